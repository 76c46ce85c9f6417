// Decode attention on GPUs (one query row per head): a workgroup per (kv head, split of
// the keys) takes the G query heads that share the kv head (grouped-query attention), so
// each K and V row is loaded once for all of them, and a chunk of keys costs one barrier.
// Keys come in chunks of KC = WG / TPK. Score phase: TPK invocations per key dot its K row
// with the G q rows (in shared memory); the TPK partial sums meet by subgroup shuffles
// (SG_SUM: the device's subgroups hold whole groups of TPK) or through shared memory, and
// the scores go to shared memory, double-buffered, so the next chunk's scores may be
// written while this chunk's are read. Value phase: each invocation owns DPT slots of
// (query head, VW-wide output lane), reads its head's KC scores and carries the online
// softmax's max and sum itself (every lane of a head computes the same ones, so no
// reduction and no barrier). A masked key loads no K row and weighs 0.
// SPLITS > 1: each split writes its heads' max, sum and unnormalised output to a scratch
// buffer and counts itself in on the kv head's counter; the last to arrive merges the
// splits, each invocation its own slots. Q_LAZY, PENDING and SOFTCAP_BITS as in
// attention.comp. lowering/attention.py derives every parameter.
#ifdef SG_SUM
#extension GL_KHR_shader_subgroup_shuffle : enable
#endif
#include "common.glsl"
layout(local_size_x = WG) in;
#include "attention_common.glsl"

#define DQ (D / VW)          // q and K values of VW per row
#define DVL (DV / VW)        // output lanes of VW per head
#define SLOTS (G * DVL)
shared VT qs[G * DQ];
shared float ss[2][G * KC];
#ifndef SG_SUM
shared float red[WG * G];
#endif

