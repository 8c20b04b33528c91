"""Benchmark cases of the mHC pre-norm kernels (fn_normw_merge fwd/bwd, pre_norm_fn fwd_mul / fwd_norm / bwd_norm /
bwd_mul): RUN_CASES for benchmarks.run (spec, tokens) and UPSTREAM_CASES for benchmarks.upstream (tk, tokens), on the
same inputs.

The two GEMMs and the two norm steps are timed as single kernels (launched through their entries, as the ops
launch them), so that each row is one kernel; the split-K GEMM runs at n_splits 16 (upstream's default, which
upstream itself forces to 1) and 1. Upstream's kernels are its JIT factories in tile_kernels.mhc.norm_fn_kernel,
called the way its autograd Function calls them.
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.common import kernel_only, nbytes

EPS = 1e-6
N_SPLITS = (16, 1)
MERGE_HIDDEN = 7168


def _kernel(name, spec):
    from tile_kernels_aot._select import find_kernel

    return find_kernel(name, spec, 0)


def _inputs(mhc, hidden, tokens):
    from tile_kernels_aot.mhc.norm_fn import round_to_tf32

    width = mhc * hidden
    residual = torch.randn(tokens, mhc, hidden, device='cuda').bfloat16()
    fn = torch.randn(mhc * (mhc + 2), width, device='cuda') / width ** 0.5
    return residual, round_to_tf32(fn)


def _norm_inputs(mhc, tokens, n_splits=16):
    mhc3 = mhc * (mhc + 2)
    partial_mul = torch.randn(n_splits, tokens, mhc3, device='cuda')
    partial_sqrsum = torch.rand(n_splits, tokens, device='cuda') * 100
    return partial_mul, partial_sqrsum


def _backward_inputs(mhc, tokens):
    from tile_kernels_aot.mhc.norm_fn import round_to_tf32

    mhc3 = mhc * (mhc + 2)
    out_grad = torch.randn(tokens, mhc3, device='cuda')
    out_mul = torch.randn(tokens, mhc3, device='cuda')
    sqrsum = torch.rand(tokens, device='cuda') * 1000 + 1
    mul_grad = torch.zeros(tokens, 32, device='cuda')
    mul_grad[:, :mhc3] = round_to_tf32(torch.randn(tokens, mhc3, device='cuda'))
    sqrsum_grad = torch.randn(tokens, device='cuda') * 1e-3
    return out_grad, out_mul, sqrsum, mul_grad, sqrsum_grad


def _merge_inputs(mhc):
    width = mhc * MERGE_HIDDEN
    fn = torch.randn(mhc * (mhc + 2), width, device='cuda')
    return fn, torch.randn(width, device='cuda'), torch.randn_like(fn), torch.zeros_like(fn), torch.zeros(width, device='cuda')


# -- benchmarks.run: spec -> (label, fn, bytes moved) ---------------------------------------------------------------


def merge_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.norm_fn import mhc_fn_normw_merge_fwd

    fn, normw, *_ = _merge_inputs(spec['mhc'])
    return f'H{MERGE_HIDDEN}', lambda: mhc_fn_normw_merge_fwd(fn, normw), 2 * nbytes(fn) + nbytes(normw)


def merge_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.norm_fn import mhc_fn_normw_merge_bwd

    fn, normw, out_fn_grad, fn_grad, normw_grad = _merge_inputs(spec['mhc'])
    return f'H{MERGE_HIDDEN}', lambda: mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad), \
        nbytes(fn, normw, out_fn_grad) + 2 * nbytes(fn_grad, normw_grad)


def fwd_mul_case(spec, tokens):
    residual, fn_tf32 = _inputs(spec['mhc'], spec['hidden'], tokens)
    x = residual.view(tokens, -1)
    kernel = _kernel('mhc.pre_norm_fn_fwd_mul', spec)
    cases = []
    for n_splits in N_SPLITS:
        partial_mul = torch.empty(n_splits, tokens, fn_tf32.shape[0], device='cuda')
        partial_sqrsum = torch.empty(n_splits, tokens, device='cuda')
        tensors = {'x': x, 'fn': fn_tf32, 'partial_mul': partial_mul, 'partial_sqrsum': partial_sqrsum}
        cases.append((f'T={tokens} n_splits={n_splits}', lambda tensors=tensors: kernel(0, tensors),
                      nbytes(x, fn_tf32, partial_mul, partial_sqrsum)))
    return cases


def fwd_norm_case(spec, tokens):
    mhc = spec['mhc']
    partial_mul, partial_sqrsum = _norm_inputs(mhc, tokens)
    out_mul, mixes = torch.empty_like(partial_mul[0]), torch.empty_like(partial_mul[0])
    sqrsum = torch.empty_like(partial_sqrsum[0])
    tensors = {'partial_mul': partial_mul, 'partial_sqrsum': partial_sqrsum, 'out_mul': out_mul, 'sqrsum': sqrsum, 'mixes': mixes}
    kernel = _kernel('mhc.pre_norm_fn_fwd_norm', spec)
    return f'T={tokens} n_splits=16', lambda: kernel(0, tensors, {'width': mhc * 4096, 'eps': EPS}), \
        nbytes(partial_mul, partial_sqrsum, out_mul, sqrsum, mixes)


def bwd_norm_case(spec, tokens):
    mhc = spec['mhc']
    out_grad, out_mul, sqrsum, mul_grad, sqrsum_grad = _backward_inputs(mhc, tokens)
    tensors = {'out_grad': out_grad, 'out_mul': out_mul, 'sqrsum': sqrsum, 'mul_grad': mul_grad, 'sqrsum_grad': sqrsum_grad}
    kernel = _kernel('mhc.pre_norm_fn_bwd_norm', spec)
    return f'T={tokens}', lambda: kernel(0, tensors, {'width': mhc * 4096, 'eps': EPS}), \
        nbytes(out_grad, out_mul, sqrsum, mul_grad, sqrsum_grad)


def bwd_mul_case(spec, tokens):
    mhc, hidden = spec['mhc'], spec['hidden']
    residual, fn_tf32 = _inputs(mhc, hidden, tokens)
    *_, mul_grad, sqrsum_grad = _backward_inputs(mhc, tokens)
    x, x_grad = residual.view(tokens, -1), torch.zeros(tokens, mhc * hidden, dtype=torch.bfloat16, device='cuda')
    fn_grad = torch.empty_like(fn_tf32)
    tensors = {'mul_grad': mul_grad, 'sqrsum_grad': sqrsum_grad, 'x': x, 'fn': fn_tf32, 'x_grad': x_grad, 'fn_grad': fn_grad}
    kernel = _kernel('mhc.pre_norm_fn_bwd_mul', spec)
    return f'T={tokens}', lambda: kernel(0, tensors), nbytes(mul_grad, sqrsum_grad, x, fn_tf32, fn_grad) + 2 * nbytes(x_grad)


RUN_CASES = {
    'mhc.fn_normw_merge_fwd': merge_fwd_case,
    'mhc.fn_normw_merge_bwd': merge_bwd_case,
    'mhc.pre_norm_fn_fwd_mul': fwd_mul_case,
    'mhc.pre_norm_fn_fwd_norm': fwd_norm_case,
    'mhc.pre_norm_fn_bwd_norm': bwd_norm_case,
    'mhc.pre_norm_fn_bwd_mul': bwd_mul_case,
}


# -- benchmarks.upstream: tk -> (label, ours, theirs, compare, bytes moved) -----------------------------------------


def _close(rtol=1e-5, atol=1e-6):
    def compare(a, b):
        a, b = (a,) if isinstance(a, torch.Tensor) else a, (b,) if isinstance(b, torch.Tensor) else b
        return all(x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True))
    return compare


def _upstream(tk):
    import importlib

    return importlib.import_module(tk.__name__ + '.mhc.norm_fn_kernel')


def up_merge_fwd_case(tk, tokens):
    from tile_kernels_aot.mhc.norm_fn import mhc_fn_normw_merge_fwd

    fn, normw, *_ = _merge_inputs(4)
    kernel = _upstream(tk)._mhc_fn_normw_merge_fwd(*fn.shape)

    def theirs():  # as upstream's autograd Function calls it
        out = torch.empty_like(fn)
        kernel(fn, normw, out)
        return out
    return f'mhc=4 H{MERGE_HIDDEN}', lambda: mhc_fn_normw_merge_fwd(fn, normw), theirs, _close(0, 0), 2 * nbytes(fn) + nbytes(normw)


def up_merge_bwd_case(tk, tokens):
    from tile_kernels_aot.mhc.norm_fn import mhc_fn_normw_merge_bwd

    fn, normw, out_fn_grad, fn_grad, normw_grad = _merge_inputs(4)
    their_fn_grad, their_normw_grad = torch.zeros_like(fn_grad), torch.zeros_like(normw_grad)
    kernel = _upstream(tk)._mhc_fn_normw_merge_bwd(*fn.shape)

    def ours():  # both accumulate: start from zero each call so that the results compare
        fn_grad.zero_(), normw_grad.zero_()
        mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
        return fn_grad, normw_grad

    def theirs():
        their_fn_grad.zero_(), their_normw_grad.zero_()
        kernel(fn, normw, out_fn_grad, their_fn_grad, their_normw_grad)
        return their_fn_grad, their_normw_grad
    return f'mhc=4 H{MERGE_HIDDEN} (with zeroing)', ours, theirs, _close(1e-5, 1e-5), nbytes(fn, normw, out_fn_grad) + 2 * nbytes(fn_grad, normw_grad)


def _summed_close(partials, expected):
    return _close(1e-3, 1e-3)(tuple(p.sum(0) for p in partials), expected)


def up_fwd_mul_cases(tk, tokens):
    """Upstream's GEMM runs unsplit; ours at n_splits 1 (the same work) and 16, whose partials are summed to compare
    (outside the timed call)."""
    from tile_kernels_aot.mhc.norm_fn import mhc_pre_norm_fn_gemm

    cases = []
    for hidden in (4096, 7168):
        residual, fn_tf32 = _inputs(4, hidden, tokens)
        mhc3, width = fn_tf32.shape
        kernel = _upstream(tk)._mhc_pre_norm_fn_fwd_mul(mhc3, 1, width)

        def theirs(kernel=kernel, residual=residual, fn_tf32=fn_tf32, mhc3=mhc3):  # its outputs allocated as upstream's Function does
            out, sqrsum = torch.empty(1, tokens, 1, mhc3, device='cuda'), torch.empty(1, tokens, 1, device='cuda')
            kernel(residual.view(tokens, -1), fn_tf32, out.view(-1, 1, mhc3), sqrsum.view(-1, 1))
            return out.view(tokens, -1), sqrsum.view(tokens)

        for n_splits in (1, 16):
            cases.append((f'mhc=4 H{hidden} n_splits={n_splits}', partial(mhc_pre_norm_fn_gemm, residual, fn_tf32, n_splits), theirs,
                          _summed_close, nbytes(residual, fn_tf32) + n_splits * tokens * (mhc3 + 1) * 4))
    return cases


@kernel_only
def up_fwd_norm_case(tk, tokens):
    mhc, width = 4, 4 * 4096
    partial_mul, partial_sqrsum = _norm_inputs(mhc, tokens)
    n_splits, _, mhc3 = partial_mul.shape
    outs = [torch.empty(tokens, mhc3, device='cuda'), torch.empty(tokens, device='cuda'), torch.empty(tokens, mhc3, device='cuda')]
    theirs_outs = [torch.empty_like(o) for o in outs]
    kernel = _upstream(tk)._mhc_pre_norm_fn_fwd_norm(mhc3, 1, width, EPS, n_splits)
    ours_kernel = _kernel('mhc.pre_norm_fn_fwd_norm', {'mhc': mhc})
    tensors = {'partial_mul': partial_mul, 'partial_sqrsum': partial_sqrsum, 'out_mul': outs[0], 'sqrsum': outs[1], 'mixes': outs[2]}

    def ours():
        ours_kernel(0, tensors, {'width': width, 'eps': EPS})
        return outs

    def theirs():
        kernel(partial_mul.view(n_splits, tokens, 1, mhc3), partial_sqrsum.view(n_splits, tokens, 1),
               theirs_outs[0].view(tokens, 1, mhc3), theirs_outs[1].view(tokens, 1), theirs_outs[2])
        return theirs_outs
    return f'mhc=4 H4096 n_splits={n_splits}', ours, theirs, _close(), nbytes(partial_mul, partial_sqrsum, *outs)


@kernel_only
def up_bwd_norm_case(tk, tokens):
    """Upstream leaves the TF32 rounding of the products' gradient to a torch op after the kernel; ours rounds in it."""
    from tile_kernels_aot.mhc.norm_fn import round_to_tf32

    mhc, width = 4, 4 * 4096
    out_grad, out_mul, sqrsum, mul_grad, sqrsum_grad = _backward_inputs(mhc, tokens)
    mhc3 = out_grad.shape[1]
    their_mul_grad, their_sqrsum_grad = torch.empty(tokens, 1, mhc3, device='cuda'), torch.empty(tokens, 1, device='cuda')
    kernel = _upstream(tk)._mhc_pre_norm_fn_bwd_norm(mhc3, 1, width, EPS)
    ours_kernel = _kernel('mhc.pre_norm_fn_bwd_norm', {'mhc': mhc})
    tensors = {'out_grad': out_grad, 'out_mul': out_mul, 'sqrsum': sqrsum, 'mul_grad': mul_grad, 'sqrsum_grad': sqrsum_grad}

    def ours():
        ours_kernel(0, tensors, {'width': width, 'eps': EPS})
        return mul_grad[:, :mhc3], sqrsum_grad

    def theirs():
        kernel(out_grad, out_mul.view(tokens, 1, mhc3), sqrsum.view(tokens, 1), their_mul_grad, their_sqrsum_grad)
        return round_to_tf32(their_mul_grad.view(tokens, mhc3)), their_sqrsum_grad.view(tokens)
    return 'mhc=4 H4096', ours, theirs, _close(1e-5, 1e-9), nbytes(out_grad, out_mul, sqrsum, mul_grad, sqrsum_grad)


