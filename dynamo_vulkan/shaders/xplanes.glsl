// x's int8 planes per block of 32 for the integer-dot GGUF mat-vec (gguf_matvec_idot.comp),
// shared by the kernels that write them (gguf_xplanes.comp; attention.comp's merge, for
// the output projection that reads its heads): with s = max|x| / 127 over the block,
// x = s * (a0 + a1 / 254 + a2 / 254^2) to within s / 254^2 / 2 (PLANES 3: fp32 accuracy),
// or x = s * (a0 + a1 / 254) to within s / 254 / 2 (PLANES 2: TF32-class error). A block
// is XP_WPB words: the planes (8 words each; word l holds 4 elements, the bytes in the
// order the weight's quants sit: NIBBLES, elements 8 (l / 2) + 2 e + l % 2, else 4 l + e),
// then s0 = s, s1 (as float bits) and the plane sums A0 = sum a0, A1 (three planes:
// s1 = s / 254^2, A1 = sum(254 a1 + a2); two: s1 = s / 254, A1 = sum a1).
// The including kernel defines PLANES (2 or 3) and NIBBLES (0 or 1).
#if PLANES != 2 && PLANES != 3
#error "xplanes.glsl: PLANES is 2 or 3"
#endif
#define XP_WPB (8u * PLANES + 4u)     // words a block
#if PLANES == 3
const float XP_S1_DIV = 64516.0;
#else
const float XP_S1_DIV = 254.0;
#endif

// element e (0..3) of word l of a block, its index in the block
uint xp_element(uint l, uint e) { return NIBBLES != 0 ? 8u * (l >> 1) + (l & 1u) + 2u * e : 4u * l + e; }

uint xp_packed(ivec4 a) {
    uvec4 u = uvec4(a) & 0xFFu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}

// a word's part of its block's largest magnitude; -1 marks a NaN, which max() may drop
float xp_word_max(vec4 v) {
    vec4 a = abs(v);
    return any(isnan(v)) ? -1.0 : max(max(a.x, a.y), max(a.z, a.w));
}

// amax, nan_in: the block's largest magnitude and whether a NaN is in it, from its 8
// words' xp_word_max in shared array `words` from index `first`
#define XP_BLOCK_MAX(words, first, amax, nan_in) { \
    amax = 0.0; \
    nan_in = false; \
    [[unroll]] for (uint i_ = 0u; i_ < 8u; ++i_) { \
        amax = max(amax, words[(first) + i_]); \
        nan_in = nan_in || words[(first) + i_] < 0.0; \
    } }

// A block's scale s and the factor its values are multiplied by before rounding, from its
// largest magnitude; a NaN in the block (nan_in) makes s NaN, so the mat-vec's sums come
// out NaN as the fp32 kernel's do (an infinity gives an infinite scale)
vec2 xp_scale(float amax, bool nan_in) {
    return vec2(nan_in ? uintBitsToFloat(0x7fc00000u) : amax / 127.0,
                amax > 0.0 && !nan_in ? 127.0 / amax : 0.0);
}

// v's planes, v times the block's factor inv
void xp_quantize(vec4 v, float inv, out ivec4 i0, out ivec4 i1, out ivec4 i2) {
    vec4 t = v * inv;
    vec4 a0 = clamp(roundEven(t), -127.0, 127.0);
    vec4 r = (t - a0) * 254.0;
    vec4 a1 = clamp(roundEven(r), -127.0, 127.0);
    i0 = ivec4(a0);
    i1 = ivec4(a1);
    i2 = ivec4(clamp(roundEven((r - a1) * 254.0), -127.0, 127.0));
}

// this word's part of the sums A0 and A1
ivec2 xp_sums(ivec4 i0, ivec4 i1, ivec4 i2) {
    int s0 = i0.x + i0.y + i0.z + i0.w, s1 = i1.x + i1.y + i1.z + i1.w;
#if PLANES == 3
    s1 = 254 * s1 + (i2.x + i2.y + i2.z + i2.w);
#endif
    return ivec2(s0, s1);
}
