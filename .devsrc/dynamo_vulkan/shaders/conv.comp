// Convolution family: direct convolution, one invocation per output element
// (n, co, od, oh, ow). 1-d and 2-d convolutions are 3-d ones with size-1
// leading spatial dims. Input, weight and bias are read through their strides
// (spec constants), so any layout works without a copy. TRANSPOSED gathers:
// output o takes input i where o = i*stride - pad + k*dil.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint COUT = 1;
layout(constant_id = 3) const uint CIN_G = 1;    // input channels per group
layout(constant_id = 4) const uint COUT_G = 1;   // output channels per group
layout(constant_id = 5) const int ID = 1;
layout(constant_id = 6) const int IH = 1;
layout(constant_id = 7) const int IW = 1;
layout(constant_id = 8) const uint OD = 1;
layout(constant_id = 9) const uint OH = 1;
layout(constant_id = 10) const uint OW = 1;
layout(constant_id = 11) const int KD = 1;
layout(constant_id = 12) const int KH = 1;
layout(constant_id = 13) const int KW = 1;
layout(constant_id = 14) const int SD = 1;
layout(constant_id = 15) const int SH = 1;
layout(constant_id = 16) const int SW = 1;
layout(constant_id = 17) const int PD = 0;
layout(constant_id = 18) const int PH = 0;
layout(constant_id = 19) const int PW = 0;
layout(constant_id = 20) const int DD = 1;
layout(constant_id = 21) const int DH = 1;
layout(constant_id = 22) const int DW = 1;
layout(constant_id = 23) const uint X_OFF = 0;   // input: offset, strides of n, c, d, h, w
layout(constant_id = 24) const uint XS_N = 0;
layout(constant_id = 25) const uint XS_C = 0;
layout(constant_id = 26) const uint XS_D = 0;
layout(constant_id = 27) const uint XS_H = 0;
layout(constant_id = 28) const uint XS_W = 0;
layout(constant_id = 29) const uint W_OFF = 0;   // weight: offset, strides of its dims 0..4
layout(constant_id = 30) const uint WS_0 = 0;
layout(constant_id = 31) const uint WS_1 = 0;
layout(constant_id = 32) const uint WS_D = 0;
layout(constant_id = 33) const uint WS_H = 0;
layout(constant_id = 34) const uint WS_W = 0;
layout(constant_id = 35) const uint B_OFF = 0;
layout(constant_id = 36) const uint B_S = 0;
BUFFER(0, outb)
BUFFER(1, xb)
BUFFER(2, wb)
#ifdef HAS_BIAS
BUFFER(3, bb)
#endif

// input position along one dim for kernel tap k at output o, or -1 if none
int tap(int o, int k, int s, int p, int d, int n) {
#ifdef TRANSPOSED
    int t = o + p - k * d;
    if (t < 0 || t % s != 0) return -1;
    int i = t / s;
#else
    int i = o * s - p + k * d;
#endif
    return (i >= 0 && i < n) ? i : -1;
}

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint q = e;
    int ow = int(q % OW); q /= OW;
    int oh = int(q % OH); q /= OH;
    int od = int(q % OD); q /= OD;
    uint co = q % COUT; q /= COUT;
    uint n = q;
    uint g = co / COUT_G, cog = co % COUT_G;
    float acc = 0.0;
    uint xn = X_OFF + n * XS_N;
    for (int kd = 0; kd < KD; ++kd) {
        int id = tap(od, kd, SD, PD, DD, ID);
        if (id < 0) continue;
        for (int kh = 0; kh < KH; ++kh) {
            int ih = tap(oh, kh, SH, PH, DH, IH);
            if (ih < 0) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int iw = tap(ow, kw, SW, PW, DW, IW);
                if (iw < 0) continue;
                uint xo = xn + uint(id) * XS_D + uint(ih) * XS_H + uint(iw) * XS_W;
                uint wo = W_OFF + uint(kd) * WS_D + uint(kh) * WS_H + uint(kw) * WS_W;
                for (uint c = 0u; c < CIN_G; ++c) {
                    uint ci = g * CIN_G + c;
#ifdef TRANSPOSED
                    uint wi = wo + ci * WS_0 + cog * WS_1;   // weight [Cin, Cout/g, k...]
#else
                    uint wi = wo + co * WS_0 + c * WS_1;     // weight [Cout, Cin/g, k...]
#endif
                    acc += ld_f32(xb[xo + ci * XS_C]) * ld_f32(wb[wi]);
                }
            }
        }
    }
#ifdef HAS_BIAS
    acc += ld_f32(bb[B_OFF + co * B_S]);
#endif
    outb[e] = st_f32(acc);
}
