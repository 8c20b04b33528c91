"""E5M6 casts: what ``quant.per_token_cast(x, 'e5m6', hidden, ...)`` and ``quant.cast_back((data, sf), fmt,
x_block_size, x_special_fmt='e5m6')`` run (upstream TileKernels v1's per_token_cast_to_e5m6 and
cast_back_e5m6).

E5M6 is the top 12 bits of an IEEE half (1 sign, 5 exponent and 6 mantissa bits; max 65024). A float32 v
encodes as the half of v rounded toward zero, shifted right by 4, plus one where (that code & 1) + (the
low 17 bits of v) > 0x10000, masked to 12 bits (upstream's rounding, bit for bit). Eight codes h0..h7
pack into three little-endian uint32 words, w0 = h0 << 20 | h1 << 8 | h2 >> 4,
w1 = h2 << 28 | h3 << 16 | h4 << 4 | h5 >> 8, w2 = h5 << 24 | h6 << 12 | h7, returned as uint8
``[num_tokens, hidden * 3 / 2]``.
"""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel, kernel_constant
from tile_kernels_aot.quant._common import (
    IN_DTYPES, QuantTensor, align, check_cast_back_args, check_input_sf, check_out_fmt, check_packed_ue8m0, check_sf_flags, dtype_name, magic,
    packed_sf_bytes, row_aligned, sf_format,
)

_CAST_OP = "per_token_cast(fmt='e5m6')"
_BACK_OP = "cast_back(x_special_fmt='e5m6')"


