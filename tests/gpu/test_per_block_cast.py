import random

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference
from tile_kernels_aot.quant.per_block import per_block_cast_spec

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, calc_diff, check_unbiased, installed_specs, installed_values, poison_allocator

pytestmark = pytest.mark.gpu

DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32}
HIDDEN_SIZES = (576, 7168)  # 576: a partial last column block for block_k 128 (and for the 256-column CTA slices)
quant = tile_kernels_aot.quant


def sf_configs(spec: dict) -> list:
    """(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) that the spec serves; upstream tests
    (False, True, False) and (True, True, True)."""
    if spec['sf_format'] == 'ue8m0':
        return [(True, True, True)]
    return [(False, True, False), (False, False, False), (True, False, False)]


def strided_input(num_tokens: int, hidden: int, dtype: torch.dtype, pad: int = 0, vec_bytes: int = 32) -> torch.Tensor:
    """Rows of hidden + pad elements (a multiple of 32 bytes) from a pointer 32-byte aligned (vec_bytes 32), or 16 bytes
    past such a boundary (vec_bytes 16), so that the op takes that spec."""
    offset = 0 if vec_bytes == 32 else 16 // dtype.itemsize
    base = torch.randn(num_tokens * (hidden + pad) + offset, device='cuda', dtype=dtype)
    return base[offset:].view(num_tokens, hidden + pad)[:, :hidden]


