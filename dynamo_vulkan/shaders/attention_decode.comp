// A decode step's attention (one query row per head) on a GPU: one workgroup per (kv
// head, split of the keys) takes the GR query heads that share the kv head, so each K
// and V row is loaded once for all of them, and a kv head's splits are few workgroups
// (a workgroup per query head and split ran past one wave of the GPU, and its merge waited
// for the second: docs/journal.md, session 39).
// Per chunk of KPP keys: TPK consecutive invocations share a key's dot products with the
// GR query rows (partial sums met by subgroup shuffles: TPK is at most the subgroup
// size); a dead key (masked) loads nothing; the scores go to shared memory, double-
// buffered, so a chunk holds one barrier. Then each invocation owns OPI (query row,
// output lane) pairs and walks the chunk's keys for them: the row's running max from
// the scores in shared memory, then every key's V lane, VB at a time with a fixed trip
// count so that the loads issue together. A masked key adds nothing (its V row is not read into the
// sum). A chunk with no live key for a row leaves that row as it was.
// SPLITS > 1: each split writes its rows' max, sum and unnormalised output, and the kv
// head's last split to arrive (last_arrival.glsl) merges them into out.
// Defines: WG, VW (4: vec4 rows), D, DV, GR (= GROUP), TPK, SPLITS, and the decode
// fusions of attention_io.glsl (Q_LAZY, PENDING); lowering/attention.py derives them.
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
layout(local_size_x = WG) in;
#include "attention_io.glsl"

#define KPP (WG / TPK)                 // keys per chunk
#define DVL (DV / VW)                  // output lanes of a row
#define NOUT (GR * DVL)                // (query row, output lane) pairs of a workgroup
#define OPI ((NOUT + WG - 1) / WG)     // ... per invocation
#define VB (KPP < 8 ? KPP : 8)         // V rows loaded together (KPP is a power of two)

#if VW == 4
#define VT vec4
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 kv4[]; };
layout(set = 0, binding = 3) readonly buffer Buf3v { vec4 vv4[]; };
#define LDK(o) kv4[(o) >> 2]
#define LDV(o) vv4[(o) >> 2]
#define DOTV(a, b) dot(a, b)
#define LDQ(o) uintBitsToFloat(uvec4(qb[o], qb[(o) + Q_SD], qb[(o) + 2u * Q_SD], qb[(o) + 3u * Q_SD]))
#define QLAZY(r, e) vec4(qget(r, e), qget(r, (e) + 1u), qget(r, (e) + 2u), qget(r, (e) + 3u))
#define KNEW(h, e) vec4(knew(h, e), knew(h, (e) + 1u), knew(h, (e) + 2u), knew(h, (e) + 3u))
#define VNEW(h, e) vec4(vnew(h, e), vnew(h, (e) + 1u), vnew(h, (e) + 2u), vnew(h, (e) + 3u))
#define STORE(buf, o, val) buf[o] = st_f32(val.x); buf[(o) + 1u] = st_f32(val.y); buf[(o) + 2u] = st_f32(val.z); buf[(o) + 3u] = st_f32(val.w)
#define LOAD4(buf, o) uintBitsToFloat(uvec4(buf[o], buf[(o) + 1u], buf[(o) + 2u], buf[(o) + 3u]))
#else
#define VT float
#define LDK(o) ld_f32(kb[o])
#define LDV(o) ld_f32(vb[o])
#define DOTV(a, b) ((a) * (b))
#define LDQ(o) ld_f32(qb[o])
#define QLAZY(r, e) qget(r, e)
#define KNEW(h, e) knew(h, e)
#define VNEW(h, e) vnew(h, e)
#define STORE(buf, o, val) buf[o] = st_f32(val)
#define LOAD4(buf, o) ld_f32(buf[o])
#endif

shared VT qs[GR][D / VW];
shared float ss[2][GR][KPP];           // a chunk's scores (NEG_INF: masked), by chunk parity

#if SPLITS > 1
// the kv head's splits merged by the last to arrive: each (row, lane) pair's invocation
// weighs every split's output by exp(its max - the row's max); the maxima and sums go
// through shared memory first
shared float c_m[GR][SPLITS];
shared float c_l[GR][SPLITS];
void combine(uint kvh) {
    uint lid = gl_LocalInvocationID.x;
    for (uint i = lid; i < GR * SPLITS; i += WG) {
        uint g = i / SPLITS, s = i % SPLITS, p = ((kvh * SPLITS + s) * GR + g) * (DV + 2u);
        c_m[g][s] = ld_f32(part_b[p]);
        c_l[g][s] = ld_f32(part_b[p + 1u]);
    }
    barrier();
    [[unroll]] for (uint j = 0u; j < OPI; ++j) {
        uint o = lid + j * WG;
        if (o < NOUT) {
            uint g = o / DVL, lane = o % DVL;
            float mx = NEG_INF;
            [[unroll]] for (uint s = 0u; s < SPLITS; ++s) mx = max(mx, c_m[g][s]);
            VT vs[SPLITS];
            [[unroll]] for (uint s = 0u; s < SPLITS; ++s)
                vs[s] = LOAD4(part_b, ((kvh * SPLITS + s) * GR + g) * (DV + 2u) + 2u + lane * VW);
            VT a = VT(0.0);
            float l = 0.0;
            [[unroll]] for (uint s = 0u; s < SPLITS; ++s) {
                float w = c_m[g][s] == NEG_INF ? 0.0 : exp(c_m[g][s] - mx);   // a split with no live key: 0
                a += w > 0.0 ? w * vs[s] : VT(0.0);
                l += w * c_l[g][s];
            }
            a /= l;                              // l = 0 (all masked): NaN
            STORE(outb, (kvh * GROUP + g) * DV + lane * VW, a);
        }
    }
}
#endif

