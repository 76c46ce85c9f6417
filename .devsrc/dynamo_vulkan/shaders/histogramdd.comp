// histogramdd: each point (a row of D coordinates, read through strides) adds
// its weight (or 1) to the D-dimensional bin it falls in, atomically. Per dim
// d, meta holds (bins, offset of its edges in edgeb, stride in the histogram)
// and rangeb its outer edges (lo, hi). LOCAL: the linear guess corrected
// against the edges (bin counts); SEARCH: a binary search in given edges.
// Torch's rules: outside [lo, hi] (or NaN) in any dim counts nowhere; v == hi
// goes to the last bin.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NPTS = 1;
layout(constant_id = 2) const uint D = 1;
layout(constant_id = 3) const uint X_OFF = 0;
layout(constant_id = 4) const uint XS_N = 0;
layout(constant_id = 5) const uint XS_D = 1;
BUFFER(0, histb)
BUFFER(1, xb)
BUFFER(2, rangeb)
BUFFER(3, edgeb)
BUFFER(4, metab)
#ifdef WEIGHTED
BUFFER(5, wb)
#endif

int upper(uint eo, int a, int b, float v) {   // first k in [a, b) with edge > v
    while (a < b) { int m = (a + b) >> 1; if (ld_f32(edgeb[eo + uint(m)]) > v) b = m; else a = m + 1; }
    return a;
}

void main() {
    uint i = flat_invocation();
    if (i >= NPTS) return;
    uint cell = 0u;
    for (uint d = 0u; d < D; ++d) {
        float v = ld_f32(xb[X_OFF + i * XS_N + d * XS_D]);
        float lo = ld_f32(rangeb[2u * d]), hi = ld_f32(rangeb[2u * d + 1u]);
        if (!(v >= lo && v <= hi)) return;
        int bins = ld_i32(metab[3u * d]);
        uint eo = uint(ld_i32(metab[3u * d + 1u]));
#ifdef SEARCH
        int pos = upper(eo, 0, bins + 1, v) - 1;
#else
        int pos = int((v - lo) * float(bins) / (hi - lo));
        pos = upper(eo, max(0, pos - 1), min(pos + 2, bins + 1), v) - 1;
#endif
        if (pos >= bins) pos = bins - 1;
        if (pos < 0) return;
        cell += uint(pos) * uint(ld_i32(metab[3u * d + 2u]));
    }
#ifdef WEIGHTED
    float w = ld_f32(wb[i]);
#else
    float w = 1.0;
#endif
    uint seen = histb[cell], was;
    do { was = seen; seen = atomicCompSwap(histb[cell], was, st_f32(ld_f32(was) + w)); } while (seen != was);
}
