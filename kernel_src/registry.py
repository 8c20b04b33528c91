"""Every kernel declaration, by name. Adding a kernel means adding its declaration here, nothing more."""

from kernel_src.decl import KernelDecl
from kernel_src.moe import counting, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight, topk_gate, topk_sum_and_topk_group_idx
from kernel_src.quant import per_token_cast
from kernel_src.transpose import batched_transpose

DECLS: dict[str, KernelDecl] = {
    d.name: d
    for d in (
        batched_transpose.DECL,
        topk_gate.DECL,
        topk_sum_and_topk_group_idx.DECL,
        normalize_weight.DECL,
        counting.GROUP_COUNT,
        counting.AUX_FI,
        inplace_unique_group_indices.DECL,
        mask_indices_by_tp.DECL,
        per_token_cast.DECL,
    )
}
