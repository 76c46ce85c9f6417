// Uploads (runtime/upload.py): an item's words, staged in `src` with other items', are
// written into its destination buffer at a word offset. With REGROUP the item is GGUF
// rows as the file holds them, and each output bit is read from the bit of its block
// that the type's table names (gguf/gpu_layout.py bit_sources), which puts the rows in
// the GPU order of their type; the last word's bytes past the rows are zero.
#include "common.glsl"
layout(local_size_x_id = 0) in;
BUFFER(0, dst)
IN_BUFFER(1, src)
#ifdef REGROUP
// [0..3]: each region's bytes per block (0 past the last region); [4 + 8 * byte + bit]:
// the source bit, within its block, of that bit of one block's regrouped bytes
IN_BUFFER(2, table)
#endif
layout(push_constant) uniform Item {
    uint src_word;    // the item's first word in src
    uint dst_word;    // the first word it writes in dst
    uint words;       // words it writes
    uint nbytes;      // REGROUP: bytes of rows
    uint row_bytes;   // REGROUP: bytes per row
} item;

void main() {
    uint w = flat_invocation();
    if (w >= item.words) return;
#ifdef REGROUP
    const uint type_bytes = table[0] + table[1] + table[2] + table[3];
    const uint nb = item.row_bytes / type_bytes;
    uint v = 0u;
    for (uint i = 0u; i < 4u; ++i) {
        uint o = 4u * w + i;
        if (o >= item.nbytes) break;
        uint row = o / item.row_bytes, ob = o - row * item.row_bytes;
        // the region holding byte ob: regions follow one another, each over all nb blocks
        uint base = 0u, r = 0u, width = table[0];
        while (ob >= (base + width) * nb) {
            base += width;
            width = table[++r];
        }
        uint rel = ob - base * nb;
        uint blk = rel / width;
        uint first = row * item.row_bytes + blk * type_bytes;   // the block's first byte
        uint entry = 4u + 8u * (base + rel - blk * width);
        uint bits = 0u;
        for (uint b = 0u; b < 8u; ++b) {
            uint s = table[entry + b];
            uint byte = first + (s >> 3u);
            uint word = src[item.src_word + (byte >> 2u)];
            bits |= ((word >> (8u * (byte & 3u) + (s & 7u))) & 1u) << b;
        }
        v |= bits << (8u * i);
    }
    dst[item.dst_word + w] = v;
#else
    dst[item.dst_word + w] = src[item.src_word + w];
#endif
}
