// GGUF embedding: out[i, :] = dequantize(row ids[i] of W), one thread per
// chunk of 8 elements, so only the looked-up rows are decoded. An out-of-range
// id sets CHECK_MASK in the plan's check word (the program raises IndexError after
// the submit: lowering/checks.py) and reads nothing; its row is zeros. A weight split across
// buffers takes one dispatch per chunk: each holds rows ROW0..ROW0+NROWS of
// TOTAL_ROWS and writes only the ids among them (the first chunk also writes
// the zeros of out-of-range ids), so the chunks together fill every row.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NIDX = 1;
layout(constant_id = 2) const uint K = 8;         // row length (elements)
layout(constant_id = 3) const uint NROWS = 1;
layout(constant_id = 4) const uint ROW_BYTES = 0;
layout(constant_id = 5) const uint IDX_OFF = 0;
layout(constant_id = 6) const uint IDX_S = 1;
layout(constant_id = 7) const uint ROW0 = 0;
layout(constant_id = 8) const uint TOTAL_ROWS = 1;
BUFFER(0, outb)
#define WQ_BINDING 1
BUFFER(WQ_BINDING, wq)
BUFFER(2, idxb)
BUFFER(3, chkb)
layout(constant_id = 9) const uint CHECK_MASK = 0;
#include "gguf_blocks.glsl"

void main() {
    uint t = flat_invocation();
    const uint chunks = K / 8u;
    if (t >= NIDX * chunks) return;
    uint i = t / chunks, ch = t % chunks;
    int row = ld_i32(idxb[IDX_OFF + i * IDX_S]);
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    bool valid = row >= 0 && uint(row) < TOTAL_ROWS;
    if (valid && (uint(row) < ROW0 || uint(row) - ROW0 >= NROWS)) return;   // another chunk's
    if (!valid && ROW0 != 0u) return;                                       // the first's zeros
    if (!valid && ch == 0u) atomicOr(chkb[0], CHECK_MASK);
    if (valid)
        deq8r((uint(row) - ROW0) * ROW_BYTES, ch, lo, hi);
    uint o = i * K + 8u * ch;
    for (uint j = 0; j < 4u; ++j) {
        outb[o + j] = st_f32(lo[j]);
        outb[o + 4u + j] = st_f32(hi[j]);
    }
}
