// The "last to arrive" handshake of a kernel whose workgroups split one result
// between them (attention's key splits, the mat-vec's post-norm, the COLS mat-vec's
// K splits): each workgroup, its partial results written, counts itself in on a
// counter (an atomic); the last of `arrivals` to do so gets true, sees every other
// workgroup's writes, and resets the counter to 0 for the next call. Include after
// declaring the counters as a coherent `uint counter[]` buffer (zero at upload).
// Every invocation of the workgroup must call it (it holds barriers); the result is
// uniform across the workgroup.
shared bool la_last;

bool last_to_arrive(uint slot, uint arrivals) {
    memoryBarrierBuffer();                       // this workgroup's writes, then its count
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        la_last = atomicAdd(counter[slot], 1u) == arrivals - 1u;
        if (la_last) counter[slot] = 0u;         // every workgroup has counted: reset
    }
    barrier();
    if (la_last) memoryBarrierBuffer();          // the others' writes, before reading them
    return la_last;
}
