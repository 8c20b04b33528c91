"""The mHC autograd layer and composites: gradients against torch autograd of the references, the fused
gradient-accumulation stash, main_grad, the grad-free fused path, and a short training run."""

from __future__ import annotations

import pytest
import torch

from tile_kernels_aot import reference
from tile_kernels_aot.modeling import mhc

from .helpers import assert_bitwise_equal, installed_values

pytestmark = pytest.mark.gpu

MHC = 4
ROWS = MHC * (MHC + 2)


def hidden_sizes() -> list:
    """The hidden sizes every kernel of a layer step is built for (pre_apply_mix also has upstream's extra sizes)."""
    kernels = ('mhc.pre_apply_mix_fwd', 'mhc.pre_norm_fn_fwd_mul', 'mhc.pre_big_fuse', 'mhc.post_fwd')
    params = [installed_values(k, 'hidden') for k in kernels]  # pytest params (a skipped placeholder without a GPU)
    common = set.intersection(*({p.values[0] for p in ps} for ps in params))
    return [p for p in params[0] if p.values[0] in common]


def layer_params(hidden: int, seed: int = 0) -> dict:
    g = torch.Generator(device='cuda').manual_seed(seed)
    return dict(
        fn=torch.randn(ROWS, MHC * hidden, device='cuda', generator=g) * hidden**-0.5,
        scale=torch.rand(3, device='cuda', generator=g) + 0.5,
        base=torch.randn(ROWS, device='cuda', generator=g) * 0.1,
        norm_weight=torch.rand(MHC * hidden, device='cuda', generator=g) + 0.5,
    )


def residual(num_seqs: int, num_tokens: int, hidden: int) -> torch.Tensor:
    return torch.randn(num_seqs, num_tokens, MHC, hidden, device='cuda').bfloat16()


