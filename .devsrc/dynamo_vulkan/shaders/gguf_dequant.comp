// GGUF dequantize: out[r, :] = the decoded row r of W, for all NROWS rows, one thread
// per chunk of 8 elements; out is a contiguous [NROWS, K] fp32 matrix. A prompt's GGUF
// linear decodes W once this way, then runs the plain matmul kernels on it (their
// tiles and tensor-core paths), instead of every row-tile of the prompt decoding W's
// tiles again.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NROWS = 1;
layout(constant_id = 2) const uint K = 8;         // row length (elements)
layout(constant_id = 3) const uint ROW_BYTES = 0;
BUFFER(0, outb)
#define WQ_BINDING 1
BUFFER(WQ_BINDING, wq)
#include "gguf_blocks.glsl"

void main() {
    uint t = flat_invocation();
    const uint chunks = K / 8u;
    if (t >= NROWS * chunks) return;
    uint row = t / chunks, ch = t % chunks;
    vec4 lo, hi;
    deq8r(row * ROW_BYTES, ch, lo, hi);
    uint o = row * K + 8u * ch;
    for (uint j = 0; j < 4u; ++j) {
        outb[o + j] = st_f32(lo[j]);
        outb[o + 4u + j] = st_f32(hi[j]);
    }
}
