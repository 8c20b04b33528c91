"""Hypothesis strategies shared by the fuzz tests: for every public op, a strategy of random VALID calls (shapes,
strides, storage offsets, dtypes, flags, token counts from 0), and mutations that make a valid call invalid.

A case builds its tensors on the device it is given: CPU for tests/cpu/test_fuzz_validation.py (where a valid call
must stop at the device check), CUDA for tests/gpu/test_fuzz_ops.py (where it must equal the reference).

Profiles: the fast one (a few examples per op) runs by default; TILE_KERNELS_AOT_FUZZ=large runs 1,000 examples per
op (TILE_KERNELS_AOT_FUZZ_EXAMPLES overrides the count of either).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import tile_kernels_aot
from tile_kernels_aot import engram, mhc, moe, quant, reference, transpose
from tile_kernels_aot.errors import SpecNotPrebuiltError
from tile_kernels_aot.modeling import engram as modeling_engram
from tile_kernels_aot.modeling import mhc as modeling_mhc

PROFILE_ENV = 'TILE_KERNELS_AOT_FUZZ'
EXAMPLES_ENV = 'TILE_KERNELS_AOT_FUZZ_EXAMPLES'
_COMMON = dict(deadline=None, database=None, print_blob=True, suppress_health_check=list(HealthCheck))
settings.register_profile('tile-kernels-aot-fast', max_examples=6, derandomize=True, **_COMMON)  # the same examples every run
settings.register_profile('tile-kernels-aot-large', max_examples=1000, **_COMMON)


def profile_name() -> str:
    return 'tile-kernels-aot-large' if os.environ.get(PROFILE_ENV, '') == 'large' else 'tile-kernels-aot-fast'


def fuzz_settings(fast_examples: int | None = None) -> settings:
    """The settings of one fuzz test: the profile the environment selects; `fast_examples` overrides the fast
    profile's count for a test whose examples cost more or less than most."""
    base = settings.get_profile(profile_name())
    count = os.environ.get(EXAMPLES_ENV)
    if count:
        return settings(base, max_examples=int(count))
    if fast_examples is not None and profile_name() == 'tile-kernels-aot-fast':
        return settings(base, max_examples=fast_examples)
    return base


def is_large() -> bool:
    return profile_name() == 'tile-kernels-aot-large'


# --- one call ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Call:
    """The arguments of one op call. `note` says which layout choices were drawn (for failure reports)."""
    args: list
    kwargs: dict
    note: str = ''

    def __call__(self, fn: Callable) -> Any:
        return fn(*self.args, **self.kwargs)

    def clone(self) -> Call:
        """The same call with every tensor cloned in place of its view (same shape, strides and offset), so that an
        op that writes in place leaves this one's inputs for the reference."""
        return Call(_map_tensors(self.args, _clone_view), _map_tensors(self.kwargs, _clone_view), self.note)


def _clone_view(t: torch.Tensor) -> torch.Tensor:
    storage = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=t.device)
    out = storage.as_strided(t.shape, t.stride(), t.storage_offset())
    out.copy_(t)
    return out


def _map_tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, tuple):
        return type(value)(*(_map_tensors(v, fn) for v in value)) if hasattr(value, '_fields') else tuple(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Case:
    """One public op. `build(draw, device, big)` draws a valid call; `names` are the op names its messages may
    carry (a composite's inner ops); `runs_anywhere` marks a pure-PyTorch op that a CPU tensor does not refuse;
    `ref(call)` is the reference result for the GPU test (None where the package has none) and `exact` says whether
    the op equals it bit for bit (else `tol`, torch.testing.assert_close's rtol / atol); `output_tol` gives single outputs
    (by position in the flattened result) a tolerance of their own, as upstream's tests do."""
    name: str
    fn: Callable
    build: Callable
    names: tuple[str, ...]
    ref: Callable | None = None
    exact: bool = True
    tol: dict | None = None
    output_tol: dict | None = None  # flattened output position -> assert_close's rtol / atol
    runs_anywhere: bool = False
    compare: Callable | None = None  # (actual, call) -> what is compared with ref(call); default: the result itself
    late: tuple = ()  # arguments (positions or names) not checked before the device: bounds from the arch package, or unused
    composite: bool = False  # calls several ops: a bad argument may first meet another argument's device check


# --- tensors ------------------------------------------------------------------------------------------------------------

def _seed(draw) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def values(draw, shape, dtype, device, *, low=None, high=None, scale=None) -> torch.Tensor:
    """A contiguous tensor of random values: normal floats (times a random power of two), integers in [low, high)."""
    gen = _seed(draw)
    if dtype.is_floating_point:
        if scale is None:
            scale = 2.0 ** draw(st.integers(-4, 4))
        t = torch.randn(shape, generator=gen) * scale
        return t.to(dtype).to(device)
    if dtype == torch.bool:
        return (torch.rand(shape, generator=gen) < 0.5).to(device)
    lo = -8 if low is None else low
    hi = 8 if high is None else high
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype).to(device)


def place(draw, t: torch.Tensor, *, align: int = 16, row_pad: bool = False, offset: bool = True) -> torch.Tensor:
    """t's values at a random storage offset that keeps `align`-byte alignment, and (with row_pad) a row stride
    padded by a multiple of `align` bytes: the layouts an op that takes strided rows must accept."""
    step = max(1, align // t.element_size())
    off = draw(st.integers(0, 3)) * step if offset else 0
    if row_pad and t.dim() >= 2 and t.shape[-2] > 1:
        pad = draw(st.integers(0, 2)) * step
    else:
        pad = 0
    if off == 0 and pad == 0:
        return t
    rows = math.prod(t.shape[:-1])
    width = t.shape[-1] + pad
    buf = torch.zeros(off + rows * width + step, dtype=t.dtype, device=t.device)
    strides = [width]
    for n in reversed(t.shape[1:-1]):
        strides.insert(0, strides[0] * n)
    view = buf.as_strided(t.shape, (*strides, 1) if t.dim() >= 2 else (1,), off)
    view.copy_(t)
    return view


def tokens(draw, big: bool, multiple: int = 1, *, small_max: int = 24, big_max: int = 4096) -> int:
    """A token count from 0: small on CPU, up to a few thousand (and the edges) on the GPU."""
    limit = big_max if big else small_max
    n = draw(st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, limit)))
    return n // multiple * multiple if multiple > 1 else n


def fused_layout(num_tokens: int, num_topk: int, num_experts: int, alignment: int, gen: torch.Generator, device):
    """A routing and its fused layout (reference.get_fused_mapping, on CPU), moved to `device`."""
    idx = torch.randint(-1, num_experts, (num_tokens, num_topk), generator=gen, dtype=torch.int64)
    maps = reference.get_fused_mapping(idx, num_experts, 0, alignment)
    return idx.to(device), [m.to(device) if isinstance(m, torch.Tensor) else m for m in maps]


F32, BF16, I32, I64 = torch.float32, torch.bfloat16, torch.int32, torch.int64
E4M3 = torch.float8_e4m3fn
FLOATS = (F32, BF16)


# --- moe ----------------------------------------------------------------------------------------------------------------

@st.composite
def b_topk_gate(draw, device, big):
    e = draw(st.sampled_from([8, 64, 72, 256]))
    t = tokens(draw, big)
    scores = place(draw, values(draw, (t, e), F32, device), align=4, row_pad=True)
    return Call([scores, draw(st.integers(1, min(e, moe.MAX_TOPK)))], {})


@st.composite
def b_topk_sum_group(draw, device, big):
    g = draw(st.sampled_from([1, 4, 8, 16, 32]))
    per = draw(st.sampled_from([1, 2, 8, 16]))
    t = tokens(draw, big)
    scores = values(draw, (t, g, per), F32, device)
    return Call([scores, draw(st.integers(1, min(2, per))), draw(st.integers(1, g))], {})


