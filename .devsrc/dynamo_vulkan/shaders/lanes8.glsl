// The CPU_LANES matmuls' (gguf_matmul.comp, matmul.comp) share of one operand: lanes
// 0..7 of a subgroup each load one value of a row, and every lane takes all 8 through
// subgroupBroadcast, a register shuffle on a CPU device, where a load whose address
// differs across the lanes would be a gather. Include after enabling
// GL_KHR_shader_subgroup_ballot.
void lanes8(float v, out vec4 lo, out vec4 hi) {
    lo = vec4(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u),
              subgroupBroadcast(v, 3u));
    hi = vec4(subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u),
              subgroupBroadcast(v, 7u));
}
