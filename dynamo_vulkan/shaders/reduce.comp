// Reduction family: out[o] = FINAL(COMBINE over r of LOAD(in[o, r])), one
// workgroup per output element; threads stride over the R reduced elements,
// then subgroup operations and shared memory combine the partial results.
// PER_LANE (few reduced elements, many outputs: a gradient summed over a batch dim):
// one invocation per output element walks its R elements in order instead.
// Kept and reduced dims each carry their own strides (spec constants), so any
// dims of any view reduce without a copy. lowering/reduce.py declares variants.
// COLUMNS (the kept dims' innermost contiguous, the reduced dims not: a gradient summed
// over batch and positions): CQ neighbouring outputs a workgroup, so a row's loads are
// coalesced, and KT slices of the reduced elements, combined in order in shared memory;
// on a GPU the reduced elements split over SPLITS workgroups (gl_WorkGroupID.y), whose
// partial results the last to arrive combines in split order.
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

#ifdef COLUMNS
#if SPLITS > 1
// coherent: the last split of a column block reads every split's partial results
layout(set = 0, binding = PART_BINDING) coherent buffer PartB { uint partb[]; };
layout(set = 0, binding = COUNT_BINDING) coherent buffer CountB { uint counter[]; };
#include "last_arrival.glsl"
#endif
#if KT > 1
shared ACC_T red[CQ * KT];
#endif
layout(constant_id = 5) const uint RSPLIT = 1;   // reduced elements a split
uint in_off(uint base, uint r) {   // the offset of reduced element r of the output at base
    uint off = base;
    INNER_INDEX
    return off;
}

void main() {
    uint tid = gl_LocalInvocationID.x, c = tid % CQ, slice = tid / CQ;
    uint o = gl_WorkGroupID.x * CQ + c, split = gl_WorkGroupID.y;
    uint rbeg = split * RSPLIT, rend = min(R, rbeg + RSPLIT);
    ACC_T acc = INIT;
    if (o < NOUT) {
        uint base = IN_OFF;
        OUTER_INDEX
        // four loads in flight a lane, combined in order
        uint r = rbeg + slice;
        for (; r + 3u * KT < rend; r += 4u * KT) {
            ACC_T v0 = LOAD(IN_AT(in_off(base, r))), v1 = LOAD(IN_AT(in_off(base, r + KT)));
            ACC_T v2 = LOAD(IN_AT(in_off(base, r + 2u * KT))), v3 = LOAD(IN_AT(in_off(base, r + 3u * KT)));
            acc = COMBINE(COMBINE(COMBINE(COMBINE(acc, v0), v1), v2), v3);
        }
        for (; r < rend; r += KT) acc = COMBINE(acc, LOAD(IN_AT(in_off(base, r))));
    }
#if KT > 1
    red[tid] = acc;
    barrier();
    if (slice == 0u) {
        for (uint j = 1u; j < KT; ++j) acc = COMBINE(acc, red[j * CQ + c]);
    }
#endif
#if SPLITS > 1
    if (slice == 0u && o < NOUT) partb[split * NOUT + o] = floatBitsToUint(acc);
    if (!last_to_arrive(gl_WorkGroupID.x, SPLITS)) return;
    if (slice == 0u && o < NOUT) {
        acc = uintBitsToFloat(partb[o]);
        for (uint z = 1u; z < SPLITS; ++z) acc = COMBINE(acc, uintBitsToFloat(partb[z * NOUT + o]));
    }
#endif
    if (slice == 0u && o < NOUT) outb[o] = STORE(FINAL(acc));
}
#elif defined(PER_LANE)
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
