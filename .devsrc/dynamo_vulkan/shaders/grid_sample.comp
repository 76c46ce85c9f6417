// grid_sampler_2d / 3d: out[n, c, (d,) h, w] samples input[n, c] at the grid's
// (x, y(, z)) in [-1, 1], with torch's rules (GridSampler.h): unnormalise (ALIGN
// corners or not), then padding (ZEROS: outside reads 0; BORDER: clamp;
// REFLECTION: reflect, then clamp) and BILINEAR (trilinear in 3-d) / NEAREST
// (round half to even) / BICUBIC (2-d; A = -0.75, padding applied to each tap)
// interpolation. 2-d runs as 3-d with one depth slice. One invocation per output
// element; input and grid are read through their strides.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint C = 1;
layout(constant_id = 3) const int ID = 1;
layout(constant_id = 4) const int IH = 1;
layout(constant_id = 5) const int IW = 1;
layout(constant_id = 6) const uint OD = 1;
layout(constant_id = 7) const uint OH = 1;
layout(constant_id = 8) const uint OW = 1;
layout(constant_id = 9) const uint X_OFF = 0;
layout(constant_id = 10) const uint XS_N = 0;
layout(constant_id = 11) const uint XS_C = 0;
layout(constant_id = 12) const uint XS_D = 0;
layout(constant_id = 13) const uint XS_H = 0;
layout(constant_id = 14) const uint XS_W = 0;
layout(constant_id = 15) const uint G_OFF = 0;
layout(constant_id = 16) const uint GS_N = 0;
layout(constant_id = 17) const uint GS_D = 0;
layout(constant_id = 18) const uint GS_H = 0;
layout(constant_id = 19) const uint GS_W = 0;
layout(constant_id = 20) const uint GS_K = 1;
BUFFER(0, outb)
BUFFER(1, xb)
BUFFER(2, gb)

float unnormalize(float c, int size) {
#ifdef ALIGN
    return (c + 1.0) * 0.5 * float(size - 1);
#else
    return ((c + 1.0) * float(size) - 1.0) * 0.5;
#endif
}

float reflect_c(float c, int twice_low, int twice_high) {
    if (twice_low == twice_high) return 0.0;
    float mn = float(twice_low) * 0.5, span = float(twice_high - twice_low) * 0.5;
    c = abs(c - mn);
    float extra = mod(c, span);
    int flips = int(floor(c / span));
    return (flips % 2 == 0) ? extra + mn : span - extra + mn;
}

float pad_c(float c, int size) {
#if defined(BORDER)
    c = clamp(c, 0.0, float(size - 1));
#elif defined(REFLECTION)
#ifdef ALIGN
    c = reflect_c(c, 0, 2 * (size - 1));
#else
    c = reflect_c(c, -1, 2 * size - 1);
#endif
    c = clamp(c, 0.0, float(size - 1));
#endif
    return c;
}

float at3(uint base, int z, int y, int x) {
    if (x < 0 || x >= IW || y < 0 || y >= IH || z < 0 || z >= ID) return 0.0;
    return ld_f32(xb[base + uint(z) * XS_D + uint(y) * XS_H + uint(x) * XS_W]);
}
float at(uint base, int y, int x) { return at3(base, 0, y, x); }

float at_padded(uint base, float y, float x) {   // bicubic taps
    int xi = int(pad_c(x, IW)), yi = int(pad_c(y, IH));
    return at(base, yi, xi);
}

vec4 cubic_weights(float t) {
    const float A = -0.75;
    float x1 = t, x2 = 1.0 - t;
    return vec4(((A * (x1 + 1.0) - 5.0 * A) * (x1 + 1.0) + 8.0 * A) * (x1 + 1.0) - 4.0 * A,
                ((A + 2.0) * x1 - (A + 3.0)) * x1 * x1 + 1.0,
                ((A + 2.0) * x2 - (A + 3.0)) * x2 * x2 + 1.0,
                ((A * (x2 + 1.0) - 5.0 * A) * (x2 + 1.0) + 8.0 * A) * (x2 + 1.0) - 4.0 * A);
}

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint w = e % OW, h = (e / OW) % OH, d = (e / (OW * OH)) % OD;
    uint c = (e / (OW * OH * OD)) % C, n = e / (OW * OH * OD * C);
    uint go = G_OFF + n * GS_N + d * GS_D + h * GS_H + w * GS_W;
    float gx = ld_f32(gb[go]), gy = ld_f32(gb[go + GS_K]);
    uint base = X_OFF + n * XS_N + c * XS_C;
    float ix = unnormalize(gx, IW), iy = unnormalize(gy, IH);
    float v;
#if defined(BICUBIC)
    float x0 = floor(ix), y0 = floor(iy);
    vec4 wx = cubic_weights(ix - x0), wy = cubic_weights(iy - y0);
    v = 0.0;
    for (int j = 0; j < 4; ++j) {
        float row = 0.0;
        for (int i = 0; i < 4; ++i) row += at_padded(base, y0 - 1.0 + float(j), x0 - 1.0 + float(i)) * wx[i];
        v += row * wy[j];
    }
#else
    ix = pad_c(ix, IW);
    iy = pad_c(iy, IH);
#ifdef DIM3
    float iz = pad_c(unnormalize(ld_f32(gb[go + 2u * GS_K]), ID), ID);
#else
    float iz = 0.0;
#endif
#if defined(NEAREST)
    v = at3(base, int(roundEven(iz)), int(roundEven(iy)), int(roundEven(ix)));
#else
    float x0 = floor(ix), y0 = floor(iy), z0 = floor(iz);
    float tx = ix - x0, ty = iy - y0, tz = iz - z0;
    int xi = int(x0), yi = int(y0), zi = int(z0);
    v = 0.0;
    for (int k = 0; k < 2; ++k) {
        float wz = k == 0 ? 1.0 - tz : tz;
        if (wz == 0.0 && k == 1) continue;
        v += wz * (at3(base, zi + k, yi, xi) * (1.0 - tx) * (1.0 - ty) +
                   at3(base, zi + k, yi, xi + 1) * tx * (1.0 - ty) +
                   at3(base, zi + k, yi + 1, xi) * (1.0 - tx) * ty +
                   at3(base, zi + k, yi + 1, xi + 1) * tx * ty);
    }
#endif
#endif
    outb[e] = st_f32(v);
}
