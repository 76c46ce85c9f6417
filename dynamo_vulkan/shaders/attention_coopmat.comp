// Attention of a prompt on tensor cores (VK_KHR_cooperative_matrix), for fp32 q/k/v under
// torch's "high" and "medium" matmul precision: q k^T and p v multiplied as scaled fp16
// with fp32 sums, the online softmax in fp32. One workgroup per (query head, block of BQ =
// NSG * RQ query rows); subgroup sg owns RQ rows of the block. Keys come in chunks of BKC,
// whose K and V rows are loaded once for the block into shared memory as fp16:
//   - each q row and each K row is multiplied by a power of two that brings its largest
//     finite magnitude into [8, 16) (coopmat_convert.glsl's scaled_exp), so that no value
//     overflows fp16 and each keeps fp16's 11 significant bits; a score is multiplied back
//     by both powers (exact) with the softmax scale;
//   - each V row j is multiplied by its own power of two 2^e_j (as q's and K's), and its
//     weight p_j by 2^(G - e_j), so that each product p_j v_j is exact but for the factor
//     2^G, common to the chunk: G = 15 + the smallest e_j of the chunks so far (the largest
//     V row), which keeps every weight below 2^15; a weight loses precision only where its
//     product is below ~2^-29 of that row's magnitude. The output's accumulators hold
//     p v 2^G; when a chunk lowers G, they are multiplied down with the rows' rescaling.
// Each subgroup computes its scores S (RQ x BKC, fp32 accumulators) from q's fragments
// (held in shared memory) and K's, stores them to shared memory, where its lanes take each
// row's running maximum and sum (LPR lanes a row, or RPL rows a lane), write the weights p
// as fp16 and each row's rescaling factor; the output's fp32 accumulators (RQ x DV, held
// in registers across the chunks) are multiplied by their rows' factors element by
// element (each element's row read once from a fragment loaded from a table of row
// indices: elements of matrices of one type map to lanes alike) and p v added on the
// tensor cores. Each row's live keys come from mask_ranges.comp (binding 5), as in
// attention_tiled.comp: the block walks the keys between its rows' first and last live
// ones, and a row whose live keys are one interval tests a key against it. A masked key
// scores -inf; a row with no live key gets NaN, as eager's softmax gives. SOFTCAP_BITS > 0:
// tanh(s / cap) * cap (Gemma 2). D and DV are multiples of 8 and of the matrix shape's
// sides; Q_VEC4 / K_VEC4 / V_VEC4: unit-stride, 16-byte aligned rows, loaded as vec4s.
// The specialisation constants are attention.comp's; lowering/attention.py picks NSG and
// BKC (coopmat_config).
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_clustered : enable
#include "common.glsl"
#define CM_F16 1
#include "coopmat_convert.glsl"
#ifndef RQ
#define RQ 16                           // query rows a subgroup
#endif
#define BQ (NSG * RQ)
#define WG (NSG * SUBGROUP)
#define RM (RQ / CM_M)                  // fragments down a subgroup's rows
#define SN (BKC / CM_N)                 // score fragments across a chunk
#define PK (BKC / CM_K)                 // p's fragments along a chunk
#define DK (D / CM_K)                   // q's fragments along the head dim
#define ON (DV / CM_N)                  // output fragments across DV
#if RQ % CM_M != 0 || BKC % CM_N != 0 || BKC % CM_K != 0 || D % CM_K != 0 || DV % CM_N != 0 || \
    D % 8 != 0 || DV % 8 != 0 || BKC % 8 != 0
#error attention_coopmat: RQ, BKC, D and DV must be multiples of the matrix shape's sides and of 8
#endif
#if SUBGROUP >= RQ
#define LPR (SUBGROUP / RQ)             // lanes a row in the softmax
#define RPL 1
#else
#define LPR 1
#define RPL (RQ / SUBGROUP)             // rows a lane
#endif
#define KPL (BKC / LPR)                 // a lane's keys of a row, consecutive
#if LPR > 1
#define ROW_MAX(x) subgroupClusteredMax(x, LPR)
#define ROW_SUM(x) subgroupClusteredAdd(x, LPR)
#else
#define ROW_MAX(x) (x)
#define ROW_SUM(x) (x)
#endif
#define ELEMS (CM_M * CM_N / SUBGROUP)  // an accumulator's elements a lane
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
#define NONE 1000                       // no power of two (yet)

