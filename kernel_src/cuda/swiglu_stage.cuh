// The bf16 SwiGLU forward's staging of its next step in shared memory: each thread copies its own 16-byte vectors
// of step t + 1 with cp.async (cp.async.cg: through L2, not L1) while it computes step t, and reads only what it
// copied itself after its own cp.async.wait_group, so no barrier joins the threads. At 1024 threads of 64 registers
// there is no room for a second step in registers; without the copy a warp's loads would be in flight only while
// that warp waits on them.
__device__ __forceinline__ void tk_stage16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void tk_stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tk_stage_wait_previous() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
