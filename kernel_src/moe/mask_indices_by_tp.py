"""moe.mask_indices_by_tp: keep the experts of this TP rank, renumbered to its local range, else -1.

With per_gpu = n // num_ep_ranks and per_dp = num_tp_ranks * per_gpu: an index i < 0, or whose
(i // per_gpu) % num_tp_ranks != tp_rank, becomes -1; otherwise v = i - tp_rank * per_gpu,
v -= (v // per_dp) * (per_dp - per_gpu), and a negative v becomes -1. Elementwise; every size and the
four rank parameters are run-time arguments.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.moe.common import INDEX_DTYPE_PARAMS, check_index_dtype, index_dtype_specs

THREADS = 128



def build(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk, row_stride = T.dynamic('num_tokens'), T.dynamic('num_topk'), T.dynamic('row_stride')

    @T.prim_func
    def mask_indices_by_tp(
        indices: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        masked_indices: T.Tensor[(num_tokens, num_topk), index_dtype],
        per_gpu: T.int32,
        per_dp: T.int32,
        num_tp_ranks: T.int32,
        tp_rank: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * num_topk, THREADS), threads=THREADS) as pid:
            flat = T.Cast('int64', pid) * THREADS + T.get_thread_binding()
            row, k = flat // num_topk, flat % num_topk
            if row < num_tokens:
                value = T.alloc_var(index_dtype)
                value = indices[row, k]
                # value >= 0 here, so floor and truncating division agree.
                if value < 0 or (value // per_gpu) % num_tp_ranks != tp_rank:
                    masked_indices[row, k] = T.Cast(index_dtype, -1)
                else:
                    value = value - tp_rank * per_gpu
                    value = value - T.truncdiv(value, per_dp) * (per_dp - per_gpu)
                    masked_indices[row, k] = T.if_then_else(value < 0, T.Cast(index_dtype, -1), value)

    return KernelProgram(mask_indices_by_tp, alignment={'indices': 4, 'masked_indices': 4})


DECL = KernelDecl(
    name='moe.mask_indices_by_tp',
    params=INDEX_DTYPE_PARAMS,
    factory=build,
    prebuilt=index_dtype_specs,
    check=check_index_dtype,
    pass_configs={'tl.disable_warp_specialized': True},
)
