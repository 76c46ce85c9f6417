// cdist: out[b, i, j] = (sum_k |x1[b, i, k] - x2[b, j, k]|^P)^(1/P) (PDIST: over
// the row pairs i < j of one matrix, x2 = x1), one
// invocation per output element; P = 0 counts differing entries, P = inf
// takes the largest difference. Inputs are contiguous (B, rows, M).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint NP = 1;
layout(constant_id = 3) const uint NR = 1;
layout(constant_id = 4) const uint M = 1;
layout(constant_id = 5) const uint P_BITS = 0x40000000u;   // p as float bits
BUFFER(0, outb)
BUFFER(1, x1b)
BUFFER(2, x2b)

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
#ifdef PDIST       // pair e of rows i < j of one (NP, M) matrix, row-major over pairs
    uint i = 0u, left = e;
    while (left >= NP - 1u - i) { left -= NP - 1u - i; ++i; }
    uint j = i + 1u + left;
    uint a0 = i * M, b0 = j * M;
#else
    uint j = e % NR, i = (e / NR) % NP, b = e / (NR * NP);
    uint a0 = (b * NP + i) * M, b0 = (b * NR + j) * M;
#endif
    float p = uintBitsToFloat(P_BITS);
    float acc = 0.0;
    for (uint k = 0u; k < M; ++k) {
        float d = abs(ld_f32(x1b[a0 + k]) - ld_f32(x2b[b0 + k]));
#if defined(P_ZERO)
        acc += d != 0.0 ? 1.0 : 0.0;
#elif defined(P_INF)
        acc = (isnan(d) || d > acc) ? d : acc;
#elif defined(P_ONE)
        acc += d;
#elif defined(P_TWO)
        acc += d * d;
#else
        acc += d == 0.0 ? 0.0 : pow(d, p);
#endif
    }
#if defined(P_TWO)
    acc = sqrt(acc);
#elif !defined(P_ZERO) && !defined(P_INF) && !defined(P_ONE)
    acc = acc == 0.0 ? 0.0 : pow(acc, 1.0 / p);
#endif
    outb[e] = st_f32(acc);
}
