"""The per-token casts: ``per_token_cast`` and its sf-only and precomputed-sf variants, ``cast_back`` and
``per_token_cast_back`` (E5M6 goes to quant/e5m6.py). See the package docstring for what is built.

The kernels take the hidden size, the block width, ``round_sf``, the scale-factor strides and the mode
as run-time arguments; a row of a flat vector index comes from a multiply-shift by a magic number
(``_common.magic``), exact for indices below 2^31; tensors of up to the kernels' ``index_limit`` constant (2^31 - 2^16)
elements.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.quant._common import (
    FORMATS, IN_DTYPES, MODE_CAST, MODE_PRECOMPUTED, MODE_SF_ONLY, VECTOR_BYTES, QuantTensor, align, alloc_quant_out, alloc_sf,
    check_cast_back_args, check_input_sf, check_int_pair, check_out_fmt, check_packed_ue8m0, check_sf_flags, dtype_name, is_pow2, magic,
    not_built, packed_sf_bytes, row_aligned, sf_format, unpack_quant, vector_bytes,
)
from tile_kernels_aot.quant.e5m6 import cast_back_from_e5m6, per_token_cast_to_e5m6

_BLOCK_WIDTHS = (16, 32, 64, 128)
_ROW_MAX_VECTORS = 128 * 16  # per-row kernel: rows of up to 2048 16-byte vectors (bf16 rows over 1024 are read twice)
_REQUANT_BLOCK_WIDTHS = (32, 64, 128)  # a quantised input is read in chunks of 32 elements


def _check_fmt(op: str, fmt: object) -> str:
    if fmt in FORMATS:
        return fmt
    if fmt == 'e5m6':
        raise not_built(op, "fmt='e5m6'")
    raise ValueError(f"{op}: fmt must be 'e4m3', 'e2m1' or 'e5m6', got {fmt!r}")


def _per_token_cast(
    op: str,
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: Optional[tuple[int, int]],
    use_tma_aligned_col_major_sf: bool,
    round_sf: bool,
    use_packed_ue8m0: bool,
    mode: int,
    sf: Optional[torch.Tensor] = None,
):
    fmt = _check_fmt(op, fmt)
    if isinstance(x, tuple):
        if mode != MODE_CAST:
            raise ValueError(f'{op}: a quantised (data, sf) input is re-quantised by per_token_cast only')
        return _requantize(op, x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    if x_block_size is not None:
        raise ValueError(f'{op}: x_block_size is for a quantised (data, sf) input; x is a tensor')
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(IN_DTYPES))
    _checks.integer(op, 'num_per_channels', num_per_channels, low=1)
    col_major, round_sf, packed = check_sf_flags(op, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    num_tokens, hidden = x.shape
    if hidden % 16:
        raise ValueError(f'{op}: x must have hidden divisible by 16, got {hidden}')
    elems_per_vector = VECTOR_BYTES // x.element_size()
    per_row = num_per_channels == hidden and num_per_channels not in _BLOCK_WIDTHS
    if not per_row and num_per_channels not in _BLOCK_WIDTHS:
        raise ValueError(f'{op}: num_per_channels must be 16, 32, 64 or 128, got {num_per_channels} '
                         f'(or equal to hidden, {hidden}, when hidden is a multiple of 64)')
    if per_row and hidden % 64:
        raise ValueError(f'{op}: num_per_channels == hidden needs hidden divisible by 64, got {hidden}')
    if per_row and hidden > _ROW_MAX_VECTORS * elems_per_vector:
        raise ValueError(f'{op}: num_per_channels == hidden supports hidden up to {_ROW_MAX_VECTORS * elems_per_vector} '
                         f'for {dtype_name(x.dtype)} input, got {hidden}')
    check_packed_ue8m0(op, packed, col_major, round_sf or mode == MODE_PRECOMPUTED)  # given scale factors need no rounding
    _checks.inner_contiguous(op, 'x', x)
    num_blocks = -(-hidden // num_per_channels)
    if mode == MODE_PRECOMPUTED:
        _checks.tensor(op, 'sf', sf, ndim=2, dtypes=(torch.float32, torch.int32))
        if sf.dtype == torch.int32 or packed:
            raise not_built(op, 'a precomputed packed UE8M0 sf')
        if tuple(sf.shape) != (num_tokens, num_blocks):
            raise ValueError(f'{op}: sf must have shape ({num_tokens}, {num_blocks}), got {tuple(sf.shape)}')
        device = _checks.on_one_cuda_device(op, x=x, sf=sf)
        returned, sf_arg = sf, sf
    else:
        device = _checks.on_one_cuda_device(op, x=x)
        returned, sf_arg = alloc_sf(num_tokens, num_blocks, col_major, packed, x.device)
    padded_elements = hidden if per_row else num_blocks * num_per_channels  # a whole number of 32-byte vectors
    if num_tokens:
        spec = per_token_cast_spec(x, fmt, num_per_channels, packed)
        kernel = find_kernel('quant.per_token_cast', spec, device)
        if num_tokens * padded_elements > kernel.entry.constants['index_limit']:
            raise ValueError(f'{op}: x is too large: {num_tokens} x {hidden} elements reach the 32-bit index range')
    out = alloc_quant_out(num_tokens, hidden, fmt, x.device)
    if num_tokens:
        padded_vectors = padded_elements * x.element_size() // spec['vec_bytes']
        row_magic, row_shift = magic(padded_vectors)
        scalars = dict(vectors_per_row=padded_vectors, row_magic=row_magic, row_shift=row_shift, npc_log2=num_per_channels.bit_length() - 1,
                       round_sf=int(round_sf), mode=mode)
        kernel(device, {'x': x, 'out': out, 'out_sf': sf_arg}, scalars)
    return out, returned


def _requantize(op: str, x: object, fmt: str, num_per_channels: int, x_block_size: object, use_tma_aligned_col_major_sf: bool,
                round_sf: bool, use_packed_ue8m0: bool) -> QuantTensor:
    """per_token_cast of e4m3 / e2m1 ``(data, sf)`` with scale factors per ``x_block_size`` block."""
    data, in_sf = unpack_quant(op, x)
    if x_block_size is None:
        raise ValueError(f'{op}: a quantised (data, sf) input needs x_block_size, the block of its scale factors')
    in_block_m, in_block_k = check_int_pair(op, 'x_block_size', x_block_size)
    _checks.tensor(op, 'data', data, ndim=2, dtypes=(torch.float8_e4m3fn, torch.int8))
    _checks.tensor(op, 'sf', in_sf, ndim=2, dtypes=(torch.float32, torch.int32))
    col_major, round_sf, packed = check_sf_flags(op, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    check_packed_ue8m0(op, packed, col_major, round_sf)
    if num_per_channels not in _REQUANT_BLOCK_WIDTHS:
        raise ValueError(f'{op}: num_per_channels must be 32, 64 or 128 for a quantised input, got {num_per_channels}')
    if not is_pow2(in_block_m):
        raise ValueError(f'{op}: x_block_size[0] must be a power of two, got {in_block_m}')
    if in_block_k < 32 or not is_pow2(in_block_k):
        raise ValueError(f'{op}: x_block_size[1] must be a power of two of at least 32, got {in_block_k}')
    in_fp4 = data.dtype == torch.int8
    num_tokens, width = data.shape
    hidden = width * 2 if in_fp4 else width
    if hidden % 32:
        raise ValueError(f'{op}: data must have a logical hidden divisible by 32, got {hidden}')
    _checks.inner_contiguous(op, 'data', data)
    if num_tokens and not row_aligned(data, VECTOR_BYTES):
        raise ValueError(f'{op}: data must have a 16-byte aligned pointer and row stride, got {data.data_ptr():#x} and '
                         f'{data.stride(0)} bytes')
    in_packed = check_input_sf(op, in_sf, -(-num_tokens // in_block_m), -(-hidden // in_block_k),
                               f'{num_tokens} tokens of {hidden} channels in blocks of {(in_block_m, in_block_k)}')
    device = _checks.on_one_cuda_device(op, data=data, sf=in_sf)
    num_blocks = -(-hidden // num_per_channels)
    if num_tokens:
        kernel = find_kernel('quant.per_token_requant', per_token_requant_spec(data, fmt, in_packed, packed), device)
        chunk = kernel.entry.constants['chunk']  # elements; a block is a whole number of chunks
        # Packed: whole words of 4 blocks a row, whose chunks past the data store the zero bytes of a row's last word.
        chunks_per_row = (align(num_blocks, 4) if packed else num_blocks) * num_per_channels // chunk
        if num_tokens * chunks_per_row * chunk > kernel.entry.constants['index_limit']:
            raise ValueError(f'{op}: data is too large: {num_tokens} x {hidden} elements reach the 32-bit index range')
    returned, sf_arg = alloc_sf(num_tokens, num_blocks, col_major, packed, data.device)
    out = alloc_quant_out(num_tokens, hidden, fmt, data.device)
    if num_tokens:
        # Both layouts' divisions (kernel_src.quant.per_token_requant: a chunk's index by the chunks a row, or a tiled
        # CTA's by the tiles of tile_chunks chunks a row); each binary reads the pair it needs.
        row_magic, row_shift = magic(chunks_per_row)
        tile_magic, tile_shift = magic(-(-chunks_per_row // kernel.entry.constants['tile_chunks']))
        scalars = dict(chunks_per_row=chunks_per_row, row_magic=row_magic, row_shift=row_shift, tile_magic=tile_magic, tile_shift=tile_shift,
                       npc_log2=num_per_channels.bit_length() - 1,
                       in_block_m_log2=in_block_m.bit_length() - 1, in_block_k_log2=in_block_k.bit_length() - 1, round_sf=int(round_sf))
        tensors = {'x': data, 'x_sf': packed_sf_bytes(in_sf) if in_packed else in_sf, 'out': out, 'out_sf': sf_arg}
        kernel(device, tensors, scalars)
    return out, returned


def per_token_requant_spec(data: torch.Tensor, fmt: str, in_packed: bool, packed: bool) -> dict:
    """The spec of per_token_requant that serves the (checked) quantised ``data``: e4m3 data takes 32-byte vectors (a
    whole chunk a load: one 256-bit load on SM100, two 16-byte ones on sm_90a, the 16-byte kernel's own code there)
    where its pointer and row stride are 32-byte aligned, else 16-byte ones; e2m1 data, 16-byte chunks, the latter."""
    in_fmt = 'e2m1' if data.dtype == torch.int8 else 'e4m3'
    return dict(in_fmt=in_fmt, fmt=fmt, in_sf_format=sf_format(in_packed), sf_format=sf_format(packed),
                vec_bytes=vector_bytes(data) if in_fmt == 'e4m3' else VECTOR_BYTES)


def per_token_cast_spec(x: torch.Tensor, fmt: str, num_per_channels: int, use_packed_ue8m0: bool) -> dict:
    """The spec that serves `x`: the vector variant when its pointer and row stride are 16-byte aligned, with 32-byte
    vectors when they are 32-byte aligned too (not per row)."""
    per_row = num_per_channels == x.shape[1] and num_per_channels not in _BLOCK_WIDTHS
    aligned = row_aligned(x, VECTOR_BYTES)
    vec_bytes = vector_bytes(x) if aligned and not per_row else VECTOR_BYTES
    return dict(in_dtype=IN_DTYPES[x.dtype], fmt=fmt, sf_format=sf_format(use_packed_ue8m0), per_row=per_row, aligned=aligned, vec_bytes=vec_bytes)


@_plans.launch_plan
def per_token_cast(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Cast to FP8 (e4m3) or FP4 (e2m1) with one scale factor per token and block of ``num_per_channels``.

    Per block: ``clamped = max(amax, floor)``, ``sf = clamped / max`` and ``q = cast(x * (max / clamped))``,
    with max 448 and floor 1e-4 for e4m3 (saturating round-to-nearest) and max 6 and floor 6 * 2^-126 for
    e2m1 (round-to-nearest-even, saturating at 6); with ``round_sf`` the scale factor is rounded up to a
    power of two and the multiplier is its exact inverse. ``x ~= q * sf`` block by block.

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 or float32 CUDA tensor, contiguous in ``hidden`` (a multiple
            of 16); the row stride is free. Or a quantised ``(data, sf)`` pair (see ``x_block_size``).
        fmt: ``'e4m3'``, ``'e2m1'`` or ``'e5m6'`` (12-bit floats, 8 per 3 words, ``num_per_channels ==
            hidden`` only, hidden a multiple of 8; see ``tile_kernels_aot.quant.e5m6``).
        num_per_channels: 16, 32, 64 or 128, or ``hidden`` (one scale factor per row; hidden a multiple of
            64, at most 16384 for bfloat16 and 8192 for float32 input).
        x_block_size: for a quantised ``(data, sf)`` input (e4m3, or e2m1 pairs in int8), the ``(m, k)``
            block of its scale factors (m a power of two, k a power of two >= 32; float32 in any strides
            or packed UE8M0 words). It is re-quantised without a bf16 copy: amax = max ``|q| * s`` per
            output block and ``out = cast(q * (s * multiplier))``, as upstream; ``num_per_channels`` is then
            32, 64 or 128, and only per_token_cast itself takes such an input.
        use_tma_aligned_col_major_sf: float32 scale factors column-major, the token dim padded to 4.
        round_sf: round scale factors up to powers of two.
        use_packed_ue8m0: four UE8M0 exponents per int32 (needs the column-major layout and round_sf);
            the bytes of a word past the last block are zero.

    Returns:
        ``(out, sf)``: ``out`` float8_e4m3fn ``[num_tokens, hidden]`` or int8 ``[num_tokens, hidden / 2]``
        (e2m1, low nibble = even column), contiguous. With ``b = ceil(hidden / num_per_channels)``, ``sf``
        is float32 ``[num_tokens, b]`` row-major, or column-major with strides ``(1, align(num_tokens, 4))``,
        or packed int32 ``[num_tokens, ceil(b / 4)]`` with strides ``(1, align(num_tokens, 4))``.
    """
    if is_compiling():
        return _custom_ops.per_token_cast(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    if fmt == 'e5m6':
        if isinstance(x, tuple) or x_block_size is not None:
            raise ValueError("per_token_cast: fmt='e5m6' takes a bfloat16 or float32 tensor, not a quantised (data, sf) input")
        return per_token_cast_to_e5m6(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _per_token_cast('per_token_cast', x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                           use_packed_ue8m0, MODE_CAST)


@_plans.launch_plan
def per_token_cast_with_sf_only(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """``per_token_cast(...)[1]`` without writing the data: only the scale factors, in the same layout."""
    if is_compiling():
        return _custom_ops.per_token_cast_with_sf_only(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                                                       use_packed_ue8m0)
    return _per_token_cast('per_token_cast_with_sf_only', x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                           round_sf, use_packed_ue8m0, MODE_SF_ONLY)[1]


@_plans.launch_plan
def per_token_cast_with_precomputed_sf(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """Cast with given scale factors: ``q = cast(x * (1 / sf))`` block by block; returns only ``q``.

    ``sf`` is float32 ``[num_tokens, ceil(hidden / num_per_channels)]`` in any strides (upstream uses
    row-major); packed UE8M0 scale factors are not supported. ``round_sf`` and the layout flags do not
    change the result (the scale factors are used as given).
    """
    if is_compiling():
        return _custom_ops.per_token_cast_with_precomputed_sf(x, fmt, num_per_channels, sf, x_block_size, use_tma_aligned_col_major_sf,
                                                              round_sf, use_packed_ue8m0)
    return _per_token_cast('per_token_cast_with_precomputed_sf', x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                           round_sf, use_packed_ue8m0, MODE_PRECOMPUTED, sf)[0]


@_plans.launch_plan
def cast_back(
    x: QuantTensor,
    fmt: str,
    x_block_size: tuple[int, int],
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """Dequantise ``(data, sf)`` to bf16 or fp32: ``out = float(q) * sf`` per block, rounded once.

    Args:
        x: ``(data, sf)``: data float8_e4m3fn ``[num_tokens, hidden]`` or int8 ``[num_tokens, hidden / 2]``
            (e2m1 pairs, low nibble = even column), contiguous, hidden a multiple of 16; sf float32
            ``[ceil(num_tokens / m), b]`` in any strides, or packed UE8M0 int32 ``[ceil(num_tokens / m),
            ceil(b / 4)]`` with ``stride(0) == 1`` (as the casts return them), ``b = ceil(hidden / n)``.
        fmt: ``'bf16'`` or ``'fp32'``.
        x_block_size: ``(m, n)``: m a power of two (1 for per-token scale factors; 32 or 128 for
            per_block_cast's blocks), n a multiple of 16; sf then has ``ceil(num_tokens / m)`` rows.
        x_special_fmt: None, or ``'e5m6'`` for the uint8 ``[num_tokens, hidden * 3 / 2]`` data of
            ``per_token_cast(fmt='e5m6')`` (blocks of ``(1, hidden)``).
    """
    if is_compiling():
        return _custom_ops.cast_back(x, fmt, x_block_size, x_special_fmt)
    op = 'cast_back'
    out_dtype = check_out_fmt(op, fmt)
    if x_special_fmt == 'e5m6':
        return cast_back_from_e5m6(x, fmt, x_block_size)
    if x_special_fmt is not None:
        raise ValueError(f"{op}: x_special_fmt must be None or 'e5m6', got {x_special_fmt!r}")
    data, sf, num_per_channels = check_cast_back_args(op, x, x_block_size, (torch.float8_e4m3fn, torch.int8), 16, token_blocks=True)
    num_per_tokens = x_block_size[0]
    fp4 = data.dtype == torch.int8
    num_tokens, width = data.shape
    hidden = width * 2 if fp4 else width
    if hidden % 16:
        raise ValueError(f'{op}: data must have a logical hidden divisible by 16, got {hidden}')
    if not data.is_contiguous():
        raise ValueError(f'{op}: data must be contiguous, got strides {data.stride()}')
    packed = check_input_sf(op, sf, -(-num_tokens // num_per_tokens), -(-hidden // num_per_channels),
                            f'{num_tokens} tokens of {hidden} channels in blocks of {tuple(x_block_size)}')
    device = _checks.on_one_cuda_device(op, data=data, sf=sf)
    if num_tokens and data.data_ptr() % (8 if fp4 else 16):  # an empty tensor's pointer is never read
        raise ValueError(f'{op}: data.data_ptr() must be {8 if fp4 else 16}-byte aligned, got {data.data_ptr():#x}')
    if num_tokens == 0:
        return torch.empty((num_tokens, hidden), dtype=out_dtype, device=data.device)
    kernel = find_kernel('quant.cast_back', dict(fmt='e2m1' if fp4 else 'e4m3', out_dtype=dtype_name(out_dtype), sf_format=sf_format(packed)),
                         device)
    if num_tokens * hidden > kernel.entry.constants['index_limit']:
        raise ValueError(f'{op}: data is too large: {num_tokens} x {hidden} elements reach the 32-bit index range')
    out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=data.device)
    sf_arg = packed_sf_bytes(sf) if packed else sf
    vector_elements = kernel.entry.constants['vector_elements']  # hidden and num_per_channels are multiples of it
    vectors_per_row = hidden // vector_elements
    row_magic, row_shift = magic(vectors_per_row)
    block_magic, block_shift = magic(num_per_channels // vector_elements)
    scalars = dict(vectors_per_row=vectors_per_row, row_magic=row_magic, row_shift=row_shift, block_magic=block_magic, block_shift=block_shift,
                   sf_row_shift=num_per_tokens.bit_length() - 1)
    kernel(device, {'x': data, 'x_sf': sf_arg, 'out': out}, scalars)
    return out


def per_token_cast_back(
    x: QuantTensor,
    fmt: str,
    num_per_channels: int,
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """``cast_back(x, fmt, (1, num_per_channels), x_special_fmt)``."""
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt=x_special_fmt)
