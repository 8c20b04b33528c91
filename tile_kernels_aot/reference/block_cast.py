"""References for the block casts, written for clarity rather than speed, runnable on CPU.

``per_block_cast`` and its two variants are ``cast`` of reference/cast.py with a (block_m, block_k) block
(the same arithmetic, blocks of several tokens): they are spelt out here under the op names so that a
test reads like the call it checks. ``per_block_cast_lossless`` re-encodes e2m1 data with power-of-two
scale factors as e4m3 on larger blocks, exactly as the kernel does (see its docstring).
"""

from __future__ import annotations

import torch

from tile_kernels_aot.reference.cast import _empty_sf, _format_sf, _sf_values, cast, e2m1_unpack

EXPONENT_SHIFT = 6  # e2m1's largest exponent (2^2) to e4m3's (2^8)
MAX_SPAN = 5  # e2m1's smallest value (2^-1) to e4m3's smallest normal (2^-6)


def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x quantised with one scale factor per ``block_size`` block (see reference.cast)."""
    return cast(x, fmt, tuple(block_size), round_sf=round_sf, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
                use_packed_ue8m0=use_packed_ue8m0)


def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """``per_block_cast(...)[1]``."""
    return per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)[1]


def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """The data of x quantised with multiplier 1 / sf per block (sf float32, one per block)."""
    return cast(x, fmt, tuple(block_size), sf=sf)


def _exponents(sf: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """int32 biased exponents of float32 scale factors (bits >> 23, unsigned) or of packed UE8M0 words,
    one per block: [rows, num_blocks]."""
    values = _sf_values(sf)[:, :num_blocks]
    return (values.contiguous().view(torch.int32) >> 23) & 0x1FF


def per_block_cast_lossless(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    x_block_size: tuple[int, int],
    out_block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode e2m1 ``(data, sf)`` with power-of-two scale factors on ``x_block_size`` blocks as e4m3 with
    scale factors on ``out_block_size`` blocks (a multiple of the input block), without loss.

    With e_in the biased exponent of an input scale factor and out_exp = max(e_in over the input blocks of
    an output block) - 6, saturating at 0: the output scale factor is the power of two with biased exponent
    out_exp (0.0 for out_exp 0), and each element is e4m3(float(q) * 2^(e_in - out_exp)), exact. Raises
    ValueError where the kernel's device assert would fire (e_in + 5 < out_exp). ``round_sf`` has no effect
    (the scale factors are powers of two anyway); the layout flags choose the output's scale-factor layout.
    """
    data, sf = x
    if fmt != 'e4m3' or data.dtype != torch.int8:
        raise ValueError('reference per_block_cast_lossless: only e2m1 (int8) data to e4m3')
    (ibm, ibk), (obm, obk) = x_block_size, out_block_size
    if obm % ibm or obk % ibk:
        raise ValueError(f'reference per_block_cast_lossless: out_block_size {out_block_size} must be a multiple of x_block_size {x_block_size}')
    m, k = data.shape[0], data.shape[1] * 2
    out_rows, out_blocks = -(-m // obm), -(-k // obk)
    if m == 0:
        out = torch.empty((0, k), dtype=torch.float8_e4m3fn, device=data.device)
        return out, _empty_sf(out_blocks, use_tma_aligned_col_major_sf, use_packed_ue8m0, data.device)
    in_rows, in_blocks = -(-m // ibm), -(-k // ibk)
    e_in = _exponents(sf, in_blocks)[:in_rows]
    # Max over the input blocks of each output block; the padding (no real elements) counts as 0.
    rm, rk = obm // ibm, obk // ibk
    padded = torch.nn.functional.pad(e_in, (0, out_blocks * rk - in_blocks, 0, out_rows * rm - in_rows))
    out_exp = (padded.view(out_rows, rm, out_blocks, rk).amax(dim=(1, 3)) - EXPONENT_SHIFT).clamp(min=0)
    # Per element: its input block's exponent and its output block's.
    e_in_el = e_in.repeat_interleave(ibm, dim=0).repeat_interleave(ibk, dim=1)[:m, :k]
    out_exp_el = out_exp.repeat_interleave(obm, dim=0).repeat_interleave(obk, dim=1)[:m, :k]
    if bool((e_in_el + MAX_SPAN < out_exp_el).any()):
        raise ValueError('reference per_block_cast_lossless: the input scale factors of an output block span more than 2^11')
    scale = ((e_in_el - out_exp_el + 127) << 23).view(torch.float32)
    out = (e2m1_unpack(data) * scale).to(torch.float8_e4m3fn)
    return out, _format_sf((out_exp << 23).view(torch.float32), use_tma_aligned_col_major_sf, use_packed_ue8m0)
