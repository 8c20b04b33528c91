"""Benchmark cases of the mHC mixing kernels (split_mixes, sinkhorn, head_compute_mix, pre_big_fuse): RUN_CASES for
benchmarks.run (spec, tokens) and UPSTREAM_CASES for benchmarks.upstream (tk, tokens), on the same inputs.

Sinkhorn runs at repeat 20 (DeepSeek-V4) and 10 (upstream's default); the (8192, 4, 4) forward is a target of
issue 37. The mixes are drawn as a norm would give them (unit scale), the scales as upstream's tests draw them.
"""

from __future__ import annotations

import torch

from benchmarks.common import nbytes

REPEATS = (20, 10)
EPS = 1e-6
POST_MULT = 2.0
HIDDEN_FOR_BIG_FUSE = 7168


def _split_inputs(mhc, tokens):
    mhc3 = mhc * (mhc + 2)
    mixes = torch.randn(tokens, mhc3, device='cuda')
    scale = torch.randn(3, device='cuda') * 0.1 + 1
    base = torch.randn(mhc3, device='cuda') * 0.1
    return mixes, scale, base


def _split_grads(mhc, tokens):
    return (torch.randn(tokens, mhc, 1, device='cuda'), torch.randn(tokens, mhc, 1, device='cuda'),
            torch.randn(tokens, mhc, mhc, device='cuda'))


def _head_inputs(mhc, tokens):
    return torch.randn(tokens, mhc, device='cuda'), torch.randn(1, device='cuda') * 0.1 + 1, torch.randn(mhc, device='cuda') * 0.1


# -- benchmarks.run: spec -> (label, fn, bytes moved) ---------------------------------------------------------------


def split_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_fwd

    mhc = spec['mhc']
    mixes, scale, base = _split_inputs(mhc, tokens)
    fn = lambda: mhc_pre_split_mixes_fwd(mixes, scale, base, mhc, POST_MULT, EPS)  # noqa: E731
    return f'T={tokens}', fn, nbytes(mixes, *fn())


def split_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd

    mhc = spec['mhc']
    mixes, scale, base = _split_inputs(mhc, tokens)
    _, post, _ = mhc_pre_split_mixes_fwd(mixes, scale, base, mhc, POST_MULT, EPS)
    grads = _split_grads(mhc, tokens)
    fn = lambda: mhc_pre_split_mixes_bwd(*grads, mixes, post, scale, base, mhc, POST_MULT)  # noqa: E731
    return f'T={tokens}', fn, nbytes(*grads, mixes, fn()[0])


def sinkhorn_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_fwd

    n = spec['mhc']
    x = torch.randn(tokens, n, n, device='cuda')
    return [(f'({tokens}, {n}, {n}) repeat {r}', (lambda r=r: mhc_sinkhorn_fwd(x, r, EPS)), 2 * nbytes(x)) for r in REPEATS]


def sinkhorn_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_bwd

    n = spec['mhc']
    x, grad = torch.randn(tokens, n, n, device='cuda'), torch.randn(tokens, n, n, device='cuda')
    return [(f'({tokens}, {n}, {n}) repeat {r}', (lambda r=r: mhc_sinkhorn_bwd(grad, x, r, EPS)), 3 * nbytes(x)) for r in REPEATS]


def head_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_fwd

    mix, scale, base = _head_inputs(spec['mhc'], tokens)
    return f'T={tokens}', lambda: mhc_head_compute_mix_fwd(mix, scale, base, EPS), 2 * nbytes(mix)


def head_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_bwd

    mix, scale, base = _head_inputs(spec['mhc'], tokens)
    grad = torch.randn_like(mix)
    return f'T={tokens}', lambda: mhc_head_compute_mix_bwd(grad, mix, scale, base), 3 * nbytes(mix)


