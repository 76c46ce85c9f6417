// Attention of a prompt (many query rows) over a key/value cache, register-tiled: one
// workgroup per (query head, block of BQ query rows), the last blocks first. The block's
// q rows sit in shared memory; keys come in chunks of BK, whose K rows (then V rows) are
// loaded into shared memory once for all BQ rows. Each invocation owns RPT rows of the block (a row group)
// and, of the TPRG invocations that share those rows, every TPRG-th key of a chunk for the
// scores (RPT x KPT of them in registers) and every TPRG-th vec4 of DV for the output
// (RPT x CV vec4 accumulators): each shared-memory read of q, K, p or V feeds RPT or KPT
// multiply-adds, where a kernel with one row per invocation group re-reads them for every
// row. An online softmax per row carries the running max (met through shared memory,
// once a chunk) and each invocation's partial sum of its own keys' weights (summed over the
// row group at the end), rescaling the output when the max grows. Each row's live keys come
// from mask_ranges.comp (binding 5): the block walks the keys between its rows' first and
// last unmasked ones (a causal prompt's block skips the chunks past its last row), and a
// row whose live keys are one interval tests a key against it instead of loading the mask.
// A masked key scores -inf; a row with no unmasked key gets NaN, as eager's softmax gives.
// SOFTCAP_BITS > 0: a score s becomes tanh(s / cap) * cap before the mask and the softmax
// (Gemma 2). Head dims need not be multiples of 4: rows
// are zero padded to whole vec4s in shared memory. KV_APART: K and V have shared arrays of
// their own (V's loads are issued with K's); without it V reuses K's after the scores.
// Q_VEC4 / K_VEC4 / V_VEC4: the operand's rows are unit stride, 16-byte aligned, loaded as
// vec4s. Global loads of a tile are all issued before any is stored (bytes in flight).
// The specialisation constants are attention.comp's; lowering/attention.py picks BQ, BK,
// RPT and TPRG (tiled_config).
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#define RG (BQ / RPT)                   // row groups
#define WG (RG * TPRG)
#define KPT (BK / TPRG)                 // keys per invocation and chunk
#define D4 ((D + 3u) / 4u)              // a q or K row, in vec4s
#define DV4 ((DV + 3u) / 4u)            // a V row, in vec4s
#define CV ((DV4 + TPRG - 1u) / TPRG)   // output vec4s per invocation and row
#define QLD (D4 + 1u)                   // padded by one vec4: rows read at once in different banks
#if BQ % RPT != 0 || BK % TPRG != 0
#error BQ must be a multiple of RPT and BK of TPRG
#endif
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
IN_BUFFER(5, ranges)      // per row: first live key, one past the last, 1 if all between are live
layout(set = 0, binding = 1) readonly buffer Buf1v { vec4 qv4[]; };
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 kv4[]; };
layout(set = 0, binding = 3) readonly buffer Buf3v { vec4 vv4[]; };
#define NEG_INF uintBitsToFloat(0xff800000u)
#define K_ELEMS (BK * QLD)
#define V_ELEMS (BK * DV4)
#ifdef KV_APART
#define V_AT K_ELEMS                    // V's rows after K's
#define KV_ELEMS (K_ELEMS + V_ELEMS)
#else
#define V_AT 0u                         // V's rows where K's were
#define KV_ELEMS (K_ELEMS > V_ELEMS ? K_ELEMS : V_ELEMS)
#endif
shared vec4 qs[BQ * QLD];
shared vec4 kvs[KV_ELEMS];
shared float ps[BK * BQ];              // the chunk's weights, key-major: ps[key * BQ + row]
shared float red[BQ * TPRG];           // per-invocation row maxima, then row sums
shared uint blk_lo, blk_hi;            // the block's live keys

// vec4 i (elements 4i .. 4i + 3, zeros past n) of the row at word o of a unit-or-strided
// operand; which: 0 q, 1 k, 2 v
vec4 row4(uint o, uint sd, uint i, uint n, bool vec, uint which) {
    if (vec) {      // whole vec4s: n is a multiple of 4, o of 4
        uint w = (o >> 2) + i;
        return which == 0u ? qv4[w] : which == 1u ? kv4[w] : vv4[w];
    }
    vec4 r = vec4(0.0);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        uint d = 4u * i + e, w = o + d * sd;
        if (d < n) r[e] = ld_f32(which == 0u ? qb[w] : which == 1u ? kb[w] : vb[w]);
    }
    return r;
}