// ---- shared memory, in uvec4 units (8 fp16 or 4 fp32): fp16 rows padded by 8 elements
#define QLD (D + 8u)                    // q: row-major (row, d)
#define KLD (D + 8u)                    // K: key-major, read as column-major B (d, key)
#define VLD (DV + 8u)                   // V: row-major B (key, dv)
#define SLD (BKC + 4u)                  // a subgroup's scores, fp32, row-major
#define PLD (BKC + 8u)                  // a subgroup's weights, fp16, row-major
#define Q_AT 0u
#define K_AT (Q_AT + BQ * QLD / 8u)
#define V_AT (K_AT + BKC * KLD / 8u)
#define S_AT (V_AT + BKC * VLD / 8u)
#define S_SG (RQ * SLD / 4u)            // one subgroup's scores
#define P_AT (S_AT + NSG * S_SG)
#define P_SG (RQ * PLD / 8u)
#define R_AT (P_AT + NSG * P_SG)        // the row-index table: CM_M x CM_N fp32
#define SMEM (R_AT + CM_M * CM_N / 4u)
shared uvec4 sm[SMEM];
shared uint qmax[BQ];                   // each q row's largest finite magnitude (float bits)
shared uint kmax[BKC];                  // ... each K row's of the chunk
shared uint vkmax[BKC];                 // ... each V row's of the chunk
shared uint vmax;                       // ... the V chunk's
shared int kexp[BKC];                   // each K row's scale exponent
shared int vexp[BKC];                   // ... each V row's (NONE: a row of zeros)
shared float qfac[BQ];                  // each q row's score factor: scale * 2^-e_q
shared float rowf[NSG * RQ];            // each row's output factor this chunk; the sums at the end