def _big_fuse_inputs(mhc, hidden, tokens):
    mhc3 = mhc * (mhc + 2)
    residual = torch.randn(tokens, mhc, hidden, device='cuda').bfloat16()
    fn = torch.randn(mhc3, mhc * hidden, device='cuda') * 1e-2
    return residual, fn, torch.randn(3, device='cuda') * 0.1 + 1, torch.randn(mhc3, device='cuda') * 0.1


def big_fuse_case(spec, tokens):
    from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse

    residual, fn, scale, base = _big_fuse_inputs(spec['mhc'], spec['hidden'], tokens)
    cases = []
    for n_splits in (16, 1):
        fn_call = lambda n_splits=n_splits: mhc_pre_big_fuse(residual, fn, scale, base, EPS, EPS, EPS, POST_MULT, 20, n_splits)  # noqa: E731
        cases.append((f'T={tokens} n_splits={n_splits}', fn_call, nbytes(residual, fn, *fn_call())))
    return cases


RUN_CASES = {
    'mhc.pre_split_mixes_fwd': split_fwd_case,
    'mhc.pre_split_mixes_bwd': split_bwd_case,
    'mhc.sinkhorn_fwd': sinkhorn_fwd_case,
    'mhc.sinkhorn_bwd': sinkhorn_bwd_case,
    'mhc.head_compute_mix_fwd': head_fwd_case,
    'mhc.head_compute_mix_bwd': head_bwd_case,
    'mhc.pre_big_fuse': big_fuse_case,
}


# -- benchmarks.upstream: tk -> (label, ours, theirs, compare, bytes moved); mhc = 4 as upstream's tests -------------


def _close_to(rtol, atol):
    def compare(a, b):
        a = a if isinstance(a, (tuple, list)) else (a,)
        b = b if isinstance(b, (tuple, list)) else (b,)
        return all(x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True))
    return compare


def _num_sms():
    from tile_kernels_aot.config import get_num_sms

    return get_num_sms()


def upstream_split_fwd_case(tk, tokens):
    from tile_kernels.mhc.pre_split_mixes_kernel import _mhc_pre_split_mixes_fwd
    from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_fwd

    mixes, scale, base = _split_inputs(4, tokens)
    kernel = _mhc_pre_split_mixes_fwd(4, POST_MULT, EPS, token_block_size=32)

    def theirs():
        pre, post, comb = mixes.new_empty(tokens, 4), mixes.new_empty(tokens, 4), mixes.new_empty(tokens, 16)
        kernel(mixes, scale, base, pre, post, comb)
        return pre.view(tokens, 4, 1), post.view(tokens, 4, 1), comb.view(tokens, 4, 4)

    return 'mhc 4', lambda: mhc_pre_split_mixes_fwd(mixes, scale, base, 4, POST_MULT, EPS), theirs, _close_to(1e-5, 2e-5), \
        nbytes(mixes) + tokens * 24 * 4


def upstream_split_bwd_case(tk, tokens):
    from tile_kernels.mhc.pre_split_mixes_kernel import _mhc_pre_split_mixes_bwd
    from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd

    mixes, scale, base = _split_inputs(4, tokens)
    _, post, _ = mhc_pre_split_mixes_fwd(mixes, scale, base, 4, POST_MULT, EPS)
    pre_grad, post_grad, comb_grad = _split_grads(4, tokens)
    num_sms = _num_sms()
    kernel = _mhc_pre_split_mixes_bwd(4, POST_MULT, token_block_size=32, num_sms=num_sms)

    def theirs():
        mixes_grad = torch.empty_like(mixes)
        scale_partial, base_partial = mixes.new_empty(num_sms, 3), mixes.new_empty(num_sms, 24)
        kernel(pre_grad.view(tokens, 4), post_grad.view(tokens, 4), comb_grad.view(tokens, 16), mixes, post.view(tokens, 4),
               scale, base, mixes_grad, scale_partial, base_partial)
        return mixes_grad, scale_partial.sum(0), base_partial.sum(0)

    def mine():
        return mhc_pre_split_mixes_bwd(pre_grad, post_grad, comb_grad, mixes, post, scale, base, 4, POST_MULT)

    # The token sums add thousands of terms in different orders: compared at a tolerance that scales with them.
    return 'mhc 4', mine, theirs, _close_to(1e-4, 1e-3), nbytes(pre_grad, post_grad, comb_grad, mixes) * 2 - nbytes(post_grad)


