"""The mHC stream kernels (expand, pre_apply_mix, post, multilayer_recompute): forward and backward against torch
autograd of tile_kernels_aot.reference with upstream's tolerances, every installed spec, token counts from 0 up, outputs
over poisoned memory; multilayer_recompute bit for bit equal to the loop of mhc_pre_apply_mix_fwd and mhc_post_fwd,
and captured in a CUDA graph without a host sync.

Each backward reduction (mix_grad, d_post, d_comb) sums a token's row in one block, so no result depends on the SM
count and there is no SM sweep here.
"""

from __future__ import annotations

import pytest
import torch

from tile_kernels_aot import reference
from tile_kernels_aot.mhc.expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from tile_kernels_aot.mhc.multilayer_recompute import mhc_multilayer_recompute
from tile_kernels_aot.mhc.post import mhc_post_bwd, mhc_post_fwd
from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd

from .helpers import assert_bitwise_equal, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu

TOKENS = (0, 1, 4001, 8192)
LAYER_COUNTS = ((1, 1), (3, 2), (10, 9), (10, 10))  # (L, Lp) of multilayer_recompute
APPLY_MIX_TOL = dict(atol=1e-2, rtol=1e-3)  # upstream's pre_apply_mix tolerance, forward and backward
MIX_GRAD_TOL = dict(atol=1e-4, rtol=1e-4)  # upstream's post mix-gradient tolerance