@pytest.mark.parametrize('spec', installed_specs('quant.per_block_cast'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_per_block_cast_bitwise(spec, num_tokens):
    dtype, fmt, block = DTYPES[spec['in_dtype']], spec['fmt'], (spec['block_m'], spec['block_k'])
    for hidden in HIDDEN_SIZES:
        x = strided_input(num_tokens, hidden, dtype, vec_bytes=spec['vec_bytes'])
        if num_tokens:
            assert per_block_cast_spec(x, fmt, block, spec['sf_format'] == 'ue8m0') == spec, 'the op would pick another spec'
        num_rows, num_blocks = -(-num_tokens // block[0]), -(-hidden // block[1])
        out_shape = (num_tokens, hidden // 2 if fmt == 'e2m1' else hidden)
        out_dtype = torch.int8 if fmt == 'e2m1' else torch.float8_e4m3fn
        for col_major, round_sf, packed in sf_configs(spec):
            args = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
            poison_allocator((out_shape, out_dtype), ((num_rows + 4, num_blocks + 4), torch.float32))
            out, sf = quant.per_block_cast(x, fmt, block, **args)
            out_ref, sf_ref = reference.per_block_cast(x, fmt, block, **args)
            assert_bitwise_equal(out, out_ref)
            assert_bitwise_equal(sf, sf_ref)  # packed: the unused bytes of the last word are zero in both
            assert_bitwise_equal(quant.per_block_cast_with_sf_only(x, fmt, block, **args), sf_ref)
            if not col_major:
                poison_allocator((out_shape, out_dtype))
                assert_bitwise_equal(quant.per_block_cast_with_precomputed_sf(x, fmt, block, sf, **args),
                                     reference.per_block_cast_with_precomputed_sf(x, fmt, block, sf, **args))
            if num_tokens >= 63:
                back = reference.cast_back((out, sf), 'fp32', block)
                if fmt == 'e4m3':
                    assert calc_diff(back, x.float()) < 2e-3  # a sanity check: the bitwise comparison above is the test
                check_unbiased(back, x.float())


@pytest.mark.parametrize('spec', installed_specs('quant.per_block_cast'))
def test_per_block_cast_strided_rows(spec):
    """A row stride larger than hidden (16-byte aligned): upstream needs a contiguous x, we do not."""
    dtype, fmt, block = DTYPES[spec['in_dtype']], spec['fmt'], (spec['block_m'], spec['block_k'])
    col_major, round_sf, packed = sf_configs(spec)[0]
    args = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
    x = strided_input(4001, 2048, dtype, pad=64, vec_bytes=spec['vec_bytes'])
    assert per_block_cast_spec(x, fmt, block, packed) == spec
    out, sf = quant.per_block_cast(x, fmt, block, **args)
    out_ref, sf_ref = reference.per_block_cast(x.contiguous(), fmt, block, **args)
    assert_bitwise_equal(out, out_ref)
    assert_bitwise_equal(sf, sf_ref)


# Values on the rounding ties of each grid (and its max, so that a block holding only these has multiplier 1):
# e2m1 midpoints between 0, 0.5, 1, 1.5, 2, 3, 4, 6; e4m3 midpoints of its 3-bit mantissa at several exponents.
TIES = {
    'e2m1': (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, 6.0, 0.0, -0.0, 0.1, -5.0, 5.5, -6.0),
    'e4m3': (1.0625, 1.1875, 1.3125, -1.4375, 0.0625 * 1.0625, 2**-7, 2**-10, -(2**-10) * 1.5, 448.0, 432.0, -272.0, 0.0,
             -0.0, 17.0, 19.0, -21.0),
}


@pytest.mark.parametrize('fmt, block_m, block_k', installed_values('quant.per_block_cast', 'fmt', 'block_m', 'block_k'))
def test_per_block_cast_special_values(fmt, block_m, block_k):
    """Zero blocks (amax clamped to the floor), a huge outlier, tiny values, and whole blocks of values on
    the rounding ties (amax = the format's max, so the multiplier is 1 with and without round_sf)."""
    bm, bk = block = (block_m, block_k)
    x = torch.randn((4 * bm, 1024), device='cuda', dtype=torch.float32)
    x[:bm, :bk] = 0
    x[0, 200] = 3e38
    x[-1, 130:140] = -1e-30
    ties = torch.tensor(TIES[fmt], device='cuda')
    x[bm:2 * bm, :256] = ties.repeat(16)  # every row segment of a block holds all of them, max included
    for round_sf in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            out, sf = quant.per_block_cast(x.to(dtype), fmt, block, round_sf=round_sf)
            out_ref, sf_ref = reference.per_block_cast(x.to(dtype), fmt, block, round_sf=round_sf)
            assert_bitwise_equal(out, out_ref)
            assert_bitwise_equal(sf, sf_ref)


def test_per_block_cast_rejects_bad_input():
    x = torch.randn((64, 7168), device='cuda', dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='fmt'):
        quant.per_block_cast(x, 'int8', (128, 128))
    with pytest.raises(ValueError, match='block_size'):
        quant.per_block_cast(x, 'e4m3', (64, 64))
    with pytest.raises(TypeError, match='block_size'):
        quant.per_block_cast(x, 'e4m3', 128)
    with pytest.raises(TypeError, match='bfloat16 or float32'):
        quant.per_block_cast(x.half(), 'e4m3', (128, 128))
    with pytest.raises(ValueError, match='hidden divisible by 16'):
        quant.per_block_cast(torch.randn((64, 72), device='cuda'), 'e4m3', (128, 128))
    with pytest.raises(ValueError, match='last dimension'):
        quant.per_block_cast(torch.randn((7168, 64), device='cuda').t(), 'e4m3', (128, 128))
    with pytest.raises(ValueError, match='16-byte aligned'):
        quant.per_block_cast(torch.randn((64, 7168 + 1), device='cuda')[:, 1:], 'e4m3', (128, 128))
    with pytest.raises(ValueError, match='use_tma_aligned_col_major_sf'):
        quant.per_block_cast(x, 'e4m3', (128, 128), round_sf=True, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match='round_sf'):
        quant.per_block_cast(x, 'e4m3', (128, 128), use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    with pytest.raises(TypeError, match='round_sf'):
        quant.per_block_cast(x, 'e4m3', (128, 128), round_sf=1)
    sf = quant.per_block_cast_with_sf_only(x, 'e4m3', (128, 128))
    with pytest.raises(ValueError, match='sf must have shape'):
        quant.per_block_cast_with_precomputed_sf(x, 'e4m3', (32, 32), sf)
    with pytest.raises(ValueError, match='row-major'):
        quant.per_block_cast_with_precomputed_sf(x, 'e4m3', (128, 128), sf, use_tma_aligned_col_major_sf=True)
    with pytest.raises(TypeError, match='sf must be float32'):
        quant.per_block_cast_with_precomputed_sf(x, 'e4m3', (128, 128), sf.double())
    with pytest.raises(ValueError, match='CUDA'):
        quant.per_block_cast(x.cpu(), 'e4m3', (128, 128))


# -- per_block_cast_lossless ----------------------------------------------------------------------------


def clamp_abs_ratio(t: torch.Tensor, max_ratio: float = 2**9) -> torch.Tensor:
    """Lift every |value| to at least max|t| / max_ratio, so no output block spans more than e2m1 + e4m3
    can hold (upstream's test data)."""
    if t.numel() == 0:
        return t
    floor = t.abs().max() / max_ratio
    return torch.sign(t) * torch.max(t.abs(), floor)


def fp4_input(num_tokens: int, hidden: int, in_sf_format: str, col_major: bool = True, round_sf: bool = True):
    """e2m1 data with (1, 32) scale factors at a random overall exponent, as upstream's generate_rand_float."""
    x = torch.randn((num_tokens, hidden), device='cuda') * float(2 ** random.randint(-110, 126))
    x = clamp_abs_ratio(torch.nan_to_num(x).clamp(-torch.finfo(torch.float32).max / 8, torch.finfo(torch.float32).max / 8))
    packed = in_sf_format == 'ue8m0'
    return reference.cast(x, 'e2m1', (1, 32), round_sf=round_sf, use_tma_aligned_col_major_sf=col_major or packed, use_packed_ue8m0=packed)


@pytest.mark.parametrize('spec', installed_specs('quant.per_block_cast_lossless'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_per_block_cast_lossless(spec, num_tokens):
    block = (spec['block_m'], spec['block_k'])
    packed = spec['sf_format'] == 'ue8m0'
    args = dict(use_tma_aligned_col_major_sf=packed or num_tokens % 2 == 1, round_sf=True, use_packed_ue8m0=packed)
    in_layouts = (True,) if spec['in_sf_format'] == 'ue8m0' else (False, True)  # float32 input sf: row- or column-major
    for hidden in HIDDEN_SIZES:
        for in_col_major in in_layouts:
            x_fp4 = fp4_input(num_tokens, hidden, spec['in_sf_format'], in_col_major)
            poison_allocator(((num_tokens, hidden), torch.float8_e4m3fn))
            out, sf = quant.per_block_cast_lossless(x_fp4, 'e4m3', (1, 32), block, **args)
            out_ref, sf_ref = reference.per_block_cast_lossless(x_fp4, 'e4m3', (1, 32), block, **args)
            assert_bitwise_equal(out, out_ref)
            assert_bitwise_equal(sf, sf_ref)
            # Upstream's test: dequantising the result gives the dequantised input, bit for bit.
            assert_bitwise_equal(reference.cast_back((out, sf), 'fp32', block), reference.cast_back(x_fp4, 'fp32', (1, 32)))


@pytest.mark.parametrize('block_m, block_k', installed_values('quant.per_block_cast_lossless', 'block_m', 'block_k'))
def test_per_block_cast_lossless_unrounded_sf_as_upstream(block_m, block_k):
    """Float32 input scale factors that are not powers of two: only their exponent bits count, as upstream
    (the cast is then not lossless, but it is the same)."""
    block = (block_m, block_k)
    x_fp4 = fp4_input(4001, 2048, 'f32', col_major=False, round_sf=False)
    out, sf = quant.per_block_cast_lossless(x_fp4, 'e4m3', (1, 32), block)
    out_ref, sf_ref = reference.per_block_cast_lossless(x_fp4, 'e4m3', (1, 32), block)
    assert_bitwise_equal(out, out_ref)
    assert_bitwise_equal(sf, sf_ref)


def test_per_block_cast_lossless_rejects_bad_input():
    data, sf = fp4_input(64, 7168, 'f32', col_major=False)
    with pytest.raises(ValueError, match="fmt must be 'e4m3'"):
        quant.per_block_cast_lossless((data, sf), 'e2m1', (1, 32), (1, 128))
    with pytest.raises(TypeError, match='x must be a'):
        quant.per_block_cast_lossless(data, 'e4m3', (1, 32), (1, 128))
    with pytest.raises(TypeError, match='data must be int8'):
        quant.per_block_cast_lossless((data.view(torch.uint8), sf), 'e4m3', (1, 32), (1, 128))
    with pytest.raises(ValueError, match='out_block_size'):
        quant.per_block_cast_lossless((data, sf), 'e4m3', (1, 32), (64, 64))
    with pytest.raises(ValueError, match='x_block_size'):
        quant.per_block_cast_lossless((data, sf), 'e4m3', (1, 48), (1, 128))
    with pytest.raises(ValueError, match='x_block_size'):
        quant.per_block_cast_lossless((data, sf), 'e4m3', (2, 32), (1, 128))
    with pytest.raises(ValueError, match='sf must have shape'):
        quant.per_block_cast_lossless((data, sf[:, :-1]), 'e4m3', (1, 32), (1, 128))
    with pytest.raises(ValueError, match='use_tma_aligned_col_major_sf'):
        quant.per_block_cast_lossless((data, sf), 'e4m3', (1, 32), (1, 128), use_packed_ue8m0=True)
    with pytest.raises(ValueError, match='8-byte aligned'):
        quant.per_block_cast_lossless((data.view(-1)[4:4 + 63 * 3584].view(63, 3584), sf[:63]), 'e4m3', (1, 32), (1, 128))
    with pytest.raises(ValueError, match='CUDA'):
        quant.per_block_cast_lossless((data.cpu(), sf.cpu()), 'e4m3', (1, 32), (1, 128))
