"""kernel_src/quant/staging.py of variant W1 (new module; the variant's swiglu.py imported STAGE_PRELUDE from here
instead of defining it, which left every SwiGLU cubin byte-identical)."""

_COPY16 = """
__device__ __forceinline__ void tk_stage16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem) : "memory");
}
"""

STAGE_PRELUDE = _COPY16 + """__device__ __forceinline__ void tk_stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tk_stage_wait_previous() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
"""

STAGE_WARP_PRELUDE = _COPY16 + """__device__ __forceinline__ void tk_stage_wait_warp() {
  asm volatile("cp.async.commit_group;\\n\\tcp.async.wait_group 0;" ::: "memory");
  __syncwarp();
}
"""
