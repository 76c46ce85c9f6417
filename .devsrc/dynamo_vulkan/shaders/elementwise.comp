// Elementwise family: out[i] = EXPR(loads of NIN operands at i), every operand
// (and the output) addressed through its own offset and strides, so broadcasts
// (stride 0), transposes and slices cost no copy. Shapes and strides are
// specialisation constants; lowering/elementwise.py declares the variants
// (NIN, NDIM, operand kinds, EXPR) and writes the SPEC_DECLS/INDEX macros.
#include "common.glsl"
#include "special.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUMEL = 1;
SPEC_DECLS
BUFFER_DECLS

void main() {
    uint i = flat_invocation();
    if (i >= NUMEL) return;
    INDEX_CODE
    OUT_STORE
}
