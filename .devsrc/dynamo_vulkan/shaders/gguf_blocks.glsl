// GGUF block decoding from raw bytes packed 4 to a uint word (little endian),
// shared by the gguf_* kernels. Include it after declaring the blocks buffer
// as `wq` (BUFFER(WQ_BINDING, wq)) and the spec constants K (row length) and ROW_BYTES,
// with exactly one QTYPE_<name> defined.
//
// Every type is decoded in chunks of 8 consecutive elements of a row:
//   deq8a(ro, ch, lo, hi): chunk ch of the row at byte ro, as element = a * q + b
//     with q in lo, hi and (a, b) returned (GB_AFFINE: b is not always 0), so a
//     mat-vec scales each chunk's dot product once instead of every element;
//   deq8r(ro, ch, lo, hi): the same chunk as values;
//   gb_bound(ro, blk) (where GB_BOUND is defined): a bound on the magnitudes of block
//     blk's finite elements from its scales alone (a non-finite scale's elements are
//     none of them finite), without reading its quants;
//   gb_raw8(ro, ch) and gb_dec8(raw, ro, ch, lo, hi) (where GB_RAW is defined): deq8a in
//     two halves, the chunk's loads (up to four whole words, as loaded: no shift or
//     select of a loaded value, which would wait for it) and then their decoding, so that
//     a kernel can keep the loads in flight while it computes (zero words decode to zeros).
// Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K rows are stored regrouped for the GPU
// (dynamo_vulkan/gguf/gpu_layout.py: every block's quants, then its other fields,
// each a region of the row; a chunk's quants one or two aligned words, nibble or
// byte k its element k); the other types keep GGML's blocks (quants.py), read by
// deq8(bo, c, lo, hi): elements 8c..8c+7 of the block at byte bo. Blocks are
// 18..210 bytes, so a block starts at any even byte offset: all fp16 fields and
// every 4-byte read below sit at even offsets, which is what gb_u32 assumes. Only
// Vulkan 1.1 core is used (no 8/16-bit storage).

uint gb_byte(uint o) { return (wq[o >> 2] >> ((o & 3u) << 3)) & 0xFFu; }
float gb_half(uint o) { return unpackHalf2x16(wq[o >> 2] >> ((o & 2u) << 3)).x; }
// 4 bytes at an even byte offset. Both words are always read (no divergent
// branch between neighbouring blocks of odd size); the second index is clamped
// to the buffer, as it is only used when the bytes straddle two words.
uint gb_u32(uint o) {
    uint i = o >> 2;
    uint a = wq[i], b = wq[min(i + 1u, uint(wq.length()) - 1u)];
    return (o & 2u) == 0u ? a : (a >> 16) | (b << 16);
}
// The 4 bytes of w, each shifted right by sh and masked.
vec4 gb_field4(uint w, uint sh, uint mask) {
    return vec4((uvec4(w) >> (uvec4(0u, 8u, 16u, 24u) + sh)) & mask);
}
// Bits b..b+3 of w as 0.0 / 1.0.
vec4 gb_bits4(uint w, uint b) { return vec4((uvec4(w) >> (uvec4(0u, 1u, 2u, 3u) + b)) & 1u); }
// A 32-bit word at byte o of a row: one load where rows are whole words.
uint gb_w(uint o) { return (ROW_BYTES & 3u) == 0u ? wq[o >> 2] : gb_u32(o); }
// Integer fields as exact floats without shifts or int-to-float conversions: a field
// stays where it is, as low mantissa bits of a float whose exponent gives its lowest
// bit the weight wanted (2^e + weight * q), and 2^e is subtracted. One and/or and one
// add per element. The add cancels a large term, so it must be done as written:
// `precise` asks for that, but the H100's driver still reassociated a sum of two such
// terms (a first Q6_K decode, 0.1 relative error), so every element is one term here,
// its fields joined as integers first (the tests against eager catch a driver that
// does otherwise).
// Nibbles 0..3 of w (bits 0..15), minus off.
vec4 gb_nib4(uint w, float off) {
    precise vec4 v = uintBitsToFloat((uvec4(w) & uvec4(0xFu, 0xF0u, 0xF00u, 0xF000u)) |
        uvec4(0x4B000000u, 0x49000000u, 0x47000000u, 0x45000000u)) -
        (vec4(8388608.0, 524288.0, 32768.0, 2048.0) + off);
    return v;
}
// The low `mask` bits of each byte of v, minus off.
vec4 gb_bytes4(uint v, uint mask, float off) {
    uint h = v >> 16;
    precise vec4 r = uintBitsToFloat((uvec4(v, v, h, h) & (uvec4(1u, 256u, 1u, 256u) * mask)) |
        uvec4(0x4B000000u, 0x47000000u, 0x4B000000u, 0x47000000u)) -
        (vec4(8388608.0, 32768.0, 8388608.0, 32768.0) + off);
    return r;
}
// The 4 bytes of w as signed integers (biased to unsigned by the xor).
vec4 gb_s8x4(uint w) { return gb_bytes4(w ^ 0x80808080u, 0xFFu, 128.0); }
// |x| where finite, else 0 (NaN fails the comparison)
float gb_fin(float x) { float a = abs(x); return a < uintBitsToFloat(0x7f800000u) ? a : 0.0; }

