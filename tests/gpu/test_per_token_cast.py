import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference
from tile_kernels_aot.quant import per_token_cast_spec

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, calc_diff, check_unbiased, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu

DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32}


def input_for(spec: dict, num_tokens: int) -> torch.Tensor:
    """Strided rows either 16-byte aligned (aligned specs) or not (the element-wise variant)."""
    dtype, hidden = DTYPES[spec['in_dtype']], spec['hidden']
    offset, extra = (0, 64) if spec['aligned'] else (1, 1)
    base = torch.randn((num_tokens + 1) * (hidden + extra) + offset, device='cuda').to(dtype)
    x = base[offset:offset + num_tokens * (hidden + extra)].view(num_tokens, hidden + extra)[:, :hidden]
    if num_tokens:
        assert per_token_cast_spec(x, spec['num_per_channels'], spec['round_sf']) == spec, 'the op would pick another spec'
    return x


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_per_token_cast_bitwise(spec, num_tokens):
    npc, round_sf = spec['num_per_channels'], spec['round_sf']
    x = input_for(spec, num_tokens)
    num_blocks = -(-spec['hidden'] // npc)
    poison_allocator(((num_tokens, spec['hidden']), torch.float8_e4m3fn), ((num_tokens, num_blocks), torch.float32))
    out, sf = tile_kernels_aot.quant.per_token_cast(x, 'e4m3', npc, round_sf=round_sf)
    out_ref, sf_ref = reference.cast(x, 'e4m3', (1, npc), round_sf=round_sf)
    assert_bitwise_equal(out, out_ref)
    assert_bitwise_equal(sf, sf_ref)
    back = reference.cast_back((out, sf), 'fp32', (1, npc))
    assert calc_diff(back, x.float()) < 1e-3
    if num_tokens >= 63:
        check_unbiased(back, x.float())


def test_per_token_cast_saturates_and_handles_tiny_blocks():
    x = torch.randn((64, 7168), device='cuda', dtype=torch.bfloat16)
    x[0, :128] = 0  # amax 0 -> clamped to 1e-4
    x[1, 5] = 3e38  # huge outlier: the rest of its block underflows to 0
    x[2, 130:140] = -1e-30
    for round_sf in (False, True):
        out, sf = tile_kernels_aot.quant.per_token_cast(x, 'e4m3', 128, round_sf=round_sf)
        out_ref, sf_ref = reference.cast(x, 'e4m3', (1, 128), round_sf=round_sf)
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)
        assert torch.isfinite(out.float()).all()


def test_per_token_cast_rejects_bad_input():
    x = torch.randn((8, 7168), device='cuda', dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match='e2m1'):
        tile_kernels_aot.quant.per_token_cast(x, 'e2m1', 32)
    with pytest.raises(ValueError, match='fmt'):
        tile_kernels_aot.quant.per_token_cast(x, 'int8', 32)
    with pytest.raises(ValueError, match='num_per_channels'):
        tile_kernels_aot.quant.per_token_cast(x, 'e4m3', 48)
    with pytest.raises(TypeError, match='bfloat16 or float32'):
        tile_kernels_aot.quant.per_token_cast(x.half(), 'e4m3', 128)
    with pytest.raises(ValueError, match='last dimension'):
        tile_kernels_aot.quant.per_token_cast(torch.randn((7168, 64), device='cuda').t(), 'e4m3', 128)
    with pytest.raises(NotImplementedError, match='layouts'):
        tile_kernels_aot.quant.per_token_cast(x, 'e4m3', 128, use_tma_aligned_col_major_sf=True)
