"""moe ops (upstream TileKernels v1 names and signatures)."""

from __future__ import annotations

import torch

from tile_kernels_aot import _checks
from tile_kernels_aot._select import find_kernel

MAX_TOPK = 32  # one warp per token; lane k writes the k-th winner


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Select the top-k experts of each token.

    Args:
        scores: ``[num_tokens, num_experts]`` float32 CUDA tensor, contiguous in the expert dimension
            (the row stride is free). Larger is preferred. Scores should be finite: NaN ranks unspecified.
        num_topk: experts per token, ``1 <= num_topk <= min(num_experts, 32)``.

    Returns:
        ``[num_tokens, num_topk]`` int64 expert indices in rank order (best first); on equal scores the
        lower index comes first, as a stable descending sort would order them.
    """
    op = 'topk_gate'
    _checks.tensor(op, 'scores', scores, ndim=2, dtypes=(torch.float32,))
    num_tokens, num_experts = scores.shape
    _checks.integer(op, 'num_topk', num_topk, low=1, high=min(num_experts, MAX_TOPK))
    _checks.inner_contiguous(op, 'scores', scores)
    device = _checks.on_one_cuda_device(op, scores=scores)
    topk_idx = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if num_tokens == 0:
        return topk_idx
    kernel = find_kernel('moe.topk_gate', {'num_experts': num_experts, 'num_topk': num_topk}, device)
    kernel(device, {'scores': scores, 'topk_idx': topk_idx})
    return topk_idx
