"""An expert-parallel MoE layer over torch.distributed: tile_kernels_aot's routing and FP8 ops around NCCL.

    torchrun --nproc-per-node N examples/ep_moe.py [--tokens-per-rank 4096] [--iters 20] [--weight-sets S] [--check]

Each of the N ranks holds num_experts / N experts (expert e lives on rank e // experts_per_rank) and its own tokens.
One step of the layer, per rank:

1. gate: ``moe.top2_sum_gate`` with the rank's EP place (DeepSeek-V3's router: sigmoid scores, 8 groups of which 4 are
   kept, top-8, routed scaling 2.5);
2. layout: ``moe.get_fused_mapping`` puts the (token, k) pairs in expert-major order, so the rows for each rank are
   one contiguous run (alignment 1: no padding rows are sent);
3. quantise: ``quant.per_token_cast`` to e4m3 with a float32 scale factor per 128 channels (half the bytes of bf16,
   as production dispatchers send), then ``moe.expand_to_fused_with_sf`` copies rows and scale factors into that order;
4. exchange: the per-expert row counts first (``all_to_all_single``), then the rows and their scale factors;
5. experts: ``quant.cast_back`` to bf16, and each local expert's SwiGLU FFN as torch matmuls;
6. return: the expert outputs (bf16) go back with a second ``all_to_all_single``, in the order they came, and
   ``moe.reduce_fused`` sums each token's top-k rows weighted by its routing weights.

``reference_layer`` computes the same layer for every rank's tokens in one process without any exchange, in pure
torch; ``--check`` compares the two. The figures come out as one JSON line (rank 0): tokens per second over all ranks,
and the time per phase (CUDA events around each) summed into our kernels, NCCL and the expert GEMMs.

For the benchmark records, append the line to the GPU run's output folder, which ``python -m benchmarks.record``
condenses (an 'ep_moe' line per run; ``python -m benchmarks.report`` tabulates them)::

    torchrun --standalone --nproc-per-node 2 examples/ep_moe.py | grep '^{' >> $OUT/ep_moe.jsonl

``--ops reference --device cpu`` runs the same exchange with tile_kernels_aot.reference's pure-torch ops on CPU tensors
over gloo, so the bookkeeping can be checked where there is no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F

BLOCK = 128  # channels per e4m3 scale factor of the dispatched rows
KINDS = ('kernels', 'nccl', 'experts')  # where a phase's time is counted


@dataclasses.dataclass(frozen=True)
class LayerConfig:
    """One MoE layer. The defaults are DeepSeek-V3's (kernel_src/models.py; the shared expert is not part of the
    routed exchange and is left out)."""

    hidden: int = 7168
    num_experts: int = 256
    num_topk: int = 8
    moe_intermediate: int = 2048
    num_groups: int = 8
    num_topk_groups: int = 4
    scoring: str = 'sigmoid'
    routed_scaling_factor: float = 2.5
    # Distinct weight sets per rank: local expert j computes with set j % weight_sets, so that a layer of full size fits
    # on a smaller GPU. Routing, traffic and FLOPs are unchanged. 0: one set per local expert.
    weight_sets: int = 0

    def experts_per_rank(self, world: int) -> int:
        if self.num_experts % world:
            raise ValueError(f'{self.num_experts} experts do not divide over {world} ranks')
        return self.num_experts // world

    def sets_per_rank(self, world: int) -> int:
        per_rank = self.experts_per_rank(world)
        return min(self.weight_sets, per_rank) if self.weight_sets else per_rank


TINY = {'hidden': 256, 'moe_intermediate': 64}  # the test size: DeepSeek-V3's router, a small FFN


# -- the exchange's bookkeeping (plain tensors and lists, no device) -------------------------------------------------

def send_counts(tokens_per_expert: Sequence[int], world: int) -> torch.Tensor:
    """``[world, experts_per_rank]`` int64: the rows this rank sends to each rank's each local expert, from the fused
    layout's per-expert counts (alignment 1, so the counts are the routed pairs)."""
    counts = torch.as_tensor(list(tokens_per_expert), dtype=torch.int64)
    if counts.numel() % world:
        raise ValueError(f'{counts.numel()} experts do not divide over {world} ranks')
    return counts.view(world, -1)


def split_sizes(counts: torch.Tensor) -> list[int]:
    """Rows per rank of a ``[world, experts_per_rank]`` count matrix: the split sizes of all_to_all_single."""
    return counts.sum(dim=1).tolist()


