import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference
from tile_kernels_aot.transpose import spec_for

from .helpers import assert_bitwise_equal, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu

DTYPE_OF_SIZE = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}
# Row counts play the role of token counts (a transpose needs multiples of 64: see
# test_rejects_bad_shapes_and_layouts). 128-tile specs get 128-multiples; 64-tile specs get shapes with a
# 64 remainder, which is what makes the op choose them.
ROWS = {128: (0, 128, 4096, 8192), 64: (0, 64, 4032, 8128)}
COLS = {128: 7168, 64: 7104}


def random_tensor(shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, device='cuda').to(dtype)
    return torch.randint(-100, 100, shape, device='cuda', dtype=dtype)


def input_for(spec: dict, rows: int, cols: int, batches: int) -> torch.Tensor:
    """A (B, M, N) view whose row (and batch) strides are aligned to exactly spec['vec_bytes'] bytes."""
    dtype = DTYPE_OF_SIZE[spec['elem_bytes']]
    pad = spec['vec_bytes'] // spec['elem_bytes']
    row_stride = cols + pad
    batch_stride = rows * row_stride + (pad if batches > 1 else 0)
    base = random_tensor((batches * batch_stride + row_stride,), dtype)
    return base.as_strided((batches, rows, cols), (batch_stride, row_stride, 1))


@pytest.mark.parametrize('spec', installed_specs('transpose.batched_transpose'))
@pytest.mark.parametrize('row_case', range(4))
@pytest.mark.parametrize('batches', (1, 3))
def test_batched_transpose_bitwise(spec, row_case, batches):
    rows, cols = ROWS[spec['tile_m']][row_case], COLS[spec['tile_n']]
    x = input_for(spec, rows, cols, batches)
    if rows:
        assert spec_for(x) == spec, f'the op would choose {spec_for(x)} for this input, not the spec under test'
    poison_allocator(((batches, cols, rows), x.dtype))
    out = tile_kernels_aot.transpose.batched_transpose(x)
    assert_bitwise_equal(out, reference.batched_transpose(x))
    if batches == 1:
        poison_allocator(((cols, rows), x.dtype))
        assert_bitwise_equal(tile_kernels_aot.transpose.transpose(x[0]), reference.transpose(x[0]))


@pytest.mark.parametrize('dtype', [torch.float16, torch.int16, torch.int8, torch.int32, torch.float8_e5m2])
def test_transpose_other_dtypes_of_the_same_sizes(dtype):
    x = random_tensor((256, 192), dtype)
    assert_bitwise_equal(tile_kernels_aot.transpose.transpose(x), x.t().contiguous())


def test_rejects_bad_shapes_and_layouts():
    x = torch.randn(100, 128, device='cuda', dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='divisible by 64'):
        tile_kernels_aot.transpose.transpose(x)
    with pytest.raises(ValueError, match='last dimension'):
        tile_kernels_aot.transpose.transpose(torch.randn(128, 128, device='cuda').t())
    with pytest.raises(ValueError, match='4-byte aligned'):
        tile_kernels_aot.transpose.transpose(torch.randn(64, 130, device='cuda').to(torch.float8_e4m3fn)[:, 1:129][:, :64])
    with pytest.raises(TypeError, match='must be'):
        tile_kernels_aot.transpose.transpose(torch.zeros(64, 64, device='cuda', dtype=torch.float64))
    with pytest.raises(ValueError, match='3 dimensions'):
        tile_kernels_aot.transpose.batched_transpose(x)
