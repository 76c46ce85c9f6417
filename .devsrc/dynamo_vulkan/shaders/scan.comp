// Scan family: inclusive scans (cumsum, cumprod, logcumsumexp) along one dim.
// One workgroup per row; the row is scanned in chunks of the workgroup size
// (a Hillis-Steele scan in shared memory) with a carry between chunks, so any
// associative COMBINE works. Rows are addressed through the kept dims' strides
// (spec constants), the scanned dim through IN_RS / OUT_RS.
#include "common.glsl"
#include "special.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint IN_OFF = 0;
layout(constant_id = 4) const uint IN_RS = 1;
layout(constant_id = 5) const uint OUT_RS = 1;
SPEC_DECLS
BUFFER(0, outb)
BUFFER(1, inb)
#ifdef CHECK_BINDING
BUFFER(CHECK_BINDING, chkb)   // int64 sums: the plan's check word (lowering/checks.py)
#endif

shared ACC_T buf[gl_WorkGroupSize.x];

ACC_T combine(ACC_T a, ACC_T b) { return COMBINE(a, b); }

void main() {
    uint row = flat_workgroup();
    if (row >= ROWS) return;
    uint ib = IN_OFF, ob = 0u, q = row;
    ROW_INDEX
    uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    ACC_T carry = INIT;
    for (uint base = 0u; base < N; base += wg) {
        uint j = base + lid;
        buf[lid] = j < N ? ACC_T(LOAD(inb[ib + j * IN_RS])) : INIT;
        barrier();
        for (uint off = 1u; off < wg; off <<= 1) {
            ACC_T t = lid >= off ? buf[lid - off] : INIT;
            barrier();
            if (lid >= off) buf[lid] = combine(t, buf[lid]);
            barrier();
        }
        if (j < N) outb[ob + j * OUT_RS] = STORE(combine(carry, buf[lid]));
        carry = combine(carry, buf[wg - 1u]);
        barrier();
    }
#ifdef CHECK_BINDING
    if (ck_ != 0u) atomicOr(chkb[0], ck_);
#endif
}
