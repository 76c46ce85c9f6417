// Included by attention.comp and attention_decode.comp after their layout(local_size...):
// the specialisation constants and bindings lowering/attention.py gives both, q's and
// the step's K/V rows' loaders (Q_LAZY, PENDING), the soft-cap, and (not CPU_LANES) the
// loads of VW-wide q/K/V values.
layout(constant_id = 0) const uint HQ = 1;
layout(constant_id = 1) const uint T = 1;
layout(constant_id = 2) const uint C = 1;
layout(constant_id = 3) const uint GROUP = 1;      // query heads per kv head
layout(constant_id = 4) const uint SCALE_BITS = 0x3f800000u;
layout(constant_id = 5) const uint Q_OFF = 0;
layout(constant_id = 6) const uint Q_SH = 0;
layout(constant_id = 7) const uint Q_ST = 0;
layout(constant_id = 8) const uint Q_SD = 1;
layout(constant_id = 9) const uint K_OFF = 0;
layout(constant_id = 10) const uint K_SH = 0;
layout(constant_id = 11) const uint K_SC = 0;
layout(constant_id = 12) const uint K_SD = 1;
layout(constant_id = 13) const uint V_OFF = 0;
layout(constant_id = 14) const uint V_SH = 0;
layout(constant_id = 15) const uint V_SC = 0;
layout(constant_id = 16) const uint V_SD = 1;
layout(constant_id = 17) const uint M_OFF = 0;
layout(constant_id = 18) const uint M_ST = 0;
layout(constant_id = 19) const uint M_SC = 1;
layout(constant_id = 20) const uint SPLIT_KEYS = 1;  // keys per split (SPLITS > 1)
layout(constant_id = 21) const uint SOFTCAP_BITS = 0;  // float bits of the logit soft-cap; 0: none
BUFFER(0, outb)
IN_BUFFER(1, qb)
IN_BUFFER(2, kb)
IN_BUFFER(3, vb)
IN_BUFFER(4, mb)
#if SPLITS > 1
// per (row, split): max, sum, then DV output values; coherent: read by another workgroup
layout(set = 0, binding = SCRATCH_BINDING) coherent buffer PartB { uint part_b[]; };
#endif
#ifdef COUNTER_BINDING
layout(set = 0, binding = COUNTER_BINDING) coherent buffer Count { uint counter[]; };
#include "last_arrival.glsl"
#endif
#ifdef Q_LAZY
Q_LAZY
// element e of q's row r, the Lazy being rows of Q_W (Q_RPH of them per q row)
float qget(uint r, uint e) { return qlazy(r * Q_RPH + e / Q_W, e % Q_W); }
#endif
#ifdef PENDING
// The step's K and V rows (a decode step's cache update, written by a scatter beside
// this kernel): key P comes from them, computed here, never from the cache.
IN_BUFFER(IDX_BINDING, idxb)
K_NEW
V_NEW
float knew(uint kvh, uint e) { return klazy(kvh * K_RPH + e / K_W, e % K_W); }
float vnew(uint kvh, uint e) { return vlazy(kvh * V_RPH + e / V_W, e % V_W); }
#endif
#include "wg_reduce.glsl"
#define NEG_INF uintBitsToFloat(0xff800000u)

// a score's soft-cap: tanh(s / cap) * cap, or s itself when SOFTCAP_BITS is 0
float capped(float s) {
    if (SOFTCAP_BITS == 0u) return s;
    float cap = uintBitsToFloat(SOFTCAP_BITS);
    return tanh_f(s / cap) * cap;
}

#ifndef CPU_LANES
// VW: 4 when q, k and v rows are vec4-aligned and unit-stride along the head dim (one
// 16-byte load for 4 dims), else 1. D, DV: head dims; DVL = DV / VW lanes of output;
// DVLP = min(DVL, WG) lanes per part; PARTS = WG / DVLP; DPT = ceil(DVL / DVLP) lanes
// per invocation; TPK invocations per key, KPP = WG / TPK keys per chunk.
#if VW == 4
#define VT vec4
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 kv4[]; };
layout(set = 0, binding = 3) readonly buffer Buf3v { vec4 vv4[]; };
#define LDK(o) kv4[(o) >> 2]
#define LDV(o) vv4[(o) >> 2]
#define DOTV(a, b) dot(a, b)
#define LDQ(o) uintBitsToFloat(uvec4(qb[o], qb[(o) + Q_SD], qb[(o) + 2u * Q_SD], qb[(o) + 3u * Q_SD]))
#define STORE(o, val) outb[o] = st_f32(val.x); outb[(o) + 1u] = st_f32(val.y); outb[(o) + 2u] = st_f32(val.z); outb[(o) + 3u] = st_f32(val.w)
#define QLAZY(r, e) vec4(qget(r, e), qget(r, (e) + 1u), qget(r, (e) + 2u), qget(r, (e) + 3u))
#define KNEW(h, e) vec4(knew(h, e), knew(h, (e) + 1u), knew(h, (e) + 2u), knew(h, (e) + 3u))
#define VNEW(h, e) vec4(vnew(h, e), vnew(h, (e) + 1u), vnew(h, (e) + 2u), vnew(h, (e) + 3u))
#else
#define VT float
#define LDK(o) ld_f32(kb[o])
#define LDV(o) ld_f32(vb[o])
#define DOTV(a, b) ((a) * (b))
#define LDQ(o) ld_f32(qb[o])
#define STORE(o, val) outb[o] = st_f32(val)
#define QLAZY(r, e) qget(r, e)
#define KNEW(h, e) knew(h, e)
#define VNEW(h, e) vnew(h, e)
#endif
#ifdef PENDING
#define LDV_AT(c, o, h, e) ((c) == P ? VNEW(h, e) : LDV(o))
#else
#define LDV_AT(c, o, h, e) LDV(o)
#endif
#endif
