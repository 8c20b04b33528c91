import torch


def stable_topk(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Indices of the `num_topk` largest scores per row, best first, equal scores in index order."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :num_topk].contiguous()
