"""transpose.transpose and transpose.batched_transpose (upstream TileKernels v1 names and signatures)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel, first_prebuilt

KERNEL = 'transpose.batched_transpose'
# Any dtype of 1, 2 or 4 bytes: the kernel moves 32-bit words and is specialised on the element size.
DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8, torch.bfloat16, torch.float16,
          torch.int16, torch.float32, torch.int32)
WORD = 4


@_plans.launch_plan
def transpose(x: torch.Tensor) -> torch.Tensor:
    """Transpose a 2-D tensor.

    Args:
        x: ``[M, N]`` CUDA tensor of 1, 2 or 4-byte elements (e4m3, bf16, fp32, ...), ``M`` and ``N``
            multiples of 64, contiguous in its last dimension; the row stride may be larger than ``N``
            (a multiple of 4 bytes).

    Returns:
        The contiguous ``[N, M]`` transpose, same dtype.
    """
    if is_compiling():
        return _custom_ops.transpose(x)
    _checks.tensor('transpose', 'x', x, ndim=2, dtypes=DTYPES)
    return _batched_transpose('transpose', x.unsqueeze(0)).squeeze(0)


@_plans.launch_plan
def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """Transpose the last two dimensions of a 3-D tensor.

    Args:
        x: ``[B, M, N]`` CUDA tensor, constraints as for :func:`transpose`; the batch stride is free too.

    Returns:
        The contiguous ``[B, N, M]`` tensor, same dtype.
    """
    if is_compiling():
        return _custom_ops.batched_transpose(x)
    _checks.tensor('batched_transpose', 'x', x, ndim=3, dtypes=DTYPES)
    return _batched_transpose('batched_transpose', x)


def _batched_transpose(op: str, x: torch.Tensor) -> torch.Tensor:
    num_batches, num_rows, num_cols = x.shape
    if num_rows % 64 or num_cols % 64:
        raise ValueError(f'{op}: x must have both transposed dimensions divisible by 64, got {num_rows} x {num_cols}')
    _checks.inner_contiguous(op, 'x', x)
    elem_bytes = x.element_size()
    if x.numel() and address_bits(x) % WORD:
        raise ValueError(f'{op}: x must have its data pointer and row (and batch) strides 4-byte aligned, '
                         f'got pointer {x.data_ptr():#x}, strides {x.stride()} of {elem_bytes}-byte elements')
    device = _checks.on_one_cuda_device(op, x=x)
    out = x.new_empty((num_batches, num_cols, num_rows))
    if out.numel() == 0:
        return out
    # The batch stride of a single batch never addresses memory: pass 0 so that any value works.
    words = x.as_strided(x.shape, (x.stride(0) if num_batches > 1 else 0, x.stride(1), 1)).view(torch.uint32)
    find_kernel(KERNEL, spec_for(x), device)(device, {'x': words, 'out': out.view(torch.uint32)})
    return out


def address_bits(x: torch.Tensor) -> int:
    """OR of the data pointer and the byte strides that address memory: its lowest set bit is the
    alignment every access of the transpose can rely on."""
    elem_bytes = x.element_size()
    batch_stride = x.stride(0) * elem_bytes if x.shape[0] > 1 else 0
    return x.data_ptr() | x.stride(1) * elem_bytes | batch_stride


def spec_for(x: torch.Tensor) -> dict:
    """The spec that serves a (B, M, N) input: the widest vectors its alignment allows, on the largest
    tiles its shape allows, among the prebuilt ones."""
    elem_bytes, (_, num_rows, num_cols) = x.element_size(), x.shape
    bits = address_bits(x)
    alignment = min(bits & -bits, 16)
    candidates = [
        dict(elem_bytes=elem_bytes, vec_bytes=vec_bytes, tile_m=tile_m, tile_n=tile_n)
        for vec_bytes in (16, 8, 4) if elem_bytes <= vec_bytes <= alignment
        for tile_m, tile_n in ((128, 128), (64, 64)) if num_rows % tile_m == 0 and num_cols % tile_n == 0
    ]
    return first_prebuilt(KERNEL, candidates, x.device.index)
