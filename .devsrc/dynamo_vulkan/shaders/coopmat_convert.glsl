// fp32 values as the 16-bit operands of the tensor-core matmul (matmul_coopmat.comp, and
// coopmat_pack.comp, which converts an operand once ahead of it): bf16 rounded to nearest
// even (CM_BF16, BF16_IN_F16), with SPLIT3 also the remainder as a second bf16 value;
// or fp16 (CM_F16). Pairs are packed into words, element 2i in the lower half of word i.
#if defined(CM_BF16) || defined(BF16_IN_F16)
// bfloat16 of fp32 bits b, rounded to nearest even, in the upper 16 bits (lower 16 zero).
// Done here in integer bits: the driver's conversion may truncate (NVIDIA's does:
// medium's products lost 4x the accuracy, all biased one way). NaN stays NaN (quieted,
// so that no payload bit is lost in the lower half), infinity stays infinity, and a
// finite x that would round beyond bfloat16's largest finite value takes that value
// (its sign kept), so that hi stays within one bf16 step of x and SPLIT3's lo holds the
// rest.
uint bf16_bits(uint b) {
    uint a = b & 0x7fffffffu;
    uint r = b + 0x7fffu + ((b >> 16) & 1u);
    if (a >= 0x7f7f8000u)
        r = a > 0x7f800000u ? (b | 0x00400000u) : a == 0x7f800000u ? b : ((b & 0x80000000u) | 0x7f7f0000u);
    return r & 0xffff0000u;
}

// Two bf16 values (bits in the upper halves of r0, r1) as one word, r0 in the lower half.
#ifdef BF16_IN_F16
uint pack2(uint r0, uint r1) { return packHalf2x16(vec2(uintBitsToFloat(r0), uintBitsToFloat(r1))); }
#else
uint pack2(uint r0, uint r1) { return (r0 >> 16) | r1; }
#endif

// 8 fp32 values as packed bf16 pairs (element 2i in the lower half of word i): hi and,
// for SPLIT3, lo = bf16(x - hi) (x - hi is exact in fp32; 0 for infinities and NaN).
void convert(vec4 x0, vec4 x1, out uvec4 hi, out uvec4 lo) {
    uvec4 b0 = floatBitsToUint(x0), b1 = floatBitsToUint(x1);
    uvec4 h0, h1;
    [[unroll]] for (uint i = 0; i < 4u; ++i) {
        h0[i] = bf16_bits(b0[i]);
        h1[i] = bf16_bits(b1[i]);
    }
    hi = uvec4(pack2(h0.x, h0.y), pack2(h0.z, h0.w), pack2(h1.x, h1.y), pack2(h1.z, h1.w));
#ifdef SPLIT3
    uvec4 l0, l1;
    [[unroll]] for (uint i = 0; i < 4u; ++i) {
        float d0 = (b0[i] & 0x7fffffffu) >= 0x7f800000u ? 0.0 : x0[i] - uintBitsToFloat(h0[i]);
        float d1 = (b1[i] & 0x7fffffffu) >= 0x7f800000u ? 0.0 : x1[i] - uintBitsToFloat(h1[i]);
        l0[i] = bf16_bits(floatBitsToUint(d0));
        l1[i] = bf16_bits(floatBitsToUint(d1));
    }
    lo = uvec4(pack2(l0.x, l0.y), pack2(l0.z, l0.w), pack2(l1.x, l1.y), pack2(l1.z, l1.w));
#else
    lo = uvec4(0u);
#endif
}
#else
// fp16 tensors' values (exact in fp16) as packed pairs
void convert(vec4 x0, vec4 x1, out uvec4 hi, out uvec4 lo) {
    hi = uvec4(packHalf2x16(x0.xy), packHalf2x16(x0.zw), packHalf2x16(x1.xy), packHalf2x16(x1.zw));
    lo = uvec4(0u);
}
#endif

// SCALED: the exponent e of a row's (or column's) power-of-two scale, from its largest
// finite magnitude m (m < 2^x with x = m's exponent + 1: scaled values below 2^4), within
// [-124, 100]; 0 for a row of zeros. pow2(e) is 2^e (e within a float's normal range).
int scaled_exp(float m) {
    return m > 0.0 ? clamp(3 - (int((floatBitsToUint(m) >> 23) & 0xffu) - 127), -124, 100) : 0;
}
float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }

