"""kernel_src.quant.cast_back's e2m1 -> e4m3 byte rewrite against the reference's e2m1 values, bit for bit.

The kernel turns each quad of e2m1 codes into the e4m3 bytes of the same values (two __byte_perm, a
multiply, masks; see e2m1_quad_as_e4m3) and converts those as e4m3 data. This replays the instructions on
every 16-bit quad of codes, in both halves of a word (with other codes in the other half), and compares
the float32 values of the bytes with the reference's e2m1_unpack, sign of zero included.
"""

from __future__ import annotations

import pytest
import torch

from kernel_src.quant import cast_back
from tests.cpu.cuda_intrinsics import byte_perm
from tile_kernels_aot.reference.cast import e2m1_unpack

MASK32 = 0xFFFFFFFF


def emulated_quad(codes: torch.Tensor, quad: int) -> torch.Tensor:
    low, high = cast_back.E2M1_MAGNITUDES_AS_E4M3
    magnitudes = byte_perm(torch.full_like(codes, low), high, codes >> (16 * quad))
    spread = byte_perm(codes, 0, torch.full_like(codes, cast_back.SIGN_SPREAD_SELECTOR + cast_back.SIGN_SPREAD_QUAD_STEP * quad))
    signs = ((spread & cast_back.SPREAD_SIGN_BITS) * cast_back.SIGN_CARRY_MULTIPLIER & MASK32) & cast_back.E4M3_SIGN_BITS
    return signs | magnitudes


@pytest.mark.parametrize('quad', [0, 1])
def test_every_quad_of_codes(quad):
    quads = torch.arange(1 << 16, dtype=torch.int64)
    other = torch.randint(0, 1 << 16, quads.shape, generator=torch.Generator().manual_seed(quad))
    codes = (quads << 16 | other) if quad else (other << 16 | quads)
    words = emulated_quad(codes, quad)
    got = words.to(torch.int32).view(torch.uint8).view(-1, 4).view(torch.float8_e4m3fn).float()
    code_bytes = torch.stack([(quads >> (8 * b)) & 0xFF for b in range(2)], 1).to(torch.uint8).view(torch.int8)
    want = e2m1_unpack(code_bytes)  # [2^16, 4]: the four codes of each quad, low nibble first
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
