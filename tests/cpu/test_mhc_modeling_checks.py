"""The mHC modeling layer without a GPU: upstream's names are all there, and bad input is refused by the
raw op underneath before any device is touched."""

from __future__ import annotations

import pytest
import torch

UPSTREAM_OPS = ('expand_to_mhc', 'mhc_head_compute_mix', 'mhc_multilayer_recompute', 'mhc_pre_norm_fn', 'mhc_post',
                'mhc_post_bwd', 'mhc_post_fwd', 'mhc_pre_apply_mix', 'mhc_pre_big_fuse', 'mhc_pre_split_mixes',
                'sinkhorn_normalize')
UPSTREAM_COMPOSITES = ('expand_from_embedding', 'mhc_head', 'mhc_pre')
UPSTREAM_REFERENCES = ('expand_to_mhc_ref', 'mhc_head_compute_mix_ref', 'mhc_post_ref', 'mhc_pre_apply_mix_ref',
                       'mhc_pre_norm_fn_ref', 'mhc_pre_split_mixes_ref', 'sinkhorn_normalize_ref')


def test_upstream_names_are_importable_from_the_same_places():
    import tile_kernels_aot
    from tile_kernels_aot.modeling import mhc
    from tile_kernels_aot.modeling.mhc import ops
    import tile_kernels_aot.torch.mhc as torch_mhc

    assert tile_kernels_aot.modeling.mhc is mhc
    for name in UPSTREAM_OPS:
        assert callable(getattr(ops, name)) and getattr(mhc, name) is getattr(ops, name), name
    for name in UPSTREAM_COMPOSITES:
        assert callable(getattr(mhc, name)), name
    for name in UPSTREAM_REFERENCES:
        assert callable(getattr(torch_mhc, name)) and getattr(tile_kernels_aot.reference, name) is getattr(torch_mhc, name), name
    for name in ('mhc_post_fwd', 'mhc_post_bwd', 'mhc_multilayer_recompute', 'round_to_tf32'):
        assert callable(getattr(tile_kernels_aot.mhc, name)), name


def test_composites_refuse_cpu_tensors_before_any_launch():
    from tile_kernels_aot.modeling import mhc

    residual = torch.zeros(1, 8, 4, 1280, dtype=torch.bfloat16)
    fn, scale, base = torch.zeros(24, 4 * 1280), torch.ones(3), torch.zeros(24)
    with pytest.raises(ValueError, match='must be on a CUDA device'):
        mhc.mhc_pre(residual, fn, scale, base)
    with torch.no_grad(), pytest.raises(ValueError, match='must be on a CUDA device'):
        mhc.mhc_pre(residual, fn, scale, base)
    with pytest.raises(ValueError, match='must be on a CUDA device'):
        mhc.expand_from_embedding(torch.zeros(8, 1280, dtype=torch.bfloat16))


def test_composites_name_the_op_and_argument_of_bad_input():
    from tile_kernels_aot.modeling import mhc

    residual = torch.zeros(1, 8, 4, 1280, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match='residual.*bfloat16'):
        mhc.mhc_pre(residual.float(), torch.zeros(24, 4 * 1280), torch.ones(3), torch.zeros(24))
    with pytest.raises(ValueError, match='fn'):
        mhc.mhc_pre(residual, torch.zeros(24, 4 * 1024), torch.ones(3), torch.zeros(24))


