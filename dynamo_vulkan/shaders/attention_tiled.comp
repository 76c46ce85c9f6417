// Attention of a prompt (many query rows) over a key/value cache, tiled: one workgroup per
// (query head, block of BQ query rows). The block's q rows sit in shared memory; keys come
// in chunks of BK, whose K and V rows are loaded into shared memory once for all BQ rows
// (the row-per-workgroup kernel, attention.comp, reads them once per row). TPR = 8
// invocations share a row: for the scores each takes every TPR-th key of the chunk, for
// the output every TPR-th lane of DV. An online softmax per row carries the running max
// and sum across chunks (rescaling the output when the max grows). The keys between the
// block's first and last unmasked ones are found first, so a causal prompt's block skips
// the chunks past its last row. A masked key scores -inf; a row with no unmasked key
// gets NaN, as eager's softmax gives. SOFTCAP_BITS > 0: a score s becomes
// tanh(s / cap) * cap before the mask and the softmax (Gemma 2). VW = 4 (D and DV
// multiples of 4): the tiles are read from shared memory as vec4s. The specialisation
// constants are attention.comp's; lowering/attention.py derives BQ, BK, D, DV and VW.
#include "common.glsl"
#define TPR 8u
#define WG (BQ * TPR)
layout(local_size_x = WG) in;
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
layout(constant_id = 20) const uint SPLIT_KEYS = 1;  // unused here (attention.comp's splits)
layout(constant_id = 21) const uint SOFTCAP_BITS = 0;
BUFFER(0, outb)
IN_BUFFER(1, qb)
IN_BUFFER(2, kb)
IN_BUFFER(3, vb)
IN_BUFFER(4, mb)
#include "wg_reduce.glsl"
#define NEG_INF uintBitsToFloat(0xff800000u)
#if VW == 4
#define VT vec4
#define DOTV(a, b) dot(a, b)
#else
#define VT float
#define DOTV(a, b) ((a) * (b))
#endif
#define DW (D / VW)                     // a q or K row, in VTs
#define DVW (DV / VW)                   // a V row, in VTs
// rows padded by one VT, so that the rows a subgroup reads at once fall in different banks
#define QLD (DW + 1u)
#define KLD (DW + 1u)
#define PLD (BK + 1u)
#define DPT ((DVW + TPR - 1u) / TPR)    // output VTs per invocation
#define KPT (BK / TPR)                  // keys per invocation and chunk
shared VT qs[BQ * QLD];
shared VT ks[BK * KLD];
shared VT vs[BK * DVW];
shared float ps[BQ * PLD];

// VW consecutive elements along the last dim from word o on (stride sd)
VT ldv(uint o, uint sd, bool in_range, uint which) {
#if VW == 4
    if (!in_range) return vec4(0.0);
    if (which == 0u) return vec4(ld_f32(qb[o]), ld_f32(qb[o + sd]), ld_f32(qb[o + 2u * sd]), ld_f32(qb[o + 3u * sd]));
    if (which == 1u) return vec4(ld_f32(kb[o]), ld_f32(kb[o + sd]), ld_f32(kb[o + 2u * sd]), ld_f32(kb[o + 3u * sd]));
    return vec4(ld_f32(vb[o]), ld_f32(vb[o + sd]), ld_f32(vb[o + 2u * sd]), ld_f32(vb[o + 3u * sd]));
#else
    if (!in_range) return 0.0;
    return ld_f32(which == 0u ? qb[o] : which == 1u ? kb[o] : vb[o]);
#endif
}

float capped(float s) {
    if (SOFTCAP_BITS == 0u) return s;
    float cap = uintBitsToFloat(SOFTCAP_BITS);
    return tanh_f(s / cap) * cap;
}

