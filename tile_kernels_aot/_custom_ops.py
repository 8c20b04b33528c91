"""torch.library custom ops, namespace ``tile_kernels_aot``, one for every public op that launches a kernel.

The public functions (``moe.topk_gate``, ``quant.per_token_cast``, ``mhc.mhc_post_fwd``, ``engram.engram_gate_fwd``,
...) stay the API. Called eagerly they run as they always have; under torch.compile (``torch.compiler.is_compiling()``)
their first line hands the call to the function of the same name here, which calls the custom op. The compiler sees one opaque node whose fake implementation gives
the outputs' shapes, dtypes and strides for symbolic token counts; the compiled graph runs the op's kernel, which is
the public function again, taking its eager path. ``torch.ops.tile_kernels_aot.<name>`` can also be called directly.

Schemas cannot hold what some public signatures do, so those ops differ from their public function:

* a quantised ``(data, sf)`` input is two tensor arguments, and a block size an ``int[]``;
* ``reduce_fused`` with ``out=`` is the op ``reduce_fused_out``, which mutates ``out`` and returns nothing
  (an op's output may not alias an input);
* ``get_fused_mapping`` never syncs: ``num_expanded_tokens=0`` sizes the buffers by upstream's bound. The public
  function's sync (``num_expanded_tokens=0`` without ``force_no_sync``) reads the counts back with ``tolist()``,
  which torch.compile traces only with ``torch._dynamo.config.capture_scalar_outputs`` and breaks the graph at
  otherwise; pass ``num_expanded_tokens`` or ``force_no_sync=True`` for one graph;
* ``swiglu_backward_and_per_token_cast`` returns its five tensors flat;
* ``expand_to_mhc_fwd``, ``mhc_pre_apply_mix_fwd`` and ``mhc_post_fwd`` with ``out=`` are the ops ``<name>_out``, as
  ``reduce_fused``;
* the op ``mhc_post_bwd`` is pure: the ``fuse_grad_acc`` stash, an attribute of the residual's untyped storage, is set
  by the function here after the op. Dynamo cannot trace that attribute (a graph break, refused under fullgraph=True),
  so compiled code passes ``fuse_grad_acc=False``, as modeling.mhc does under torch.compile;
* ``engram_gate_fwd`` returns ``(out, saved)`` with ``saved`` a list, empty without ``save_for_backward`` (a schema has
  no optional returns);
* the fake of ``engram_gate_bwd`` gives ``grad_w_partial`` an unbacked first dim: its chunk count follows from the
  binary's manifest constants, which a fake cannot read without a device.

Ops that write their inputs declare it: ``inplace_unique_group_indices`` (``group_indices``), ``top2_sum_gate``
(``unmapped_topk_idx``), ``swiglu_forward_and_per_token_cast`` (``clamped_count``), the ``_out`` ops (``out``),
``mhc_pre_apply_mix_bwd`` and ``mhc_pre_norm_fn_bwd`` (``x_grad``), ``mhc_fn_normw_merge_bwd`` (``fn_grad``,
``normw_grad``), ``mhc_multilayer_recompute`` (``layer_input_list``, ``residual_list``) and ``grad_w_reduce``
(``grad_weight_hidden``, ``grad_weight_embed``). No op has a registered autograd formula: upstream defines none, the
quantising ops' outputs (fp8, int) are not differentiable, and the SwiGLU, mHC and Engram backwards are ops of their
own, which the autograd Functions (training code, tile_kernels_aot.modeling) call.

Aliases without a kernel of their own are traced through, not registered: ``quant.per_token_cast_back`` (it calls
``cast_back``) and the pure-torch ``quant.unpack_from_e2m1fn_x2`` and ``mhc.round_to_tf32``.

Adding an op: a ``_define`` line (schema, the public function that serves it, its fake), plus, where the signatures
differ, a function here with the public signature that calls the op and an ``eager`` converter back. Every fake
allocates as its public function does (quant's through the same ``alloc_sf`` / ``alloc_quant_out``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable

import torch
from torch.compiler import is_compiling

NAMESPACE = 'tile_kernels_aot'
_LIB = torch.library.Library(NAMESPACE, 'DEF')
ops = torch.ops.tile_kernels_aot
# Public functions served by custom ops: {'module.name': the op it calls}. The tests check it covers every public op.
PUBLIC: dict[str, str] = {}
TRACED_THROUGH = ('quant.per_token_cast_back', 'quant.unpack_from_e2m1fn_x2', 'mhc.round_to_tf32')


@contextlib.contextmanager
def _not_compiling():
    """is_compiling() False while an op's kernel runs during a compile session (a backend that runs the graph on
    real tensors): the public function must take its eager path, not call the op again."""
    flag = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = False
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = flag


def _kernel(public: str, eager: Callable | None) -> Callable:
    """The op's kernel: the public function ``public`` ('module.name', looked up at the first call, since the op
    modules import this one), called with the op's arguments, or through ``eager(function, *args)``."""
    module, name = public.split('.')
    resolved: list[Callable] = []

    def run(*args, **kwargs):
        if not resolved:
            fn = getattr(importlib.import_module(f'{__package__}.{module}'), name)
            resolved.append(fn if eager is None else (lambda *a, **k: eager(fn, *a, **k)))
        if is_compiling():
            with _not_compiling():
                return resolved[0](*args, **kwargs)
        return resolved[0](*args, **kwargs)

    return run


