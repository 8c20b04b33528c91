"""Block-scaled casts (upstream TileKernels v1 names and signatures), exported by tile_kernels_aot.quant:

* ``per_block_cast``, ``per_block_cast_with_sf_only``, ``per_block_cast_with_precomputed_sf``: bfloat16 or
  float32 ``(num_tokens, hidden)`` to e4m3 or e2m1 with one scale factor per ``(block_m, block_k)`` block,
  blocks (128, 128) and (32, 32) prebuilt ((128, 32) and (32, 128) are declared and build on request);
* ``per_block_cast_lossless``: e2m1 ``(data, sf)`` with power-of-two scale factors on small blocks to e4m3
  on (1, 128), (32, 32) or (128, 128) blocks, without loss.

The token count, hidden size, row stride, round_sf, the mode and the scale-factor strides are run-time
arguments of the kernels; every argument is checked here, before anything is allocated or launched.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.quant._common import (
    FORMATS, IN_DTYPES, MODE_CAST, MODE_PRECOMPUTED, MODE_SF_ONLY, VECTOR_BYTES, QuantTensor, alloc_quant_out, alloc_sf,
    check_bool, check_e4m3, check_grid_y, check_input_sf, check_int_pair, check_packed_ue8m0, check_sf_flags, is_pow2, packed_sf_bytes, row_aligned, sf_format,
    unpack_quant, vector_bytes,
)

_BLOCK_SIZES = (32, 128)
_LOSSLESS_BLOCK_MS = (1, 32, 128)
_LOSSLESS_BLOCK_KS = (32, 128)


def _per_block_cast(op: str, x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, mode: int,
                    sf: Optional[torch.Tensor] = None):
    if fmt not in FORMATS:
        raise ValueError(f"{op}: fmt must be 'e4m3' or 'e2m1', got {fmt!r}")
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(IN_DTYPES))
    block_m, block_k = check_int_pair(op, 'block_size', block_size, (tuple, list))
    if block_m not in _BLOCK_SIZES or block_k not in _BLOCK_SIZES:
        raise ValueError(f'{op}: block_size must be (32 or 128, 32 or 128), got {tuple(block_size)}')
    col_major, round_sf, packed = check_sf_flags(op, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    # Precomputed scale factors are refused below if packed at all, so their rounding goes unchecked here.
    check_packed_ue8m0(op, packed, col_major, round_sf or mode == MODE_PRECOMPUTED)
    if mode == MODE_PRECOMPUTED and (col_major or packed):
        raise ValueError(f'{op}: precomputed scale factors must be row-major float32: '
                         'use_tma_aligned_col_major_sf and use_packed_ue8m0 must be False')
    num_tokens, hidden = x.shape
    if hidden % 16:
        raise ValueError(f'{op}: x must have hidden divisible by 16, got {hidden}')
    _checks.inner_contiguous(op, 'x', x)
    if num_tokens and not row_aligned(x, VECTOR_BYTES):
        raise ValueError(f'{op}: x must have a 16-byte aligned data pointer and row stride, got {x.data_ptr():#x} and strides {x.stride()}')
    num_rows, num_blocks = -(-num_tokens // block_m), -(-hidden // block_k)
    if mode == MODE_PRECOMPUTED:
        _checks.tensor(op, 'sf', sf, ndim=2, dtypes=(torch.float32,))
        if tuple(sf.shape) != (num_rows, num_blocks):
            raise ValueError(f'{op}: sf must have shape ({num_rows}, {num_blocks}) for x of shape {tuple(x.shape)} and block_size '
                             f'{(block_m, block_k)}, got {tuple(sf.shape)}')
        device = _checks.on_one_cuda_device(op, x=x, sf=sf)
    else:
        device = _checks.on_one_cuda_device(op, x=x)
    if num_tokens:
        kernel = find_kernel('quant.per_block_cast', per_block_cast_spec(x, fmt, (block_m, block_k), packed), device)
        check_grid_y(op, hidden, kernel.entry.constants['cta_columns'], 'x must have hidden')
    returned, sf_arg = (sf, sf) if mode == MODE_PRECOMPUTED else alloc_sf(num_rows, num_blocks, col_major, packed, x.device)
    out = alloc_quant_out(num_tokens, hidden, fmt, x.device)
    if num_tokens:
        kernel(device, {'x': x, 'out': out, 'out_sf': sf_arg}, {'round_sf': int(round_sf), 'mode': mode})
    return out, returned


def per_block_cast_spec(x: torch.Tensor, fmt: str, block_size: tuple[int, int], use_packed_ue8m0: bool) -> dict:
    """The spec that serves a (16-byte aligned) `x`: 32-byte vectors where its pointer and row stride are 32-byte
    aligned too."""
    return dict(in_dtype=IN_DTYPES[x.dtype], fmt=fmt, block_m=block_size[0], block_k=block_size[1], sf_format=sf_format(use_packed_ue8m0),
                vec_bytes=vector_bytes(x))


@_plans.launch_plan
def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Cast to FP8 (e4m3) or FP4 (e2m1) with one scale factor per ``block_size`` block of tokens x channels.

    Per block: ``clamped = max(amax, floor)``, ``sf = clamped / max`` and ``q = cast(x * (max / clamped))``,
    with max 448 and floor 1e-4 for e4m3 (saturating round-to-nearest) and max 6 and floor 6 * 2^-126 for
    e2m1 (round-to-nearest-even, saturating at 6); with ``round_sf`` the scale factor is rounded up to a
    power of two and the multiplier is its exact inverse. ``x ~= q * sf`` block by block. The last row and
    column blocks may be partial (num_tokens need not be a multiple of block_m, nor hidden of block_k).

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 or float32 CUDA tensor, contiguous in ``hidden`` (a multiple of
            16), with a 16-byte aligned data pointer and row stride (upstream requires a contiguous x).
        fmt: ``'e4m3'`` or ``'e2m1'``.
        block_size: ``(block_m, block_k)``, each 32 or 128; (128, 128) and (32, 32) are prebuilt.
        use_tma_aligned_col_major_sf: float32 scale factors column-major, the row-block dim padded to 4.
        round_sf: round scale factors up to powers of two.
        use_packed_ue8m0: four UE8M0 exponents per int32 (needs the column-major layout and round_sf); the
            bytes of a word past the last block are zero.

    Returns:
        ``(out, sf)``: ``out`` float8_e4m3fn ``[num_tokens, hidden]`` or int8 ``[num_tokens, hidden / 2]`` (e2m1,
        low nibble = even column), contiguous. With ``m = ceil(num_tokens / block_m)`` and ``b = ceil(hidden /
        block_k)``, ``sf`` is float32 ``[m, b]`` row-major, or column-major with strides ``(1, align(m, 4))``,
        or packed int32 ``[m, ceil(b / 4)]`` with strides ``(1, align(m, 4))``.
    """
    if is_compiling():
        return _custom_ops.per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _per_block_cast('per_block_cast', x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, MODE_CAST)


