"""The mHC stream ops (expand, pre_apply_mix, post, multilayer_recompute) refuse bad arguments with CPU tensors, naming
the op and the argument, before any device is touched; misaligned pointers once the binary is known; an unbuilt
shape with SpecNotPrebuiltError."""

import json
import types

import pytest
import torch

from tile_kernels_aot import _checks, _select
from tile_kernels_aot.errors import SpecNotPrebuiltError
from tile_kernels_aot.mhc import expand, multilayer_recompute, post, pre_apply_mix
from tile_kernels_aot.mhc.expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from tile_kernels_aot.mhc.multilayer_recompute import mhc_multilayer_recompute
from tile_kernels_aot.mhc.post import mhc_post_bwd, mhc_post_fwd
from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd

MHC, H, LEAD = 4, 1280, (2, 3)
BF16, F32 = torch.bfloat16, torch.float32


def streams(*lead, mhc=MHC, h=H):
    return torch.zeros(*(lead or LEAD), mhc, h, dtype=BF16)


def rows(*lead, h=H):
    return torch.zeros(*(lead or LEAD), h, dtype=BF16)


def mix(*lead, cols=1, mhc=MHC, dtype=F32):
    return torch.zeros(*(lead or LEAD), mhc, cols, dtype=dtype)


def post_args():
    return rows(), streams(), mix(), mix(cols=MHC)


def layers(num_layers, num_post):
    return ([mix() for _ in range(num_layers)], [rows() for _ in range(num_post)], [mix() for _ in range(num_post)],
            [mix(cols=MHC) for _ in range(num_post)], [rows() for _ in range(num_layers)], [streams() for _ in range(num_post)])


def misaligned(t):
    """t's values at an address 2 bytes past an aligned one."""
    flat = torch.zeros(t.numel() + 1, dtype=t.dtype)
    return flat[1:].view(t.shape)


