"""engram ops (upstream TileKernels v1 names and signatures): n-gram hashing and the Engram gate.

The gate, for token t and stream h of x, k (T, 4, H) and v (T, H)::

    rstd_x = rsqrt(mean(x^2) + eps)            rstd_k = rsqrt(mean(k^2) + eps)
    dot = sum(x * wf * k)                       (wf = weight_hidden * weight_embed, fused_weight)
    s = dot * rstd_x * rstd_k / sqrt(H)         gate = sigmoid(sign(s) * sqrt(max(|s|, clamp_value)))
    out = bf16(x + gate * v)

engram_gate_bwd returns the weight gradient as partials, one per chunk of consecutive tokens (the chunk size
follows from the token count alone), and grad_w_reduce sums them in an order fixed by their count: the
gradients do not depend on set_num_sms, bitwise. Every kernel takes the token count, eps, clamp_value and the row strides of
k and v at run time; the gate kernels are built per hidden size H (kernel_src/models.py), with 4 streams.
"""

from __future__ import annotations


import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _index_checks, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.config import get_num_sms

HC = 4  # streams (hc_mult) the kernels are built for
VEC_BYTES = 16  # the gate kernels read and write every row in 16-byte vectors


def _rows(op: str, name: str, t: torch.Tensor) -> None:
    """k and v: contiguous rows of H elements at strides (in elements) that keep every row 16-byte aligned."""
    _checks.inner_contiguous(op, name, t)
    vec = VEC_BYTES // t.element_size()
    outer = [s for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1]
    if t.numel() and (t.data_ptr() % VEC_BYTES or any(s % vec for s in outer)):
        raise ValueError(f'{op}: {name} must have a 16-byte aligned data pointer and row strides that are multiples of {vec} '
                         f'elements, got pointer {t.data_ptr():#x}, strides {t.stride()}')


