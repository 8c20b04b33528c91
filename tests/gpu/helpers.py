"""What the GPU tests share: the specs to cover (read from the installed manifest, so they follow the
kernel declarations), the SM counts to run at, bitwise comparison, and allocator poisoning."""

from __future__ import annotations

import math

import pytest
import torch

from tile_kernels_aot import config

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