CASES = [
    # (callable, exception, message)
    (lambda: expand_to_mhc_fwd([1.0], 4), TypeError, 'expand_to_mhc_fwd: hidden must be a torch.Tensor'),
    (lambda: expand_to_mhc_fwd(rows().float(), 4), TypeError, 'expand_to_mhc_fwd: hidden must be bfloat16, got float32'),
    (lambda: expand_to_mhc_fwd(rows(), 0), ValueError, r'expand_to_mhc_fwd: mhc_mult must be >= 1, got 0'),
    (lambda: expand_to_mhc_fwd(rows(), 4.0), TypeError, 'expand_to_mhc_fwd: mhc_mult must be an int'),
    (lambda: expand_to_mhc_fwd(streams()[..., 0, :], 4), ValueError, 'expand_to_mhc_fwd: hidden must be contiguous'),
    (lambda: expand_to_mhc_fwd(rows(), 4, out=streams(mhc=2)), ValueError, r'expand_to_mhc_fwd: out must have shape \(2, 3, 4, 1280\)'),
    (lambda: expand_to_mhc_fwd(rows(), 4, out=streams().float()), TypeError, 'expand_to_mhc_fwd: out must be bfloat16'),
    (lambda: expand_to_mhc_fwd(rows(), 4, out=streams().transpose(-1, -2).contiguous().transpose(-1, -2)), ValueError,
     'expand_to_mhc_fwd: out must be contiguous'),
    (lambda: expand_to_mhc_fwd(rows(), 4), ValueError, 'expand_to_mhc_fwd: hidden must be on a CUDA device, got cpu'),
    (lambda: expand_to_mhc_bwd(rows()[0, 0]), ValueError, 'expand_to_mhc_bwd: out_grad must have 2 or 3 or'),
    (lambda: expand_to_mhc_bwd(streams().half()), TypeError, 'expand_to_mhc_bwd: out_grad must be bfloat16, got float16'),
    (lambda: expand_to_mhc_bwd(streams()), ValueError, 'expand_to_mhc_bwd: out_grad must be on a CUDA device'),

    (lambda: mhc_pre_apply_mix_fwd(streams().float(), mix()), TypeError, 'mhc_pre_apply_mix_fwd: x must be bfloat16'),
    (lambda: mhc_pre_apply_mix_fwd(streams(), mix(dtype=BF16)), TypeError, 'mhc_pre_apply_mix_fwd: mix must be float32'),
    (lambda: mhc_pre_apply_mix_fwd(streams(), mix(mhc=2)), ValueError, r'mhc_pre_apply_mix_fwd: mix must have shape \(2, 3, 4, 1\)'),
    (lambda: mhc_pre_apply_mix_fwd(streams(), mix(2, 4)), ValueError, r"mhc_pre_apply_mix_fwd: mix must have shape \(2, 3, 4, 1\) \(x's token dims"),
    (lambda: mhc_pre_apply_mix_fwd(streams(), mix()[..., 0]), ValueError, 'mhc_pre_apply_mix_fwd: mix must have shape'),
    (lambda: mhc_pre_apply_mix_fwd(streams().transpose(0, 1), mix().transpose(0, 1)), ValueError, 'mhc_pre_apply_mix_fwd: x must be contiguous'),
    (lambda: mhc_pre_apply_mix_fwd(streams(), mix(), out=rows(h=H + 8)), ValueError, r'mhc_pre_apply_mix_fwd: out must have shape \(2, 3, 1280\)'),
    (lambda: mhc_pre_apply_mix_fwd(streams(), mix()), ValueError, 'mhc_pre_apply_mix_fwd: x must be on a CUDA device'),
    (lambda: mhc_pre_apply_mix_bwd(rows(h=64), streams(), mix(), streams()), ValueError, r'mhc_pre_apply_mix_bwd: o_grad must have shape \(2, 3, 1280\)'),
    (lambda: mhc_pre_apply_mix_bwd(rows(), streams(), mix(), streams().float()), TypeError, 'mhc_pre_apply_mix_bwd: x_grad must be bfloat16'),
    (lambda: mhc_pre_apply_mix_bwd(rows(), streams(), mix(), streams(mhc=2)), ValueError, 'mhc_pre_apply_mix_bwd: x_grad must have shape'),
    (lambda: mhc_pre_apply_mix_bwd(rows(), streams(), mix(), streams(3, 2).transpose(0, 1)), ValueError,
     'mhc_pre_apply_mix_bwd: x_grad must be contiguous'),
    (lambda: mhc_pre_apply_mix_bwd(rows(), streams(), mix(), streams()), ValueError, 'mhc_pre_apply_mix_bwd: o_grad must be on a CUDA device'),

    (lambda: mhc_post_fwd(rows(), streams(), mix(), mix(cols=2)), ValueError, r'mhc_post_fwd: comb_res_mix must have shape \(2, 3, 4, 4\)'),
    (lambda: mhc_post_fwd(rows(), streams(), mix(mhc=2), mix(cols=MHC)), ValueError, 'mhc_post_fwd: post_layer_mix must have shape'),
    (lambda: mhc_post_fwd(rows(h=H - 8), streams(), mix(), mix(cols=MHC)), ValueError, r'mhc_post_fwd: x must have shape \(2, 3, 1280\)'),
    (lambda: mhc_post_fwd(rows(3, 2), streams(), mix(), mix(cols=MHC)), ValueError, r"mhc_post_fwd: x must have shape \(2, 3, 1280\) \(residual's token"),
    (lambda: mhc_post_fwd(rows().float(), streams(), mix(), mix(cols=MHC)), TypeError, 'mhc_post_fwd: x must be bfloat16'),
    (lambda: mhc_post_fwd(rows(), streams(), mix().double(), mix(cols=MHC)), TypeError, 'mhc_post_fwd: post_layer_mix must be float32'),
    (lambda: mhc_post_fwd(rows(), streams(), mix(), mix(cols=MHC).transpose(-1, -2)), ValueError, 'mhc_post_fwd: comb_res_mix must be contiguous'),
    (lambda: mhc_post_fwd(*post_args(), out=rows()[0, 0]), ValueError, 'mhc_post_fwd: out must have 2 or'),
    (lambda: mhc_post_fwd(*post_args(), out=streams(mhc=2)), ValueError, r"mhc_post_fwd: out must have shape \(2, 3, 4, 1280\) \(residual's shape\)"),
    (lambda: mhc_post_fwd(*post_args()), ValueError, 'mhc_post_fwd: x must be on a CUDA device'),
    (lambda: mhc_post_bwd(*post_args(), streams(mhc=2)), ValueError, r'mhc_post_bwd: d_o must have shape \(2, 3, 4, 1280\)'),
    (lambda: mhc_post_bwd(*post_args(), streams().float()), TypeError, 'mhc_post_bwd: d_o must be bfloat16'),
    (lambda: mhc_post_bwd(*post_args(), streams(), fuse_grad_acc=1), TypeError, 'mhc_post_bwd: fuse_grad_acc must be a bool'),
    (lambda: mhc_post_bwd(*post_args(), streams()), ValueError, 'mhc_post_bwd: x must be on a CUDA device'),

    (lambda: mhc_multilayer_recompute(streams(), *layers(0, 0)), ValueError, 'mhc_multilayer_recompute: pre_mix_list must hold at least one layer'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(3, 1)), ValueError, 'mhc_multilayer_recompute: layer_output_list must hold L or L - 1'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 3)), ValueError, 'mhc_multilayer_recompute: layer_output_list must hold L or L - 1'),
    (lambda: mhc_multilayer_recompute(streams(), mix(), *layers(1, 1)[1:]), TypeError, 'mhc_multilayer_recompute: pre_mix_list must be a list'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 2)[:4], [rows()], [streams()] * 2), ValueError,
     r'mhc_multilayer_recompute: layer_input_list must hold 2 tensors \(as pre_mix_list\), got 1'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 2)[:5], [streams()]), ValueError,
     r'mhc_multilayer_recompute: residual_list must hold 2 tensors \(as layer_output_list\)'),
    (lambda: mhc_multilayer_recompute(streams(), [mix(), mix(mhc=2)], *layers(2, 2)[1:]), ValueError,
     r'mhc_multilayer_recompute: pre_mix_list\[1\] must have shape \(2, 3, 4, 1\)'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 1)[:4], [rows(), rows().float()], [streams()]), TypeError,
     r'mhc_multilayer_recompute: layer_input_list\[1\] must be bfloat16'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 1)[:5], [streams(3, 2).transpose(0, 1)]), ValueError,
     r'mhc_multilayer_recompute: residual_list\[0\] must be contiguous'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 1)[:3], [mix(cols=2)], *layers(2, 1)[4:]), ValueError,
     r'mhc_multilayer_recompute: comb_mix_list\[0\] must have shape \(2, 3, 4, 4\)'),
    (lambda: mhc_multilayer_recompute(streams().float(), *layers(1, 1)), TypeError, 'mhc_multilayer_recompute: initial_residual must be bfloat16'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 1)), ValueError, 'mhc_multilayer_recompute: initial_residual must be on a CUDA device'),
]