@kernel_only
def up_bwd_mul_case(tk, tokens):
    mhc, hidden = 4, 4096
    residual, fn_tf32 = _inputs(mhc, hidden, tokens)
    *_, mul_grad, sqrsum_grad = _backward_inputs(mhc, tokens)
    mhc3, width = fn_tf32.shape
    x = residual.view(tokens, width)
    x_grad, their_x_grad = torch.zeros_like(x), torch.zeros_like(x)
    fn_grad, their_fn_grad = torch.empty_like(fn_tf32), torch.empty_like(fn_tf32)
    their_mul_grad = mul_grad[:, :mhc3].contiguous().view(tokens, 1, mhc3)
    kernel = _upstream(tk)._mhc_pre_norm_fn_bwd_mul(mhc3, 1, width)
    ours_kernel = _kernel('mhc.pre_norm_fn_bwd_mul', {'mhc': mhc, 'hidden': hidden})
    tensors = {'mul_grad': mul_grad, 'sqrsum_grad': sqrsum_grad, 'x': x, 'fn': fn_tf32, 'x_grad': x_grad, 'fn_grad': fn_grad}

    def ours():  # x_grad accumulates: the first call (the compared one) starts from zero
        ours_kernel(0, tensors)
        return x_grad, fn_grad

    def theirs():
        kernel(their_mul_grad, sqrsum_grad.view(tokens, 1), x, fn_tf32, their_x_grad, their_fn_grad)
        return their_x_grad, their_fn_grad
    return 'mhc=4 H4096', ours, theirs, _close(1e-2, 1e-2), nbytes(mul_grad, sqrsum_grad, x, fn_tf32, fn_grad) + 2 * nbytes(x_grad)


UPSTREAM_CASES = {
    'mhc.fn_normw_merge_fwd': up_merge_fwd_case,
    'mhc.fn_normw_merge_bwd': up_merge_bwd_case,
    'mhc.pre_norm_fn_fwd_mul': up_fwd_mul_cases,
    'mhc.pre_norm_fn_fwd_norm': up_fwd_norm_case,
    'mhc.pre_norm_fn_bwd_norm': up_bwd_norm_case,
    'mhc.pre_norm_fn_bwd_mul': up_bwd_mul_case,
}
