"""E5M6: the cast (per_token_cast_to_e5m6, behind per_token_cast(fmt='e5m6')) and the cast back
(cast_back_from_e5m6, behind cast_back(x_special_fmt='e5m6')) bit for bit against tile_kernels_aot.reference
(data, scale factors, shapes, strides) for every installed spec; the round trip within upstream's bounds,
on random data and on upstream's special values; argument errors before any launch."""

import pytest
import torch

from tile_kernels_aot import reference
from tile_kernels_aot.quant.e5m6 import cast_back_from_e5m6, e5m6_spec_of, per_token_cast_to_e5m6

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, calc_diff, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu

# kernel_src/models.py hidden_sizes() (all multiples of 32), plus hidden sizes that are multiples of 8 but
# not of 32, which only the element-wise (aligned=False) variants serve.
HIDDEN_SIZES = (576, 2048, 2560, 2880, 3072, 4096, 5120, 6144, 7168)
ODD_HIDDEN_SIZES = (8, 72, 1000)
DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32}
# (use_tma_aligned_col_major_sf, round_sf) per scale-factor format; packed UE8M0 needs both.
SF_CONFIGS = {'f32': ((False, True), (True, True), (False, False), (True, False)), 'ue8m0': ((True, True),)}
# Upstream's generate_e5m6_inputs: min subnormal, max subnormal, min normal; the last column 65024 (the max).
SPECIAL_VALUES = (2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14)


def e5m6_inputs(num_tokens: int, hidden: int, dtype: torch.dtype, aligned: bool):
    """(x, is_special) pairs as upstream's generate_e5m6_inputs, laid out for the variant: 16-byte aligned
    rows with a wider row stride, or rows that start 1 element off a 16-byte boundary."""
    def place(values: torch.Tensor) -> torch.Tensor:
        offset, extra = (0, 64) if aligned else (1, 1)
        base = torch.zeros((num_tokens + 1) * (hidden + extra) + offset, device='cuda', dtype=dtype)
        x = base[offset:offset + num_tokens * (hidden + extra)].view(num_tokens, hidden + extra)[:, :hidden]
        x.copy_(values)
        return x

    yield place(torch.randn((num_tokens, hidden), device='cuda').to(dtype)), False
    for value in SPECIAL_VALUES:
        x = torch.full((num_tokens, hidden), value, device='cuda', dtype=dtype)
        x[:, -1] = 65024.0
        yield place(x), True


def hidden_sizes_for(aligned: bool, num_tokens: int = 0):
    """Every size for small token counts; for the large ones (seconds of reference work per size) the
    smallest, an odd-sized and the largest model size."""
    sizes = HIDDEN_SIZES if num_tokens <= 63 else (576, 2880, 7168)
    return sizes + (() if aligned else ODD_HIDDEN_SIZES)


