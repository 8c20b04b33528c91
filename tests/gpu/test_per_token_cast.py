import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference
from tile_kernels_aot.quant import per_token_cast_spec
from tile_kernels_aot.quant.per_token import per_token_requant_spec
from tile_kernels_aot.reference.cast import _format_sf as format_sf

from .helpers import (
    TOKEN_COUNTS, assert_bitwise_equal, calc_diff, check_unbiased, copy_at, installed_specs, installed_values, poison_allocator,
)

pytestmark = pytest.mark.gpu

DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32}
# A short row whose last block holds 16 columns whatever the block width over 16 (one vector: the lane that stores a
# block's scale factor may hold only padding), a row that is not a whole number of 128-wide blocks, and the largest
# model row (kernel_src/models.py); the hidden size is a run-time argument of every binary.
HIDDEN_SIZES = (1040, 2880, 7168)
# A quantised input's hidden is a multiple of 32 (its chunks): a short row with a 64-column last block of 128, and the rest.
REQUANT_HIDDEN_SIZES = (576, 2880, 7168)
BLOCK_WIDTHS = (16, 32, 64, 128)
ROUND_TRIP_BOUND = {'e4m3': 1e-3, 'e2m1': 2e-2}


def input_for(spec: dict, num_tokens: int, hidden: int) -> torch.Tensor:
    """Strided rows that select the spec: 32-byte aligned (32-byte vectors, and per row), 16-byte aligned but not 32
    (16-byte vectors), or neither (the element-wise variant)."""
    dtype = DTYPES[spec['in_dtype']]
    if not spec['aligned']:
        offset, extra = 1, 1
    else:
        offset, extra = (16 // dtype.itemsize if spec['vec_bytes'] == 16 and not spec['per_row'] else 0), 64
    base = torch.randn((num_tokens + 1) * (hidden + extra) + offset, device='cuda').to(dtype)
    return base[offset:offset + num_tokens * (hidden + extra)].view(num_tokens, hidden + extra)[:, :hidden]


def layouts(spec: dict) -> list[tuple[bool, bool, bool]]:
    """(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) combinations the spec serves."""
    if spec['sf_format'] == 'ue8m0':
        return [(True, True, True)]
    return [(col_major, round_sf, False) for col_major in (False, True) for round_sf in (False, True)]


def block_widths(spec: dict, hidden: int) -> tuple[int, ...]:
    if spec['per_row']:
        return (hidden,) if hidden % 64 == 0 and hidden not in BLOCK_WIDTHS else ()
    return BLOCK_WIDTHS


def sf_storage(num_tokens: int, num_blocks: int, col_major: bool, packed: bool) -> tuple[tuple[int, ...], torch.dtype]:
    if packed:
        return (-(-num_blocks // 4), -(-num_tokens * 4 // 16) * 16), torch.uint8
    return ((num_blocks, -(-num_tokens // 4) * 4) if col_major else (num_tokens, num_blocks)), torch.float32


@pytest.mark.parametrize('hidden', HIDDEN_SIZES)
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast'))
def test_per_token_cast_bitwise(spec, num_tokens, hidden):
    fmt = spec['fmt']
    x = input_for(spec, num_tokens, hidden)
    for npc in block_widths(spec, hidden):
        for col_major, round_sf, packed in layouts(spec):
            if num_tokens:
                assert per_token_cast_spec(x, fmt, npc, packed) == spec, 'the op would pick another spec'
            num_blocks = -(-hidden // npc)
            out_shape = (num_tokens, hidden // 2) if fmt == 'e2m1' else (num_tokens, hidden)
            poison_allocator((out_shape, torch.uint8), sf_storage(num_tokens, num_blocks, col_major, packed))
            flags = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
            out, sf = tile_kernels_aot.quant.per_token_cast(x, fmt, npc, **flags)
            out_ref, sf_ref = reference.cast(x, fmt, (1, npc), **flags)
            assert_bitwise_equal(out, out_ref)
            assert_bitwise_equal(sf, sf_ref)

            poison_allocator(sf_storage(num_tokens, num_blocks, col_major, packed))
            assert_bitwise_equal(tile_kernels_aot.quant.per_token_cast_with_sf_only(x, fmt, npc, **flags), sf_ref)
            if not packed:
                # Upstream uses row-major precomputed scale factors; any strides work here.
                precomputed = tile_kernels_aot.quant.per_token_cast_with_precomputed_sf(x, fmt, npc, sf)
                assert_bitwise_equal(precomputed, reference.cast(x, fmt, (1, npc), sf=sf))

            back = reference.cast_back((out, sf), 'fp32', (1, npc))
            assert calc_diff(back, x.float()) < ROUND_TRIP_BOUND[fmt]
            if num_tokens >= 63:
                check_unbiased(back, x.float())


@pytest.mark.parametrize('hidden', (8256, 16384))
@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast', where=lambda s: s['per_row'] and s['in_dtype'] == 'bfloat16'))
def test_per_token_cast_per_row_wider_than_registers(spec, hidden):
    """bf16 rows over 8192 channels (up to the op's 16384) are read twice, in chunks of 8192
    (kernel_src/quant/per_token_cast/per_row.py); rows' largest elements sit in either chunk."""
    fmt = spec['fmt']
    x = input_for(spec, 63, hidden)
    x[::2, -1] = 40.0  # last chunk
    x[1::4, 3] = -50.0  # first chunk
    for col_major, round_sf, packed in layouts(spec):
        flags = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
        out, sf = tile_kernels_aot.quant.per_token_cast(x, fmt, hidden, **flags)
        out_ref, sf_ref = reference.cast(x, fmt, (1, hidden), **flags)
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)
        assert_bitwise_equal(tile_kernels_aot.quant.per_token_cast_with_sf_only(x, fmt, hidden, **flags), sf_ref)
        if not packed:
            precomputed = tile_kernels_aot.quant.per_token_cast_with_precomputed_sf(x, fmt, hidden, sf)
            assert_bitwise_equal(precomputed, reference.cast(x, fmt, (1, hidden), sf=sf))


@pytest.mark.parametrize('in_dtype, fmt', installed_values('quant.per_token_cast', 'in_dtype', 'fmt'))
def test_per_token_cast_takes_narrow_vectors_where_wide_ones_do_not_fit(in_dtype, fmt):
    """An input whose pointer or row stride is a multiple of 16 bytes but not of 32 takes the 16-byte kernel, a 32-byte
    aligned one the 32-byte kernel: both exact."""
    dtype = DTYPES[in_dtype]
    step = 16 // dtype.itemsize  # elements in 16 bytes
    base = torch.randn(64 * 7168 + 64 * step + step, device='cuda').to(dtype)
    inputs = {
        32: base[:64 * 7168].view(64, 7168),
        16: base[step:step + 64 * 7168].view(64, 7168),  # the pointer 16 bytes past a 32-byte boundary
    }
    inputs['16 (row stride)'] = base[:64 * (7168 + step)].view(64, 7168 + step)[:, :7168]
    for expected, x in inputs.items():
        spec = per_token_cast_spec(x, fmt, 32, False)
        assert spec['aligned'] and spec['vec_bytes'] == (32 if expected == 32 else 16), (expected, spec)
        out, sf = tile_kernels_aot.quant.per_token_cast(x, fmt, 32)
        out_ref, sf_ref = reference.cast(x, fmt, (1, 32))
        assert_bitwise_equal(out, out_ref)
        assert_bitwise_equal(sf, sf_ref)


@pytest.mark.parametrize('fmt', installed_values('quant.per_token_cast', 'fmt'))
def test_per_token_cast_saturates_and_handles_tiny_blocks(fmt):
    x = torch.randn((64, 7168), device='cuda', dtype=torch.bfloat16)
    x[0, :128] = 0  # amax 0 -> clamped to the floor
    x[1, 5] = 3e38  # huge outlier: the rest of its block underflows to 0
    x[2, 130:140] = -1e-30
    x[3, 256:384] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=torch.bfloat16).repeat(16)  # e2m1 ties
    for npc in (32, 128, 7168):
        for round_sf in (False, True):
            out, sf = tile_kernels_aot.quant.per_token_cast(x, fmt, npc, round_sf=round_sf)
            out_ref, sf_ref = reference.cast(x, fmt, (1, npc), round_sf=round_sf)
            assert_bitwise_equal(out, out_ref)
            assert_bitwise_equal(sf, sf_ref)
            if fmt == 'e4m3':
                assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast', where=lambda s: s['fmt'] == 'e2m1' and s['sf_format'] == 'f32'))
def test_per_token_cast_e2m1_saturates_products_of_given_scale_factors(spec):
    """Given scale factors an eighth of the cast's own put most products of the even rows past 6, many past 7,
    where the kernels' unclamped encoding would overflow (E2M1_UNCLAMPED_BOUND in kernel_src/quant/common.py):
    those threads clamp first. Bit for bit against the reference, odd rows (unclamped) alike."""
    hidden = 2880
    x = input_for(spec, 64, hidden)
    for npc in block_widths(spec, hidden):
        _, sf = tile_kernels_aot.quant.per_token_cast(x, 'e2m1', npc)
        given = sf.clone()
        given[::2] /= 8
        out = tile_kernels_aot.quant.per_token_cast_with_precomputed_sf(x, 'e2m1', npc, given)
        assert_bitwise_equal(out, reference.cast(x, 'e2m1', (1, npc), sf=given))
        codes = out.view(torch.uint8)
        saturated = ((codes & 0x07) == 0x07) | ((codes & 0x70) == 0x70)
        assert saturated[::2].float().mean() > 0.5 and saturated[1::2].float().mean() < 0.25


# NaN bit patterns of both signs with several payloads (quiet, signalling, all ones), per input dtype.
NAN_BITS = {'bfloat16': (0x7FC0, 0xFFC0, 0x7F81, 0xFFFF), 'float32': (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF)}


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_cast', where=lambda s: s['fmt'] == 'e2m1'))
def test_per_token_cast_e2m1_of_nan(spec):
    """A NaN element is skipped by its block's amax (fmaxf) and encodes as +0: its product with the
    multiplier is the GPU's canonical NaN 0x7FFFFFFF (positive, whatever the input's sign and payload), which
    kernel_src.quant.common.e2m1_top_nibble turns into code 0 with no NaN test of its own. Every other element
    and every scale factor is the reference's for the same input with the NaNs replaced by zeros."""
    hidden = 7168
    x = input_for(spec, 40, hidden)
    assert per_token_cast_spec(x, 'e2m1', hidden if spec['per_row'] else 32, spec['sf_format'] == 'ue8m0') == spec
    int_dtype = torch.int16 if spec['in_dtype'] == 'bfloat16' else torch.int32
    # Narrowing an int64 to int16/int32 wraps, so the patterns above the sign bit become the negative integers of the same bits.
    nans = torch.tensor(NAN_BITS[spec['in_dtype']], dtype=torch.int64).to(int_dtype).cuda().view(x.dtype)
    is_nan = torch.zeros(x.shape, dtype=torch.bool, device='cuda')
    is_nan[::3, ::37] = True
    is_nan[1, 64:96] = True  # a whole 32-wide block of NaNs: its amax is the floor
    x[is_nan] = nans.repeat(-(-int(is_nan.sum()) // nans.numel()))[:int(is_nan.sum())]
    assert x.isnan().sum() == is_nan.sum()
    for npc in ((hidden,) if spec['per_row'] else (32, 128)):
        for col_major, round_sf, packed in layouts(spec):
            flags = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
            out, sf = tile_kernels_aot.quant.per_token_cast(x, 'e2m1', npc, **flags)
            out_ref, sf_ref = reference.cast(x.nan_to_num(0.0), 'e2m1', (1, npc), **flags)
            assert_bitwise_equal(sf, sf_ref)
            ref_bytes = out_ref.view(torch.uint8).int()
            codes = torch.stack([ref_bytes & 0xF, ref_bytes >> 4], dim=-1).flatten(-2)
            codes[is_nan] = 0
            assert_bitwise_equal(out, (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8))


def test_per_token_cast_sf_strides_match_upstream():
    x = torch.randn((5, 7168), device='cuda', dtype=torch.bfloat16)
    _, sf = tile_kernels_aot.quant.per_token_cast(x, 'e4m3', 128, use_tma_aligned_col_major_sf=True)
    assert sf.shape == (5, 56) and sf.stride() == (1, 8) and sf.dtype == torch.float32
    _, sf = tile_kernels_aot.quant.per_token_cast(x, 'e2m1', 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    assert sf.shape == (5, 56) and sf.stride() == (1, 8) and sf.dtype == torch.int32
    out, sf = tile_kernels_aot.quant.per_token_cast(x, 'e2m1', 32)
    assert out.shape == (5, 3584) and out.dtype == torch.int8 and sf.shape == (5, 224) and sf.stride() == (224, 1)


def test_per_token_cast_rejects_bad_input():
    x = torch.randn((8, 7168), device='cuda', dtype=torch.bfloat16)
    op = tile_kernels_aot.quant
    with pytest.raises(ValueError, match='e5m6'):  # E5M6 has one scale factor per row
        op.per_token_cast(x, 'e5m6', 128)
    with pytest.raises(ValueError, match='e5m6'):
        op.per_token_cast((x, x), 'e5m6', 7168)
    with pytest.raises(ValueError, match='fmt'):
        op.per_token_cast(x, 'int8', 32)
    with pytest.raises(ValueError, match='num_per_channels'):
        op.per_token_cast(x, 'e4m3', 48)
    with pytest.raises(TypeError, match='bfloat16 or float32'):
        op.per_token_cast(x.half(), 'e4m3', 128)
    with pytest.raises(ValueError, match='last dimension'):
        op.per_token_cast(torch.randn((7168, 64), device='cuda').t(), 'e4m3', 128)
    with pytest.raises(ValueError, match='use_packed_ue8m0 needs use_tma_aligned_col_major_sf'):
        op.per_token_cast(x, 'e4m3', 128, round_sf=True, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match='use_packed_ue8m0 needs round_sf'):
        op.per_token_cast(x, 'e4m3', 128, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    with pytest.raises(TypeError, match='round_sf must be a bool'):
        op.per_token_cast(x, 'e4m3', 128, round_sf=1)
    with pytest.raises(TypeError, match='data must be float8_e4m3fn or int8'):
        op.per_token_cast((x, x), 'e4m3', 128, x_block_size=(1, 128))
    q = torch.zeros((8, 7168), device='cuda', dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match='needs x_block_size'):
        op.per_token_cast((q, torch.ones((8, 56), device='cuda')), 'e4m3', 128)
    with pytest.raises(ValueError, match='x_block_size is for a quantised'):
        op.per_token_cast(x, 'e4m3', 128, x_block_size=(1, 128))
    with pytest.raises(ValueError, match=r'sf must have shape \(1, 56\)'):
        op.per_token_cast((q, torch.ones((8, 56), device='cuda')), 'e4m3', 128, x_block_size=(128, 128))
    with pytest.raises(ValueError, match='num_per_channels must be 32, 64 or 128'):
        op.per_token_cast((q, torch.ones((1, 56), device='cuda')), 'e4m3', 16, x_block_size=(128, 128))
    with pytest.raises(ValueError, match='power of two of at least 32'):
        op.per_token_cast((q, torch.ones((8, 448), device='cuda')), 'e4m3', 128, x_block_size=(1, 16))
    with pytest.raises(ValueError, match='re-quantised by per_token_cast only'):
        op.per_token_cast_with_sf_only((q, torch.ones((1, 56), device='cuda')), 'e4m3', 128, x_block_size=(128, 128))
    with pytest.raises(ValueError, match='hidden divisible by 64'):
        op.per_token_cast(torch.randn((8, 7184), device='cuda'), 'e4m3', 7184)
    with pytest.raises(ValueError, match='sf must have shape'):
        op.per_token_cast_with_precomputed_sf(x, 'e4m3', 128, torch.ones((8, 55), device='cuda'))
    with pytest.raises(NotImplementedError, match='packed UE8M0'):
        op.per_token_cast_with_precomputed_sf(x, 'e4m3', 128, torch.ones((8, 14), dtype=torch.int32, device='cuda'))


REQUANT_LAYOUTS = ((False, True, False), (True, True, True), (False, False, False))


def requant_input(spec: dict, q: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """q with its data where the op takes the spec: as allocated (32-byte aligned, rows of 32-byte multiples) for
    32-byte vectors and e2m1 data, copied 16 bytes past a 32-byte boundary for e4m3 data in 16-byte vectors."""
    data, sf = q
    if spec['in_fmt'] == 'e4m3' and spec['vec_bytes'] == 16:
        data = copy_at(data, 16)
    if data.shape[0]:
        in_packed, packed = spec['in_sf_format'] == 'ue8m0', spec['sf_format'] == 'ue8m0'
        assert per_token_requant_spec(data, spec['fmt'], in_packed, packed) == spec, 'the op would pick another spec'
    return data, sf


@pytest.mark.parametrize('hidden', REQUANT_HIDDEN_SIZES)
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('spec', installed_specs('quant.per_token_requant'))
def test_per_token_cast_of_quantised_input(spec, num_tokens, hidden):
    """A quantised (data, sf) input, as upstream tests it: data from a cast of bf16 with blocks (128, 128) or
    (32, 32) (and (1, 32)), then per_token_cast with 32 or 128 per channel, bit for bit against the reference."""
    x = torch.randn((num_tokens, hidden), device='cuda', dtype=torch.bfloat16)
    in_packed, packed = spec['in_sf_format'] == 'ue8m0', spec['sf_format'] == 'ue8m0'
    for col_major, round_sf, use_packed in REQUANT_LAYOUTS:
        if use_packed != in_packed:
            continue
        for x_block in ((128, 128), (32, 32), (1, 32)):
            q = requant_input(spec, reference.cast(x, spec['in_fmt'], x_block, round_sf=round_sf, use_tma_aligned_col_major_sf=col_major,
                                                   use_packed_ue8m0=use_packed))
            for npc in (32, 128):
                if packed != use_packed:
                    continue
                args = dict(x_block_size=x_block, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
                # (and the packed scale factors' storage: the kernels write the zero bytes past a row's last block)
                sf_storage = (-(-hidden // (4 * npc)), -(-num_tokens * 4 // 16) * 16) if packed else (num_tokens, -(-hidden // npc) * 4)
                poison_allocator(((num_tokens, hidden), torch.float8_e4m3fn), (sf_storage, torch.uint8))
                out, sf = tile_kernels_aot.quant.per_token_cast(q, spec['fmt'], npc, **args)
                out_ref, sf_ref = reference.cast(q, spec['fmt'], (1, npc), **args)
                assert_bitwise_equal(out, out_ref)
                assert_bitwise_equal(sf, sf_ref)
                if num_tokens >= 63 and spec['fmt'] == 'e4m3' and spec['in_fmt'] == 'e4m3':
                    back = reference.cast_back((out, sf), 'fp32', (1, npc))
                    assert calc_diff(back, x.float()) < 2e-3  # a sanity check: the bitwise comparison is the test


E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_requant', lambda s: (s['in_fmt'], s['fmt'], s['sf_format']) == ('e4m3', 'e2m1', 'f32')))
def test_per_token_cast_e4m3_to_e2m1_ties_without_round_sf(spec):
    """Without round_sf a chunk's codes are those of 6 q / M (M its largest |q|) except where that lands exactly on an
    e2m1 midpoint, and there the float32 factor decides: all of a chunk's ties up, all down, or all to the even code
    (the ratio path of kernel_src.quant.per_token_requant). Every chunk here holds its largest value and each of its
    tie partners, under input scale factors that give all three outcomes many times (counted below from the
    reference's own factors), bit for bit against the reference."""
    generator = torch.Generator().manual_seed(11)
    num_tokens, hidden = 512, 1024
    magnitudes = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # byte b's value (0x7F: NaN)
    ties = [[b for b in range(1, 0x7F) if any(6 * magnitudes[b].item() == mid * magnitudes[largest].item() for mid in E2M1_MIDPOINTS)]
            for largest in range(0x7F)]
    largest = torch.randint(0x08, 0x7F, (num_tokens * hidden // 32,), generator=generator)
    chunks = (torch.rand((largest.numel(), 32), generator=generator) * (largest[:, None] + 1).float()).long()  # bytes <= M
    for i, m in enumerate(largest.tolist()):
        chunks[i, :len(ties[m]) + 1] = torch.tensor([m] + ties[m])
    chunks |= torch.randint(0, 2, chunks.shape, generator=generator) << 7  # either sign
    data = chunks.to(torch.uint8).view(torch.float8_e4m3fn).view(num_tokens, hidden)
    scale = (torch.rand((num_tokens, hidden // 32), generator=generator) + 1) * torch.exp2(torch.randint(-12, 13, (num_tokens, hidden // 32), generator=generator).float())
    # The reference's factor of each chunk, and where r = M F - 6 puts its ties (6 * 2^-24 times 0.875 and -0.625).
    amax = magnitudes[largest].view(num_tokens, hidden // 32) * scale
    factor = scale * (6 / amax)
    r = magnitudes[largest].view(num_tokens, hidden // 32).double() * factor.double() - 6
    unit = 6 * 2.0**-24
    outcomes = ((r > 0.875 * unit).sum().item(), (r < -0.625 * unit).sum().item(), (r.abs() <= 0.625 * unit).sum().item())
    assert min(outcomes) > 500, outcomes
    q = requant_input(spec, (data.cuda(), scale.cuda()))
    args = {'x_block_size': (1, 32), 'use_tma_aligned_col_major_sf': False, 'round_sf': False, 'use_packed_ue8m0': False}
    out, sf = tile_kernels_aot.quant.per_token_cast(q, 'e2m1', 32, **args)
    out_ref, sf_ref = reference.cast(q, 'e2m1', (1, 32), **args)
    assert_bitwise_equal(out, out_ref)
    assert_bitwise_equal(sf, sf_ref)


@pytest.mark.parametrize('spec', installed_specs('quant.per_token_requant'))
def test_per_token_cast_of_quantised_input_with_extreme_scale_factors(spec):
    """Each chunk picks its path from its factor (input scale factor times output multiplier): e2m1 input
    re-encodes through a table of its eight magnitudes' outputs when the factor is finite, e4m3 input to e2m1
    works in f16 lanes when the factors of every active lane of the warp are powers of two in f16's normal range
    (the warp's other chunks here push some warps off that path, and keep others on it), and everything else goes
    element by element in float32. Scale factors from 2^-120 to 2^120 and zero, and (32, 32) blocks of signed
    zeros with a scale factor of 2^10, whose factor (2^10 times the floor's multiplier 2^126) is infinite, so
    0 * factor is NaN and every code comes out +0, where the table or the f16 lanes would have kept the -0
    codes' sign: bit for bit against the reference."""
    generator = torch.Generator(device='cuda').manual_seed(7)
    m, k = 96, 1024
    in_fp4 = spec['in_fmt'] == 'e2m1'
    data = torch.randint(-128, 128, (m, k // 2 if in_fp4 else k), dtype=torch.int8, device='cuda', generator=generator)
    if not in_fp4:
        data[(data & 0x7F) == 0x7F] = 0x7E  # no NaNs: the reference's amax would carry them into the scale factor
    signed_zeros = torch.tensor([0x00, 0x08, 0x80, 0x88] if in_fp4 else [0x00, 0x80], dtype=torch.uint8, device='cuda').view(torch.int8)
    zero_blocks = ((0, 0), (2, 5))
    zero_width = 16 if in_fp4 else 32
    for row, col in zero_blocks:
        picks = torch.randint(0, len(signed_zeros), (32, zero_width), device='cuda', generator=generator)
        data[32 * row:32 * row + 32, zero_width * col:zero_width * col + zero_width] = signed_zeros[picks]
    if not in_fp4:
        data[0:32, 32 * 12:32 * 15] = 0x7E  # 448
        tiny = torch.tensor([0x00, 0x01, 0x80, 0x81], dtype=torch.uint8, device='cuda').view(torch.int8)  # +-0, +-2^-9
        data[32:64, 32 * 20:32 * 22] = tiny[torch.randint(0, 4, (32, 64), device='cuda', generator=generator)]
        data[32:64, 32 * 20] = data[32:64, 32 * 21] = 0x01  # every row of those blocks has amax 2^-9
    data = data if in_fp4 else data.view(torch.float8_e4m3fn)
    in_packed, packed = spec['in_sf_format'] == 'ue8m0', spec['sf_format'] == 'ue8m0'
    exponents = torch.randint(-20, 21, (m // 32, k // 32), device='cuda', generator=generator).float()
    # (e4m3 input: 2^110, as 448 * 2^120 overflows float32, where the reference and the kernels part ways)
    exponents[1, 1], exponents[1, 2], exponents[0, 7] = 120 if in_fp4 else 110, -120, 100
    for row, col in zero_blocks:
        exponents[row, col] = 10
    if in_fp4 and in_packed:
        # Around the bounds of e2m1 -> e2m1's exponent path (EXPONENT_PATH_INPUTS: UE8M0 bytes 4 to 252), where amax
        # meets the floor and nears float32's largest value.
        exponents[2, 8:16] = torch.arange(-126, -118, device='cuda')
        exponents[0, 12:15] = torch.tensor([123, 124, 125], device='cuda')
    elif in_packed:
        # Around the bounds of e4m3 -> e2m1's exponent path (F16_EXPONENT_PATH_BYTES: output bytes 2 to 252): blocks of
        # 448 (amax 1.75 * 2^8, output byte = input byte + 7) at input bytes 244-246, and blocks of +-2^-9 (output byte =
        # input byte - 11) at input bytes 12 and 13.
        exponents[0, 12:15] = torch.tensor([117, 118, 119], device='cuda')
        exponents[1, 20:22] = torch.tensor([-115, -114], device='cuda')
    scale = torch.exp2(exponents)
    scale[2, 3] = 0.0  # UE8M0 byte 0 reads as +0 too
    if not in_packed:
        scale *= torch.rand(scale.shape, device='cuda', generator=generator) + 1  # not only powers of two
    for col_major, round_sf, use_packed in REQUANT_LAYOUTS:
        if use_packed != in_packed:
            continue
        q = requant_input(spec, (data, format_sf(scale, col_major, use_packed)))
        for npc in (32, 128):
            args = dict(x_block_size=(32, 32), use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
            out, sf = tile_kernels_aot.quant.per_token_cast(q, spec['fmt'], npc, **args)
            out_ref, sf_ref = reference.cast(q, spec['fmt'], (1, npc), **args)
            assert_bitwise_equal(out, out_ref)
            assert_bitwise_equal(sf, sf_ref)
            if spec['fmt'] == 'e2m1' and npc == 32:
                # The infinite-factor blocks did take the per-element path: no -0 code survives there. (With
                # 128 per scale factor the neighbouring blocks set a finite factor, and -0 stays -0.)
                for row, col in zero_blocks:
                    assert not (out[32 * row:32 * row + 32, 16 * col:16 * col + 16].view(torch.uint8) & 0x88).any()
