// Attention over a key/value cache (dynamo_vulkan.attention). One workgroup per
// (query head, query row, split of the keys). Keys come in chunks of KPP; TPK
// invocations share one key's dot product with the query (held in shared
// memory), and masked keys score -inf. An online softmax carries the running
// max and sum across chunks, rescaling the accumulated output when the max
// grows; a chunk whose keys are all masked is skipped, so a decode step reads
// the cache only up to its position. For the weighted sum of V rows, invocation
// i owns output lanes i % DVLP (+ DVLP, ...) and every PARTS-th key of the
// chunk; the parts meet in shared memory at the end.
// VPK > 0 (decode's splits): each invocation's V rows of a chunk (VPK of them) are
// loaded with its key, before the softmax, so the chunk waits on memory once.
// SPLITS > 1 (decode: few rows, so the keys are spread over more workgroups):
// each split writes its max, sum and unnormalised output to a scratch buffer,
// then counts itself in on the row's counter (an atomic); the row's last split
// to arrive merges them all and resets the counter to 0 for the next call, so a
// decode step's attention is one kernel and one barrier level.
// Decode fusions: Q_LAZY, q is an elementwise expression (its RoPE) computed as it
// is loaded; PENDING, the step's K and V rows, which a scatter writes into the caches
// beside this kernel (same barrier level), are computed here for key P (read from
// the scatter's index) and the caches are never read at P.
// RANGES_BINDING (decode's splits): the row's live keys come from mask_ranges.comp, made
// once for every layer, and are cut evenly into the splits (whole chunks each), so the
// splits walk as few chunks as those keys allow and none scans the mask; the keys in
// range still read the mask. Without it, each workgroup finds its keys' live range in
// the mask: chunks outside it (a prompt's keys past its last row in a longer cache, a
// decode step's past its position, a sliding window's before it) cost no loads and no
// barriers; a split with none loads nothing else and only counts itself in for the merge.
// PLANES_BINDING (decode's splits, DV a multiple of 32): the merge also writes each row's
// output as int8 planes (xplanes.glsl, PLANES and NIBBLES; row r's blocks r * DV / 32 ..),
// which the output projection's integer-dot mat-vec reads (its x is the heads' outputs in
// order), so its planes cost no kernel and no barrier level of their own.
// SOFTCAP_BITS > 0 (Gemma 2): a score s = scale * q.k becomes tanh(s / cap) * cap before
// the mask and the softmax; 0 leaves it as is (a specialisation constant, so the branch
// folds away).
// lowering/attention.py derives every parameter.
#extension GL_EXT_control_flow_attributes : enable
#ifdef CPU_LANES
#extension GL_KHR_shader_subgroup_shuffle : enable
#endif
#include "common.glsl"
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
#ifdef RANGES_BINDING
// decode's splits: each mask row's live keys (mask_ranges.comp: first, one past the last)
IN_BUFFER(RANGES_BINDING, rangesb)
#endif
#ifdef PLANES_BINDING
#if DV % 32 != 0
#error "the output's planes take whole blocks of 32"
#endif
#include "xplanes.glsl"
BUFFER(PLANES_BINDING, planesb)
#endif
#include "wg_reduce.glsl"
#define NEG_INF uintBitsToFloat(0xff800000u)

// a score's soft-cap: tanh(s / cap) * cap, or s itself when SOFTCAP_BITS is 0
float capped(float s) {
    if (SOFTCAP_BITS == 0u) return s;
    float cap = uintBitsToFloat(SOFTCAP_BITS);
    return tanh_f(s / cap) * cap;
}