def check_cast_to_e5m6(spec, num_tokens, hidden_sizes):
    """The cast against the reference, bit for bit, for each hidden size and scale-factor layout."""
    dtype, packed = DTYPES[spec['in_dtype']], spec['sf_format'] == 'ue8m0'
    for hidden in hidden_sizes:
        for col_major, round_sf in SF_CONFIGS[spec['sf_format']]:
            for x, _ in e5m6_inputs(num_tokens, hidden, dtype, spec['aligned']):
                if num_tokens > 1:
                    assert e5m6_spec_of(x, packed) == spec, 'the op would pick another spec'
                poison_allocator(((num_tokens, hidden // 8 * 3), torch.uint32), ((num_tokens, 1), torch.float32),
                                 ((1, -(-num_tokens // 4) * 4), torch.int32))
                data, sf = per_token_cast_to_e5m6(x, hidden, col_major, round_sf, packed)
                data_ref, sf_ref = reference.cast_to_e5m6(x, hidden, col_major, round_sf, packed)
                assert_bitwise_equal(data, data_ref)
                assert_bitwise_equal(sf, sf_ref)
                assert data.shape == (num_tokens, hidden * 3 // 2) and data.dtype == torch.uint8
                if col_major and num_tokens > 1:
                    assert sf.stride() == (1, -(-num_tokens // 4) * 4)


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast_to_e5m6'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_cast_to_e5m6_bitwise(spec, num_tokens):
    check_cast_to_e5m6(spec, num_tokens, hidden_sizes_for(spec['aligned'], num_tokens))


# Rows wider than the 8192 channels the cast holds in registers take its two-pass path (upstream has no
# limit): wide model-like sizes, and for the element-wise variants one that is not a multiple of 32.
WIDE_HIDDEN_SIZES = (8192 + 32, 16384)
ODD_WIDE_HIDDEN_SIZES = (8192 + 8,)


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast_to_e5m6'))
@pytest.mark.parametrize('num_tokens', (1, 5, 130))
def test_cast_to_e5m6_wide_rows_bitwise(spec, num_tokens):
    check_cast_to_e5m6(spec, num_tokens, WIDE_HIDDEN_SIZES + (() if spec['aligned'] else ODD_WIDE_HIDDEN_SIZES))


@pytest.mark.parametrize('spec', installed_specs('quant.cast_back_e5m6'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_cast_back_e5m6_round_trip(spec, num_tokens):
    """Upstream's test_cast_back_e5m6: cast, cast back, compare with the input (calc_diff < 1e-4 on random
    data, < 5e-6 on the special values) and bit for bit with the reference."""
    fmt = 'bf16' if spec['out_dtype'] == 'bfloat16' else 'fp32'
    dtype, packed = DTYPES[spec['out_dtype']], spec['sf_format'] == 'ue8m0'
    for hidden in hidden_sizes_for(spec['aligned'], num_tokens):
        for x, is_special in e5m6_inputs(num_tokens, hidden, dtype, True):
            data, sf = per_token_cast_to_e5m6(x, hidden, packed, True, packed)
            if not spec['aligned'] and hidden % 32 == 0:
                # The word-by-word variant also serves data that is 4- but not 16-byte aligned.
                moved = torch.empty(data.numel() + 4, dtype=torch.uint8, device='cuda')[4:].view(data.shape)
                moved.copy_(data)
                data = moved
            poison_allocator(((num_tokens, hidden), dtype))
            back = cast_back_from_e5m6((data, sf), fmt, (1, hidden))
            assert_bitwise_equal(back, reference.cast_back_from_e5m6((data, sf), fmt, (1, hidden)))
            if num_tokens:
                assert calc_diff(back, x) < (5e-6 if is_special else 1e-4), (hidden, is_special)


@pytest.mark.parametrize('spec', installed_specs('quant.cast_back_e5m6'))
@pytest.mark.parametrize('block', (8, 64, 128))
def test_cast_back_e5m6_narrow_blocks(spec, block):
    """Blocks narrower than the row (several scale factors per token), scale factors in any strides."""
    fmt = 'bf16' if spec['out_dtype'] == 'bfloat16' else 'fp32'
    num_tokens = 63
    for hidden in hidden_sizes_for(spec['aligned']):
        if hidden % 32 == 0 and not spec['aligned']:
            continue
        codes = torch.randint(0, 4096, (num_tokens, hidden), device='cuda')
        codes[(codes & 0x7C0) == 0x7C0] = 0  # no inf / NaN codes
        data = reference.e5m6.pack_e5m6(codes)
        num_blocks = -(-hidden // block)
        if spec['sf_format'] == 'ue8m0':
            exponents = torch.randint(100, 150, (num_tokens, -(-num_blocks // 4) * 4), dtype=torch.int32, device='cuda')
            words = exponents.to(torch.uint8).view(torch.int32)  # [num_tokens, words], 4 exponents a word
            sf = torch.empty((words.shape[1], num_tokens + 3), dtype=torch.int32, device='cuda')[:, :num_tokens]
            sf.copy_(words.T)
            sf = sf.T  # column-major, as per_token_cast returns packed scale factors
        else:
            sf = torch.rand((num_blocks, num_tokens), device='cuda').T + 0.5  # column-major float32
        back = cast_back_from_e5m6((data, sf), fmt, (1, block))
        assert_bitwise_equal(back, reference.cast_back_from_e5m6((data, sf), fmt, (1, block)))


def test_e5m6_rejects_bad_input():
    x = torch.randn((8, 2048), device='cuda').bfloat16()
    with pytest.raises(ValueError, match='num_per_channels must equal hidden'):
        per_token_cast_to_e5m6(x, 128)
    with pytest.raises(ValueError, match='hidden divisible by 8'):
        per_token_cast_to_e5m6(x[:, :2044], 2044)
    with pytest.raises(ValueError, match='needs round_sf'):
        per_token_cast_to_e5m6(x, 2048, True, False, True)
    with pytest.raises(ValueError, match='needs use_tma_aligned_col_major_sf'):
        per_token_cast_to_e5m6(x, 2048, False, True, True)
    with pytest.raises(TypeError, match='bfloat16 or float32'):
        per_token_cast_to_e5m6(x.half(), 2048)
    with pytest.raises(TypeError, match='round_sf must be a bool'):
        per_token_cast_to_e5m6(x, 2048, round_sf=1)
    data, sf = per_token_cast_to_e5m6(x, 2048, round_sf=True)
    with pytest.raises(ValueError, match="fmt must be 'bf16' or 'fp32'"):
        cast_back_from_e5m6((data, sf), 'fp16', (1, 2048))
    with pytest.raises(NotImplementedError, match='more than one token'):
        cast_back_from_e5m6((data, sf), 'bf16', (2, 2048))
    with pytest.raises(ValueError, match='multiple of 8'):
        cast_back_from_e5m6((data, sf), 'bf16', (1, 100))
    with pytest.raises(ValueError, match='sf must have shape'):
        cast_back_from_e5m6((data, sf), 'bf16', (1, 1024))
    with pytest.raises(ValueError, match='multiple of 12'):
        cast_back_from_e5m6((data[:, :-4], sf), 'bf16', (1, 2048))
    with pytest.raises(TypeError, match='data must be uint8'):
        cast_back_from_e5m6((data.view(torch.int8), sf), 'bf16', (1, 2048))
