import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, calc_diff, check_unbiased, installed_specs, installed_values, poison_allocator

pytestmark = pytest.mark.gpu

OUT_DTYPES = {'bfloat16': 'bf16', 'float32': 'fp32'}
HIDDEN_SIZES = (576, 2880, 7168)  # see test_per_token_cast.py
ROUND_TRIP_BOUND = {'e4m3': 1e-3, 'e2m1': 2e-2}


def layouts(spec: dict) -> list[tuple[bool, bool, bool]]:
    """(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) of the scale factors the spec reads."""
    if spec['sf_format'] == 'ue8m0':
        return [(True, True, True)]
    return [(False, False, False), (False, True, False), (True, True, False)]


@pytest.mark.parametrize('hidden', HIDDEN_SIZES)
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('spec', installed_specs('quant.cast_back'))
def test_per_token_cast_back_bitwise(spec, num_tokens, hidden):
    fmt, out_fmt = spec['fmt'], OUT_DTYPES[spec['out_dtype']]
    x = torch.randn((num_tokens, hidden), device='cuda', dtype=getattr(torch, spec['out_dtype']))
    for npc in (16, 32, 128, hidden):
        for col_major, round_sf, packed in layouts(spec):
            data, sf = reference.cast(x, fmt, (1, npc), round_sf=round_sf, use_tma_aligned_col_major_sf=col_major, use_packed_ue8m0=packed)
            poison_allocator(((num_tokens, hidden), x.dtype))
            back = tile_kernels_aot.quant.per_token_cast_back((data, sf), out_fmt, npc)
            assert_bitwise_equal(back, reference.cast_back((data, sf), out_fmt, (1, npc)))
            assert_bitwise_equal(tile_kernels_aot.quant.cast_back((data, sf), out_fmt, (1, npc)), back)
            assert calc_diff(back, x) < ROUND_TRIP_BOUND[fmt]
            if num_tokens >= 63:
                check_unbiased(back.float(), x.float())


@pytest.mark.parametrize('block', ((32, 32), (128, 128), (128, 32)))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('spec', installed_specs('quant.cast_back'))
def test_cast_back_of_token_blocks(spec, num_tokens, block):
    """Scale factors shared by blocks of tokens (per_block_cast's layouts): sf row = token // block[0]."""
    fmt, out_fmt = spec['fmt'], OUT_DTYPES[spec['out_dtype']]
    x = torch.randn((num_tokens, 7168), device='cuda', dtype=getattr(torch, spec['out_dtype']))
    for col_major, round_sf, packed in layouts(spec):
        data, sf = reference.cast(x, fmt, block, round_sf=round_sf, use_tma_aligned_col_major_sf=col_major, use_packed_ue8m0=packed)
        poison_allocator(((num_tokens, 7168), x.dtype))
        back = tile_kernels_aot.quant.cast_back((data, sf), out_fmt, block)
        assert_bitwise_equal(back, reference.cast_back((data, sf), out_fmt, block))
        if fmt == 'e4m3':
            assert calc_diff(back, x) < 2e-3  # a sanity check (as test_per_block_cast): the bitwise comparison is the test


@pytest.mark.parametrize('fmt', installed_values('quant.cast_back', 'fmt'))
def test_cast_back_of_the_op_output(fmt):
    """Upstream's round trip: per_token_cast with each layout, then per_token_cast_back."""
    x = torch.randn((4001, 7168), device='cuda', dtype=torch.bfloat16)
    for npc in (128, 7168):
        for col_major, round_sf, packed in ((False, True, False), (True, True, True)):
            q = tile_kernels_aot.quant.per_token_cast(x, fmt, npc, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
            for out_fmt in ('bf16', 'fp32'):
                back = tile_kernels_aot.quant.per_token_cast_back(q, out_fmt, npc)
                assert_bitwise_equal(back, reference.cast_back(q, out_fmt, (1, npc)))
                assert calc_diff(back, x) < ROUND_TRIP_BOUND[fmt]


def test_cast_back_rejects_bad_input():
    data = torch.zeros((8, 7168), device='cuda', dtype=torch.float8_e4m3fn)
    sf = torch.ones((8, 56), device='cuda')
    op = tile_kernels_aot.quant
    with pytest.raises(ValueError, match="fmt must be 'bf16' or 'fp32'"):
        op.cast_back((data, sf), 'fp16', (1, 128))
    with pytest.raises(ValueError, match='power of two'):
        op.cast_back((data, torch.ones((1, 56), device='cuda')), 'bf16', (96, 128))
    with pytest.raises(ValueError, match=r'sf must have shape \(1, 56\)'):
        op.cast_back((data, sf), 'bf16', (128, 128))
    with pytest.raises(TypeError, match='uint8'):  # E5M6 data is packed uint8
        op.cast_back((data, sf), 'bf16', (1, 128), x_special_fmt='e5m6')
    with pytest.raises(ValueError, match='sf must have shape'):
        op.per_token_cast_back((data, sf), 'bf16', 32)
    with pytest.raises(ValueError, match='multiple of 16'):
        op.per_token_cast_back((data, sf), 'bf16', 24)
    with pytest.raises(TypeError, match='data must be float8_e4m3fn or int8'):
        op.per_token_cast_back((data.float(), sf), 'bf16', 128)
    with pytest.raises(ValueError, match='column-major'):
        op.per_token_cast_back((data, torch.ones((8, 14), dtype=torch.int32, device='cuda')), 'bf16', 128)
    with pytest.raises(ValueError, match='data must be contiguous'):
        op.per_token_cast_back((torch.zeros((8, 7296), device='cuda', dtype=torch.float8_e4m3fn)[:, :7168], sf), 'bf16', 128)