#ifdef Q_VEC4
#define QV true
#else
#define QV false
#endif
#ifdef K_VEC4
#define KV true
#else
#define KV false
#endif
#ifdef V_VEC4
#define VV true
#else
#define VV false
#endif

// rows [0, keys) of the chunk from key c0 on, zeros after: K into kvs[r * QLD ..], V into
// kvs[V_AT + r * DV4 ..]; every invocation's loads issued before its stores
#define K_PER ((BK * D4 + WG - 1u) / WG)
#define V_PER ((BK * DV4 + WG - 1u) / WG)
void load_k(uint kvh, uint c0, uint keys) {
    vec4 w[K_PER];
    [[unroll]] for (uint u = 0u; u < K_PER; ++u) {
        uint e = gl_LocalInvocationID.x + u * WG, kr = e / D4, i = e % D4;
        w[u] = e < BK * D4 && kr < keys ? row4(K_OFF + kvh * K_SH + (c0 + kr) * K_SC, K_SD, i, D, KV, 1u) : vec4(0.0);
    }
    [[unroll]] for (uint u = 0u; u < K_PER; ++u) {
        uint e = gl_LocalInvocationID.x + u * WG;
        if ((BK * D4) % WG == 0u || e < BK * D4) kvs[(e / D4) * QLD + e % D4] = w[u];
    }
}

