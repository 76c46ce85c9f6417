// embedding_bag: out[b, j] = SUM / MEAN / MAX over the bag's indices i of
// weight[idx[i], j] (times per_sample_weights[i] with HAS_PSW), one invocation
// per output element. Bag b spans offsets[b] .. offsets[b+1] (the last one
// runs to the end unless LAST_OFF). Entries equal to PAD are skipped; empty
// bags give 0. An index out of range sets CHECK_MASK in the plan's check word, and
// offsets that do not start at 0, decrease or pass the end set OFFSETS_MASK (the
// program raises after the submit: lowering/checks.py); nothing is read for them.
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
layout(constant_id = 17) const uint CHECK_MASK = 0;
layout(constant_id = 18) const uint OFFSETS_MASK = 0;
BUFFER(0, outb)
BUFFER(1, wb)
BUFFER(2, idxb)
BUFFER(3, offb)
BUFFER(4, chkb)
#ifdef HAS_PSW
BUFFER(5, pswb)
#endif

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint b = e / DIM, j = e % DIM;
    int first = ld_i32(offb[F_OFF + b * F_S]);
    int last = (b + 1u < NOFF) ? ld_i32(offb[F_OFF + (b + 1u) * F_S]) : int(NIDX);
    bool bad_offsets = (b == 0u && first != 0) || first < 0 || last < first ||
                       uint(last) > NIDX;
    uint start = bad_offsets ? 0u : uint(first), end = bad_offsets ? 0u : uint(last);
    bool bad = false;
#ifdef MAX
    float acc = uintBitsToFloat(0xff800000u);
#else
    float acc = 0.0;
#endif
    uint count = 0u;
    for (uint i = start; i < end; ++i) {
        int row = ld_i32(idxb[I_OFF + i * I_S]);
        if (PAD >= 0 && row == PAD) continue;      // PAD -1: no padding index
        if (row < 0 || row >= NROWS) { bad = true; continue; }
        float v = ld_f32(wb[W_OFF + uint(row) * W_RS + j * W_CS]);
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
    if (j == 0u && (bad || bad_offsets))
        atomicOr(chkb[0], (bad ? CHECK_MASK : 0u) | (bad_offsets ? OFFSETS_MASK : 0u));
}
