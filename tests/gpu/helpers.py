"""What the GPU tests share: the specs to cover (read from the installed manifest, so they follow the
kernel declarations), the SM counts to run at, bitwise comparison, allocator poisoning, and a sample of ops
from every family for the loader's tests (preload, several devices)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import config, reference

TOKEN_COUNTS = (0, 1, 63, 4001, 8192)
_NO_GPU = pytest.mark.skip(reason='needs a CUDA GPU')


def installed_specs(kernel: str, where=None) -> list:
    """One pytest param per installed spec of `kernel` for GPU 0 (those for which where(spec) holds, if
    given); a skipped placeholder without a GPU."""
    if not torch.cuda.is_available():
        return [pytest.param(None, marks=_NO_GPU, id='no-gpu')]
    from tile_kernels_aot._select import prebuilt_specs

    specs = [s for s in prebuilt_specs(kernel, 0) if where is None or where(s)]
    assert specs, f'the installed arch package has no {kernel} binaries' + (' of the kind this test needs' if where else '')
    return [pytest.param(s, id='-'.join(f'{k}={v}' for k, v in s.items())) for s in specs]


def installed_values(kernel: str, *names: str) -> list:
    """One pytest param per distinct combination of the spec parameters `names` among the installed specs of
    `kernel` for GPU 0 (a value each, in that order); a skipped placeholder without a GPU."""
    if not torch.cuda.is_available():
        return [pytest.param(*(None for _ in names), marks=_NO_GPU, id='no-gpu')]
    from tile_kernels_aot._select import prebuilt_specs

    values = sorted({tuple(s[n] for n in names) for s in prebuilt_specs(kernel, 0)})
    assert values, f'the installed arch package has no {kernel} binaries'
    return [pytest.param(*v, id='-'.join(f'{n}={x}' for n, x in zip(names, v))) for v in values]


def sm_counts() -> tuple[int, int, int]:
    """The SM counts an op whose result must not depend on config.set_num_sms runs at: one, all but 20, all of GPU 0's
    (the restore_num_sms fixture puts the setting back)."""
    device_sms = config.get_device_num_sms(0)
    return (1, device_sms - 20, device_sms)


def copy_at(x: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of x starting `offset` elements into a fresh (256-byte aligned) allocation."""
    return torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)[offset:].view(x.shape).copy_(x)


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _addressing_strides(t: torch.Tensor) -> tuple:
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)  # a dim of size 1 is never stepped over


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype, shape, strides and bits (upstream's assert_equal)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.numel() == 0 or _addressing_strides(actual) == _addressing_strides(expected), (actual.stride(), expected.stride())
    as_int = _INT_OF_SIZE[actual.element_size()]
    a, e = actual.contiguous().view(-1).view(as_int), expected.contiguous().view(-1).view(as_int)
    bad = a != e
    if bad.any():
        first = bad.nonzero()[:5].flatten().tolist()
        raise AssertionError(f'{int(bad.sum())} of {actual.numel()} elements differ; first at flat indices {first}: '
                             f'{actual.contiguous().view(-1)[first].tolist()} vs {expected.contiguous().view(-1)[first].tolist()}')


def poison_allocator(*shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]) -> None:
    """Fill with 0xFF bytes the blocks the next allocations of these shapes will reuse, so that an
    output element the kernel fails to write shows up as NaN / -1 instead of a lucky zero."""
    blocks = [torch.empty(shape, dtype=dtype, device='cuda') for shape, dtype in shapes_and_dtypes]
    for b in blocks:
        b.view(torch.uint8).fill_(0xFF)
    del blocks


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - cosine-like similarity, as upstream's calc_diff."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator) if denominator != 0 else 0.0


def check_unbiased(dequantized: torch.Tensor, original: torch.Tensor) -> None:
    """Round-to-nearest is unbiased: about half the values round down (upstream's check_bias)."""
    count = dequantized.numel()
    if count == 0:
        return
    below = (dequantized < original).sum().item() + (dequantized == original).sum().item() / 2
    assert abs(below / count - 0.5) < 10 / math.sqrt(count), f'{below / count:.4f} of values rounded down'


def sample_inputs(num_tokens: int, device: int | None = None) -> tuple[torch.Tensor, ...]:
    """The inputs of sample_ops on `device` (the current one when None): router scores and two bf16 activations."""
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        return (torch.randn(num_tokens, 256, device='cuda'), torch.randn(num_tokens, 7168, device='cuda').bfloat16(),
                torch.randn(num_tokens, 7168, device='cuda').bfloat16())


def sample_ops(scores: torch.Tensor, x_t: torch.Tensor, x_q: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A routing, a counting, a transpose, a quantisation and a cast-back op: one binary of each family to load,
    each output equal bit for bit to sample_references'."""
    idx = tile_kernels_aot.moe.topk_gate(scores, 8)
    q, sf = tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128)
    return (idx, tile_kernels_aot.moe.group_count(idx, 256), tile_kernels_aot.transpose.transpose(x_t), q.view(torch.uint8), sf,
            tile_kernels_aot.quant.cast_back((q, sf), 'bf16', (1, 128)))


def sample_references(scores: torch.Tensor, x_t: torch.Tensor, x_q: torch.Tensor) -> tuple[torch.Tensor, ...]:
    idx = reference.stable_topk(scores, 8)
    q, sf = reference.cast(x_q, 'e4m3', (1, 128))
    return (idx, reference.group_count(idx, 256), reference.transpose(x_t), q.view(torch.uint8), sf,
            reference.cast_back((q, sf), 'bf16', (1, 128)))
