"""Real model configurations: the one place prebuilt specialisations are derived from.

Values are the models' published Hugging Face ``config.json`` fields (see docs/models.md for the source
of each). The token count is never here: it is a dynamic dim of every kernel.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MoEModel:
    name: str
    hidden: int  # hidden_size
    num_experts: int  # routed experts
    num_topk: int  # experts per token
    moe_intermediate: int  # per-expert FFN width
    num_groups: int = 0  # n_group; 0 (or 1) means no group-limited routing
    num_topk_groups: int = 0  # topk_group
    scoring: str = 'softmax'
    num_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    group_topk_sum: int = 0  # how a group is scored for group-limited routing: its top-1 (1) or top-2 sum (2)


MODELS: tuple[MoEModel, ...] = (
    MoEModel('DeepSeek-V3', 7168, 256, 8, 2048, 8, 4, 'sigmoid', 1, 2.5, group_topk_sum=2),  # noaux_tc
    MoEModel('DeepSeek-V3.2', 7168, 256, 8, 2048, 8, 4, 'sigmoid', 1, 2.5, group_topk_sum=2),
    MoEModel('DeepSeek-V2', 5120, 160, 6, 1536, 8, 3, 'softmax', 2, 16.0, group_topk_sum=1),  # group_limited_greedy
    MoEModel('DeepSeek-V2-Lite', 2048, 64, 6, 1408, 1, 1, 'softmax', 2, 1.0),
    MoEModel('Kimi-K2', 7168, 384, 8, 2048, 1, 1, 'sigmoid', 1, 2.827),
    MoEModel('Qwen3-30B-A3B', 2048, 128, 8, 768),
    MoEModel('Qwen3-235B-A22B', 4096, 128, 8, 1536),
    MoEModel('Mixtral-8x7B', 4096, 8, 2, 14336),
    MoEModel('Mixtral-8x22B', 6144, 8, 2, 16384),
    MoEModel('gpt-oss-120b', 2880, 128, 4, 2880),
    MoEModel('gpt-oss-20b', 2880, 32, 4, 2880),
    MoEModel('GLM-4.5', 5120, 160, 8, 1536, 1, 1, 'sigmoid', 1, 2.5),
    MoEModel('GLM-4.5-Air', 4096, 128, 8, 1408, 1, 1, 'sigmoid', 1, 1.0),
    MoEModel('DeepSeek-V4-Flash', 4096, 256, 6, 2048, 0, 0, 'sqrtsoftplus', 1, 1.5),  # noaux_tc, no groups
)


@dataclasses.dataclass(frozen=True)
class MHCModel:
    """A model whose residual stream is a manifold hyper-connection (mHC) of `mhc` streams."""

    name: str
    hidden: int  # hidden_size
    mhc: int  # hc_mult: residual streams
    num_layers: int  # num_hidden_layers (each has an attention and an FFN sublayer, so 2x mHC pre/post)
    sinkhorn_iters: int  # hc_sinkhorn_iters: a run-time argument of every kernel, recorded for the tests
    eps: float  # hc_eps (Sinkhorn and pre-mix eps); also a run-time argument


MHC_MODELS: tuple[MHCModel, ...] = (
    MHCModel('DeepSeek-V4-Flash', 4096, 4, 43, 20, 1e-6),
)

# Shapes upstream TileKernels v1 tests with (tile_kernels/testing/generator.py and the test files).
UPSTREAM_HIDDEN_SIZES: tuple[int, ...] = (576, 2048, 2560, 3072, 4096, 6144, 7168)
UPSTREAM_TOPK_GATE: tuple[tuple[int, int], ...] = (
    (72, 6), (32, 6), (64, 6), (96, 6), (16, 6), (36, 6), (108, 6), (128, 6), (144, 6), (256, 8),
)


# topk_sum_and_topk_group_idx in upstream's tests: experts {72, 256} x groups {4, 8, 12, 16} (where they
# divide) x top-1/top-2 sums x {2, 4} groups kept.
UPSTREAM_GROUP_GATE: tuple[tuple[int, int, int, int], ...] = tuple(
    (g, e // g, s, k) for e in (72, 256) for g in (4, 8, 12, 16) if e % g == 0 for s in (1, 2) for k in (2, 4)
)


# mHC sizes in upstream's tests (tests/mhc/*): hidden sizes of every kernel, the extra one of pre_apply_mix, and the
# stream counts of expand_to_mhc (the other kernels are tested, and built, at mhc = 4).
UPSTREAM_MHC_HIDDEN_SIZES: tuple[int, ...] = (1280, 2560, 4096, 7168, 8192)
UPSTREAM_MHC_APPLY_MIX_HIDDEN_SIZES: tuple[int, ...] = (7680,)
UPSTREAM_MHC_EXPAND_MULTS: tuple[int, ...] = (2, 4, 8)


def mhc_shapes() -> list[tuple[int, int]]:
    """(mhc, hidden) of every mHC model, plus upstream's test sizes at mhc = 4."""
    return sorted({(m.mhc, m.hidden) for m in MHC_MODELS} | {(4, h) for h in UPSTREAM_MHC_HIDDEN_SIZES})


