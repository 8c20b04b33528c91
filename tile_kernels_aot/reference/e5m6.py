"""E5M6 casts (one scale factor per token), written for clarity rather than speed.

E5M6 is the top 12 bits of an IEEE half: 1 sign, 5 exponent (bias 15) and 6 mantissa bits, max 65024,
smallest subnormal 2^-20. A float32 v encodes as
  h = the bits of half(v) rounded toward zero,
  code = h >> 4, plus one where (code & 1) + (bits(v) & 0x1FFFF) > 0x10000, masked to 12 bits
(upstream's rounding: half-to-even on the 17 float32 mantissa bits below the 6 kept ones). Eight codes
pack into three little-endian uint32 words: w0 = h0 << 20 | h1 << 8 | h2 >> 4,
w1 = h2 << 28 | h3 << 16 | h4 << 4 | h5 >> 8, w2 = h5 << 24 | h6 << 12 | h7; uint8 [M, 3K/2].

Per token: amax, clamped = max(amax, 1e-4), sf = clamped / 65024, multiplier 65024 / clamped (two
divisions), or with round_sf the power of two at or above sf and its exact inverse; data = e5m6(x *
multiplier). Scale factors float32 [M, 1], row-major or column-major (strides (1, align(M, 4))), or packed
UE8M0: int32 words holding the exponent in their low byte, column-major.
"""

from __future__ import annotations

import torch

from tile_kernels_aot.reference.cast import _align, _dequantize

E5M6_MAX, AMAX_FLOOR = 65024.0, 1e-4
_U32 = 0xFFFFFFFF


def _half_rtz_bits(v: torch.Tensor) -> torch.Tensor:
    """int64 bits of half(v) rounded toward zero, as the hardware's cvt.rz.f16.f32 (a finite value too large
    for a half gives the largest finite half; the casts never produce one: |x * multiplier| <= 65024 * (1 + 2^-23))."""
    bits = v.contiguous().view(torch.int32).to(torch.int64) & _U32
    sign = (bits >> 16) & 0x8000
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = sign | ((exp - 112) << 10) | (mant >> 13)
    subnormal = sign | ((0x800000 | mant) >> (126 - exp).clamp(min=0, max=63))
    out = torch.where(exp >= 113, normal, torch.where(exp >= 103, subnormal, sign))
    out = torch.where((exp > 142) & (exp < 255), sign | 0x7BFF, out)
    return torch.where(exp == 255, torch.where(mant == 0, sign | 0x7C00, torch.full_like(out, 0x7FFF)), out)


def e5m6_codes(v: torch.Tensor) -> torch.Tensor:
    """The 12-bit e5m6 codes (int64) of float32 v."""
    code = _half_rtz_bits(v) >> 4
    below = v.contiguous().view(torch.int32).to(torch.int64) & 0x1FFFF
    return (code + (((code & 1) + below) > 0x10000).to(torch.int64)) & 0xFFF


def pack_e5m6(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [M, 3K/2] of int64 codes [M, K] (K a multiple of 8)."""
    m, k = codes.shape
    h = codes.view(m, k // 8, 8).unbind(-1)
    w0 = (h[0] << 20) | (h[1] << 8) | (h[2] >> 4)
    w1 = (h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8)
    w2 = (h[5] << 24) | (h[6] << 12) | h[7]
    words = torch.stack([w0, w1, w2], dim=-1) & _U32
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # the same 32 bits
    return words.view(m, k // 8 * 3).view(torch.uint8)


def unpack_e5m6(data: torch.Tensor) -> torch.Tensor:
    """float32 [M, K] of uint8 [M, 3K/2]: each code in the top 12 bits of a half."""
    m, width = data.shape
    k = width // 3 * 2
    words = (data.contiguous().view(torch.int32).to(torch.int64) & _U32).view(m, k // 8, 3)
    w0, w1, w2 = words.unbind(-1)
    halves = torch.stack([
        w0 >> 16, w0 >> 4, (w0 << 8) | (w1 >> 24), w1 >> 12, w1, (w1 << 12) | (w2 >> 20), w2 >> 8, w2 << 4,
    ], dim=-1) & 0xFFF0
    halves = torch.where(halves >= 2**15, halves - 2**16, halves).to(torch.int16)
    return halves.view(torch.float16).float().view(m, k)


def cast_to_e5m6(
    x: torch.Tensor,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data uint8 [M, 3K/2], sf) of a bf16/fp32 x [M, K]; num_per_channels must equal K (one scale factor per
    token, as upstream's kernel requires); packed UE8M0 needs round_sf and the column-major flag."""
    m, k = x.shape
    if num_per_channels != k or k % 8:
        raise ValueError(f'reference cast_to_e5m6: num_per_channels must equal hidden ({k}) and hidden be divisible by 8')
    if use_packed_ue8m0 and not (round_sf and use_tma_aligned_col_major_sf):
        raise ValueError('reference cast_to_e5m6: packed UE8M0 scale factors need round_sf and use_tma_aligned_col_major_sf')
    values = x.float()
    clamped = values.abs().amax(dim=1, keepdim=True).clamp(min=AMAX_FLOOR) if k else values.new_full((m, 1), AMAX_FLOOR)
    sf = clamped / torch.full_like(clamped, E5M6_MAX)
    if round_sf:
        exponent = ((sf.view(torch.int32) - 1) >> 23) + 1  # biased exponent of the power of two at or above sf
        multiplier = ((254 - exponent) << 23).view(torch.float32)
        sf = (exponent << 23).view(torch.float32)
    else:
        exponent = None
        multiplier = torch.full_like(clamped, E5M6_MAX) / clamped
    data = pack_e5m6(e5m6_codes(values * multiplier))
    if not use_tma_aligned_col_major_sf:
        return data, sf
    stored = exponent if use_packed_ue8m0 else sf  # packed: the exponent in the low byte, the other bytes zero
    storage = torch.zeros((1, _align(m, 4)), dtype=stored.dtype, device=x.device)
    storage[:, :m] = stored.T
    return data, storage[:, :m].T


def cast_back_from_e5m6(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int]) -> torch.Tensor:
    """Dequantise (data, sf) to 'fp32' or 'bf16': float(code) * sf per (m, n) block, rounded once. sf is
    float32 in any strides, or packed UE8M0 int32 words (four block exponents a word, low byte first)."""
    data, sf = x
    return _dequantize(unpack_e5m6(data), sf, x_block_size, fmt)
