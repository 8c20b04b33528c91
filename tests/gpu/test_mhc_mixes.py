"""The mHC mixing kernels (split_mixes, sinkhorn, head_compute_mix fwd and bwd) against torch autograd of
tile_kernels_aot.reference.mhc with upstream's tolerances, at every installed spec, over poisoned outputs; their
token sums bitwise the same at every SM count; pre_big_fuse bitwise equal to the composed raw ops.

Gradients are compared with the reference's autograd in float64 (cast to float32): the scale and base gradients
add up to 8192 tokens' terms, where a float32 reference's own rounding would be the larger error.
"""

from __future__ import annotations

import pytest
import torch

from tile_kernels_aot import config, reference
from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_bwd, mhc_head_compute_mix_fwd
from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd
from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd

from .helpers import assert_bitwise_equal, installed_specs, poison_allocator, sm_counts

pytestmark = pytest.mark.gpu

TOKENS = (0, 1, 4001, 8192)
REPEATS = (1, 10, 20)
SPLIT_TOL = dict(rtol=1e-5, atol=2e-5)  # upstream's tests/mhc/test_pre_split_mixes.py
HEAD_TOL = dict(rtol=1e-4, atol=1e-5)  # upstream's tests/mhc/test_head_compute_mix.py
POST_MULT, PRE_EPS, SINKHORN_EPS = 2.0, 1e-6, 1e-6


def poison_like(*tensors):
    poison_allocator(*((tuple(t.shape), t.dtype) for t in tensors))


def autograd(fn, inputs, grads):
    """fn's outputs and the gradients of sum(outputs * grads) with respect to inputs, all in float64."""
    inputs = [x.detach().double().requires_grad_() for x in inputs]
    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    torch.autograd.backward(outputs, [g.double() for g in grads])
    return [x.grad.float() for x in inputs]


# -- pre_split_mixes ------------------------------------------------------------------------------------------------


def split_inputs(mhc, tokens):
    mhc3 = mhc * (mhc + 2)
    return (torch.randn(1, tokens, mhc3, device='cuda'), torch.randn(3, device='cuda') * 0.5 + 1,
            torch.randn(mhc3, device='cuda') * 0.5)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_split_mixes_fwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_split_mixes_fwd(spec, tokens):
    mhc = spec['mhc']
    mixes, scale, base = split_inputs(mhc, tokens)
    expected = reference.mhc_pre_split_mixes_ref(mixes, scale, base, mhc, POST_MULT, PRE_EPS)
    poison_like(*expected)
    actual = mhc_pre_split_mixes_fwd(mixes, scale, base, mhc, POST_MULT, PRE_EPS)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **SPLIT_TOL)


def split_bwd(mixes, scale, base, mhc, grads, post_mult=POST_MULT):
    _, post, _ = mhc_pre_split_mixes_fwd(mixes, scale, base, mhc, post_mult, PRE_EPS)
    return mhc_pre_split_mixes_bwd(*grads, mixes, post, scale, base, mhc, post_mult)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_split_mixes_bwd'))
@pytest.mark.parametrize('tokens', TOKENS)
@pytest.mark.parametrize('post_mult', (POST_MULT, 0.0))
def test_split_mixes_bwd(spec, tokens, post_mult):
    mhc = spec['mhc']
    mixes, scale, base = split_inputs(mhc, tokens)
    grads = (torch.randn(1, tokens, mhc, 1, device='cuda'), torch.randn(1, tokens, mhc, 1, device='cuda'),
             torch.randn(1, tokens, mhc, mhc, device='cuda'))
    expected = autograd(lambda m, s, b: reference.mhc_pre_split_mixes_ref(m, s, b, mhc, post_mult, PRE_EPS), (mixes, scale, base), grads)
    _, post, _ = mhc_pre_split_mixes_fwd(mixes, scale, base, mhc, post_mult, PRE_EPS)
    poison_like(mixes, scale, base)
    actual = mhc_pre_split_mixes_bwd(*grads, mixes, post, scale, base, mhc, post_mult)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **SPLIT_TOL)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_split_mixes_bwd'))