def mhc_mults() -> list[int]:
    """Stream counts of every mHC model (the kernels without a hidden size are specialised on it alone)."""
    return sorted({m.mhc for m in MHC_MODELS} | {4})


def hidden_sizes() -> list[int]:
    return sorted({m.hidden for m in MODELS} | set(UPSTREAM_HIDDEN_SIZES))


def group_gate_shapes() -> list[tuple[int, int, int, int]]:
    """(groups, experts per group, top-k summed, groups kept) of every model with group-limited routing."""
    ours = {(m.num_groups, m.num_experts // m.num_groups, m.group_topk_sum, m.num_topk_groups)
            for m in MODELS if m.num_groups > 1 and m.num_topk_groups < m.num_groups}
    return sorted(ours | set(UPSTREAM_GROUP_GATE))


def gate_shapes() -> list[tuple[int, int]]:
    """(num_experts, num_topk) of every model's router, plus upstream's test list."""
    return sorted({(m.num_experts, m.num_topk) for m in MODELS} | set(UPSTREAM_TOPK_GATE))


@dataclasses.dataclass(frozen=True)
class EngramModel:
    """A model with Engram n-gram memory layers gated into an `hc`-stream residual (hc_mult)."""

    name: str
    hidden: int  # hidden_size of the backbone
    hc: int  # hc_mult: residual streams the gate runs over
    max_ngram_size: int  # N: the hash mixes the last N token ids
    heads_per_ngram: int  # M: n_head_per_ngram, embedding tables (hash moduli) per n-gram order
    num_layers: int  # L: Engram layers hashed in one call (len(layer_ids))


ENGRAM_MODELS: tuple[EngramModel, ...] = (
    EngramModel('Engram-demo', 1024, 4, 3, 8, 2),
)

# Engram sizes in upstream's tests (tests/engram/*): the gate's hidden sizes (hc = 4) and the hash's (N, L, M).
UPSTREAM_ENGRAM_HIDDEN_SIZES: tuple[int, ...] = (2048, 2560, 3072, 4096, 6144, 7168)
UPSTREAM_ENGRAM_HASH: tuple[tuple[int, int, int], ...] = ((3, 2, 8),)


def engram_hidden_sizes() -> list[int]:
    """Hidden sizes of the Engram gate kernels (hc = 4): every Engram model's, upstream's Engram test sizes and
    hidden_sizes(); a kernel keeps those it can tile."""
    return sorted({m.hidden for m in ENGRAM_MODELS} | set(UPSTREAM_ENGRAM_HIDDEN_SIZES) | set(hidden_sizes()))


def engram_hash_shapes() -> list[tuple[int, int, int]]:
    """(N, L, M) of every Engram model's hash, plus upstream's test shape."""
    return sorted({(m.max_ngram_size, m.num_layers, m.heads_per_ngram) for m in ENGRAM_MODELS} | set(UPSTREAM_ENGRAM_HASH))
