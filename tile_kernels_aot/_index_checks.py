"""The opt-in host check of index tensors: TILE_KERNELS_AOT_CHECK_INDICES=1.

The ops that read an index, a position or a count from a tensor (group_count, get_fused_mapping, expand_to_fused,
reduce_fused, ...) check its values on the device: a kernel skips the entries documented as padding and stops at a
device-side assert on any other out-of-range one, which ends the process's CUDA context (kernel_src/bounds.py). The
gating ops do the same on a NaN score, and on an infinite one where they add scores or apply a scoring function to
them (topk_sum_and_topk_group_idx, top2_sum_gate; topk_gate ranks infinities as numbers). With the variable set to 1 (or ``enable(True)``), each of those ops first
checks its index tensors (and the gating ops their scores) with torch ops on their own device and raises ValueError naming the op, the argument, the
first bad position and its value, and the rule it breaks, before anything is launched. A serving engine that would
rather have an exception than a lost context turns it on, for the price of a few small reductions and a host sync
per call (so a checked call cannot be captured in a CUDA graph).

Off (the default), the cost per call is one read of the module flag ``enabled``: the ops test it before calling
anything here. The variable is read once, when the package is imported.
"""

from __future__ import annotations

import torch

from tile_kernels_aot.config import env_switch

CHECK_ENV = 'TILE_KERNELS_AOT_CHECK_INDICES'
enabled: bool = env_switch(CHECK_ENV, False)


def enable(on: bool = True) -> None:
    """Turn the checks on or off for this process (the environment variable sets the start value)."""
    global enabled
    if not isinstance(on, bool):
        raise TypeError(f'enable: on must be a bool, got {type(on).__name__}')
    enabled = on


def _first(bad: torch.Tensor) -> int | None:
    """The flat (row-major) position of the first True of `bad`, or None: one host sync when all is well."""
    flat = bad.reshape(-1)
    if not bool(flat.any()):
        return None
    return int(flat.to(torch.uint8).argmax())  # argmax answers the first of equal maxima


def _position(shape: torch.Size, flat: int) -> str:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return ', '.join(map(str, reversed(index)))


def _raise(op: str, name: str, t: torch.Tensor, flat: int, rule: str) -> None:
    value = t.reshape(-1)[flat].item()
    raise ValueError(f'{op}: {name}[{_position(t.shape, flat)}] = {value} breaks the rule that {rule} '
                     f'(checked before the launch: {CHECK_ENV})')


def below(op: str, name: str, t: torch.Tensor, high: int, *, what: str) -> None:
    """Every entry of `t` is below `high` (`what` names the bound, e.g. 'num_groups (256)'); negative entries mean
    'none' to the kernel and pass (an int64 one of any size: the kernels narrow indices without wrapping)."""
    bad = t >= high
    rule = f'entries are below {what} (negative entries are skipped)'
    flat = _first(bad)
    if flat is not None:
        _raise(op, name, t, flat, rule)


def within(op: str, name: str, t: torch.Tensor, low: int, high: int | None, *, what: str, rows: torch.Tensor | None = None) -> None:
    """Every entry of `t` is in [low, high) (`what` says so in words; no upper bound with `high` None); with `rows`
    (bool, one per row of a 2-d `t`), only the rows where it is True are checked."""
    bad = t < low if high is None else (t < low) | (t >= high)
    if rows is not None:
        bad &= rows.reshape(-1, *([1] * (t.dim() - 1)))
    flat = _first(bad)
    if flat is not None:
        _raise(op, name, t, flat, what)


def finite(op: str, name: str, t: torch.Tensor, *, rows: torch.Tensor | None = None, infinities: bool = False) -> None:
    """Every entry of `t` (float) is finite, or with `infinities` not NaN: the gating kernels stop at a device-side
    assert on a NaN score, and on an infinite one where they add scores or apply a scoring function to them. With
    `rows` (bool, one per row of a 2-d `t`), only the rows where it is True are checked."""
    bad = torch.isnan(t) if infinities else ~torch.isfinite(t)
    if rows is not None:
        bad &= rows.reshape(-1, *([1] * (t.dim() - 1)))
    flat = _first(bad)
    if flat is not None:
        _raise(op, name, t, flat, 'scores are not NaN' if infinities else 'gating inputs are finite (no NaN or infinity)')


def fused_positions_fit(op: str, topk_idx: torch.Tensor, num_experts: int, alignment: int, num_expanded_tokens: int) -> None:
    """get_fused_mapping with a given buffer size: the routing's aligned segments fit in it."""
    routed = topk_idx[(topk_idx >= 0) & (topk_idx < num_experts)]
    counts = torch.bincount(routed.reshape(-1).long(), minlength=num_experts)
    needed = int(((counts + alignment - 1) // alignment * alignment).sum())
    if needed > num_expanded_tokens:
        raise ValueError(f'{op}: num_expanded_tokens = {num_expanded_tokens} is too small for this routing, whose segments '
                         f'aligned to {alignment} take {needed} positions (checked before the launch: {CHECK_ENV})')