def upstream_sinkhorn_fwd_case(tk, tokens):
    from tile_kernels.mhc.sinkhorn_kernel import _mhc_sinkhorn_fwd
    from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_fwd

    x = torch.randn(tokens, 4, 4, device='cuda')
    cases = []
    for r in REPEATS:
        kernel = _mhc_sinkhorn_fwd(4, 1, r, EPS)

        def theirs(kernel=kernel):
            out = torch.empty_like(x)
            kernel(x, out)
            return out

        cases.append((f'(T, 4, 4) repeat {r}', (lambda r=r: mhc_sinkhorn_fwd(x, r, EPS)), theirs, _close_to(1.3e-6, 1e-5), 2 * nbytes(x)))
    return cases


def upstream_sinkhorn_bwd_case(tk, tokens):
    from tile_kernels.mhc.sinkhorn_kernel import _mhc_sinkhorn_bwd
    from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_bwd

    x, grad = torch.randn(tokens, 4, 4, device='cuda'), torch.randn(tokens, 4, 4, device='cuda')
    cases = []
    for r in REPEATS:
        kernel = _mhc_sinkhorn_bwd(4, 32, r, EPS)

        def theirs(kernel=kernel):
            out = torch.empty_like(x)
            kernel(grad, x, out)
            return out

        cases.append((f'(T, 4, 4) repeat {r}', (lambda r=r: mhc_sinkhorn_bwd(grad, x, r, EPS)), theirs, _close_to(1e-4, 1e-5), 3 * nbytes(x)))
    return cases


def upstream_head_fwd_case(tk, tokens):
    from tile_kernels.mhc.head_compute_mix_kernel import _mhc_head_compute_mix_fwd
    from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_fwd

    mix, scale, base = _head_inputs(4, tokens)
    kernel = _mhc_head_compute_mix_fwd(4, EPS, token_block_size=32)

    def theirs():
        out = torch.empty_like(mix)
        kernel(mix, scale, base, out)
        return out

    return 'mhc 4', lambda: mhc_head_compute_mix_fwd(mix, scale, base, EPS), theirs, _close_to(1e-4, 1e-5), 2 * nbytes(mix)


def upstream_head_bwd_case(tk, tokens):
    from tile_kernels.mhc.head_compute_mix_kernel import _mhc_head_compute_mix_bwd
    from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_bwd

    mix, scale, base = _head_inputs(4, tokens)
    grad = torch.randn_like(mix)
    num_sms = _num_sms()
    kernel = _mhc_head_compute_mix_bwd(4, token_block_size=32, num_sms=num_sms)

    def theirs():
        input_grad = torch.empty_like(mix)
        scale_partial, base_partial = mix.new_empty(num_sms, 1), mix.new_empty(num_sms, 4)
        kernel(grad, mix, scale, base, input_grad, scale_partial, base_partial)
        return input_grad, scale_partial.sum(0), base_partial.sum(0)

    return 'mhc 4', lambda: mhc_head_compute_mix_bwd(grad, mix, scale, base), theirs, _close_to(1e-4, 1e-3), 3 * nbytes(mix)


def upstream_big_fuse_case(tk, tokens):
    """DeepSeek-V4-Flash's shape (H 4096, repeat 20). Upstream's TileLang path forces n_splits = 1 and its GEMM adds
    in another order than ours, so the results are compared at the tolerances of upstream's norm_fn test."""
    from tile_kernels.modeling.mhc.ops.pre_big_fuse import mhc_pre_big_fuse as theirs_op
    from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse

    residual, fn, scale, base = _big_fuse_inputs(4, 4096, tokens)
    args = (EPS, EPS, EPS, POST_MULT, 20)

    def compare(a, b):
        return all(x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=1e-2, atol=1e-2) for x, y in zip(a, b, strict=True))

    moved = nbytes(residual, fn) + tokens * (4 * 4 + 16 * 4 + 4096 * 2)
    return [(f'H 4096 n_splits {n}', (lambda n=n: mhc_pre_big_fuse(residual, fn, scale, base, *args, n)),
             (lambda: theirs_op(residual, fn, scale, base, *args, 1)), compare, moved) for n in (16, 1)]


