"""moe.reduce_fused: gather each token's top-k rows of the fused layout and sum them, weighted.

    acc = 0;  for k ascending with pos = token_topk_to_pos[t, k] >= 0:
        s = topk_weights[t, k] (or 1);  s = s * x_sf[pos] (if given)
        acc = fma(x[pos], s, acc)            (fp32, one rounding: an explicit __fmaf_rn)
    out[t] = cast(acc * sf[0]) for fp8 output with sf, else cast(acc)

The spec is the input dtype (float32 / bfloat16) and the output dtype (the input's, or float8_e4m3fn).
Hidden size, top-k, row strides and the three optional inputs are run-time: an absent weight / x_sf /
sf is a flag of 0 and a one-element dummy tensor that is never read, so a flag costs one uniform branch.

Grid (tokens, row slices): a block of THREADS threads owns VECTORS 16-byte vectors per thread of one
token's row, accumulated in registers. It walks the top-k slots TOPK_IN_FLIGHT at a time: the slots'
positions, then every row load of those slots, then their FMAs in ascending k, so that a thread has
TOPK_IN_FLIGHT * VECTORS loads in flight instead of one round trip per slot. Columns past the hidden
size are masked. A negative position is skipped; one past the rows of x fails a device assert and is skipped
too (kernel_src/bounds.py).
"""

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T

from kernel_src.bounds import all_of, device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

# Chosen by the sweep of benchmarks/tuning.py (bf16, H 7168, K 8): 64 threads x 2 vectors (1024 bf16 columns a
# block, so the common hidden sizes split into whole slices) with 4 slots in flight is faster than 128 x 2,
# 128 x 7 with 2 slots and 256 x 1 with 8 slots.
THREADS = 64
VECTORS = 2  # 16-byte vectors of a row per thread
TOPK_IN_FLIGHT = 4  # top-k slots whose rows are loaded together: 8 loads (128 bytes) in flight per thread
IN_BYTES = {'float32': 4, 'bfloat16': 2}
OUT_DTYPES = ('same', 'float8_e4m3fn')


def check(in_dtype: str, out_dtype: str) -> None:
    if in_dtype not in IN_BYTES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_BYTES)}, got {in_dtype!r}')
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f'out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}')


def build(arch: Arch, in_dtype: str, out_dtype: str, threads: int = THREADS, vectors: int = VECTORS,
          topk_in_flight: int = TOPK_IN_FLIGHT) -> KernelProgram:
    vec = 16 // IN_BYTES[in_dtype]
    out_t = in_dtype if out_dtype == 'same' else out_dtype
    slice_elems = threads * vectors * vec

    num_tokens, num_expanded, hidden = T.dynamic('num_tokens'), T.dynamic('num_expanded_tokens'), T.dynamic('hidden')
    num_topk = T.dynamic('num_topk')
    x_stride, out_stride = T.dynamic('x_stride'), T.dynamic('out_stride')
    w_rows, w_cols, w_stride = T.dynamic('w_rows'), T.dynamic('w_cols'), T.dynamic('w_stride')
    num_x_sf = T.dynamic('num_x_sf')

    @T.prim_func
    def reduce_fused(
        x: T.StridedTensor[(num_expanded, hidden), (x_stride, 1), in_dtype],
        x_sf: T.Tensor[(num_x_sf,), T.float32],
        topk_weights: T.StridedTensor[(w_rows, w_cols), (w_stride, 1), T.float32],
        token_topk_to_pos: T.Tensor[(num_tokens, num_topk), T.int32],
        sf: T.Tensor[(1,), T.float32],
        out: T.StridedTensor[(num_tokens, hidden), (out_stride, 1), out_t],
        with_weights: T.int32,
        with_x_sf: T.int32,
        with_sf: T.int32,
    ):
        with T.Kernel(num_tokens, T.ceildiv(hidden, slice_elems), threads=threads) as (token, part):
            tid = T.get_thread_binding()
            T.assume(x_stride % vec == 0)
            T.assume(out_stride % vec == 0)
            T.assume(hidden % vec == 0)
            acc = T.alloc_local((vectors, vec), T.float32)
            values = T.alloc_local((topk_in_flight, vectors, vec), in_dtype)
            pos = T.alloc_local((topk_in_flight,), T.int32)
            scale = T.alloc_local((topk_in_flight,), T.float32)
            result = T.alloc_local((vectors, vec), out_t)
            out_scale = T.alloc_var(T.float32)
            for j in T.unroll(vectors):
                for v in T.unroll(vec):
                    acc[j, v] = T.float32(0)
            # topk_in_flight slots at a time: their positions, then all their row loads, then the FMAs in
            # ascending k (the order is what makes the sum bitwise reproducible).
            for r in T.serial(T.truncdiv(num_topk + topk_in_flight - 1, topk_in_flight)):
                for u in T.unroll(topk_in_flight):
                    pos[u] = -1
                    if r * topk_in_flight + u < num_topk:
                        pos[u] = token_topk_to_pos[token, r * topk_in_flight + u]
                in_range = T.alloc_var(T.bool)
                in_range = True
                for u in T.unroll(topk_in_flight):
                    in_range = all_of(in_range, pos[u] < num_expanded)
                device_assert(in_range)
                for u in T.unroll(topk_in_flight):
                    pos[u] = T.if_then_else(pos[u] < num_expanded, pos[u], -1)
                for u in T.unroll(topk_in_flight):
                    if pos[u] >= 0:
                        scale[u] = T.float32(1)
                        if with_weights != 0:
                            scale[u] = topk_weights[token, r * topk_in_flight + u]
                        if with_x_sf != 0:
                            scale[u] = scale[u] * x_sf[pos[u]]
                        for j in T.unroll(vectors):
                            col = (part * (threads * vectors) + j * threads + tid) * vec
                            if col < hidden:
                                for v in T.vectorized(vec):
                                    values[u, j, v] = x[pos[u], col + v]
                for u in T.unroll(topk_in_flight):
                    if pos[u] >= 0:
                        for j in T.unroll(vectors):
                            for v in T.unroll(vec):
                                acc[j, v] = T.ieee_fmaf(T.Cast('float32', values[u, j, v]), scale[u], acc[j, v])
            if out_dtype != 'same':
                if with_sf != 0:
                    out_scale = sf[0]
                    for j in T.unroll(vectors):
                        for v in T.unroll(vec):
                            acc[j, v] = acc[j, v] * out_scale
            for j in T.unroll(vectors):
                for v in T.unroll(vec):
                    result[j, v] = T.Cast(out_t, acc[j, v])
                col = (part * (threads * vectors) + j * threads + tid) * vec
                if col < hidden:
                    for v in T.vectorized(vec):
                        out[token, col + v] = result[j, v]

    return KernelProgram(reduce_fused, alignment={
        'x': 16, 'out': 16 if out_dtype == 'same' else vec, 'x_sf': 4, 'topk_weights': 4, 'token_topk_to_pos': 4, 'sf': 4})


def prebuilt():
    for in_dtype in IN_BYTES:
        for out_dtype in OUT_DTYPES:
            yield dict(in_dtype=in_dtype, out_dtype=out_dtype)


DECL = KernelDecl(
    name='moe.reduce_fused',
    params=(param('in_dtype', 'str', ''), param('out_dtype', 'str', 'o')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_thread_storage_sync': True},
)
