// Sort family: sort / argsort / topk / kthvalue along one dim by ranking.
// One invocation per element j of a row counts the elements ordered before it
// (stable: equal keys keep their original order; NaN sorts as the largest
// value, as in torch) and writes itself at that rank if the rank is below K
// (K = N for a full sort). O(N) work per element: meant for rows of moderate
// length. NAN_MEDIAN keeps the rank of the lower median of the non-NaN values.
// Rows are addressed through the kept dims' strides (spec constants).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;   // rows * N
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint K = 1;       // ranks kept (topk); N for sort
layout(constant_id = 4) const uint IN_OFF = 0;
layout(constant_id = 5) const uint IN_RS = 1;
layout(constant_id = 6) const uint OUT_RS = 1;
layout(constant_id = 7) const uint K_LO = 0;    // only ranks K_LO..K-1 are written, at rank - K_LO
SPEC_DECLS
BUFFER(0, valb)
BUFFER(1, idxb)
BUFFER(2, inb)

// does a come before b in ascending order (NaN last)?
bool lt(VAL_T a, VAL_T b) {
#ifdef IS_FLOAT
    if (isnan(a)) return false;
    if (isnan(b)) return true;
#endif
    return a < b;
}

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint q = e / N, j = e % N;
    uint ib = IN_OFF, ob = 0u;
    ROW_INDEX
    VAL_T v = LOAD(inb[ib + j * IN_RS]);
    uint rank = 0u, valid = 0u;
    for (uint k = 0u; k < N; ++k) {
        VAL_T w = LOAD(inb[ib + k * IN_RS]);
#ifdef IS_FLOAT
        if (!isnan(w)) valid += 1u;
#endif
#ifdef DESCENDING
        bool before = lt(v, w);
#else
        bool before = lt(w, v);
#endif
        if (before || (k < j && !lt(v, w) && !lt(w, v))) rank += 1u;
    }
#ifdef NAN_MEDIAN   // the lower median of the row's non-NaN values (rank 0 if all are NaN)
    uint lo = valid == 0u ? 0u : (valid - 1u) / 2u, hi = lo + 1u;
#else
    uint lo = K_LO, hi = K;
#endif
    if (rank >= lo && rank < hi) {
        uint o = ob + (rank - lo) * OUT_RS;
        valb[o] = STORE(v);
        idxb[o] = st_i32(int(j));
    }
}
