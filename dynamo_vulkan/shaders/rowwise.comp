// Row family: softmax, log_softmax, layer norm and its backward's dx, RMS norm. One
// workgroup per row; the row is N elements at stride IN_RS (OUT_RS in the output) and
// rows are addressed through the kept dims' strides (spec constants), so a softmax
// over any dim of any view needs no copy. lowering/rowwise.py declares variants.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint IN_OFF = 0;
layout(constant_id = 4) const uint IN_RS = 1;
layout(constant_id = 5) const uint OUT_RS = 1;
layout(constant_id = 6) const uint EPS_BITS = 0;
SPEC_DECLS
BUFFER_DECLS

#include "wg_reduce.glsl"

#ifdef LAYER_NORM_BACKWARD
// element j of a row's a = dy * w and xhat = (x - mean) * rstd (dy from word ib, x from xo)
vec2 lnb_terms(uint ib, uint xo, uint j, float mean, float rstd) {
    float a = ld_f32(inb[ib + j * IN_RS]);
#ifdef HAS_WEIGHT
    a *= ld_f32(wb[W_OFF + j * W_RS]);
#endif
    return vec2(a, (ld_f32(xb[xo + j * IN_RS]) - mean) * rstd);
}
#endif

void main() {
    uint row = flat_workgroup();
    if (row >= ROWS) return;
    uint ib = IN_OFF, ob = 0u, q = row;
    ROW_INDEX
    uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
#if defined(SOFTMAX) || defined(LOG_SOFTMAX)
    float m = uintBitsToFloat(0xff800000u);
    bool nan_seen = false;
    for (uint j = lid; j < N; j += wg) { float x = ld_f32(inb[ib + j * IN_RS]); nan_seen = nan_seen || isnan(x); m = max(m, x); }
    m = wg_max(m);
    float s = 0.0;
    for (uint j = lid; j < N; j += wg) s += exp(ld_f32(inb[ib + j * IN_RS]) - m);
    s = wg_sum(s);
    for (uint j = lid; j < N; j += wg) {
        float x = ld_f32(inb[ib + j * IN_RS]);
#ifdef SOFTMAX
        outb[ob + j * OUT_RS] = st_f32(exp(x - m) / s);
#else
        outb[ob + j * OUT_RS] = st_f32(x - m - log(s));
#endif
    }
#elif defined(RMS_NORM)   // x * rsqrt(mean(x^2) + eps) * w (+ a residual)
    float s = 0.0;
    for (uint j = lid; j < N; j += wg) { float x = ld_f32(inb[ib + j * IN_RS]); s += x * x; }
    float r = inversesqrt(wg_sum(s) / float(N) + uintBitsToFloat(EPS_BITS));
    for (uint j = lid; j < N; j += wg)
    {
        float y = ld_f32(inb[ib + j * IN_RS]) * r * ld_f32(wb[W_OFF + j * W_RS]);
#ifdef HAS_RESIDUAL
        y = ld_f32(resb[R_OFF + ob + j * OUT_RS]) + y;     // out and res share one layout
#endif
        outb[ob + j * OUT_RS] = st_f32(y);
    }
#elif defined(LAYER_NORM_BACKWARD)
    // dx = rstd / N * (N a - sum(a) - xhat sum(a xhat)), a = dy * w, xhat = (x - mean) *
    // rstd: both sums in one pass over the row, then dx; x is laid out as dy (rows of N
    // from X_OFF), mean and rstd one a row
    float mean = ld_f32(meanb[M_OFF + row]), rstd = ld_f32(rstdb[S_OFF + row]);
    uint xo = X_OFF + ib - IN_OFF;
    float s1 = 0.0, s2 = 0.0;
    for (uint j = lid; j < N; j += wg) {
        vec2 t = lnb_terms(ib, xo, j, mean, rstd);
        s1 += t.x;
        s2 += t.x * t.y;
    }
    s1 = wg_sum(s1);
    s2 = wg_sum(s2);
    for (uint j = lid; j < N; j += wg) {
        vec2 t = lnb_terms(ib, xo, j, mean, rstd);
        outb[ob + j * OUT_RS] = st_f32(rstd / float(N) * ((t.x * float(N) - s1) - t.y * s2));
    }
#else  // LAYER_NORM: rows are contiguous in the output; mean/rstd one per row
    float s = 0.0;
    for (uint j = lid; j < N; j += wg) s += ld_f32(inb[ib + j * IN_RS]);
    float mean = wg_sum(s) / float(N);
    float v = 0.0;
    for (uint j = lid; j < N; j += wg) { float d = ld_f32(inb[ib + j * IN_RS]) - mean; v += d * d; }
    float rstd = inversesqrt(wg_sum(v) / float(N) + uintBitsToFloat(EPS_BITS));
    for (uint j = lid; j < N; j += wg) {
        float y = (ld_f32(inb[ib + j * IN_RS]) - mean) * rstd;
#ifdef HAS_WEIGHT
        y *= ld_f32(wb[W_OFF + j * W_RS]);
#endif
#ifdef HAS_BIAS
        y += ld_f32(bb[B_OFF + j * B_RS]);
#endif
        outb[ob + j * OUT_RS] = st_f32(y);
    }
    if (lid == 0u) { meanb[row] = st_f32(mean); rstdb[row] = st_f32(rstd); }
#endif
}
