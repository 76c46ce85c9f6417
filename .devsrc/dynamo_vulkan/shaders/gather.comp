// Gather family: out[i, j] = src[ROW(idx[i]), j] for embedding and
// index_select: a row of ROW_LEN elements per index, read through the source's
// strides. An index out of range (negative ones too: embedding and index_select do
// not wrap them) writes 0 and sets bit CHECK_BIT of chkb, which the program raises
// after the submit (lowering/checks.py).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NIDX = 1;
layout(constant_id = 2) const uint ROW_LEN = 1;
layout(constant_id = 3) const uint NROWS = 1;
layout(constant_id = 4) const uint SRC_OFF = 0;
layout(constant_id = 5) const uint SRC_RS = 0;   // stride between rows
layout(constant_id = 6) const uint SRC_CS = 1;   // stride inside a row
layout(constant_id = 7) const uint IDX_OFF = 0;
layout(constant_id = 8) const uint IDX_S = 1;
layout(constant_id = 9) const uint CHECK_BIT = 0;
BUFFER(0, outb)
BUFFER(1, srcb)
BUFFER(2, idxb)
BUFFER(3, chkb)

void main() {
    uint e = flat_invocation();
    if (e >= NIDX * ROW_LEN) return;
    uint i = e / ROW_LEN, j = e % ROW_LEN;
    int row = ld_i32(idxb[IDX_OFF + i * IDX_S]);
    if (row < 0 || uint(row) >= NROWS) {
        if (j == 0u) atomicOr(chkb[0], 1u << CHECK_BIT);
        outb[e] = 0u;
        return;
    }
    outb[e] = srcb[SRC_OFF + uint(row) * SRC_RS + j * SRC_CS];
}
