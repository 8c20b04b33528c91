// NaN-propagating float32 min and max (PTX min.NaN / max.NaN, one FMNMX.NAN each on sm_80 and later), for the
// SwiGLU clamps min(l, c) and min(max(r, -c), c). The C form `l > c ? c : l` against a run-time c costs a compare
// and a select: nvcc cannot use FMNMX.NAN itself, as c might be NaN (the ops never pass one).
__device__ __forceinline__ float tk_min_nan(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float tk_max_nan(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
