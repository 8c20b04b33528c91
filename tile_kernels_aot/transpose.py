"""transpose.transpose and transpose.batched_transpose (upstream TileKernels v1 names and signatures)."""

from __future__ import annotations

import functools

import torch

from tile_kernels_aot import _checks
from tile_kernels_aot._select import find_kernel, has_spec

KERNEL = 'transpose.batched_transpose'
# Any dtype of 1, 2 or 4 bytes: the kernel moves 32-bit words and is specialised on the element size.
DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8, torch.bfloat16, torch.float16,
          torch.int16, torch.float32, torch.int32)
WORD = 4


def transpose(x: torch.Tensor) -> torch.Tensor:
    """Transpose a 2-D tensor.

    Args:
        x: ``[M, N]`` CUDA tensor of 1, 2 or 4-byte elements (e4m3, bf16, fp32, ...), ``M`` and ``N``
            multiples of 64, contiguous in its last dimension; the row stride may be larger than ``N``
            (a multiple of 4 bytes).

    Returns:
        The contiguous ``[N, M]`` transpose, same dtype.
    """
    _checks.tensor('transpose', 'x', x, ndim=2, dtypes=DTYPES)
    return _batched_transpose('transpose', x.unsqueeze(0)).squeeze(0)


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """Transpose the last two dimensions of a 3-D tensor.

    Args:
        x: ``[B, M, N]`` CUDA tensor, constraints as for :func:`transpose`; the batch stride is free too.

    Returns:
        The contiguous ``[B, N, M]`` tensor, same dtype.
    """
    _checks.tensor('batched_transpose', 'x', x, ndim=3, dtypes=DTYPES)
    return _batched_transpose('batched_transpose', x)


def _batched_transpose(op: str, x: torch.Tensor) -> torch.Tensor:
    num_batches, num_rows, num_cols = x.shape
    if num_rows % 64 or num_cols % 64:
        raise ValueError(f'{op}: x must have both transposed dimensions divisible by 64, got {num_rows} x {num_cols}')
    _checks.inner_contiguous(op, 'x', x)
    elem_bytes = x.element_size()
    batch_stride = x.stride(0) * elem_bytes if num_batches > 1 else 0
    row_stride = x.stride(1) * elem_bytes
    if x.numel() and (x.data_ptr() | row_stride | batch_stride) % WORD:
        raise ValueError(f'{op}: x must have its data pointer and row (and batch) strides 4-byte aligned, '
                         f'got pointer {x.data_ptr():#x}, strides {x.stride()} of {elem_bytes}-byte elements')
    device = _checks.on_one_cuda_device(op, x=x)
    out = torch.empty((num_batches, num_cols, num_rows), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    address_bits = x.data_ptr() | row_stride | batch_stride
    alignment = min(address_bits & -address_bits, 16)  # the largest power of two dividing all three
    params = _choose_spec(elem_bytes, alignment, num_rows % 128 == 0, num_cols % 128 == 0, device)
    words = x.as_strided(x.shape, (batch_stride // elem_bytes, x.stride(1), 1)).view(torch.uint32)
    find_kernel(KERNEL, params, device)(device, {'x': words, 'out': out.view(torch.uint32)})
    return out


@functools.cache
def _choose_spec(elem_bytes: int, alignment: int, rows_128: bool, cols_128: bool, device: int) -> dict:
    """The widest vectors the input's alignment allows, on the largest tiles its shape allows."""
    candidates = [
        dict(elem_bytes=elem_bytes, vec_bytes=vec_bytes, tile_m=tile_m, tile_n=tile_n)
        for vec_bytes in (16, 8, 4) if elem_bytes <= vec_bytes <= alignment
        for tile_m, tile_n in ((128, 128), (64, 64)) if (rows_128 or tile_m == 64) and (cols_128 or tile_n == 64)
    ]
    for params in candidates:
        if has_spec(KERNEL, params, device):
            return params
    return candidates[0]  # find_kernel raises SpecNotPrebuiltError for it, naming the nearest prebuilt specs
