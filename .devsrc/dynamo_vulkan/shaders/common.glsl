// Shared by every kernel: 32-bit word storage, typed loads/stores, and the
// flat invocation index over a 2-D grid (for more than 65535 workgroups).
// Every buffer is an array of uint words; f32, i32 and bool (0/1) are decoded here.
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_vote : enable

#define BUFFER(b, name) layout(set = 0, binding = b) buffer Buf##b { uint name[]; };
// A buffer the kernel only reads: the driver may then load it through its read-only
// cache path (faster on the H100: docs/journal.md, session 29).
#define IN_BUFFER(b, name) layout(set = 0, binding = b) readonly buffer Buf##b { uint name[]; };

float ld_f32(uint w) { return uintBitsToFloat(w); }
int ld_i32(uint w) { return int(w); }
bool ld_b(uint w) { return w != 0u; }
uint st_f32(float v) { return floatBitsToUint(v); }
uint st_i32(int v) { return uint(v); }
uint st_b(bool v) { return v ? 1u : 0u; }

// isnan and isinf from the bits, in every kernel: Vulkan lets a compiler assume that
// floats hold no NaN or infinity unless a shader asks to preserve them, and NVIDIA's then
// folds the builtins to false (a NaN lost by amax, atan2(inf, inf) as 0).
bool isnan_bits(float x) { return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u; }
bvec4 isnan_bits(vec4 x) { return greaterThan(floatBitsToUint(x) & 0x7fffffffu, uvec4(0x7f800000u)); }
bool isinf_bits(float x) { return (floatBitsToUint(x) & 0x7fffffffu) == 0x7f800000u; }
bvec4 isinf_bits(vec4 x) { return equal(floatBitsToUint(x) & 0x7fffffffu, uvec4(0x7f800000u)); }
// float to bool from the bits: a driver that flushes subnormals would call 1e-40 zero
bool nonzero_f(float x) { return (floatBitsToUint(x) & 0x7fffffffu) != 0u; }
#define isnan isnan_bits
#define isinf isinf_bits

// Macros, not functions: gl_WorkGroupSize must be read after the kernel's
// layout(local_size_x_id) declaration, which comes after this include.
#define flat_workgroup() (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x)
#define flat_invocation() (flat_workgroup() * gl_WorkGroupSize.x + gl_LocalInvocationID.x)

const float M_SQRT1_2 = 0.70710678118654752440;
const float M_2_SQRTPI = 1.12837916709551257390;

