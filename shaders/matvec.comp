// Skinny matmul (M <= 8 rows, e.g. one decode token): one workgroup per output
// column n and batch; threads stride over K, so a linear layer's weight row
// (B = W^T, contiguous along K) is read once, coalesced, for all M rows; the
// partial sums meet through subgroup adds and shared memory.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint M = 1;
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint K = 1;
layout(constant_id = 4) const uint A_OFF = 0;
layout(constant_id = 5) const uint A_SB = 0;
layout(constant_id = 6) const uint A_SM = 0;
layout(constant_id = 7) const uint A_SK = 0;
layout(constant_id = 8) const uint B_OFF = 0;
layout(constant_id = 9) const uint B_SB = 0;
layout(constant_id = 10) const uint B_SK = 0;
layout(constant_id = 11) const uint B_SN = 0;
layout(constant_id = 12) const uint C_OFF = 0;
layout(constant_id = 13) const uint C_SB = 0;
layout(constant_id = 14) const uint C_SM = 0;
layout(constant_id = 15) const uint C_SN = 0;
layout(constant_id = 16) const uint ALPHA_BITS = 0x3f800000u;
layout(constant_id = 17) const uint BETA_BITS = 0x3f800000u;
BUFFER(0, outb)
BUFFER(1, ab)
BUFFER(2, bbuf)
#ifdef HAS_BIAS
BUFFER(3, cb)
#endif
#define MAXM 8
shared float partial[64][MAXM];

void main() {
    uint n = flat_workgroup();
    uint batch = gl_WorkGroupID.z;
    if (n >= N) return;
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB + n * B_SN;
    float acc[MAXM];
    for (uint m = 0; m < MAXM; ++m) acc[m] = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < K; k += gl_WorkGroupSize.x) {
        float b = ld_f32(bbuf[bbase + k * B_SK]);
        for (uint m = 0; m < M; ++m) acc[m] += ld_f32(ab[abase + m * A_SM + k * A_SK]) * b;
    }
    for (uint m = 0; m < M; ++m) {
        float s = subgroupAdd(acc[m]);
        if (subgroupElect()) partial[gl_SubgroupID][m] = s;
    }
    barrier();
    if (gl_LocalInvocationID.x < M) {
        uint m = gl_LocalInvocationID.x;
        float s = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; ++g) s += partial[g][m];
        float v = uintBitsToFloat(ALPHA_BITS) * s;
#ifdef HAS_BIAS
        v += uintBitsToFloat(BETA_BITS) * ld_f32(cb[C_OFF + batch * C_SB + m * C_SM + n * C_SN]);
#endif
        outb[(batch * M + m) * N + n] = st_f32(v);
    }
}
