"""quant.per_channel_cast, per_channel_cast_fused (gather, e4m3 input) and per_channel_cast_and_transpose: bit
for bit against tile_kernels_aot.reference (data, scale factors, shapes, strides), for every installed
spec, the token counts the op allows nearest to TOKEN_COUNTS, and every model hidden size the op's
alignment rule allows; argument errors before any launch."""

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, calc_diff, check_unbiased, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu

# kernel_src/models.py hidden_sizes(): the models' hidden sizes and upstream's test list (all multiples of 64;
# the e4m3-input path needs multiples of 128). The hidden size is a run-time argument of every binary.
HIDDEN_SIZES = (576, 2048, 2560, 2880, 3072, 4096, 5120, 6144, 7168)
DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32}
# Token counts: TOKEN_COUNTS rounded up to what the op allows (multiples of 128; of 16 with a gather).
ALIGNED_TOKENS = tuple(sorted({-(-t // 128) * 128 for t in TOKEN_COUNTS}))


def allowed_tokens(num_tokens: int, gather: bool) -> int:
    alignment = 16 if gather else 128
    return -(-num_tokens // alignment) * alignment


def spec_inputs(spec: dict, num_tokens_out: int, hidden: int):
    """(x, num_per_channels, pos_to_token) for a fused spec: the gather reads 4001 input rows (each of them
    several times, as an expanded MoE layout does) with every 5th position -1."""
    gather = spec['gather']
    num_tokens = 4001 if gather else num_tokens_out
    x = torch.randn((num_tokens, hidden), device='cuda') * 4
    if spec['in_dtype'] == 'float8_e4m3fn':
        x = reference.cast(x.bfloat16(), 'e4m3', (1, 128))
        npc = 128
    else:
        x, npc = x.to(DTYPES[spec['in_dtype']]), None
    pos = None
    if gather:
        pos = torch.randint(0, num_tokens, (num_tokens_out,), dtype=torch.int32, device='cuda')
        pos[::5] = -1
    return x, npc, pos


def hidden_sizes_for(spec: dict):
    return [h for h in HIDDEN_SIZES if h % (128 if spec['in_dtype'] == 'float8_e4m3fn' else 64) == 0]


@pytest.mark.parametrize('spec', installed_specs('quant.per_channel_cast_fused'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('round_sf', (False, True))
def test_per_channel_cast_fused_bitwise(spec, num_tokens, round_sf):
    num_tokens_out = allowed_tokens(num_tokens, spec['gather'])
    for hidden in hidden_sizes_for(spec):
        x, npc, pos = spec_inputs(spec, num_tokens_out, hidden)
        poison_allocator(((num_tokens_out, hidden), torch.float8_e4m3fn), ((-(-num_tokens_out // 128), hidden), torch.float32))
        out, sf = tile_kernels_aot.quant.per_channel_cast_fused(x, 'e4m3', 128, round_sf=round_sf, num_per_channels=npc, pos_to_token=pos)
        out_ref, sf_ref = reference.per_channel_cast_fused(x, 128, npc, round_sf, pos)
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)


@pytest.mark.parametrize('num_tokens', ALIGNED_TOKENS)
@pytest.mark.parametrize('hidden', HIDDEN_SIZES)
@pytest.mark.parametrize('round_sf', (False, True))
def test_per_channel_cast_bitwise_and_unbiased(num_tokens, hidden, round_sf):
    x = torch.randn((num_tokens, hidden), device='cuda').bfloat16()
    out, sf = tile_kernels_aot.quant.per_channel_cast(x, 'e4m3', 128, round_sf)
    out_ref, sf_ref = reference.per_channel_cast(x, 128, round_sf)
    assert_bitwise_equal(out, out_ref)
    assert_bitwise_equal(sf, sf_ref)
    # The same as the generic block cast of (128, 1) blocks (upstream's own test compares with that).
    out_cast, sf_cast = reference.cast(x, 'e4m3', (128, 1), round_sf=round_sf)
    assert_bitwise_equal(out, out_cast)
    assert_bitwise_equal(sf, sf_cast)
    back = reference.cast_back((out, sf), 'fp32', (128, 1))
    if num_tokens:
        assert calc_diff(back, x.float()) < 1e-3
        check_unbiased(back, x.float())


@pytest.mark.parametrize('spec', installed_specs('quant.per_channel_cast_and_transpose'))
@pytest.mark.parametrize('num_tokens', ALIGNED_TOKENS)
@pytest.mark.parametrize('round_sf', (False, True))
def test_per_channel_cast_and_transpose_bitwise(spec, num_tokens, round_sf):
    npt = spec['num_per_tokens']
    for hidden in HIDDEN_SIZES:
        x = torch.randn((num_tokens, hidden), device='cuda').bfloat16()
        poison_allocator(((hidden, num_tokens), torch.float8_e4m3fn), ((num_tokens // npt, hidden), torch.float32))
        out, sf = tile_kernels_aot.quant.per_channel_cast_and_transpose(x, 'e4m3', npt, round_sf)
        out_ref, sf_ref = reference.per_channel_cast_and_transpose(x, npt, round_sf)
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)
        assert out.shape == (hidden, num_tokens) and out.is_contiguous()


def test_per_channel_cast_strided_rows_and_special_values():
    """A row stride wider than hidden, a zero column (amax clamped to 1e-4), huge and tiny outliers."""
    base = torch.randn((512, 7168 + 64), device='cuda').bfloat16()
    x = base[:, 32:32 + 7168]
    x[:, 0] = 0
    x[5, 1] = 3e38
    x[7, 2:10] = -1e-30
    for round_sf in (False, True):
        out, sf = tile_kernels_aot.quant.per_channel_cast(x, 'e4m3', 128, round_sf)
        out_ref, sf_ref = reference.per_channel_cast(x, 128, round_sf)
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)
        assert torch.isfinite(out.float()).all()


def test_per_channel_cast_fused_gather_all_negative_and_one_input_row():
    x = torch.randn((1, 2048), device='cuda').bfloat16()
    pos = torch.full((48,), -1, dtype=torch.int32, device='cuda')
    pos[3] = 0
    for p in (pos, torch.full_like(pos, -1)):
        out, sf = tile_kernels_aot.quant.per_channel_cast_fused(x, 'e4m3', 128, pos_to_token=p)
        out_ref, sf_ref = reference.per_channel_cast_fused(x, 128, None, False, p)
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)


def test_per_channel_cast_rejects_bad_input():
    x = torch.randn((256, 2048), device='cuda').bfloat16()
    qc = tile_kernels_aot.quant
    with pytest.raises(ValueError, match='fmt'):
        qc.per_channel_cast(x, 'e2m1', 128)
    with pytest.raises(ValueError, match='num_per_tokens'):
        qc.per_channel_cast(x, 'e4m3', 64)
    with pytest.raises(ValueError, match='num_tokens divisible by 128'):
        qc.per_channel_cast(x[:200], 'e4m3', 128)
    with pytest.raises(ValueError, match='hidden divisible by 64'):
        qc.per_channel_cast(x[:, :2000], 'e4m3', 128)
    with pytest.raises(TypeError, match='x must be bfloat16 or float32'):
        qc.per_channel_cast(x.half(), 'e4m3', 128)
    with pytest.raises(ValueError, match='16-byte aligned'):
        qc.per_channel_cast(torch.randn((256, 2048 + 1), device='cuda').bfloat16()[:, 1:], 'e4m3', 128)
    with pytest.raises(ValueError, match='pos_to_token must have a length divisible by 16'):
        qc.per_channel_cast_fused(x, 'e4m3', 128, pos_to_token=torch.zeros(20, dtype=torch.int32, device='cuda'))
    with pytest.raises(TypeError, match='pos_to_token must be int32'):
        qc.per_channel_cast_fused(x, 'e4m3', 128, pos_to_token=torch.zeros(32, dtype=torch.int64, device='cuda'))
    with pytest.raises(ValueError, match='num_per_channels'):
        qc.per_channel_cast_fused(x, 'e4m3', 128, num_per_channels=128)
    data, sf = reference.cast(x, 'e4m3', (1, 128))
    with pytest.raises(ValueError, match='num_per_channels must be 128'):
        qc.per_channel_cast_fused((data, sf), 'e4m3', 128)
    with pytest.raises(ValueError, match=r'x\[1\] must have shape'):
        qc.per_channel_cast_fused((data, sf[:, :4]), 'e4m3', 128, num_per_channels=128)
    with pytest.raises(ValueError, match='num_per_tokens must be 32 or 128'):
        qc.per_channel_cast_and_transpose(x, 'e4m3', 64)
    with pytest.raises(TypeError, match='x must be bfloat16'):
        qc.per_channel_cast_and_transpose(x.float(), 'e4m3', 128)
    with pytest.raises(ValueError, match='CUDA'):
        qc.per_channel_cast(x.cpu(), 'e4m3', 128)


def test_unpack_from_e2m1fn_x2():
    codes = torch.arange(256, dtype=torch.int32, device='cuda').to(torch.uint8).view(16, 16)
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device='cuda')
    expected_lo = torch.where((codes & 8) > 0, -values[(codes & 7).long()], values[(codes & 7).long()])
    expected_hi = torch.where((codes >> 4 & 8) > 0, -values[(codes >> 4 & 7).long()], values[(codes >> 4 & 7).long()])
    out = tile_kernels_aot.quant.unpack_from_e2m1fn_x2(codes.view(torch.int8))
    assert out.shape == (16, 32) and out.dtype == torch.float32
    assert torch.equal(out[:, 0::2].view(torch.int32), expected_lo.view(torch.int32))  # -0.0 for code 8 too
    assert torch.equal(out[:, 1::2].view(torch.int32), expected_hi.view(torch.int32))
    assert tile_kernels_aot.quant.unpack_from_e2m1fn_x2(codes, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(TypeError, match='int8 or uint8'):
        tile_kernels_aot.quant.unpack_from_e2m1fn_x2(codes.float())
