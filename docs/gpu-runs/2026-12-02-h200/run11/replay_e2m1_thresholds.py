"""per_token_requant's e4m3 -> e2m1 path by thresholds (E4M3_TO_E2M1_THRESHOLDS_PRELUDE) against the reference's
e2m1 rounding, bit for bit.

`thresholds` replays tk_e2m1_thresholds for many factors at once: the approximate reciprocal (the exact float32
one, and that one a few ulps off either way, as rcp.approx may be; flushed as .ftz flushes), the e4m3 conversion
(round to nearest even, saturated at 448), and the float32 product checked against each threshold. `codes` replays
tk_e2m1_word_by_thresholds on 32-bit words: the byte subtractions whose borrows must stay inside their bytes, the
sign-replicating permutes, the selects and the packing. Every e4m3 value but the NaNs (the kernel sends a chunk
with a NaN down the float32 path) goes through each positive finite factor: random ones over a wide range of
binades, subnormal and huge ones, and ones that put a product on, or an ulp or two beside, every threshold.
GPU tests compare the kernel itself with the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tile_kernels_aot.reference.cast import E2M1_THRESHOLDS, e2m1_codes

pytest.importorskip('kernel_src.quant.per_token_requant')  # the prelude is build-time code

E4M3_CODES = [c for c in range(256) if c & 0x7F != 0x7F]  # every e4m3 byte but the two NaNs
SMALLEST_NORMAL = np.float32(2.0**-126)


def e4m3_values(codes) -> np.ndarray:
    return torch.tensor(list(codes), dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()


def e4m3_nearest(y: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e4m3x2.f32 of non-negative float32 y: the nearest e4m3 byte (ties to even), 0x7e above 448."""
    return torch.from_numpy(np.minimum(y, np.float32(448))).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.uint32)


def thresholds(f: np.ndarray, ulps: int) -> np.ndarray:
    """[F, 7] uint32: tk_e2m1_thresholds' B for each positive finite float32 factor, with its reciprocal `ulps` off."""
    with np.errstate(over='ignore'):  # 1 / f of a subnormal f, flushed to infinity below as .ftz does
        r = np.float32(1) / f
    r = np.nextafter(r, np.float32(np.inf) if ulps > 0 else np.float32(0)) if ulps else r
    for _ in range(abs(ulps) - 1):
        r = np.nextafter(r, np.float32(np.inf) if ulps > 0 else np.float32(0))
    r = np.where(f < SMALLEST_NORMAL, np.float32(np.inf), np.where(r < SMALLEST_NORMAL, np.float32(0), r))  # .ftz
    out = np.empty((f.shape[0], 7), dtype=np.uint32)
    for i, (t, inclusive) in enumerate(E2M1_THRESHOLDS):
        t = np.float32(t)
        with np.errstate(over='ignore', invalid='ignore'):  # t * inf
            m0 = e4m3_nearest((t * r).astype(np.float32))
        p = (e4m3_values(m0) * f).astype(np.float32)
        reached = p >= t if inclusive else p > t
        out[:, i] = (m0 + (~reached).astype(np.uint32)) * np.uint32(0x01010101)
    return out


def sign_masks(x: np.ndarray) -> np.ndarray:
    """PTX prmt.b32 x, 0, 0xBA98: each byte's bit 7 replicated over the byte."""
    return ((x >> np.uint32(7)) & np.uint32(0x01010101)) * np.uint32(0xFF)


def codes_of_words(w: np.ndarray, B: np.ndarray) -> np.ndarray:
    """tk_e2m1_codes_by_thresholds: w [F, N] words, B [F, 7] -> [F, N] bytes of code and sign (high nibbles loose)."""
    b = [B[:, i:i + 1] for i in range(7)]
    x = w | np.uint32(0x80808080)
    c2 = sign_masks(x - b[3])
    c1 = sign_masks(x - ((b[5] & c2) | (b[1] & ~c2)))
    high, low = (b[6] & c2) | (b[2] & ~c2), (b[4] & c2) | (b[0] & ~c2)
    c0 = x - ((high & c1) | (low & ~c1))
    e = (c2 & np.uint32(0x04040404)) | (c1 & ~np.uint32(0x04040404))
    e = (e & ~np.uint32(0x01010101)) | ((c0 >> np.uint32(7)) & np.uint32(0x01010101))
    return (e & np.uint32(0x07070707)) | ((w >> np.uint32(4)) & ~np.uint32(0x07070707))


