// Gradient accumulation across micro-batches on the GPU (runtime/accumulate.py): a later
// backward's gradient added into the buffer where a parameter's .grad accumulates, or
// (COPY) an earlier one moved there before its output buffer is written again. One
// float32 add per element, as eager's grad += new_grad.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint N = 1;      // elements
layout(constant_id = 1) const uint COPY = 0;   // 1: dst = src; 0: dst += src
BUFFER(0, dst)
IN_BUFFER(1, src)
void main() {
    uint i = flat_workgroup() * 256u + gl_LocalInvocationID.x;
    if (i >= N) return;
    dst[i] = COPY != 0u ? src[i] : st_f32(ld_f32(dst[i]) + ld_f32(src[i]));
}