def sublayer(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A stand-in for attention or the FFN: elementwise, so that the test measures mHC, not a GEMM."""
    return (x.float() * weight).tanh().bfloat16()


def mhc_layer(ops, x, params, weight, sinkhorn_repeat=20, **pre_kwargs):
    """One sublayer with mHC around it, through `ops` (the package's modeling.mhc or the references)."""
    if ops is None:
        layer_input, (post, comb) = reference.mhc_pre_ref(
            x, params['fn'], params['scale'], params['base'], norm_weight=params.get('norm_weight'), sinkhorn_repeat=sinkhorn_repeat)
        return reference.mhc_post_ref(sublayer(layer_input, weight), x, post, comb)
    layer_input, (post, comb) = ops.mhc_pre(x, params['fn'], params['scale'], params['base'], norm_weight=params.get('norm_weight'),
                                            sinkhorn_repeat=sinkhorn_repeat, **pre_kwargs)
    return ops.mhc_post(sublayer(layer_input, weight), x, post, comb)


def leaves(params: dict) -> dict:
    return {k: v.detach().clone().requires_grad_() for k, v in params.items()}


@pytest.mark.parametrize('hidden', hidden_sizes())
def test_one_layer_forward_and_gradients_match_the_reference(hidden):
    torch.backends.cuda.matmul.allow_tf32 = True  # the kernels' GEMM is TF32, as upstream's reference test sets
    try:
        x0 = residual(1, 512, hidden)
        params = layer_params(hidden)
        weight = torch.rand(hidden, device='cuda') + 0.5
        results = []
        for ops in (mhc, None):
            x = x0.clone().requires_grad_()
            p = leaves(params)
            out = mhc_layer(ops, x, p, weight)
            out.float().square().mean().backward()
            results.append((out, x.grad, {k: v.grad for k, v in p.items()}))
        (out, x_grad, grads), (ref_out, ref_x_grad, ref_grads) = results
        torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(x_grad.float(), ref_x_grad.float(), atol=2e-3, rtol=2e-2)
        for name in ('scale', 'base'):
            torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-3, rtol=1e-2)
        torch.testing.assert_close(grads['fn'], ref_grads['fn'], atol=3e-2, rtol=1e-3)
        torch.testing.assert_close(grads['norm_weight'], ref_grads['norm_weight'], atol=3e-2, rtol=1e-2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


@pytest.mark.parametrize('hidden', hidden_sizes())
def test_fused_grad_accumulation_gives_the_unfused_gradients(hidden):
    """mhc_post's backward stashes d_residual; the pre ops add into it. With fuse_grad_acc off in
    mhc_pre_norm_fn the same sums form through autograd, in a different bf16 rounding order."""
    x0 = residual(2, 96, hidden)
    params = layer_params(hidden, seed=1)
    weight = torch.rand(hidden, device='cuda') + 0.5
    grads = []
    for fuse in (True, False):
        x = x0.clone().requires_grad_()
        p = leaves(params)
        mixes = mhc.mhc_pre_norm_fn(x, p['fn'], p['norm_weight'], 1e-6, fuse_grad_acc=fuse)
        pre, post, comb = mhc.mhc_pre_split_mixes(mixes, p['scale'], p['base'], MHC, 1.0, 1e-6)
        comb = mhc.sinkhorn_normalize(comb, 20, 1e-6)
        out = mhc.mhc_post(sublayer(mhc.mhc_pre_apply_mix(x, pre), weight), x, post, comb)
        out.float().square().mean().backward()
        assert not hasattr(x.untyped_storage(), mhc.ops.STASH) or not fuse, 'the last pre op removes the stash'
        grads.append((x.grad.float(), p['fn'].grad, p['norm_weight'].grad))
    for fused, unfused in zip(*grads):
        torch.testing.assert_close(fused, unfused, atol=1e-2, rtol=1e-2)


def test_main_grad_is_accumulated_and_no_gradient_returned():
    hidden = hidden_sizes()[0].values[0]
    x = residual(1, 64, hidden).requires_grad_()
    params = leaves(layer_params(hidden, seed=2))
    for name in ('fn', 'norm_weight'):
        params[name].main_grad = torch.ones_like(params[name])
    out = mhc_layer(mhc, x, params, torch.ones(hidden, device='cuda'))
    out.float().sum().backward()
    for name in ('fn', 'norm_weight'):
        assert params[name].grad is None, f'{name}: the gradient goes to main_grad only'
        assert not torch.equal(params[name].main_grad, torch.ones_like(params[name])), f'{name}.main_grad unchanged'


@pytest.mark.parametrize('hidden', hidden_sizes())
@pytest.mark.parametrize('num_tokens', (1, 128, 4001))
def test_grad_free_mhc_pre_is_the_fused_kernel_and_equals_the_composed_ops(hidden, num_tokens):
    x = residual(1, num_tokens, hidden)
    p = layer_params(hidden, seed=3)
    kwargs = dict(norm_eps=1e-6, post_mult_value=2.0, pre_eps=1e-6, sinkhorn_eps=1e-6, sinkhorn_repeat=20, n_splits=16)
    with torch.no_grad():
        layer_input, (post, comb) = mhc.mhc_pre(x, p['fn'], p['scale'], p['base'], **kwargs)
    with torch.enable_grad():
        grad_input, (grad_post, grad_comb) = mhc.mhc_pre(x, p['fn'], p['scale'], p['base'], **kwargs)
    assert_bitwise_equal(layer_input, grad_input.detach())
    assert_bitwise_equal(post, grad_post.detach())
    assert_bitwise_equal(comb, grad_comb.detach())


@pytest.mark.parametrize('hidden', hidden_sizes())
def test_mhc_head_matches_the_reference(hidden):
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        x = residual(2, 100, hidden)
        fn = torch.randn(MHC, MHC * hidden, device='cuda') * hidden**-0.5
        scale, base = torch.rand(1, device='cuda'), torch.randn(MHC, device='cuda')
        out = mhc.mhc_head(x, fn, scale, base)
        ref = reference.mhc_head_ref(x, fn, scale, base)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=1e-2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_two_layer_block_trains_like_the_reference():
    """A two-layer mHC block (embedding expansion, two sublayers, head) trained for a few SGD steps from the
    same start: the loss curves agree within the kernels' tolerance."""
    hidden = 4096 if any(v.values[0] == 4096 for v in hidden_sizes()) else hidden_sizes()[0].values[0]
    torch.manual_seed(0)
    embedding = torch.randn(2, 256, hidden, device='cuda').bfloat16()
    target = torch.randn(2, 256, hidden, device='cuda')
    start = [layer_params(hidden, seed=10 + i) for i in range(2)]
    head_fn = torch.randn(MHC, MHC * hidden, device='cuda') * hidden**-0.5
    weights = [torch.rand(hidden, device='cuda') + 0.5 for _ in range(2)]
    curves = []
    torch.backends.cuda.matmul.allow_tf32 = True  # the reference's GEMMs in TF32, like the kernels'
    for ops in (mhc, None):
        layers = [leaves(p) for p in start]
        head = head_fn.clone().requires_grad_()
        losses = []
        for _ in range(5):
            x = mhc.expand_from_embedding(embedding) if ops else reference.expand_to_mhc_ref(embedding, MHC)
            for p, w in zip(layers, weights):
                x = mhc_layer(ops, x, p, w)
            ones, zeros = torch.ones(1, device='cuda'), torch.zeros(MHC, device='cuda')
            out = mhc.mhc_head(x, head, ones, zeros) if ops else reference.mhc_head_ref(x, head, ones, zeros)
            loss = (out.float() - target).square().mean()
            loss.backward()
            with torch.no_grad():
                for tensor in [head] + [v for p in layers for v in p.values()]:
                    tensor -= 0.5 * tensor.grad
                    tensor.grad = None
            losses.append(loss.item())
        curves.append(losses)
    torch.backends.cuda.matmul.allow_tf32 = False
    ours, ref = curves
    assert ours[-1] < ours[0], f'the loss does not fall: {ours}'
    for a, b in zip(ours, ref):
        assert abs(a - b) <= 2e-3 * abs(b), f'loss curves differ: {ours} vs {ref}'
