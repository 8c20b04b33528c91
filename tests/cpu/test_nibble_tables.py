"""kernel_src.quant.nibbles.table_bytes_of_codes (four e2m1 codes through an eight-byte table by byte
permutes) in its two uses, replayed on the CPU for every 16-bit group of four codes:
* per_block_cast_lossless: the e4m3 bytes of the codes' values times 2^d, for every d the kernel accepts
  (its device assert rejects the others), against torch's own float8_e4m3fn conversion;
* per_token_requant: the halves whose high bytes the table gives, against the e2m1 values themselves; its
  re-encoding of eight codes through a per-chunk table of codes (e2m1_word_through_table), and the largest
  magnitude of a chunk (largest_magnitude, e2m1_value).
"""

from __future__ import annotations

import pytest
import torch

from kernel_src.quant import nibbles
from kernel_src.quant import per_block_cast_lossless as lossless
from kernel_src.quant import per_token_requant as requant
from tests.cpu.cuda_intrinsics import byte_perm
from tile_kernels_aot.reference.cast import E2M1_VALUES, e2m1_codes

SIGNED_VALUES = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)  # by code 0..15


def table_bytes(words: torch.Tensor, table_low: int, table_high: int, half: int) -> torch.Tensor:
    """table_bytes_of_codes, instruction by instruction."""
    magnitudes = words & nibbles.CODE_MAGNITUDES
    looked_up = byte_perm(torch.full_like(words, table_low), table_high, magnitudes >> (16 * half))
    doubled = byte_perm(words, 0, 0x1100 + 0x2222 * half)
    return looked_up ^ (((doubled << 4) & 0xFFFFFFFF) & nibbles.SIGN_BITS_EVEN) ^ (doubled & nibbles.SIGN_BITS_ODD)


def every_group_of_four_codes() -> torch.Tensor:
    """uint32 words (int64) holding every 16-bit group of four codes, once in each half."""
    groups = torch.arange(1 << 16, dtype=torch.int64)
    return torch.cat([groups, groups << 16])


def codes_of(words: torch.Tensor) -> torch.Tensor:
    return torch.stack([(words >> (4 * i)) & 15 for i in range(8)], dim=1)


