// segment_reduce: out[o, s, i] = REDUCE over j in segment s of data[o, j, i],
// starting from INIT (the `initial` value, or the op's identity); MEAN divides
// by the segment length (an empty one keeps INIT, NaN without `initial`).
// Segments come from lengths (O x S, summed here) or offsets (O x (S + 1)).
// One invocation per output element; operands are contiguous.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint S = 1;
layout(constant_id = 3) const uint N = 1;      // data length along the axis
layout(constant_id = 4) const uint INNER = 1;
layout(constant_id = 5) const uint INIT_BITS = 0;
layout(constant_id = 6) const uint HAS_INITIAL = 0;
BUFFER(0, outb)
BUFFER(1, datab)
BUFFER(2, segb)

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint i = e % INNER, s = (e / INNER) % S, o = e / (INNER * S);
#ifdef OFFSETS
    uint start = uint(ld_i32(segb[o * (S + 1u) + s])), end = uint(ld_i32(segb[o * (S + 1u) + s + 1u]));
#else
    uint start = 0u;
    for (uint t = 0u; t < s; ++t) start += uint(ld_i32(segb[o * S + t]));
    uint end = start + uint(ld_i32(segb[o * S + s]));
#endif
    end = min(end, N);
    float acc = uintBitsToFloat(INIT_BITS);
    for (uint j = start; j < end; ++j) {
        float v = ld_f32(datab[(o * N + j) * INNER + i]);
        acc = COMBINE(acc, v);
    }
#ifdef MEAN
    if (end > start) acc /= float(end - start);
    else if (HAS_INITIAL == 0u) acc = uintBitsToFloat(0x7fc00000u);
#endif
    outb[e] = st_f32(acc);
}