// vec4 i (elements 4i .. 4i + 3) of the row at word o of an operand; which: 0 q, 1 k, 2 v
vec4 row4(uint o, uint sd, uint i, bool vec, uint which) {
    if (vec) {
        uint w = (o >> 2) + i;
        return which == 0u ? qv4[w] : which == 1u ? kv4[w] : vv4[w];
    }
    vec4 r;
    [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        uint w = o + (4u * i + e) * sd;
        r[e] = ld_f32(which == 0u ? qb[w] : which == 1u ? kb[w] : vb[w]);
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

// the largest finite magnitude of 8 values, as float bits (non-negative floats order as
// their bits)
uint finite_max(vec4 a, vec4 b) {
    vec4 m = max(abs(a), abs(b));
    uint r = 0u;
    [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        uint x = floatBitsToUint(m[e]);
        if (x < 0x7f800000u) r = max(r, x);
    }
    return r;
}

// 8 values times 2^e as fp16 pairs
uvec4 to_f16(vec4 a, vec4 b, int e) {
    float f = pow2(e);
    a *= f;
    b *= f;
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

float capped(float s) {
    if (SOFTCAP_BITS == 0u) return s;
    float cap = uintBitsToFloat(SOFTCAP_BITS);
    return tanh_f(s / cap) * cap;
}

#define Q_OCT (BQ * D / 8u)
#define K_OCT (BKC * D / 8u)
#define V_OCT (BKC * DV / 8u)
#define Q_PER ((Q_OCT + WG - 1u) / WG)
#define K_PER ((K_OCT + WG - 1u) / WG)
#define V_PER ((V_OCT + WG - 1u) / WG)

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>

void main() {
    uint blocks = (T + BQ - 1u) / BQ;
    uint wid = flat_workgroup();
    if (wid >= HQ * blocks) return;
    uint h = wid / blocks, t0 = (wid % blocks) * BQ, kvh = h / GROUP;
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    float scale = uintBitsToFloat(SCALE_BITS);

    // the block's live keys: from the first live key of any of its rows to the last
    uint nrows = min(BQ, T - t0), k0 = C, k1 = 0u;
    for (uint r = 0u; r < nrows; ++r) {
        k0 = min(k0, ranges[3u * (t0 + r)]);
        k1 = max(k1, ranges[3u * (t0 + r) + 1u]);
    }
    k1 = max(k0, k1);

    // q rows into shared memory as fp16, each scaled by its power of two; the row-index
    // table; the chunk maxima zeroed
    for (uint r = tid; r < BQ; r += WG) qmax[r] = 0u;
    for (uint r = tid; r < BKC; r += WG) {
        kmax[r] = 0u;
        vkmax[r] = 0u;
    }
    if (tid == 0u) vmax = 0u;
    for (uint e = tid; e < CM_M * CM_N / 4u; e += WG) {
        uint r = (4u * e) / CM_N;
        sm[R_AT + e] = floatBitsToUint(vec4(float(r)));
    }
    barrier();
    {
        vec4 w[2u * Q_PER];
        [[unroll]] for (uint u = 0u; u < Q_PER; ++u) {
            uint g = tid + u * WG, r = g / (D / 8u), i = g % (D / 8u);
            bool in_ = g < Q_OCT && t0 + r < T;
            uint o = Q_OFF + h * Q_SH + (t0 + r) * Q_ST;
            w[2u * u] = in_ ? row4(o, Q_SD, 2u * i, QV, 0u) : vec4(0.0);
            w[2u * u + 1u] = in_ ? row4(o, Q_SD, 2u * i + 1u, QV, 0u) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0u; u < Q_PER; ++u) {
            uint g = tid + u * WG;
            if (g < Q_OCT) atomicMax(qmax[g / (D / 8u)], finite_max(w[2u * u], w[2u * u + 1u]));
        }
        barrier();
        [[unroll]] for (uint u = 0u; u < Q_PER; ++u) {
            uint g = tid + u * WG, r = g / (D / 8u), i = g % (D / 8u);
            if (g < Q_OCT) sm[Q_AT + (r * QLD) / 8u + i] = to_f16(w[2u * u], w[2u * u + 1u],
                                                                    scaled_exp(uintBitsToFloat(qmax[r])));
        }
        for (uint r = tid; r < BQ; r += WG) qfac[r] = scale * pow2(-scaled_exp(uintBitsToFloat(qmax[r])));
    }
    barrier();

    // each output element's row within its fragment, from the row-index table
    FRAG_C ridx;
    coopMatLoad(ridx, sm, R_AT, CM_N / 4u, gl_CooperativeMatrixLayoutRowMajor);
    uint erow[ELEMS];
    [[unroll]] for (uint e = 0u; e < ELEMS; ++e) erow[e] = uint(ridx[e]);

    // this lane's rows in the softmax: RPL rows from rbase, keys [kbase, kbase + KPL)
    uint rbase = (lane / LPR) * RPL, kbase = (lane % LPR) * KPL;
    float m[RPL], l[RPL];
    uint lo[RPL], hi[RPL];
    [[unroll]] for (uint rr = 0u; rr < RPL; ++rr) {
        m[rr] = NEG_INF;
        l[rr] = 0.0;
        uint t = min(t0 + sg * RQ + rbase + rr, T - 1u);
        bool dense = ranges[3u * t + 2u] != 0u;
        lo[rr] = dense ? ranges[3u * t] : 1u;
        hi[rr] = dense ? ranges[3u * t + 1u] : 0u;
    }
    FRAG_C acc[RM][ON];
    [[unroll]] for (uint i = 0u; i < RM; ++i)
        [[unroll]] for (uint j = 0u; j < ON; ++j) acc[i][j] = FRAG_C(0.0);
    int vg = NONE;                          // G: the weights' common power of two so far
    uint s_at = S_AT + sg * S_SG, p_at = P_AT + sg * P_SG;

    for (uint c0 = k0; c0 < k1; c0 += BKC) {
        uint keys = min(BKC, k1 - c0);
        barrier();                          // the last chunk's K, V, p and kexp are read
        // K and V rows of the chunk (zeros past `keys`): every load issued, then the maxima
        vec4 kw[2u * K_PER], vw[2u * V_PER];
        [[unroll]] for (uint u = 0u; u < K_PER; ++u) {
            uint g = tid + u * WG, r = g / (D / 8u), i = g % (D / 8u);
            bool in_ = g < K_OCT && r < keys;
            uint o = K_OFF + kvh * K_SH + (c0 + r) * K_SC;
            kw[2u * u] = in_ ? row4(o, K_SD, 2u * i, KV, 1u) : vec4(0.0);
            kw[2u * u + 1u] = in_ ? row4(o, K_SD, 2u * i + 1u, KV, 1u) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0u; u < V_PER; ++u) {
            uint g = tid + u * WG, r = g / (DV / 8u), i = g % (DV / 8u);
            bool in_ = g < V_OCT && r < keys;
            uint o = V_OFF + kvh * V_SH + (c0 + r) * V_SC;
            vw[2u * u] = in_ ? row4(o, V_SD, 2u * i, VV, 2u) : vec4(0.0);
            vw[2u * u + 1u] = in_ ? row4(o, V_SD, 2u * i + 1u, VV, 2u) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0u; u < K_PER; ++u) {
            uint g = tid + u * WG;
            if (g < K_OCT) atomicMax(kmax[g / (D / 8u)], finite_max(kw[2u * u], kw[2u * u + 1u]));
        }
        {
            uint vm = 0u;
            [[unroll]] for (uint u = 0u; u < V_PER; ++u) {
                uint g = tid + u * WG, x = finite_max(vw[2u * u], vw[2u * u + 1u]);
                if (g < V_OCT) atomicMax(vkmax[g / (DV / 8u)], x);
                vm = max(vm, x);
            }
            vm = subgroupMax(vm);
            if (subgroupElect()) atomicMax(vmax, vm);
        }
        barrier();
        // G: lowered by a chunk with a larger V row (a chunk of zeros changes nothing)
        float vm = uintBitsToFloat(vmax);
        int ng = vm > 0.0 ? min(vg, 15 + scaled_exp(vm)) : vg;
        float vdown = vg == NONE || ng == vg ? 1.0 : pow2(max(ng - vg, -126));
        vg = ng;
        [[unroll]] for (uint u = 0u; u < K_PER; ++u) {
            uint g = tid + u * WG, r = g / (D / 8u), i = g % (D / 8u);
            if (g < K_OCT) {
                int e = scaled_exp(uintBitsToFloat(kmax[r]));
                sm[K_AT + (r * KLD) / 8u + i] = to_f16(kw[2u * u], kw[2u * u + 1u], e);
                if (i == 0u) kexp[r] = e;
            }
        }
        [[unroll]] for (uint u = 0u; u < V_PER; ++u) {
            uint g = tid + u * WG, r = g / (DV / 8u), i = g % (DV / 8u);
            if (g < V_OCT) {
                uint x = vkmax[r];
                int e = scaled_exp(uintBitsToFloat(x));
                sm[V_AT + (r * VLD) / 8u + i] = to_f16(vw[2u * u], vw[2u * u + 1u], e);
                if (i == 0u) vexp[r] = x == 0u ? NONE : e;
            }
        }
        barrier();                          // K, V, kexp and vexp are in shared memory
        for (uint r = tid; r < BKC; r += WG) {   // for the next chunk (read above)
            kmax[r] = 0u;
            vkmax[r] = 0u;
        }
        if (tid == 0u) vmax = 0u;

        // scores of this subgroup's rows: q k^T
        {
            FRAG_C s[RM][SN];
            [[unroll]] for (uint i = 0u; i < RM; ++i)
                [[unroll]] for (uint j = 0u; j < SN; ++j) s[i][j] = FRAG_C(0.0);
            [[unroll]] for (uint dk = 0u; dk < DK; ++dk) {
                FRAG_A a[RM];
                [[unroll]] for (uint i = 0u; i < RM; ++i)
                    coopMatLoad(a[i], sm, Q_AT + ((sg * RQ + i * CM_M) * QLD + dk * CM_K) / 8u, QLD / 8u,
                                gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint j = 0u; j < SN; ++j) {
                    FRAG_B b;
                    coopMatLoad(b, sm, K_AT + (j * CM_N * KLD + dk * CM_K) / 8u, KLD / 8u,
                                gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (uint i = 0u; i < RM; ++i) s[i][j] = coopMatMulAdd(a[i], b, s[i][j]);
                }
            }
            [[unroll]] for (uint i = 0u; i < RM; ++i)
                [[unroll]] for (uint j = 0u; j < SN; ++j)
                    coopMatStore(s[i][j], sm, s_at + (i * CM_M * SLD + j * CM_N) / 4u, SLD / 4u,
                                 gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // the online softmax of this lane's rows over its keys of the chunk
        [[unroll]] for (uint rr = 0u; rr < RPL; ++rr) {
            uint r = rbase + rr, t = t0 + sg * RQ + r;
            float qf = qfac[sg * RQ + r];
            float sv[KPL];
            float cm = NEG_INF;
            [[unroll]] for (uint j = 0u; j < KPL; ++j) {
                uint kj = kbase + j, c = c0 + kj, w = r * SLD + kj;
                float s = uintBitsToFloat(sm[s_at + w / 4u][w % 4u]);
                bool live = t < T && kj < keys &&
                    (lo[rr] <= hi[rr] ? c >= lo[rr] && c < hi[rr] : ld_b(mb[M_OFF + min(t, T - 1u) * M_ST + min(c, C - 1u) * M_SC]));
                // times the softmax scale and 2^-(e_q + e_k): two factors, each in range
                sv[j] = live ? capped(s * qf * pow2(-kexp[kj])) : NEG_INF;
                cm = max(cm, sv[j]);
            }
            cm = ROW_MAX(cm);
            float nm = max(m[rr], cm);
            float alpha = m[rr] == NEG_INF ? 0.0 : exp(m[rr] - nm), ls = 0.0;
            [[unroll]] for (uint j = 0u; j < KPL; j += 2u) {
                vec2 p = vec2(sv[j] == NEG_INF ? 0.0 : exp(sv[j] - nm),
                              sv[j + 1u] == NEG_INF ? 0.0 : exp(sv[j + 1u] - nm));
                ls += p.x + p.y;
                // times 2^(G - e_j); a row of zeros, whose v is 0, weighs 0
                ivec2 e = ivec2(vexp[kbase + j], vexp[kbase + j + 1u]);
                p.x = e.x == NONE ? 0.0 : p.x * pow2(max(vg - e.x, -126));
                p.y = e.y == NONE ? 0.0 : p.y * pow2(max(vg - e.y, -126));
                uint w = r * PLD + kbase + j;    // an even element: one word
                sm[p_at + w / 8u][(w % 8u) / 2u] = packHalf2x16(p);
            }
            m[rr] = nm;
            l[rr] = l[rr] * alpha + ls;
            if (lane % LPR == 0u) rowf[sg * RQ + r] = alpha * vdown;
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // the output rescaled by its rows' factors, then p v added
        [[unroll]] for (uint i = 0u; i < RM; ++i) {
            float f[ELEMS];
            [[unroll]] for (uint e = 0u; e < ELEMS; ++e) f[e] = rowf[sg * RQ + i * CM_M + erow[e]];
            [[unroll]] for (uint j = 0u; j < ON; ++j)
                [[unroll]] for (uint e = 0u; e < ELEMS; ++e) acc[i][j][e] *= f[e];
        }
        [[unroll]] for (uint pk = 0u; pk < PK; ++pk) {
            FRAG_A a[RM];
            [[unroll]] for (uint i = 0u; i < RM; ++i)
                coopMatLoad(a[i], sm, p_at + (i * CM_M * PLD + pk * CM_K) / 8u, PLD / 8u,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0u; j < ON; ++j) {
                FRAG_B b;
                coopMatLoad(b, sm, V_AT + (pk * CM_K * VLD + j * CM_N) / 8u, VLD / 8u,
                            gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint i = 0u; i < RM; ++i) acc[i][j] = coopMatMulAdd(a[i], b, acc[i][j]);
            }
        }
    }

    // each row's sum over its lanes, times 2^G: the output's divisor
    [[unroll]] for (uint rr = 0u; rr < RPL; ++rr) {
        float sum = l[rr];
        sum = ROW_SUM(sum);
        if (lane % LPR == 0u) rowf[sg * RQ + rbase + rr] = sum * (vg == NONE ? 1.0 : pow2(vg));
    }
    barrier();                              // every subgroup is past its last fragment loads
    // through a per-subgroup fp32 fragment in the stages' memory: out = acc / divisor
    uint scratch = K_AT + sg * (CM_M * CM_N / 4u);
    [[unroll]] for (uint i = 0u; i < RM; ++i) {
        [[unroll]] for (uint j = 0u; j < ON; ++j) {
            coopMatStore(acc[i][j], sm, scratch, CM_N / 4u, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint u = 0u; u < CM_M * CM_N / SUBGROUP; ++u) {
                uint e = lane + u * SUBGROUP, r = sg * RQ + i * CM_M + e / CM_N, t = t0 + r;
                if (t < T) {
                    // sum = 0 (no live key): NaN, as eager's softmax gives
                    float v = uintBitsToFloat(sm[scratch + e / 4u][e % 4u]) / rowf[r];
                    outb[(h * T + t) * DV + j * CM_N + e % CM_N] = st_f32(v);
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