def _strides(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """t with the strides of its size-1 dims set to 0: a stride never stepped over may be any value (the kernel
    takes it as a 32-bit argument)."""
    return t.as_strided(t.shape, tuple(0 if n == 1 else s for s, n in zip(t.stride(), t.shape)))


def _hc(op: str, name: str, t: torch.Tensor, dim: int) -> None:
    if t.shape[dim] != HC:
        raise ValueError(f'{op}: {name} must have {HC} streams (hc_mult) in dimension {dim}, got shape {tuple(t.shape)}')


def _grid(kernel, rows: int, device: int) -> int:
    return max(1, min(rows, get_num_sms(device) * kernel.entry.constants['ctas_per_sm']))


@_plans.launch_plan
def engram_hash(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """Embedding-table indices of each token's n-grams.

    For layer l with ids id_0 .. id_{N-1} of a token: h_0 = id_0 * m[l, 0], h_n = h_{n-1} XOR (id_n * m[l, n]) in
    wrapping int64 arithmetic; for n >= 1 and table j: out[l, t, (n-1) * M + j] = (h_n mod vocab_sizes[l, n-1, j])
    + offsets[l, (n-1) * M + j], the modulus floored and the int32 sum wrapping as in torch. Every int32 id and
    int64 multiplier is in range; vocab_sizes must be positive: a size below 1 fails a device-side assert
    (TILE_KERNELS_AOT_CHECK_INDICES=1 raises ValueError before it instead).

    Args:
        ngram_token_ids: ``[T, N]`` int32 CUDA tensor, contiguous in N (the row stride is free).
        multipliers: ``[L, N]`` int64, contiguous.
        vocab_sizes: ``[L, N - 1, M]`` int32, contiguous.
        offsets: ``[L, (N - 1) * M]`` int32, contiguous (make_offsets gives the usual exclusive prefix sums).

    Returns:
        ``[L, T, (N - 1) * M]`` int32 indices.
    """
    if is_compiling():
        return _custom_ops.engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets)
    op = 'engram_hash'
    _checks.tensor(op, 'ngram_token_ids', ngram_token_ids, ndim=2, dtypes=(torch.int32,))
    _checks.tensor(op, 'multipliers', multipliers, ndim=2, dtypes=(torch.int64,))
    _checks.tensor(op, 'vocab_sizes', vocab_sizes, ndim=3, dtypes=(torch.int32,))
    _checks.tensor(op, 'offsets', offsets, ndim=2, dtypes=(torch.int32,))
    num_tokens, max_ngram_size = ngram_token_ids.shape
    num_layers, _, tables = vocab_sizes.shape
    _checks.integer(op, 'max_ngram_size (ngram_token_ids.shape[1])', max_ngram_size, low=2)
    _checks.integer(op, 'num_ngram_layers (vocab_sizes.shape[0])', num_layers, low=1, high=65535)
    _checks.integer(op, 'num_embed_table_per_ngram (vocab_sizes.shape[2])', tables, low=1)
    _checks.shape(op, 'multipliers', multipliers, (num_layers, max_ngram_size))
    _checks.shape(op, 'vocab_sizes', vocab_sizes, (num_layers, max_ngram_size - 1, tables))
    _checks.shape(op, 'offsets', offsets, (num_layers, (max_ngram_size - 1) * tables))
    _checks.inner_contiguous(op, 'ngram_token_ids', ngram_token_ids)
    for name, t in (('multipliers', multipliers), ('vocab_sizes', vocab_sizes), ('offsets', offsets)):
        _checks.contiguous(op, name, t)
    device = _checks.on_one_cuda_device(op, ngram_token_ids=ngram_token_ids, multipliers=multipliers, vocab_sizes=vocab_sizes,
                                        offsets=offsets)
    if _index_checks.enabled:
        _index_checks.within(op, 'vocab_sizes', vocab_sizes, 1, None, what='table sizes are positive')
    kernel = find_kernel('engram.engram_hash', {'max_ngram_size': max_ngram_size, 'tables_per_ngram': tables}, device)
    output = ngram_token_ids.new_empty((num_layers, num_tokens, (max_ngram_size - 1) * tables))
    if num_tokens == 0:
        return output
    kernel(device, {'ngram_token_ids': _strides(ngram_token_ids), 'multipliers': multipliers, 'vocab_sizes': vocab_sizes,
                    'offsets': offsets, 'output': output})
    return output


@_plans.launch_plan
def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """weight_hidden * weight_embed in fp32 (exact: a product of two bf16 values fits).

    Args:
        weight_hidden, weight_embed: ``[4, H]`` bf16 CUDA tensors, contiguous, 16-byte aligned; ``4 * H`` a multiple
            of the kernel's elements_per_thread (8).

    Returns:
        ``[4, H]`` float32.
    """
    if is_compiling():
        return _custom_ops.fused_weight(weight_hidden, weight_embed)
    op = 'fused_weight'
    _weights(op, weight_hidden, weight_embed)
    device = _checks.on_one_cuda_device(op, weight_hidden=weight_hidden, weight_embed=weight_embed)
    kernel = find_kernel('engram.fused_weight', {'hc': HC}, device)
    _multiple(op, weight_hidden, kernel.entry.constants['elements_per_thread'])
    weight_fused = weight_hidden.new_empty(weight_hidden.shape, dtype=torch.float32)
    if weight_fused.numel() == 0:
        return weight_fused
    kernel(device, {'weight_hidden': weight_hidden.view(-1), 'weight_embed': weight_embed.view(-1), 'weight_fused': weight_fused.view(-1)})
    return weight_fused


def _weights(op: str, weight_hidden: torch.Tensor, weight_embed: torch.Tensor, alignment: int = 16) -> int:
    _checks.tensor(op, 'weight_hidden', weight_hidden, ndim=2, dtypes=(torch.bfloat16,))
    _checks.tensor(op, 'weight_embed', weight_embed, ndim=2, dtypes=(torch.bfloat16,))
    _hc(op, 'weight_hidden', weight_hidden, 0)
    _checks.shape(op, 'weight_embed', weight_embed, tuple(weight_hidden.shape))
    _checks.contiguous(op, 'weight_hidden', weight_hidden, alignment)
    _checks.contiguous(op, 'weight_embed', weight_embed, alignment)
    return weight_hidden.shape[1]


def _multiple(op: str, weight: torch.Tensor, per_thread: int) -> None:
    if weight.numel() % per_thread:
        raise ValueError(f'{op}: the weights must have a multiple of {per_thread} elements, got shape {tuple(weight.shape)}')


def _gate_inputs(op: str, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor | None) -> tuple[int, int]:
    """(tokens, hidden) of the gate's operands; weight_fused None: not made yet (engram_gate checks before fused_weight)."""
    _checks.tensor(op, 'hidden_states', x, ndim=3, dtypes=(torch.bfloat16,))
    _checks.tensor(op, 'k', k, ndim=3, dtypes=(torch.bfloat16,))
    _checks.tensor(op, 'v', v, ndim=2, dtypes=(torch.bfloat16,))
    if weight_fused is not None:
        _checks.tensor(op, 'weight_fused', weight_fused, ndim=2, dtypes=(torch.float32,))
    num_tokens, _, hidden = x.shape
    _hc(op, 'hidden_states', x, 1)
    _checks.shape(op, 'k', k, tuple(x.shape))
    _checks.shape(op, 'v', v, (num_tokens, hidden))
    _checks.contiguous(op, 'hidden_states', x, VEC_BYTES)
    _rows(op, 'k', k)
    _rows(op, 'v', v)
    if weight_fused is not None:
        _checks.shape(op, 'weight_fused', weight_fused, (HC, hidden))
        _checks.contiguous(op, 'weight_fused', weight_fused, VEC_BYTES)
    return num_tokens, hidden


def _check_gate_fwd(op: str, hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor | None,
                   eps: float, clamp_value: float, save_for_backward: bool, **weights: torch.Tensor) -> tuple:
    """engram_gate_fwd's checks and binary: (tokens, hidden, eps, clamp_value, device, kernel). EngramGateFn runs them
    before fused_weight, with weight_fused None and the weights it is made of (of shape [4, H]) as keywords, so that a
    bad call launches nothing."""
    num_tokens, hidden = _gate_inputs(op, hidden_states, k, v, weight_fused)
    for name, t in weights.items():
        _checks.tensor(op, name, t, ndim=2, dtypes=(torch.bfloat16,))
        _checks.shape(op, name, t, (HC, hidden))
    eps = _checks.real(op, 'eps', eps, low=0)
    clamp_value = _checks.real(op, 'clamp_value', clamp_value, low=0)
    if not isinstance(save_for_backward, bool):
        raise TypeError(f'{op}: save_for_backward must be a bool, got {type(save_for_backward).__name__}')
    on_device = {'hidden_states': hidden_states, 'k': k, 'v': v, **weights}
    if weight_fused is not None:
        on_device['weight_fused'] = weight_fused
    device = _checks.on_one_cuda_device(op, **on_device)
    kernel = find_kernel('engram.engram_gate_fwd', {'hidden': hidden, 'save': save_for_backward}, device)
    return num_tokens, hidden, eps, clamp_value, device, kernel


def _saved(op: str, num_tokens: int, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _checks.tensor(op, name, t, ndim=2, dtypes=(torch.float32,))
        _checks.shape(op, name, t, (num_tokens, HC))
        _checks.contiguous(op, name, t, 4)


@_plans.launch_plan
def engram_gate_fwd(
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Engram gate forward (formulas in the module docstring).

    Args:
        hidden_states: ``[T, 4, H]`` bf16 CUDA tensor, contiguous, 16-byte aligned.
        k: ``[T, 4, H]`` bf16, contiguous in H; token and stream strides multiples of 8 elements (16 bytes), any
            values otherwise.
        v: ``[T, H]`` bf16, contiguous in H; token stride a multiple of 8 elements.
        weight_fused: ``[4, H]`` float32 (fused_weight), contiguous.
        eps: RMSNorm epsilon (finite, >= 0).
        clamp_value: floor of ``|s|`` before the square root (finite, >= 0).
        save_for_backward: also return dot (raw sum(x * wf * k)), gate, rstd_x and rstd_k.

    Returns:
        ``(out, dot, gate, rstd_x, rstd_k)``: out ``[T, 4, H]`` bf16; the others ``[T, 4]`` float32, or None
        without save_for_backward.
    """
    if is_compiling():
        return _custom_ops.engram_gate_fwd(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward)
    num_tokens, _, eps, clamp_value, device, kernel = _check_gate_fwd('engram_gate_fwd', hidden_states, k, v, weight_fused, eps,
                                                                 clamp_value, save_for_backward)
    out = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
    saved = [hidden_states.new_empty((num_tokens, HC), dtype=torch.float32) for _ in range(4)] if save_for_backward else [None] * 4
    if num_tokens == 0:
        return (out, *saved)
    tensors = {'x': hidden_states, 'k': _strides(k), 'v': _strides(v), 'weight_fused': weight_fused, 'out': out}
    if save_for_backward:
        tensors.update(zip(('dot', 'gate', 'rstd_x', 'rstd_k'), saved))
    kernel(device, tensors, {'eps': eps, 'clamp_value': clamp_value, 'num_blocks': _grid(kernel, num_tokens * HC, device)})
    return (out, *saved)


@_plans.launch_plan
def engram_gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    clamp_value: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Engram gate backward.

    Args:
        grad_out: ``[T, 4, H]`` bf16, contiguous, 16-byte aligned.
        hidden_states, k, v, weight_fused: the forward's inputs (constraints as engram_gate_fwd).
        dot, gate_score, rstd_x, rstd_k: ``[T, 4]`` float32, contiguous: what engram_gate_fwd saved.
        clamp_value: the forward's clamp_value.

    Returns:
        ``(grad_x, grad_k, grad_v, grad_w_partial)``: grad_x and grad_k ``[T, 4, H]`` bf16 (contiguous), grad_v
        ``[T, H]`` bf16, grad_w_partial ``[P, 4, H]`` float32, the fused-weight gradient of P chunks of consecutive
        tokens (P depends on T only), for grad_w_reduce.
    """
    if is_compiling():
        return _custom_ops.engram_gate_bwd(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value)
    op = 'engram_gate_bwd'
    num_tokens, hidden = _gate_inputs(op, hidden_states, k, v, weight_fused)
    _checks.tensor(op, 'grad_out', grad_out, ndim=3, dtypes=(torch.bfloat16,))
    _checks.shape(op, 'grad_out', grad_out, tuple(hidden_states.shape))
    _checks.contiguous(op, 'grad_out', grad_out, VEC_BYTES)
    _saved(op, num_tokens, dot=dot, gate_score=gate_score, rstd_x=rstd_x, rstd_k=rstd_k)
    clamp_value = _checks.real(op, 'clamp_value', clamp_value, low=0)
    device = _checks.on_one_cuda_device(op, grad_out=grad_out, hidden_states=hidden_states, k=k, v=v, weight_fused=weight_fused,
                                        dot=dot, gate_score=gate_score, rstd_x=rstd_x, rstd_k=rstd_k)
    kernel = find_kernel('engram.engram_gate_bwd', {'hidden': hidden}, device)
    constants = kernel.entry.constants
    tokens_per_partial = partial_tokens(num_tokens, constants['min_partials'], constants['max_tokens_per_partial'])
    num_partials = -(-num_tokens // tokens_per_partial)
    grad_x = torch.empty_like(hidden_states, memory_format=torch.contiguous_format)
    grad_k = torch.empty(hidden_states.shape, dtype=torch.bfloat16, device=hidden_states.device)
    grad_v = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=hidden_states.device)
    grad_w_partial = torch.empty((num_partials, HC, hidden), dtype=torch.float32, device=hidden_states.device)
    if num_tokens == 0:
        return grad_x, grad_k, grad_v, grad_w_partial
    tensors = {'grad_out': grad_out, 'x': hidden_states, 'k': _strides(k), 'v': _strides(v), 'weight_fused': weight_fused,
               'dot': dot, 'gate': gate_score, 'rstd_x': rstd_x, 'rstd_k': rstd_k,
               'grad_x': grad_x, 'grad_k': grad_k, 'grad_v': grad_v, 'grad_w_partial': grad_w_partial}
    scalars = {'clamp_value': clamp_value, 'tokens_per_partial': tokens_per_partial, 'num_blocks': _grid(kernel, num_partials * HC, device)}
    kernel(device, tensors, scalars)
    return grad_x, grad_k, grad_v, grad_w_partial


def partial_tokens(num_tokens: int, min_partials: int, max_tokens_per_partial: int) -> int:
    """Tokens per weight-gradient partial: enough chunks for the grid at small T, at most max_tokens_per_partial
    tokens each; a function of the token count alone, so the partials never depend on the SM count."""
    return max(1, min(max_tokens_per_partial, -(-num_tokens // min_partials)))


@_plans.launch_plan
def grad_w_reduce(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> None:
    """Sum the partials (in an order that depends on P alone: kernel_src/engram/grad_w_reduce.py) into gw and
    accumulate in place: grad_weight_hidden += gw * weight_embed,
    grad_weight_embed += gw * weight_hidden.

    Args:
        grad_w_partial: ``[P, 4, H]`` float32, contiguous, 16-byte aligned (P >= 0).
        weight_hidden, weight_embed: ``[4, H]`` bf16, contiguous, 8-byte aligned.
        grad_weight_hidden, grad_weight_embed: ``[4, H]`` float32, contiguous, 16-byte aligned; updated in place.
    """
    if is_compiling():
        return _custom_ops.grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    op = 'grad_w_reduce'
    _checks.tensor(op, 'grad_w_partial', grad_w_partial, ndim=3, dtypes=(torch.float32,))
    hidden = _weights(op, weight_hidden, weight_embed, alignment=8)
    _checks.shape(op, 'grad_w_partial', grad_w_partial, (grad_w_partial.shape[0], HC, hidden))
    _checks.contiguous(op, 'grad_w_partial', grad_w_partial, 16)
    for name, t in (('grad_weight_hidden', grad_weight_hidden), ('grad_weight_embed', grad_weight_embed)):
        _checks.tensor(op, name, t, ndim=2, dtypes=(torch.float32,))
        _checks.shape(op, name, t, (HC, hidden))
        _checks.contiguous(op, name, t, 16)
    device = _checks.on_one_cuda_device(op, grad_w_partial=grad_w_partial, weight_hidden=weight_hidden, weight_embed=weight_embed,
                                        grad_weight_hidden=grad_weight_hidden, grad_weight_embed=grad_weight_embed)
    kernel = find_kernel('engram.grad_w_reduce', {'hc': HC}, device)
    _multiple(op, weight_hidden, kernel.entry.constants['columns_per_thread'])
    if grad_w_partial.shape[0] == 0 or hidden == 0:
        return
    kernel(device, {'grad_w_partial': grad_w_partial.view(grad_w_partial.shape[0], -1), 'weight_hidden': weight_hidden.view(-1),
                    'weight_embed': weight_embed.view(-1), 'grad_weight_hidden': grad_weight_hidden.view(-1),
                    'grad_weight_embed': grad_weight_embed.view(-1)})
