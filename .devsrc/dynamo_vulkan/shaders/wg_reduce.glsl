// Workgroup-wide sum and max: subgroup reductions, then one value per subgroup
// through shared memory. Every invocation must call them (they hold barriers) and
// gets the result; include after the kernel's layout(local_size...) declaration.
shared float wg_partial[64];

float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) wg_partial[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) t += wg_partial[s];
    barrier();
    return t;
}

float wg_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) wg_partial[gl_SubgroupID] = v;
    barrier();
    float t = wg_partial[0];
    for (uint s = 1; s < gl_NumSubgroups; ++s) t = max(t, wg_partial[s]);
    barrier();
    return t;
}