void main() {
    uint blocks = (T + BQ - 1u) / BQ;
    uint wid = flat_workgroup();
    if (wid >= HQ * blocks) return;
    uint h = wid / blocks, t0 = (wid % blocks) * BQ, kvh = h / GROUP;
    uint lid = gl_LocalInvocationID.x, r = lid / TPR, sub = lid % TPR;
    uint t = t0 + r;
    bool row_in = t < T;
    // the block's live keys: from the first unmasked key of any of its rows to the last
    float lo_f = float(C), hi_f = 0.0;
    uint rows = min(BQ, T - t0);
    for (uint e = lid; e < rows * C; e += WG) {
        uint tr = t0 + e / C, c = e % C;
        if (ld_b(mb[M_OFF + tr * M_ST + c * M_SC])) { lo_f = min(lo_f, float(c)); hi_f = max(hi_f, float(c + 1u)); }
    }
    lo_f = -wg_max(-lo_f);
    hi_f = wg_max(hi_f);
    uint k0 = uint(lo_f), k1 = max(k0, uint(hi_f));
    for (uint e = lid; e < BQ * DW; e += WG) {
        uint qr = e / DW, i = e % DW;
        qs[qr * QLD + i] = ldv(Q_OFF + h * Q_SH + (t0 + qr) * Q_ST + i * VW * Q_SD, Q_SD, t0 + qr < T, 0u);
    }
    float scale = uintBitsToFloat(SCALE_BITS);
    float m = NEG_INF, l = 0.0;
    VT acc[DPT];
    for (uint j = 0u; j < DPT; ++j) acc[j] = VT(0.0);
    for (uint c0 = k0; c0 < k1; c0 += BK) {
        uint keys = min(BK, k1 - c0);
        barrier();                                   // the last chunk's K, V and p are read
        for (uint e = lid; e < BK * DW; e += WG) {
            uint kr = e / DW, i = e % DW;
            ks[kr * KLD + i] = ldv(K_OFF + kvh * K_SH + (c0 + kr) * K_SC + i * VW * K_SD, K_SD, kr < keys, 1u);
        }
        for (uint e = lid; e < BK * DVW; e += WG) {
            uint vr = e / DVW, i = e % DVW;
            vs[e] = ldv(V_OFF + kvh * V_SH + (c0 + vr) * V_SC + i * VW * V_SD, V_SD, vr < keys, 2u);
        }
        barrier();
        // scores of this invocation's keys (sub, sub + TPR, ...), their row max
        float s[KPT];
        float cm = NEG_INF;
        for (uint q = 0u; q < KPT; ++q) {
            uint kj = sub + q * TPR, c = c0 + kj;
            float qk = 0.0;
            for (uint i = 0u; i < DW; ++i) qk += DOTV(qs[r * QLD + i], ks[kj * KLD + i]);
            bool live = row_in && kj < keys && ld_b(mb[M_OFF + min(t, T - 1u) * M_ST + min(c, C - 1u) * M_SC]);
            s[q] = live ? capped(qk * scale) : NEG_INF;
            cm = max(cm, s[q]);
        }
        ps[r * PLD + sub] = cm;
        barrier();
        for (uint q = 0u; q < TPR; ++q) cm = max(cm, ps[r * PLD + q]);
        float nm = max(m, cm);
        // no live key in this row yet: p and alpha stay 0 (acc and l are still 0)
        float alpha = m == NEG_INF ? 0.0 : exp(m - nm);
        barrier();                                   // the maxima are read
        for (uint q = 0u; q < KPT; ++q)
            ps[r * PLD + sub + q * TPR] = s[q] == NEG_INF ? 0.0 : exp(s[q] - nm);
        m = nm;
        barrier();                                   // p of the whole row is written
        float rs = 0.0;
        for (uint q = 0u; q < BK; ++q) rs += ps[r * PLD + q];
        l = l * alpha + rs;
        for (uint j = 0u; j < DPT; ++j) {
            uint g = sub + j * TPR;
            if (g >= DVW) break;
            VT a = acc[j] * alpha;
            for (uint q = 0u; q < keys; ++q) a += ps[r * PLD + q] * vs[q * DVW + g];
            acc[j] = a;
        }
    }
    if (!row_in) return;
    for (uint j = 0u; j < DPT; ++j) {
        uint g = sub + j * TPR;
        if (g >= DVW) break;
        VT a = acc[j] / l;                                  // l = 0 (all masked): NaN
        uint o = (h * T + t) * DV + g * VW;
#if VW == 4
        outb[o] = st_f32(a.x); outb[o + 1u] = st_f32(a.y); outb[o + 2u] = st_f32(a.z); outb[o + 3u] = st_f32(a.w);
#else
        outb[o] = st_f32(a);
#endif
    }
}