def _define(schema: str, public: str, fake: Callable, eager: Callable | None = None) -> torch._ops.OpOverloadPacket:
    """Define tile_kernels_aot::<name> by its schema: served by the public function ``public`` on CUDA tensors (and on
    CPU ones, which it refuses with its own message), and described by ``fake`` under FakeTensorMode and on meta."""
    name = schema[:schema.index('(')]
    _LIB.define(schema)
    packet = getattr(ops, name)
    kernel = _with_defaults(packet.default._schema, _kernel(public, eager))
    _LIB.impl(name, kernel, 'CUDA')
    _LIB.impl(name, kernel, 'CPU')
    torch.library.register_fake(f'{NAMESPACE}::{name}', _with_defaults(packet.default._schema, fake), lib=_LIB)
    PUBLIC.setdefault(public, name)
    return packet


def _with_defaults(schema: torch.FunctionSchema, fn: Callable) -> Callable:
    """``fn`` called with every argument of the schema: the dispatcher leaves out trailing ones equal to their defaults."""
    positional = [a.default_value for a in schema.arguments if not a.kwarg_only]
    keywords = {a.name: a.default_value for a in schema.arguments if a.kwarg_only}

    def call(*args, **kwargs):
        if len(args) < len(positional):
            args = (*args, *positional[len(args):])
        if len(kwargs) < len(keywords):
            kwargs = {**keywords, **kwargs}
        return fn(*args, **kwargs)

    return call


def _common():
    from tile_kernels_aot.quant import _common
    return _common


def _sf(num_rows, num_blocks: int, col_major: bool, packed: bool, device: torch.device) -> torch.Tensor:
    """The scale factors a cast returns, allocated as it allocates them."""
    return _common().alloc_sf(num_rows, num_blocks, col_major, packed, device)[0]


def _quant_out(num_tokens, hidden, fmt: str, device: torch.device) -> torch.Tensor:
    return _common().alloc_quant_out(num_tokens, hidden, fmt, device)


def _pair(x, x_sf):
    return x if x_sf is None else (x, x_sf)


def _split(x) -> tuple:
    return (x[0], x[1]) if isinstance(x, tuple) else (x, None)


def _tuple(block):
    return None if block is None else tuple(block)


def _list(block):
    return None if block is None else list(block)


def _ceil(a, b):
    return -(-a // b)


# -- moe ------------------------------------------------------------------------------------------------------------

topk_gate = _define(
    'topk_gate(Tensor scores, int num_topk) -> Tensor', 'moe.topk_gate',
    lambda scores, num_topk: scores.new_empty((scores.shape[0], num_topk), dtype=torch.int64))

topk_sum_and_topk_group_idx = _define(
    'topk_sum_and_topk_group_idx(Tensor scores, int num_topk_sum, int num_topk_groups) -> Tensor', 'moe.topk_sum_and_topk_group_idx',
    lambda scores, num_topk_sum, num_topk_groups: scores.new_empty((scores.shape[0], num_topk_groups), dtype=torch.int64))


def _top2_sum_gate_fake(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts, *rest):
    shape = (logits.shape[0], num_topk + (num_shared_experts if use_shared_as_routed else 0))
    return logits.new_empty(shape, dtype=torch.int64), logits.new_empty(shape)


top2_sum_gate = _define(
    'top2_sum_gate(Tensor logits, Tensor bias, int num_topk, int num_topk_groups, int num_groups, bool use_shared_as_routed, '
    'int num_shared_experts, float routed_scaling_factor, int ep_rank, int num_ep_ranks, int tp_rank, int num_tp_ranks, '
    'str scoring_func, Tensor? mask=None, Tensor? fix_routing_mask=None, Tensor? to_physical_map=None, Tensor? logical_count=None, '
    'Tensor(a!)? unmapped_topk_idx=None) -> (Tensor, Tensor)', 'moe.top2_sum_gate', _top2_sum_gate_fake)

normalize_weight = _define(
    'normalize_weight(Tensor topk_weights) -> (Tensor, Tensor)', 'moe.normalize_weight',
    lambda w: (w.new_empty((w.shape[0],)), w.new_empty(w.shape)))

group_count = _define(
    'group_count(Tensor group_idx, int num_groups) -> Tensor', 'moe.group_count',
    lambda group_idx, num_groups: group_idx.new_empty((num_groups,), dtype=torch.int32))

aux_fi = _define(
    'aux_fi(Tensor topk_idx, int num_experts, int num_aux_topk) -> Tensor', 'moe.aux_fi',
    lambda topk_idx, num_experts, num_aux_topk: topk_idx.new_empty((num_experts,), dtype=torch.float32))

inplace_unique_group_indices = _define(
    'inplace_unique_group_indices(Tensor(a!) group_indices, int num_groups) -> ()', 'moe.inplace_unique_group_indices',
    lambda group_indices, num_groups: None)

mask_indices_by_tp = _define(
    'mask_indices_by_tp(Tensor indices, int n, int num_ep_ranks, int tp_rank, int num_tp_ranks) -> Tensor', 'moe.mask_indices_by_tp',
    lambda indices, *sizes: indices.new_empty(indices.shape))


def _fused_mapping_fake(topk_idx, num_experts, num_expanded_tokens, alignment):
    num_tokens, num_topk = topk_idx.shape
    if num_expanded_tokens == 0:
        num_expanded_tokens = (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment
    new = topk_idx.new_empty
    positions = tuple(new((num_expanded_tokens,), dtype=torch.int32) for _ in range(3))
    experts = tuple(new((num_experts,), dtype=torch.int32) for _ in range(3))
    return (*positions, new((num_tokens, num_topk), dtype=torch.int32), *experts)


_get_fused_mapping = _define(
    'get_fused_mapping(Tensor topk_idx, int num_experts, int num_expanded_tokens, int alignment) '
    '-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)', 'moe.get_fused_mapping', _fused_mapping_fake,
    lambda f, topk_idx, num_experts, num_expanded_tokens, alignment: f(topk_idx, num_experts, num_expanded_tokens, alignment, True)[:7])


def get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync=False):
    outs = _get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment)
    if num_expanded_tokens or force_no_sync:
        return (*outs, [])
    counts = outs[6].tolist()  # the eager op's host sync
    used = sum(counts)
    return (outs[0][:used], outs[1][:used], outs[2][:used], *outs[3:], counts)


