// Reduction family: out[o] = FINAL(COMBINE over r of LOAD(in[o, r])), one
// workgroup per output element; threads stride over the R reduced elements,
// then subgroup operations and shared memory combine the partial results.
// PER_LANE (few reduced elements, many outputs: a gradient summed over a batch dim):
// one invocation per output element walks its R elements in order instead.
// Kept and reduced dims each carry their own strides (spec constants), so any
// dims of any view reduce without a copy. lowering/reduce.py declares variants.
// X_LAZY: the input is an elementwise expression (fusion.row_loader's xlazy(m, k), its
// buffers bound from 2), computed as each element is loaded: the strides are then those
// of the expression's contiguous shape, and element i is row i / XL_K, column i % XL_K.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NOUT = 1;
layout(constant_id = 2) const uint R = 1;
layout(constant_id = 3) const uint IN_OFF = 0;
layout(constant_id = 4) const uint DIV_BITS = 0x3f800000u;   // var/std: the divisor (float bits)
SPEC_DECLS
BUFFER(0, outb)
BUFFER(1, inb)
#ifdef HAS_AUX
BUFFER(2, auxb)   // var/std: one mean per output element
#endif
#ifdef CHECK_BINDING
BUFFER(CHECK_BINDING, chkb)   // int64 sums: the plan's check word (lowering/checks.py)
#endif
#ifdef X_LAZY
X_LAZY
#define IN_AT(i) xlazy((i) / uint(XL_K), (i) % uint(XL_K))
#else
#define IN_AT(i) inb[i]
#endif
float sq_(float v) { return v * v; }
float div_(float a) {   // a / divisor, IEEE even where the driver divides by reciprocal
    float d = uintBitsToFloat(DIV_BITS);
    if (d == 0.0) return a == 0.0 ? uintBitsToFloat(0x7fc00000u) : a * uintBitsToFloat(0x7f800000u);
    return a / d;
}

#ifdef PER_LANE
void main() {
    uint o = flat_invocation();
    if (o >= NOUT) return;
    uint base = IN_OFF;
    OUTER_INDEX
    ACC_T acc = INIT;
    for (uint r = 0u; r < R; ++r) {
        uint off = base;
        INNER_INDEX
        acc = COMBINE(acc, LOAD(IN_AT(off)));
    }
    outb[o] = STORE(FINAL(acc));
#ifdef CHECK_BINDING
    if (ck_ != 0u) atomicOr(chkb[0], ck_);
#endif
}
#else
shared ACC_T partial[64];

void main() {
    uint o = flat_workgroup();
    if (o >= NOUT) return;
    uint base = IN_OFF;
    OUTER_INDEX
    ACC_T acc = INIT;
    for (uint r = gl_LocalInvocationID.x; r < R; r += gl_WorkGroupSize.x) {
        uint off = base;
        INNER_INDEX
        ACC_T v = LOAD(IN_AT(off));
        acc = COMBINE(acc, v);
    }
    acc = SUBGROUP_COMBINE(acc);
    if (subgroupElect()) partial[gl_SubgroupID] = acc;
    barrier();
    if (gl_SubgroupID == 0) {
        acc = gl_SubgroupInvocationID < gl_NumSubgroups ? partial[gl_SubgroupInvocationID] : INIT;
        for (uint s = gl_SubgroupSize + gl_SubgroupInvocationID; s < gl_NumSubgroups; s += gl_SubgroupSize)
            acc = COMBINE(acc, partial[s]);
        acc = SUBGROUP_COMBINE(acc);
        if (subgroupElect()) {
            outb[o] = STORE(FINAL(acc));
#ifdef CHECK_BINDING
            if (ck_ != 0u) atomicOr(chkb[0], ck_);
#endif
        }
    }
}
#endif
