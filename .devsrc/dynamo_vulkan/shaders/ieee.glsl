// Included by common.glsl (after log1p_f, which asinh_f uses).
// IEEE special values as torch's CPU kernels treat them. GLSL leaves max, min and atan
// undefined for NaN (lavapipe drops it), and its pow, mod and atan(y, x) differ from C's
// at zeros and infinities.
#define INF_F uintBitsToFloat(0x7f800000u)
#define NAN_F uintBitsToFloat(0x7fc00000u)
bool signbit_(float x) { return (floatBitsToUint(x) >> 31) != 0u; }
// a / b, also where a driver divides as a * (1 / b) and flushes a subnormal reciprocal to
// zero (NVIDIA: 1e38 / 1e38 gave 0): for |b| > 2^126 both are scaled by 1/4 first (precise:
// not folded back), which changes no finite quotient's bits beyond a's underflow
float div_f(float a, float b) {
    if (!(abs(b) > 8.5070592e37)) return a / b;
    precise float s = a * 0.25, t = b * 0.25;
    return s / t;
}
// -0 or +0 from bits (a select between the constants -0.0 and 0.0 may be folded)
float zero_signed_(bool negative) { return uintBitsToFloat(negative ? 0x80000000u : 0u); }
// max, min and relu choose between bit patterns: Vulkan lets a compiler that sees a float
// select turn it into fmax/fmin, which drop NaN and the sign of zero (NVIDIA's does).
// max and min keep the first operand when the two compare equal (+0 and -0), as torch's
float max_f(float a, float b) {
    return uintBitsToFloat(isnan_bits(a) || isnan_bits(b) ? 0x7fc00000u
                           : (a < b ? floatBitsToUint(b) : floatBitsToUint(a)));
}
float min_f(float a, float b) {
    return uintBitsToFloat(isnan_bits(a) || isnan_bits(b) ? 0x7fc00000u
                           : (b < a ? floatBitsToUint(b) : floatBitsToUint(a)));
}
// torch's relu: negative numbers to +0; -0 and NaN as they are
float relu_f(float x) {
    uint u = floatBitsToUint(x);
    return uintBitsToFloat(u > 0x80000000u && u <= 0xff800000u ? 0u : u);
}
// atan by reduction to |x| <= tan(pi/8) and a polynomial (the Cephes atanf scheme):
// lavapipe's atan is 3e-6 off at 1
float atan_f(float x) {
    if (isnan(x) || x == 0.0) return x;
    float a = abs(x), base = 0.0;
    if (a > 2.414213562373095) { base = 1.5707963267948966; a = -1.0 / a; }
    else if (a > 0.4142135623730950) { base = 0.7853981633974483; a = (a - 1.0) / (a + 1.0); }
    float z = a * a;
    float r = base + ((((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z
              - 3.33329491539e-1) * z * a + a);
    return x < 0.0 ? -r : r;
}
float atan2_f(float y, float x) {
    if (isnan(y) || isnan(x)) return y + x;
    float pi = 3.14159265358979;
    if (y == 0.0) return signbit_(x) ? (signbit_(y) ? -pi : pi) : y;
    if (isinf(x) && isinf(y)) return (x > 0.0 ? 0.25 * pi : 0.75 * pi) * sign(y);
    if (isinf(x)) return x > 0.0 ? zero_signed_(signbit_(y)) : pi * sign(y);
    if (abs(x) >= abs(y)) {
        float r = atan_f(div_f(y, x));
        return x > 0.0 ? r : (y > 0.0 ? r + pi : r - pi);
    }
    return (y > 0.0 ? 0.5 * pi : -0.5 * pi) - atan_f(div_f(x, y));
}
float asinh_f(float x) {  // log1p form: accurate near 0; log(2|x|) where x * x overflows
    float a = abs(x);
    float r = a > 1.0e18 ? log(a) + 0.6931471805599453 : log1p_f(a + a * a / (1.0 + sqrt(1.0 + a * a)));
    return x < 0.0 ? -r : (x > 0.0 ? r : x);
}
float log_f(float x) {  // subnormal x scaled up first (lavapipe's log reads them as 2^-127)
    return (x > 0.0 && x < 1.17549435e-38) ? log(x * 16777216.0) - 16.635532333438687 : log(x);
}
// C fmod, exact: each step subtracts |b| scaled to the top of |a|, which loses no bits.
float fmod_f(float a, float b) {
    if (isnan(a) || isnan(b) || isinf(a) || b == 0.0) return NAN_F;
    float x = abs(a), y = abs(b);
    if (isinf(b) || x < y) return a;
    for (int n = 0; n < 300 && x >= y; ++n) {
        int ex, ey;
        frexp(x, ex);
        frexp(y, ey);
        float t = ldexp(y, ex - ey);
        if (t > x) t *= 0.5;
        x -= t;
    }
    return signbit_(a) ? -x : x;
}
float remainder_f(float a, float b) {  // Python's modulo: the sign of b
    float m = fmod_f(a, b);
    return (m != 0.0 && ((b < 0.0) != (m < 0.0))) ? m + b : m;
}
float floordiv_f(float a, float b) {  // torch's div(rounding_mode="floor")
    if (b == 0.0) return div_f(a, b);
    float m = fmod_f(a, b);
    float d = div_f(a - m, b);
    if (m != 0.0 && ((b < 0.0) != (m < 0.0))) d -= 1.0;
    if (d == 0.0) return zero_signed_(signbit_(a) != signbit_(b));
    float f = floor(d);
    return d - f > 0.5 ? f + 1.0 : f;
}
bool odd_int_(float b) { return abs(b) < 16777216.0 && b == floor(b) && mod(b, 2.0) != 0.0; }
float pow_pos_(float a, float b) {  // a > 0 finite; small integer exponents multiply
    if (b == 1.0) return a;
    if (b == 2.0) return a * a;
    if (b == 3.0) return a * a * a;
    if (b == 0.5) return sqrt(a);
    if (b == -1.0) return div_f(1.0, a);
    return pow(a, b);
}
float pow_f(float a, float b) {  // C's pow: zeros, infinities, negative bases
    if (b == 0.0 || a == 1.0) return 1.0;
    if (isnan(a) || isnan(b)) return a + b;
    if (isinf(b)) {
        float m = abs(a);
        return m == 1.0 ? 1.0 : ((m > 1.0) == (b > 0.0) ? INF_F : 0.0);
    }
    bool odd = odd_int_(b);
    if (a == 0.0 || isinf(a)) {
        float r = (a == 0.0) == (b < 0.0) ? INF_F : 0.0;
        return odd && signbit_(a) ? -r : r;
    }
    if (a < 0.0) {
        if (b != floor(b)) return NAN_F;
        float p = pow_pos_(-a, b);
        return odd ? -p : p;
    }
    return pow_pos_(a, b);
}
float hypot_f(float a, float b) {  // scaled: a * a may overflow where the result does not
    if (isinf(a) || isinf(b)) return INF_F;
    if (isnan(a) || isnan(b)) return NAN_F;
    float m = max(abs(a), abs(b)), n = min(abs(a), abs(b));
    if (m == 0.0) return 0.0;
    float r = div_f(n, m);
    return m * sqrt(1.0 + r * r);
}