@_plans.launch_plan
def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """``per_block_cast(...)[1]`` without writing the data: only the scale factors, in the same layout."""
    if is_compiling():
        return _custom_ops.per_block_cast_with_sf_only(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _per_block_cast('per_block_cast_with_sf_only', x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                           MODE_SF_ONLY)[1]


@_plans.launch_plan
def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """Cast with given scale factors: ``q = cast(x * (1 / sf))`` block by block; returns only ``q``.

    ``sf`` is float32 ``[ceil(num_tokens / block_m), ceil(hidden / block_k)]`` in any strides (upstream:
    row-major). The layout flags must be False, as upstream; ``round_sf`` does not change the result (the
    scale factors are used as given).
    """
    if is_compiling():
        return _custom_ops.per_block_cast_with_precomputed_sf(x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf,
                                                              use_packed_ue8m0)
    return _per_block_cast('per_block_cast_with_precomputed_sf', x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                           use_packed_ue8m0, MODE_PRECOMPUTED, sf)[0]


@_plans.launch_plan
def per_block_cast_lossless(
    x: QuantTensor,
    fmt: str,
    x_block_size: tuple[int, int],
    out_block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Re-encode FP4 (e2m1) ``(data, sf)`` as FP8 (e4m3) with scale factors on larger blocks, without loss.

    With e_in the biased exponent of an input scale factor (the UE8M0 byte, or bits >> 23 of a float32,
    which must be a power of two for the result to be exact) and ``out_exp = max(e_in over the input
    blocks of an output block) - 6``, saturating at 0: the output scale factor is the power of two of biased
    exponent out_exp, and each element is ``e4m3(q * 2^(e_in - out_exp))``, exact, so dequantising the result
    gives the dequantised input bit for bit. The kernel device-asserts ``e_in + 5 >= out_exp`` (the input
    scale factors of an output block span at most 2^11), as upstream.

    Args:
        x: ``(data, sf)``: data int8 ``[num_tokens, hidden / 2]`` (e2m1 pairs, low nibble = even column),
            contiguous in its last dim, 8-byte aligned pointer and row stride, hidden a multiple of 16; sf
            float32 ``[ceil(num_tokens / x_block_size[0]), ceil(hidden / x_block_size[1])]`` in any strides,
            or packed UE8M0 int32 ``[ceil(num_tokens / x_block_size[0]), ceil(blocks / 4)]`` column-major
            (``stride(0) == 1``), as the casts return them.
        fmt: ``'e4m3'``.
        x_block_size: powers of two ``(bm, bk)``, bk >= 16, dividing ``out_block_size``; upstream uses (1, 32).
        out_block_size: (1, 128), (32, 32) or (128, 128) (prebuilt); also (1, 32), (32, 128), (128, 32) on request.
        use_tma_aligned_col_major_sf, use_packed_ue8m0: the output scale-factor layout, as per_block_cast.
        round_sf: no effect (the output scale factors are powers of two anyway), as upstream.

    Returns:
        ``(out, sf)``: out float8_e4m3fn ``[num_tokens, hidden]`` contiguous, sf as per_block_cast returns it
        for ``out_block_size``.
    """
    if is_compiling():
        return _custom_ops.per_block_cast_lossless(x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf,
                                                   use_packed_ue8m0)
    op = 'per_block_cast_lossless'
    check_e4m3(op, fmt, ' (lossless re-encoding is e2m1 -> e4m3 only)')
    data, sf = unpack_quant(op, x)
    _checks.tensor(op, 'data', data, ndim=2, dtypes=(torch.int8,))
    _checks.tensor(op, 'sf', sf, ndim=2, dtypes=(torch.float32, torch.int32))
    in_m, in_k = check_int_pair(op, 'x_block_size', x_block_size, (tuple, list))
    block_m, block_k = check_int_pair(op, 'out_block_size', out_block_size, (tuple, list))
    if block_m not in _LOSSLESS_BLOCK_MS or block_k not in _LOSSLESS_BLOCK_KS:
        raise ValueError(f'{op}: out_block_size must be (block_m, block_k) with block_m 1, 32 or 128 and block_k 32 or 128, '
                         f'got {tuple(out_block_size)}')
    if not (is_pow2(in_m) and is_pow2(in_k) and in_k >= 16 and block_m % in_m == 0 and block_k % in_k == 0):
        raise ValueError(f'{op}: x_block_size must be powers of two, the channel count at least 16, dividing out_block_size '
                         f'{(block_m, block_k)}, got {tuple(x_block_size)}')
    check_bool(op, 'round_sf', round_sf)
    col_major = check_bool(op, 'use_tma_aligned_col_major_sf', use_tma_aligned_col_major_sf)
    packed = check_bool(op, 'use_packed_ue8m0', use_packed_ue8m0)
    check_packed_ue8m0(op, packed, col_major)  # the output exponents are powers of two whatever round_sf says
    num_tokens, width = data.shape
    hidden = width * 2
    if hidden % 16:
        raise ValueError(f'{op}: data must have a logical hidden (2 x its width) divisible by 16, got {hidden}')
    _checks.inner_contiguous(op, 'data', data)
    if num_tokens and not row_aligned(data, 8):
        raise ValueError(f'{op}: data must have an 8-byte aligned data pointer and row stride, got {data.data_ptr():#x} and strides {data.stride()}')
    in_packed = check_input_sf(op, sf, -(-num_tokens // in_m), -(-hidden // in_k),
                               f'{num_tokens} tokens of {hidden} channels in blocks of {(in_m, in_k)}')
    device = _checks.on_one_cuda_device(op, data=data, sf=sf)
    if num_tokens:
        spec = dict(block_m=block_m, block_k=block_k, in_sf_format=sf_format(in_packed), sf_format=sf_format(packed))
        kernel = find_kernel('quant.per_block_cast_lossless', spec, device)
        check_grid_y(op, hidden, kernel.entry.constants['cta_columns'], 'data must have a logical hidden')
    num_rows, num_blocks = -(-num_tokens // block_m), -(-hidden // block_k)
    returned, sf_arg = alloc_sf(num_rows, num_blocks, col_major, packed, data.device)
    out = torch.empty((num_tokens, hidden), dtype=torch.float8_e4m3fn, device=data.device)
    if num_tokens:
        in_sf_arg = packed_sf_bytes(sf) if in_packed else sf
        scalars = dict(in_block_m_log2=in_m.bit_length() - 1, in_block_k_log2=in_k.bit_length() - 1)
        kernel(device, {'x': data, 'x_sf': in_sf_arg, 'out': out, 'out_sf': sf_arg}, scalars)
    return out, returned
