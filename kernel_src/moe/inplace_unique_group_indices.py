"""moe.inplace_unique_group_indices: in each row keep the first occurrence of every index and overwrite
later repeats with -1, in place; negative entries are left alone.

One thread per token keeps the indices seen so far as a bitmask of WORDS 64-bit words in registers
(selected by unrolled compares, never by a run-time register index). Top-k and the group count (up to
64 * WORDS) are run-time arguments, so one binary serves every model.
"""

from tilelang import language as T
from tvm import tirx  # after tilelang, which puts its bundled tvm on the path

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.moe.common import INDEX_DTYPE_PARAMS, check_index_dtype, index_dtype_specs

THREADS = 128
WORDS = 16  # groups up to 1024



def build(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk, row_stride = T.dynamic('num_tokens'), T.dynamic('num_topk'), T.dynamic('row_stride')

    @T.prim_func
    def inplace_unique_group_indices(
        group_indices: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        num_groups: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as pid:
            row = pid * THREADS + T.get_thread_binding()
            seen = T.alloc_local((WORDS,), T.uint64)
            for w in T.unroll(WORDS):
                seen[w] = T.uint64(0)
            if row < num_tokens:
                for k in T.serial(num_topk):
                    index = T.Cast('int32', group_indices[row, k])
                    T.call_intrin('void', tirx.op.Op.get('tl.device_assert'), index < num_groups)
                    found = T.alloc_var(T.bool)
                    found = False
                    for w in T.unroll(WORDS):
                        bit = T.if_then_else(index >= 0 and index // 64 == w, T.shift_left(T.uint64(1), T.Cast('uint64', index % 64)), T.uint64(0))
                        found = found or (seen[w] & bit) != T.uint64(0)
                        seen[w] = seen[w] | bit
                    if found:
                        group_indices[row, k] = T.Cast(index_dtype, -1)

    return KernelProgram(inplace_unique_group_indices, alignment={'group_indices': 4})


DECL = KernelDecl(
    name='moe.inplace_unique_group_indices',
    params=INDEX_DTYPE_PARAMS,
    factory=build,
    prebuilt=index_dtype_specs,
    check=check_index_dtype,
    pass_configs={'tl.disable_warp_specialized': True},
)