@pytest.mark.parametrize('index', range(len(CASES)))
def test_bad_arguments_name_the_op_and_argument(index):
    call, error, message = CASES[index]
    with pytest.raises(error, match=message):
        call()


class _NoLaunch:
    """What find_kernel returns in these tests: the constants of a stream kernel's manifest entry; launching fails."""

    entry = types.SimpleNamespace(constants={'vector_alignment': 16, 'mix_alignment': 16})

    def __call__(self, *args, **kwargs):
        raise AssertionError('the op launched a kernel on bad input')


@pytest.fixture
def past_the_device_check(monkeypatch):
    """CPU tensors pass the device check (device 0) and find_kernel answers with _NoLaunch: the checks after it run."""
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    for module in (expand, pre_apply_mix, post, multilayer_recompute):
        monkeypatch.setattr(module, 'find_kernel', lambda kernel, params, device: _NoLaunch())


ALIGNMENT_CASES = [
    (lambda: expand_to_mhc_fwd(misaligned(rows()), 4), 'expand_to_mhc_fwd: hidden must be 16-byte aligned'),
    (lambda: expand_to_mhc_fwd(rows(), 4, out=misaligned(streams())), 'expand_to_mhc_fwd: out must be 16-byte aligned'),
    (lambda: expand_to_mhc_bwd(misaligned(streams())), 'expand_to_mhc_bwd: out_grad must be 16-byte aligned'),
    (lambda: mhc_pre_apply_mix_fwd(misaligned(streams()), mix()), 'mhc_pre_apply_mix_fwd: x must be 16-byte aligned'),
    (lambda: mhc_pre_apply_mix_fwd(streams(), misaligned(mix())), 'mhc_pre_apply_mix_fwd: mix must be 16-byte aligned'),
    (lambda: mhc_pre_apply_mix_bwd(rows(), streams(), mix(), misaligned(streams())), 'mhc_pre_apply_mix_bwd: x_grad must be 16-byte aligned'),
    (lambda: mhc_post_fwd(rows(), streams(), mix(), misaligned(mix(cols=MHC))), 'mhc_post_fwd: comb_res_mix must be 16-byte aligned'),
    (lambda: mhc_post_fwd(*post_args(), out=misaligned(streams())), 'mhc_post_fwd: out must be 16-byte aligned'),
    (lambda: mhc_post_bwd(misaligned(rows()), *post_args()[1:], streams()), 'mhc_post_bwd: x must be 16-byte aligned'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 1)[:4], [rows(), misaligned(rows())], [streams()]),
     r'mhc_multilayer_recompute: layer_input_list\[1\] must be 16-byte aligned'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(2, 2)[:2], [mix(), misaligned(mix())], *layers(2, 2)[3:]),
     r'mhc_multilayer_recompute: post_mix_list\[1\] must be 16-byte aligned'),
]


