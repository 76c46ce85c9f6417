// Arg-reduction family: the index of the first largest (LARGEST) or smallest
// element over the reduced dims, NaN counting as larger than everything (torch's
// rule), and with WANT_VALUES the value too (max/min with indices). One workgroup
// per output element; threads scan strided elements, then a shared-memory tree
// keeps the better (value, index) pair, ties going to the lower index.
// Long rows run in two passes: SPLITS workgroups per output each pick the best of
// CHUNK elements (SPLITS defined: the pair goes to slot o * SPLITS + s), then PAIRS
// picks among those pairs, taking each candidate's index from pidxb.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NOUT = 1;
layout(constant_id = 2) const uint R = 1;
layout(constant_id = 3) const uint IN_OFF = 0;
SPEC_DECLS
BUFFER(0, idxb)
BUFFER(1, inb)
#ifdef WANT_VALUES
BUFFER(2, valb)
#endif
#if defined(PAIRS) && defined(WANT_VALUES)
BUFFER(3, pidxb)
#elif defined(PAIRS)
BUFFER(2, pidxb)
#endif

shared VAL_T sval[gl_WorkGroupSize.x];
shared uint sidx[gl_WorkGroupSize.x];

// is (a, ia) a better pick than (b, ib)?
bool better(VAL_T a, uint ia, VAL_T b, uint ib) {
    if (ib == 0xffffffffu) return ia != 0xffffffffu;
    if (ia == 0xffffffffu) return false;
#ifdef IS_FLOAT
    bool na = isnan(a), nb = isnan(b);
    if (na || nb) return na && (!nb || ia < ib);
#endif
    if (a != b) {
#ifdef LARGEST
        return a > b;
#else
        return a < b;
#endif
    }
    return ia < ib;
}

void main() {
#ifdef SPLITS
    uint o = flat_workgroup() / SPLITS;
    uint slot = flat_workgroup();
    uint r0 = (slot % SPLITS) * CHUNK, r1 = min(R, r0 + CHUNK);
#else
    uint o = flat_workgroup();
    uint slot = o;
    uint r0 = 0u, r1 = R;
#endif
    if (o >= NOUT) return;
    uint base = IN_OFF;
    OUTER_INDEX
    uint lid = gl_LocalInvocationID.x;
    VAL_T best = VAL_T(0);
    uint bi = 0xffffffffu;
    for (uint r = r0 + lid; r < r1; r += gl_WorkGroupSize.x) {
        uint off = base;
        INNER_INDEX
        VAL_T v = LOAD(inb[off]);
#ifdef PAIRS
        uint ri = uint(ld_i32(pidxb[off]));
#else
        uint ri = r;
#endif
        if (better(v, ri, best, bi)) { best = v; bi = ri; }
    }
    sval[lid] = best;
    sidx[lid] = bi;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1) {
        if (lid < s && better(sval[lid + s], sidx[lid + s], sval[lid], sidx[lid])) {
            sval[lid] = sval[lid + s];
            sidx[lid] = sidx[lid + s];
        }
        barrier();
    }
    if (lid == 0u) {
        idxb[slot] = st_i32(int(sidx[0] == 0xffffffffu ? 0u : sidx[0]));
#ifdef WANT_VALUES
        VAL_T v = sval[0];
        valb[slot] = STORE(v);
#endif
    }
}
