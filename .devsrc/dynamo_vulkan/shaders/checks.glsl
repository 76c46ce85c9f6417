// Included by common.glsl: int64 arithmetic on int32 words with overflow checks. torch's
// int64 results travel as int32 (DESIGN: values that do not fit are an error, not a
// wrap): these forms compute the int32 result and set bits `m` in ck_, which an
// elementwise kernel ORs into the plan's check word (lowering/checks.py); the program
// then raises OverflowError after the submit.
uint ck_ = 0u;
int iadd_ck(int a, int b, uint m) { int r = a + b; if (((a ^ r) & (b ^ r)) < 0) ck_ |= m; return r; }
int isub_ck(int a, int b, uint m) { int r = a - b; if (((a ^ b) & (a ^ r)) < 0) ck_ |= m; return r; }
int imul_ck(int a, int b, uint m) {
    int hi, lo;
    imulExtended(a, b, hi, lo);
    if (hi != (lo >> 31)) ck_ |= m;
    return lo;
}
int ineg_ck(int a, uint m) { if (a == int(0x80000000u)) ck_ |= m; return -a; }
int iabs_ck(int a, uint m) { if (a == int(0x80000000u)) ck_ |= m; return abs(a); }
int ishl_ck(int a, int b, uint m) {  // a << b as int64 would give it (b >= 64: 0)
    if (b < 0 || b >= 64) return 0;
    if (b >= 32) { if (a != 0) ck_ |= m; return 0; }
    int r = a << b;
    if ((r >> b) != a) ck_ |= m;
    return r;
}
int ftoi_ck(float x, uint m) {  // float -> int64: truncated, NaN and out of int32 flagged
    if (!(x > -2147483904.0 && x < 2147483648.0)) { ck_ |= m; return 0; }
    return int(trunc(x));
}
int ishr_(int a, int b) { return (b < 0 || b >= 31) ? (a < 0 ? -1 : 0) : a >> b; }  // as int64's
// Exact int64 sums of int32 values as (high, low) halves: low in [0, 65535] after each
// normalisation, high the rest; join64_ck flags a total outside int32. Exact while the
// total stays within 2^47 (65536 values of any int32 size).
ivec2 split64_(int x) { return ivec2(x >> 16, x & 0xffff); }
ivec2 norm64_(ivec2 s) { return ivec2(s.x + (s.y >> 16), s.y & 0xffff); }
ivec2 add64_(ivec2 a, ivec2 b) { return norm64_(a + b); }
int join64_ck(ivec2 v, uint m) { if (v.x < -32768 || v.x > 32767) ck_ |= m; return v.x * 65536 + v.y; }
// Exact int64 products of int32 values as (int32 product mod 2^32, float32 product): the
// float's size and sign tell whether the exact product left int32 (below 3e9 in size the
// exact one is below 2^32, where a product beyond int32 wraps to the other sign).
ivec2 psplit64_(int x) { return ivec2(x, floatBitsToInt(float(x))); }
ivec2 pmul64_(ivec2 a, ivec2 b) {   // the float part clamped: no infinity, so 0 stays 0
    float f = clamp(intBitsToFloat(a.y) * intBitsToFloat(b.y), -1.0e10, 1.0e10);
    return ivec2(a.x * b.x, floatBitsToInt(f));
}
ivec2 psubgroup64_(ivec2 v) {   // pmul64_ over the subgroup (in subgroup-uniform control flow)
    float f = intBitsToFloat(v.y);
    bool zero = subgroupAny(f == 0.0);
    uint negatives = subgroupAdd(f < 0.0 ? 1u : 0u);
    float m = zero ? 0.0 : exp2(min(subgroupAdd(f == 0.0 ? 0.0 : log2(abs(f))), 34.0));
    return ivec2(subgroupMul(v.x), floatBitsToInt((negatives & 1u) != 0u ? -m : m));
}
int pjoin64_ck(ivec2 p, uint m) {
    float f = intBitsToFloat(p.y);
    if (abs(f) > 3.0e9 || (p.x < 0) != (f < 0.0) || (p.x == 0) != (f == 0.0)) ck_ |= m;
    return p.x;
}
// a ** b as int64 would give it (b < 0 as ipow_); a result outside int32 flagged. Each
// step's size is at most the result's, so a step that overflows means the result does.
int ipow_ck(int a, int b, uint m) {
    if (b < 0 || a == 0 || a == 1) return ipow_(a, b);
    if (a == -1) return (b & 1) != 0 ? -1 : 1;
    if (b > 31) { ck_ |= m; return 0; }
    int r = 1;
    for (int e = 0; e < b; ++e) r = imul_ck(r, a, m);
    return r;
}