#if SPLITS > 1
#if SPLITS > WG
#error "the merge takes one invocation per split"
#endif
#define C_DVC (DV < WG ? DV : WG)     // output lanes per pass of the merge
#define C_G (WG / C_DVC)              // groups of splits per output lane
shared float c_w[SPLITS];
shared float c_acc[WG];
#ifdef PLANES_BINDING
shared float c_row[DV];     // the merged row, for its planes
shared ivec2 c_sums[DV / 4u];
#if DV / 4 > WG
#error "the output's planes take an invocation per word of a plane"
#endif
void row_planes(uint row);
#endif
#define C_NS ((SPLITS + C_G - 1) / C_G)   // splits per invocation of an output lane
// out[row] = the splits' outputs merged by their softmax weights: an invocation per
// split for the maxima and sums, then C_G invocations per output lane, each over every
// C_G-th split. Each invocation loads all its splits' values into registers before it
// adds any: the scratch is coherent, and a load followed by its add waits for the value
// before the next load issues (one invocation looping over every split waits on each
// load in turn: docs/journal.md, session 29). Every invocation calls it.
void combine(uint row) {
    uint base = row * SPLITS * (DV + 2u), lid = gl_LocalInvocationID.x;
    float ms = NEG_INF, ls = 0.0;
    if (lid < SPLITS) {
        uint p = base + lid * (DV + 2u);
        ms = ld_f32(part_b[p]);
        ls = ld_f32(part_b[p + 1u]);
    }
    float mx = wg_max(ms);
    float w = lid < SPLITS ? exp(ms - mx) : 0.0;   // every key masked (mx = -inf): NaN
    float l = wg_sum(ls * w);
    if (lid < SPLITS) c_w[lid] = w;
    barrier();
    uint lane = lid % C_DVC, grp = lid / C_DVC;
    for (uint d0 = 0u; d0 < DV; d0 += C_DVC) {
        uint d = d0 + lane;
        float a = 0.0;
        if (grp < C_G && d < DV) {
            float vs[C_NS];
            [[unroll]] for (uint i = 0u; i < C_NS; ++i) {
                uint s = min(grp + i * C_G, SPLITS - 1u);      // past the last: unused
                vs[i] = ld_f32(part_b[base + s * (DV + 2u) + 2u + d]);
            }
            [[unroll]] for (uint i = 0u; i < C_NS; ++i) {
                uint s = grp + i * C_G;
                float ws = s < SPLITS ? c_w[s] : 0.0;
                a += ws > 0.0 ? vs[i] * ws : 0.0;     // a split with no live key: skipped
            }
        }
        c_acc[lid] = a;
        barrier();
        if (grp == 0u && d < DV) {
            float t = 0.0;
            for (uint g = 0u; g < C_G; ++g) t += c_acc[g * C_DVC + lane];
            outb[row * DV + d] = st_f32(t / l);       // l = 0 (all masked): NaN
#ifdef PLANES_BINDING
            c_row[d] = t / l;
#endif
        }
        barrier();
    }
#ifdef PLANES_BINDING
    row_planes(row);
#endif
}

#ifdef PLANES_BINDING
// the merged row's planes (c_row), 8 invocations a block, each making its word of every
// plane; the block's largest magnitude and plane sums meet in shared memory (c_acc, free
// after the merge's last barrier). Every invocation calls it (barriers).
void row_planes(uint row) {
    uint lid = gl_LocalInvocationID.x, j = lid >> 3, l = lid & 7u, b0 = 32u * j, first = lid & ~7u;
    bool live = lid < DV / 4u;
    vec4 v = vec4(0.0);
    if (live)
        v = vec4(c_row[b0 + xp_element(l, 0u)], c_row[b0 + xp_element(l, 1u)],
                 c_row[b0 + xp_element(l, 2u)], c_row[b0 + xp_element(l, 3u)]);
    c_acc[lid] = xp_word_max(v);
    barrier();
    float amax;
    bool nan_in;
    XP_BLOCK_MAX(c_acc, first, amax, nan_in)
    vec2 sc = xp_scale(amax, nan_in);
    ivec4 i0, i1, i2;
    xp_quantize(v, sc.y, i0, i1, i2);
    uint o = XP_WPB * (row * (DV / 32u) + j);
    ivec2 part = xp_sums(i0, i1, i2);
    if (live) {
        planesb[o + l] = xp_packed(i0);
        planesb[o + 8u + l] = xp_packed(i1);
#if PLANES == 3
        planesb[o + 16u + l] = xp_packed(i2);
#endif
        c_sums[lid] = part;
    }
    barrier();
    if (live && l == 0u) {
        ivec2 sums = ivec2(0);
        [[unroll]] for (uint i = 0u; i < 8u; ++i) sums += c_sums[first + i];
        planesb[o + 8u * PLANES] = floatBitsToUint(sc.x);
        planesb[o + 8u * PLANES + 1u] = floatBitsToUint(sc.x / XP_S1_DIV);
        planesb[o + 8u * PLANES + 2u] = uint(sums.x);
        planesb[o + 8u * PLANES + 3u] = uint(sums.y);
    }
}
#endif
#endif