def codes(q_bytes: np.ndarray, B: np.ndarray) -> np.ndarray:
    """tk_e2m1_word_by_thresholds over consecutive words of q_bytes (a multiple of 8): [F, len / 8] uint32 words."""
    w = q_bytes.view(np.uint32)[None, :]
    e = codes_of_words(w, B)
    packed = (e & np.uint32(0x0F0F0F0F)) | ((e >> np.uint32(4)) & np.uint32(0xF0F0F0F0))
    a, b = packed[:, 0::2], packed[:, 1::2]  # elements 0-3 and 4-7 of each group of eight
    def byte(v, k):
        return (v >> np.uint32(8 * k)) & np.uint32(0xFF)
    return byte(a, 0) | (byte(a, 2) << np.uint32(8)) | (byte(b, 0) << np.uint32(16)) | (byte(b, 2) << np.uint32(24))


def reference_words(q_bytes: np.ndarray, f: np.ndarray) -> np.ndarray:
    """The reference's codes of RN(q * f), packed as the kernel packs them (element i of eight in nibble i)."""
    q = torch.from_numpy(e4m3_values(q_bytes))
    products = q[None, :] * torch.from_numpy(f)[:, None]  # float32 products, rounded once
    c = e2m1_codes(products).numpy().astype(np.uint32).reshape(f.shape[0], -1, 8)
    return sum(c[:, :, i] << np.uint32(4 * i) for i in range(8))


def factors() -> np.ndarray:
    rng = np.random.default_rng(0)
    random = (2.0 ** rng.uniform(-40, 40, 4000)).astype(np.float32)
    edges = np.array([2.0**-149, 2.0**-140, 2.0**-127, 2.0**-126, 1e-30, 3e-4, 1.0, 6.0 / 448, 1 / 3, 1e30, 3.0e38], dtype=np.float32)
    # Factors that put val(m) * f on a threshold, and an ulp or two either side of that factor.
    magnitudes = e4m3_values(range(1, 0x7F))
    on = np.array([t / v for t, _ in E2M1_THRESHOLDS for v in magnitudes], dtype=np.float64).astype(np.float32)
    on = on[np.isfinite(on) & (on > 0)]
    near = [on]
    for direction in (np.float32(np.inf), np.float32(0)):
        step = on
        for _ in range(2):
            step = np.nextafter(step, direction)
            near.append(step)
    return np.unique(np.concatenate([random, edges, *near]))


@pytest.mark.parametrize('ulps', [0, 1, -1, 2, -2])
def test_codes_by_thresholds_match_the_reference(ulps):
    f = factors()
    assert np.all(f > 0) and np.all(np.isfinite(f))
    q_bytes = np.array(E4M3_CODES + [0] * (-len(E4M3_CODES) % 8), dtype=np.uint8)  # padded with zeros to whole words
    expected = reference_words(q_bytes, f)
    for start in range(0, f.shape[0], 2048):
        chunk = f[start:start + 2048]
        got = codes(q_bytes, thresholds(chunk, ulps))
        mismatch = np.nonzero(got != expected[start:start + 2048])
        assert mismatch[0].size == 0, f'factor {chunk[mismatch[0][0]]!r}: word {mismatch[1][0]}'


def test_thresholds_are_ordered_and_in_range():
    B = thresholds(factors(), 0) & np.uint32(0xFF)
    assert np.all(np.diff(B.astype(np.int64), axis=1) >= 0), 'the binary search needs b1 <= ... <= b7'
    assert B.max() <= 0x7F