@pytest.fixture(autouse=True)
def exact_fp32_matmul():
    """The references' einsums in full fp32 (another test module may leave TF32 on)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def bf16(*shape):
    return torch.randn(*shape, device='cuda').bfloat16()


def mixes(tokens, mhc, cols=1):
    """Weights as the pre step gives them: positive, about 1 / mhc a stream (comb is doubly stochastic-like)."""
    return torch.rand(1, tokens, mhc, cols, device='cuda') * (2 / mhc)


def poisoned(*shape, dtype=torch.bfloat16):
    """A tensor of NaN bytes, for outputs the op writes into."""
    t = torch.empty(*shape, dtype=dtype, device='cuda')
    t.view(torch.uint8).fill_(0xFF)
    return t


# -- expand -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('spec', installed_specs('mhc.expand_to_mhc_fwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_expand_forward_is_a_copy(spec, tokens):
    mhc, h = spec['mhc'], spec['hidden']
    x = bf16(1, tokens, h)
    poison_allocator(((1, tokens, mhc, h), torch.bfloat16))
    assert_bitwise_equal(expand_to_mhc_fwd(x, mhc), reference.expand_to_mhc_ref(x, mhc))
    out = poisoned(1, tokens, mhc, h)
    assert expand_to_mhc_fwd(x, mhc, out=out) is out
    assert_bitwise_equal(out, reference.expand_to_mhc_ref(x, mhc))


@pytest.mark.parametrize('spec', installed_specs('mhc.expand_to_mhc_bwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_expand_backward_matches_autograd(spec, tokens):
    mhc, h = spec['mhc'], spec['hidden']
    x = bf16(1, tokens, h).requires_grad_()
    grad = bf16(1, tokens, mhc, h)
    reference.expand_to_mhc_ref(x, mhc).backward(grad)
    poison_allocator(((1, tokens, h), torch.bfloat16))
    ours = expand_to_mhc_bwd(grad)
    assert ours.shape == x.shape and ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, x.grad)


# -- pre_apply_mix ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_apply_mix_fwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_pre_apply_mix_forward(spec, tokens):
    mhc, h = spec['mhc'], spec['hidden']
    x, mix = bf16(1, tokens, mhc, h), mixes(tokens, mhc)
    poison_allocator(((1, tokens, h), torch.bfloat16))
    out = mhc_pre_apply_mix_fwd(x, mix)
    torch.testing.assert_close(out, reference.mhc_pre_apply_mix_ref(x, mix), **APPLY_MIX_TOL)
    given = poisoned(1, tokens, h)
    assert mhc_pre_apply_mix_fwd(x, mix, out=given) is given
    assert_bitwise_equal(given, out)


@pytest.mark.parametrize('spec', installed_specs('mhc.pre_apply_mix_bwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_pre_apply_mix_backward_matches_autograd_and_accumulates(spec, tokens):
    mhc, h = spec['mhc'], spec['hidden']
    x, mix, o_grad = bf16(1, tokens, mhc, h).requires_grad_(), mixes(tokens, mhc).requires_grad_(), bf16(1, tokens, h)
    reference.mhc_pre_apply_mix_ref(x, mix).backward(o_grad)
    x_grad = torch.zeros_like(x)
    poison_allocator(((1, tokens, mhc, 1), torch.float32))
    mix_grad = mhc_pre_apply_mix_bwd(o_grad, x.detach(), mix.detach(), x_grad)
    torch.testing.assert_close(mix_grad, mix.grad, **APPLY_MIX_TOL)
    torch.testing.assert_close(x_grad, x.grad, **APPLY_MIX_TOL)
    # Into a buffer that already holds a gradient (the stash of mhc_post's backward): added in fp32, rounded once (so
    # the expectation is formed in fp32 too: x.grad, already rounded, would round twice where the sum cancels).
    before = bf16(1, tokens, mhc, h)
    x_grad = before.clone()
    mhc_pre_apply_mix_bwd(o_grad, x.detach(), mix.detach(), x_grad)
    torch.testing.assert_close(x_grad, (before.float() + mix.detach() * o_grad.float().unsqueeze(-2)).bfloat16())


# -- post ---------------------------------------------------------------------------------------------------------


def post_inputs(tokens, mhc, h):
    return bf16(1, tokens, h), bf16(1, tokens, mhc, h), mixes(tokens, mhc), mixes(tokens, mhc, mhc)


@pytest.mark.parametrize('spec', installed_specs('mhc.post_fwd'))
@pytest.mark.parametrize('tokens', TOKENS)
def test_post_forward(spec, tokens):
    mhc, h = spec['mhc'], spec['hidden']
    args = post_inputs(tokens, mhc, h)
    poison_allocator(((1, tokens, mhc, h), torch.bfloat16))
    out = mhc_post_fwd(*args)
    torch.testing.assert_close(out, reference.mhc_post_ref(*args))
    given = poisoned(1, tokens, mhc, h)
    assert mhc_post_fwd(*args, out=given) is given
    assert_bitwise_equal(given, out)
    in_place = args[1].clone()  # out may be the residual itself
    mhc_post_fwd(args[0], in_place, *args[2:], out=in_place)
    assert_bitwise_equal(in_place, out)


@pytest.mark.parametrize('spec', installed_specs('mhc.post_bwd'))
@pytest.mark.parametrize('tokens', TOKENS)
@pytest.mark.parametrize('fuse_grad_acc', (True, False))
def test_post_backward_matches_autograd(spec, tokens, fuse_grad_acc):
    mhc, h = spec['mhc'], spec['hidden']
    leaves = [t.requires_grad_() for t in post_inputs(tokens, mhc, h)]
    d_o = bf16(1, tokens, mhc, h)
    reference.mhc_post_ref(*leaves).backward(d_o)
    x, residual, post_mix, comb_mix = (t.detach() for t in leaves)
    poison_allocator(((1, tokens, h), torch.bfloat16), ((1, tokens, mhc, h), torch.bfloat16), ((1, tokens, mhc, 1), torch.float32),
                     ((1, tokens, mhc, mhc), torch.float32))
    d_x, d_residual, d_post, d_comb = mhc_post_bwd(x, residual, post_mix, comb_mix, d_o, fuse_grad_acc=fuse_grad_acc)
    torch.testing.assert_close(d_x, leaves[0].grad)
    torch.testing.assert_close(d_residual, leaves[1].grad)
    torch.testing.assert_close(d_post, leaves[2].grad, **MIX_GRAD_TOL)
    torch.testing.assert_close(d_comb, leaves[3].grad, **MIX_GRAD_TOL)
    stash = getattr(residual.untyped_storage(), 'grad_from_mhc_post', None)
    assert (stash is d_residual) if fuse_grad_acc else stash is None


def test_post_backward_takes_a_non_contiguous_gradient():
    spec = installed_specs('mhc.post_bwd')[0].values[0]
    mhc, h = spec['mhc'], spec['hidden']
    args = post_inputs(64, mhc, h)
    d_o = bf16(64, 1, mhc, h).transpose(0, 1)
    expected = mhc_post_bwd(*args, d_o.contiguous(), fuse_grad_acc=False)
    for ours, theirs in zip(mhc_post_bwd(*args, d_o, fuse_grad_acc=False), expected):
        assert_bitwise_equal(ours, theirs)


# -- multilayer_recompute -----------------------------------------------------------------------------------------


def recompute_inputs(tokens, mhc, h, num_layers, num_post):
    return dict(
        initial_residual=bf16(1, tokens, mhc, h),
        pre_mix_list=[mixes(tokens, mhc) for _ in range(num_layers)],
        layer_output_list=[bf16(1, tokens, h) for _ in range(num_post)],
        post_mix_list=[mixes(tokens, mhc) for _ in range(num_post)],
        comb_mix_list=[mixes(tokens, mhc, mhc) for _ in range(num_post)],
        layer_input_list=[poisoned(1, tokens, h) for _ in range(num_layers)],
        residual_list=[poisoned(1, tokens, mhc, h) for _ in range(num_post)],
    )


def layer_loop(inputs):
    """What multilayer_recompute replaces: the ops one layer at a time."""
    res, layer_inputs, residuals = inputs['initial_residual'], [], []
    for i, pre in enumerate(inputs['pre_mix_list']):
        layer_inputs.append(mhc_pre_apply_mix_fwd(res, pre))
        if i < len(inputs['layer_output_list']):
            res = mhc_post_fwd(inputs['layer_output_list'][i], res, inputs['post_mix_list'][i], inputs['comb_mix_list'][i])
            residuals.append(res)
    return layer_inputs, residuals


def assert_recomputed(inputs):
    layer_inputs, residuals = layer_loop(inputs)
    assert len(layer_inputs) == len(inputs['layer_input_list']) and len(residuals) == len(inputs['residual_list'])
    for ours, loop in zip(inputs['layer_input_list'] + inputs['residual_list'], layer_inputs + residuals):
        assert_bitwise_equal(ours, loop)


@pytest.mark.parametrize('spec', installed_specs('mhc.multilayer_recompute'))
@pytest.mark.parametrize('tokens', TOKENS)
@pytest.mark.parametrize('num_layers, num_post', LAYER_COUNTS)
def test_multilayer_recompute_is_the_layer_loop_bit_for_bit(spec, tokens, num_layers, num_post):
    inputs = recompute_inputs(tokens, spec['mhc'], spec['hidden'], num_layers, num_post)
    assert mhc_multilayer_recompute(**inputs) is None
    assert_recomputed(inputs)


def test_multilayer_recompute_never_syncs_and_replays_in_a_cuda_graph():
    spec = installed_specs('mhc.multilayer_recompute')[0].values[0]
    inputs = recompute_inputs(4001, spec['mhc'], spec['hidden'], 10, 9)
    mhc_multilayer_recompute(**inputs)  # loads the binary (a first call may synchronise, later ones must not)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        mhc_multilayer_recompute(**inputs)
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert_recomputed(inputs)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mhc_multilayer_recompute(**inputs)
    # New values in the captured inputs, poison in the outputs: the replay must recompute everything from them.
    fresh = recompute_inputs(4001, spec['mhc'], spec['hidden'], 10, 9)
    inputs['initial_residual'].copy_(fresh['initial_residual'])
    for name in ('pre_mix_list', 'layer_output_list', 'post_mix_list', 'comb_mix_list'):
        for static, new in zip(inputs[name], fresh[name]):
            static.copy_(new)
    for t in inputs['layer_input_list'] + inputs['residual_list']:
        t.view(torch.uint8).fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()
    assert_recomputed(inputs)