#if defined(QTYPE_F32)
const uint QK = 8, QB = 32;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    uint i = bo >> 2;
    lo = uintBitsToFloat(uvec4(wq[i], wq[i + 1u], wq[i + 2u], wq[i + 3u]));
    hi = uintBitsToFloat(uvec4(wq[i + 4u], wq[i + 5u], wq[i + 6u], wq[i + 7u]));
}
#elif defined(QTYPE_F16)
const uint QK = 8, QB = 16;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    uint i = bo >> 2;
    lo = vec4(unpackHalf2x16(wq[i]), unpackHalf2x16(wq[i + 1u]));
    hi = vec4(unpackHalf2x16(wq[i + 2u]), unpackHalf2x16(wq[i + 3u]));
}
#elif defined(QTYPE_BF16)
const uint QK = 8, QB = 16;
vec2 gb_bf2(uint w) { return uintBitsToFloat(uvec2(w << 16, w & 0xFFFF0000u)); }
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    uint i = bo >> 2;
    lo = vec4(gb_bf2(wq[i]), gb_bf2(wq[i + 1u]));
    hi = vec4(gb_bf2(wq[i + 2u]), gb_bf2(wq[i + 3u]));
}
#elif defined(QTYPE_Q4_0)
// regrouped: quants (16 bytes a block), d (fp16)
const uint QK = 32, QB = 18, NB = K / QK;
#define GB_REGROUPED 1
#define GB_RAW 1
uint gb_q40_d(uint ro, uint ch) { return ro + 16u * NB + 2u * (ch >> 2); }
uvec4 gb_raw8(uint ro, uint ch) { return uvec4(gb_w(ro + 4u * ch), wq[gb_q40_d(ro, ch) >> 2], 0u, 0u); }
vec2 gb_dec8(uvec4 r, uint ro, uint ch, out vec4 lo, out vec4 hi) {
    lo = gb_nib4(r.x, 8.0);
    hi = gb_nib4(r.x >> 16, 8.0);
    return vec2(unpackHalf2x16(r.y >> ((gb_q40_d(ro, ch) & 2u) << 3)).x, 0.0);
}
#define GB_BOUND 1
float gb_bound(uint ro, uint blk) { return 8.0 * gb_fin(gb_half(ro + 16u * NB + 2u * blk)); }
#elif defined(QTYPE_Q4_1)
// regrouped: quants (16 bytes a block), d and m (fp16 each)
const uint QK = 32, QB = 20, NB = K / QK;
#define GB_REGROUPED 1
#define GB_AFFINE 1
#define GB_RAW 1
uvec4 gb_raw8(uint ro, uint ch) { return uvec4(gb_w(ro + 4u * ch), gb_w(ro + 16u * NB + 4u * (ch >> 2)), 0u, 0u); }
vec2 gb_dec8(uvec4 r, uint ro, uint ch, out vec4 lo, out vec4 hi) {
    lo = gb_nib4(r.x, 0.0);
    hi = gb_nib4(r.x >> 16, 0.0);
    return unpackHalf2x16(r.y);
}
#define GB_BOUND 1
float gb_bound(uint ro, uint blk) {
    vec2 dm = unpackHalf2x16(gb_w(ro + 16u * NB + 4u * blk));
    return 15.0 * gb_fin(dm.x) + gb_fin(dm.y);
}
#elif defined(QTYPE_Q5_0)
// regrouped: quants (16 bytes a block), qh (bit e: the fifth bit of element e), d. The
// fifth bit is added as a float: every partial sum stays an integer below 2^24, exact
// in any order.
const uint QK = 32, QB = 22, NB = K / QK;
#define GB_REGROUPED 1
#define GB_RAW 1
uint gb_q50_d(uint ro, uint ch) { return ro + 20u * NB + 2u * (ch >> 2); }
uvec4 gb_raw8(uint ro, uint ch) {
    return uvec4(gb_w(ro + 4u * ch), gb_w(ro + 16u * NB + 4u * (ch >> 2)), wq[gb_q50_d(ro, ch) >> 2], 0u);
}
vec2 gb_dec8(uvec4 r, uint ro, uint ch, out vec4 lo, out vec4 hi) {
    uint qh = r.y >> (8u * (ch & 3u));
    lo = gb_nib4(r.x, 16.0) + 16.0 * gb_bits4(qh, 0u);
    hi = gb_nib4(r.x >> 16, 16.0) + 16.0 * gb_bits4(qh, 4u);
    return vec2(unpackHalf2x16(r.z >> ((gb_q50_d(ro, ch) & 2u) << 3)).x, 0.0);
}
#define GB_BOUND 1
float gb_bound(uint ro, uint blk) { return 16.0 * gb_fin(gb_half(ro + 20u * NB + 2u * blk)); }
#elif defined(QTYPE_Q5_1)
const uint QK = 32, QB = 24;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    vec2 dm = unpackHalf2x16(gb_u32(bo));
    uint qh = gb_u32(bo + 4u);
    uint o = bo + 8u + (c & 1u) * 8u, sh = (c >> 1) * 4u;
    lo = dm.x * (gb_field4(gb_u32(o), sh, 0xFu) + 16.0 * gb_bits4(qh, 8u * c)) + dm.y;
    hi = dm.x * (gb_field4(gb_u32(o + 4u), sh, 0xFu) + 16.0 * gb_bits4(qh, 8u * c + 4u)) + dm.y;
}
#elif defined(QTYPE_Q8_0)
// regrouped: quants (32 bytes a block), d
const uint QK = 32, QB = 34, NB = K / QK;
#define GB_REGROUPED 1
#define GB_RAW 1
uint gb_q80_d(uint ro, uint ch) { return ro + 32u * NB + 2u * (ch >> 2); }
uvec4 gb_raw8(uint ro, uint ch) {
    uint o = ro + 8u * ch;
    return uvec4(gb_w(o), gb_w(o + 4u), wq[gb_q80_d(ro, ch) >> 2], 0u);
}
vec2 gb_dec8(uvec4 r, uint ro, uint ch, out vec4 lo, out vec4 hi) {
    lo = gb_s8x4(r.x);
    hi = gb_s8x4(r.y);
    return vec2(unpackHalf2x16(r.z >> ((gb_q80_d(ro, ch) & 2u) << 3)).x, 0.0);
}
#define GB_BOUND 1
float gb_bound(uint ro, uint blk) { return 128.0 * gb_fin(gb_half(ro + 32u * NB + 2u * blk)); }
#elif defined(QTYPE_Q2_K)
// scales[16] (low nibble: scale, high: min, per 16 elements), qs[64], d, dmin.
// Element 128g + 32s + l is bits 2s..2s+1 of qs[32g + l].
const uint QK = 256, QB = 84;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    vec2 dm = unpackHalf2x16(gb_u32(bo + 80u));
    uint sc = gb_byte(bo + (c >> 1));
    float dl = dm.x * float(sc & 0xFu), ml = dm.y * float(sc >> 4);
    uint o = bo + 16u + 32u * (c >> 4) + 8u * (c & 3u), sh = 2u * ((c >> 2) & 3u);
    lo = dl * gb_field4(gb_u32(o), sh, 3u) - ml;
    hi = dl * gb_field4(gb_u32(o + 4u), sh, 3u) - ml;
}
#elif defined(QTYPE_Q3_K)
// hmask[32], qs[64] (as Q2_K), scales[12] (16 6-bit scales, bias 32), d.
// Element 128g + 32s + l: high bit is bit 4g + s of hmask[l]; clear means -4.
const uint QK = 256, QB = 110;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    float d = gb_half(bo + 108u);
    uint i = c >> 1;   // scale index (16 elements each)
    uint sl = (gb_byte(bo + 96u + (i & 7u)) >> (4u * (i >> 3))) & 0xFu;
    uint sh2 = (gb_byte(bo + 104u + (i & 3u)) >> (2u * (i >> 2))) & 3u;
    float dl = d * float(int(sl | (sh2 << 4)) - 32);
    uint l0 = 8u * (c & 3u), s = (c >> 2) & 3u, g = c >> 4;
    uint o = bo + 32u + 32u * g + l0, sh = 2u * s, hb = 4u * g + s;
    uint m0 = gb_u32(bo + l0), m1 = gb_u32(bo + l0 + 4u);
    lo = dl * (gb_field4(gb_u32(o), sh, 3u) - 4.0 + 4.0 * gb_field4(m0, hb, 1u));
    hi = dl * (gb_field4(gb_u32(o + 4u), sh, 3u) - 4.0 + 4.0 * gb_field4(m1, hb, 1u));
}
#elif defined(QTYPE_Q4_K)
// regrouped: quants (128 bytes a block), then per block 16 bytes: d, dmin (fp16), the
// low nibbles of sub-block j's 6-bit scale and min in byte 4 + j, and their high 2 bits
// in bits 4j.. of the last word; read as one 16-byte load (rows of 144 * NB bytes keep
// them 16-byte aligned)
const uint QK = 256, QB = 144, NB = K / QK;
#define GB_REGROUPED 1
#define GB_AFFINE 1
layout(set = 0, binding = WQ_BINDING) readonly buffer WqVec4 { uvec4 wq4[]; };
// (a, b) of a sub-block (32 elements; its elements are a * q + b) from the block's
// fields: d, dmin (dm), the byte of its scale's and min's low nibbles (b) and the word of
// their high bits shifted to bit 0 (h)
vec2 gb_q4k_ab_of(uint dm, uint b, uint h) {
    vec2 d = unpackHalf2x16(dm);
    float sc = float((b & 0xFu) | ((h & 3u) << 4)), mn = float(((b >> 4) & 0xFu) | ((h & 0xCu) << 2));
    return vec2(d.x * sc, -d.y * mn);
}
// (a, b) of sub-block j of block blk
vec2 gb_q4k_ab(uint ro, uint blk, uint j) {
    uvec4 s = wq4[(ro + 128u * NB + 16u * blk) >> 4];
    return gb_q4k_ab_of(s.x, (j < 4u ? s.y : s.z) >> (8u * (j & 3u)), s.w >> (4u * j));
}
vec2 deq8a(uint ro, uint ch, out vec4 lo, out vec4 hi) {
    uint w = gb_w(ro + 4u * ch);
    lo = gb_nib4(w, 0.0);
    hi = gb_nib4(w >> 16, 0.0);
    return gb_q4k_ab(ro, ch >> 5, (ch >> 2) & 7u);
}
// the chunk's quant word and its block's words of d and dmin, of its sub-block's scale
// byte and of the high bits (deq8a reads the block's fields as one 16-byte load instead)
#define GB_RAW 1
#define GB_RAW_ONLY 1
uvec4 gb_raw8(uint ro, uint ch) {
    uint f = (ro + 128u * NB + 16u * (ch >> 5)) >> 2;
    return uvec4(gb_w(ro + 4u * ch), wq[f], wq[f + 1u + ((ch >> 4) & 1u)], wq[f + 3u]);
}
vec2 gb_dec8(uvec4 r, uint ro, uint ch, out vec4 lo, out vec4 hi) {
    uint j = (ch >> 2) & 7u;
    lo = gb_nib4(r.x, 0.0);
    hi = gb_nib4(r.x >> 16, 0.0);
    return gb_q4k_ab_of(r.y, r.z >> (8u * (j & 3u)), r.w >> (4u * j));
}
// each sub-block's a * q + b at q = 0 and 15, the ends of its range
#define GB_BOUND 1
float gb_bound(uint ro, uint blk) {
    float m = 0.0;
    for (uint j = 0u; j < 8u; ++j) {
        vec2 ab = gb_q4k_ab(ro, blk, j);
        if (abs(ab.x) < uintBitsToFloat(0x7f800000u))     // else none is finite
            m = max(m, max(gb_fin(ab.y), gb_fin(15.0 * ab.x + ab.y)));
    }
    return m;
}
#elif defined(QTYPE_Q5_K)
// d, dmin, scales[12] (eight 6-bit scales and mins), qh[32], qs[128].
// Element 64g + 32h + l is nibble h of qs[32g + l] (sub-block j = 2g + h);
// its fifth bit is bit j of qh[l].
const uint QK = 256, QB = 176, QS = 48;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    vec2 dm = unpackHalf2x16(gb_u32(bo));
    uint j = c >> 2, sc, mn;
    if (j < 4u) {
        sc = gb_byte(bo + 4u + j) & 63u;
        mn = gb_byte(bo + 8u + j) & 63u;
    } else {
        uint b = gb_byte(bo + 8u + j);   // scales[8 + j - 4]
        sc = (b & 0xFu) | ((gb_byte(bo + j) >> 2) & 0x30u);
        mn = (b >> 4) | ((gb_byte(bo + 4u + j) >> 2) & 0x30u);
    }
    float dd = dm.x * float(sc), dmn = dm.y * float(mn);
    uint l0 = 8u * (c & 3u), sh = 4u * (j & 1u);
    uint o = bo + QS + 32u * (c >> 3) + l0;
    vec4 q0 = gb_field4(gb_u32(o), sh, 0xFu), q1 = gb_field4(gb_u32(o + 4u), sh, 0xFu);
    q0 += 16.0 * gb_field4(gb_u32(bo + 16u + l0), j, 1u);
    q1 += 16.0 * gb_field4(gb_u32(bo + 20u + l0), j, 1u);
    lo = dd * q0 - dmn;
    hi = dd * q1 - dmn;
}
#elif defined(QTYPE_Q6_K)
// regrouped: low nibbles (128 bytes a block: chunk c's word, byte i = its elements i and
// i + 4), high bit pairs (64: a chunk pair's word, byte i = the even chunk's elements i,
// i + 4 at bits 4, 6, the odd one's at bits 0, 2), scales (16 int8, one per 16 elements),
// d; q - 32 its value. A bit select joins each 6-bit value in a byte (one magic term per
// element: a sum of two would need adds above 2^24, which lose bits if reassociated).
const uint QK = 256, QB = 210, NB = K / QK;
#define GB_REGROUPED 1
#define GB_RAW 1
// byte offsets of chunk ch's scale byte and of its block's d
uint gb_q6k_sc(uint ro, uint ch) { return ro + 192u * NB + 16u * (ch >> 5) + ((ch & 31u) >> 1); }
uint gb_q6k_d(uint ro, uint ch) { return ro + 208u * NB + 2u * (ch >> 5); }
uvec4 gb_raw8(uint ro, uint ch) {
    return uvec4(gb_w(ro + 4u * ch), gb_w(ro + 128u * NB + 4u * (ch >> 1)), wq[gb_q6k_sc(ro, ch) >> 2],
                 wq[gb_q6k_d(ro, ch) >> 2]);
}
vec2 gb_dec8(uvec4 r, uint ro, uint ch, out vec4 lo, out vec4 hi) {
    uint h = r.y << (4u * (ch & 1u)), sc = r.z >> ((gb_q6k_sc(ro, ch) & 3u) << 3);
    lo = gb_bytes4((r.x & 0x0F0F0F0Fu) | (h & 0xF0F0F0F0u), 0x3Fu, 32.0);
    hi = gb_bytes4(((r.x >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0xF0F0F0F0u), 0x3Fu, 32.0);
    return vec2(unpackHalf2x16(r.w >> ((gb_q6k_d(ro, ch) & 2u) << 3)).x * float(int(sc << 24) >> 24), 0.0);
}
// q - 32 lies in [-32, 31]: 32 times d times the largest of the block's 16 int8 scales
#define GB_BOUND 1
float gb_bound(uint ro, uint blk) {
    uint so = ro + 192u * NB + 16u * blk, big = 0u;
    for (uint i = 0u; i < 4u; ++i) {
        uint w = gb_w(so + 4u * i);
        for (uint j = 0u; j < 32u; j += 8u) big = max(big, uint(abs(int(w << (24u - j)) >> 24)));
    }
    return 32.0 * float(big) * gb_fin(gb_half(ro + 208u * NB + 2u * blk));
}
#else
#error "gguf_blocks.glsl: define one QTYPE_<name>"
#endif
#ifdef GB_INT_DOT
// Integer dot products of one block of 32 elements (block b of its row; for the K-quants,
// sub-block b % 8 of block b / 8) with x held as PLANES (2 or 3) int8 planes
// (gguf_xplanes.comp, int_dot.glsl). gb_dot_qx gives P with sum_i q_i x_i = s0 P.x + s1 P.y over the block's
// integer quants q (the K-quants' sub-block scales applied), from x's plane words xp (their
// bytes in the order the quants sit: GB_DOT_NIBBLES, the even elements of each 8 in one
// word and the odd in the next, for the 4-bit types; else element order) and the planes'
// sums A (gguf_xplanes.comp); gb_dot_dm gives (d, m) with the block's element d * q + m.
// Sums of integers are exact; Q6_K's, scaled per 16 elements, are joined in fp32.
layout(set = 0, binding = WQ_BINDING) readonly buffer WqDot { uvec4 wqd[]; };
// 16 bytes at byte o of a row (o on 16 bytes of the row's start): one load where rows
// start on 16 bytes, else four words
uvec4 gb_w16(uint o) {
    return (ROW_BYTES & 15u) == 0u ? wqd[o >> 4] : uvec4(gb_w(o), gb_w(o + 4u), gb_w(o + 8u), gb_w(o + 12u));
}
// 4 words of x's plane bytes against 4 words of quant bytes; a plane's 8 words (xp[2p],
// xp[2p + 1]) against the block's quants as 8 words
#define GB_DOT4W(DOT4, a, q) (DOT4(a.x, q.x) + DOT4(a.y, q.y) + DOT4(a.z, q.z) + DOT4(a.w, q.w))
#define GB_DOT8(DOT4, a, c, q0, q1) (GB_DOT4W(DOT4, a, q0) + GB_DOT4W(DOT4, c, q1))
#ifndef PLANES
#define PLANES 3
#endif
#define GB_XP uvec4 xp[2 * PLANES]
// the integer sums (I0, 254 I1 + I2; two planes: I0, I1) of planes against quants q0, q1
// read with offset off (element = q - off): exact in int32 for 8-bit quants and below
vec2 gb_dot_planes(uvec4 q0, uvec4 q1, bool q_signed, int off, GB_XP, ivec2 sums) {
    ivec3 r = ivec3(0);
    [[unroll]] for (uint p = 0; p < PLANES; ++p)
        r[p] = q_signed ? GB_DOT8(SDOT4, xp[2 * p], xp[2 * p + 1], q0, q1)
                        : GB_DOT8(SUDOT4, xp[2 * p], xp[2 * p + 1], q0, q1);
#if PLANES == 3
    return vec2(r.x - off * sums.x, 254 * r.y + r.z - off * sums.y);
#else
    return vec2(r.x - off * sums.x, r.y - off * sums.y);
#endif
}
#if defined(QTYPE_Q4_0) || defined(QTYPE_Q4_1) || defined(QTYPE_Q4_K)
#define GB_DOT_NIBBLES 1
#if defined(QTYPE_Q4_0)
const int GB_DOT_OFF = 8;
vec2 gb_dot_dm(uint ro, uint b) { return vec2(gb_half(ro + 16u * NB + 2u * b), 0.0); }
#elif defined(QTYPE_Q4_1)
const int GB_DOT_OFF = 0;
vec2 gb_dot_dm(uint ro, uint b) { return unpackHalf2x16(gb_w(ro + 16u * NB + 4u * b)); }
#else
const int GB_DOT_OFF = 0;
vec2 gb_dot_dm(uint ro, uint b) { return gb_q4k_ab(ro, b >> 3, b & 7u); }
#endif
vec2 gb_dot_qx(uint ro, uint b, GB_XP, ivec2 sums) {
    uvec4 q = gb_w16(ro + 16u * b);
    uvec4 lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
    return gb_dot_planes(uvec4(lo.x, hi.x, lo.y, hi.y), uvec4(lo.z, hi.z, lo.w, hi.w), false,
                         GB_DOT_OFF, xp, sums);
}
#elif defined(QTYPE_Q8_0)
#define GB_DOT_NIBBLES 0
vec2 gb_dot_qx(uint ro, uint b, GB_XP, ivec2 sums) {
    return gb_dot_planes(gb_w16(ro + 32u * b), gb_w16(ro + 32u * b + 16u), true, 0, xp, sums);
}
vec2 gb_dot_dm(uint ro, uint b) { return vec2(gb_half(ro + 32u * NB + 2u * b), 0.0); }
#elif defined(QTYPE_Q6_K)
#define GB_DOT_NIBBLES 0
// chunk c's 8 values q - 32 as two words of signed bytes (elements 0..3, 4..7), from its
// low-nibble word w and its high-bit word h shifted as deq8a shifts it
uvec2 gb_q6k_bytes(uint w, uint h) {
    uvec2 t = (uvec2((w & 0x0F0F0F0Fu) | (h & 0xF0F0F0F0u),
                     ((w >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0xF0F0F0F0u)) & 0x3F3F3F3Fu) ^ 0x20202020u;
    return t | ((t & 0x20202020u) * 6u);     // 6-bit two's complement, sign-extended per byte
}
vec2 gb_dot_qx(uint ro, uint b, GB_XP, ivec2 sums) {
    uvec4 w = gb_w16(ro + 16u * b);
    uint hb = ro + 128u * NB + 8u * b, h0 = gb_w(hb), h1 = gb_w(hb + 4u);
    uvec2 c0 = gb_q6k_bytes(w.x, h0), c1 = gb_q6k_bytes(w.y, h0 << 4);
    uvec2 c2 = gb_q6k_bytes(w.z, h1), c3 = gb_q6k_bytes(w.w, h1 << 4);
    uvec4 q0 = uvec4(c0, c1), q1 = uvec4(c2, c3);
    // elements 0..15 and 16..31 have scales of their own: bytes 2j, 2j + 1 of block b / 8's
    uint so = ro + 192u * NB + 16u * (b >> 3) + 2u * (b & 7u);
    uint sw = wq[so >> 2] >> ((so & 2u) << 3);
    int sc0 = int(sw << 24) >> 24, sc1 = int(sw << 16) >> 24;
    ivec3 j = ivec3(0);
    [[unroll]] for (uint p = 0; p < PLANES; ++p)
        j[p] = sc0 * GB_DOT4W(SDOT4, xp[2 * p], q0) + sc1 * GB_DOT4W(SDOT4, xp[2 * p + 1], q1);
#if PLANES == 3
    return vec2(float(j.x), 254.0 * float(j.y) + float(j.z));   // 254 j1 may pass 2^31
#else
    return vec2(float(j.x), float(j.y));
#endif
}
vec2 gb_dot_dm(uint ro, uint b) { return vec2(gb_half(ro + 208u * NB + 2u * (b >> 3)), 0.0); }
#else
#error "gguf_blocks.glsl: no integer dot products for this type"
#endif
#endif
const uint CPB = QK / 8u;   // chunks of 8 per block
#ifndef GB_AFFINE
#define GB_AFFINE 0
#endif
#if defined(GB_RAW) && !defined(GB_RAW_ONLY)
vec2 deq8a(uint ro, uint ch, out vec4 lo, out vec4 hi) { return gb_dec8(gb_raw8(ro, ch), ro, ch, lo, hi); }
#endif
#ifndef GB_REGROUPED
// GGML's blocks: the chunk's values, a = 1
vec2 deq8a(uint ro, uint ch, out vec4 lo, out vec4 hi) {
    deq8(ro + (ch / CPB) * QB, ch % CPB, lo, hi);
    return vec2(1.0, 0.0);
}
#endif
void deq8r(uint ro, uint ch, out vec4 lo, out vec4 hi) {
    vec2 ab = deq8a(ro, ch, lo, hi);
    lo *= ab.x;
    hi *= ab.x;
#if GB_AFFINE
    lo += ab.y;
    hi += ab.y;
#endif
}
