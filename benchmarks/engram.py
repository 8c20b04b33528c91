"""Benchmark cases of the Engram kernels: RUN_CASES for benchmarks.run (spec, tokens) and UPSTREAM_CASES for
benchmarks.upstream (tk, tokens), on the same inputs (upstream's test draws: randn data, eps 1e-20, clamp 1e-6).

engram_gate_fwd's target is 90% of the copy bandwidth (issue 38); upstream's cases run at H = 7168 and 4096, the
sizes its kernels are tuned for. The fused weight and grad_w_reduce kernels are not specialised on H: they run at
H = 7168.
"""

from __future__ import annotations

import torch

from benchmarks.common import calc_diff, nbytes

HC = 4
EPS, CLAMP = 1e-20, 1e-6
HIDDEN = 7168
UPSTREAM_HIDDEN = (7168, 4096)


def _gate_inputs(tokens, hidden):
    x = torch.randn(tokens, HC, hidden, dtype=torch.bfloat16, device='cuda')
    k = torch.randn(tokens, HC, hidden, dtype=torch.bfloat16, device='cuda')
    v = torch.randn(tokens, hidden, dtype=torch.bfloat16, device='cuda')
    wh = torch.randn(HC, hidden, dtype=torch.bfloat16, device='cuda')
    we = torch.randn(HC, hidden, dtype=torch.bfloat16, device='cuda')
    return x, k, v, wh, we


def _hash_inputs(tokens, n=3, layers=2, m=8):
    from tile_kernels_aot.reference.engram import make_offsets

    ids = torch.randint(0, 100_000, (tokens, n), dtype=torch.int32, device='cuda')
    multipliers = torch.randint(0, 100_000, (layers, n), dtype=torch.int64, device='cuda')
    vocab = torch.randint(100_000, 1_000_000, (layers, n - 1, m), dtype=torch.int32, device='cuda')
    return ids, multipliers, vocab, make_offsets(vocab)


def _saved(x, k, v, wh, we, ops):
    weight_fused = ops.fused_weight(wh, we)
    _, *saved = ops.engram_gate_fwd(x, k, v, weight_fused, EPS, CLAMP, save_for_backward=True)
    return weight_fused, saved


# -- benchmarks.run: spec -> (label, fn, bytes moved) ---------------------------------------------------------------


def hash_case(spec, tokens):
    from tile_kernels_aot.engram import engram_hash

    inputs = _hash_inputs(tokens, spec['max_ngram_size'], 2, spec['tables_per_ngram'])
    fn = lambda: engram_hash(*inputs)
    return f'T={tokens}, L=2', fn, nbytes(*inputs, fn())


def fused_weight_case(spec, tokens):
    from tile_kernels_aot.engram import fused_weight

    _, _, _, wh, we = _gate_inputs(0, HIDDEN)
    fn = lambda: fused_weight(wh, we)
    return f'H={HIDDEN}', fn, nbytes(wh, we, fn())


def gate_fwd_case(spec, tokens):
    from tile_kernels_aot import engram

    hidden, save = spec['hidden'], spec['save']
    x, k, v, wh, we = _gate_inputs(tokens, hidden)
    weight_fused = engram.fused_weight(wh, we)
    fn = lambda: engram.engram_gate_fwd(x, k, v, weight_fused, EPS, CLAMP, save_for_backward=save)
    return f'T={tokens}, H={hidden}', fn, nbytes(x, k, v, weight_fused, *fn())


def gate_bwd_case(spec, tokens):
    from tile_kernels_aot import engram

    hidden = spec['hidden']
    x, k, v, wh, we = _gate_inputs(tokens, hidden)
    weight_fused, saved = _saved(x, k, v, wh, we, engram)
    grad_out = torch.randn_like(x)
    fn = lambda: engram.engram_gate_bwd(grad_out, x, k, v, weight_fused, *saved, CLAMP)
    return f'T={tokens}, H={hidden}', fn, nbytes(grad_out, x, k, v, weight_fused, *saved, *fn())