void main() {
    uint wid = flat_workgroup();
    if (wid >= (HQ / GROUP) * SPLITS) return;
    uint kvh = wid / SPLITS, split = wid % SPLITS, lid = gl_LocalInvocationID.x;
    uint k0 = split * SPLIT_KEYS, k1 = SPLITS > 1 ? min(C, k0 + SPLIT_KEYS) : C;
    for (uint i = lid; i < GR * (D / VW); i += WG) {
        uint g = i / (D / VW), e = i % (D / VW), h = kvh * GROUP + g;
#ifdef Q_LAZY
        qs[g][e] = QLAZY(h, e * VW);
#else
        qs[g][e] = LDQ(Q_OFF + h * Q_SH + e * VW * Q_SD);
#endif
    }
#ifdef PENDING
    int pi = int(idxb[IDX_OFF]);
    uint P = uint(pi < 0 ? pi + int(C) : pi);
#endif
    barrier();
    float scale = uintBitsToFloat(SCALE_BITS);
    uint kslot = lid / TPK, sub = lid % TPK;
    float m[OPI], l[OPI];
    VT acc[OPI];
    [[unroll]] for (uint j = 0u; j < OPI; ++j) { m[j] = NEG_INF; l[j] = 0.0; acc[j] = VT(0.0); }
    uint par = 0u;
    for (uint c0 = k0; c0 < k1; c0 += KPP, par ^= 1u) {
        uint c = c0 + kslot;
        bool live = c < k1 && ld_b(mb[M_OFF + min(c, k1 - 1u) * M_SC]);
        float qk[GR];
        [[unroll]] for (uint g = 0u; g < GR; ++g) qk[g] = 0.0;
        if (live) {
            uint kbase = K_OFF + kvh * K_SH + c * K_SC;
            for (uint i = sub; i < D / VW; i += TPK) {
#ifdef PENDING
                VT kk = c == P ? KNEW(kvh, i * VW) : LDK(kbase + i * VW * K_SD);
#else
                VT kk = LDK(kbase + i * VW * K_SD);
#endif
                [[unroll]] for (uint g = 0u; g < GR; ++g) qk[g] += DOTV(qs[g][i], kk);
            }
        }
        [[unroll]] for (uint x = 1u; x < TPK; x <<= 1)
            [[unroll]] for (uint g = 0u; g < GR; ++g) qk[g] += subgroupShuffleXor(qk[g], x);
        if (sub == 0u) {
            [[unroll]] for (uint g = 0u; g < GR; ++g) ss[par][g][kslot] = live ? capped(qk[g] * scale) : NEG_INF;
        }
        barrier();
        [[unroll]] for (uint j = 0u; j < OPI; ++j) {
            uint o = lid + j * WG;
            if (o >= NOUT) continue;
            uint g = o / DVL, lane = o % DVL;
            float cm = NEG_INF;
            [[unroll]] for (uint k = 0u; k < KPP; ++k) cm = max(cm, ss[par][g][k]);
            if (cm == NEG_INF) continue;         // no live key of the chunk for this row
            float nm = max(m[j], cm), alpha = exp(m[j] - nm);   // 0 on the first live chunk
            uint vbase = V_OFF + kvh * V_SH + lane * VW * V_SD;
            VT a = acc[j] * alpha;
            float ls = 0.0;
            [[unroll]] for (uint kb0 = 0u; kb0 < KPP; kb0 += VB) {
                VT vr[VB];
                [[unroll]] for (uint k = 0u; k < VB; ++k) {
                    uint key = min(c0 + kb0 + k, k1 - 1u);     // past the split's end: unused
#ifdef PENDING
                    vr[k] = key == P ? VNEW(kvh, lane * VW) : LDV(vbase + key * V_SC);
#else
                    vr[k] = LDV(vbase + key * V_SC);
#endif
                }
                [[unroll]] for (uint k = 0u; k < VB; ++k) {
                    float s = ss[par][g][kb0 + k];
                    float p = s == NEG_INF ? 0.0 : exp(s - nm);
                    a += s == NEG_INF ? VT(0.0) : p * vr[k];
                    ls += p;
                }
            }
            acc[j] = a;
            l[j] = l[j] * alpha + ls;
            m[j] = nm;
        }
    }
#if SPLITS > 1
    [[unroll]] for (uint j = 0u; j < OPI; ++j) {
        uint o = lid + j * WG;
        if (o < NOUT) {
            uint g = o / DVL, lane = o % DVL, p = (wid * GR + g) * (DV + 2u);
            if (lane == 0u) { part_b[p] = st_f32(m[j]); part_b[p + 1u] = st_f32(l[j]); }
            STORE(part_b, p + 2u + lane * VW, acc[j]);
        }
    }
    if (last_to_arrive(kvh, SPLITS)) combine(kvh);
#else
    [[unroll]] for (uint j = 0u; j < OPI; ++j) {
        uint o = lid + j * WG;
        if (o < NOUT) {
            uint g = o / DVL, lane = o % DVL;
            VT a = acc[j] / l[j];                // l = 0 (all masked): NaN
            STORE(outb, (kvh * GROUP + g) * DV + lane * VW, a);
        }
    }
#endif
}
