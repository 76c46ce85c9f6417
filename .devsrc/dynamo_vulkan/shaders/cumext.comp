// cummax / cummin: running extreme along one dim and the index where it was
// taken, one invocation per row walking it in order (torch's rule: a NaN, or a
// value >= (cummax) / <= (cummin) the current one, takes over). Rows are
// addressed through the kept dims' strides (spec constants).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint IN_OFF = 0;
layout(constant_id = 4) const uint IN_RS = 1;
layout(constant_id = 5) const uint OUT_RS = 1;
SPEC_DECLS
BUFFER(0, valb)
BUFFER(1, idxb)
BUFFER(2, inb)

void main() {
    uint q = flat_invocation();
    if (q >= ROWS) return;
    uint ib = IN_OFF, ob = 0u;
    ROW_INDEX
    VAL_T best = LOAD(inb[ib]);
    int arg = 0;
    for (uint j = 0u; j < N; ++j) {
        VAL_T v = LOAD(inb[ib + j * IN_RS]);
        if (TAKES(v, best)) { best = v; arg = int(j); }
        valb[ob + j * OUT_RS] = STORE(best);
        idxb[ob + j * OUT_RS] = st_i32(arg);
    }
}