// erfc(z) for z = |x| >= 0 (Numerical Recipes erfc, Chebyshev fit): relative error < 1.2e-7
float erfc_fit_(float z) {
    float t = 1.0 / (1.0 + 0.5 * z);
    return t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
           t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
           t * (-0.82215223 + t * 0.17087277)))))))));
}
// erf with |error| < 1.2e-7
float erf_f(float x) {
    float z = abs(x);
    if (z < 0.5) {  // the Taylor series: 1 - erfc cancels near 0
        float q = x * x;
        return M_2_SQRTPI * x * (1.0 - q * (1.0 / 3.0 - q * (0.1 - q * (1.0 / 42.0 - q * (1.0 / 216.0
               - q * (1.0 / 1320.0))))));
    }
    float r = erfc_fit_(z);
    return x >= 0.0 ? 1.0 - r : r - 1.0;
}
float erfc_f(float x) {
    float r = erfc_fit_(abs(x));
    return x >= 0.0 ? r : 2.0 - r;
}
// log1p / expm1 near 0 by series (drivers' log and exp are only accurate in
// absolute terms there), the plain forms elsewhere.
float log1p_f(float x) {
    if (abs(x) >= 0.5) return log(1.0 + x);
    float s = x / (2.0 + x), s2 = s * s;     // log1p(x) = 2 atanh(s)
    return 2.0 * s * (1.0 + s2 * (1.0 / 3.0 + s2 * (0.2 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0 +
           s2 * (1.0 / 11.0))))));
}
float expm1_f(float x) {
    if (abs(x) >= 0.5) return exp(x) - 1.0;
    return x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0 +
           x * (1.0 / 720.0 + x * (1.0 / 5040.0 + x * (1.0 / 40320.0))))))));
}
// tan by Cody-Waite reduction modulo pi/4 and a polynomial (the Cephes tanf scheme):
// drivers' tan (and sin/cos near a pole) lose the relative accuracy torch has there.
float tan_f(float xx) {
    if (isinf(xx) || isnan(xx)) return uintBitsToFloat(0x7fc00000u);
    float x = abs(xx);
    int j = int(1.27323954473516 * x);
    float y = float(j);
    if ((j & 1) != 0) { j += 1; y += 1.0; }
    precise float z = ((x - y * 0.78515625) - y * 2.4187564849853515625e-4) - y * 3.77489497744594108e-8;
    float zz = z * z;
    float t = x > 1.0e-4 ? (((((9.38540185543e-3 * zz + 3.11992232697e-3) * zz + 2.44301354525e-2) * zz +
              5.34112807005e-2) * zz + 1.33387994085e-1) * zz + 3.33331568548e-1) * zz * z + z : z;
    if ((j & 2) != 0) t = -1.0 / t;
    return xx < 0.0 ? -t : t;
}
float tanh_f(float x) {  // GLSL tanh overflows to NaN for |x| > ~44 on some drivers
    float e = expm1_f(-2.0 * abs(x));  // exp(-2|x|) - 1: no cancellation near 0
    float t = -e / (2.0 + e);
    return x < 0.0 ? -t : (x > 0.0 ? t : x);
}
float sinh_f(float x) {  // (E + E / (E + 1)) / 2 with E = expm1(|x|): accurate near 0
    float e = expm1_f(abs(x));
    float s = isinf(e) ? e : 0.5 * (e + e / (e + 1.0));
    return x < 0.0 ? -s : (x > 0.0 ? s : x);
}
float sigmoid_f(float x) { return x >= 0.0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }
// Integer division and modulo with torch's signs (GLSL's int division truncates).
int irem_(int a, int b) { return b == 0 ? 0 : a - b * (a / b); }
int imod_(int a, int b) { int r = irem_(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
int ifloordiv_(int a, int b) {
    if (b == 0) return 0;
    int q = a / b;
    return (a - q * b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int ipow_(int a, int b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) != 0 ? -1 : 1) : 0);
    int r = 1;
    for (int e = b; e > 0; e >>= 1) { if ((e & 1) != 0) r *= a; a *= a; }
    return r;
}
float round_bf16(float x) {  // to the nearest bfloat16, ties to even (NaN kept)
    if (isnan(x)) return x;
    uint u = floatBitsToUint(x);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uintBitsToFloat(u & 0xffff0000u);
}
// to the nearest float16, ties to even, as torch's .half() (overflow to inf, NaN kept):
// by steps of the float16 quantum, since packHalf2x16's rounding is the driver's choice
float round_f16(float x) {
    if (isnan(x) || isinf(x)) return x;
    float a = abs(x);
    if (a >= 65520.0) return x < 0.0 ? -uintBitsToFloat(0x7f800000u) : uintBitsToFloat(0x7f800000u);
    int e;
    frexp(a, e);                       // a < 2^e
    int q = max(e - 1, -14) - 10;      // the quantum's exponent (subnormal halves: 2^-24)
    float r = ldexp(roundEven(ldexp(a, -q)), q);
    return (floatBitsToUint(x) >> 31) != 0u ? -r : r;
}
// float -> int32 as torch's CPU casts do (x86: NaN and values beyond int32 give -2^31;
// narrower integers wrap that), where GLSL leaves them undefined (NVIDIA saturates)
int ftoi32_(float x) {
    return (x > -2147483904.0 && x < 2147483648.0) ? int(trunc(x)) : int(0x80000000u);
}
#include "ieee.glsl"
#include "checks.glsl"