def test_split_mixes_bwd_sums_do_not_depend_on_the_sm_count(spec, restore_num_sms):
    mhc = spec['mhc']
    mixes, scale, base = split_inputs(mhc, 8192)
    grads = (torch.randn(1, 8192, mhc, 1, device='cuda'), torch.randn(1, 8192, mhc, 1, device='cuda'),
             torch.randn(1, 8192, mhc, mhc, device='cuda'))
    results = []
    for num_sms in sm_counts():
        config.set_num_sms(num_sms)
        results.append(split_bwd(mixes, scale, base, mhc, grads))
    for other in results[1:]:
        for a, e in zip(other, results[0], strict=True):
            assert_bitwise_equal(a, e)


# -- sinkhorn -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('spec', installed_specs('mhc.sinkhorn_fwd'))
@pytest.mark.parametrize('tokens', TOKENS)
@pytest.mark.parametrize('repeat', REPEATS)
def test_sinkhorn_fwd(spec, tokens, repeat):
    n = spec['mhc']
    x = torch.randn(tokens, n, n, device='cuda')
    expected = reference.sinkhorn_normalize_ref(x, repeat, SINKHORN_EPS)
    poison_like(expected)
    torch.testing.assert_close(mhc_sinkhorn_fwd(x, repeat, SINKHORN_EPS), expected)


@pytest.mark.parametrize('spec', installed_specs('mhc.sinkhorn_bwd'))
@pytest.mark.parametrize('tokens', TOKENS)
@pytest.mark.parametrize('repeat', REPEATS)
def test_sinkhorn_bwd(spec, tokens, repeat):
    n = spec['mhc']
    x, grad = torch.randn(2, tokens, n, n, device='cuda'), torch.randn(2, tokens, n, n, device='cuda')
    (expected,) = autograd(lambda t: reference.sinkhorn_normalize_ref(t, repeat, SINKHORN_EPS), (x,), (grad,))
    poison_like(expected)
    torch.testing.assert_close(mhc_sinkhorn_bwd(grad, x, repeat, SINKHORN_EPS), expected)


@pytest.mark.parametrize('spec', installed_specs('mhc.sinkhorn_bwd'))
def test_sinkhorn_bwd_repeat_limit(spec):
    """The backward keeps every step's input in shared memory: up to max_repeat rounds, refused beyond."""
    from tile_kernels_aot._select import find_kernel

    n = spec['mhc']
    max_repeat = find_kernel('mhc.sinkhorn_bwd', spec, 0).entry.constants['max_repeat']
    x, grad = torch.randn(64, n, n, device='cuda'), torch.randn(64, n, n, device='cuda')
    (expected,) = autograd(lambda t: reference.sinkhorn_normalize_ref(t, max_repeat, SINKHORN_EPS), (x,), (grad,))
    torch.testing.assert_close(mhc_sinkhorn_bwd(grad, x, max_repeat, SINKHORN_EPS), expected)
    with pytest.raises(ValueError, match=f'mhc_sinkhorn_bwd: repeat must be in \\[1, {max_repeat}\\]'):
        mhc_sinkhorn_bwd(grad, x, max_repeat + 1, SINKHORN_EPS)


@pytest.mark.parametrize('spec', installed_specs('mhc.sinkhorn_fwd'))
def test_sinkhorn_eps_and_repeat_are_run_time(spec):
    """One binary, several eps and repeat values: each matches its reference."""
    n = spec['mhc']
    x = torch.randn(4001, n, n, device='cuda')
    for repeat, eps in ((3, 1e-3), (20, 0.0), (7, 1e-6)):
        torch.testing.assert_close(mhc_sinkhorn_fwd(x, repeat, eps), reference.sinkhorn_normalize_ref(x, repeat, eps))


# -- head_compute_mix -----------------------------------------------------------------------------------------------


def head_inputs(mhc, tokens):
    return torch.randn(1, tokens, mhc, device='cuda'), torch.randn(1, device='cuda') * 0.5 + 1, torch.randn(mhc, device='cuda') * 0.5


