"""quant ops (upstream TileKernels v1 names and signatures).

Built in this release:

* ``per_token_cast``, ``per_token_cast_with_sf_only`` and ``per_token_cast_with_precomputed_sf``: bfloat16 or
  float32 input (any row stride, last dim contiguous, hidden a multiple of 16) to e4m3 or e2m1 (two codes per
  int8, low nibble = even column), 16, 32, 64 or 128 channels per scale factor, or one per row
  (``num_per_channels == hidden``, hidden a multiple of 64 and at most 16384 bf16 / 8192 fp32 elements);
  scale factors row-major float32, TMA-aligned column-major float32, or packed UE8M0 (column-major, with
  ``round_sf``); with or without ``round_sf``.
* ``cast_back`` and ``per_token_cast_back``: e4m3 or e2m1 data with per-token scale factors (blocks of
  ``(1, n)``, n a multiple of 16) in any of those layouts, to bf16 or fp32.

* ``per_token_cast(fmt='e5m6')`` and ``cast_back(x_special_fmt='e5m6')`` (``tile_kernels_aot._e5m6``).

Not built (they raise NotImplementedError naming what is missing; nothing falls back to a slower path):
re-quantising an FP8/FP4 ``(data, sf)`` input, and ``cast_back`` with blocks of more than one token.

The kernels take the hidden size, the block width, ``round_sf``, the scale-factor strides and the mode
as run-time arguments; a row of a flat vector index comes from a multiply-shift by a magic number that
this module computes (``_magic``), exact for indices below 2^31; tensors of up to 2^31 - 2^16 elements.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from tile_kernels_aot import _checks
from tile_kernels_aot._e5m6 import cast_back_from_e5m6, per_token_cast_to_e5m6
from tile_kernels_aot._select import find_kernel

QuantTensor = tuple[torch.Tensor, torch.Tensor]
_IN_DTYPES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}
_FORMATS = ('e4m3', 'e2m1')
_OUT_DTYPES = {'bf16': torch.bfloat16, 'fp32': torch.float32}
_VECTOR_BYTES = 16
_BLOCK_WIDTHS = (16, 32, 64, 128)
_ROW_MAX_VECTORS = 128 * 16  # per-row kernel: 128 threads x 16 vectors
_MODE_CAST, _MODE_SF_ONLY, _MODE_PRECOMPUTED = 0, 1, 2
_INDEX_LIMIT = 2**31 - 2**16  # flat element indices (plus a CTA's overrun) stay int32 in the kernels


def _not_built(op: str, what: str) -> NotImplementedError:
    return NotImplementedError(f'{op}: {what} is not built in this release of tile-kernels-aot')


def _magic(divisor: int) -> tuple[int, int]:
    """(magic, shift) with (n * magic) >> shift == n // divisor for every 0 <= n < 2^31.

    With l = ceil(log2(divisor)), magic = ceil(2^(31 + l) / divisor) < 2^32 and its excess
    e = magic * divisor - 2^(31 + l) < divisor <= 2^l, so n * e < 2^(31 + l) and the error term never
    reaches the next integer; n * magic < 2^63 fits a signed 64-bit product.
    """
    shift = 31 + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _check_fmt(op: str, fmt: object) -> str:
    if fmt in _FORMATS:
        return fmt
    if fmt == 'e5m6':
        raise _not_built(op, "fmt='e5m6'")
    raise ValueError(f"{op}: fmt must be 'e4m3', 'e2m1' or 'e5m6', got {fmt!r}")


def _check_bool(op: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f'{op}: {name} must be a bool, got {type(value).__name__}')
    return value


def _alloc_sf(x: torch.Tensor, num_blocks: int, col_major: bool, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the op returns, what the kernel writes), allocated as upstream does: column-major layouts pad
    the token dim to 16 bytes (4 float32 or 4 int32 words), packed UE8M0 holds 4 blocks per int32."""
    num_tokens = x.shape[0]
    if packed:
        words = -(-num_blocks // 4)
        storage = torch.empty((words, _align(num_tokens * 4, 16)), dtype=torch.uint8, device=x.device)[:, :num_tokens * 4]
        if num_tokens == 0:
            return torch.empty((words, 0), dtype=torch.int32, device=x.device).T, storage
        return storage.view(torch.int32).T, storage
    if col_major:
        storage = torch.empty((num_blocks, _align(num_tokens, 4)), dtype=torch.float32, device=x.device)[:, :num_tokens]
        return storage.T, storage.T
    sf = torch.empty((num_tokens, num_blocks), dtype=torch.float32, device=x.device)
    return sf, sf


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
    if isinstance(x, tuple) or x_block_size is not None:
        raise _not_built(op, 're-quantising an FP8/FP4 (data, sf) input')
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(_IN_DTYPES))
    _checks.integer(op, 'num_per_channels', num_per_channels, low=1)
    col_major = _check_bool(op, 'use_tma_aligned_col_major_sf', use_tma_aligned_col_major_sf)
    round_sf = _check_bool(op, 'round_sf', round_sf)
    packed = _check_bool(op, 'use_packed_ue8m0', use_packed_ue8m0)
    num_tokens, hidden = x.shape
    if hidden % 16:
        raise ValueError(f'{op}: x must have hidden divisible by 16, got {hidden}')
    elems_per_vector = _VECTOR_BYTES // x.element_size()
    per_row = num_per_channels == hidden and num_per_channels not in _BLOCK_WIDTHS
    if not per_row and num_per_channels not in _BLOCK_WIDTHS:
        raise ValueError(f'{op}: num_per_channels must be 16, 32, 64 or 128, got {num_per_channels} '
                         f'(or equal to hidden, {hidden}, when hidden is a multiple of 64)')
    if per_row and hidden % 64:
        raise ValueError(f'{op}: num_per_channels == hidden needs hidden divisible by 64, got {hidden}')
    if per_row and hidden > _ROW_MAX_VECTORS * elems_per_vector:
        raise ValueError(f'{op}: num_per_channels == hidden supports hidden up to {_ROW_MAX_VECTORS * elems_per_vector} '
                         f'for {str(x.dtype).removeprefix("torch.")} input, got {hidden}')
    if packed and not col_major:
        raise ValueError(f'{op}: use_packed_ue8m0 needs use_tma_aligned_col_major_sf=True (packed UE8M0 is column-major)')
    if packed and not round_sf and mode != _MODE_PRECOMPUTED:
        raise ValueError(f'{op}: use_packed_ue8m0 needs round_sf=True (UE8M0 holds powers of two only)')
    _checks.inner_contiguous(op, 'x', x)
    num_blocks = -(-hidden // num_per_channels)
    if mode == _MODE_PRECOMPUTED:
        _checks.tensor(op, 'sf', sf, ndim=2, dtypes=(torch.float32, torch.int32))
        if sf.dtype == torch.int32 or packed:
            raise _not_built(op, 'a precomputed packed UE8M0 sf')
        if tuple(sf.shape) != (num_tokens, num_blocks):
            raise ValueError(f'{op}: sf must have shape ({num_tokens}, {num_blocks}), got {tuple(sf.shape)}')
        device = _checks.on_one_cuda_device(op, x=x, sf=sf)
        returned, sf_arg = sf, sf
    else:
        device = _checks.on_one_cuda_device(op, x=x)
        returned, sf_arg = _alloc_sf(x, num_blocks, col_major, packed)
    padded_vectors = (hidden if per_row else num_blocks * num_per_channels) // elems_per_vector
    if num_tokens * padded_vectors * elems_per_vector > _INDEX_LIMIT:
        raise ValueError(f'{op}: x is too large: {num_tokens} x {hidden} elements reach the 32-bit index range')
    out_shape = (num_tokens, hidden // 2) if fmt == 'e2m1' else (num_tokens, hidden)
    out = x.new_empty(out_shape, dtype=torch.int8 if fmt == 'e2m1' else torch.float8_e4m3fn)
    if num_tokens:
        magic, shift = _magic(padded_vectors)
        spec = per_token_cast_spec(x, fmt, num_per_channels, packed)
        scalars = dict(vectors_per_row=padded_vectors, row_magic=magic, row_shift=shift, npc_log2=num_per_channels.bit_length() - 1,
                       round_sf=int(round_sf), mode=mode)
        find_kernel('quant.per_token_cast', spec, device)(device, {'x': x, 'out': out, 'out_sf': sf_arg}, scalars)
    return out, returned


def per_token_cast_spec(x: torch.Tensor, fmt: str, num_per_channels: int, use_packed_ue8m0: bool) -> dict:
    """The spec that serves `x`: the 16-byte vector variant when its pointer and row stride allow it."""
    row_bytes = x.stride(0) * x.element_size() if x.shape[0] > 1 else 0  # one row: the stride is unused
    aligned = (x.data_ptr() | row_bytes) % _VECTOR_BYTES == 0
    per_row = num_per_channels == x.shape[1] and num_per_channels not in _BLOCK_WIDTHS
    return dict(in_dtype=_IN_DTYPES[x.dtype], fmt=fmt, sf_format='ue8m0' if use_packed_ue8m0 else 'f32', per_row=per_row, aligned=aligned)


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
            of 16); the row stride is free.
        fmt: ``'e4m3'``, ``'e2m1'`` or ``'e5m6'`` (12-bit floats, 8 per 3 words, ``num_per_channels ==
            hidden`` only, hidden a multiple of 8 and at most 8192; see ``tile_kernels_aot._e5m6``).
        num_per_channels: 16, 32, 64 or 128, or ``hidden`` (one scale factor per row; hidden a multiple of
            64, at most 16384 for bfloat16 and 8192 for float32 input).
        x_block_size: only for re-quantising an FP8/FP4 ``(data, sf)`` input (not built).
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
    if fmt == 'e5m6':
        if isinstance(x, tuple) or x_block_size is not None:
            raise _not_built('per_token_cast', "fmt='e5m6' from an FP8/FP4 (data, sf) input")
        return per_token_cast_to_e5m6(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _per_token_cast('per_token_cast', x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                           use_packed_ue8m0, _MODE_CAST)


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
    return _per_token_cast('per_token_cast_with_sf_only', x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                           round_sf, use_packed_ue8m0, _MODE_SF_ONLY)[1]


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
    return _per_token_cast('per_token_cast_with_precomputed_sf', x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                           round_sf, use_packed_ue8m0, _MODE_PRECOMPUTED, sf)[0]


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
            ``[num_tokens, b]`` in any strides, or packed UE8M0 int32 ``[num_tokens, ceil(b / 4)]`` with
            ``stride(0) == 1`` (as per_token_cast returns them), ``b = ceil(hidden / n)``.
        fmt: ``'bf16'`` or ``'fp32'``.
        x_block_size: ``(1, n)`` with n a multiple of 16 (blocks of more than one token are not built).
        x_special_fmt: None, or ``'e5m6'`` for the uint8 ``[num_tokens, hidden * 3 / 2]`` data of
            ``per_token_cast(fmt='e5m6')`` (blocks of ``(1, hidden)``).
    """
    op = 'cast_back'
    if fmt not in _OUT_DTYPES:
        raise ValueError(f"{op}: fmt must be 'bf16' or 'fp32', got {fmt!r}")
    if x_special_fmt == 'e5m6':
        return cast_back_from_e5m6(x, fmt, x_block_size)
    if x_special_fmt is not None:
        raise ValueError(f"{op}: x_special_fmt must be None or 'e5m6', got {x_special_fmt!r}")
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError(f'{op}: x must be a (data, sf) tuple, got {type(x).__name__}')
    if not (isinstance(x_block_size, tuple) and len(x_block_size) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x_block_size)):
        raise TypeError(f'{op}: x_block_size must be a tuple of two ints, got {x_block_size!r}')
    data, sf = x
    _checks.tensor(op, 'data', data, ndim=2, dtypes=(torch.float8_e4m3fn, torch.int8))
    _checks.tensor(op, 'sf', sf, ndim=2, dtypes=(torch.float32, torch.int32))
    num_per_tokens, num_per_channels = x_block_size
    if num_per_tokens != 1:
        raise _not_built(op, f'x_block_size={x_block_size} (blocks of more than one token)')
    if num_per_channels < 16 or num_per_channels % 16:
        raise ValueError(f'{op}: x_block_size[1] must be a positive multiple of 16, got {num_per_channels}')
    fp4 = data.dtype == torch.int8
    num_tokens, width = data.shape
    hidden = width * 2 if fp4 else width
    if hidden % 16:
        raise ValueError(f'{op}: data must have a logical hidden divisible by 16, got {hidden}')
    if not data.is_contiguous():
        raise ValueError(f'{op}: data must be contiguous, got strides {data.stride()}')
    packed = sf.dtype == torch.int32
    num_blocks = -(-hidden // num_per_channels)
    expected = (num_tokens, -(-num_blocks // 4) if packed else num_blocks)
    if tuple(sf.shape) != expected:
        raise ValueError(f'{op}: sf must have shape {expected} for {num_tokens} tokens of {hidden} channels in blocks of {num_per_channels}, got {tuple(sf.shape)}')
    if packed and num_tokens > 1 and sf.stride(0) != 1:
        raise ValueError(f'{op}: a packed UE8M0 sf (int32) must be column-major (stride(0) == 1), got strides {sf.stride()}')
    device = _checks.on_one_cuda_device(op, data=data, sf=sf)
    out = torch.empty((num_tokens, hidden), dtype=_OUT_DTYPES[fmt], device=data.device)
    if num_tokens == 0:
        return out
    if data.data_ptr() % (8 if fp4 else 16):
        raise ValueError(f'{op}: data.data_ptr() must be {8 if fp4 else 16}-byte aligned, got {data.data_ptr():#x}')
    # The packed words as the bytes the kernel reads: word w of token t is bytes [4t, 4t + 4) of row w.
    sf_arg = sf
    if packed:
        words = sf.T if sf.T.stride(-1) == 1 else sf.T.contiguous()  # one token: any stride(0) will do
        sf_arg = words.view(torch.uint8)
    vectors_per_row = hidden // 16
    if num_tokens * hidden > _INDEX_LIMIT:
        raise ValueError(f'{op}: data is too large: {num_tokens} x {hidden} elements reach the 32-bit index range')
    row_magic, row_shift = _magic(vectors_per_row)
    block_magic, block_shift = _magic(num_per_channels // 16)
    spec = dict(fmt='e2m1' if fp4 else 'e4m3', out_dtype=str(out.dtype).removeprefix('torch.'), sf_format='ue8m0' if packed else 'f32')
    scalars = dict(vectors_per_row=vectors_per_row, row_magic=row_magic, row_shift=row_shift, block_magic=block_magic, block_shift=block_shift)
    find_kernel('quant.cast_back', spec, device)(device, {'x': data, 'x_sf': sf_arg, 'out': out}, scalars)
    return out


def per_token_cast_back(
    x: QuantTensor,
    fmt: str,
    num_per_channels: int,
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """``cast_back(x, fmt, (1, num_per_channels), x_special_fmt)``."""
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt=x_special_fmt)
from tile_kernels_aot._per_block import per_block_cast, per_block_cast_lossless, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only  # noqa: E402,F401
from tile_kernels_aot._swiglu import swiglu_backward_and_per_token_cast, swiglu_forward_and_per_channel_cast_and_transpose, swiglu_forward_and_per_token_cast  # noqa: E402,F401
from tile_kernels_aot._per_channel import per_channel_cast, per_channel_cast_and_transpose, per_channel_cast_fused, unpack_from_e2m1fn_x2  # noqa: E402,F401