@_plans.launch_plan
def per_token_cast_to_e5m6(
    x: torch.Tensor,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Cast to E5M6 with one scale factor per token: ``clamped = max(amax of the row, 1e-4)``,
    ``sf = clamped / 65024``, data ``= e5m6(x * (65024 / clamped))``; with ``round_sf`` sf is rounded up
    to a power of two and the multiplier is its exact inverse.

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 or float32 CUDA tensor, contiguous in ``hidden`` (a multiple of 8;
            rows of more than 8192 channels are read twice, for the amax and to encode); the row stride is free.
        num_per_channels: must equal ``hidden`` (one scale factor per token), as upstream requires.
        use_tma_aligned_col_major_sf: float32 scale factors column-major, the token dim padded to 4.
        round_sf: round the scale factors up to powers of two.
        use_packed_ue8m0: the exponent byte in an int32 word whose other bytes are zero, column-major (needs
            use_tma_aligned_col_major_sf and round_sf).

    Returns:
        ``(data, sf)``: data uint8 ``[num_tokens, hidden * 3 / 2]`` (contiguous); sf float32
        ``[num_tokens, 1]``, row-major or with strides ``(1, align(num_tokens, 4))``, or packed int32
        ``[num_tokens, 1]`` with strides ``(1, align(num_tokens, 4))``.
    """
    if is_compiling():
        return _custom_ops.per_token_cast_to_e5m6(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    op = _CAST_OP
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(IN_DTYPES))
    _checks.integer(op, 'num_per_channels', num_per_channels, low=1)
    col_major, round_sf, packed = check_sf_flags(op, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    num_tokens, hidden = x.shape
    if num_per_channels != hidden:
        raise ValueError(f'{op}: num_per_channels must equal hidden ({hidden}), got {num_per_channels}')
    if hidden == 0 or hidden % 8:
        raise ValueError(f'{op}: x must have hidden divisible by 8, got {hidden}')
    check_packed_ue8m0(op, packed, col_major, round_sf)
    _checks.inner_contiguous(op, 'x', x)
    device = _checks.on_one_cuda_device(op, x=x)

    out = torch.empty((num_tokens, hidden // 2 * 3), dtype=torch.uint8, device=x.device)  # the kernel stores uint32 words
    if col_major:
        storage = torch.empty((1, align(num_tokens, 4)), dtype=torch.int32 if packed else torch.float32, device=x.device)
        sf, sf_arg = storage[:, :num_tokens].T, storage[0, :num_tokens]
    else:
        sf = torch.empty((num_tokens, 1), dtype=torch.float32, device=x.device)
        sf_arg = sf[:, 0]
    if num_tokens:
        spec = e5m6_spec_of(x, packed)
        tensors = {'x': x, 'out': out.view(torch.uint32), 'out_sf': sf_arg}
        find_kernel('quant.per_token_cast_to_e5m6', spec, device)(device, tensors, {'round_sf': int(round_sf)})
    return out, sf


@_plans.launch_plan
def cast_back_from_e5m6(x: QuantTensor, fmt: str, x_block_size: tuple[int, int]) -> torch.Tensor:
    """Dequantise E5M6 ``(data, sf)`` to bf16 or fp32: ``out = float(code) * sf`` per block, rounded once.

    Args:
        x: ``(data, sf)``: data uint8 ``[num_tokens, hidden * 3 / 2]`` (hidden a multiple of 8), contiguous,
            4-byte aligned; sf float32 ``[num_tokens, b]`` in any strides, or packed UE8M0 int32
            ``[num_tokens, ceil(b / 4)]`` with ``stride(0) == 1`` (as per_token_cast returns them),
            ``b = ceil(hidden / n)``.
        fmt: ``'bf16'`` or ``'fp32'``.
        x_block_size: ``(1, n)``, n a positive multiple of 8 (per_token_cast's E5M6 uses ``n = hidden``;
            blocks of more than one token are not built).

    Returns:
        ``[num_tokens, hidden]`` bfloat16 or float32, contiguous.
    """
    if is_compiling():
        return _custom_ops.cast_back_from_e5m6(x, fmt, x_block_size)
    op = _BACK_OP
    out_dtype = check_out_fmt(op, fmt)
    data, sf, num_per_channels = check_cast_back_args(op, x, x_block_size, (torch.uint8,), 8)
    num_tokens, width = data.shape
    if width % 12:
        raise ValueError(f'{op}: data must have a width of hidden * 3 / 2 with hidden divisible by 8 (a multiple of 12), got {width}')
    hidden = width // 3 * 2
    if not data.is_contiguous():
        raise ValueError(f'{op}: data must be contiguous, got strides {data.stride()}')
    packed = check_input_sf(op, sf, num_tokens, -(-hidden // num_per_channels),
                            f'{num_tokens} tokens of {hidden} channels in blocks of {num_per_channels}')
    if data.data_ptr() % 4:
        raise ValueError(f'{op}: data.data_ptr() must be 4-byte aligned (it is read as uint32 words), got {data.data_ptr():#x}')
    device = _checks.on_one_cuda_device(op, data=data, sf=sf)
    out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=data.device)
    if num_tokens == 0:
        return out
    aligned = hidden % kernel_constant('quant.cast_back_e5m6', 'chunk', device) == 0 and data.data_ptr() % 16 == 0
    kernel = find_kernel('quant.cast_back_e5m6', dict(out_dtype=dtype_name(out.dtype), sf_format=sf_format(packed), aligned=aligned), device)
    chunk, index_limit = kernel.entry.constants['chunk'], kernel.entry.constants['index_limit']
    chunks_per_row = -(-hidden // chunk)
    if num_tokens * chunks_per_row >= index_limit:
        raise ValueError(f'{op}: data is too large: {num_tokens} rows of {chunks_per_row} chunks of {chunk} channels reach the '
                         '32-bit index range')
    sf_arg = packed_sf_bytes(sf) if packed else sf
    row_magic, row_shift = magic(chunks_per_row)
    block_magic, block_shift = magic(num_per_channels)
    scalars = dict(chunks_per_row=chunks_per_row, row_magic=row_magic, row_shift=row_shift, block_magic=block_magic, block_shift=block_shift)
    kernel(device, {'out': out, 'x': data.view(torch.uint32), 'x_sf': sf_arg}, scalars)
    return out


def e5m6_spec_of(x: torch.Tensor, use_packed_ue8m0: bool) -> dict:
    """The spec per_token_cast_to_e5m6 picks for the CUDA tensor `x`: the 16-byte variant when hidden is a multiple of
    the kernels' chunk of channels and the pointer and row stride are 16-byte aligned."""
    aligned = x.shape[1] % kernel_constant('quant.per_token_cast_to_e5m6', 'chunk', x.device.index) == 0 and row_aligned(x, 16)
    return dict(in_dtype=IN_DTYPES[x.dtype], sf_format=sf_format(use_packed_ue8m0), aligned=aligned)

