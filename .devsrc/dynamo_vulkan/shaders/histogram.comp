// Histograms: each input element (read through its strides, flattened) adds
// its weight (or 1) to the bin it falls in, atomically. The outer edges come
// from a 2-word buffer (lo, hi) computed on the GPU when they depend on the
// data. LINEAR: bin = (v - lo) * BINS / (hi - lo) (histc); LOCAL: that guess
// corrected against the bin edges (histogram with a bin count); SEARCH: a
// binary search in the given edges. Values outside [lo, hi] (and NaN) count
// nowhere; v == hi goes to the last bin. These are torch's CPU rules.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const int BINS = 1;
SPEC_DECLS
BUFFER(0, histb)
BUFFER(1, xb)
BUFFER(2, rangeb)
#if defined(LOCAL) || defined(SEARCH)
BUFFER(3, edgeb)
#endif
#ifdef WEIGHTED
BUFFER(4, wb)
#endif

float edge(int k) {
#if defined(LOCAL) || defined(SEARCH)
    return ld_f32(edgeb[k]);
#else
    return 0.0;
#endif
}

// the first k in [a, b) with edge(k) > v (upper_bound)
int upper(int a, int b, float v) {
    while (a < b) { int m = (a + b) >> 1; if (edge(m) > v) b = m; else a = m + 1; }
    return a;
}

void main() {
    uint i = flat_invocation();
    if (i >= NUMEL) return;
    uint r = i;
    uint xo = X_OFF;
    X_INDEX
    float v = ld_f32(xb[xo]);
    float lo = ld_f32(rangeb[0]), hi = ld_f32(rangeb[1]);
    if (!(v >= lo && v <= hi)) return;
#ifdef SEARCH
    int pos = upper(0, BINS + 1, v) - 1;
#else
    int pos = int((v - lo) * float(BINS) / (hi - lo));
#ifdef LOCAL
    pos = upper(max(0, pos - 1), min(pos + 2, BINS + 1), v) - 1;
#endif
#endif
    if (pos >= BINS) pos = BINS - 1;
    if (pos < 0) return;
#ifdef WEIGHTED
    float w = ld_f32(wb[i]);
#else
    float w = 1.0;
#endif
    uint seen = histb[pos], was;
    do { was = seen; seen = atomicCompSwap(histb[pos], was, st_f32(ld_f32(was) + w)); } while (seen != was);
}
