// GGUF block decoding from raw bytes packed 4 to a uint word (little endian),
// shared by the gguf_* kernels. Include it after declaring the blocks buffer
// as `wq` (BUFFER(n, wq)), with exactly one QTYPE_<name> defined.
//
// Every type is decoded in chunks of 8 consecutive elements:
//   QK  elements per block, QB bytes per block (F32/F16/BF16: a "block" of 8),
//   deq8(bo, c, lo, hi): elements 8c..8c+7 of the block at byte offset bo.
// Layouts follow dynamo_vulkan/gguf/quants.py (GGML's block formats). Blocks
// are 18..210 bytes, so a block starts at any even byte offset: all fp16
// fields and every 4-byte read below sit at even offsets, which is what
// gb_u32 assumes. Only Vulkan 1.1 core is used (no 8/16-bit storage).

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
vec4 gb_i8x4(uint w) { return vec4(ivec4(uvec4(w) << uvec4(24u, 16u, 8u, 0u)) >> 24); }
// Bits b..b+3 of w as 0.0 / 1.0.
vec4 gb_bits4(uint w, uint b) { return vec4((uvec4(w) >> (uvec4(0u, 1u, 2u, 3u) + b)) & 1u); }

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
// d, qs[16]: byte j holds element j (low nibble) and j + 16 (high nibble).
const uint QK = 32, QB = 18;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    float d = gb_half(bo);
    uint o = bo + 2u + (c & 1u) * 8u, sh = (c >> 1) * 4u;
    lo = d * (gb_field4(gb_u32(o), sh, 0xFu) - 8.0);
    hi = d * (gb_field4(gb_u32(o + 4u), sh, 0xFu) - 8.0);
}
#elif defined(QTYPE_Q4_1)
const uint QK = 32, QB = 20;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    vec2 dm = unpackHalf2x16(gb_u32(bo));
    uint o = bo + 4u + (c & 1u) * 8u, sh = (c >> 1) * 4u;
    lo = dm.x * gb_field4(gb_u32(o), sh, 0xFu) + dm.y;
    hi = dm.x * gb_field4(gb_u32(o + 4u), sh, 0xFu) + dm.y;
}
#elif defined(QTYPE_Q5_0)
// d, qh (bit e: fifth bit of element e), qs[16] as Q4_0.
const uint QK = 32, QB = 22;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    float d = gb_half(bo);
    uint qh = gb_u32(bo + 2u);
    uint o = bo + 6u + (c & 1u) * 8u, sh = (c >> 1) * 4u;
    lo = d * (gb_field4(gb_u32(o), sh, 0xFu) + 16.0 * gb_bits4(qh, 8u * c) - 16.0);
    hi = d * (gb_field4(gb_u32(o + 4u), sh, 0xFu) + 16.0 * gb_bits4(qh, 8u * c + 4u) - 16.0);
}
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
const uint QK = 32, QB = 34;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    float d = gb_half(bo);
    uint o = bo + 2u + 8u * c;
    lo = d * gb_i8x4(gb_u32(o));
    hi = d * gb_i8x4(gb_u32(o + 4u));
}
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
#elif defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
// d, dmin, scales[12] (eight 6-bit scales and mins), [Q5_K: qh[32]], qs[128].
// Element 64g + 32h + l is nibble h of qs[32g + l] (sub-block j = 2g + h);
// Q5_K: its fifth bit is bit j of qh[l].
const uint QK = 256;
#if defined(QTYPE_Q4_K)
const uint QB = 144, QS = 16;
#else
const uint QB = 176, QS = 48;
#endif
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
#if defined(QTYPE_Q5_K)
    q0 += 16.0 * gb_field4(gb_u32(bo + 16u + l0), j, 1u);
    q1 += 16.0 * gb_field4(gb_u32(bo + 20u + l0), j, 1u);
#endif
    lo = dd * q0 - dmn;
    hi = dd * q1 - dmn;
}
#elif defined(QTYPE_Q6_K)
// ql[128], qh[64], scales[16] (int8, per 16 elements), d. Element 128g + e
// (e < 128): low 4 bits are nibble e/64 of ql[64g + e%64], high 2 bits are
// bits 2(e/32).. of qh[32g + e%32]; value d * scale * (q - 32).
const uint QK = 256, QB = 210;
void deq8(uint bo, uint c, out vec4 lo, out vec4 hi) {
    float d = gb_half(bo + 208u);
    float dd = d * float(int(gb_byte(bo + 192u + (c >> 1)) << 24) >> 24);
    uint g = c >> 4, e = 8u * (c & 15u);
    uint ol = bo + 64u * g + (e & 63u), shl = 4u * (e >> 6);
    uint oh = bo + 128u + 32u * g + (e & 31u), shh = 2u * (e >> 5);
    lo = dd * (gb_field4(gb_u32(ol), shl, 0xFu) + 16.0 * gb_field4(gb_u32(oh), shh, 3u) - 32.0);
    hi = dd * (gb_field4(gb_u32(ol + 4u), shl, 0xFu) + 16.0 * gb_field4(gb_u32(oh + 4u), shh, 3u) - 32.0);
}
#else
#error "gguf_blocks.glsl: define one QTYPE_<name>"
#endif
const uint CPB = QK / 8u;   // chunks of 8 per block