def upstream_mhc_pre_case(tk, tokens):
    """mhc_pre of one layer (H 7168, repeat 20) through each package's modeling API: grad off (one fused kernel), grad
    on (norm_fn, split, Sinkhorn, apply_mix, saving for the backward), and grad on with mhc_post and the backward of
    both, as a training step runs them (mhc_post's backward leaves the pre ops' fused gradient stash)."""
    from tile_kernels.modeling.mhc import mhc_pre as their_pre
    from tile_kernels.modeling.mhc.ops import mhc_post as their_post
    from tile_kernels_aot.modeling.mhc import mhc_post, mhc_pre

    hidden = 7168
    residual, fn, scale, base = _big_fuse_inputs(4, hidden, tokens)
    residual = residual.unsqueeze(0)  # (1, T, mhc, H): upstream's grad-on path asserts two leading dims
    kwargs = dict(norm_eps=EPS, pre_eps=EPS, sinkhorn_eps=EPS, post_mult_value=POST_MULT, sinkhorn_repeat=20)
    stream_grad = torch.randn(1, tokens, 4, hidden, device='cuda').bfloat16()

    def grad_off(pre):
        with torch.no_grad():
            layer_input, (post, comb) = pre(residual, fn, scale, base, **kwargs)
        return layer_input, post, comb

    def grad_on(pre):
        leaf = residual.clone().requires_grad_()
        layer_input, (post, comb) = pre(leaf, fn.clone().requires_grad_(), scale.clone().requires_grad_(), base.clone().requires_grad_(), **kwargs)
        return layer_input.detach(), post.detach(), comb.detach()

    def step(pre, post_op):
        leaf = residual.clone().requires_grad_()
        weights = [t.clone().requires_grad_() for t in (fn, scale, base)]
        layer_input, (post, comb) = pre(leaf, *weights, **kwargs)
        # The sublayer is the identity, so only the mHC ops' own work is timed.
        post_op(layer_input, leaf, post, comb).backward(stream_grad)
        return leaf.grad, *[w.grad for w in weights]

    moved = nbytes(residual) + tokens * hidden * 2
    loose = _close_to(1e-2, 1e-2)
    return [(f'H {hidden} grad off', lambda: grad_off(mhc_pre), lambda: grad_off(their_pre), loose, moved),
            (f'H {hidden} grad on', lambda: grad_on(mhc_pre), lambda: grad_on(their_pre), loose, moved),
            (f'H {hidden} grad on, with mhc_post and backward', lambda: step(mhc_pre, mhc_post), lambda: step(their_pre, their_post),
             _close_to(5e-2, 5e-2), 3 * moved)]


# Public ops that run several kernels: benchmarks.upstream times them by these names, which are not kernels.
UPSTREAM_COMPOSITES = {'mhc.mhc_pre': upstream_mhc_pre_case}

UPSTREAM_CASES = {
    'mhc.pre_split_mixes_fwd': upstream_split_fwd_case,
    'mhc.pre_split_mixes_bwd': upstream_split_bwd_case,
    'mhc.sinkhorn_fwd': upstream_sinkhorn_fwd_case,
    'mhc.sinkhorn_bwd': upstream_sinkhorn_bwd_case,
    'mhc.head_compute_mix_fwd': upstream_head_fwd_case,
    'mhc.head_compute_mix_bwd': upstream_head_bwd_case,
    'mhc.pre_big_fuse': upstream_big_fuse_case,
}