def offsets(sizes: Sequence[int]) -> list[int]:
    """Where each run starts in a buffer of runs of these sizes, and the total last: ``[0, s0, s0 + s1, ...]``."""
    out = [0]
    for size in sizes:
        out.append(out[-1] + size)
    return out


def expert_order(recv_counts: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """The received rows come grouped by source rank and, within one, by local expert: ``recv_counts[s, j]`` rows of
    expert j from rank s. Returns the permutation that groups them by expert (stable, so source rank order within
    one), and each local expert's run in that order as offsets (``experts_per_rank + 1`` of them)."""
    world, per_rank = recv_counts.shape
    row_expert = torch.arange(per_rank).repeat(world).repeat_interleave(recv_counts.reshape(-1))
    order = torch.sort(row_expert, stable=True).indices
    return order, offsets(recv_counts.sum(dim=0).tolist())


# -- inputs and weights, the same whichever process makes them ------------------------------------------------------

def rank_inputs(cfg: LayerConfig, rank: int, num_tokens: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s tokens: ``x`` bf16 ``[num_tokens, hidden]`` and router logits float32 ``[num_tokens, num_experts]``."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 7919 * (rank + 1))
    x = torch.randn((num_tokens, cfg.hidden), generator=gen, device=device).bfloat16()
    logits = torch.randn((num_tokens, cfg.num_experts), generator=gen, device=device)
    return x, logits


def router_bias(cfg: LayerConfig, device, seed: int = 0) -> torch.Tensor:
    """The router's score correction bias (ranking only), float32 ``[num_experts]``."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 1)
    return 0.1 * torch.randn((cfg.num_experts,), generator=gen, device=device)


def weight_source(cfg: LayerConfig, world: int, expert: int) -> int:
    """The global expert whose weights `expert` computes with: itself, unless weight sets are shared on its rank."""
    per_rank = cfg.experts_per_rank(world)
    first = expert // per_rank * per_rank
    return first + (expert - first) % cfg.sets_per_rank(world)


def expert_weights(cfg: LayerConfig, source: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert `source`'s SwiGLU weights: ``w13`` bf16 ``[2 * moe_intermediate, hidden]`` (gate rows, then up rows) and
    ``w2`` bf16 ``[hidden, moe_intermediate]``. Drawn on `device` (the same values on every GPU of one model)."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 104729 * (source + 2))
    w13 = torch.randn((2 * cfg.moe_intermediate, cfg.hidden), generator=gen, device=device) * cfg.hidden ** -0.5
    w2 = torch.randn((cfg.hidden, cfg.moe_intermediate), generator=gen, device=device) * cfg.moe_intermediate ** -0.5
    return w13.bfloat16(), w2.bfloat16()


def swiglu_ffn(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``(silu(x W1^T) * x W3^T) W2^T`` in bf16 with float32 accumulation, as the layer's experts compute."""
    gate, up = (x @ w13.T).chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).bfloat16() @ w2.T


class LocalExperts:
    """The weights of one rank's experts (``weight_sets`` distinct sets), and their FFN over received rows."""

    def __init__(self, cfg: LayerConfig, rank: int, world: int, device, seed: int = 0) -> None:
        self.cfg, self.per_rank = cfg, cfg.experts_per_rank(world)
        first = rank * self.per_rank
        num_sets = cfg.sets_per_rank(world)
        self.w13 = torch.empty((num_sets, 2 * cfg.moe_intermediate, cfg.hidden), dtype=torch.bfloat16, device=device)
        self.w2 = torch.empty((num_sets, cfg.hidden, cfg.moe_intermediate), dtype=torch.bfloat16, device=device)
        for s in range(num_sets):
            self.w13[s], self.w2[s] = expert_weights(cfg, first + s, device, seed)

    def __call__(self, h: torch.Tensor, recv_counts: torch.Tensor) -> torch.Tensor:
        """The FFN output of every received row (bf16, rows in the order received)."""
        order, starts = expert_order(recv_counts)
        order = order.to(h.device)
        grouped = h[order]
        y = torch.empty_like(grouped)
        for j in range(self.per_rank):
            lo, hi = starts[j], starts[j + 1]
            if hi > lo:
                s = j % self.w13.shape[0]
                y[lo:hi] = swiglu_ffn(grouped[lo:hi], self.w13[s], self.w2[s])
        out = torch.empty_like(y)
        out[order] = y
        return out


# -- the ops: tile_kernels_aot's kernels, or the same steps in pure torch ---------------------------------------------

def kernel_ops() -> SimpleNamespace:
    import tile_kernels_aot

    moe, quant = tile_kernels_aot.moe, tile_kernels_aot.quant
    return SimpleNamespace(
        gate=moe.top2_sum_gate, fused_mapping=moe.get_fused_mapping, combine=moe.reduce_fused,
        quantize=lambda x: quant.per_token_cast(x, 'e4m3', BLOCK),
        expand=lambda q, token_topk_to_pos, pos_to_expert: moe.expand_to_fused_with_sf(q, BLOCK, token_topk_to_pos, pos_to_expert),
        dequantize=lambda q: quant.cast_back(q, 'bf16', (1, BLOCK)))


def reference_ops() -> SimpleNamespace:
    from tile_kernels_aot import reference as ref

    def expand(q, token_topk_to_pos, pos_to_expert):  # the e4m3 rows move as bytes (index_put has no float8 on some devices)
        data, sf = ref.expand_to_fused_with_sf((q[0].view(torch.uint8), q[1]), BLOCK, token_topk_to_pos, pos_to_expert)
        return data.view(torch.float8_e4m3fn), sf

    return SimpleNamespace(
        gate=ref.top2_sum_gate, fused_mapping=ref.get_fused_mapping, combine=ref.reduce_fused, expand=expand,
        quantize=lambda x: ref.cast(x, 'e4m3', (1, BLOCK)), dequantize=lambda q: ref.cast_back(q, 'bf16', (1, BLOCK)))


OPS = {'kernels': kernel_ops, 'reference': reference_ops}


# -- timing ----------------------------------------------------------------------------------------------------------

class PhaseTimer:
    """Time per phase: CUDA events on the current stream around each phase on a GPU, the host clock on CPU. A phase's
    time is counted under its kind (our kernels, NCCL, the expert GEMMs); the step is from its first phase's start
    to its last phase's end, host syncs included."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == 'cuda'
        self.marks: list[tuple[str, str, object, object]] = []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    @contextlib.contextmanager
    def __call__(self, phase: str, kind: str):
        start = self._now()
        yield
        self.marks.append((phase, kind, start, self._now()))

    def summary(self) -> dict:
        """ms per phase, per kind and for the whole of the timed steps (call after the steps, once)."""
        if self.cuda:
            torch.cuda.synchronize()
        phases: dict[str, float] = {}
        kinds = dict.fromkeys(KINDS, 0.0)
        for phase, kind, start, end in self.marks:
            ms = self._ms(start, end)
            phases[phase] = phases.get(phase, 0.0) + ms
            kinds[kind] += ms
        total = self._ms(self.marks[0][2], self.marks[-1][3]) if self.marks else 0.0
        return {'phases': phases, 'kinds': kinds, 'total': total}


class _NoTimer:
    @contextlib.contextmanager
    def __call__(self, phase: str, kind: str):
        yield


def _all_to_all(send: torch.Tensor, send_splits: list[int], recv_splits: list[int], group) -> torch.Tensor:
    """all_to_all_single over dim 0, of any dtype: 1-byte floats travel as uint8."""
    recv = send.new_empty((sum(recv_splits), *send.shape[1:]))
    carrier = torch.uint8 if send.element_size() == 1 else None
    dist.all_to_all_single(recv.view(carrier) if carrier else recv, send.view(carrier) if carrier else send, recv_splits, send_splits, group=group)
    return recv


# -- the layer -------------------------------------------------------------------------------------------------------

def ep_layer(x: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor, experts: LocalExperts, cfg: LayerConfig, group=None,
             ops: SimpleNamespace | None = None, timer=None) -> torch.Tensor:
    """One step of the expert-parallel layer on this rank's tokens (see the module docstring): ``[T, hidden]`` bf16."""
    ops = ops or kernel_ops()
    timer = timer or _NoTimer()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    with timer('gate', 'kernels'):
        topk_idx, topk_weights = ops.gate(logits, bias, cfg.num_topk, cfg.num_topk_groups, cfg.num_groups, False, 0,
                                          cfg.routed_scaling_factor, rank, world, 0, 1, cfg.scoring)
    with timer('layout', 'kernels'):  # reads the per-expert counts back: the split sizes are host values
        pos_to_expert, _, _, token_topk_to_pos, _, _, _, per_expert = ops.fused_mapping(topk_idx, cfg.num_experts, 0, 1)
    with timer('quantize', 'kernels'):
        data, sf = ops.expand(ops.quantize(x), token_topk_to_pos, pos_to_expert)
    counts = send_counts(per_expert, world)
    with timer('counts', 'nccl'):
        recv_counts = torch.empty_like(counts, device=x.device)
        dist.all_to_all_single(recv_counts, counts.to(x.device), group=group)
        recv_counts = recv_counts.cpu()
    send_splits, recv_splits = split_sizes(counts), split_sizes(recv_counts)
    with timer('dispatch', 'nccl'):
        recv_data = _all_to_all(data, send_splits, recv_splits, group)
        recv_sf = _all_to_all(sf, send_splits, recv_splits, group)
    with timer('dequantize', 'kernels'):
        h = ops.dequantize((recv_data, recv_sf))
    with timer('experts', 'experts'):
        y = experts(h, recv_counts)
    with timer('return', 'nccl'):
        back = _all_to_all(y, recv_splits, send_splits, group)
    with timer('combine', 'kernels'):
        return ops.combine(back, topk_weights, token_topk_to_pos)


def reference_layer(xs: Sequence[torch.Tensor], logits: Sequence[torch.Tensor], bias: torch.Tensor, cfg: LayerConfig, world: int,
                    seed: int = 0, quantize: bool = True) -> list[torch.Tensor]:
    """The layer for every rank's tokens in one process, no exchange, pure torch: the same routing, the same e4m3
    round trip of the dispatched rows (unless ``quantize`` is off), each token's experts and the weighted sum in
    k order. Returns each rank's output."""
    from tile_kernels_aot import reference as ref

    x, logit = torch.cat(list(xs)), torch.cat(list(logits))
    num_tokens = x.shape[0]
    idx, weights = ref.top2_sum_gate(logit, bias, cfg.num_topk, cfg.num_topk_groups, cfg.num_groups, False, 0, cfg.routed_scaling_factor,
                                     0, world, 0, 1, cfg.scoring)
    h = ref.cast_back(ref.cast(x, 'e4m3', (1, BLOCK)), 'bf16', (1, BLOCK)) if quantize else x
    y = torch.empty((num_tokens * cfg.num_topk, cfg.hidden), dtype=torch.bfloat16, device=x.device)
    flat = idx.reshape(-1)
    for expert in flat.unique().tolist():
        pairs = (flat == expert).nonzero().flatten()
        w13, w2 = expert_weights(cfg, weight_source(cfg, world, expert), x.device, seed)
        y[pairs] = swiglu_ffn(h[pairs // cfg.num_topk], w13, w2)
    positions = torch.arange(num_tokens * cfg.num_topk, dtype=torch.int32, device=x.device).view(num_tokens, cfg.num_topk)
    out = ref.reduce_fused(y, weights, positions)
    return list(out.split([t.shape[0] for t in xs]))


def calc_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """1 - the cosine-like similarity ``2 a.b / (a.a + b.b)`` (0 for equal tensors)."""
    a, b = a.double(), b.double()
    denominator = (a * a + b * b).sum()
    return float(1 - 2 * (a * b).sum() / denominator) if denominator != 0 else 0.0


# Bounds of --check: against the reference with the same e4m3 round trip only the rounding of the bf16 GEMMs and of the
# router's float32 weights differs; without it, the e4m3 quantisation of the dispatched rows (about 2^-5 relative
# per element) adds its error.
SAME_LAYER_DIFF = 1e-4
UNQUANTIZED_DIFF = 2e-3


# -- the command -----------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--tokens-per-rank', type=int, default=4096)
    parser.add_argument('--hidden', type=int, default=LayerConfig.hidden)
    parser.add_argument('--moe-intermediate', type=int, default=LayerConfig.moe_intermediate)
    parser.add_argument('--weight-sets', type=int, default=0,
                        help='distinct expert weight sets per rank (local expert j uses set j %% S), so that the layer fits; 0: one per expert')
    parser.add_argument('--tiny', action='store_true', help=f'the test size: {TINY}')
    parser.add_argument('--iters', type=int, default=20, help='timed steps')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--check', action='store_true', help='compare the first step with reference_layer (on rank 0) and exit 1 beyond the bounds')
    parser.add_argument('--device', choices=('cuda', 'cpu'), default='cuda')
    parser.add_argument('--ops', choices=tuple(OPS), default='kernels', help="'reference': tile_kernels_aot.reference's pure-torch ops")
    parser.add_argument('--backend', default=None, help='torch.distributed backend (default: nccl on cuda, gloo on cpu)')
    args = parser.parse_args(argv)
    if args.weight_sets < 0 or args.tokens_per_rank < 0 or args.iters < 1 or args.warmup < 0:
        parser.error('--weight-sets, --tokens-per-rank and --warmup must be >= 0, --iters >= 1')
    if args.device == 'cpu' and args.ops == 'kernels':
        parser.error("--device cpu needs --ops reference (the kernels run on a GPU)")
    return args


def config_of(args: argparse.Namespace) -> LayerConfig:
    sizes = dict(TINY) if args.tiny else {'hidden': args.hidden, 'moe_intermediate': args.moe_intermediate}
    return LayerConfig(weight_sets=args.weight_sets, **sizes)


def check(out: torch.Tensor, cfg: LayerConfig, args: argparse.Namespace, group=None) -> dict:
    """Gather every rank's output on rank 0 and compare with reference_layer there (the result on every rank)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    outs = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(outs, out, group=group)
    result = {}
    if rank == 0:
        inputs = [rank_inputs(cfg, r, args.tokens_per_rank, out.device, args.seed) for r in range(world)]
        bias = router_bias(cfg, out.device, args.seed)
        ours = torch.cat(outs)
        for name, quantize, bound in (('same_layer', True, SAME_LAYER_DIFF), ('unquantized', False, UNQUANTIZED_DIFF)):
            ref = torch.cat(reference_layer([x for x, _ in inputs], [lg for _, lg in inputs], bias, cfg, world, args.seed, quantize))
            result[name] = {'diff': calc_diff(ours, ref), 'bound': bound, 'max_abs': float((ours.float() - ref.float()).abs().max()) if ours.numel() else 0.0}
        result['ok'] = all(v['diff'] <= v['bound'] for v in result.values())
    box = [result]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def run(args: argparse.Namespace, group=None) -> dict:
    """The example's steps on this rank: build the rank's experts and inputs, warm up, time `iters` steps. Returns the
    figures (every rank's slowest step time decides), with the check's result under 'check' when asked."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == 'cuda' else torch.device('cpu')
    cfg = config_of(args)
    ops = OPS[args.ops]()
    experts = LocalExperts(cfg, rank, world, device, args.seed)
    x, logits = rank_inputs(cfg, rank, args.tokens_per_rank, device, args.seed)
    bias = router_bias(cfg, device, args.seed)
    out = ep_layer(x, logits, bias, experts, cfg, group, ops)
    checked = check(out, cfg, args, group) if args.check else None
    for _ in range(args.warmup):
        ep_layer(x, logits, bias, experts, cfg, group, ops)
    timer = PhaseTimer(device)
    for _ in range(args.iters):
        ep_layer(x, logits, bias, experts, cfg, group, ops, timer)
    times = timer.summary()
    slowest = torch.tensor([times['total']], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    step_ms = float(slowest) / args.iters
    result = {
        'what': 'ep_moe', 'world_size': world, 'tokens_per_rank': args.tokens_per_rank, 'hidden': cfg.hidden, 'num_experts': cfg.num_experts,
        'num_topk': cfg.num_topk, 'moe_intermediate': cfg.moe_intermediate, 'weight_sets': cfg.sets_per_rank(world), 'ops': args.ops,
        'device': torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu', 'iters': args.iters,
        'step_ms': step_ms, 'tokens_per_s': world * args.tokens_per_rank / step_ms * 1e3,
        'phases_ms': {k: v / args.iters for k, v in times['phases'].items()},
        **{f'{kind}_ms': v / args.iters for kind, v in times['kinds'].items()},
    }
    for kind in KINDS:
        result[f'{kind}_share'] = result[f'{kind}_ms'] / result['step_ms'] if result['step_ms'] else 0.0
    if checked is not None:
        result['check'] = checked
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == 'cuda':
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))
    dist.init_process_group(args.backend or ('nccl' if args.device == 'cuda' else 'gloo'))
    try:
        result = run(args)
        if dist.get_rank() == 0:
            print(json.dumps(result), flush=True)
    finally:
        dist.destroy_process_group()
    return 0 if result.get('check', {'ok': True})['ok'] else 1


if __name__ == '__main__':
    sys.exit(main())
