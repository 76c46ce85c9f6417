// One fp32 operand of the tensor-core matmul converted to 16 bits once, ahead of it
// (matmul_coopmat.comp's A_PACKED / B_PACKED), so that the matmul's inner loop reads half
// the bytes and converts nothing. Layout: per batch, ROWS_P rows (M or N rounded up to
// whole tiles) of KP elements along k (K rounded up to whole K steps), zeros in the
// padding; two elements a word (coopmat_convert.glsl), 16 bytes an octet of 8 along k;
// with SPLIT3 each batch's lo plane follows its hi plane.
// One invocation an octet. ALONG_ROWS: the source's unit stride runs along the rows (B of
// x @ W with W [K, N]), so neighbouring invocations take neighbouring rows of one octet
// column (their reads coalesce); else neighbouring octets of one row.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#include "coopmat_convert.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;      // M (or N)
layout(constant_id = 2) const uint K = 1;
layout(constant_id = 3) const uint OFF = 0;
layout(constant_id = 4) const uint SB = 0;        // batch stride (0: one batch)
layout(constant_id = 5) const uint SR = 0;        // row stride
layout(constant_id = 6) const uint SK = 0;        // k stride
layout(constant_id = 7) const uint BATCHES = 1;   // batches packed
layout(constant_id = 8) const uint ROWS_P = 1;
layout(constant_id = 9) const uint KP = 8;
layout(set = 0, binding = 0) writeonly buffer Buf0 { uvec4 dst[]; };
IN_BUFFER(1, src)

void main() {
    uint ko = KP / 8u, count = BATCHES * ROWS_P * ko;
    uint e = flat_invocation();
    if (e >= count) return;
#ifdef ALONG_ROWS
    uint r = e % ROWS_P, o = (e / ROWS_P) % ko, b = e / (ROWS_P * ko);
#else
    uint o = e % ko, r = (e / ko) % ROWS_P, b = e / (ko * ROWS_P);
#endif
    vec4 x[2] = vec4[2](vec4(0.0), vec4(0.0));
    if (r < ROWS) {
        uint base = OFF + b * SB + r * SR;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
            uint k = o * 8u + i;
            if (k < K) x[i / 4u][i % 4u] = ld_f32(src[base + k * SK]);
        }
    }
    uvec4 hi, lo;
    convert(x[0], x[1], hi, lo);
#ifdef SPLIT3
    uint at = (b * 2u * ROWS_P + r) * ko + o;
    dst[at + ROWS_P * ko] = lo;
#else
    uint at = (b * ROWS_P + r) * ko + o;
#endif
    dst[at] = hi;
}
