"""moe.expand_to_fused and moe.expand_to_fused_with_sf: copy token rows (and their scale-factor rows)
into the expert-major fused layout, zero-filling the padding rows.

The kernel copies bits, so it is specialised on the element size only (the op views any 1-, 2- or
4-byte dtype as a carrier type of that size) and on whether rows can be moved in 16-byte vectors
(`aligned`: pointers and row strides 16-byte aligned, the hidden size a whole number of vectors);
otherwise it moves one element at a time. Hidden size, top-k, strides and the scale-factor width
and layout are run-time values. The scale factors (fp32 or packed UE8M0 int32, both 4 bytes, moved
as int32) go through the same program: without them the op passes a 0-wide dummy, so the loops
over them run zero times.

Grid: blocks [0, num_tokens) each own one token: the block loads a chunk of the row (VECTORS
16-byte vectors per thread, all loads issued before any store) and stores it to each of the token's
top-k positions, chunk after chunk; the positions sit in shared memory. A negative position is skipped;
one past the fused rows fails a device assert and is skipped too (kernel_src/bounds.py). The remaining
ceil(N / ZERO_ROWS) blocks each own ZERO_ROWS fused rows and zero-fill those whose pos_to_expert is
negative (stores only). Rows routed to by no pair and not marked as padding are left as they are,
as upstream leaves them.
"""

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T

from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

THREADS = 128
VECTORS = 4  # 16-byte vectors per thread per chunk: 8 KB of loads in flight per block
ZERO_ROWS = 16  # fused rows per zero-filling block
MAX_TOPK = 64
# Carrier types by element size. The kernel only moves these values (no arithmetic), so a float16
# carrier keeps any 2-byte pattern, NaN payloads included; the manifest has no int16.
INT_OF_SIZE = {1: 'uint8', 2: 'float16', 4: 'int32'}


def check(elem_bytes: int, aligned: bool) -> None:
    if elem_bytes not in INT_OF_SIZE:
        raise ValueError(f'elem_bytes must be 1, 2 or 4, got {elem_bytes}')


def build(arch: Arch, elem_bytes: int, aligned: bool) -> KernelProgram:
    dtype = INT_OF_SIZE[elem_bytes]
    vec = 16 // elem_bytes if aligned else 1  # elements per vector
    per_thread = VECTORS if aligned else 4 * VECTORS  # the scalar path moves as many loads in flight as it can
    chunk = THREADS * per_thread * vec  # elements of a row per chunk

    num_tokens, hidden, num_topk = T.dynamic('num_tokens'), T.dynamic('hidden'), T.dynamic('num_topk')
    num_expanded = T.dynamic('num_expanded_tokens')
    x_stride = T.dynamic('x_stride')
    sf_rows, sf_hidden, sf_stride = T.dynamic('sf_rows'), T.dynamic('sf_hidden'), T.dynamic('sf_stride')
    out_sf_rows, out_sf_stride0, out_sf_stride1 = T.dynamic('out_sf_rows'), T.dynamic('out_sf_stride0'), T.dynamic('out_sf_stride1')

    @T.prim_func
    def expand_to_fused(
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), dtype],
        x_sf: T.StridedTensor[(sf_rows, sf_hidden), (sf_stride, 1), T.int32],
        out: T.Tensor[(num_expanded, hidden), dtype],
        out_sf: T.StridedTensor[(out_sf_rows, sf_hidden), (out_sf_stride0, out_sf_stride1), T.int32],
        token_topk_to_pos: T.Tensor[(num_tokens, num_topk), T.int32],
        pos_to_expert: T.Tensor[(num_expanded,), T.int32],
    ):
        with T.Kernel(num_tokens + T.ceildiv(num_expanded, ZERO_ROWS), threads=THREADS) as bid:
            tid = T.get_thread_binding()
            if aligned:
                T.assume(x_stride % vec == 0)
                T.assume(hidden % vec == 0)
            values = T.alloc_local((per_thread, vec), dtype)
            rows = T.alloc_shared((MAX_TOPK,), T.int32)  # a token's positions, or a zero block's row flags
            pos_in = T.alloc_var(T.int32)
            num_chunks = T.truncdiv(hidden + chunk - 1, chunk)
            if bid < num_tokens:
                if tid < num_topk:
                    pos_in = token_topk_to_pos[bid, tid]
                    device_assert(pos_in < num_expanded)
                    rows[tid] = T.if_then_else(pos_in < num_expanded, pos_in, -1)
                T.sync_threads()
                for c in T.serial(num_chunks):
                    for j in T.unroll(per_thread):
                        col = (c * (THREADS * per_thread) + j * THREADS + tid) * vec
                        if col < hidden:
                            for v in T.vectorized(vec):
                                values[j, v] = x[bid, col + v]
                    for k in T.serial(num_topk):
                        pos = rows[k]
                        if pos >= 0:
                            for j in T.unroll(per_thread):
                                col = (c * (THREADS * per_thread) + j * THREADS + tid) * vec
                                if col < hidden:
                                    for v in T.vectorized(vec):
                                        out[pos, col + v] = values[j, v]
                for s0 in T.serial(T.truncdiv(sf_hidden + THREADS - 1, THREADS)):
                    s = s0 * THREADS + tid
                    if s < sf_hidden:
                        sf = x_sf[bid, s]
                        for k in T.serial(num_topk):
                            if rows[k] >= 0:
                                out_sf[rows[k], s] = sf
            else:
                first = (bid - num_tokens) * ZERO_ROWS
                if tid < ZERO_ROWS:
                    rows[tid] = T.if_then_else(first + tid < num_expanded, pos_to_expert[T.min(first + tid, num_expanded - 1)], 0)
                T.sync_threads()
                for r in T.serial(ZERO_ROWS):
                    if rows[r] < 0:
                        for c in T.serial(num_chunks):
                            for j in T.unroll(per_thread):
                                col = (c * (THREADS * per_thread) + j * THREADS + tid) * vec
                                if col < hidden:
                                    for v in T.vectorized(vec):
                                        out[first + r, col + v] = T.cast(0, dtype)
                        for s0 in T.serial(T.truncdiv(sf_hidden + THREADS - 1, THREADS)):
                            s = s0 * THREADS + tid
                            if s < sf_hidden:
                                out_sf[first + r, s] = 0

    align = 16 if aligned else elem_bytes
    return KernelProgram(expand_to_fused, alignment={
        'x': align, 'out': align, 'x_sf': 4, 'out_sf': 4, 'token_topk_to_pos': 4, 'pos_to_expert': 4})


def prebuilt():
    for elem_bytes in INT_OF_SIZE:
        for aligned in (True, False):
            yield dict(elem_bytes=elem_bytes, aligned=aligned)


DECL = KernelDecl(
    name='moe.expand_to_fused',
    params=(param('elem_bytes', 'int', 'b'), param('aligned', 'bool', 'al')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_thread_storage_sync': True},
    constants={'max_topk': MAX_TOPK},  # a token's positions staged in shared memory
)
