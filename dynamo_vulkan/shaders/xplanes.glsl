// x as three int8 planes per block of 32 (the format gguf_matvec_idot.comp reads), made
// by eight invocations a block, invocation l of its eight making word l of each plane:
// with s = max|x| / 127 over the block, x = s * (a0 + a1 / 254 + a2 / 254^2) to within
// s / 254^2 / 2, about 2^-24 of the block's largest value (fp32 accuracy). Per block, 7
// uvec4: planes 0..2 (8 words each, the bytes in the order the weight's quants sit:
// NIBBLES, the even elements of each 8 in one word and the odd in the next, else element
// order), then s0 = s * rn, s1 = s / 254^2 * rn (float bits: rn carries an RMSNorm's
// rsqrt) and the plane sums A0 = sum a0, A1 = sum(254 a1 + a2).
// Include after defining XP_OUT (the planes' uint array) and MAXWG (the workgroup size
// at most); the eight invocations of a block are 8-aligned in the workgroup.
#ifndef NIBBLES
#define NIBBLES 0
#endif
shared float xp_max[MAXWG];
shared int xp_a0[MAXWG], xp_a1[MAXWG];
// word l's 4 elements of a block: the first, then one every XP_DE
const uint XP_DE = NIBBLES != 0 ? 2u : 1u;
uint xp_first(uint l) { return NIBBLES != 0 ? 8u * (l >> 1) + (l & 1u) : 4u * l; }

uint xp_packed(ivec4 a) {
    uvec4 u = uvec4(a) & 0xFFu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}

// Word l of block blk's planes from its 4 elements v (invocation lid; live: blk is a
// block to write). Every invocation of the workgroup must call it (it holds barriers).
void xp_block(uint lid, uint l, uint blk, bool live, vec4 v, float rn) {
    vec4 av = abs(v);
    // a NaN (which max() may drop) is marked -1 and makes the block's scales NaN, so the
    // mat-vec's sums come out NaN as the fp32 kernel's do (an infinity gives an infinite
    // scale, and the sums infinities or NaN)
    xp_max[lid] = any(isnan(v)) ? -1.0 : max(max(av.x, av.y), max(av.z, av.w));
    barrier();
    uint first = lid & ~7u;
    float amax = 0.0;
    bool nan_in = false;
    [[unroll]] for (uint i = 0; i < 8u; ++i) {
        amax = max(amax, xp_max[first + i]);
        nan_in = nan_in || xp_max[first + i] < 0.0;
    }
    float s = nan_in ? uintBitsToFloat(0x7fc00000u) : amax / 127.0;
    float inv = amax > 0.0 && !nan_in ? 127.0 / amax : 0.0;
    vec4 t = v * inv;
    vec4 a0 = clamp(roundEven(t), -127.0, 127.0);
    vec4 r = (t - a0) * 254.0;
    vec4 a1 = clamp(roundEven(r), -127.0, 127.0);
    vec4 a2 = clamp(roundEven((r - a1) * 254.0), -127.0, 127.0);
    ivec4 i0 = ivec4(a0), i1 = ivec4(a1), i2 = ivec4(a2);
    uint o = 28u * blk;
    if (live) {
        XP_OUT[o + l] = xp_packed(i0);
        XP_OUT[o + 8u + l] = xp_packed(i1);
        XP_OUT[o + 16u + l] = xp_packed(i2);
    }
    xp_a0[lid] = i0.x + i0.y + i0.z + i0.w;
    xp_a1[lid] = 254 * (i1.x + i1.y + i1.z + i1.w) + (i2.x + i2.y + i2.z + i2.w);
    barrier();
    if (live && l == 0u) {
        int s0 = 0, s1 = 0;
        [[unroll]] for (uint i = 0; i < 8u; ++i) { s0 += xp_a0[first + i]; s1 += xp_a1[first + i]; }
        XP_OUT[o + 24u] = floatBitsToUint(s * rn);
        XP_OUT[o + 25u] = floatBitsToUint(s / 64516.0 * rn);
        XP_OUT[o + 26u] = uint(s0);
        XP_OUT[o + 27u] = uint(s1);
    }
}
