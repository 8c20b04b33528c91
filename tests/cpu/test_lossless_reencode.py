"""kernel_src.quant.per_block_cast_lossless.e4m3_word_of_e2m1 (the byte-permute re-encoding of e2m1 codes as
e4m3 bytes) against torch's own float8_e4m3fn conversion of the decoded values times 2^d, for every 16-bit
group of four codes and every scale offset d the kernel accepts (its device assert rejects the others)."""

from __future__ import annotations

import pytest
import torch

from tile_kernels_aot.reference.cast import E2M1_VALUES

lossless = pytest.importorskip('kernel_src.quant.per_block_cast_lossless')


def byte_perm(x: torch.Tensor, y: torch.Tensor, selector: torch.Tensor) -> torch.Tensor:
    """CUDA's __byte_perm on int64 tensors holding uint32s: byte n of the result is byte (selector >> 4n) & 7
    of the eight bytes of x (0..3) and y (4..7); only the low 16 bits of the selector are read."""
    source = x | (y << 32)
    result = torch.zeros_like(x)
    for n in range(4):
        index = (selector >> (4 * n)) & 7
        result |= ((source >> (8 * index)) & 0xFF) << (8 * n)
    return result


def emulated_e4m3_bytes(words: torch.Tensor, d: int) -> torch.Tensor:
    """The eight e4m3 bytes (int64 [n, 8]) the kernel writes for the eight codes of each uint32 word."""
    k = (d + 6) << 3
    table_low = (k * 0x01010100 + lossless.E4M3_TABLE_LOW) & 0xFFFFFFFF
    table_high = (k * 0x01010101 + lossless.E4M3_TABLE_HIGH) & 0xFFFFFFFF
    magnitudes = words & lossless.CODE_MAGNITUDES
    out = []
    for half in range(2):
        encoded = byte_perm(torch.full_like(words, table_low), torch.full_like(words, table_high), magnitudes >> (16 * half))
        doubled = byte_perm(words, torch.zeros_like(words), torch.full_like(words, 0x1100 + 0x2222 * half))
        result = encoded | (((doubled << 4) & 0xFFFFFFFF) & lossless.SIGN_BITS_EVEN) | (doubled & lossless.SIGN_BITS_ODD)
        out += [(result >> (8 * i)) & 0xFF for i in range(4)]
    return torch.stack(out, dim=1)


@pytest.mark.parametrize('d', range(-lossless.MAX_SPAN, lossless.EXPONENT_SHIFT + 1))
def test_byte_permute_reencoding_matches_the_float8_conversion(d):
    # Every 16-bit group of four codes, once in the low and once in the high half of a word.
    groups = torch.arange(1 << 16, dtype=torch.int64)
    words = torch.cat([groups, groups << 16])
    got = emulated_e4m3_bytes(words, d)
    values = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)  # codes 0..15
    codes = torch.stack([(words >> (4 * i)) & 15 for i in range(8)], dim=1)
    want = (values[codes] * 2.0**d).to(torch.float8_e4m3fn).view(torch.uint8).long()
    # -0.0 (code 8) converts to 0x80, the kernel's sign bit on a zero magnitude byte.
    assert torch.equal(got, want), (got != want).nonzero()[:5]
