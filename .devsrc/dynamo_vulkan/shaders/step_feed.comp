// Between two replayed greedy decode steps (runtime/replay.py): the step just run's
// token (its graph's output) is recorded in the call's token list and becomes the next
// step's token input; the next step's position is taken from the call's positions.
// One invocation: it moves two words, where a transfer would need barriers of its own.
#include "common.glsl"
layout(local_size_x = 1) in;
layout(constant_id = 0) const uint STEP = 0;   // the step about to run; K: none, record only
layout(constant_id = 1) const uint K = 1;      // steps in the call
BUFFER(0, tok_in)         // the step graph's token input (one word)
BUFFER(1, pos_in)         // ... its position input (one word)
IN_BUFFER(2, tok_out)     // ... its token output (one word)
IN_BUFFER(3, positions)   // the call's K positions
BUFFER(4, tokens)         // the call's K tokens
void main() {
    if (STEP > 0u) {
        uint t = tok_out[0];
        tokens[STEP - 1u] = t;
        if (STEP < K) tok_in[0] = t;
    }
    if (STEP < K) pos_in[0] = positions[STEP];
}
