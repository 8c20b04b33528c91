"""Block-scaled FP8 (e4m3) and FP4 (e2m1) casts, written for clarity rather than speed.

The arithmetic follows the kernels operation for operation so that results compare bit for bit:
amax in float32, clamped = max(amax, floor), sf = clamped / max, multiplier = max / clamped (two
divisions, not one division and a reciprocal), or with round_sf the power of two at or above sf and its
exact inverse; then x * multiplier in float32, and
  e4m3: saturated to +-448 and rounded to nearest even (max 448, floor 1e-4);
  e2m1: rounded to nearest even among 0, 0.5, 1, 1.5, 2, 3, 4, 6 and saturated at 6 (max 6, floor
        6 * 2^-126), the sign kept (also on a zero), two codes per int8 with the even column in the low
        nibble.
Scale-factor layouts as upstream: row-major float32; TMA-aligned column-major float32 (strides
(1, align(M, 4))); packed UE8M0 (column-major int32 words of four exponent bytes, block 4w + i in byte i
of word w, the bytes past the last block zero).
"""

from __future__ import annotations

import torch

FORMATS = {'e4m3': (448.0, 1e-4), 'e2m1': (6.0, 6.0 * 2.0**-126)}  # (max, amax floor)
E4M3_MAX, E4M3_AMAX_FLOOR = FORMATS['e4m3']
# Round-to-nearest-even onto the e2m1 magnitudes as thresholds on |v|: the code is the number of thresholds
# passed, inclusive where the tie goes up to the even code (codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6).
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """x as float32 padded to whole blocks, viewed (Mb, bm, Kb, bk), plus the mask of real elements."""
    bm, bk = block
    m, k = x.shape
    pm, pk = -m % bm, -k % bk
    padded = torch.nn.functional.pad(x.float(), (0, pk, 0, pm))
    real = torch.nn.functional.pad(torch.ones_like(x, dtype=torch.bool), (0, pk, 0, pm))
    shape = ((m + pm) // bm, bm, (k + pk) // bk, bk)
    return padded.view(shape), real.view(shape)


def _round_up_pow2(sf: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= sf, for positive normal float32 sf."""
    bits = sf.view(torch.int32)
    return ((bits + 0x7FFFFF) & 0x7F800000).view(torch.float32)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """The 4-bit e2m1 codes (uint8, sign in bit 3) of float32 v: RTNE, saturating at 6."""
    a = v.abs()
    code = (v.view(torch.int32) < 0).to(torch.uint8) * 8
    for threshold, inclusive in E2M1_THRESHOLDS:
        code += (a >= threshold if inclusive else a > threshold).to(torch.uint8)
    return code


def e2m1_unpack(data: torch.Tensor) -> torch.Tensor:
    """float32 [M, 2K] of int8 [M, K] e2m1 pairs (low nibble first), -0.0 for the negative zero code."""
    codes = data.view(torch.uint8)
    codes = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(data.shape[0], data.shape[1] * 2).long()
    magnitude = torch.tensor(E2M1_VALUES, device=data.device)[codes & 7]
    return torch.where(codes >= 8, -magnitude, magnitude)


def _sf_values(sf: torch.Tensor) -> torch.Tensor:
    """float32 scale factors of a float32 or packed UE8M0 (int32 words) tensor, one per block."""
    if sf.dtype == torch.float32:
        return sf
    if sf.numel() == 0:  # an empty tensor's strides need not allow the byte view below
        return torch.empty((sf.shape[0], sf.shape[1] * 4), dtype=torch.float32, device=sf.device)
    exponents = sf.T.contiguous().view(torch.uint8).view(sf.shape[1], sf.shape[0], 4).permute(1, 0, 2).reshape(sf.shape[0], sf.shape[1] * 4)
    return (exponents.to(torch.int32) << 23).view(torch.float32)


def _empty_sf(num_blocks: int, col_major: bool, packed: bool, device: torch.device) -> torch.Tensor:
    """The scale factors of zero rows in the layout asked (_format_sf needs at least one row)."""
    if packed:
        return torch.empty((-(-num_blocks // 4), 0), dtype=torch.int32, device=device).T
    if col_major:
        return torch.empty((num_blocks, 0), dtype=torch.float32, device=device).T
    return torch.empty((0, num_blocks), dtype=torch.float32, device=device)


def _format_sf(scale: torch.Tensor, col_major: bool, packed: bool) -> torch.Tensor:
    """Float32 [Mb, Kb] scale factors in the requested layout (see the module docstring)."""
    if not col_major:
        return scale.contiguous()
    mb, kb = scale.shape
    if packed:
        exponents = torch.zeros((_align(kb, 4), _align(mb, 4)), dtype=torch.uint8, device=scale.device)
        exponents[:kb, :mb] = (scale.view(torch.int32) >> 23).to(torch.uint8).T
        # Column-major words: storage [word][token][byte].
        words = exponents.view(-1, 4, _align(mb, 4)).permute(0, 2, 1).contiguous().view(torch.int32)
        return words.view(-1, _align(mb, 4)).T[:mb]
    storage = torch.zeros((kb, _align(mb, 4)), dtype=torch.float32, device=scale.device)
    storage[:, :mb] = scale.T
    return storage.T[:mb]


def cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor | None = None,
    x_block_size: tuple[int, int] | None = None,
    round_sf: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Quantise a 2-D bf16/fp32 tensor to e4m3 or e2m1 with one scale factor per `block_size` block.

    Returns (data, sf): data float8_e4m3fn [M, K] or int8 [M, K / 2] (e2m1); sf in the layout the flags
    choose (see the module docstring; packed UE8M0 needs round_sf and the column-major flag). With a
    given float32 `sf` (the precomputed case, any strides) returns only the data, quantised with
    multiplier 1 / sf. `x` may also be a quantised (data, sf) pair with scale-factor blocks of
    `x_block_size`: re-quantised as upstream's per_token_cast does (see _requantize).
    """
    if fmt not in FORMATS:
        raise NotImplementedError(f'reference cast: fmt={fmt!r} is not implemented, only e4m3 and e2m1')
    if isinstance(x, tuple):
        return _requantize(x, fmt, block_size, x_block_size, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f'reference cast: x must be a 2-D bfloat16/float32 tensor, got {x.dim()}-d {x.dtype}')
    if use_packed_ue8m0 and not (round_sf and use_tma_aligned_col_major_sf) and sf is None:
        raise ValueError('reference cast: packed UE8M0 scale factors need round_sf and use_tma_aligned_col_major_sf')
    m, k = x.shape
    if m == 0:
        data = x.new_empty((0, k // 2 if fmt == 'e2m1' else k), dtype=torch.int8 if fmt == 'e2m1' else torch.float8_e4m3fn)
        if sf is not None:
            return data
        return data, _empty_sf(-(-k // block_size[1]), use_tma_aligned_col_major_sf, use_packed_ue8m0, x.device)
    blocks, _ = _blocks(x, block_size)
    if sf is None:
        scale, multiplier = _block_scales(x.abs(), block_size, fmt, round_sf)
    else:
        scale = sf
        multiplier = 1.0 / sf
    q = (blocks * multiplier[:, None, :, None]).reshape(blocks.shape[0] * blocks.shape[1], blocks.shape[2] * blocks.shape[3])[:m, :k]
    data = _encode(q, fmt)
    if sf is not None:
        return data
    return data, _format_sf(scale, use_tma_aligned_col_major_sf, use_packed_ue8m0)


def _block_scales(magnitudes: torch.Tensor, block_size: tuple[int, int], fmt: str, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, multiplier) per block of float32 magnitudes [M, K]: clamped = max(amax, floor), sf = clamped / max
    and multiplier = max / clamped (two divisions), or with round_sf the power of two at or above sf and its
    exact inverse."""
    fmax, floor = FORMATS[fmt]
    blocks, real = _blocks(magnitudes, block_size)
    amax = torch.where(real, blocks, torch.zeros((), device=magnitudes.device)).amax(dim=(1, 3))
    clamped = amax.clamp(min=floor)
    scale = clamped / torch.full_like(clamped, fmax)
    if round_sf:
        scale = _round_up_pow2(scale)
        return scale, 1.0 / scale
    return scale, torch.full_like(clamped, fmax) / clamped


def _encode(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 [M, K] already scaled: e4m3 saturated at 448, or e2m1 codes two per int8 (even column low)."""
    if fmt == 'e4m3':
        return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    m, k = v.shape
    codes = e2m1_codes(v.contiguous()).view(m, k // 2, 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).view(torch.int8)


def _requantize(x: tuple[torch.Tensor, torch.Tensor], fmt: str, block_size: tuple[int, int], x_block_size: tuple[int, int] | None,
                round_sf: bool, col_major: bool, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cast of a quantised (data, sf) input, as upstream's per_token_cast computes it (not via a dequantised copy):
    amax = max |q| * s over the block (s the input scale factor of each element), and q * (s * multiplier).
    As upstream, s * multiplier can overflow to inf for an all-zero block (e2m1's floor makes the
    multiplier up to 2^126); 0 * inf is then NaN, which encodes by its sign bit (a CUDA NaN is positive:
    +0), so the kernel and this reference agree when both run on the GPU."""
    if x_block_size is None:
        raise ValueError('reference cast: a (data, sf) input needs x_block_size')
    data, in_sf = x
    q = e2m1_unpack(data) if data.dtype == torch.int8 else data.float()
    m, k = q.shape
    s = _sf_values(in_sf).repeat_interleave(x_block_size[0], dim=0).repeat_interleave(x_block_size[1], dim=1)[:m, :k]
    if m == 0:
        return cast(q, fmt, block_size, round_sf=round_sf, use_tma_aligned_col_major_sf=col_major, use_packed_ue8m0=packed)
    scale, multiplier = _block_scales(q.abs() * s, block_size, fmt, round_sf)
    expanded = multiplier.repeat_interleave(block_size[0], dim=0).repeat_interleave(block_size[1], dim=1)[:m, :k]
    return _encode(q * (s * expanded), fmt), _format_sf(scale, col_major, packed)


def cast_back(x: tuple[torch.Tensor, torch.Tensor], fmt: str, block_size: tuple[int, int]) -> torch.Tensor:
    """Dequantise (data, sf) back to 'fp32' or 'bf16': float(q) * sf per block, rounded once.

    data is float8_e4m3fn [M, K] or int8 [M, K / 2] (e2m1 pairs); sf float32 in any strides or packed
    UE8M0 int32 words (column-major, as cast returns them).
    """
    data, sf = x
    return _dequantize(e2m1_unpack(data) if data.dtype == torch.int8 else data.float(), sf, block_size, fmt)


def _dequantize(values: torch.Tensor, sf: torch.Tensor, block_size: tuple[int, int], fmt: str) -> torch.Tensor:
    """float32 values [M, K] times their block's scale factor (float32, or packed UE8M0 int32 words), rounded
    once to 'fp32' or 'bf16'."""
    m, k = values.shape
    expanded = _sf_values(sf).repeat_interleave(block_size[0], dim=0).repeat_interleave(block_size[1], dim=1)[:m, :k]
    out = values * expanded
    return out if fmt == 'fp32' else out.to(torch.bfloat16)