def grad_w_reduce_case(spec, tokens):
    """The partials engram_gate_bwd leaves at this token count, at H = 7168."""
    from tile_kernels_aot import engram
    from tile_kernels_aot._select import kernel_constant

    per_partial = engram.partial_tokens(tokens, kernel_constant('engram.engram_gate_bwd', 'min_partials', 0),
                                        kernel_constant('engram.engram_gate_bwd', 'max_tokens_per_partial', 0))
    partial = torch.randn(-(-tokens // per_partial), HC, HIDDEN, device='cuda')
    _, _, _, wh, we = _gate_inputs(0, HIDDEN)
    grads = torch.zeros(HC, HIDDEN, device='cuda'), torch.zeros(HC, HIDDEN, device='cuda')
    fn = lambda: engram.grad_w_reduce(partial, wh, we, *grads)
    return f'T={tokens}, P={partial.shape[0]}, H={HIDDEN}', fn, nbytes(partial, wh, we, *grads, *grads)


RUN_CASES = {
    'engram.engram_hash': hash_case,
    'engram.fused_weight': fused_weight_case,
    'engram.engram_gate_fwd': gate_fwd_case,
    'engram.engram_gate_bwd': gate_bwd_case,
    'engram.grad_w_reduce': grad_w_reduce_case,
}


# -- benchmarks.upstream: tk -> (label, ours, theirs, compare, bytes moved), or a list of them ------------------------


def _bitwise(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def upstream_hash_case(tk, tokens):
    import tile_kernels_aot as ours

    inputs = _hash_inputs(tokens)
    return 'N=3 L=2 M=8', lambda: ours.engram.engram_hash(*inputs), lambda: tk.engram.engram_hash(*inputs), _bitwise, \
        nbytes(*inputs) + 2 * tokens * 16 * 4


def upstream_fused_weight_case(tk, tokens):
    import tile_kernels_aot as ours

    _, _, _, wh, we = _gate_inputs(0, HIDDEN)
    return f'H={HIDDEN}', lambda: ours.engram.fused_weight(wh, we), lambda: tk.engram.fused_weight(wh, we), _bitwise, \
        nbytes(wh, we) * 3


def upstream_gate_fwd_case(tk, tokens):
    import tile_kernels_aot as ours

    def compare(a, b):  # upstream's test: calc_diff < 2e-10 for every output
        return all(calc_diff(x, y) < 2e-10 for x, y in zip(a, b) if x is not None)

    cases = []
    for hidden in UPSTREAM_HIDDEN:
        x, k, v, wh, we = _gate_inputs(tokens, hidden)
        weight_fused = ours.engram.fused_weight(wh, we)
        for save in (True, False):
            args = (x, k, v, weight_fused, EPS, CLAMP, save)
            mine = lambda args=args: ours.engram.engram_gate_fwd(*args)
            theirs = lambda args=args: tk.engram.engram_gate_fwd(*args)
            cases.append((f'H={hidden}, save={save}', mine, theirs, compare, nbytes(x, k, v, weight_fused, *mine())))
    return cases


def upstream_gate_bwd_case(tk, tokens):
    """grad_x, grad_k and grad_v agree as upstream's test asks (calc_diff < 1e-8), and so does the sum of each side's
    weight partials (ours: one per token chunk; upstream's: one per SM)."""
    import tile_kernels_aot as ours

    def compare(a, b):
        return all(calc_diff(x, y) < 1e-8 for x, y in zip(a[:3], b[:3])) and calc_diff(a[3].sum(0), b[3].sum(0)) < 1e-10

    cases = []
    for hidden in UPSTREAM_HIDDEN:
        x, k, v, wh, we = _gate_inputs(tokens, hidden)
        weight_fused, saved = _saved(x, k, v, wh, we, ours.engram)
        grad_out = torch.randn_like(x)
        args = (grad_out, x, k, v, weight_fused, *saved, CLAMP)
        mine = lambda args=args: ours.engram.engram_gate_bwd(*args)
        theirs = lambda args=args: tk.engram.engram_gate_bwd(*args)
        cases.append((f'H={hidden}', mine, theirs, compare, nbytes(grad_out, x, k, v, weight_fused, *saved, *mine())))
    return cases


def upstream_grad_w_reduce_case(tk, tokens):
    """132 partials (an H200's SM count, upstream's partial count there) at H = 7168; each side accumulates into its
    own gradients, which start equal, so their first calls compare."""
    import tile_kernels_aot as ours

    partial = torch.randn(132, HC, HIDDEN, device='cuda')
    _, _, _, wh, we = _gate_inputs(0, HIDDEN)
    mine_grads = torch.randn(HC, HIDDEN, device='cuda'), torch.randn(HC, HIDDEN, device='cuda')
    their_grads = tuple(g.clone() for g in mine_grads)

    def mine():
        ours.engram.grad_w_reduce(partial, wh, we, *mine_grads)
        return mine_grads

    def theirs():
        tk.engram.grad_w_reduce(partial, wh, we, *their_grads)
        return their_grads

    compare = lambda a, b: all(calc_diff(x, y) < 1e-10 for x, y in zip(a, b))
    return f'P=132, H={HIDDEN}', mine, theirs, compare, nbytes(partial, wh, we) + 2 * nbytes(*mine_grads)


UPSTREAM_CASES = {
    'engram.engram_hash': upstream_hash_case,
    'engram.fused_weight': upstream_fused_weight_case,
    'engram.engram_gate_fwd': upstream_gate_fwd_case,
    'engram.engram_gate_bwd': upstream_gate_bwd_case,
    'engram.grad_w_reduce': upstream_grad_w_reduce_case,
}