#ifdef CPU_LANES
// CPU devices (lavapipe), prompts: a workgroup is one subgroup (WG = 8 lanes) and takes
// AR query rows of one kv head (its GROUP heads' rows, head by head). For each chunk of
// 8 keys, lane e owns key c0 + e for the dot products, and output vec4s e, e + 8, ...
// for the weighted sum. q sits spread over the lanes (vec4 e + 8j in lane e) and reaches
// every lane by subgroupShuffle, as p does: register shuffles, not loads, which on a CPU
// device cost alike whatever their pattern; each key's and V row's loads serve AR rows.
// No shared memory, no barrier; a chunk with no live key for any row costs its mask
// loads. Needs vec4 K and V rows (VW = 4); q is read through its strides.
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 kv4[]; };
layout(set = 0, binding = 3) readonly buffer Buf3v { vec4 vv4[]; };
#define QJ ((D / 4u + 7u) / 8u)      // q vec4s per lane and row
#define VJ ((DV / 4u + 7u) / 8u)     // output vec4s per lane and row
void main() {
    uint hkv = HQ / GROUP, rows = GROUP * T, blocks = (rows + AR - 1u) / AR;
    uint wid = flat_workgroup();
    if (wid >= hkv * blocks) return;
    uint kvh = wid / blocks, r0 = (wid % blocks) * AR, e = gl_SubgroupInvocationID;
    float scale = uintBitsToFloat(SCALE_BITS);
    vec4 q[AR][QJ], acc[AR][VJ];
    uint tr[AR];
    float m[AR], l[AR];
    [[unroll]] for (uint i = 0; i < AR; ++i) {
        uint r = min(r0 + i, rows - 1u), h = kvh * GROUP + r / T;      // rows past: clamped, unused
        tr[i] = r % T;
        m[i] = NEG_INF;
        l[i] = 0.0;
        [[unroll]] for (uint j = 0; j < QJ; ++j) {
            uint o = Q_OFF + h * Q_SH + tr[i] * Q_ST + (e + 8u * j) * 4u * Q_SD;
            q[i][j] = e + 8u * j < D / 4u ? uintBitsToFloat(uvec4(qb[o], qb[o + Q_SD], qb[o + 2u * Q_SD],
                                                                 qb[o + 3u * Q_SD])) : vec4(0.0);
        }
        [[unroll]] for (uint j = 0; j < VJ; ++j) acc[i][j] = vec4(0.0);
    }
    for (uint c0 = 0; c0 < C; c0 += 8u) {
        uint c = min(c0 + e, C - 1u);
        bool live[AR], any = false;
        [[unroll]] for (uint i = 0; i < AR; ++i) {
            live[i] = c0 + e < C && ld_b(mb[M_OFF + tr[i] * M_ST + c * M_SC]);
            any = any || live[i];
        }
        if (!subgroupAny(any)) continue;             // uniform: no row sees these keys
        float s[AR];
        [[unroll]] for (uint i = 0; i < AR; ++i) s[i] = 0.0;
        uint kbase = K_OFF + kvh * K_SH + c * K_SC;
        [[unroll]] for (uint sl = 0; sl < D / 4u; ++sl) {
            vec4 kk = kv4[(kbase + 4u * sl) >> 2];
            [[unroll]] for (uint i = 0; i < AR; ++i) s[i] += dot(subgroupShuffle(q[i][sl / 8u], sl % 8u), kk);
        }
        float p[AR];
        [[unroll]] for (uint i = 0; i < AR; ++i) {
            float si = live[i] ? capped(s[i] * scale) : NEG_INF;
            float cm = subgroupMax(si);
            p[i] = 0.0;
            if (cm == NEG_INF) continue;             // uniform: row i sees none of them
            float nm = max(m[i], cm), alpha = exp(m[i] - nm);   // 0 on its first live chunk
            p[i] = live[i] ? exp(si - nm) : 0.0;
            l[i] = l[i] * alpha + subgroupAdd(p[i]);
            m[i] = nm;
            [[unroll]] for (uint j = 0; j < VJ; ++j) acc[i][j] *= alpha;
        }
        uint keys = min(8u, C - c0);
        for (uint kk = 0; kk < keys; ++kk) {
            uint vbase = V_OFF + kvh * V_SH + (c0 + kk) * V_SC;
            vec4 vr[VJ];
            [[unroll]] for (uint j = 0; j < VJ; ++j)
                vr[j] = e + 8u * j < DV / 4u ? vv4[(vbase + 4u * (e + 8u * j)) >> 2] : vec4(0.0);
            [[unroll]] for (uint i = 0; i < AR; ++i) {
                float pk = subgroupShuffle(p[i], kk);
                [[unroll]] for (uint j = 0; j < VJ; ++j) acc[i][j] += pk * vr[j];
            }
        }
    }
    [[unroll]] for (uint i = 0; i < AR; ++i) {
        uint r = r0 + i, h = kvh * GROUP + r / T;
        if (r >= rows) break;
        [[unroll]] for (uint j = 0; j < VJ; ++j) {
            uint sl = e + 8u * j;
            if (sl >= DV / 4u) continue;
            vec4 a = acc[i][j] / l[i];               // l = 0 (all masked): NaN
            uint o = (h * T + tr[i]) * DV + 4u * sl;
            outb[o] = st_f32(a.x); outb[o + 1u] = st_f32(a.y); outb[o + 2u] = st_f32(a.z); outb[o + 3u] = st_f32(a.w);
        }
    }
}
#else

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
shared VT qs[D / VW];
shared float ps[KPP];
shared float sdot[TPK > 1 ? WG : 1];
shared VT red[WG * DPT];

