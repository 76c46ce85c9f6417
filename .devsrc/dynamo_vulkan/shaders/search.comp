// searchsorted / bucketize: for each value, the insertion index into its row
// of a sorted sequence (binary search): the first position whose element is
// >= the value, or > it with RIGHT. With SORTER the row is read through the
// permutation that sorts it. Operands are contiguous; a 1-d sequence serves
// every value (ROWS = 1), an N-d one has a row per VPR values.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint L = 1;      // row length
layout(constant_id = 3) const uint VPR = 1;    // values per row (0: one row for all)
BUFFER(0, outb)
BUFFER(1, seqb)
BUFFER(2, valb)
#ifdef SORTER
BUFFER(3, sortb)
#endif

VAL_T at(uint base, uint k) {
#ifdef SORTER
    return LOAD(seqb[base + uint(ld_i32(sortb[base + k]))]);
#else
    return LOAD(seqb[base + k]);
#endif
}

// NaN sorts last, as in torch
bool before(VAL_T a, VAL_T v) {   // does a come before v's insertion point?
#ifdef IS_FLOAT
    if (isnan(v)) return !isnan(a);
    if (isnan(a)) return false;
#endif
#ifdef RIGHT
    return a <= v;
#else
    return a < v;
#endif
}

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint base = VPR == 0u ? 0u : (e / VPR) * L;
    VAL_T v = LOAD(valb[e]);
    uint lo = 0u, hi = L;
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        if (before(at(base, mid), v)) lo = mid + 1u; else hi = mid;
    }
    outb[e] = st_i32(int(lo));
}