void load_v(uint kvh, uint c0, uint keys) {
    vec4 w[V_PER];
    [[unroll]] for (uint u = 0u; u < V_PER; ++u) {
        uint e = gl_LocalInvocationID.x + u * WG, vr = e / DV4, i = e % DV4;
        w[u] = e < BK * DV4 && vr < keys ? row4(V_OFF + kvh * V_SH + (c0 + vr) * V_SC, V_SD, i, DV, VV, 2u) : vec4(0.0);
    }
    [[unroll]] for (uint u = 0u; u < V_PER; ++u) {
        uint e = gl_LocalInvocationID.x + u * WG;
        if ((BK * DV4) % WG == 0u || e < BK * DV4) kvs[V_AT + e] = w[u];
    }
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
    // heaviest blocks first, every head's at once: a causal prompt's last blocks walk the
    // most keys, and started first they share the GPU with the light ones that follow
    // instead of running alone at the end; a block's heads read the same K and V rows
    uint h = wid % HQ, t0 = (blocks - 1u - wid / HQ) * BQ, kvh = h / GROUP;
    uint lid = gl_LocalInvocationID.x, g = lid / TPRG, kg = lid % TPRG;
    // the block's live keys: from the first unmasked key of any of its rows to the last
    // (an invocation a row: their loads in flight together)
    if (lid == 0u) {
        blk_lo = C;
        blk_hi = 0u;
    }
    barrier();
    for (uint r = lid; r < min(BQ, T - t0); r += WG) {
        atomicMin(blk_lo, ranges[3u * (t0 + r)]);
        atomicMax(blk_hi, ranges[3u * (t0 + r) + 1u]);
    }
    barrier();
    uint k0 = blk_lo, k1 = max(blk_lo, blk_hi);
    // this invocation's rows: their live interval where it is one (else lo > hi: the mask)
    uint lo[RPT], hi[RPT];
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        uint t = min(t0 + g * RPT + r, T - 1u);
        bool dense = ranges[3u * t + 2u] != 0u;
        lo[r] = dense ? ranges[3u * t] : 1u;
        hi[r] = dense ? ranges[3u * t + 1u] : 0u;
    }
    {
        vec4 w[(BQ * D4 + WG - 1u) / WG];
        [[unroll]] for (uint u = 0u; u < w.length(); ++u) {
            uint e = lid + u * WG, qr = e / D4, i = e % D4;
            w[u] = e < BQ * D4 && t0 + qr < T ? row4(Q_OFF + h * Q_SH + (t0 + qr) * Q_ST, Q_SD, i, D, QV, 0u) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0u; u < w.length(); ++u) {
            uint e = lid + u * WG;
            if (e < BQ * D4) qs[(e / D4) * QLD + e % D4] = w[u];
        }
    }
    float scale = uintBitsToFloat(SCALE_BITS);
    float m[RPT], l[RPT];
    vec4 acc[RPT][CV];
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0;
        [[unroll]] for (uint j = 0u; j < CV; ++j) acc[r][j] = vec4(0.0);
    }
    for (uint c0 = k0; c0 < k1; c0 += BK) {
        uint keys = min(BK, k1 - c0);
        barrier();                                   // the last chunk's V and p are read
        load_k(kvh, c0, keys);
#ifdef KV_APART
        load_v(kvh, c0, keys);
#endif
        barrier();
        float s[RPT][KPT];
        [[unroll]] for (uint r = 0u; r < RPT; ++r)
            [[unroll]] for (uint j = 0u; j < KPT; ++j) s[r][j] = 0.0;
        [[unroll]] for (uint i = 0u; i < D4; ++i) {
            vec4 qr[RPT];
            [[unroll]] for (uint r = 0u; r < RPT; ++r) qr[r] = qs[(g * RPT + r) * QLD + i];
            [[unroll]] for (uint j = 0u; j < KPT; ++j) {
                vec4 kr = kvs[(kg + j * TPRG) * QLD + i];
                [[unroll]] for (uint r = 0u; r < RPT; ++r) s[r][j] += dot(qr[r], kr);
            }
        }
        // scaled, capped and masked; this invocation's maximum of each row
        [[unroll]] for (uint r = 0u; r < RPT; ++r) {
            uint t = t0 + g * RPT + r;
            float cm = NEG_INF;
            [[unroll]] for (uint j = 0u; j < KPT; ++j) {
                uint kj = kg + j * TPRG, c = c0 + kj;
                bool live = t < T && kj < keys &&
                    (lo[r] <= hi[r] ? c >= lo[r] && c < hi[r] : ld_b(mb[M_OFF + min(t, T - 1u) * M_ST + min(c, C - 1u) * M_SC]));
                s[r][j] = live ? capped(s[r][j] * scale) : NEG_INF;
                cm = max(cm, s[r][j]);
            }
            red[(g * RPT + r) * TPRG + kg] = cm;
        }
        barrier();                                   // the maxima are written, K is read
#ifndef KV_APART
        load_v(kvh, c0, keys);
#endif
        [[unroll]] for (uint r = 0u; r < RPT; ++r) {
            float nm = m[r];
            [[unroll]] for (uint q = 0u; q < TPRG; ++q) nm = max(nm, red[(g * RPT + r) * TPRG + q]);
            // no live key in this row yet: p and alpha stay 0 (acc and l are still 0)
            float alpha = m[r] == NEG_INF ? 0.0 : exp(m[r] - nm), ls = 0.0;
            [[unroll]] for (uint j = 0u; j < KPT; ++j) {
                float p = s[r][j] == NEG_INF ? 0.0 : exp(s[r][j] - nm);
                ps[(kg + j * TPRG) * BQ + g * RPT + r] = p;
                ls += p;
            }
            m[r] = nm;
            l[r] = l[r] * alpha + ls;
            [[unroll]] for (uint j = 0u; j < CV; ++j) acc[r][j] *= alpha;
        }
        barrier();                                   // p and V are written
        // every key of the chunk: past `keys`, p and V's rows are zeros
        [[unroll]] for (uint kj = 0u; kj < BK; ++kj) {
            float p[RPT];
            [[unroll]] for (uint r = 0u; r < RPT; ++r) p[r] = ps[kj * BQ + g * RPT + r];
            [[unroll]] for (uint j = 0u; j < CV; ++j) {
                uint col = kg + j * TPRG;
                if (DV4 % TPRG == 0u || col < DV4) {
                    vec4 vr = kvs[V_AT + kj * DV4 + col];
                    [[unroll]] for (uint r = 0u; r < RPT; ++r) acc[r][j] += p[r] * vr;
                }
            }
        }
    }
    // each row's sum over the TPRG invocations' keys
    barrier();
    [[unroll]] for (uint r = 0u; r < RPT; ++r) red[(g * RPT + r) * TPRG + kg] = l[r];
    barrier();
    [[unroll]] for (uint r = 0u; r < RPT; ++r) {
        uint t = t0 + g * RPT + r;
        if (t >= T) continue;
        float sum = 0.0;
        for (uint q = 0u; q < TPRG; ++q) sum += red[(g * RPT + r) * TPRG + q];
        [[unroll]] for (uint j = 0u; j < CV; ++j) {
            uint col = kg + j * TPRG;
            if (col >= DV4) continue;
            vec4 a = acc[r][j] / sum;                     // sum = 0 (all masked): NaN
            uint o = (h * T + t) * DV + 4u * col;
            [[unroll]] for (uint e = 0u; e < 4u; ++e)
                if (4u * col + e < DV) outb[o + e] = st_f32(a[e]);
        }
    }
}
