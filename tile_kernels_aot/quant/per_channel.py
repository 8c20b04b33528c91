"""Per-channel e4m3 casts (upstream TileKernels v1's quant.per_channel_cast, per_channel_cast_fused and
per_channel_cast_and_transpose) and the e2m1 debug decoder unpack_from_e2m1fn_x2.

One scale factor per channel and block of ``num_per_tokens`` tokens: ``clamped = max(amax, 1e-4)``,
``sf = clamped / 448``, ``q = e4m3(x * (448 / clamped))`` (saturating), or with ``round_sf`` the scale
factor rounded up to a power of two and the multiplier its exact inverse. The scale factors are float32
``[ceil(num_tokens / num_per_tokens), hidden]``, row-major.

The kernels take the token count, hidden size, strides and ``round_sf`` at run time; the compile-time
variants are the input dtype, the gather, and for the transposed cast the block height.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot import _index_checks
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.quant._common import IN_DTYPES, VECTOR_BYTES, QuantTensor, check_bool, check_e4m3, check_grid_y, row_aligned

_IN_SF_BLOCK = 128  # channels per input scale factor of an e4m3 input


def _check_vectors(op: str, name: str, t: torch.Tensor) -> None:
    """The kernels move 16-byte vectors: the pointer and the row stride must allow them."""
    _checks.inner_contiguous(op, name, t)
    if not row_aligned(t, VECTOR_BYTES):
        raise ValueError(f'{op}: {name} must have a 16-byte aligned data pointer and row stride, got pointer '
                         f'{t.data_ptr():#x} and row stride {t.stride(0)} elements')


@_plans.launch_plan
def per_channel_cast_fused(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels: Optional[int] = None,
    pos_to_token: Optional[torch.Tensor] = None,
) -> QuantTensor:
    """Cast to e4m3 with one scale factor per channel and 128 tokens, optionally gathering the rows and
    dequantising an e4m3 input first.

    Output row ``r`` is input row ``pos_to_token[r]``, or zeros where that is negative (without
    ``pos_to_token``, row ``r``). An e4m3 input ``(data, sf)`` is first dequantised to float32,
    ``data * sf`` per (1, 128) block, and that product is what is cast.

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 or float32 CUDA tensor, hidden a multiple of 64; or
            ``(data, sf)`` with data float8_e4m3fn ``[num_tokens, hidden]`` (hidden a multiple of 128) and
            sf float32 ``[num_tokens, hidden / 128]`` (any strides). Contiguous in ``hidden``, with a
            16-byte aligned pointer and row stride.
        fmt: ``'e4m3'``.
        num_per_tokens: 128.
        round_sf: round scale factors up to powers of two.
        num_per_channels: None for a plain tensor, 128 for a ``(data, sf)`` input.
        pos_to_token: optional int32 ``[num_tokens_out]`` (contiguous) of input rows or -1; values must
            be below ``num_tokens`` (a device-side assert checks). ``num_tokens_out`` must be a multiple
            of 16 with it, and ``num_tokens`` a multiple of 128 without it.

    Returns:
        ``(out, sf)``: out float8_e4m3fn ``[num_tokens_out, hidden]``, sf float32
        ``[ceil(num_tokens_out / 128), hidden]``, both contiguous.
    """
    if is_compiling():
        return _custom_ops.per_channel_cast_fused(x, fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token)
    return _per_channel_cast('per_channel_cast_fused', x, fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token)


def _per_channel_cast(op, x, fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token) -> QuantTensor:
    check_e4m3(op, fmt)
    _checks.integer(op, 'num_per_tokens', num_per_tokens, low=1)
    if num_per_tokens != 128:
        raise ValueError(f'{op}: num_per_tokens must be 128, got {num_per_tokens}')
    round_sf = check_bool(op, 'round_sf', round_sf)
    dequant = isinstance(x, tuple)
    if dequant:
        if len(x) != 2:
            raise TypeError(f'{op}: x must be a tensor or a (data, sf) tuple, got a tuple of {len(x)}')
        data, x_sf = x
        _checks.tensor(op, 'x[0]', data, ndim=2, dtypes=(torch.float8_e4m3fn,))
        _checks.tensor(op, 'x[1]', x_sf, ndim=2, dtypes=(torch.float32,))
        if num_per_channels != _IN_SF_BLOCK:
            raise ValueError(f'{op}: num_per_channels must be 128 for a (data, sf) input, got {num_per_channels!r}')
        num_tokens, hidden = data.shape
        if hidden % _IN_SF_BLOCK:
            raise ValueError(f'{op}: x[0] must have hidden divisible by 128, got {hidden}')
        if tuple(x_sf.shape) != (num_tokens, hidden // _IN_SF_BLOCK):
            raise ValueError(f'{op}: x[1] must have shape ({num_tokens}, {hidden // _IN_SF_BLOCK}), got {tuple(x_sf.shape)}')
        in_dtype = 'float8_e4m3fn'
    else:
        data, x_sf = x, None
        _checks.tensor(op, 'x', data, ndim=2, dtypes=tuple(IN_DTYPES))
        if num_per_channels is not None:
            raise ValueError(f'{op}: num_per_channels is for a (data, sf) input; pass None with a plain tensor, got {num_per_channels!r}')
        num_tokens, hidden = data.shape
        if hidden % 64:
            raise ValueError(f'{op}: x must have hidden divisible by 64, got {hidden}')
        in_dtype = IN_DTYPES[data.dtype]
    name = 'x[0]' if dequant else 'x'
    gather = pos_to_token is not None
    if gather:
        _checks.tensor(op, 'pos_to_token', pos_to_token, ndim=1, dtypes=(torch.int32,))
        if not pos_to_token.is_contiguous():
            raise ValueError(f'{op}: pos_to_token must be contiguous, got stride {pos_to_token.stride()}')
        num_tokens_out = pos_to_token.shape[0]
        if num_tokens_out % 16:
            raise ValueError(f'{op}: pos_to_token must have a length divisible by 16, got {num_tokens_out}')
    else:
        num_tokens_out = num_tokens
        if num_tokens % 128:
            raise ValueError(f'{op}: {name} must have num_tokens divisible by 128 (without pos_to_token), got {num_tokens}')
    _check_vectors(op, name, data)
    tensors = dict(x=data)
    if dequant:
        tensors['x_sf'] = x_sf
    if gather:
        tensors['pos_to_token'] = pos_to_token
    device = _checks.on_one_cuda_device(op, **tensors)
    if gather and _index_checks.enabled:
        _index_checks.below(op, 'pos_to_token', pos_to_token, num_tokens, what=f'the {num_tokens} rows of {name}')
    if num_tokens_out:
        spec = dict(in_dtype=in_dtype, gather=gather, transpose=False, num_per_tokens=num_per_tokens)
        kernel = find_kernel('quant.per_channel_cast_fused', spec, device)
        check_grid_y(op, num_tokens_out, kernel.entry.constants['tile_m'], 'the token count must be')
    out = torch.empty((num_tokens_out, hidden), dtype=torch.float8_e4m3fn, device=data.device)
    out_sf = torch.empty((-(-num_tokens_out // num_per_tokens), hidden), dtype=torch.float32, device=data.device)
    if num_tokens_out:
        kernel(device, {**tensors, 'out': out, 'out_sf': out_sf}, {'round_sf': int(round_sf)})
    return out, out_sf


@_plans.launch_plan
def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False) -> QuantTensor:
    """Cast to e4m3 with one scale factor per channel and block of 128 tokens.

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 or float32 CUDA tensor, num_tokens a multiple of 128, hidden a
            multiple of 64, contiguous in ``hidden`` with a 16-byte aligned pointer and row stride.
        fmt: ``'e4m3'``.
        num_per_tokens: 128.
        round_sf: round scale factors up to powers of two.

    Returns:
        ``(out, sf)``: out float8_e4m3fn ``[num_tokens, hidden]``, sf float32 ``[num_tokens / 128, hidden]``.
    """
    if is_compiling():
        return _custom_ops.per_channel_cast(x, fmt, num_per_tokens, round_sf)
    if isinstance(x, tuple):
        raise TypeError('per_channel_cast: x must be a tensor (use per_channel_cast_fused for a (data, sf) input)')
    return _per_channel_cast('per_channel_cast', x, fmt, num_per_tokens, round_sf, None, None)


@_plans.launch_plan
def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False) -> QuantTensor:
    """Per-channel e4m3 cast written transposed: ``out[h, t]``, with one scale factor per channel and block
    of ``num_per_tokens`` tokens.

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 CUDA tensor, num_tokens a multiple of 128, hidden a multiple of
            64, contiguous in ``hidden`` with a 16-byte aligned pointer and row stride.
        fmt: ``'e4m3'``.
        num_per_tokens: 32 or 128.
        round_sf: round scale factors up to powers of two.

    Returns:
        ``(out, sf)``: out float8_e4m3fn ``[hidden, num_tokens]``, sf float32
        ``[num_tokens / num_per_tokens, hidden]``, both contiguous.
    """
    if is_compiling():
        return _custom_ops.per_channel_cast_and_transpose(x, fmt, num_per_tokens, round_sf)
    op = 'per_channel_cast_and_transpose'
    check_e4m3(op, fmt)
    _checks.integer(op, 'num_per_tokens', num_per_tokens, low=1)
    if num_per_tokens not in (32, 128):
        raise ValueError(f'{op}: num_per_tokens must be 32 or 128, got {num_per_tokens}')
    round_sf = check_bool(op, 'round_sf', round_sf)
    _checks.tensor(op, 'x', x, ndim=2, dtypes=(torch.bfloat16,))
    num_tokens, hidden = x.shape
    if num_tokens % 128:
        raise ValueError(f'{op}: x must have num_tokens divisible by 128, got {num_tokens}')
    if hidden % 64:
        raise ValueError(f'{op}: x must have hidden divisible by 64, got {hidden}')
    _check_vectors(op, 'x', x)
    device = _checks.on_one_cuda_device(op, x=x)
    if num_tokens:
        spec = dict(in_dtype='bfloat16', gather=False, transpose=True, num_per_tokens=num_per_tokens)
        kernel = find_kernel('quant.per_channel_cast_and_transpose', spec, device)
        check_grid_y(op, num_tokens, kernel.entry.constants['tile_m'], 'the token count must be')
    out = torch.empty((hidden, num_tokens), dtype=torch.float8_e4m3fn, device=x.device)
    out_sf = torch.empty((num_tokens // num_per_tokens, hidden), dtype=torch.float32, device=x.device)
    if num_tokens:
        kernel(device, {'x': x, 'out': out, 'out_sf': out_sf}, {'round_sf': int(round_sf)})
    return out, out_sf


# e2m1 codes 0..15 (sign in bit 3): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0.0).
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed e2m1 pairs (for debugging): ``[..., K]`` int8/uint8 to ``[..., 2K]`` of ``out_dtype``,
    the low nibble first. Pure PyTorch, any device."""
    op = 'unpack_from_e2m1fn_x2'
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'{op}: x must be a torch.Tensor, got {type(x).__name__}')
    if x.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f'{op}: x must be int8 or uint8, got {str(x.dtype).removeprefix("torch.")}')
    if x.dim() == 0:
        raise ValueError(f'{op}: x must have at least 1 dimension so the last dim can be doubled')
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f'{op}: out_dtype must be a floating-point torch.dtype, got {out_dtype!r}')
    codes = x.view(torch.uint8).to(torch.int64)
    codes = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(*x.shape[:-1], x.shape[-1] * 2)
    return torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)[codes].to(out_dtype)
