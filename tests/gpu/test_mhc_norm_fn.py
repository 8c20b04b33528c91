"""The mHC pre-norm kernels against torch autograd of tile_kernels_aot.reference.mhc_pre_norm_fn_ref (TF32 matmuls
allowed, as upstream's test), with upstream's tolerances: mixes 1e-3, residual gradient torch's default for bf16, fn
gradient atol 3e-2 rtol 1e-3. The split-K partials must add up, in split order, to exactly what the norm kernel
writes; every result must be the same bits at every SM count."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tile_kernels_aot import config, reference
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import norm_fn as ops

from .helpers import assert_bitwise_equal, installed_specs, poison_allocator, sm_counts

pytestmark = pytest.mark.gpu

EPS = 1e-6
FWD_TOKENS = (0, 1, 4001, 8192)
SPLIT_TOKENS = (13, 48, 512)  # upstream's split-K test sizes
N_SPLITS = (1, 4, 16)


@contextlib.contextmanager
def tf32_matmuls():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def inputs(spec, num_tokens, seed=0):
    """Upstream's test distribution: unit-normal streams and fn ~ 1e-4 N(0, 1), each stream m scaled by 1 + m / 100."""
    mhc, hidden = spec['mhc'], spec['hidden']
    generator = torch.Generator(device='cuda').manual_seed(seed)
    stream_scale = 1 + torch.arange(mhc, device='cuda') / 100
    residual = (torch.randn(1, num_tokens, mhc, hidden, device='cuda', generator=generator) * stream_scale[:, None]).bfloat16()
    fn = torch.randn(mhc * (mhc + 2), mhc, hidden, device='cuda', generator=generator) * 1e-4 * stream_scale[:, None]
    return residual, fn.flatten(1, 2)


def reference_mixes(residual, fn):
    with tf32_matmuls():
        return reference.mhc_pre_norm_fn_ref(residual, fn, None, EPS)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_norm_fn_fwd_mul'))
