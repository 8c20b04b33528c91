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

from tile_kernels_aot.reference.cast import E2M1_VALUES

nibbles = pytest.importorskip('kernel_src.quant.nibbles')
lossless = pytest.importorskip('kernel_src.quant.per_block_cast_lossless')
requant = pytest.importorskip('kernel_src.quant.per_token_requant')

SIGNED_VALUES = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)  # by code 0..15


def byte_perm(x: torch.Tensor, y, selector) -> torch.Tensor:
    """CUDA's __byte_perm on int64 tensors (or ints) holding uint32s: byte n of the result is byte
    (selector >> 4n) & 7 of the eight bytes of x (0..3) and y (4..7); only the low 16 bits of the selector
    are read."""
    x, y, selector = (torch.as_tensor(v, dtype=torch.int64).expand_as(x) for v in (x, y, selector))
    source = x | (y << 32)
    result = torch.zeros_like(x)
    for n in range(4):
        index = (selector >> (4 * n)) & 7
        result |= ((source >> (8 * index)) & 0xFF) << (8 * n)
    return result


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
    assert not ((magnitudes | (magnitudes >> 4) | (magnitudes >> 16) | (magnitudes >> 20)) & 0x8888).any()
    lookup = lambda selectors: byte_perm(torch.full_like(words, codes_low), codes_high, selectors)
    first = (lookup(magnitudes >> 4) * 16 + lookup(magnitudes)) & 0xFFFFFFFF
    second = (lookup(magnitudes >> 20) * 16 + lookup(magnitudes >> 16)) & 0xFFFFFFFF
    got = byte_perm(first, second, 0x6420) ^ (words & nibbles.CODE_SIGNS)
    inputs = codes_of(words)
    want_codes = table[inputs & 7] ^ (inputs & 8)
    want = sum(want_codes[:, i] << (4 * i) for i in range(8))
    assert torch.equal(got, want)


def test_requant_pow2_tables_by_selector():
    """The constant e2m1 -> e2m1 tables of shifts 0..3 as the kernel picks them: the identity bytes permuted by
    the 64-bit selector constant shifted right by 16 * shift (a permute reads the low 16 bits)."""
    for shift, tables in enumerate(requant.POW2_CODE_TABLES):
        for half, all_selectors in enumerate(requant.POW2_TABLE_SELECTORS):
            selectors = (all_selectors >> (16 * shift)) & 0xFFFFFFFF
            assert not selectors & 0x8888  # prmt, not __byte_perm: bit 3 clear
            got = byte_perm(torch.tensor([requant.IDENTITY_BYTES[0]]), requant.IDENTITY_BYTES[1], selectors).item()
            assert got == tables[half], (shift, half)
        assert tables == requant.pow2_code_table(shift)


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