@pytest.mark.parametrize('d', range(-lossless.MAX_SPAN, lossless.EXPONENT_SHIFT + 1))
def test_lossless_e4m3_bytes_match_the_float8_conversion(d):
    words = every_group_of_four_codes()
    k = (d + 6) << 3
    table_low = (k * 0x01010100 + lossless.E4M3_TABLE_LOW) & 0xFFFFFFFF
    table_high = (k * 0x01010101 + lossless.E4M3_TABLE_HIGH) & 0xFFFFFFFF
    encoded = [table_bytes(words, table_low, table_high, half) for half in range(2)]
    got = torch.stack([(encoded[i // 4] >> (8 * (i % 4))) & 0xFF for i in range(8)], dim=1)
    want = (SIGNED_VALUES[codes_of(words)] * 2.0**d).to(torch.float8_e4m3fn).view(torch.uint8).long()
    # -0.0 (code 8) converts to 0x80, the sign bit on a zero magnitude byte.
    assert torch.equal(got, want), (got != want).nonzero()[:5]


def test_requant_halves_are_the_e2m1_values():
    words = every_group_of_four_codes()
    pairs = []
    for half in range(2):
        high = table_bytes(words, requant.HALF_TABLE_LOW, requant.HALF_TABLE_HIGH, half)
        pairs += [byte_perm(high, 0, 0x1404), byte_perm(high, 0, 0x3424)]
    as_int32 = torch.stack(pairs, dim=1).to(torch.int32)  # wraps as the bits of a uint32
    got = as_int32.view(torch.float16).float()  # [n, 8]: little-endian halves, element 0 first
    want = SIGNED_VALUES[codes_of(words)]
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit: -0.0 kept


def random_words(count: int = 1 << 16) -> torch.Tensor:
    return torch.randint(0, 1 << 32, (count,), dtype=torch.int64, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize('seed', range(8))
def test_requant_e2m1_word_through_table(seed):
    """Every code through a random table of eight codes (any sign), with the input's sign flipping the
    code's: the nibble-level definition, against e2m1_word_through_table's permutes."""
    table = torch.randint(0, 16, (8,), generator=torch.Generator().manual_seed(seed))
    codes_low, codes_high = (nibbles.table_word(int(c) for c in table[4 * h:4 * h + 4]) for h in range(2))
    words = torch.cat([every_group_of_four_codes(), random_words()])
    magnitudes = words & nibbles.CODE_MAGNITUDES
    # (prmt's selectors here have bit 3 of every nibble clear, so byte_perm models it)
    assert not ((magnitudes | (magnitudes >> 16)) & 0x8888).any()
    lookup = lambda selectors: byte_perm(torch.full_like(words, codes_low), codes_high, selectors)
    code_pairs = lambda x: x + (x >> 4)  # as the kernel pairs them (LEA.HI): no 32-bit carry for code bytes below 16
    first, second = code_pairs(lookup(magnitudes)), code_pairs(lookup(magnitudes >> 16))
    assert (first < 2**32).all() and (second < 2**32).all()
    got = byte_perm(first, second, 0x6420) ^ (words & nibbles.CODE_SIGNS)
    inputs = codes_of(words)
    want_codes = table[inputs & 7] ^ (inputs & 8)
    want = sum(want_codes[:, i] << (4 * i) for i in range(8))
    assert torch.equal(got, want)


def pow2_code_table(shift: int) -> tuple[int, int]:
    """The e2m1 -> e2m1 table (two words of four code bytes) of the factor 2^shift as the reference encodes it: code m
    goes to the code of E2M1_VALUES[m] * 2^shift, exact on the grid or saturated to 6 (code 7)."""
    codes = [requant.E2M1_VALUES.index(v * 2**shift) if v * 2**shift <= 6 else 7 for v in requant.E2M1_VALUES]
    return nibbles.table_word(codes[:4]), nibbles.table_word(codes[4:])


def table_byte(table, m: int) -> int:
    return (table[m // 4] >> (8 * (m % 4))) & 0xFF


@pytest.mark.parametrize('shift', range(requant.POW2_TABLE_SHIFTS[0], requant.POW2_TABLE_SHIFTS[1] + 1))
def test_requant_power_of_two_tables(shift):
    """The e2m1 -> e2m1 table of a factor 2^shift as the kernel forms it (power_of_two_table) holds the reference's code
    for every magnitude whose product is at most 6, the only ones a chunk under that factor looks up; past those it
    would need the saturation it does not do (so the bound is the reason it may skip it)."""
    table = shifted_code_table(shift, 2, max(2 * shift, 1))
    want = pow2_code_table(shift)
    looked_up = [m for m, v in enumerate(requant.E2M1_VALUES) if v * 2**shift <= 6]
    assert looked_up == list(range(len(looked_up)))  # every magnitude up to a chunk's largest
    for m in looked_up:
        assert table_byte(table, m) == table_byte(want, m), m
    for m in range(len(looked_up), 8):
        assert table_byte(table, m) > 7 and table_byte(want, m) == 7, m


def test_requant_largest_magnitude():
    chunks = random_words(4 * 20000).view(-1, 4)
    # Chunks whose largest magnitude is each of 0..7, not only 7.
    chunks = chunks & (torch.arange(chunks.shape[0])[:, None] % 8 * 0x11111111 | nibbles.CODE_SIGNS)
    present = torch.zeros(chunks.shape[0], dtype=torch.int64)
    for w in range(4):
        for half in range(2):
            present |= byte_perm(torch.full_like(present, nibbles.PRESENCE_LOW), nibbles.PRESENCE_HIGH,
                                 (chunks[:, w] & nibbles.CODE_MAGNITUDES) >> (16 * half))
    halves = present | (present >> 16)
    folded = (halves | (halves >> 8)) & 0xFF
    got = folded.double().log2().floor().long()  # the top set bit: 31 - __clz
    want = torch.stack([codes_of(chunks[:, w]) & 7 for w in range(4)], dim=1).amax(dim=(1, 2))
    assert torch.equal(got, want)
    assert set(want.tolist()) == set(range(8))


def test_requant_e2m1_value():
    for m, value in enumerate(requant.E2M1_VALUES):
        bits = ((m + 252) << 22) & 0xFFFFFFFF
        got = m * 0.5 if m < 2 else torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32).item()
        assert got == value == E2M1_VALUES[m]


def float32_between(low: float, high: float) -> torch.Tensor:
    """Every float32 from low to high (positive), as float64."""
    bits = torch.tensor([low, high], dtype=torch.float32).view(torch.int32).long()
    return torch.arange(bits[0].item(), bits[1].item() + 1, dtype=torch.int64).to(torch.int32).view(torch.float32).double()


def rounded(x: torch.Tensor) -> torch.Tensor:
    """float64 x rounded to float32 (nearest, ties to even), as float64."""
    return x.float().double()


@pytest.mark.parametrize('largest', range(1, 8))
def test_requant_canonical_tables(largest):
    """e2m1 -> e2m1 without round_sf (canonical_table): for every float32 factor the kernel's window test passes, fused
    or not, the table it builds from the largest code alone (and the tie's comparison) holds, for every magnitude up
    to the largest, the reference's code of the float32 product."""
    value = requant.E2M1_VALUES[largest]
    factors = float32_between(6 / value * 0.97, 6 / value * 1.03)
    window = requant.CANONICAL_WINDOW
    fused = (rounded(factors * value - 6).abs() < window)  # one FFMA: the product is exact in float64
    separate = (rounded(rounded(factors * value) - 6).abs() < window)
    assert not (fused | separate)[[0, -1]].any()  # the window lies inside the factors tried
    factors = factors[fused | separate]
    assert factors.numel() > 250000
    steps = 7 - largest
    first = ((requant.CANONICAL_FIRST_CODES >> (4 * steps)) & 15) + (factors >= requant.CANONICAL_TIE_FACTOR).long()
    table = shifted_code_table(steps, 1, first)
    for m in range(largest + 1):
        got = (table[m // 4] >> (8 * (m % 4))) & 0xFF
        want = e2m1_codes(rounded(factors * requant.E2M1_VALUES[m]).float()).long()
        assert torch.equal(got, want), (largest, m)
    if largest == 6:  # the tie: both codes occur
        assert set(first.tolist()) == {1, 2}


def shifted_code_table(steps: int, codes_per_step: int, first) -> list:
    """The kernel's shifted_code_table: [low, high] words (ints, or tensors of first's shape)."""
    low = steps * codes_per_step * requant.SHIFTED_CODE_STEP[0] + requant.SHIFTED_CODE_TABLE[0] + (first << 8)
    high = steps * codes_per_step * requant.SHIFTED_CODE_STEP[1] + requant.SHIFTED_CODE_TABLE[1] + 0 * first
    return [low, high]


@pytest.mark.parametrize('largest', range(1, 8))
def test_requant_exponent_path_tables(largest):
    """The exponent path's table (a shift of (7 - L) / 2 for largest code L) holds the constant power-of-two table's
    codes for every magnitude up to L, which is every code such a chunk looks up, none of them saturated."""
    shift = (7 - largest) >> 1
    assert requant.POW2_TABLE_SHIFTS[0] <= shift <= requant.POW2_TABLE_SHIFTS[1]
    table = shifted_code_table(shift, 2, max(2 * shift, 1))  # power_of_two_table, as the kernel forms it
    want = pow2_code_table(shift)
    for m in range(largest + 1):
        assert table_byte(table, m) == table_byte(want, m), m
        assert requant.E2M1_VALUES[m] * 2**shift <= 6


def test_requant_exponent_path():
    """e2m1 -> e2m1 with UE8M0 in and out (EXPONENT_PATH_INPUTS): for every input exponent byte and largest code, what
    block_scale gives (the float amax, its floor, pow2_scale_exponent, inverse_pow2 and the product with the input's
    scale, each rounded to float32), against the integer path's byte e - (7 - L) / 2 and factor 2^((7 - L) / 2): equal
    wherever the kernel takes the integer path, and different just outside it, so neither bound is slack."""
    np = pytest.importorskip('numpy')
    from kernel_src.quant.common import FORMATS, pow2_scale_carry

    fmax, floor = FORMATS['e2m1']
    carry, f = pow2_scale_carry(fmax)
    byte = np.arange(256, dtype=np.uint32)[:, None]
    largest = np.arange(8)[None, :]
    scale = (byte << np.uint32(23)).view(np.float32)  # as load_chunk reads the byte: 0 is 0.0, 255 inf
    with np.errstate(over='ignore', invalid='ignore'):
        amax = np.array(requant.E2M1_VALUES, np.float32)[largest] * scale
        clamped = np.maximum(amax, np.float32(floor))
        bits = clamped.view(np.int32).astype(np.int64)
        exponent = np.where(bits >= 0x7F800000, 255, np.maximum(((bits + carry) >> 23) - f, 1))
        multiplier = ((254 - exponent).clip(0, 255).astype(np.uint32) << np.uint32(23)).view(np.float32)
        factor = scale * multiplier
    shift = (7 - largest) >> 1
    same = (exponent == byte.astype(np.int64) - shift) & (factor == np.exp2(shift).astype(np.float32))
    low, high = requant.EXPONENT_PATH_INPUTS
    taken = (byte >= low) & (byte <= high) & (largest >= 1)
    assert same[taken.nonzero()].all()
    assert not same[low - 1, 1:].all() and not same[high + 1, 1:].all()


def test_requant_f16_exponent_path():
    """e4m3 -> e2m1 with UE8M0 in and out (F16_EXPONENT_PATH_BYTES): for every positive finite e4m3 amax and input byte,
    what block_scale gives (the float amax times the input's scale, its floor, pow2_scale_exponent, inverse_pow2 and
    the factor, each rounded to float32), against the kernel's integer byte (input byte plus amax_shift, from the
    amax's bits) and factor 2^-amax_shift: equal wherever the kernel takes that path, with a factor the f16 lanes take
    (|amax_shift| <= 11, amax times it at most 6), and different just outside each bound."""
    np = pytest.importorskip('numpy')
    from kernel_src.quant.common import FORMATS, pow2_scale_carry

    fmax, floor = FORMATS['e2m1']
    carry, f = pow2_scale_carry(fmax)
    assert requant.F16_EXPONENT_PATH_CARRY == carry
    byte = np.arange(256, dtype=np.int64)[:, None]
    e4m3 = torch.arange(1, 127, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()  # 2^-9 .. 448
    amax = e4m3[None, :]
    scale = (byte.astype(np.uint32) << np.uint32(23)).view(np.float32)  # as load_chunk reads the byte: 0 is 0.0, 255 inf
    with np.errstate(over='ignore', invalid='ignore'):
        clamped = np.maximum(amax * scale, np.float32(floor))
        bits = clamped.view(np.int32).astype(np.int64)
        exponent = np.where(bits >= 0x7F800000, 255, np.maximum(((bits + carry) >> 23) - f, 1))
        multiplier = ((254 - exponent).clip(0, 255).astype(np.uint32) << np.uint32(23)).view(np.float32)
        factor = scale * multiplier
    amax_shift = ((amax.view(np.uint32).astype(np.int64) + requant.F16_EXPONENT_PATH_CARRY) >> 23) - (127 + f)
    sf_byte = byte + amax_shift
    low, high = requant.F16_EXPONENT_PATH_BYTES
    first, last = requant.F16_EXPONENT_PATH_INPUTS
    taken = (byte >= first) & (byte <= last) & (sf_byte >= low) & (sf_byte <= high)
    same = (exponent == sf_byte) & (factor == np.exp2(-amax_shift.astype(np.float64)).astype(np.float32))
    assert same[taken.nonzero()].all()
    assert (np.abs(amax_shift) <= 11).all() and (amax * np.exp2(-amax_shift.astype(np.float64)) <= 6).all()
    assert not same[sf_byte == low - 1].all() and not same[(sf_byte == high + 1) & (byte <= last)].all()
    for outside in (first - 1, last + 1):  # a zero scale (the floor sets the byte) and an infinite one
        assert not same[outside][(sf_byte[outside] >= low) & (sf_byte[outside] <= high)].any()


def test_requant_halving_steps_of_largest():
    """halving_steps_of_largest, replayed on chunks holding every set of magnitudes (with random signs and repeats):
    (7 - L) / 2 and L >= 1 for the largest magnitude L, without L."""
    generator = torch.Generator().manual_seed(5)
    sets = [[m for m in range(8) if p >> m & 1] or [0] for p in range(256) for _ in range(8)]  # which magnitudes a chunk holds
    picks = torch.tensor([[c[i % len(c)] for i in range(32)] for c in sets])[:, torch.randperm(32, generator=generator)]
    codes = picks | (torch.randint(0, 2, picks.shape, generator=generator) << 3)  # a random sign per nibble
    words = sum(codes.view(-1, 4, 8)[:, :, i] << (4 * i) for i in range(8))
    magnitudes = (words & nibbles.CODE_MAGNITUDES).unbind(1)
    any_bits, top_pairs = 0, 0
    for m in magnitudes:
        any_bits, top_pairs = any_bits | m, top_pairs | (m & (m << 1))
    at_least = lambda bits, mask: ((bits & mask) != 0).long()
    steps = 3 - at_least(any_bits, nibbles.CODE_BITS_2_1) - at_least(any_bits, nibbles.CODE_BIT_2) - at_least(top_pairs, nibbles.CODE_BIT_2)
    largest = picks.amax(dim=1)
    nonzero = largest >= 1
    assert torch.equal(any_bits != 0, nonzero)
    assert torch.equal(steps[nonzero], ((7 - largest) >> 1)[nonzero])
    assert set(largest.tolist()) == set(range(8))
