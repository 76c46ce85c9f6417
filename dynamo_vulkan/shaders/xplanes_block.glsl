// One block of 32 elements of x as PLANES (2 or 3) int8 planes, the integer-dot mat-vec's
// layout (gguf_xplanes.comp says what the planes and the block's four words hold). Eight
// consecutive invocations make a block: invocation l holds its word's four values v and
// writes word l of each plane at word o of XP_OUT (the block's first word), the first of
// the eight then the scales (times rn, the norm's rsqrt where the planes are of a
// normalised x) and the plane sums. Every invocation of the workgroup calls it (it holds
// barriers); `live` says whether this one's block is written. Needs MAXWG and XP_OUT.
#ifndef PLANES
#define PLANES 3
#endif
#if PLANES != 2 && PLANES != 3
#error "xplanes_block.glsl: PLANES is 2 or 3"
#endif
#define WPB (8u * PLANES + 4u)     // words a block
shared float xp_max[MAXWG];
shared int xp_a0[MAXWG], xp_a1[MAXWG];

uint xp_packed(ivec4 a) {
    uvec4 u = uvec4(a) & 0xFFu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}

void xp_block(vec4 v, uint lid, uint l, uint o, bool live, float rn) {
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
    if (live) {
        XP_OUT[o + l] = xp_packed(i0);
        XP_OUT[o + 8u + l] = xp_packed(i1);
#if PLANES == 3
        XP_OUT[o + 16u + l] = xp_packed(i2);
#endif
    }
    xp_a0[lid] = i0.x + i0.y + i0.z + i0.w;
#if PLANES == 3
    xp_a1[lid] = 254 * (i1.x + i1.y + i1.z + i1.w) + (i2.x + i2.y + i2.z + i2.w);
    const float S1_DIV = 64516.0;
#else
    xp_a1[lid] = i1.x + i1.y + i1.z + i1.w;
    const float S1_DIV = 254.0;
#endif
    barrier();
    if (live && l == 0u) {
        int s0 = 0, s1 = 0;
        [[unroll]] for (uint i = 0; i < 8u; ++i) { s0 += xp_a0[first + i]; s1 += xp_a1[first + i]; }
        XP_OUT[o + 8u * PLANES] = floatBitsToUint(s * rn);
        XP_OUT[o + 8u * PLANES + 1u] = floatBitsToUint(s / S1_DIV * rn);
        XP_OUT[o + 8u * PLANES + 2u] = uint(s0);
        XP_OUT[o + 8u * PLANES + 3u] = uint(s1);
    }
    barrier();    // the shared arrays are free for the next block
}
