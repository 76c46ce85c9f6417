// Attention over a key/value cache (dynamo_vulkan.attention), one workgroup per
// (query head, query row). Keys come in chunks of WG, one per invocation: its
// score is a dot product with the query (held in shared memory), masked keys
// score -inf. An online softmax carries the running max and sum across chunks,
// rescaling the accumulated output when the max grows; a chunk whose keys are
// all masked is skipped, so a decode step reads the cache only up to its
// position. For the weighted sum of V rows, invocation i owns output lanes
// i % DVLP (+ DVLP, ...) and every PARTS-th key of the chunk; the parts meet in
// shared memory at the end. lowering/fused.py derives the parameters.
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
BUFFER(0, outb)
BUFFER(1, qb)
BUFFER(2, kb)
BUFFER(3, vb)
BUFFER(4, mb)
#include "wg_reduce.glsl"

// VW: 4 when q, k and v rows are vec4-aligned and unit-stride along the head dim (one
// 16-byte load for 4 dims), else 1. D, DV: head dims; DVL = DV / VW lanes of output;
// DVLP = min(DVL, WG) lanes per part; PARTS = WG / DVLP; DPT = ceil(DVL / DVLP) lanes
// per invocation. All #defines from the lowering.
#if VW == 4
#define VT vec4
layout(set = 0, binding = 2) buffer Buf2v { vec4 kv4[]; };
layout(set = 0, binding = 3) buffer Buf3v { vec4 vv4[]; };
#define LDK(o) kv4[(o) >> 2]
#define LDV(o) vv4[(o) >> 2]
#define DOTV(a, b) dot(a, b)
#define LDQ(o) uintBitsToFloat(uvec4(qb[o], qb[(o) + Q_SD], qb[(o) + 2u * Q_SD], qb[(o) + 3u * Q_SD]))
#define STORE(o, val) outb[o] = st_f32(val.x); outb[(o) + 1u] = st_f32(val.y); outb[(o) + 2u] = st_f32(val.z); outb[(o) + 3u] = st_f32(val.w)
#else
#define VT float
#define LDK(o) ld_f32(kb[o])
#define LDV(o) ld_f32(vb[o])
#define DOTV(a, b) ((a) * (b))
#define LDQ(o) ld_f32(qb[o])
#define STORE(o, val) outb[o] = st_f32(val)
#endif
shared VT qs[D / VW];
shared float ps[WG];
shared VT red[WG * DPT];
#define NEG_INF uintBitsToFloat(0xff800000u)

void main() {
    uint row = flat_workgroup();
    if (row >= HQ * T) return;
    uint h = row / T, t = row % T, kvh = h / GROUP;
    uint lid = gl_LocalInvocationID.x;
    for (uint i = lid; i < D / VW; i += WG) qs[i] = LDQ(Q_OFF + h * Q_SH + t * Q_ST + i * VW * Q_SD);
    barrier();
    float scale = uintBitsToFloat(SCALE_BITS);
    uint part = lid / DVLP, lane0 = lid % DVLP;
    bool owner = part < PARTS;
    float m = NEG_INF, l = 0.0;
    VT acc[DPT];
    for (uint j = 0; j < DPT; ++j) acc[j] = VT(0.0);
    for (uint c0 = 0; c0 < C; c0 += WG) {
        uint c = c0 + lid;
        bool live = c < C && ld_b(mb[M_OFF + t * M_ST + c * M_SC]);
        float s = NEG_INF;
        if (live) {
            uint kbase = K_OFF + kvh * K_SH + c * K_SC;
            float qk = 0.0;
            for (uint i = 0; i < D / VW; ++i) qk += DOTV(qs[i], LDK(kbase + i * VW * K_SD));
            s = qk * scale;
        }
        float cm = wg_max(s);
        if (cm == NEG_INF) continue;            // the whole chunk is masked (uniform)
        float nm = max(m, cm);
        float alpha = exp(m - nm);              // 0 on the first live chunk (m = -inf)
        float p = live ? exp(s - nm) : 0.0;
        ps[lid] = p;
        l = l * alpha + wg_sum(p);              // its barriers also publish ps
        m = nm;
        uint keys = min(uint(WG), C - c0);
        if (owner) {
            for (uint j = 0; j < DPT; ++j) {
                uint lane = lane0 + j * DVLP;
                if (lane >= DVL) break;
                uint vbase = V_OFF + kvh * V_SH + (c0 + part) * V_SC + lane * VW * V_SD;
                VT a = acc[j] * alpha;
                for (uint i = part; i < keys; i += PARTS, vbase += PARTS * V_SC)
                    a += ps[i] * LDV(vbase);
                acc[j] = a;
            }
        }
        barrier();                              // ps is rewritten by the next chunk
    }
    for (uint j = 0; j < DPT; ++j) red[lid * DPT + j] = acc[j];
    barrier();
    if (part == 0u) {
        for (uint j = 0; j < DPT; ++j) {
            uint lane = lane0 + j * DVLP;
            if (lane >= DVL) break;
            VT a = VT(0.0);
            for (uint q = 0; q < PARTS; ++q) a += red[(q * DVLP + lane0) * DPT + j];
            a /= l;                              // l = 0 (all masked): NaN
            STORE((h * T + t) * DV + lane * VW, a);
        }
    }
}
