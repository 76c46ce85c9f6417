// Pooling family: max / average / adaptive pooling over up to 3 spatial dims,
// one invocation per output element (n, c, od, oh, ow). 1-d and 2-d pools are
// 3-d ones with size-1 leading spatial dims. The input is read through its
// strides. MAX also writes the argmax as a flat index into the input plane.
// Windows: fixed (start = o*stride - pad, taps at dilation) or ADAPTIVE
// (start = floor(o*I/O), end = ceil((o+1)*I/O)).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
layout(constant_id = 2) const uint C = 1;
layout(constant_id = 3) const int ID = 1;
layout(constant_id = 4) const int IH = 1;
layout(constant_id = 5) const int IW = 1;
layout(constant_id = 6) const int OD = 1;
layout(constant_id = 7) const int OH = 1;
layout(constant_id = 8) const int OW = 1;
layout(constant_id = 9) const int KD = 1;
layout(constant_id = 10) const int KH = 1;
layout(constant_id = 11) const int KW = 1;
layout(constant_id = 12) const int SD = 1;
layout(constant_id = 13) const int SH = 1;
layout(constant_id = 14) const int SW = 1;
layout(constant_id = 15) const int PD = 0;
layout(constant_id = 16) const int PH = 0;
layout(constant_id = 17) const int PW = 0;
layout(constant_id = 18) const int DD = 1;
layout(constant_id = 19) const int DH = 1;
layout(constant_id = 20) const int DW = 1;
layout(constant_id = 21) const uint X_OFF = 0;
layout(constant_id = 22) const uint XS_N = 0;
layout(constant_id = 23) const uint XS_C = 0;
layout(constant_id = 24) const uint XS_D = 0;
layout(constant_id = 25) const uint XS_H = 0;
layout(constant_id = 26) const uint XS_W = 0;
layout(constant_id = 27) const int DIVISOR = 0;         // avg: divisor_override (0: none)
layout(constant_id = 28) const uint INCLUDE_PAD = 1;    // avg: count_include_pad
BUFFER(0, outb)
BUFFER(1, xb)
#ifdef MAX
BUFFER(2, idxb)
#endif

// the window along one dim: first tap, tap count, and (avg) padded size
void window(int o, int O, int I, int K, int S, int P, int Dl, out int start, out int taps,
            out int padded) {
#ifdef ADAPTIVE
    start = (o * I) / O;
    int end = ((o + 1) * I + O - 1) / O;
    taps = end - start;
    padded = taps;
#else
    start = o * S - P;
    int end = min(start + (K - 1) * Dl + 1, I + P);
    padded = end - start;
    taps = K;
#endif
}

void main() {
    uint e = flat_invocation();
    if (e >= NUMEL) return;
    uint q = e;
    int ow = int(q % uint(OW)); q /= uint(OW);
    int oh = int(q % uint(OH)); q /= uint(OH);
    int od = int(q % uint(OD)); q /= uint(OD);
    uint c = q % C, n = q / C;
    int d0, dn, dp, h0, hn, hp, w0, wn, wp;
    window(od, OD, ID, KD, SD, PD, DD, d0, dn, dp);
    window(oh, OH, IH, KH, SH, PH, DH, h0, hn, hp);
    window(ow, OW, IW, KW, SW, PW, DW, w0, wn, wp);
#ifdef ADAPTIVE
    const int dd = 1, dh = 1, dw = 1;
#else
    const int dd = DD, dh = DH, dw = DW;
#endif
    uint base = X_OFF + n * XS_N + c * XS_C;
#ifdef MAX
    float best = uintBitsToFloat(0xff800000u);
    int arg = -1;
#else
    float acc = 0.0;
    int count = 0;
#endif
    for (int a = 0; a < dn; ++a) {
        int id = d0 + a * dd;
        if (id < 0 || id >= ID) continue;
        for (int b = 0; b < hn; ++b) {
            int ih = h0 + b * dh;
            if (ih < 0 || ih >= IH) continue;
            for (int k = 0; k < wn; ++k) {
                int iw = w0 + k * dw;
                if (iw < 0 || iw >= IW) continue;
                float v = ld_f32(xb[base + uint(id) * XS_D + uint(ih) * XS_H + uint(iw) * XS_W]);
#ifdef MAX
                if (arg < 0 || v > best || isnan(v)) {   // torch: the last NaN wins
                    best = v;
                    arg = (id * IH + ih) * IW + iw;
                }
#else
                acc += v;
                count += 1;
#endif
            }
        }
    }
#ifdef MAX
    outb[e] = st_f32(best);
    idxb[e] = st_i32(max(arg, 0));
#else
    int div = DIVISOR != 0 ? DIVISOR : (INCLUDE_PAD != 0u ? dp * hp * wp : count);
    outb[e] = st_f32(acc / float(div));
#endif
}