void main() {
    uint wid = flat_workgroup();
    if (wid >= (HQ / G) * SPLITS) return;
    uint kvh = wid / SPLITS, split = wid % SPLITS, lid = gl_LocalInvocationID.x;
    uint k0 = split * SPLIT_KEYS, k1 = min(C, k0 + SPLIT_KEYS);
    // the score phase's key and lane: from the subgroup's own numbering, so a key's TPK
    // lanes share a subgroup whatever order the device gives its invocations
#ifdef SG_SUM
    uint sl = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#else
    uint sl = lid;
#endif
    uint kj = sl / TPK, ku = sl % TPK;
    for (uint i = lid; i < G * DQ; i += WG) {
        uint h = kvh * G + i / DQ, e = (i % DQ) * VW;
#ifdef Q_LAZY
        qs[i] = QLAZY(h * T, e);
#else
        qs[i] = LDQ(Q_OFF + h * Q_SH + e * Q_SD);
#endif
    }
#ifdef PENDING
    int pi = int(idxb[IDX_OFF]);
    uint P = uint(pi < 0 ? pi + int(C) : pi);
#endif
    barrier();
    float scale = uintBitsToFloat(SCALE_BITS);
    float m[DPT], l[DPT];
    VT acc[DPT];
    for (uint s = 0u; s < DPT; ++s) { m[s] = NEG_INF; l[s] = 0.0; acc[s] = VT(0.0); }
    uint buf = 0u;
    for (uint c0 = k0; c0 < k1; c0 += KC, buf ^= 1u) {
        // scores of the chunk's keys, every head
        uint c = c0 + kj;
        bool live = c < k1 && ld_b(mb[M_OFF + c * M_SC]);
        float part[G];
        for (uint h = 0u; h < G; ++h) part[h] = 0.0;
        if (live) {
            uint kbase = K_OFF + kvh * K_SH + c * K_SC;
            for (uint i = ku; i < DQ; i += TPK) {
#ifdef PENDING
                VT kk = c == P ? KNEW(kvh, i * VW) : LDK(kbase + i * VW * K_SD);
#else
                VT kk = LDK(kbase + i * VW * K_SD);
#endif
                for (uint h = 0u; h < G; ++h) part[h] += DOTV(qs[h * DQ + i], kk);
            }
        }
#ifdef SG_SUM
        for (uint o = 1u; o < TPK; o <<= 1)
            for (uint h = 0u; h < G; ++h) part[h] += subgroupShuffleXor(part[h], o);
        if (ku == 0u && kj < KC)
            for (uint h = 0u; h < G; ++h) ss[buf][h * KC + kj] = live ? capped(part[h] * scale) : NEG_INF;
#else
        for (uint h = 0u; h < G; ++h) red[sl * G + h] = part[h];
        barrier();
        if (ku == 0u) {
            for (uint h = 0u; h < G; ++h) {
                float t = 0.0;
                for (uint w = 0u; w < TPK; ++w) t += red[(sl + w) * G + h];
                ss[buf][h * KC + kj] = live ? capped(t * scale) : NEG_INF;
            }
        }
#endif
        barrier();
        // the weighted sum of V rows, each invocation its own slots
        uint keys = min(uint(KC), k1 - c0);
        for (uint s = 0u; s < DPT; ++s) {
            uint slot = lid + s * WG;
            if (slot >= SLOTS) break;
            uint hh = slot / DVL, lane = slot % DVL;
            float cm = NEG_INF;
            for (uint j = 0u; j < keys; ++j) cm = max(cm, ss[buf][hh * KC + j]);
            if (cm == NEG_INF) continue;            // no live key in the chunk (uniform)
            float nm = max(m[s], cm), alpha = exp(m[s] - nm);   // 0 on the first live chunk
            VT a = acc[s] * alpha;
            float ls = l[s] * alpha;
            uint vbase = V_OFF + kvh * V_SH + lane * VW * V_SD;
            for (uint j = 0u; j < keys; ++j) {
                float sc = ss[buf][hh * KC + j];
                float p = sc == NEG_INF ? 0.0 : exp(sc - nm);
                uint key = c0 + j;
                ls += p;
                a += p * LDV_AT(key, vbase + key * V_SC, kvh, lane * VW);
            }
            acc[s] = a;
            l[s] = ls;
            m[s] = nm;
        }
        // no barrier: the next chunk writes the other score buffer, and the one after
        // comes behind that chunk's barrier, which every invocation reaches only when
        // done with this one
    }
#if SPLITS > 1
    for (uint s = 0u; s < DPT; ++s) {
        uint slot = lid + s * WG;
        if (slot >= SLOTS) break;
        uint h = kvh * G + slot / DVL, lane = slot % DVL;
        uint pb = (h * SPLITS + split) * (DV + 2u);
        if (lane == 0u) { part_b[pb] = st_f32(m[s]); part_b[pb + 1u] = st_f32(l[s]); }
        uint o = pb + 2u + lane * VW;
#if VW == 4
        part_b[o] = st_f32(acc[s].x); part_b[o + 1u] = st_f32(acc[s].y);
        part_b[o + 2u] = st_f32(acc[s].z); part_b[o + 3u] = st_f32(acc[s].w);
#else
        part_b[o] = st_f32(acc[s]);
#endif
    }
    if (!last_to_arrive(kvh, SPLITS)) return;
    // the merge: each slot over every split, weighted by exp(its max - the max)
    for (uint s = 0u; s < DPT; ++s) {
        uint slot = lid + s * WG;
        if (slot >= SLOTS) break;
        uint h = kvh * G + slot / DVL, lane = slot % DVL;
        uint pb = h * SPLITS * (DV + 2u);
        float mx = NEG_INF;
        for (uint p = 0u; p < SPLITS; ++p) mx = max(mx, ld_f32(part_b[pb + p * (DV + 2u)]));
        VT a = VT(0.0);
        float ls = 0.0;
        for (uint p = 0u; p < SPLITS; ++p) {
            uint o = pb + p * (DV + 2u);
            float ms = ld_f32(part_b[o]);
            float w = ms == NEG_INF ? 0.0 : exp(ms - mx);      // a split with no live key: 0
            ls += w * ld_f32(part_b[o + 1u]);
            uint e = o + 2u + lane * VW;
#if VW == 4
            VT v = vec4(ld_f32(part_b[e]), ld_f32(part_b[e + 1u]), ld_f32(part_b[e + 2u]), ld_f32(part_b[e + 3u]));
#else
            VT v = ld_f32(part_b[e]);
#endif
            a += w > 0.0 ? w * v : VT(0.0);
        }
        VT r = a / ls;                                // ls = 0 (every key masked): NaN
        STORE(h * DV + lane * VW, r);
    }
#else
    for (uint s = 0u; s < DPT; ++s) {
        uint slot = lid + s * WG;
        if (slot >= SLOTS) break;
        uint h = kvh * G + slot / DVL, lane = slot % DVL;
        VT r = acc[s] / l[s];                         // l = 0 (every key masked): NaN
        STORE(h * DV + lane * VW, r);
    }
#endif
}
