"""moe.inplace_unique_group_indices: in each row keep the first occurrence of every index and overwrite
later repeats with -1, in place; negative entries are left alone.

One thread per token. The first UNROLLED indices of the row are loaded by predicated loads issued
together (one memory latency rather than one per index: the in-place stores would otherwise keep the
compiler from hoisting the next load above them), and each is compared with the ones before it, in
registers: for the usual top-k of 8 that is 28 compares, whatever the group count. Indices past
UNROLLED, if any, are compared with the unrolled ones and with the row's earlier tail as it is in
memory: a repeat there may already read -1, but the first occurrence of its value is never
overwritten, so the answer is the same. 32 threads per block spread the loads of 8192 tokens over
every SM (the loads are one per index and lane, so their L1 cost grows with the warps per SM).
The indices are only compared, never used as addresses, so no value can make the kernel read or write
outside the row, and any value is deduplicated as the op says: the kernel checks nothing on the device
(kernel_src/bounds.py), and the op's num_groups bounds the values only under TILE_KERNELS_AOT_CHECK_INDICES=1,
on the host: the kernel does not take it. The values are compared in their own dtype, so no two int64 values
compare equal after narrowing. Top-k is a run-time argument, so one binary serves every model.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.moe.common import INDEX_DTYPE_PARAMS, check_index_dtype, index_dtype_specs

THREADS = 32
UNROLLED = 16  # indices per row loaded together; covers the top-k of every model in kernel_src/models.py


def build(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk, row_stride = T.dynamic('num_tokens'), T.dynamic('num_topk'), T.dynamic('row_stride')

    @T.prim_func
    def inplace_unique_group_indices(
        group_indices: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as pid:
            row = pid * THREADS + T.get_thread_binding()
            first = T.alloc_local((UNROLLED,), index_dtype)
            if row < num_tokens:
                # min() keeps the address of a lane past the top-k inside the row; its value is unused.
                for k in T.unroll(UNROLLED):
                    first[k] = T.if_then_else(k < num_topk, group_indices[row, T.min(k, num_topk - 1)], T.Cast(index_dtype, -1))
                for k in T.unroll(UNROLLED):
                    if k < num_topk:
                        repeat = T.alloc_var(T.bool)
                        repeat = False
                        for j in T.unroll(k):
                            repeat = repeat or first[j] == first[k]
                        if first[k] >= 0 and repeat:
                            group_indices[row, k] = T.Cast(index_dtype, -1)
                for k in T.serial(T.max(num_topk - UNROLLED, 0)):
                    index = group_indices[row, UNROLLED + k]
                    if index >= 0:
                        repeat = T.alloc_var(T.bool)
                        repeat = False
                        for j in T.unroll(UNROLLED):
                            repeat = repeat or first[j] == index
                        for j in T.serial(k):
                            repeat = repeat or group_indices[row, UNROLLED + j] == index
                        if repeat:
                            group_indices[row, UNROLLED + k] = T.Cast(index_dtype, -1)

    return KernelProgram(inplace_unique_group_indices, alignment={'group_indices': 4})


DECL = KernelDecl(
    name='moe.inplace_unique_group_indices',
    params=INDEX_DTYPE_PARAMS,
    factory=build,
    prebuilt=index_dtype_specs,
    check=check_index_dtype,
    pass_configs={'tl.disable_warp_specialized': True},
)