@pytest.mark.parametrize('num_tokens', FWD_TOKENS)
@pytest.mark.parametrize('n_splits', N_SPLITS)
def test_forward(spec, num_tokens, n_splits):
    residual, fn = inputs(spec, num_tokens)
    mhc3, width = fn.shape
    poison_allocator(((1, num_tokens, mhc3), torch.float32), ((num_tokens, mhc3), torch.float32), ((num_tokens,), torch.float32),
                     ((n_splits, num_tokens, mhc3), torch.float32), ((n_splits, num_tokens), torch.float32))
    mixes, fn_tf32, out_mul, sqrsum = ops.mhc_pre_norm_fn_fwd(residual, fn, EPS, n_splits)
    assert mixes.shape == (1, num_tokens, mhc3) and out_mul.shape == (num_tokens, mhc3) and sqrsum.shape == (num_tokens,)
    assert_bitwise_equal(fn_tf32, ops.round_to_tf32(fn))
    if num_tokens == 0:
        return  # (the reference cannot view an empty batch back into (1, 0, -1))
    torch.testing.assert_close(mixes, reference_mixes(residual, fn), atol=1e-3, rtol=1e-3)
    x = residual.view(num_tokens, width).float()
    torch.testing.assert_close(sqrsum, x.square().sum(-1), atol=1e-3, rtol=1e-4)
    with tf32_matmuls():
        torch.testing.assert_close(out_mul, x @ fn.t(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_norm_fn_fwd_mul'))
@pytest.mark.parametrize('num_tokens', SPLIT_TOKENS)
def test_split_partials_add_up_in_split_order(spec, num_tokens, restore_num_sms):
    """The GEMM alone (what mhc_pre_big_fuse calls): each split's partials, summed in split order from zero, are the
    norm kernel's out_mul and sqrsum bit for bit; splits past the number of GEMM steps are zeros."""
    residual, fn = inputs(spec, num_tokens, seed=1)
    flat = residual.view(num_tokens, *residual.shape[-2:])
    steps = fn.shape[1] // find_kernel('mhc.pre_norm_fn_fwd_mul', spec, 0).entry.constants['k_step']
    for n_splits in (*N_SPLITS, steps, steps + 3, ops.MAX_N_SPLITS):
        fn_tf32 = ops.round_to_tf32(fn)
        poison_allocator(((n_splits, num_tokens, fn.shape[0]), torch.float32), ((n_splits, num_tokens), torch.float32))
        partial_mul, partial_sqrsum = ops.mhc_pre_norm_fn_gemm(flat, fn_tf32, n_splits)
        _, _, out_mul, sqrsum = ops.mhc_pre_norm_fn_fwd(residual, fn, EPS, n_splits)
        mul_sum, sqr_sum = torch.zeros_like(partial_mul[0]), torch.zeros_like(partial_sqrsum[0])
        for s in range(n_splits):
            mul_sum, sqr_sum = mul_sum + partial_mul[s], sqr_sum + partial_sqrsum[s]
            first, last = s * steps // n_splits, (s + 1) * steps // n_splits
            if first == last:
                assert not partial_mul[s].any() and not partial_sqrsum[s].any()
        assert_bitwise_equal(out_mul, mul_sum)
        assert_bitwise_equal(sqrsum, sqr_sum)
        torch.testing.assert_close(ops.mhc_pre_norm_fn_fwd(residual, fn, EPS, n_splits)[0], reference_mixes(residual, fn), atol=1e-3, rtol=1e-3)
        for sms in sm_counts():
            config.set_num_sms(sms)
            again_mul, again_sqr = ops.mhc_pre_norm_fn_gemm(flat, fn_tf32, n_splits)
            assert_bitwise_equal(again_mul, partial_mul)
            assert_bitwise_equal(again_sqr, partial_sqrsum)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_norm_fn_bwd_mul'))
@pytest.mark.parametrize('num_tokens', FWD_TOKENS + SPLIT_TOKENS)
def test_backward(spec, num_tokens, restore_num_sms):
    residual, fn = inputs(spec, num_tokens, seed=2)
    mhc3, width = fn.shape
    out_grad = torch.randn(1, num_tokens, mhc3, device='cuda')
    _, fn_tf32, out_mul, sqrsum = ops.mhc_pre_norm_fn_fwd(residual, fn, EPS, 16)
    accumulated = torch.randn_like(residual, dtype=torch.float32).bfloat16()  # x_grad adds to what is there
    results = []
    for sms in sm_counts():
        config.set_num_sms(sms)
        x_grad = accumulated.clone()
        poison_allocator(((mhc3, width), torch.float32), ((num_tokens, 32), torch.float32), ((num_tokens,), torch.float32))
        fn_grad = ops.mhc_pre_norm_fn_bwd(out_grad, residual, fn_tf32, out_mul, sqrsum, EPS, x_grad)
        results.append((x_grad, fn_grad))
    x_grad, fn_grad = results[0]
    for other_x, other_fn in results[1:]:
        assert_bitwise_equal(other_x, x_grad)
        assert_bitwise_equal(other_fn, fn_grad)
    if num_tokens == 0:
        assert x_grad.shape == residual.shape and not fn_grad.any()
        return
    residual_ref, fn_ref = residual.clone().requires_grad_(), fn.clone().requires_grad_()
    with tf32_matmuls():
        reference.mhc_pre_norm_fn_ref(residual_ref, fn_ref, None, EPS).backward(out_grad)
    torch.testing.assert_close(x_grad, (accumulated.float() + residual_ref.grad.float()).bfloat16())
    torch.testing.assert_close(fn_grad, fn_ref.grad, atol=3e-2, rtol=1e-3)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_norm_fn_bwd_mul'))
def test_backward_into_zeros_matches_autograd(spec):
    """x_grad starting at zero, as the autograd Function does without a stash: torch's default bf16 tolerance."""
    residual, fn = inputs(spec, 4001, seed=3)
    out_grad = torch.randn(1, 4001, fn.shape[0], device='cuda')
    residual_ref = residual.clone().requires_grad_()
    with tf32_matmuls():
        reference.mhc_pre_norm_fn_ref(residual_ref, fn, None, EPS).backward(out_grad)
    _, fn_tf32, out_mul, sqrsum = ops.mhc_pre_norm_fn_fwd(residual, fn, EPS, 4)
    x_grad = torch.zeros_like(residual)
    ops.mhc_pre_norm_fn_bwd(out_grad, residual, fn_tf32, out_mul, sqrsum, EPS, x_grad)
    torch.testing.assert_close(x_grad, residual_ref.grad)


@pytest.mark.parametrize('spec', installed_specs('mhc.fn_normw_merge_fwd'))
@pytest.mark.parametrize('hidden', (1280, 4096, 7168))
def test_fn_normw_merge(spec, hidden):
    mhc = spec['mhc']
    width = mhc * hidden
    fn = torch.randn(mhc * (mhc + 2), width, device='cuda')
    normw = torch.randn(width, device='cuda')
    poison_allocator((tuple(fn.shape), torch.float32))
    assert_bitwise_equal(ops.mhc_fn_normw_merge_fwd(fn, normw), fn * normw)

    fn_ref, normw_ref = fn.clone().requires_grad_(), normw.clone().requires_grad_()
    out_fn_grad = torch.randn_like(fn)
    (fn_ref * normw_ref).backward(out_fn_grad)
    fn_grad, normw_grad = torch.randn_like(fn), torch.randn_like(normw)  # accumulated into, as .main_grad is
    expected_fn, expected_normw = fn_grad + fn_ref.grad, normw_grad + normw_ref.grad
    ops.mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
    torch.testing.assert_close(fn_grad, expected_fn, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(normw_grad, expected_normw, atol=1e-5, rtol=1e-5)