@st.composite
def b_top2_sum_gate(draw, device, big):
    e = draw(st.sampled_from([64, 128, 256]))
    t = tokens(draw, big)
    topk = draw(st.sampled_from([1, 2, 4, 6, 8]))
    grouping = draw(st.sampled_from([(0, 0), (8, 4), (8, 8), (16, 8)]))
    groups, kept = grouping
    if groups and kept * (e // groups) < topk:
        groups, kept = 0, 0
    shared = draw(st.booleans())
    num_shared = draw(st.sampled_from([1, 2])) if shared else 1
    if shared and (topk % num_shared or e % (topk // num_shared)):
        shared, num_shared = False, 1
    logits = values(draw, (t, e), F32, device)
    bias = values(draw, (e,), F32, device, scale=0.1)
    num_ep = draw(st.sampled_from([1, 2, 4]))
    num_tp = draw(st.sampled_from([1, 2]))
    kwargs = {}
    num_slots_shared = num_shared if shared else 0
    if shared or draw(st.booleans()):
        extra = max(num_slots_shared, draw(st.integers(0, 2)))
        logical = e + num_slots_shared
        gen = _seed(draw)
        kwargs['logical_count'] = torch.randint(1, extra + 2, (logical,), generator=gen, dtype=I32).to(device)
        kwargs['to_physical_map'] = torch.randint(0, e + extra, (logical, 1 + extra), generator=gen, dtype=I32).to(device)
    if draw(st.booleans()):
        kwargs['mask'] = values(draw, (t,), torch.bool, device)
    if draw(st.booleans()):
        kwargs['unmapped_topk_idx'] = values(draw, (t, topk), I64, device, low=0, high=e)
        if draw(st.booleans()):
            kwargs['fix_routing_mask'] = values(draw, (t,), torch.bool, device)
    args = [logits, bias, topk, kept, groups, shared, num_shared, draw(st.sampled_from([1.0, 2.5])),
            draw(st.integers(0, num_ep - 1)), num_ep, draw(st.integers(0, num_tp - 1)), num_tp,
            draw(st.sampled_from(moe.SCORING_FUNCS))]
    return Call(args, kwargs)


@st.composite
def b_normalize_weight(draw, device, big):
    t, k = tokens(draw, big), draw(st.integers(1, 16))
    w = place(draw, values(draw, (t, k), F32, device).abs(), align=4, row_pad=True)
    return Call([w], {})


def _index(draw, device, big, *, bound, k_max=16, negative=True):
    t, k = tokens(draw, big), draw(st.integers(1, k_max))
    dtype = draw(st.sampled_from([I64, I32]))
    idx = values(draw, (t, k), dtype, device, low=-1 if negative else 0, high=bound)
    return place(draw, idx, align=idx.element_size(), row_pad=True)


@st.composite
def b_group_count(draw, device, big):
    g = draw(st.sampled_from([1, 8, 64, 256, 1024]))
    return Call([_index(draw, device, big, bound=g), g], {})


@st.composite
def b_aux_fi(draw, device, big):
    e = draw(st.sampled_from([1, 8, 64, 256]))
    idx = _index(draw, device, big, bound=e)
    return Call([idx, e, draw(st.integers(1, 16))], {})


@st.composite
def b_unique(draw, device, big):
    g = draw(st.sampled_from([1, 8, 64, 1024]))
    return Call([_index(draw, device, big, bound=g), g], {})


@st.composite
def b_mask_tp(draw, device, big):
    num_ep = draw(st.sampled_from([1, 2, 8]))
    num_tp = draw(st.sampled_from([1, 2, 4]))
    n = num_ep * num_tp * draw(st.sampled_from([1, 4, 32]))
    return Call([_index(draw, device, big, bound=n), n, num_ep, draw(st.integers(0, num_tp - 1)), num_tp], {})


@st.composite
def b_get_fused_mapping(draw, device, big):
    e = draw(st.sampled_from([1, 8, 64, 256]))
    idx = _index(draw, device, big, bound=e, k_max=8)
    alignment = draw(st.sampled_from([1, 4, 64, 128]))
    t, k = idx.shape
    expanded = 0 if draw(st.booleans()) else reference.fused_num_expanded_tokens(t, k, e, alignment)
    return Call([idx, e, expanded, alignment], {'force_no_sync': draw(st.booleans())} if expanded == 0 else {})


@st.composite
def b_expand_to_fused(draw, device, big):
    t, k, e = tokens(draw, big), draw(st.integers(1, 8)), draw(st.sampled_from([1, 8, 32]))
    _, maps = fused_layout(t, k, e, draw(st.sampled_from([1, 16, 128])), _seed(draw), device)
    pos_to_expert, token_topk_to_pos = maps[0], maps[3]
    dtype = draw(st.sampled_from([BF16, F32, E4M3, torch.int8, torch.float16]))
    hidden = draw(st.sampled_from([16, 64, 128, 7168 // 8]))
    x = values(draw, (t, hidden), F32, device).to(dtype)
    return Call([place(draw, x, align=16, row_pad=True), token_topk_to_pos, pos_to_expert], {})


@st.composite
def b_expand_to_fused_with_sf(draw, device, big):
    t, k, e = tokens(draw, big), draw(st.integers(1, 8)), draw(st.sampled_from([1, 8, 32]))
    _, maps = fused_layout(t, k, e, draw(st.sampled_from([1, 16, 128])), _seed(draw), device)
    npc = draw(st.sampled_from([32, 128]))
    hidden = draw(st.sampled_from([128, 256, 1024]))
    data = values(draw, (t, hidden), F32, device).to(E4M3)
    packed = draw(st.booleans())
    blocks = -(-hidden // npc)
    if packed:
        sf = values(draw, (t, -(-blocks // 4)), I32, device, low=0, high=2**31 - 1)
    else:
        sf = values(draw, (t, blocks), F32, device).abs()
    col = packed or draw(st.booleans())
    return Call([(data, sf), npc, maps[3], maps[0]], {'use_tma_aligned_col_major_sf': col})


@st.composite
def b_reduce_fused(draw, device, big):
    t, k, e = tokens(draw, big), draw(st.integers(1, 8)), draw(st.sampled_from([1, 8, 32]))
    _, maps = fused_layout(t, k, e, draw(st.sampled_from([1, 16, 128])), _seed(draw), device)
    token_topk_to_pos = maps[3]
    num_expanded = maps[0].shape[0]
    dtype = draw(st.sampled_from(FLOATS))
    hidden = draw(st.sampled_from([16, 64, 256]))
    x = place(draw, values(draw, (num_expanded, hidden), dtype, device), align=16, row_pad=True)
    if draw(st.booleans()):
        x = (x, values(draw, (num_expanded,), F32, device).abs())
    weights = values(draw, (t, k), F32, device) if draw(st.booleans()) else None
    kwargs = {}
    if draw(st.booleans()):
        kwargs['fp8_format'] = 'e4m3'
        if draw(st.booleans()):
            kwargs['sf'] = values(draw, (1,), F32, device).abs() + 0.5
    return Call([x, weights, token_topk_to_pos], kwargs)


# --- quant --------------------------------------------------------------------------------------------------------------

def _sf_flags(draw, fmt_allows_packed=True):
    col = draw(st.booleans())
    round_sf = draw(st.booleans())
    packed = fmt_allows_packed and col and round_sf and draw(st.booleans())
    return {'use_tma_aligned_col_major_sf': col, 'round_sf': round_sf, 'use_packed_ue8m0': packed}


@st.composite
def b_per_token_cast(draw, device, big, variant='full'):
    dtype = draw(st.sampled_from(FLOATS))
    fmt = draw(st.sampled_from(['e4m3', 'e2m1'] + (['e5m6'] if variant == 'full' else [])))
    if fmt == 'e5m6':
        hidden = draw(st.sampled_from([64, 128, 1024, 7168]))
        npc = hidden
        flags = _sf_flags(draw)
    else:
        per_row = draw(st.booleans())
        if per_row:
            hidden = draw(st.sampled_from([64, 128, 512, 4096]))
            npc = hidden
        else:
            npc = draw(st.sampled_from([16, 32, 64, 128]))
            hidden = draw(st.sampled_from([16, 32, 48, 128, 256, 1040, 7168]))
        flags = _sf_flags(draw)
        if variant == 'precomputed':
            flags['use_packed_ue8m0'] = False
    t = tokens(draw, big)
    x = place(draw, values(draw, (t, hidden), dtype, device), align=draw(st.sampled_from([4, 16, 32])), row_pad=True)
    if variant == 'precomputed':
        sf = values(draw, (t, -(-hidden // npc)), F32, device).abs() + 2.0 ** -8
        return Call([x, fmt, npc, sf], flags)
    return Call([x, fmt, npc], flags)


def _quantised(draw, device, t, hidden, fmt, block, *, packed_ok=True):
    """A (data, sf) pair of `fmt` ('e4m3' or 'e2m1') with scale factors per `block` = (m, n), in a layout the
    dequantising ops take."""
    m, n = block
    data = values(draw, (t, hidden), F32, device).to(E4M3) if fmt == 'e4m3' else values(draw, (t, hidden // 2), torch.int8, device, low=-128, high=128)
    rows, blocks = -(-t // m), -(-hidden // n)
    if packed_ok and draw(st.booleans()):
        words = torch.randint(0, 2**31 - 1, (-(-blocks // 4), max(rows, 1)), generator=_seed(draw), dtype=I32)
        sf = words.to(device).T[:rows]
        # exponent bytes in a sane range: 127 +- 8 in every byte
        sf = (sf & 0x07070707) + 0x7B7B7B7B
        sf = sf.T.contiguous().T
    else:
        # powers of two within 2^6 of each other: per_block_cast_lossless takes at most 2^11 within an output block
        sf = torch.exp2(torch.randint(-3, 3, (rows, blocks), generator=_seed(draw)).float()).to(device)
        if draw(st.booleans()):
            sf = sf.T.contiguous().T
    return data, sf


@st.composite
def b_cast_back(draw, device, big, per_token=False):
    fmt_in = draw(st.sampled_from(['e4m3', 'e2m1']))
    m = 1 if per_token else draw(st.sampled_from([1, 32, 128]))
    n = draw(st.sampled_from([16, 32, 128]))
    hidden = draw(st.sampled_from([32, 128, 256, 1024]))
    t = tokens(draw, big)
    x = _quantised(draw, device, t, hidden, fmt_in, (m, n))
    out = draw(st.sampled_from(['bf16', 'fp32']))
    return Call([x, out, n] if per_token else [x, out, (m, n)], {})


@st.composite
def b_e5m6(draw, device, big):
    hidden = draw(st.sampled_from([8, 64, 1024, 7168]))
    t = tokens(draw, big)
    x = place(draw, values(draw, (t, hidden), draw(st.sampled_from(FLOATS)), device), align=16, row_pad=True)
    return Call([x, hidden], _sf_flags(draw))


@st.composite
def b_cast_back_e5m6(draw, device, big):
    hidden = draw(st.sampled_from([8, 64, 1024]))
    t = tokens(draw, big)
    data = values(draw, (t, hidden * 3 // 2), torch.uint8, device, low=0, high=256)
    sf = torch.exp2(torch.randint(-8, 8, (t, 1), generator=_seed(draw)).float()).to(device)
    return Call([(data, sf), draw(st.sampled_from(['bf16', 'fp32'])), (1, hidden)], {})


@st.composite
def b_per_block_cast(draw, device, big, variant='full'):
    dtype = draw(st.sampled_from(FLOATS))
    fmt = draw(st.sampled_from(['e4m3', 'e2m1']))
    block = draw(st.sampled_from([(128, 128), (32, 32)]))
    hidden = draw(st.sampled_from([16, 32, 128, 272, 1024]))
    t = tokens(draw, big, big_max=1024)
    x = place(draw, values(draw, (t, hidden), dtype, device), align=16, row_pad=True)
    if variant == 'precomputed':
        sf = values(draw, (-(-t // block[0]), -(-hidden // block[1])), F32, device).abs() + 2.0 ** -8
        return Call([x, fmt, block, sf], {'round_sf': draw(st.booleans())})
    return Call([x, fmt, block], _sf_flags(draw))


@st.composite
def b_per_block_lossless(draw, device, big):
    out_block = draw(st.sampled_from([(1, 128), (32, 32), (128, 128)]))
    hidden = draw(st.sampled_from([32, 128, 256, 1024]))
    t = tokens(draw, big, big_max=1024)
    x = _quantised(draw, device, t, hidden, 'e2m1', (1, 32))
    return Call([x, 'e4m3', (1, 32), out_block], _sf_flags(draw))


@st.composite
def b_per_channel_cast(draw, device, big, transpose_=False):
    dtype = BF16 if transpose_ else draw(st.sampled_from(FLOATS))
    t = draw(st.sampled_from([0, 128, 256] + ([1024, 4096] if big else [])))
    hidden = draw(st.sampled_from([64, 128, 192, 1024]))
    x = place(draw, values(draw, (t, hidden), dtype, device), align=16, row_pad=True)
    npt = draw(st.sampled_from([32, 128])) if transpose_ else 128
    return Call([x, 'e4m3', npt], {'round_sf': draw(st.booleans())})


@st.composite
def b_per_channel_fused(draw, device, big):
    hidden = draw(st.sampled_from([128, 256, 1024]))
    kwargs = {'round_sf': draw(st.booleans())}
    gathered = draw(st.booleans())
    t = tokens(draw, big) if gathered else draw(st.sampled_from([0, 128, 256]))
    if draw(st.booleans()):
        data = values(draw, (t, hidden), F32, device).to(E4M3)
        sf = torch.exp2(torch.randint(-4, 4, (t, hidden // 128), generator=_seed(draw)).float()).to(device)
        x = (data, sf)
        kwargs['num_per_channels'] = 128
    else:
        x = place(draw, values(draw, (t, hidden), draw(st.sampled_from(FLOATS)), device), align=16, row_pad=True)
    if gathered:
        t_out = draw(st.sampled_from([0, 16, 48, 128]))
        kwargs['pos_to_token'] = values(draw, (t_out,), I32, device, low=-1, high=max(t, 1)) if t else torch.full((t_out,), -1, dtype=I32, device=device)
    return Call([x, 'e4m3', 128], kwargs)


@st.composite
def b_unpack_e2m1(draw, device, big):
    shape = draw(st.sampled_from([(0, 4), (3, 8), (2, 3, 16)]))
    x = values(draw, shape, draw(st.sampled_from([torch.int8, torch.uint8])), device, low=0, high=128)
    return Call([x], {'out_dtype': draw(st.sampled_from([F32, BF16]))})


@st.composite
def b_swiglu_fwd_token(draw, device, big):
    dtype = draw(st.sampled_from(FLOATS))
    hidden = draw(st.sampled_from([128, 256, 1024]))
    n = tokens(draw, big)
    x = values(draw, (n, 2 * hidden), dtype, device)
    per_row = draw(st.booleans())
    npc = hidden if per_row else 128
    flags = _sf_flags(draw) if not per_row else {'round_sf': draw(st.booleans())}
    kwargs = dict(flags)
    if draw(st.booleans()):
        t, k = draw(st.integers(1, 8)), draw(st.integers(1, 4))
        kwargs['topk_weights'] = values(draw, (t, k), F32, device)
        kwargs['pos_to_token_topk'] = values(draw, (n,), I32, device, low=-1, high=t * k)
    if draw(st.booleans()):
        kwargs['pos_to_expert'] = values(draw, (n,), I32, device, low=0, high=4)  # a skipped row's output is left unwritten
    if draw(st.booleans()):
        kwargs['swiglu_clamp_value'] = draw(st.sampled_from([1.0, 7.0]))
        if draw(st.booleans()):
            kwargs['clamped_count'] = torch.zeros(3, dtype=I64, device=device)
    if draw(st.booleans()):
        kwargs['sf_clamp_min'] = draw(st.sampled_from([1e-4, 1e-2]))
    return Call([x, 'e4m3', npc], kwargs)


@st.composite
def b_swiglu_fwd_channel(draw, device, big):
    t = draw(st.sampled_from([0, 128, 256] + ([2048] if big else [])))
    hidden = draw(st.sampled_from([64, 128, 512]))
    x = values(draw, (t, 2 * hidden), BF16, device)
    kwargs = {'round_sf': draw(st.booleans()), 'without_transpose': draw(st.booleans())}
    if draw(st.booleans()):
        kwargs['swiglu_clamp_value'] = 3.0
    return Call([x, 'e4m3', draw(st.sampled_from([32, 128]))], kwargs)


@st.composite
def b_swiglu_bwd(draw, device, big):
    npc = draw(st.sampled_from([32, 128]))
    hidden = npc * draw(st.sampled_from([1, 2, 4]))
    t, k = draw(st.integers(0, 8)), draw(st.integers(1, 4))
    _, maps = fused_layout(t, k, 4, 1, _seed(draw), device)
    pos_to_token_topk, token_topk_to_pos = maps[2], maps[3]
    n = pos_to_token_topk.shape[0]
    data = values(draw, (n, 2 * hidden), F32, device).to(E4M3)
    sf = torch.exp2(torch.randint(-4, 4, (n, 2 * hidden // npc), generator=_seed(draw)).float()).to(device)
    grad = values(draw, (n, hidden), BF16, device)
    weight = values(draw, (t, k), F32, device)
    kwargs = {'round_sf': draw(st.booleans())}
    if draw(st.booleans()):
        kwargs['swiglu_clamp_value'] = 5.0
    return Call([(data, sf), grad, weight, pos_to_token_topk, token_topk_to_pos, npc], kwargs)


# --- transpose ----------------------------------------------------------------------------------------------------------

@st.composite
def b_transpose(draw, device, big, batched=False):
    dtype = draw(st.sampled_from([BF16, F32, E4M3, torch.int8]))
    m = 64 * draw(st.integers(0, 4 if not big else 32))
    n = 64 * draw(st.integers(0, 4 if not big else 32))
    shape = (draw(st.integers(0, 3)), m, n) if batched else (m, n)
    x = values(draw, shape, F32, device).to(dtype)
    return Call([place(draw, x, align=4, row_pad=True)], {})


# --- mhc ----------------------------------------------------------------------------------------------------------------

MHC_HIDDEN = (256, 1280)


def _lead(draw, big):
    t = tokens(draw, big, big_max=512)
    return draw(st.sampled_from([(1, t), (2, t // 2), (t, 1)]))  # (batch, sequence), as the references take them


def _mhc(draw, big, max_mhc=4):
    return draw(st.sampled_from([m for m in (1, 2, 4) if m <= max_mhc])), _lead(draw, big), draw(st.sampled_from(MHC_HIDDEN))


@st.composite
def b_expand_fwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    kwargs = {'out': torch.empty(*lead, m, h, dtype=BF16, device=device)} if draw(st.booleans()) else {}
    return Call([values(draw, (*lead, h), BF16, device), m], kwargs)


@st.composite
def b_embedding(draw, device, big):
    m, lead, h = _mhc(draw, big)
    return Call([values(draw, (*lead, h), BF16, device), m], {})


@st.composite
def b_expand_bwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    return Call([values(draw, (*lead, m, h), BF16, device)], {})


@st.composite
def b_apply_mix_fwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    kwargs = {'out': torch.empty(*lead, h, dtype=BF16, device=device)} if draw(st.booleans()) else {}
    return Call([values(draw, (*lead, m, h), BF16, device), values(draw, (*lead, m, 1), F32, device)], kwargs)


@st.composite
def b_apply_mix_bwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    return Call([values(draw, (*lead, h), BF16, device), values(draw, (*lead, m, h), BF16, device), values(draw, (*lead, m, 1), F32, device),
                 values(draw, (*lead, m, h), BF16, device)], {})


def _post_inputs(draw, device, m, lead, h):
    return [values(draw, (*lead, h), BF16, device), values(draw, (*lead, m, h), BF16, device), values(draw, (*lead, m, 1), F32, device),
            values(draw, (*lead, m, m), F32, device)]


@st.composite
def b_post_fwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    kwargs = {'out': torch.empty(*lead, m, h, dtype=BF16, device=device)} if draw(st.booleans()) else {}
    return Call(_post_inputs(draw, device, m, lead, h), kwargs)


@st.composite
def b_post_bwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    return Call([*_post_inputs(draw, device, m, lead, h), values(draw, (*lead, m, h), BF16, device)], {'fuse_grad_acc': draw(st.booleans())})


@st.composite
def b_multilayer(draw, device, big):
    m, lead, h = _mhc(draw, big)
    num_layers = draw(st.integers(1, 3))
    num_post = num_layers - draw(st.integers(0, 1))
    lists = ([values(draw, (*lead, m, 1), F32, device) for _ in range(num_layers)],
             [values(draw, (*lead, h), BF16, device) for _ in range(num_post)],
             [values(draw, (*lead, m, 1), F32, device) for _ in range(num_post)],
             [values(draw, (*lead, m, m), F32, device) for _ in range(num_post)],
             [torch.empty(*lead, h, dtype=BF16, device=device) for _ in range(num_layers)],
             [torch.empty(*lead, m, h, dtype=BF16, device=device) for _ in range(num_post)])
    return Call([values(draw, (*lead, m, h), BF16, device), *lists], {})


def _mixes(draw, device, big, max_mhc=4):
    m, lead, _ = _mhc(draw, big, max_mhc)
    return m, lead, values(draw, (*lead, m * (m + 2)), F32, device)


@st.composite
def b_split_fwd(draw, device, big):
    m, lead, mixes = _mixes(draw, device, big)
    return Call([mixes, values(draw, (3,), F32, device), values(draw, (m * (m + 2),), F32, device), m, 2.0, 1e-6], {})


@st.composite
def b_split_bwd(draw, device, big):
    m, lead, mixes = _mixes(draw, device, big)
    grads = [values(draw, (*lead, m, 1), F32, device), values(draw, (*lead, m, 1), F32, device), values(draw, (*lead, m, m), F32, device)]
    return Call([*grads, mixes, values(draw, (*lead, m, 1), F32, device), values(draw, (3,), F32, device),
                 values(draw, (m * (m + 2),), F32, device), m, 2.0], {})


@st.composite
def b_sinkhorn_fwd(draw, device, big):
    m, lead, _ = _mhc(draw, big)
    return Call([values(draw, (*lead, m, m), F32, device), draw(st.integers(1, 20)), draw(st.sampled_from([1e-6, 1e-3]))], {})


@st.composite
def b_sinkhorn_bwd(draw, device, big):
    m, lead, _ = _mhc(draw, big)
    x = values(draw, (*lead, m, m), F32, device)
    return Call([values(draw, (*lead, m, m), F32, device), x, draw(st.integers(1, 10)), 1e-6], {})


@st.composite
def b_head_fwd(draw, device, big):
    m, lead, _ = _mhc(draw, big)
    return Call([values(draw, (*lead, m), F32, device), values(draw, (1,), F32, device), values(draw, (m,), F32, device), 1e-6], {})


@st.composite
def b_head_bwd(draw, device, big):
    m, lead, _ = _mhc(draw, big)
    return Call([values(draw, (*lead, m), F32, device), values(draw, (*lead, m), F32, device), values(draw, (1,), F32, device),
                 values(draw, (m,), F32, device)], {})


@st.composite
def b_merge_fwd(draw, device, big):
    m, _, h = _mhc(draw, big)
    return Call([values(draw, (m * (m + 2), m * h), F32, device), values(draw, (m * h,), F32, device)], {})


@st.composite
def b_merge_bwd(draw, device, big):
    m, _, h = _mhc(draw, big)
    shape = (m * (m + 2), m * h)
    return Call([values(draw, shape, F32, device), values(draw, (m * h,), F32, device), values(draw, shape, F32, device),
                 torch.zeros(shape, device=device), torch.zeros(m * h, device=device)], {})


@st.composite
def b_norm_fwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    return Call([values(draw, (*lead, m, h), BF16, device), values(draw, (m * (m + 2), m * h), F32, device, scale=2.0 ** -6), 1e-6],
                {'n_splits': draw(st.integers(1, 32))})


@st.composite
def b_norm_gemm(draw, device, big):
    m, lead, h = _mhc(draw, big)
    t = math.prod(lead)
    fn = mhc.round_to_tf32(values(draw, (m * (m + 2), m * h), F32, device, scale=2.0 ** -6))
    return Call([values(draw, (t, m, h), BF16, device), fn, draw(st.integers(1, 32))], {})


@st.composite
def b_norm_bwd(draw, device, big):
    m, lead, h = _mhc(draw, big)
    t, m3 = math.prod(lead), m * (m + 2)
    residual = values(draw, (*lead, m, h), BF16, device)
    return Call([values(draw, (*lead, m3), F32, device), residual, values(draw, (m3, m * h), F32, device, scale=2.0 ** -6),
                 values(draw, (t, m3), F32, device), values(draw, (t,), F32, device).abs() + 1.0, 1e-6, torch.zeros_like(residual)], {})


@st.composite
def b_big_fuse(draw, device, big):
    m, lead, h = _mhc(draw, big)
    m3 = m * (m + 2)
    return Call([values(draw, (*lead, m, h), BF16, device), values(draw, (m3, m * h), F32, device, scale=2.0 ** -6),
                 values(draw, (3,), F32, device), values(draw, (m3,), F32, device), 1e-6, 1e-6, 1e-6, 2.0, draw(st.integers(1, 20))],
                {'n_splits': draw(st.integers(1, 32))})


@st.composite
def b_round_tf32(draw, device, big):
    return Call([values(draw, draw(st.sampled_from([(0,), (5,), (3, 7)])), F32, device)], {})


@st.composite
def b_modeling_pre(draw, device, big):
    m, lead, h = _mhc(draw, big)
    m3 = m * (m + 2)
    kwargs = {'mhc_mult': m, 'sinkhorn_repeat': draw(st.integers(1, 20)), 'n_splits': draw(st.integers(1, 16))}
    if draw(st.booleans()):
        kwargs['norm_weight'] = values(draw, (m * h,), F32, device)
    return Call([values(draw, (*lead, m, h), BF16, device), values(draw, (m3, m * h), F32, device, scale=2.0 ** -6),
                 values(draw, (3,), F32, device), values(draw, (m3,), F32, device)], kwargs)


@st.composite
def b_modeling_head(draw, device, big):
    m, lead, h = _mhc(draw, big)
    kwargs = {'mhc_mult': m, 'n_splits': draw(st.integers(1, 16))}
    return Call([values(draw, (*lead, m, h), BF16, device), values(draw, (m, m * h), F32, device, scale=2.0 ** -6),
                 values(draw, (1,), F32, device), values(draw, (m,), F32, device)], kwargs)


@st.composite
def b_modeling_norm_fn(draw, device, big):
    m, lead, h = _mhc(draw, big)
    weight = values(draw, (m * h,), F32, device) if draw(st.booleans()) else None
    return Call([values(draw, (*lead, m, h), BF16, device), values(draw, (m * (m + 2), m * h), F32, device, scale=2.0 ** -6), weight, 1e-6],
                {'n_splits': draw(st.integers(1, 16))})


# --- engram -------------------------------------------------------------------------------------------------------------

ENGRAM_HIDDEN = (256, 1024)


@st.composite
def b_engram_hash(draw, device, big):
    t, n, layers, m = tokens(draw, big), draw(st.integers(2, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 8))
    vocab = values(draw, (layers, n - 1, m), I32, 'cpu', low=1, high=1_000_000)
    ids = place(draw, values(draw, (t, n), I32, device, low=-2**31, high=2**31 - 1), align=4, row_pad=True)
    mult = values(draw, (layers, n), I64, device, low=-2**62, high=2**62)
    return Call([ids, mult, vocab.to(device), reference.make_offsets(vocab).to(device)], {})


def _engram_weights(draw, device, h):
    return values(draw, (4, h), BF16, device), values(draw, (4, h), BF16, device)


@st.composite
def b_fused_weight(draw, device, big):
    return Call(list(_engram_weights(draw, device, draw(st.sampled_from(ENGRAM_HIDDEN)))), {})


def _gate_inputs(draw, device, big):
    h, t = draw(st.sampled_from(ENGRAM_HIDDEN)), tokens(draw, big, big_max=2048)
    x = values(draw, (t, 4, h), BF16, device)
    k = values(draw, (t, 4, h), BF16, device)
    if draw(st.booleans()):  # strided token and stream rows, 16-byte multiples
        k = place(draw, k, align=16, row_pad=True)
    v = place(draw, values(draw, (t, h), BF16, device), align=16, row_pad=True)
    wh, we = _engram_weights(draw, device, h)
    return t, h, x, k, v, wh, we


@st.composite
def b_gate_fwd(draw, device, big):
    t, h, x, k, v, wh, we = _gate_inputs(draw, device, big)
    wf = (wh.float() * we.float())
    return Call([x, k, v, wf, draw(st.sampled_from([1e-20, 1e-6])), draw(st.sampled_from([0.0, 1e-6, 0.5]))],
                {'save_for_backward': draw(st.booleans())})


@st.composite
def b_gate_bwd(draw, device, big):
    t, h, x, k, v, wh, we = _gate_inputs(draw, device, big)
    saved = [values(draw, (t, 4), F32, device).abs() + 0.1 for _ in range(4)]
    return Call([values(draw, (t, 4, h), BF16, device), x, k, v, wh.float() * we.float(), *saved, 1e-6], {})


@st.composite
def b_grad_w_reduce(draw, device, big):
    h = draw(st.sampled_from(ENGRAM_HIDDEN))
    wh, we = _engram_weights(draw, device, h)
    return Call([values(draw, (draw(st.integers(0, 6)), 4, h), F32, device), wh, we, torch.zeros(4, h, device=device),
                 torch.zeros(4, h, device=device)], {})


@st.composite
def b_engram_gate(draw, device, big):
    t, h, x, k, v, wh, we = _gate_inputs(draw, device, big)
    return Call([x, k, v, wh, we, draw(st.sampled_from([0.0, 1e-6])), draw(st.sampled_from([1e-20, 1e-6]))], {})


# --- invalid calls: one mutation of a valid one ------------------------------------------------------------------------

# Dtypes no op takes: a mutation to one of them must be refused before the device check.
NEVER_TAKEN = (torch.float64, torch.complex64)
OTHER_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int8, torch.uint8, torch.int16, torch.int32,
                torch.int64, torch.bool, *NEVER_TAKEN)


def _slots(value, path=()):
    """(path, value) of every argument leaf that a mutation may change: tensors, ints, bools, floats, strings and
    tuples of ints, inside the (data, sf) tuples and the tensor lists too."""
    if isinstance(value, torch.Tensor) or isinstance(value, (bool, int, float, str)) or isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _slots(v, (*path, i))


def _call_slots(call: Call):
    for i, a in enumerate(call.args):
        yield from _slots(a, ('args', i))
    for k, a in call.kwargs.items():
        yield from _slots(a, ('kwargs', k))


def _replace(call: Call, path, new) -> Call:
    """The call with the leaf at `path` replaced (containers copied, the original call untouched)."""

    def put(container, rest):
        head, tail = rest[0], rest[1:]
        value = new if not tail else put(container[head], tail)
        if isinstance(container, dict):
            return {**container, head: value}
        items = list(container)
        items[head] = value
        return items if isinstance(container, list) else tuple(items)

    if path[0] == 'args':
        return Call(put(call.args, path[1:]), dict(call.kwargs), call.note)
    return Call(list(call.args), put(call.kwargs, path[1:]), call.note)


def _retype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float8_e4m3fn:
        return t.float().to(dtype)
    return t.to(dtype)


def _mutations_of_tensor(draw, t: torch.Tensor):
    """(kind, new value, hard): hard when the result can never be a valid argument."""
    kind = draw(st.sampled_from(['dtype', 'not_tensor', 'rank_up', 'rank_down', 'shape', 'stride', 'offset', 'meta']))
    if kind == 'dtype':
        dtype = draw(st.sampled_from([d for d in OTHER_DTYPES if d != t.dtype]))
        return f'dtype {dtype}', _retype(t, dtype), dtype in NEVER_TAKEN
    if kind == 'not_tensor':
        return 'not a tensor', draw(st.sampled_from([[1.0], 3, 'x', (t,)])), True
    if kind == 'rank_up':
        return 'one more dim', t.unsqueeze(draw(st.integers(0, t.dim()))), False
    if kind == 'rank_down':
        if t.dim() == 1:
            return 'one dim fewer', t[0] if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device), False
        return 'one dim fewer', t.reshape(-1), False
    if kind == 'shape':
        if t.dim() == 0:
            return 'shape', t.reshape(1), False
        dim = draw(st.integers(0, t.dim() - 1))
        if t.shape[dim] > 0 and draw(st.booleans()):
            return f'dim {dim} shorter', t.narrow(dim, 0, t.shape[dim] - 1), False
        extra = torch.zeros_like(t.narrow(dim, 0, 1) if t.shape[dim] else t.new_zeros(*[1 if d == dim else n for d, n in enumerate(t.shape)]))
        return f'dim {dim} longer', torch.cat([t, extra.to(t.dtype)], dim), False
    if kind == 'stride':
        if t.dim() >= 2 and draw(st.booleans()):
            return 'transposed', t.transpose(-1, -2), False
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device) if t.dim() else torch.zeros(2, dtype=t.dtype, device=t.device)
        view = wide[..., ::2] if t.dim() else wide[:1].reshape(())
        return 'every other element', view.copy_(t) if t.dim() else view, False
    if kind == 'offset':
        flat = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
        return 'one element off', flat[1:].view(t.shape).copy_(t.contiguous()) if t.numel() else flat[1:].view(t.shape), False
    other = 'cpu' if t.is_cuda else 'meta'  # a CUDA call gets one CPU tensor; a CPU call one on the meta device
    return f'{other} device', t.to(other), False


def _mutations_of_int(draw, value: int):
    kind = draw(st.sampled_from(['range', 'float', 'str', 'none', 'bool']))
    if kind == 'range':
        return 'out of range', draw(st.sampled_from([-1, 0, value + 1, value - 1, 2**31, 2**63, -2**40])), False
    if kind == 'float':
        return 'a float', float(value) + 0.5, True
    if kind == 'str':
        return 'a string', str(value), True
    if kind == 'bool':
        return 'a bool', draw(st.booleans()), False
    return 'None', None, False


def mutate(draw, call: Call):
    slots = list(_call_slots(call))
    path, value = draw(st.sampled_from(slots))
    if isinstance(value, torch.Tensor):
        what, new, hard = _mutations_of_tensor(draw, value)
    elif isinstance(value, bool):
        what, new, hard = 'bool as ' + repr(x := draw(st.sampled_from([1, 'yes', None]))), x, False
    elif isinstance(value, int):
        what, new, hard = _mutations_of_int(draw, value)
    elif isinstance(value, float):
        new = draw(st.sampled_from([float('nan'), float('inf'), -1.0, 'x', None]))
        what, hard = f'float as {new!r}', False
    elif isinstance(value, str):
        new = draw(st.sampled_from(['bogus', '', value.upper() + '_', 3]))
        what, hard = f'string as {new!r}', new not in ('',)
    else:  # a tuple of ints: a block size
        new = draw(st.sampled_from([(0, 0), (3, 5), value[:1], (*value, 1), (-value[0], value[-1]), [*value]]))
        what, hard = f'block as {new!r}', False
    return path, what, _replace(call, path, new), hard


ALLOWED = (TypeError, ValueError, SpecNotPrebuiltError, NotImplementedError)
DEVICE_ERROR = 'must be on a CUDA device'


def names(case: Case) -> str:
    return ' or '.join(case.names)


def named(case: Case, message: str) -> bool:
    """Whether the first line of an error message names one of the case's ops ('op:', 'op(fmt=...):' or the binary's
    'kernel.op[spec]:'), or is a SpecNotPrebuiltError's, which names the binary the op asked for ('kernel has no
    prebuilt ...': an mHC op's binaries carry the family's names, e.g. mhc.pre_apply_mix_fwd)."""
    first = message.split('\n')[0]
    return any(f'{n}{mark}' in first for n in case.names for mark in (':', '(', '[')) or ' has no prebuilt ' in first


# A string argument whose mutation may stay valid ('' is reduce_fused's default fp8_format).
_SOFT_STRINGS = {'fp8_format'}


def hard_for(case: Case, path, hard: bool) -> bool:
    """Whether a mutation that can never be valid must be refused before the device check: not for a composite (another
    argument's device check may come first), nor for an argument the op checks only after it (Case.late)."""
    return hard and path[-1] not in _SOFT_STRINGS and not case.composite and path[1] not in case.late


# --- the table ----------------------------------------------------------------------------------------------------------

def _with(build, **fixed):
    return lambda device, big: build(device, big, **fixed)


def _ref_cast(call):
    x, fmt, npc = call.args[:3]
    return reference.cast(x, fmt, (1, npc), **call.kwargs)


def _ref_cast_precomputed(call):
    x, fmt, npc, sf = call.args
    return reference.cast(x, fmt, (1, npc), sf=sf)


def _ref_sf_only(call):
    x, fmt, npc = call.args
    return reference.cast(x, fmt, (1, npc), **call.kwargs)[1]


def _ref_per_token_cast(call):
    x, fmt, npc = call.args
    if fmt == 'e5m6':
        kw = call.kwargs
        return reference.cast_to_e5m6(x, npc, kw['use_tma_aligned_col_major_sf'], kw['round_sf'], kw['use_packed_ue8m0'])
    return _ref_cast(call)


def _ref_per_token_cast_back(call):
    x, fmt, npc = call.args
    return reference.cast_back(x, fmt, (1, npc))


def _ref_per_channel_fused(call):
    x, _, npt = call.args
    kw = call.kwargs
    return reference.per_channel_cast_fused(x, npt, kw.get('num_per_channels'), kw['round_sf'], kw.get('pos_to_token'))


def _ref_per_channel(fn):
    return lambda call: fn(call.args[0], call.args[2], **call.kwargs)


def _args_only(fn):
    return lambda call: fn(*call.args, **call.kwargs)


def _ref_in_place(fn, *written):
    """A reference of an op that writes its arguments `written` (indices) in place: those arguments afterwards."""
    def ref(call):
        fn(*call.args, **call.kwargs)
        return tuple(call.args[i] for i in written)
    return ref


def _written(*indices):
    return lambda result, call: tuple(call.args[i] for i in indices)


def _ref_get_fused_mapping(call):
    return reference.get_fused_mapping(*call.args, **call.kwargs)


def _ref_expand_bwd(call):
    g = call.args[0]
    acc = g.select(-2, 0).float()
    for m in range(1, g.shape[-2]):  # fp32 in ascending m, rounded once
        acc = acc + g.select(-2, m).float()
    return acc.bfloat16()


def _ref_expand_fwd(call):
    return reference.expand_to_mhc_ref(call.args[0], call.args[1])


EMPTY = 'every tensor of the result is empty'  # what a reference that takes no empty input gives for one


def _nonempty(ref):
    """A reference that cannot take zero tokens (a reshape with -1): EMPTY for those."""
    return lambda call: EMPTY if call.args[0].numel() == 0 else ref(call)


def _ref_modeling_pre(call):
    with torch.no_grad():
        return reference.mhc_pre_ref(*call.args, **{k: v for k, v in call.kwargs.items() if k != 'n_splits'})


# The tolerances of the op's own GPU tests (upstream's): torch.testing.assert_close's, or calc_diff's bound.
_SPLIT_TOL = dict(rtol=1e-5, atol=2e-5)
_HEAD_TOL = dict(rtol=1e-4, atol=1e-5)
_APPLY_MIX_TOL = dict(atol=1e-2, rtol=1e-3)
_POST_TOL = {}  # assert_close's defaults for the dtype
_MIX_TOL = dict(rtol=1.3e-6, atol=1e-5)  # Sinkhorn: float32 defaults
_NORM_TOL = dict(rtol=1e-3, atol=1e-3)
_MODEL_TOL = dict(rtol=1e-2, atol=2e-2)
_GATE_TOL = {'calc_diff': 1e-8}

_C = Case
CASES: list[Case] = [
    # moe
    _C('moe.topk_gate', moe.topk_gate, b_topk_gate, ('topk_gate',), _args_only(reference.stable_topk)),
    _C('moe.topk_sum_and_topk_group_idx', moe.topk_sum_and_topk_group_idx, b_topk_sum_group, ('topk_sum_and_topk_group_idx',),
       _args_only(reference.topk_sum_and_topk_group_idx)),
    _C('moe.top2_sum_gate', moe.top2_sum_gate, b_top2_sum_gate, ('top2_sum_gate',), _args_only(reference.top2_sum_gate),
       late=(6,)),
    _C('moe.normalize_weight', moe.normalize_weight, b_normalize_weight, ('normalize_weight',), _args_only(reference.normalize_weight)),
    _C('moe.group_count', moe.group_count, b_group_count, ('group_count',), _args_only(reference.group_count), late=(1,)),
    _C('moe.aux_fi', moe.aux_fi, b_aux_fi, ('aux_fi',), _args_only(reference.aux_fi), late=(1,)),
    _C('moe.inplace_unique_group_indices', moe.inplace_unique_group_indices, b_unique, ('inplace_unique_group_indices',),
       _ref_in_place(reference.inplace_unique_group_indices, 0), compare=_written(0)),
    _C('moe.mask_indices_by_tp', moe.mask_indices_by_tp, b_mask_tp, ('mask_indices_by_tp',), _args_only(reference.mask_indices_by_tp)),
    _C('moe.get_fused_mapping', moe.get_fused_mapping, b_get_fused_mapping, ('get_fused_mapping',), _ref_get_fused_mapping, late=(1,)),
    _C('moe.expand_to_fused', moe.expand_to_fused, b_expand_to_fused, ('expand_to_fused',), _args_only(reference.expand_to_fused)),
    _C('moe.expand_to_fused_with_sf', moe.expand_to_fused_with_sf, b_expand_to_fused_with_sf, ('expand_to_fused_with_sf',),
       _args_only(reference.expand_to_fused_with_sf)),
    _C('moe.reduce_fused', moe.reduce_fused, b_reduce_fused, ('reduce_fused',), _args_only(reference.reduce_fused)),
    # quant
    _C('quant.per_token_cast', quant.per_token_cast, b_per_token_cast, ('per_token_cast',), _ref_per_token_cast),
    _C('quant.per_token_cast_with_sf_only', quant.per_token_cast_with_sf_only, _with(b_per_token_cast, variant='sf_only'),
       ('per_token_cast_with_sf_only', 'per_token_cast'), _ref_sf_only),
    _C('quant.per_token_cast_with_precomputed_sf', quant.per_token_cast_with_precomputed_sf, _with(b_per_token_cast, variant='precomputed'),
       ('per_token_cast_with_precomputed_sf', 'per_token_cast'), _ref_cast_precomputed),
    _C('quant.cast_back', quant.cast_back, b_cast_back, ('cast_back',), _args_only(reference.cast_back)),
    _C('quant.per_token_cast_back', quant.per_token_cast_back, _with(b_cast_back, per_token=True), ('per_token_cast_back', 'cast_back'),
       _ref_per_token_cast_back),
    _C('quant.per_token_cast_to_e5m6', quant.per_token_cast_to_e5m6, b_e5m6, ('per_token_cast_to_e5m6', 'per_token_cast'),
       lambda call: reference.cast_to_e5m6(call.args[0], call.args[1], *call.kwargs.values())),
    _C('quant.cast_back_from_e5m6', quant.cast_back_from_e5m6, b_cast_back_e5m6, ('cast_back_from_e5m6', 'cast_back'),
       _args_only(reference.cast_back_from_e5m6)),
    _C('quant.per_block_cast', quant.per_block_cast, b_per_block_cast, ('per_block_cast',), _args_only(reference.per_block_cast)),
    _C('quant.per_block_cast_with_sf_only', quant.per_block_cast_with_sf_only, b_per_block_cast,
       ('per_block_cast_with_sf_only', 'per_block_cast'), _args_only(reference.per_block_cast_with_sf_only)),
    _C('quant.per_block_cast_with_precomputed_sf', quant.per_block_cast_with_precomputed_sf, _with(b_per_block_cast, variant='precomputed'),
       ('per_block_cast_with_precomputed_sf', 'per_block_cast'), _args_only(reference.per_block_cast_with_precomputed_sf)),
    _C('quant.per_block_cast_lossless', quant.per_block_cast_lossless, b_per_block_lossless, ('per_block_cast_lossless',),
       _args_only(reference.per_block_cast_lossless)),
    _C('quant.per_channel_cast', quant.per_channel_cast, b_per_channel_cast, ('per_channel_cast',), _ref_per_channel(reference.per_channel_cast)),
    _C('quant.per_channel_cast_fused', quant.per_channel_cast_fused, b_per_channel_fused, ('per_channel_cast_fused',), _ref_per_channel_fused),
    _C('quant.per_channel_cast_and_transpose', quant.per_channel_cast_and_transpose, _with(b_per_channel_cast, transpose_=True),
       ('per_channel_cast_and_transpose',), _ref_per_channel(reference.per_channel_cast_and_transpose)),
    _C('quant.unpack_from_e2m1fn_x2', quant.unpack_from_e2m1fn_x2, b_unpack_e2m1, ('unpack_from_e2m1fn_x2',), runs_anywhere=True),
    _C('quant.swiglu_forward_and_per_token_cast', quant.swiglu_forward_and_per_token_cast, b_swiglu_fwd_token,
       ('swiglu_forward_and_per_token_cast',), _args_only(reference.swiglu_forward_and_per_token_cast)),
    _C('quant.swiglu_forward_and_per_channel_cast_and_transpose', quant.swiglu_forward_and_per_channel_cast_and_transpose, b_swiglu_fwd_channel,
       ('swiglu_forward_and_per_channel_cast_and_transpose',), _args_only(reference.swiglu_forward_and_per_channel_cast_and_transpose)),
    _C('quant.swiglu_backward_and_per_token_cast', quant.swiglu_backward_and_per_token_cast, b_swiglu_bwd,
       ('swiglu_backward_and_per_token_cast',), _args_only(reference.swiglu_backward_and_per_token_cast),
       output_tol={4: {'rtol': 1e-4, 'atol': 1e-4}}),  # weight_grad: a float32 sum in another order, upstream's tolerance
    # transpose
    _C('transpose.transpose', transpose.transpose, b_transpose, ('transpose',), _args_only(reference.transpose)),
    _C('transpose.batched_transpose', transpose.batched_transpose, _with(b_transpose, batched=True), ('batched_transpose',),
       _args_only(reference.batched_transpose)),
    # mhc
    _C('mhc.expand_to_mhc_fwd', mhc.expand_to_mhc_fwd, b_expand_fwd, ('expand_to_mhc_fwd',), _ref_expand_fwd),
    _C('mhc.expand_to_mhc_bwd', mhc.expand_to_mhc_bwd, b_expand_bwd, ('expand_to_mhc_bwd',), _ref_expand_bwd),
    _C('mhc.mhc_pre_apply_mix_fwd', mhc.mhc_pre_apply_mix_fwd, b_apply_mix_fwd, ('mhc_pre_apply_mix_fwd',),
       lambda call: reference.mhc_pre_apply_mix_ref(*call.args[:2]), exact=False, tol=_APPLY_MIX_TOL),
    _C('mhc.mhc_pre_apply_mix_bwd', mhc.mhc_pre_apply_mix_bwd, b_apply_mix_bwd, ('mhc_pre_apply_mix_bwd',)),
    _C('mhc.mhc_post_fwd', mhc.mhc_post_fwd, b_post_fwd, ('mhc_post_fwd',), lambda call: reference.mhc_post_ref(*call.args[:4]),
       exact=False, tol=_POST_TOL),
    _C('mhc.mhc_post_bwd', mhc.mhc_post_bwd, b_post_bwd, ('mhc_post_bwd',)),
    _C('mhc.mhc_multilayer_recompute', mhc.mhc_multilayer_recompute, b_multilayer, ('mhc_multilayer_recompute',),
       compare=_written(5, 6)),
    _C('mhc.mhc_pre_split_mixes_fwd', mhc.mhc_pre_split_mixes_fwd, b_split_fwd, ('mhc_pre_split_mixes_fwd',),
       _args_only(reference.mhc_pre_split_mixes_ref), exact=False, tol=_SPLIT_TOL),
    _C('mhc.mhc_pre_split_mixes_bwd', mhc.mhc_pre_split_mixes_bwd, b_split_bwd, ('mhc_pre_split_mixes_bwd',)),
    _C('mhc.mhc_sinkhorn_fwd', mhc.mhc_sinkhorn_fwd, b_sinkhorn_fwd, ('mhc_sinkhorn_fwd',),
       _args_only(reference.sinkhorn_normalize_ref), exact=False, tol=_MIX_TOL),
    _C('mhc.mhc_sinkhorn_bwd', mhc.mhc_sinkhorn_bwd, b_sinkhorn_bwd, ('mhc_sinkhorn_bwd',)),
    _C('mhc.mhc_head_compute_mix_fwd', mhc.mhc_head_compute_mix_fwd, b_head_fwd, ('mhc_head_compute_mix_fwd',),
       _args_only(reference.mhc_head_compute_mix_ref), exact=False, tol=_HEAD_TOL),
    _C('mhc.mhc_head_compute_mix_bwd', mhc.mhc_head_compute_mix_bwd, b_head_bwd, ('mhc_head_compute_mix_bwd',)),
    _C('mhc.mhc_fn_normw_merge_fwd', mhc.mhc_fn_normw_merge_fwd, b_merge_fwd, ('mhc_fn_normw_merge_fwd',),
       lambda call: call.args[0] * call.args[1]),
    _C('mhc.mhc_fn_normw_merge_bwd', mhc.mhc_fn_normw_merge_bwd, b_merge_bwd, ('mhc_fn_normw_merge_bwd',), compare=_written(3, 4)),
    _C('mhc.mhc_pre_norm_fn_fwd', mhc.mhc_pre_norm_fn_fwd, b_norm_fwd, ('mhc_pre_norm_fn_fwd',),
       _nonempty(lambda call: reference.mhc_pre_norm_fn_ref(call.args[0], call.args[1], None, call.args[2])), exact=False, tol=_NORM_TOL,
       compare=lambda result, call: result[0]),
    _C('mhc.mhc_pre_norm_fn_gemm', mhc.mhc_pre_norm_fn_gemm, b_norm_gemm, ('mhc_pre_norm_fn_gemm',)),
    _C('mhc.mhc_pre_norm_fn_bwd', mhc.mhc_pre_norm_fn_bwd, b_norm_bwd, ('mhc_pre_norm_fn_bwd',)),
    _C('mhc.mhc_pre_big_fuse', mhc.mhc_pre_big_fuse, b_big_fuse, ('mhc_pre_big_fuse', 'mhc_pre_norm_fn_gemm', 'mhc_pre_norm_fn_fwd'),
       composite=True),
    _C('mhc.round_to_tf32', mhc.round_to_tf32, b_round_tf32, ('round_to_tf32',),
       lambda call: (call.args[0].contiguous().view(torch.int32) + 0x1000).view(torch.float32), runs_anywhere=True),
    # engram
    _C('engram.engram_hash', engram.engram_hash, b_engram_hash, ('engram_hash',), _args_only(reference.engram_hash_ref)),
    _C('engram.fused_weight', engram.fused_weight, b_fused_weight, ('fused_weight',), _args_only(reference.fused_weight_ref)),
    _C('engram.engram_gate_fwd', engram.engram_gate_fwd, b_gate_fwd, ('engram_gate_fwd',)),
    _C('engram.engram_gate_bwd', engram.engram_gate_bwd, b_gate_bwd, ('engram_gate_bwd',)),
    _C('engram.grad_w_reduce', engram.grad_w_reduce, b_grad_w_reduce, ('grad_w_reduce',),
       _ref_in_place(reference.grad_w_reduce_ref, 3, 4), exact=False, tol={'calc_diff': 1e-10}, compare=_written(3, 4)),
    # modeling composites (their messages name the inner op that refused)
    _C('modeling.mhc.expand_from_embedding', modeling_mhc.expand_from_embedding, b_embedding, ('expand_to_mhc_fwd', 'expand_to_mhc'),
       _ref_expand_fwd),
    _C('modeling.mhc.mhc_pre', modeling_mhc.mhc_pre, b_modeling_pre,
       ('mhc_pre', 'mhc_pre_big_fuse', 'mhc_pre_norm_fn', 'mhc_pre_norm_fn_fwd', 'mhc_pre_norm_fn_gemm', 'mhc_fn_normw_merge_fwd',
        'mhc_pre_split_mixes_fwd', 'mhc_sinkhorn_fwd', 'mhc_pre_apply_mix_fwd'),
       _nonempty(_ref_modeling_pre), exact=False, tol=_MODEL_TOL, composite=True),
    _C('modeling.mhc.mhc_head', modeling_mhc.mhc_head, b_modeling_head,
       ('mhc_head', 'mhc_pre_norm_fn', 'mhc_pre_norm_fn_fwd', 'mhc_pre_norm_fn_gemm', 'mhc_fn_normw_merge_fwd', 'mhc_head_compute_mix_fwd',
        'mhc_pre_apply_mix_fwd'),
       _nonempty(lambda call: reference.mhc_head_ref(*call.args, **{k: v for k, v in call.kwargs.items() if k != 'n_splits'})),
       exact=False, tol=_MODEL_TOL,
       composite=True),
    _C('modeling.mhc.mhc_pre_norm_fn', modeling_mhc.mhc_pre_norm_fn, b_modeling_norm_fn,
       ('mhc_pre_norm_fn', 'mhc_pre_norm_fn_fwd', 'mhc_fn_normw_merge_fwd'),
       _nonempty(lambda call: reference.mhc_pre_norm_fn_ref(*call.args)), exact=False, tol=_NORM_TOL, composite=True),
    _C('modeling.mhc.sinkhorn_normalize', modeling_mhc.sinkhorn_normalize, b_sinkhorn_fwd, ('sinkhorn_normalize', 'mhc_sinkhorn_fwd'),
       _args_only(reference.sinkhorn_normalize_ref), exact=False, tol=_MIX_TOL),
    _C('modeling.engram.engram_gate', modeling_engram.engram_gate, b_engram_gate, ('engram_gate', 'engram_gate_fwd', 'fused_weight'),
       lambda call: reference.engram_gate_ref(*call.args), exact=False, tol=_GATE_TOL, composite=True),
]

# The autograd ops of modeling.mhc (the others it exports are the raw ops above, re-exported).
CASES += [
    _C('modeling.mhc.expand_to_mhc', modeling_mhc.expand_to_mhc, b_expand_fwd, ('expand_to_mhc_fwd', 'expand_to_mhc'), _ref_expand_fwd),
    _C('modeling.mhc.mhc_pre_apply_mix', modeling_mhc.mhc_pre_apply_mix, b_apply_mix_fwd, ('mhc_pre_apply_mix_fwd', 'mhc_pre_apply_mix'),
       lambda call: reference.mhc_pre_apply_mix_ref(*call.args[:2]), exact=False, tol=_APPLY_MIX_TOL),
    _C('modeling.mhc.mhc_post', modeling_mhc.mhc_post, b_post_fwd, ('mhc_post_fwd', 'mhc_post'), lambda call: reference.mhc_post_ref(*call.args[:4]),
       exact=False, tol=_POST_TOL),
    _C('modeling.mhc.mhc_head_compute_mix', modeling_mhc.mhc_head_compute_mix, b_head_fwd, ('mhc_head_compute_mix_fwd', 'mhc_head_compute_mix'),
       _args_only(reference.mhc_head_compute_mix_ref), exact=False, tol=_HEAD_TOL),
    _C('modeling.mhc.mhc_pre_split_mixes', modeling_mhc.mhc_pre_split_mixes, b_split_fwd, ('mhc_pre_split_mixes_fwd', 'mhc_pre_split_mixes'),
       _args_only(reference.mhc_pre_split_mixes_ref), exact=False, tol=_SPLIT_TOL),
]

CASE_IDS = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}

# Which public functions the table covers, for a test that every public op has a case.
COVERED_MODULES = {'moe': moe, 'quant': quant, 'transpose': transpose, 'mhc': mhc, 'engram': engram, 'modeling.mhc': modeling_mhc,
                   'modeling.engram': modeling_engram}
NOT_OPS = {
    'moe': {'find_kernel', 'kernel_constant', 'get_num_sms', 'get_device_num_sms', 'LoadedKernel'},
    'quant': {'QuantTensor', 'per_token_cast_spec'},
    'transpose': {'find_kernel', 'first_prebuilt', 'spec_for', 'address_bits'},
    'mhc': set(),
    'engram': {'find_kernel', 'get_num_sms', 'partial_tokens'},  # partial_tokens: an int helper of engram_gate_bwd, no tensors
    'modeling.mhc': {'ops'},
    'modeling.engram': {'EngramGateFn'},
}
assert tile_kernels_aot  # the package import above makes every submodule importable by attribute