@pytest.mark.parametrize('index', range(len(ALIGNMENT_CASES)))
def test_misaligned_pointers_are_refused_before_a_launch(past_the_device_check, index):
    call, message = ALIGNMENT_CASES[index]
    with pytest.raises(ValueError, match=message):
        call()


def test_zero_tokens_return_empty_outputs_without_a_kernel(past_the_device_check, monkeypatch):
    def no_kernel(*args):
        raise AssertionError('a kernel was looked up for zero tokens')

    for module in (expand, pre_apply_mix, post, multilayer_recompute):
        monkeypatch.setattr(module, 'find_kernel', no_kernel)
    assert expand_to_mhc_fwd(rows(0, 3), 4).shape == (0, 3, 4, H)
    assert expand_to_mhc_bwd(streams(3, 0)).shape == (3, 0, H)
    assert mhc_pre_apply_mix_fwd(streams(0), mix(0)).shape == (0, H)
    assert mhc_pre_apply_mix_bwd(rows(0), streams(0), mix(0), streams(0)).shape == (0, MHC, 1)
    assert mhc_post_fwd(rows(0), streams(0), mix(0), mix(0, cols=MHC)).shape == (0, MHC, H)
    residual = streams(0)
    grads = mhc_post_bwd(rows(0), residual, mix(0), mix(0, cols=MHC), streams(0))
    assert [g.shape for g in grads] == [(0, H), (0, MHC, H), (0, MHC, 1), (0, MHC, MHC)]
    assert residual.untyped_storage().grad_from_mhc_post is grads[1]
    empty = streams(0)
    assert mhc_multilayer_recompute(empty, [mix(0)], [], [], [], [rows(0)], []) is None


@pytest.fixture
def device_without_mhc(tmp_path, monkeypatch):
    """A faked sm_90a device whose arch package has no mHC binaries; CPU tensors pass the device check."""
    root = tmp_path / 'sm_90a'
    root.mkdir()
    manifest = {'schema': 2, 'target': 'sm_90a', 'package': 'tile_kernels_aot_sm90a', 'version': '0', 'provenance': {}, 'kernels': {}}
    (root / 'manifest.json').write_text(json.dumps(manifest))
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    _select.reset()
    yield
    _select.reset()


@pytest.mark.parametrize('call, kernel', [
    (lambda: expand_to_mhc_fwd(rows(h=1000), 4), 'mhc.expand_to_mhc_fwd'),
    (lambda: expand_to_mhc_bwd(streams(mhc=3)), 'mhc.expand_to_mhc_bwd'),
    (lambda: mhc_pre_apply_mix_fwd(streams(h=1000), mix()), 'mhc.pre_apply_mix_fwd'),
    (lambda: mhc_pre_apply_mix_bwd(rows(), streams(), mix(), streams()), 'mhc.pre_apply_mix_bwd'),
    (lambda: mhc_post_fwd(*post_args()), 'mhc.post_fwd'),
    (lambda: mhc_post_bwd(*post_args(), streams()), 'mhc.post_bwd'),
    (lambda: mhc_multilayer_recompute(streams(), *layers(1, 1)), 'mhc.multilayer_recompute'),
])
def test_unbuilt_shape_raises_spec_not_prebuilt(device_without_mhc, call, kernel):
    with pytest.raises(SpecNotPrebuiltError, match=f'{kernel} has no prebuilt sm_90a binary') as info:
        call()
    assert info.value.kernel == kernel