def test_the_reference_layer_step_runs_on_cpu_and_mixes_streams():
    """The references define the math the GPU tests hold the kernels to; a smoke check that the composed step
    has the documented shapes and that Sinkhorn leaves a doubly stochastic matrix."""
    from tile_kernels_aot import reference

    residual = torch.randn(2, 3, 4, 256).bfloat16()
    layer_input, (post, comb) = reference.mhc_pre_ref(residual, torch.randn(24, 1024) * 0.03, torch.ones(3), torch.zeros(24),
                                                      sinkhorn_repeat=20)
    assert layer_input.shape == (2, 3, 256) and layer_input.dtype == torch.bfloat16
    assert post.shape == (2, 3, 4, 1) and comb.shape == (2, 3, 4, 4)
    torch.testing.assert_close(comb.sum(-2), torch.ones(2, 3, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(comb.sum(-1), torch.ones(2, 3, 4), atol=1e-3, rtol=0)
    out = reference.mhc_post_ref(layer_input, residual, post, comb)
    assert out.shape == residual.shape and out.dtype == torch.bfloat16


def test_the_reference_layer_step_takes_zero_tokens():
    from tile_kernels_aot import reference

    residual = torch.empty(0, 3, 4, 256).bfloat16()
    layer_input, (post, comb) = reference.mhc_pre_ref(residual, torch.randn(24, 1024), torch.ones(3), torch.zeros(24))
    assert layer_input.shape == (0, 3, 256) and post.shape == (0, 3, 4, 1) and comb.shape == (0, 3, 4, 4)


class _Looked(BaseException):
    """A binary was looked up: the call got past the checks of the op that runs first."""


@pytest.fixture
def past_the_device(monkeypatch):
    """CPU tensors pass the device check, and looking up any binary raises _Looked: a composite must then refuse bad
    input to any of its ops before its first op chooses (and would launch) a binary."""
    from tile_kernels_aot import _checks, _select

    def looked(*args, **kwargs):
        raise _Looked('a binary was looked up')

    _select.reset()  # no binary found before this test
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    monkeypatch.setattr(_select, 'package_for_device', looked)


def _pre_args(**changes):
    args = dict(residual=torch.zeros(1, 8, 4, 1280, dtype=torch.bfloat16), fn=torch.zeros(24, 4 * 1280), scale=torch.ones(3),
                base=torch.zeros(24), norm_weight=torch.ones(4 * 1280), mhc_mult=4, pre_eps=1e-6, sinkhorn_eps=1e-6,
                sinkhorn_repeat=20)
    return {**args, **changes}


@pytest.mark.parametrize('changes, error', [
    (dict(scale=torch.ones(2)), 'scale'), (dict(scale=[1.0, 1.0, 1.0]), 'scale'), (dict(base=torch.zeros(24).bfloat16()), 'base'),
    (dict(mhc_mult=5), 'mhc_mult'), (dict(mhc_mult=-1), 'mhc_mult'), (dict(mhc_mult=4.0), 'mhc_mult'),
    (dict(pre_eps=float('nan')), 'pre_eps'), (dict(sinkhorn_repeat=0), 'sinkhorn_repeat'),
    (dict(residual=[0.0]), 'residual'), (dict(residual=torch.zeros(1, 8, 4, 1280)), 'residual'),
])
def test_mhc_pre_refuses_bad_input_to_any_of_its_ops_before_the_first_chooses_a_binary(past_the_device, changes, error):
    from tile_kernels_aot.modeling import mhc

    args = _pre_args(**changes)
    with pytest.raises((TypeError, ValueError), match=f'mhc_pre.*{error}'):
        mhc.mhc_pre(args.pop('residual'), args.pop('fn'), args.pop('scale'), args.pop('base'), **args)
    args = _pre_args()
    with pytest.raises(_Looked):  # the valid call gets as far as a binary
        mhc.mhc_pre(args.pop('residual'), args.pop('fn'), args.pop('scale'), args.pop('base'), **args)


@pytest.mark.parametrize('changes, error', [(dict(scale=torch.ones(2)), 'scale'), (dict(base=torch.zeros(5)), 'base'),
                                            (dict(pre_eps=float('inf')), 'pre_eps')])
def test_mhc_head_refuses_bad_input_to_any_of_its_ops_before_the_first_chooses_a_binary(past_the_device, changes, error):
    from tile_kernels_aot.modeling import mhc

    args = {'scale': torch.ones(1), 'base': torch.zeros(4), 'pre_eps': 1e-6, **changes}
    with pytest.raises((TypeError, ValueError), match=f'mhc_head.*{error}'):
        mhc.mhc_head(torch.zeros(8, 4, 1280, dtype=torch.bfloat16), torch.zeros(4, 4 * 1280), args.pop('scale'), args.pop('base'),
                     norm_weight=torch.ones(4 * 1280), **args)