void main() {
    uint wid = flat_workgroup();
    if (wid >= HQ * T * SPLITS) return;
    uint row = wid / SPLITS, split = wid % SPLITS;
    uint h = row / T, t = row % T, kvh = h / GROUP;
    uint lid = gl_LocalInvocationID.x;
#ifdef RANGES_BINDING
    // the row's live keys [lo, hi) cut into SPLITS runs of whole chunks (at least one), so
    // a split walks as few chunks as the live keys allow and no split scans the mask; a
    // split past the live keys gets an empty range
    uint lo = min(rangesb[3u * t], C), hi = max(lo, min(rangesb[3u * t + 1u], C));
    uint per = ((hi - lo + SPLITS - 1u) / SPLITS + KPP - 1u) / KPP * KPP;
    uint k0 = min(hi, lo + split * per), k1 = min(hi, k0 + per);
#else
    uint k0 = split * SPLIT_KEYS, k1 = SPLITS > 1 ? min(C, k0 + SPLIT_KEYS) : C;
    // the keys between the split's first and last unmasked ones, found in one pass over
    // its mask before anything else is loaded. Key indices are exact as floats (below
    // 2^24). No live key: an empty range, as if every chunk were skipped.
    float lo_f = float(k1), hi_f = float(k0);
    for (uint c = k0 + lid; c < k1; c += WG) {
        if (ld_b(mb[M_OFF + t * M_ST + c * M_SC])) { lo_f = min(lo_f, float(c)); hi_f = float(c + 1u); }
    }
    lo_f = -wg_max(-lo_f);
    hi_f = wg_max(hi_f);
    k0 = uint(lo_f);
    k1 = max(k0, uint(hi_f));
#endif
#if SPLITS > 1
    if (k0 >= k1) {     // no live key in this split (uniform): an empty part for the merge
        if (lid == 0u) { part_b[wid * (DV + 2u)] = st_f32(NEG_INF); part_b[wid * (DV + 2u) + 1u] = st_f32(0.0); }
#ifdef COUNTER_BINDING
        if (last_to_arrive(row, SPLITS)) combine(row);
#endif
        return;
    }
#endif
#ifdef Q_LAZY
    for (uint i = lid; i < D / VW; i += WG) qs[i] = QLAZY(h * T + t, i * VW);
#else
    for (uint i = lid; i < D / VW; i += WG) qs[i] = LDQ(Q_OFF + h * Q_SH + t * Q_ST + i * VW * Q_SD);
#endif
#ifdef PENDING
    int pi = int(idxb[IDX_OFF]);
    uint P = uint(pi < 0 ? pi + int(C) : pi);
#endif
    barrier();
    float scale = uintBitsToFloat(SCALE_BITS);
    uint part = lid / DVLP, lane0 = lid % DVLP;
    uint kslot = lid / TPK, sub = lid % TPK;
    bool owner = part < PARTS;
    float m = NEG_INF, l = 0.0;
    VT acc[DPT];
    for (uint j = 0; j < DPT; ++j) acc[j] = VT(0.0);
    for (uint c0 = k0; c0 < k1; c0 += KPP) {
        uint c = c0 + kslot;
        // the key's mask, its K row and (VPK) this invocation's V rows are loaded at
        // once, none waiting for another: past the last key the address is clamped
        // and the value unused
        uint cl = min(c, k1 - 1u);
        bool live = c < k1 && ld_b(mb[M_OFF + t * M_ST + cl * M_SC]);
        float s = NEG_INF;
        float qk = 0.0;
        uint kbase = K_OFF + kvh * K_SH + cl * K_SC;
#ifdef PENDING
        if (cl == P) {
            for (uint i = sub; i < D / VW; i += TPK) qk += DOTV(qs[i], KNEW(kvh, i * VW));
        } else
#endif
        for (uint i = sub; i < D / VW; i += TPK) qk += DOTV(qs[i], LDK(kbase + i * VW * K_SD));
#if VPK > 0
        VT vpre[DPT * VPK];
        if (owner) {
            for (uint j = 0; j < DPT; ++j) {
                uint lane = min(lane0 + j * DVLP, DVL - 1u);
                for (uint q = 0; q < VPK; ++q) {
                    uint key = min(c0 + part + q * PARTS, k1 - 1u);
                    vpre[j * VPK + q] = LDV_AT(key, V_OFF + kvh * V_SH + key * V_SC + lane * VW * V_SD,
                                               kvh, lane * VW);
                }
            }
        }
#endif
#if TPK > 1
        sdot[lid] = qk;
        barrier();
        if (sub == 0u) {
            for (uint j = 1; j < TPK; ++j) qk += sdot[lid + j];
        }
        live = live && sub == 0u;                // one invocation speaks for each key
#endif
        if (live) s = capped(qk * scale);
        float cm = wg_max(s);
        if (cm == NEG_INF) continue;            // the whole chunk is masked (uniform)
        float nm = max(m, cm);
        float alpha = exp(m - nm);              // 0 on the first live chunk (m = -inf)
        float p = live ? exp(s - nm) : 0.0;
        if (sub == 0u) ps[kslot] = p;
        l = l * alpha + wg_sum(p);              // its barriers also publish ps
        m = nm;
        uint keys = min(uint(KPP), k1 - c0);
        if (owner) {
            for (uint j = 0; j < DPT; ++j) {
                uint lane = lane0 + j * DVLP;
                if (lane >= DVL) break;
                VT a = acc[j] * alpha;
#if VPK > 0
                for (uint q = 0; q < VPK; ++q) {
                    uint i = part + q * PARTS;
                    if (i < keys) a += ps[i] * vpre[j * VPK + q];
                }
#else
                uint vbase = V_OFF + kvh * V_SH + (c0 + part) * V_SC + lane * VW * V_SD;
                for (uint i = part; i < keys; i += PARTS, vbase += PARTS * V_SC)
                    a += ps[i] * LDV_AT(c0 + i, vbase, kvh, lane * VW);
#endif
                acc[j] = a;
            }
        }
        barrier();                              // ps and sdot are rewritten next chunk
    }
    for (uint j = 0; j < DPT; ++j) red[lid * DPT + j] = acc[j];
    barrier();
#if SPLITS > 1
    uint pbase = wid * (DV + 2u);
    if (lid == 0u) { part_b[pbase] = st_f32(m); part_b[pbase + 1u] = st_f32(l); }
#endif
    if (part == 0u) {
        for (uint j = 0; j < DPT; ++j) {
            uint lane = lane0 + j * DVLP;
            if (lane >= DVL) break;
            VT a = VT(0.0);
            for (uint q = 0; q < PARTS; ++q) a += red[(q * DVLP + lane0) * DPT + j];
#if SPLITS > 1
            uint o = pbase + 2u + lane * VW;
#if VW == 4
            part_b[o] = st_f32(a.x); part_b[o + 1u] = st_f32(a.y);
            part_b[o + 2u] = st_f32(a.z); part_b[o + 3u] = st_f32(a.w);
#else
            part_b[o] = st_f32(a);
#endif
#else
            a /= l;                              // l = 0 (all masked): NaN
            STORE((h * T + t) * DV + lane * VW, a);
#endif
        }
    }
#ifdef COUNTER_BINDING
    if (last_to_arrive(row, SPLITS)) combine(row);
#endif
}
#endif