def test_prebuilt_specs_cover_the_models():
    """Every (mhc, hidden) of kernel_src.models is prebuilt; expand also at upstream's stream counts, pre_apply_mix at
    its extra hidden size; the row split covers each model row with less than one slice of idle threads."""
    pytest.importorskip('tilelang')
    from kernel_src.mhc import expand as expand_src
    from kernel_src.mhc import multilayer_recompute as recompute_src
    from kernel_src.mhc import post as post_src
    from kernel_src.mhc import pre_apply_mix as mix_src
    from kernel_src.mhc.row_slices import VEC, row_slices
    from kernel_src.models import UPSTREAM_MHC_APPLY_MIX_HIDDEN_SIZES, UPSTREAM_MHC_EXPAND_MULTS, mhc_shapes

    shapes = set(mhc_shapes())
    for decl in (mix_src.FWD, mix_src.BWD, post_src.FWD, post_src.BWD, recompute_src.DECL, expand_src.FWD, expand_src.BWD):
        assert shapes <= {(s['mhc'], s['hidden']) for s in decl.specs()}, decl.name
    assert {(m, h) for m in UPSTREAM_MHC_EXPAND_MULTS for _, h in shapes} <= {(s['mhc'], s['hidden']) for s in expand_src.FWD.specs()}
    assert {(4, h) for h in UPSTREAM_MHC_APPLY_MIX_HIDDEN_SIZES} <= {(s['mhc'], s['hidden']) for s in mix_src.FWD.specs()}
    for _, hidden in shapes:
        for vectors in (1, 2):
            split = row_slices(hidden, vectors)
            assert split.threads % 32 == 0 and split.slices * split.width >= hidden
            assert split.slices * split.width - hidden < split.threads * vectors * VEC
    with pytest.raises(ValueError, match='builds for mhc <= 4'):
        post_src.BWD.normalize({'mhc': 8, 'hidden': 4096})
    with pytest.raises(ValueError, match='hidden must be a positive multiple of 8'):
        mix_src.FWD.normalize({'mhc': 4, 'hidden': 1284})


STREAM_KERNELS = ('mhc.expand_to_mhc_fwd', 'mhc.expand_to_mhc_bwd', 'mhc.pre_apply_mix_fwd', 'mhc.pre_apply_mix_bwd', 'mhc.post_fwd',
                  'mhc.post_bwd', 'mhc.multilayer_recompute')


@pytest.fixture(scope='module')
def stream_build(tmp_path_factory):
    """sm_90a binaries of every stream kernel at mhc 4, H 1280 (tilelang + nvcc, no GPU)."""
    pytest.importorskip('tilelang')
    from build_tools.build import BuildArgs, build
    from kernel_src.decl import Arch

    root = tmp_path_factory.mktemp('mhc_stream')
    specs = root / 'specs.json'
    specs.write_text(json.dumps([{'kernel': k, 'params': {'mhc': MHC, 'hidden': H}} for k in STREAM_KERNELS]))
    build(BuildArgs(archs=(Arch('sm_90a'),), kernels=STREAM_KERNELS, specs_file=specs, prebuilt=False, jobs=2, out=root / 'dist',
                    build_dir=root / 'build', wheels=False))
    return root / 'build' / 'sm_90a'


@pytest.mark.build
def test_ops_bind_their_tensors_to_the_built_entries(stream_build, record_launches, monkeypatch):
    """Each op's tensors and names satisfy its binary's manifest (shapes, strides, dtypes, alignment); the launch
    itself is replaced by a record of the bound dims and the grid."""
    launched = record_launches(stream_build)
    # No pinned memory without a GPU: the tables stay on the host.
    monkeypatch.setattr(torch, 'tensor', lambda data, *, pin_memory=False, _tensor=torch.tensor, **kw: _tensor(data, **kw))
    monkeypatch.setattr(torch.Tensor, 'to', lambda self, *args, **kwargs: self)
    try:
        expand_to_mhc_fwd(rows(), MHC)
        expand_to_mhc_bwd(streams())
        mhc_pre_apply_mix_fwd(streams(), mix())
        mhc_pre_apply_mix_bwd(rows(), streams(), mix(), streams())
        mhc_post_fwd(*post_args())
        mhc_post_bwd(*post_args(), streams())
        for num_layers, num_post in ((1, 0), (3, 2), (2, 2)):
            mhc_multilayer_recompute(streams(), *layers(num_layers, num_post))
    finally:
        _select.reset()
    tokens = LEAD[0] * LEAD[1]
    assert [k for k, _, _ in launched] == list(STREAM_KERNELS) + ['mhc.multilayer_recompute'] * 2
    for kernel, env, grids in launched:
        assert env['num_tokens'] == tokens and grids[0][0] == tokens, kernel
    assert [(env['num_layers'], env['num_post']) for k, env, _ in launched[-3:]] == [(1, 0), (3, 2), (2, 2)]