@pytest.mark.parametrize('spec', installed_specs('mhc.head_compute_mix_fwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_head_compute_mix_fwd(spec, tokens):
    mix, scale, base = head_inputs(spec['mhc'], tokens)
    expected = reference.mhc_head_compute_mix_ref(mix, scale, base, PRE_EPS)
    poison_like(expected)
    torch.testing.assert_close(mhc_head_compute_mix_fwd(mix, scale, base, PRE_EPS), expected, **HEAD_TOL)


@pytest.mark.parametrize('spec', installed_specs('mhc.head_compute_mix_bwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_head_compute_mix_bwd(spec, tokens):
    mix, scale, base = head_inputs(spec['mhc'], tokens)
    grad = torch.randn_like(mix)
    expected = autograd(lambda m, s, b: reference.mhc_head_compute_mix_ref(m, s, b, PRE_EPS), (mix, scale, base), (grad,))
    poison_like(*expected)
    actual = mhc_head_compute_mix_bwd(grad, mix, scale, base)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, **HEAD_TOL)


@pytest.mark.parametrize('spec', installed_specs('mhc.head_compute_mix_bwd'))
def test_head_compute_mix_bwd_sums_do_not_depend_on_the_sm_count(spec, restore_num_sms):
    mix, scale, base = head_inputs(spec['mhc'], 8192)
    grad = torch.randn_like(mix)
    results = []
    for num_sms in sm_counts():
        config.set_num_sms(num_sms)
        results.append(mhc_head_compute_mix_bwd(grad, mix, scale, base))
    for other in results[1:]:
        for a, e in zip(other, results[0], strict=True):
            assert_bitwise_equal(a, e)


# -- pre_big_fuse ---------------------------------------------------------------------------------------------------


def composed_pre(residual, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult, repeat, n_splits):
    """The pre step through the separate raw ops, which pre_big_fuse must equal bit for bit."""
    from tile_kernels_aot.mhc.norm_fn import mhc_pre_norm_fn_fwd
    from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_fwd

    mhc = residual.shape[-2]
    mixes, *_ = mhc_pre_norm_fn_fwd(residual, fn, rms_eps, n_splits)
    pre, post, comb = mhc_pre_split_mixes_fwd(mixes, scale, base, mhc, post_mult, pre_eps)
    return post, mhc_sinkhorn_fwd(comb, repeat, sinkhorn_eps), mhc_pre_apply_mix_fwd(residual, pre)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_big_fuse'))
@pytest.mark.parametrize('tokens', (1, 512, 1024, 2048, 8192))
@pytest.mark.parametrize('n_splits', (1, 16))
def test_pre_big_fuse_equals_the_composed_ops(spec, tokens, n_splits):
    from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse

    mhc, hidden = spec['mhc'], spec['hidden']
    mhc3 = mhc * (mhc + 2)
    residual = torch.randn(1, tokens, mhc, hidden, device='cuda').bfloat16()
    fn = torch.randn(mhc3, mhc * hidden, device='cuda') * 1e-2
    scale, base = torch.randn(3, device='cuda') * 0.5 + 1, torch.randn(mhc3, device='cuda') * 0.5
    args = (1e-6, 1e-6, 1e-6, POST_MULT, 20, n_splits)
    expected = composed_pre(residual, fn, scale, base, *args)
    poison_like(*expected)
    actual = mhc_pre_big_fuse(residual, fn, scale, base, *args)
    for a, e in zip(actual, expected, strict=True):
        assert_bitwise_equal(a, e)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_big_fuse', where=lambda s: s['hidden'] == 4096))
def test_pre_big_fuse_run_time_arguments(spec):
    """Other eps, repeat and post_mult values through the same binary: still the composed ops' bits."""
    from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse

    mhc, hidden = spec['mhc'], spec['hidden']
    mhc3 = mhc * (mhc + 2)
    residual = torch.randn(1, 333, mhc, hidden, device='cuda').bfloat16()
    fn = torch.randn(mhc3, mhc * hidden, device='cuda') * 1e-2
    scale, base = torch.randn(3, device='cuda') * 0.5 + 1, torch.randn(mhc3, device='cuda') * 0.5
    for args in ((1e-5, 1e-3, 1e-4, 1.0, 1, 3), (1e-6, 0.0, 0.0, 0.5, 10, 16)):
        for a, e in zip(mhc_pre_big_fuse(residual, fn, scale, base, *args), composed_pre(residual, fn, scale, base, *args), strict=True):
            assert_bitwise_equal(a, e)
