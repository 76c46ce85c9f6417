// Special functions for the elementwise and scan kernels, each compiled in only where a
// lowering rule asks for it by defining NEED_<NAME> (lowering/mathops.py, lowering/scan.py;
// declared in shaders/families.py). Needs common.glsl (erf_f, pow_f, M_2_SQRTPI).

#ifdef NEED_ERFINV
// Giles' single-precision erfinv ("Approximating the erfinv function", 2010), then two
// Newton steps on erf_f to reach float32 accuracy.
float erfinv_f(float y) {
  if (isnan(y) || abs(y) > 1.0) return uintBitsToFloat(0x7fc00000u);
  if (abs(y) == 1.0) return y * uintBitsToFloat(0x7f800000u);
  float w = -log((1.0 - y) * (1.0 + y)); float p;
  if (w < 5.0) { w = w - 2.5; p = 2.81022636e-08; p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w; p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w; p = -0.00417768164 + p * w; p = 0.246640727 + p * w;
    p = 1.50140941 + p * w; }
  else { w = sqrt(w) - 3.0; p = -0.000200214257; p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w; p = -0.00367342844 + p * w; p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w; p = 0.00943887047 + p * w; p = 1.00167406 + p * w;
    p = 2.83297682 + p * w; }
  float x = p * y;
  for (int k = 0; k < 2; ++k) { float d = M_2_SQRTPI * exp(-x * x);
    if (d > 0.0) x -= (erf_f(x) - y) / d; }
  return x; }
#endif

#if defined(NEED_LGAMMA) || defined(NEED_IGAMMA)
// lgamma: Lanczos (g = 7, 9 terms) for x >= 0.5, reflection below.
float lgamma_pos_(float x) { x -= 1.0; float a = 0.99999999999980993; float t = x + 7.5;
  a += 676.5203681218851 / (x + 1.0); a += -1259.1392167224028 / (x + 2.0);
  a += 771.32342877765313 / (x + 3.0); a += -176.61502916214059 / (x + 4.0);
  a += 12.507343278686905 / (x + 5.0); a += -0.13857109526572012 / (x + 6.0);
  a += 9.9843695780195716e-6 / (x + 7.0); a += 1.5056327351493116e-7 / (x + 8.0);
  return 0.91893853320467274 + (x + 0.5) * log(t) - t + log(a); }
float lgamma_f(float x) {
  if (isnan(x)) return x;
  if (isinf(x)) return uintBitsToFloat(0x7f800000u);
  if (x >= 0.5) return lgamma_pos_(x);
  if (x == floor(x)) return uintBitsToFloat(0x7f800000u);
  float s = abs(sin(3.14159265358979 * x));
  return log(3.14159265358979 / s) - lgamma_pos_(1.0 - x); }
#endif

#ifdef NEED_DIGAMMA
// digamma: recurrence up to x >= 6, then the asymptotic series; reflection for x < 0.
float digamma_pos_(float x) { float r = 0.0; while (x < 6.0) { r -= 1.0 / x; x += 1.0; }
  float f = 1.0 / (x * x);
  return r + log(x) - 0.5 / x - f * (1.0 / 12.0 - f * (1.0 / 120.0 - f * (1.0 / 252.0 -
         f * (1.0 / 240.0 - f / 132.0)))); }
float digamma_f(float x) {
  if (isnan(x) || (isinf(x) && x > 0.0)) return x;
  if (x == 0.0) return (floatBitsToUint(x) >> 31) != 0u ? uintBitsToFloat(0x7f800000u)
                                                        : uintBitsToFloat(0xff800000u);
  if (x < 0.0) { if (x == floor(x)) return uintBitsToFloat(0x7fc00000u);
    return digamma_pos_(1.0 - x) - 3.14159265358979 / tan(3.14159265358979 * x); }
  return digamma_pos_(x); }
#endif

#ifdef NEED_I0
// i0: Abramowitz and Stegun 9.8.1 / 9.8.2.
float i0_f(float x) { float a = abs(x);
  if (a < 3.75) { float t = (x / 3.75) * (x / 3.75);
    return 1.0 + t * (3.5156229 + t * (3.0899424 + t * (1.2067492 + t * (0.2659732 +
           t * (0.0360768 + t * 0.0045813))))); }
  float t = 3.75 / a;
  return (exp(a) / sqrt(a)) * (0.39894228 + t * (0.01328592 + t * (0.00225319 +
         t * (-0.00157565 + t * (0.00916281 + t * (-0.02057706 + t * (0.02635537 +
         t * (-0.01647633 + t * 0.00392377)))))))); }
#endif

#ifdef NEED_NEXTAFTER
float nextafter_f(float a, float b) {
  if (isnan(a) || isnan(b)) return uintBitsToFloat(0x7fc00000u);
  if (a == b) return b;
  if (a == 0.0) return (floatBitsToUint(b) & 0x80000000u) != 0u ? -uintBitsToFloat(1u)
                                                                 : uintBitsToFloat(1u);
  uint u = floatBitsToUint(a);
  return uintBitsToFloat(((a < b) == (a > 0.0)) ? u + 1u : u - 1u); }
#endif

#ifdef NEED_SIGNBIT
bool signbit_f(float x) { return (floatBitsToUint(x) >> 31) != 0u; }
#endif

