"""Copies from global into shared memory with cp.async, for the quant kernels that stage their loads.

Our own asm volatile with a "memory" clobber, so that the compiler keeps every shared-memory read after the wait that
covers it (tilelang does not know that these calls write shared memory). The copies bypass L1 (.cg): the data is read
once. Its own module (not common.py), so that a change here re-lowers only its users.
"""

_COPY16 = """
__device__ __forceinline__ void tk_stage16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem) : "memory");
}
"""

# A thread's copies, read by the same thread only (so no barrier): one group a step, and a wait for all but the newest
# group (a copy two steps ahead) or for all.
STAGE_PRELUDE = _COPY16 + """__device__ __forceinline__ void tk_stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tk_stage_wait_previous() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void tk_stage_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
"""
