// The bindings, specialisation constants and decode fusions that attention.comp and
// attention_decode.comp share (lowering/attention.py binds both alike): out, q, k, v
// and the mask; SCRATCH_BINDING and COUNTER_BINDING where the keys are split (each
// split's partial results, and a counter per merge for the last to arrive); Q_LAZY, q
// an elementwise expression (its RoPE) computed as it is loaded; PENDING, the step's K
// and V rows computed here. Include after common.glsl and the kernel's local size.
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
#define NEG_INF uintBitsToFloat(0xff800000u)

// a score's soft-cap: tanh(s / cap) * cap, or s itself when SOFTCAP_BITS is 0
float capped(float s) {
    if (SOFTCAP_BITS == 0u) return s;
    float cap = uintBitsToFloat(SOFTCAP_BITS);
    return tanh_f(s / cap) * cap;
}