#ifdef NEED_TRIGAMMA
// trigamma as torch computes it: reflection below 0.5, six steps of the recurrence, then
// the asymptotic series.
float trigamma_f(float x) { float sgn = 1.0; float r = 0.0;
  if (x < 0.5) { sgn = -1.0; float sp = sin(3.14159265358979 * x);
    r -= (3.14159265358979 * 3.14159265358979) / (sp * sp); x = 1.0 - x; }
  for (int i = 0; i < 6; ++i) { r += 1.0 / (x * x); x += 1.0; }
  float ixx = 1.0 / (x * x);
  r += (1.0 + 1.0 / (2.0 * x) + ixx * (1.0 / 6.0 - ixx * (1.0 / 30.0 - ixx * (1.0 / 42.0)))) / x;
  return sgn * r; }
#endif

#ifdef NEED_ZETA
// Hurwitz zeta(s, q) by Euler-Maclaurin summation (the Cephes scheme torch uses), for
// polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x).
float zeta_f(float x, float q) {
  const float A[12] = float[12](12.0, -720.0, 30240.0, -1209600.0, 47900160.0,
    -1.8924375803183791606e9, 7.47242496e10, -2.950130727918164224e12,
    1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
    -7.1661652561756670113e18);
  if (x == 1.0) return uintBitsToFloat(0x7f800000u);
  if (q <= 0.0) { if (q == floor(q)) return uintBitsToFloat(0x7f800000u);
    if (x != floor(x)) return uintBitsToFloat(0x7fc00000u); }
  float s = pow_f(q, -x); float a = q; int i = 0; float b = 0.0;
  while (i < 9 || a <= 9.0) { i += 1; a += 1.0; b = pow_f(a, -x); s += b;
    if (abs(b / s) < 1.0e-7) return s; }
  float w = a; s += b * w / (x - 1.0); s -= 0.5 * b; a = 1.0; float k = 0.0;
  for (int j = 0; j < 12; ++j) { a *= x + k; b /= w; float t = a * b / A[j]; s += t;
    if (abs(t / s) < 1.0e-7) break; k += 1.0; a *= x + k; b /= w; k += 1.0; }
  return s; }
#endif

#ifdef NEED_IGAMMA
// Regularised incomplete gamma P(a, x) (igamma) and Q = 1 - P (igammac): the power
// series below x = a (or x <= 1), the continued fraction above (Cephes igam / igamc,
// torch's edge rules).
float igam_fac_(float a, float x) { return exp(a * log(x) - x - lgamma_f(a)); }
float igam_series_(float a, float x) { float r = a, c = 1.0, s = 1.0;
  for (int i = 0; i < 500; ++i) { r += 1.0; c *= x / r; s += c; if (c <= s * 1.0e-8) break; }
  return s * igam_fac_(a, x) / a; }
float igamc_cf_(float a, float x) { float y = 1.0 - a, z = x + y + 1.0, c = 0.0;
  float pkm2 = 1.0, qkm2 = x, pkm1 = x + 1.0, qkm1 = z * x, ans = pkm1 / qkm1;
  for (int i = 0; i < 500; ++i) { c += 1.0; y += 1.0; z += 2.0; float yc = y * c;
    float pk = pkm1 * z - pkm2 * yc, qk = qkm1 * z - qkm2 * yc; float t = 1.0;
    if (qk != 0.0) { float r = pk / qk; t = abs((ans - r) / r); ans = r; }
    pkm2 = pkm1; pkm1 = pk; qkm2 = qkm1; qkm1 = qk;
    if (abs(pk) > 1.0e15) { pkm2 *= 1.0e-15; pkm1 *= 1.0e-15; qkm2 *= 1.0e-15; qkm1 *= 1.0e-15; }
    if (t <= 1.0e-8) break; }
  return ans * igam_fac_(a, x); }
float igamma_f(float a, float x, bool upper) {
  float nan = uintBitsToFloat(0x7fc00000u);
  if (isnan(a) || isnan(x) || x < 0.0 || a < 0.0) return nan;
  if (a == 0.0) return x > 0.0 ? (upper ? 0.0 : 1.0) : nan;
  if (x == 0.0) return upper ? 1.0 : 0.0;
  if (isinf(a)) return isinf(x) ? nan : (upper ? 1.0 : 0.0);
  if (isinf(x)) return upper ? 0.0 : 1.0;
  bool cf = x > 1.0 && x > a;
  float v = cf ? igamc_cf_(a, x) : igam_series_(a, x);
  return cf == upper ? v : 1.0 - v; }
#endif

#ifdef NEED_LSE
// log(exp(a) + exp(b)) without overflow; -inf stays -inf, NaN propagates.
float lse_(float a, float b) { float m = max(a, b); if (isinf(m) && m < 0.0) return m; if (isnan(a) || isnan(b)) return a + b; return m + log(1.0 + exp(min(a, b) - m)); }
#endif

#ifdef NEED_RANDOM_BITS
// A counter-based generator (dropout): element i's 32 random bits are a hash of i and the
// call's two seed words (the lowbias32 integer mix, twice); its top 24 bits make u in [0, 1).
uint dv_mix(uint h) { h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16; return h; }
float dv_uniform(uint i, int s0, int s1) { return float(dv_mix(dv_mix(i ^ uint(s0)) + uint(s1)) >> 8u) * 5.9604645e-8; }
#endif
