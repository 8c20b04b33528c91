"""Every kernel declaration, by name. Adding a kernel means adding its declaration here, nothing more."""

from kernel_src.decl import KernelDecl
from kernel_src.moe import (
    counting, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight, top2_sum_gate, topk_gate, topk_sum_and_topk_group_idx,
)
from kernel_src.moe import expand_to_fused, fused_mapping, reduce_fused
from kernel_src.quant import cast_back, per_token_cast, per_token_requant
from kernel_src.quant import swiglu
from kernel_src.quant import per_block_cast, per_block_cast_lossless
from kernel_src.quant import e5m6, per_channel_cast
from kernel_src.transpose import batched_transpose
from kernel_src.mhc import expand, multilayer_recompute, post, pre_apply_mix
from kernel_src.mhc import head_compute_mix, pre_big_fuse, pre_split_mixes, sinkhorn
from kernel_src.engram import fused_weight, gate_bwd, gate_fwd, grad_w_reduce, ngram_hash
from kernel_src.mhc.norm_fn import gemm as norm_fn_gemm, merge as norm_fn_merge, norm as norm_fn_norm

DECLS: dict[str, KernelDecl] = {
    d.name: d
    for d in (
        batched_transpose.DECL,
        topk_gate.DECL,
        topk_sum_and_topk_group_idx.DECL,
        top2_sum_gate.DECL,
        normalize_weight.DECL,
        counting.GROUP_COUNT,
        counting.AUX_FI,
        inplace_unique_group_indices.DECL,
        mask_indices_by_tp.DECL,
        per_token_cast.DECL,
        per_token_requant.DECL,
        per_channel_cast.FUSED,
        per_channel_cast.TRANSPOSE,
        e5m6.CAST,
        e5m6.CAST_BACK,
        cast_back.DECL,
        swiglu.FORWARD,
        swiglu.CHANNEL,
        swiglu.BACKWARD,
        fused_mapping.DECL,
        expand_to_fused.DECL,
        reduce_fused.DECL,
        per_block_cast.DECL,
        per_block_cast_lossless.DECL,
        ngram_hash.DECL,
        fused_weight.DECL,
        gate_fwd.DECL,
        gate_bwd.DECL,
        grad_w_reduce.DECL,
        norm_fn_merge.MERGE_FWD,
        norm_fn_merge.MERGE_BWD,
        norm_fn_gemm.FWD_MUL,
        norm_fn_norm.FWD_NORM,
        norm_fn_norm.BWD_NORM,
        norm_fn_gemm.BWD_MUL,
        pre_split_mixes.FWD,
        pre_split_mixes.BWD,
        sinkhorn.FWD,
        sinkhorn.BWD,
        head_compute_mix.FWD,
        head_compute_mix.BWD,
        pre_big_fuse.DECL,
        expand.FWD,
        expand.BWD,
        pre_apply_mix.FWD,
        pre_apply_mix.BWD,
        post.FWD,
        post.BWD,
        multilayer_recompute.DECL,
    )
}
