// The live keys of each row of an attention mask [T, C] (bools): ranges[3t] = the first
// unmasked key, ranges[3t + 1] = one past the last (C and 0 for a row with none),
// ranges[3t + 2] = 1 where every key between them is unmasked (causal and sliding-window
// masks), so that a prompt's attention (attention_tiled.comp) finds each block's keys
// without scanning the mask, and tests a score's key against its row's interval instead
// of loading the mask. A workgroup per row; M_VEC4: the rows are 16-byte aligned with C a
// multiple of 4 (4 bools a load). The specialisation constants are attention.comp's mask
// offset and strides, T and C.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#define WG 64u
layout(local_size_x = WG) in;
layout(constant_id = 0) const uint T = 1;
layout(constant_id = 1) const uint C = 1;
layout(constant_id = 2) const uint M_OFF = 0;
layout(constant_id = 3) const uint M_ST = 0;
layout(constant_id = 4) const uint M_SC = 1;
BUFFER(0, ranges)
IN_BUFFER(1, mb)
layout(set = 0, binding = 1) readonly buffer Buf1v { uvec4 mv4[]; };
#define UNROLL 4u
shared uint lo_s, hi_s, live_s;

void main() {
    uint t = flat_workgroup();
    if (t >= T) return;
    uint lid = gl_LocalInvocationID.x;
    if (lid == 0u) { lo_s = C; hi_s = 0u; live_s = 0u; }
    barrier();
    uint lo = C, hi = 0u, live = 0u;     // integers: exact for any C
#ifdef M_VEC4
    uint base = (M_OFF + t * M_ST) >> 2, n = C / 4u;
    for (uint i0 = lid; i0 < n; i0 += WG * UNROLL) {
        uvec4 w[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) w[u] = i0 + u * WG < n ? mv4[base + i0 + u * WG] : uvec4(0u);
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u)
            [[unroll]] for (uint e = 0u; e < 4u; ++e)
                if (w[u][e] != 0u) {
                    uint c = 4u * (i0 + u * WG) + e;
                    lo = min(lo, c); hi = max(hi, c + 1u); live += 1u;
                }
    }
#else
    for (uint c0 = lid; c0 < C; c0 += WG * UNROLL) {
        bool b[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u)
            b[u] = c0 + u * WG < C && ld_b(mb[M_OFF + t * M_ST + (c0 + u * WG) * M_SC]);
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u)
            if (b[u]) { uint c = c0 + u * WG; lo = min(lo, c); hi = max(hi, c + 1u); live += 1u; }
    }
#endif
    atomicMin(lo_s, lo);
    atomicMax(hi_s, hi);
    atomicAdd(live_s, live);
    barrier();
    if (lid == 0u) {
        ranges[3u * t] = lo_s;
        ranges[3u * t + 1u] = hi_s;
        ranges[3u * t + 2u] = live_s > 0u && live_s == hi_s - lo_s ? 1u : 0u;
    }
}
