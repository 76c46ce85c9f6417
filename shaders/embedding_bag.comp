// embedding_bag: out[b, j] = SUM / MEAN / MAX over the bag's indices i of
// weight[idx[i], j] (times per_sample_weights[i] with HAS_PSW), one invocation
// per output element. Bag b spans offsets[b] .. offsets[b+1] (the last one
// runs to the end unless LAST_OFF). Entries equal to PAD are skipped; empty
// bags give 0; out-of-range rows read as 0 (a kernel cannot raise).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint DIM = 1;
layout(constant_id = 3) const uint NIDX = 0;
layout(constant_id = 4) const uint NOFF = 1;
layout(constant_id = 5) const int NROWS = 1;
layout(constant_id = 6) const uint W_OFF = 0;
layout(constant_id = 7) const uint W_RS = 1;
layout(constant_id = 8) const uint W_CS = 1;
layout(constant_id = 9) const uint I_OFF = 0;
layout(constant_id = 10) const uint I_S = 1;
layout(constant_id = 11) const uint F_OFF = 0;
layout(constant_id = 12) const uint F_S = 1;
layout(constant_id = 13) const int PAD = -1;
layout(constant_id = 14) const uint P_OFF = 0;
layout(constant_id = 15) const uint P_S = 1;
layout(constant_id = 16) const uint LAST_OFF = 0;
BUFFER(0, outb)
BUFFER(1, wb)
BUFFER(2, idxb)
BUFFER(3, offb)
#ifdef HAS_PSW
BUFFER(4, pswb)
#endif

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint b = e / DIM, j = e % DIM;
    uint start = uint(ld_i32(offb[F_OFF + b * F_S]));
    uint end = (b + 1u < NOFF) ? uint(ld_i32(offb[F_OFF + (b + 1u) * F_S])) : NIDX;
    end = min(end, NIDX);
#ifdef MAX
    float acc = uintBitsToFloat(0xff800000u);
#else
    float acc = 0.0;
#endif
    uint count = 0u;
    for (uint i = start; i < end; ++i) {
        int row = ld_i32(idxb[I_OFF + i * I_S]);
        if (row == PAD) continue;
        float v = (row >= 0 && row < NROWS) ? ld_f32(wb[W_OFF + uint(row) * W_RS + j * W_CS]) : 0.0;
#ifdef HAS_PSW
        v *= ld_f32(pswb[P_OFF + i * P_S]);
#endif
#ifdef MAX
        acc = (isnan(v) || v > acc) ? v : acc;
#else
        acc += v;
#endif
        count += 1u;
    }
#ifdef MEAN
    if (count > 0u) acc /= float(count);
#endif
    if (count == 0u) acc = 0.0;
    outb[e] = st_f32(acc);
}
