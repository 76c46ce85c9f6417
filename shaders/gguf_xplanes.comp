// x as three int8 planes per block of 32, for the integer-dot GGUF mat-vec
// (gguf_matvec_idot.comp): with s = max|x| / 127 over the block, x = s * (a0 + a1 / 254 +
// a2 / 254^2) to within s / 254^2 / 2, about 2^-24 of the block's largest value, so the
// mat-vec keeps fp32 accuracy (no activation quantization error of the 8-bit kind).
// One invocation per block of one row of x. Out, per block: 7 uvec4 = planes 0..2 (8
// words each, the bytes in the order the weight's quants sit: NIBBLES, the even elements
// of each 8 in one word and the odd in the next, else element order), then s0 = s,
// s1 = s / 254^2 (as float bits) and the plane sums A0 = sum a0, A1 = sum(254 a1 + a2).
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NB = 1;       // blocks per row
layout(constant_id = 2) const uint M = 1;        // rows of x
layout(constant_id = 3) const uint X_OFF = 0;
layout(constant_id = 4) const uint X_SM = 0;     // x row stride, in words
BUFFER(0, outb)
IN_BUFFER(1, xb)
#ifndef NIBBLES
#define NIBBLES 0
#endif

// element of the block for byte e of plane word j
uint elem(uint j, uint e) { return NIBBLES != 0 ? 8u * (j >> 1) + 2u * e + (j & 1u) : 4u * j + e; }

void main() {
    uint g = flat_invocation();
    if (g >= NB * M) return;
    uint m = g / NB, b = g % NB, xo = X_OFF + m * X_SM + 32u * b;
    float v[32];
    float amax = 0.0;
    [[unroll]] for (uint i = 0; i < 32u; ++i) { v[i] = ld_f32(xb[xo + i]); amax = max(amax, abs(v[i])); }
    float s = amax / 127.0, inv = amax > 0.0 ? 127.0 / amax : 0.0;
    int a0s = 0, a1s = 0;
    uint o = 28u * g;
    [[unroll]] for (uint j = 0; j < 8u; ++j) {
        uint w0 = 0u, w1 = 0u, w2 = 0u;
        [[unroll]] for (uint e = 0; e < 4u; ++e) {
            float t = v[elem(j, e)] * inv;
            float a0 = clamp(roundEven(t), -127.0, 127.0);
            float r = (t - a0) * 254.0;
            float a1 = clamp(roundEven(r), -127.0, 127.0);
            float a2 = clamp(roundEven((r - a1) * 254.0), -127.0, 127.0);
            ivec3 a = ivec3(a0, a1, a2);
            a0s += a.x;
            a1s += 254 * a.y + a.z;
            w0 |= (uint(a.x) & 0xFFu) << (8u * e);
            w1 |= (uint(a.y) & 0xFFu) << (8u * e);
            w2 |= (uint(a.z) & 0xFFu) << (8u * e);
        }
        outb[o + j] = w0;
        outb[o + 8u + j] = w1;
        outb[o + 16u + j] = w2;
    }
    outb[o + 24u] = floatBitsToUint(s);
    outb[o + 25u] = floatBitsToUint(s / 64516.0);
    outb[o + 26u] = uint(a0s);
    outb[o + 27u] = uint(a1s);
}