expand_to_fused = _define(
    'expand_to_fused(Tensor x, Tensor token_topk_to_pos, Tensor pos_to_expert) -> Tensor', 'moe.expand_to_fused',
    lambda x, token_topk_to_pos, pos_to_expert: x.new_empty((pos_to_expert.shape[0], x.shape[1])))


def _expand_with_sf_fake(x, sf, num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf):
    num_expanded, hidden_sf = pos_to_expert.shape[0], sf.shape[1]
    if use_tma_aligned_col_major_sf:
        out_sf = sf.new_empty((hidden_sf, (num_expanded + 3) // 4 * 4))[:, :num_expanded].T
    else:
        out_sf = sf.new_empty((num_expanded, hidden_sf))
    return x.new_empty((num_expanded, x.shape[1])), out_sf


_expand_to_fused_with_sf = _define(
    'expand_to_fused_with_sf(Tensor x, Tensor sf, int num_per_channels, Tensor token_topk_to_pos, Tensor pos_to_expert, '
    'bool use_tma_aligned_col_major_sf=False) -> (Tensor, Tensor)', 'moe.expand_to_fused_with_sf', _expand_with_sf_fake,
    lambda f, x, sf, *rest: f((x, sf), *rest))


def expand_to_fused_with_sf(x, num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf=False):
    return _expand_to_fused_with_sf(x[0], x[1], num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf)


def _reduce_fused_fake(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf):
    out_dtype = torch.float8_e4m3fn if fp8_format == 'e4m3' else x.dtype
    return x.new_empty((token_topk_to_pos.shape[0], x.shape[1]), dtype=out_dtype)


_REDUCE_ARGS = 'Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, str fp8_format="", Tensor? sf=None'
_reduce_fused = _define(
    f'reduce_fused({_REDUCE_ARGS}) -> Tensor', 'moe.reduce_fused', _reduce_fused_fake,
    lambda f, x, x_sf, *rest: f(_pair(x, x_sf), *rest))


def _reduce_into(f, x, x_sf, *rest, out) -> None:
    f(_pair(x, x_sf), *rest, out=out)


_reduce_fused_out = _define(
    f'reduce_fused_out({_REDUCE_ARGS}, *, Tensor(a!) out) -> ()', 'moe.reduce_fused', lambda *args, out: None, _reduce_into)


def reduce_fused(x, topk_weights, token_topk_to_pos, fp8_format='', sf=None, out=None):
    x, x_sf = _split(x)
    if out is None:
        return _reduce_fused(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf)
    _reduce_fused_out(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf, out=out)
    return out


# -- quant ----------------------------------------------------------------------------------------------------------

_CAST_FLAGS = 'bool use_tma_aligned_col_major_sf=False, bool round_sf=False, bool use_packed_ue8m0=False'


def _e5m6_fake(x, num_per_channels, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False):
    num_tokens, hidden = x.shape
    data = x.new_empty((num_tokens, hidden // 8 * 3), dtype=torch.uint32).view(torch.uint8)
    if use_tma_aligned_col_major_sf:
        dtype = torch.int32 if use_packed_ue8m0 else torch.float32
        return data, x.new_empty((1, (num_tokens + 3) // 4 * 4), dtype=dtype)[:, :num_tokens].T
    return data, x.new_empty((num_tokens, 1), dtype=torch.float32)


def _per_token_fake(x, x_sf, fmt, num_per_channels, x_block_size, col_major, round_sf, packed):
    """(out, sf) of per_token_cast and its variants."""
    if fmt == 'e5m6':
        return _e5m6_fake(x, num_per_channels, col_major, round_sf, packed)
    num_tokens, hidden = x.shape
    if x_sf is not None and x.dtype == torch.int8:  # e2m1 pairs
        hidden *= 2
    return _quant_out(num_tokens, hidden, fmt, x.device), _sf(num_tokens, _ceil(hidden, num_per_channels), col_major, packed, x.device)


def _per_token_eager(f, x, x_sf, fmt, num_per_channels, x_block_size, *flags):
    return f(_pair(x, x_sf), fmt, num_per_channels, _tuple(x_block_size), *flags)


_PER_TOKEN_ARGS = 'Tensor x, Tensor? x_sf, str fmt, int num_per_channels'
_per_token_cast = _define(
    f'per_token_cast({_PER_TOKEN_ARGS}, int[]? x_block_size=None, {_CAST_FLAGS}) -> (Tensor, Tensor)', 'quant.per_token_cast',
    _per_token_fake, _per_token_eager)
_per_token_cast_with_sf_only = _define(
    f'per_token_cast_with_sf_only({_PER_TOKEN_ARGS}, int[]? x_block_size=None, {_CAST_FLAGS}) -> Tensor',
    'quant.per_token_cast_with_sf_only', lambda *args: _per_token_fake(*args)[1], _per_token_eager)
_per_token_cast_with_precomputed_sf = _define(
    f'per_token_cast_with_precomputed_sf({_PER_TOKEN_ARGS}, Tensor sf, int[]? x_block_size=None, {_CAST_FLAGS}) -> Tensor',
    'quant.per_token_cast_with_precomputed_sf',
    lambda x, x_sf, fmt, npc, sf, block, *flags: _per_token_fake(x, x_sf, fmt, npc, block, *flags)[0],
    lambda f, x, x_sf, fmt, npc, sf, block, *flags: f(_pair(x, x_sf), fmt, npc, sf, _tuple(block), *flags))


def per_token_cast(x, fmt, num_per_channels, x_block_size=None, use_tma_aligned_col_major_sf=False, round_sf=False,
                   use_packed_ue8m0=False):
    return _per_token_cast(*_split(x), fmt, num_per_channels, _list(x_block_size), use_tma_aligned_col_major_sf, round_sf,
                           use_packed_ue8m0)


def per_token_cast_with_sf_only(x, fmt, num_per_channels, x_block_size=None, use_tma_aligned_col_major_sf=False, round_sf=False,
                                use_packed_ue8m0=False):
    return _per_token_cast_with_sf_only(*_split(x), fmt, num_per_channels, _list(x_block_size), use_tma_aligned_col_major_sf,
                                        round_sf, use_packed_ue8m0)


def per_token_cast_with_precomputed_sf(x, fmt, num_per_channels, sf, x_block_size=None, use_tma_aligned_col_major_sf=False,
                                       round_sf=False, use_packed_ue8m0=False):
    return _per_token_cast_with_precomputed_sf(*_split(x), fmt, num_per_channels, sf, _list(x_block_size),
                                               use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


per_token_cast_to_e5m6 = _define(
    f'per_token_cast_to_e5m6(Tensor x, int num_per_channels, {_CAST_FLAGS}) -> (Tensor, Tensor)', 'quant.per_token_cast_to_e5m6',
    _e5m6_fake)

_OUT_DTYPES = {'bf16': torch.bfloat16, 'fp32': torch.float32}


def _cast_back_fake(x, sf, fmt, x_block_size, x_special_fmt=None):
    num_tokens, width = x.shape
    hidden = width // 3 * 2 if x_special_fmt == 'e5m6' else width * 2 if x.dtype == torch.int8 else width
    return x.new_empty((num_tokens, hidden), dtype=_OUT_DTYPES.get(fmt, torch.float32))


_cast_back = _define(
    'cast_back(Tensor x, Tensor sf, str fmt, int[] x_block_size, str? x_special_fmt=None) -> Tensor', 'quant.cast_back',
    _cast_back_fake, lambda f, x, sf, fmt, block, special: f((x, sf), fmt, tuple(block), special))
_cast_back_from_e5m6 = _define(
    'cast_back_from_e5m6(Tensor x, Tensor sf, str fmt, int[] x_block_size) -> Tensor', 'quant.cast_back_from_e5m6',
    lambda x, sf, fmt, block: _cast_back_fake(x, sf, fmt, block, 'e5m6'),
    lambda f, x, sf, fmt, block: f((x, sf), fmt, tuple(block)))


def cast_back(x, fmt, x_block_size, x_special_fmt=None):
    return _cast_back(x[0], x[1], fmt, list(x_block_size), x_special_fmt)


def cast_back_from_e5m6(x, fmt, x_block_size):
    return _cast_back_from_e5m6(x[0], x[1], fmt, list(x_block_size))


def _per_block_fake(x, fmt, block_size, col_major=False, round_sf=False, packed=False):
    num_tokens, hidden = x.shape
    sf = _sf(_ceil(num_tokens, block_size[0]), _ceil(hidden, block_size[1]), col_major, packed, x.device)
    return _quant_out(num_tokens, hidden, fmt, x.device), sf


per_block_cast = _define(
    f'per_block_cast(Tensor x, str fmt, int[] block_size, {_CAST_FLAGS}) -> (Tensor, Tensor)', 'quant.per_block_cast', _per_block_fake)
per_block_cast_with_sf_only = _define(
    f'per_block_cast_with_sf_only(Tensor x, str fmt, int[] block_size, {_CAST_FLAGS}) -> Tensor', 'quant.per_block_cast_with_sf_only',
    lambda *args: _per_block_fake(*args)[1])
per_block_cast_with_precomputed_sf = _define(
    f'per_block_cast_with_precomputed_sf(Tensor x, str fmt, int[] block_size, Tensor sf, {_CAST_FLAGS}) -> Tensor',
    'quant.per_block_cast_with_precomputed_sf', lambda x, fmt, block_size, sf, *flags: _quant_out(*x.shape, fmt, x.device))


def _lossless_fake(x, x_sf, fmt, x_block_size, out_block_size, col_major=False, round_sf=False, packed=False):
    num_tokens, hidden = x.shape[0], x.shape[1] * 2
    sf = _sf(_ceil(num_tokens, out_block_size[0]), _ceil(hidden, out_block_size[1]), col_major, packed, x.device)
    return x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn), sf


_per_block_cast_lossless = _define(
    f'per_block_cast_lossless(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, int[] out_block_size, {_CAST_FLAGS}) '
    '-> (Tensor, Tensor)', 'quant.per_block_cast_lossless', _lossless_fake, lambda f, x, x_sf, *rest: f((x, x_sf), *rest))


def per_block_cast_lossless(x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf=False, round_sf=False,
                            use_packed_ue8m0=False):
    return _per_block_cast_lossless(x[0], x[1], fmt, list(x_block_size), list(out_block_size), use_tma_aligned_col_major_sf,
                                    round_sf, use_packed_ue8m0)


def _per_channel_fake(x, num_tokens_out, num_per_tokens):
    hidden = x.shape[1]
    return (x.new_empty((num_tokens_out, hidden), dtype=torch.float8_e4m3fn),
            x.new_empty((_ceil(num_tokens_out, num_per_tokens), hidden), dtype=torch.float32))


per_channel_cast = _define(
    'per_channel_cast(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> (Tensor, Tensor)', 'quant.per_channel_cast',
    lambda x, fmt, num_per_tokens, round_sf: _per_channel_fake(x, x.shape[0], num_per_tokens))
_per_channel_cast_fused = _define(
    'per_channel_cast_fused(Tensor x, Tensor? x_sf, str fmt, int num_per_tokens, bool round_sf=False, int? num_per_channels=None, '
    'Tensor? pos_to_token=None) -> (Tensor, Tensor)', 'quant.per_channel_cast_fused',
    lambda x, x_sf, fmt, npt, round_sf, npc, pos_to_token: _per_channel_fake(x, x.shape[0] if pos_to_token is None else pos_to_token.shape[0], npt),
    lambda f, x, x_sf, *rest: f(_pair(x, x_sf), *rest))


def per_channel_cast_fused(x, fmt, num_per_tokens, round_sf=False, num_per_channels=None, pos_to_token=None):
    return _per_channel_cast_fused(*_split(x), fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token)


def _per_channel_transposed_fake(x, num_per_tokens, hidden, transpose):
    num_tokens = x.shape[0]
    out = x.new_empty((hidden, num_tokens) if transpose else (num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return out, x.new_empty((num_tokens // num_per_tokens, hidden), dtype=torch.float32)


per_channel_cast_and_transpose = _define(
    'per_channel_cast_and_transpose(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> (Tensor, Tensor)',
    'quant.per_channel_cast_and_transpose', lambda x, fmt, npt, round_sf: _per_channel_transposed_fake(x, npt, x.shape[1], True))


def _swiglu_forward_fake(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert, col_major, round_sf, packed, *rest):
    num_rows, hidden = x.shape[0], x.shape[1] // 2
    num_blocks = hidden // 128 if num_per_channels == 128 else 1
    return x.new_empty((num_rows, hidden), dtype=torch.float8_e4m3fn), _sf(num_rows, num_blocks, col_major, packed, x.device)


swiglu_forward_and_per_token_cast = _define(
    'swiglu_forward_and_per_token_cast(Tensor x, str fmt, int num_per_channels, Tensor? pos_to_token_topk=None, '
    f'Tensor? topk_weights=None, Tensor? pos_to_expert=None, {_CAST_FLAGS}, float? swiglu_clamp_value=None, '
    'Tensor(a!)? clamped_count=None, float? sf_clamp_min=None) -> (Tensor, Tensor)', 'quant.swiglu_forward_and_per_token_cast',
    _swiglu_forward_fake)
swiglu_forward_and_per_channel_cast_and_transpose = _define(
    'swiglu_forward_and_per_channel_cast_and_transpose(Tensor x, str fmt, int num_per_tokens, bool round_sf=False, '
    'bool without_transpose=False, float? swiglu_clamp_value=None) -> (Tensor, Tensor)',
    'quant.swiglu_forward_and_per_channel_cast_and_transpose',
    lambda x, fmt, npt, round_sf, without_transpose, clamp: _per_channel_transposed_fake(x, npt, x.shape[1] // 2, not without_transpose))


def _swiglu_backward_fake(x, x_sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels, round_sf, clamp):
    width = x.shape[-1]
    num_rows = x.shape[0] if x.dim() == 2 else x.shape[0] * x.shape[1]
    return (x.new_empty((num_rows, width // 2), dtype=torch.bfloat16), x.new_empty((num_rows, width), dtype=torch.float8_e4m3fn),
            x.new_empty((num_rows, width // num_per_channels), dtype=torch.float32), x.new_empty((num_rows, width), dtype=torch.bfloat16),
            weight.new_empty(token_topk_to_pos.shape, dtype=torch.float32))


def _swiglu_backward_eager(f, x, x_sf, *rest):
    out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad = f((x, x_sf), *rest)
    return out, x_grad_fp8, x_grad_sf, x_grad, weight_grad


_swiglu_backward_and_per_token_cast = _define(
    'swiglu_backward_and_per_token_cast(Tensor x, Tensor x_sf, Tensor grad_out, Tensor weight, Tensor pos_to_token_topk, '
    'Tensor token_topk_to_pos, int num_per_channels, bool round_sf=False, float? swiglu_clamp_value=None) '
    '-> (Tensor, Tensor, Tensor, Tensor, Tensor)', 'quant.swiglu_backward_and_per_token_cast', _swiglu_backward_fake,
    _swiglu_backward_eager)


def swiglu_backward_and_per_token_cast(x, grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels, round_sf=False,
                                       swiglu_clamp_value=None):
    out, x_grad_fp8, x_grad_sf, x_grad, weight_grad = _swiglu_backward_and_per_token_cast(
        x[0], x[1], grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels, round_sf, swiglu_clamp_value)
    return out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad


# -- transpose ------------------------------------------------------------------------------------------------------

transpose = _define('transpose(Tensor x) -> Tensor', 'transpose.transpose', lambda x: x.new_empty((x.shape[1], x.shape[0])))
batched_transpose = _define(
    'batched_transpose(Tensor x) -> Tensor', 'transpose.batched_transpose', lambda x: x.new_empty((x.shape[0], x.shape[2], x.shape[1])))


# -- mhc ------------------------------------------------------------------------------------------------------------

def _into(f, *args, out) -> None:
    f(*args, out=out)


def _streams_fake(t, tail: int, *shape, dtype=None):
    """A new contiguous tensor of t's token dims (all but its last ``tail``), then ``shape``."""
    return t.new_empty((*t.shape[:t.dim() - tail], *shape), dtype=dtype)


def _num_tokens(t, tail: int):
    return math.prod(t.shape[:t.dim() - tail])


_expand_to_mhc_fwd = _define(
    'expand_to_mhc_fwd(Tensor hidden, int mhc_mult) -> Tensor', 'mhc.expand_to_mhc_fwd',
    lambda hidden, mhc_mult: _streams_fake(hidden, 1, mhc_mult, hidden.shape[-1]))
_expand_to_mhc_fwd_out = _define(
    'expand_to_mhc_fwd_out(Tensor hidden, int mhc_mult, *, Tensor(a!) out) -> ()', 'mhc.expand_to_mhc_fwd',
    lambda hidden, mhc_mult, out: None, _into)


def expand_to_mhc_fwd(hidden, mhc_mult, out=None):
    if out is None:
        return _expand_to_mhc_fwd(hidden, mhc_mult)
    _expand_to_mhc_fwd_out(hidden, mhc_mult, out=out)
    return out


expand_to_mhc_bwd = _define(
    'expand_to_mhc_bwd(Tensor out_grad) -> Tensor', 'mhc.expand_to_mhc_bwd',
    lambda out_grad: _streams_fake(out_grad, 2, out_grad.shape[-1]))

_mhc_pre_apply_mix_fwd = _define(
    'mhc_pre_apply_mix_fwd(Tensor x, Tensor mix) -> Tensor', 'mhc.mhc_pre_apply_mix_fwd',
    lambda x, mix: _streams_fake(x, 2, x.shape[-1]))
_mhc_pre_apply_mix_fwd_out = _define(
    'mhc_pre_apply_mix_fwd_out(Tensor x, Tensor mix, *, Tensor(a!) out) -> ()', 'mhc.mhc_pre_apply_mix_fwd',
    lambda x, mix, out: None, _into)


def mhc_pre_apply_mix_fwd(x, mix, out=None):
    if out is None:
        return _mhc_pre_apply_mix_fwd(x, mix)
    _mhc_pre_apply_mix_fwd_out(x, mix, out=out)
    return out


mhc_pre_apply_mix_bwd = _define(
    'mhc_pre_apply_mix_bwd(Tensor o_grad, Tensor x, Tensor mix, Tensor(a!) x_grad) -> Tensor', 'mhc.mhc_pre_apply_mix_bwd',
    lambda o_grad, x, mix, x_grad: mix.new_empty(mix.shape))

_POST_ARGS = 'Tensor x, Tensor residual, Tensor post_layer_mix, Tensor comb_res_mix'
_mhc_post_fwd = _define(
    f'mhc_post_fwd({_POST_ARGS}) -> Tensor', 'mhc.mhc_post_fwd', lambda x, residual, post, comb: torch.empty_like(residual))
_mhc_post_fwd_out = _define(
    f'mhc_post_fwd_out({_POST_ARGS}, *, Tensor(a!) out) -> ()', 'mhc.mhc_post_fwd', lambda x, residual, post, comb, out: None, _into)


def mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out=None):
    if out is None:
        return _mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix)
    _mhc_post_fwd_out(x, residual, post_layer_mix, comb_res_mix, out=out)
    return out


_mhc_post_bwd = _define(
    f'mhc_post_bwd({_POST_ARGS}, Tensor d_o) -> (Tensor, Tensor, Tensor, Tensor)', 'mhc.mhc_post_bwd',
    lambda x, residual, post, comb, d_o: tuple(torch.empty_like(t) for t in (x, residual, post, comb)),
    lambda f, *args: f(*args, fuse_grad_acc=False))


def mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o, fuse_grad_acc=True):
    grads = _mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o)
    if fuse_grad_acc:
        residual.untyped_storage().grad_from_mhc_post = grads[1]
    return grads


mhc_multilayer_recompute = _define(
    'mhc_multilayer_recompute(Tensor initial_residual, Tensor[] pre_mix_list, Tensor[] layer_output_list, Tensor[] post_mix_list, '
    'Tensor[] comb_mix_list, Tensor(a!)[] layer_input_list, Tensor(b!)[] residual_list) -> ()', 'mhc.mhc_multilayer_recompute',
    lambda *args: None)

mhc_fn_normw_merge_fwd = _define(
    'mhc_fn_normw_merge_fwd(Tensor fn, Tensor normw) -> Tensor', 'mhc.mhc_fn_normw_merge_fwd', lambda fn, normw: torch.empty_like(fn))
mhc_fn_normw_merge_bwd = _define(
    'mhc_fn_normw_merge_bwd(Tensor fn, Tensor normw, Tensor out_fn_grad, Tensor(a!) fn_grad, Tensor(b!) normw_grad) -> ()',
    'mhc.mhc_fn_normw_merge_bwd', lambda *args: None)


def _mix_count(mhc):
    return mhc * (mhc + 2)


def _pre_norm_fn_fwd_fake(residual, fn, norm_eps, n_splits):
    mhc3, num_tokens = _mix_count(residual.shape[-2]), _num_tokens(residual, 2)
    new = residual.new_empty
    return (_streams_fake(residual, 2, mhc3, dtype=torch.float32), new(fn.shape, dtype=torch.float32),
            new((num_tokens, mhc3), dtype=torch.float32), new((num_tokens,), dtype=torch.float32))


mhc_pre_norm_fn_fwd = _define(
    'mhc_pre_norm_fn_fwd(Tensor residual, Tensor fn, float norm_eps, int n_splits=16) -> (Tensor, Tensor, Tensor, Tensor)',
    'mhc.mhc_pre_norm_fn_fwd', _pre_norm_fn_fwd_fake)
mhc_pre_norm_fn_gemm = _define(
    'mhc_pre_norm_fn_gemm(Tensor residual_flat, Tensor fn_tf32, int n_splits) -> (Tensor, Tensor)', 'mhc.mhc_pre_norm_fn_gemm',
    lambda x, fn_tf32, n_splits: (x.new_empty((n_splits, x.shape[0], fn_tf32.shape[0]), dtype=torch.float32),
                                  x.new_empty((n_splits, x.shape[0]), dtype=torch.float32)))
mhc_pre_norm_fn_bwd = _define(
    'mhc_pre_norm_fn_bwd(Tensor out_grad, Tensor residual, Tensor fn_tf32, Tensor out_mul, Tensor sqrsum, float norm_eps, '
    'Tensor(a!) x_grad) -> Tensor', 'mhc.mhc_pre_norm_fn_bwd', lambda out_grad, residual, fn_tf32, *rest: torch.empty_like(fn_tf32))


def _split_mixes_fake(mixes, scale, base, mhc_mult, *floats):
    return (_streams_fake(mixes, 1, mhc_mult, 1), _streams_fake(mixes, 1, mhc_mult, 1), _streams_fake(mixes, 1, mhc_mult, mhc_mult))


mhc_pre_split_mixes_fwd = _define(
    'mhc_pre_split_mixes_fwd(Tensor mixes, Tensor scale, Tensor base, int mhc_mult, float post_mult_value, float pre_eps) '
    '-> (Tensor, Tensor, Tensor)', 'mhc.mhc_pre_split_mixes_fwd', _split_mixes_fake)
mhc_pre_split_mixes_bwd = _define(
    'mhc_pre_split_mixes_bwd(Tensor pre_grad, Tensor post_grad, Tensor comb_grad, Tensor mixes, Tensor post_mix, Tensor scale, '
    'Tensor base, int mhc_mult, float post_mult_value) -> (Tensor, Tensor, Tensor)', 'mhc.mhc_pre_split_mixes_bwd',
    lambda pre_grad, post_grad, comb_grad, mixes, post_mix, scale, base, mhc_mult, post_mult_value: (
        torch.empty_like(mixes), scale.new_empty((3,)), base.new_empty((_mix_count(mhc_mult),))))

mhc_sinkhorn_fwd = _define(
    'mhc_sinkhorn_fwd(Tensor x, int repeat, float eps) -> Tensor', 'mhc.mhc_sinkhorn_fwd', lambda x, repeat, eps: torch.empty_like(x))
mhc_sinkhorn_bwd = _define(
    'mhc_sinkhorn_bwd(Tensor grad_out, Tensor x, int repeat, float eps) -> Tensor', 'mhc.mhc_sinkhorn_bwd',
    lambda grad_out, x, repeat, eps: torch.empty_like(x))

mhc_head_compute_mix_fwd = _define(
    'mhc_head_compute_mix_fwd(Tensor input_mix, Tensor scale, Tensor base, float pre_eps) -> Tensor', 'mhc.mhc_head_compute_mix_fwd',
    lambda input_mix, scale, base, pre_eps: torch.empty_like(input_mix))
mhc_head_compute_mix_bwd = _define(
    'mhc_head_compute_mix_bwd(Tensor grad, Tensor input_mix, Tensor scale, Tensor base) -> (Tensor, Tensor, Tensor)',
    'mhc.mhc_head_compute_mix_bwd',
    lambda grad, input_mix, scale, base: (torch.empty_like(input_mix), scale.new_empty((1,)), base.new_empty((input_mix.shape[-1],))))


def _pre_big_fuse_fake(residual, *rest):
    mhc, hidden = residual.shape[-2:]
    return (_streams_fake(residual, 2, mhc, 1, dtype=torch.float32), _streams_fake(residual, 2, mhc, mhc, dtype=torch.float32),
            _streams_fake(residual, 2, hidden))


mhc_pre_big_fuse = _define(
    'mhc_pre_big_fuse(Tensor residual, Tensor fn, Tensor mhc_scale, Tensor mhc_base, float rms_eps, float mhc_pre_eps, '
    'float mhc_sinkhorn_eps, float mhc_post_mult_value, int sinkhorn_repeat, int n_splits=16) -> (Tensor, Tensor, Tensor)',
    'mhc.mhc_pre_big_fuse', _pre_big_fuse_fake)


# -- engram ---------------------------------------------------------------------------------------------------------

engram_hash = _define(
    'engram_hash(Tensor ngram_token_ids, Tensor multipliers, Tensor vocab_sizes, Tensor offsets) -> Tensor', 'engram.engram_hash',
    lambda ids, multipliers, vocab_sizes, offsets: ids.new_empty(
        (vocab_sizes.shape[0], ids.shape[0], vocab_sizes.shape[1] * vocab_sizes.shape[2])))
fused_weight = _define(
    'fused_weight(Tensor weight_hidden, Tensor weight_embed) -> Tensor', 'engram.fused_weight',
    lambda weight_hidden, weight_embed: weight_hidden.new_empty(weight_hidden.shape, dtype=torch.float32))


def _gate_fwd_fake(x, k, v, weight_fused, eps, clamp_value, save_for_backward):
    saved = [x.new_empty((x.shape[0], x.shape[1]), dtype=torch.float32) for _ in range(4)] if save_for_backward else []
    return torch.empty_like(x, memory_format=torch.contiguous_format), saved


_engram_gate_fwd = _define(
    'engram_gate_fwd(Tensor hidden_states, Tensor k, Tensor v, Tensor weight_fused, float eps, float clamp_value, '
    'bool save_for_backward=True) -> (Tensor, Tensor[])', 'engram.engram_gate_fwd', _gate_fwd_fake,
    lambda f, *args: (lambda out, *saved: (out, [s for s in saved if s is not None]))(*f(*args)))


def engram_gate_fwd(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward=True):
    out, saved = _engram_gate_fwd(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward)
    return (out, *saved) if save_for_backward else (out, None, None, None, None)


def _gate_bwd_fake(grad_out, x, k, v, weight_fused, *saved_and_clamp):
    num_tokens, hc, hidden = x.shape
    # The chunk count comes from the binary's manifest constants, which a fake (no device) cannot read.
    num_partials = torch.library.get_ctx().new_dynamic_size()
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape), x.new_empty((num_tokens, hidden)),
            x.new_empty((num_partials, hc, hidden), dtype=torch.float32))


engram_gate_bwd = _define(
    'engram_gate_bwd(Tensor grad_out, Tensor hidden_states, Tensor k, Tensor v, Tensor weight_fused, Tensor dot, Tensor gate_score, '
    'Tensor rstd_x, Tensor rstd_k, float clamp_value) -> (Tensor, Tensor, Tensor, Tensor)', 'engram.engram_gate_bwd', _gate_bwd_fake)
grad_w_reduce = _define(
    'grad_w_reduce(Tensor grad_w_partial, Tensor weight_hidden, Tensor weight_embed, Tensor(a!) grad_weight_hidden, '
    'Tensor(b!) grad_weight_embed) -> ()', 'engram.grad_w_reduce', lambda *args: None)
