// x as three int8 planes per block of 32, for the integer-dot GGUF mat-vec
// (gguf_matvec_idot.comp; the format and its accuracy: xplanes.glsl), eight invocations
// per block of one row of x.
// NORM: the planes are of x RMS-normalised (x * nw * rsqrt(mean(x^2) + eps), the rowwise
// kernel's RMS_NORM HAS_WEIGHT formula): each workgroup sums x^2 over the whole row
// (one row of x), the planes hold x * nw and the scales carry the rsqrt, so the mat-vecs
// that read them need no norm of their own. X_LAZY: x is an elementwise expression
// (silu(gate) * up), computed as it is loaded (fusion.row_loader), once for all readers.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NB = 1;       // blocks per row
layout(constant_id = 2) const uint M = 1;        // rows of x
layout(constant_id = 3) const uint X_OFF = 0;
layout(constant_id = 4) const uint X_SM = 0;     // x row stride, in words
layout(constant_id = 5) const uint EPS_BITS = 0; // NORM: eps
BUFFER(0, outb)
IN_BUFFER(1, xb)
#ifdef NORM
IN_BUFFER(2, nwb)      // the norm's weight, 32 NB floats from word 0
#include "wg_reduce.glsl"
#endif
#ifdef X_LAZY
X_LAZY
#define XLOAD(m, k) xlazy(m, k)
#else
#define XLOAD(m, k) ld_f32(xb[X_OFF + (m) * X_SM + (k)])
#endif
#ifndef MAXWG
#define MAXWG 256
#endif
#define XP_OUT outb
#include "xplanes.glsl"

void main() {
    uint lid = gl_LocalInvocationID.x, g = flat_invocation(), l = g & 7u, blk = g >> 3;
    bool live = blk < NB * M;          // no early return: the barriers need every invocation
    uint m = min(blk, NB * M - 1u) / NB, b = min(blk, NB * M - 1u) % NB;
    uint e0 = xp_first(l), de = XP_DE;
    uint k0 = 32u * b + e0;
    vec4 v = vec4(XLOAD(m, k0), XLOAD(m, k0 + de), XLOAD(m, k0 + 2u * de), XLOAD(m, k0 + 3u * de));
    float rn = 1.0;      // NORM: rsqrt(mean(x^2) + eps)
#ifdef NORM
    float ss = 0.0;
    for (uint k = lid; k < 32u * NB; k += gl_WorkGroupSize.x) {
        float xv = XLOAD(m, k);
        ss += xv * xv;
    }
    rn = inversesqrt(wg_sum(ss) / float(32u * NB) + uintBitsToFloat(EPS_BITS));
    v *= vec4(ld_f32(nwb[k0]), ld_f32(nwb[k0 + de]), ld_f32(nwb[k0 + 2u * de]), ld_f32(nwb[k0 + 3u * de]));
#endif
    xp_block(lid, l, blk, live, v, rn);
}
