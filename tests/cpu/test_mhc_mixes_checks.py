"""The mixing ops (split_mixes, sinkhorn, head_compute_mix, pre_big_fuse) refuse bad input with CPU tensors, naming
the op and the argument, before anything is allocated or launched; a spec that is not built raises
SpecNotPrebuiltError. No GPU: the device is faked where a test gets as far as choosing a binary."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tile_kernels_aot import _checks, _select
from tile_kernels_aot.errors import SpecNotPrebuiltError
from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_bwd, mhc_head_compute_mix_fwd
from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse
from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd
from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd

from .test_select import fake_device  # noqa: F401  (a fixture)

N, T = 4, 6
MHC3 = N * (N + 2)


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t that starts 4 bytes past a 16-byte boundary."""
    flat = torch.zeros(t.numel() + 8, dtype=t.dtype)
    start = next(i for i in range(1, 8) if (flat.data_ptr() + i * t.element_size()) % 16)
    return flat[start:start + t.numel()].view(t.shape).copy_(t)


def split_fwd_args(**change):
    args = dict(mixes=torch.zeros(2, T // 2, MHC3), scale=torch.ones(3), base=torch.zeros(MHC3), mhc_mult=N,
                post_mult_value=2.0, pre_eps=1e-6)
    args.update(change)
    return args


def split_bwd_args(**change):
    args = dict(pre_grad=torch.zeros(2, T // 2, N, 1), post_grad=torch.zeros(2, T // 2, N, 1),
                comb_grad=torch.zeros(2, T // 2, N, N), mixes=torch.zeros(2, T // 2, MHC3), post_mix=torch.zeros(2, T // 2, N, 1),
                scale=torch.ones(3), base=torch.zeros(MHC3), mhc_mult=N, post_mult_value=2.0)
    args.update(change)
    return args


BAD_SPLIT_FWD = [
    (dict(mixes=torch.zeros(T, MHC3, dtype=torch.bfloat16)), TypeError, 'mixes must be float32'),
    (dict(mixes=torch.zeros(T, MHC3 + 1)), ValueError, r'mixes must have shape \(\.\.\., 24\)'),
    (dict(mixes=torch.zeros(MHC3, T).t()), ValueError, 'mixes must be contiguous'),
    (dict(mixes=misaligned(torch.zeros(T, MHC3))), ValueError, 'mixes must be 16-byte aligned'),
    (dict(mixes=[0.0] * MHC3), TypeError, 'mixes must be a torch.Tensor'),
    (dict(scale=torch.ones(2)), ValueError, 'scale must have 3 elements'),
    (dict(scale=torch.ones(3, dtype=torch.float64)), TypeError, 'scale must be float32'),
    (dict(base=torch.zeros(MHC3 - 1)), ValueError, 'base must have 24 elements'),
    (dict(base=torch.zeros(2 * MHC3)[::2]), ValueError, 'base must be contiguous'),
    (dict(base=misaligned(torch.zeros(MHC3))), ValueError, 'base must be 16-byte aligned'),
    (dict(mhc_mult=4.0), TypeError, 'mhc_mult must be an int'),
    (dict(mhc_mult=0), ValueError, 'mhc_mult must be >= 1'),
    (dict(mhc_mult=2), ValueError, r'mixes must have shape \(\.\.\., 8\)'),
    (dict(post_mult_value=math.inf), ValueError, 'post_mult_value must be a finite float32 value'),
    (dict(post_mult_value='2'), TypeError, 'post_mult_value must be a float'),
    (dict(pre_eps=math.nan), ValueError, 'pre_eps must be a finite float32 value'),
    (dict(pre_eps=True), TypeError, 'pre_eps must be a float'),
]


@pytest.mark.parametrize('change, error, message', BAD_SPLIT_FWD)
def test_split_mixes_fwd_refuses(change, error, message):
    with pytest.raises(error, match='mhc_pre_split_mixes_fwd: ' + message):
        mhc_pre_split_mixes_fwd(**split_fwd_args(**change))


BAD_SPLIT_BWD = [
    (dict(pre_grad=torch.zeros(2, T // 2, N)), ValueError, r'pre_grad must have shape \(\.\.\., 4, 1\)'),
    (dict(post_grad=torch.zeros(2, T // 2 + 1, N, 1)), ValueError, 'mixes .* and post_grad .* disagree on the token dims'),
    (dict(comb_grad=torch.zeros(2, T // 2, N, N, dtype=torch.float16)), TypeError, 'comb_grad must be float32'),
    (dict(comb_grad=torch.zeros(2, T // 2, N, N).transpose(-1, -2)), ValueError, 'comb_grad must be contiguous'),
    (dict(post_mix=misaligned(torch.zeros(2, T // 2, N, 1))), ValueError, 'post_mix must be 16-byte aligned'),
    (dict(mixes=torch.zeros(2, T // 2, MHC3 - 1)), ValueError, r'mixes must have shape \(\.\.\., 24\)'),
    (dict(scale=torch.ones(4)), ValueError, 'scale must have 3 elements'),
    (dict(base=torch.zeros(MHC3, dtype=torch.bfloat16)), TypeError, 'base must be float32'),
    (dict(post_mult_value=-math.inf), ValueError, 'post_mult_value must be a finite float32 value'),
    (dict(mhc_mult=None), TypeError, 'mhc_mult must be an int'),
]


@pytest.mark.parametrize('change, error, message', BAD_SPLIT_BWD)
def test_split_mixes_bwd_refuses(change, error, message):
    with pytest.raises(error, match='mhc_pre_split_mixes_bwd: ' + message):
        mhc_pre_split_mixes_bwd(**split_bwd_args(**change))


BAD_SINKHORN = [
    (dict(x=torch.zeros(T, N, N, dtype=torch.bfloat16)), TypeError, 'x must be float32'),
    (dict(x=torch.zeros(T, N, N + 1)), ValueError, r'x must have shape \(\.\.\., n, n\)'),
    (dict(x=torch.zeros(N)), ValueError, 'x must have'),
    (dict(x=torch.zeros(T, N, N).transpose(-1, -2)), ValueError, 'x must be contiguous'),
    (dict(x=misaligned(torch.zeros(T, N, N))), ValueError, 'x must be 16-byte aligned'),
    (dict(repeat=0), ValueError, 'repeat must be in'),
    (dict(repeat=2.0), TypeError, 'repeat must be an int'),
    (dict(eps=math.nan), ValueError, 'eps must be a finite float32 value'),
    (dict(eps=None), TypeError, 'eps must be a float'),
]


@pytest.mark.parametrize('change, error, message', BAD_SINKHORN)
def test_sinkhorn_fwd_refuses(change, error, message):
    args = dict(x=torch.zeros(T, N, N), repeat=20, eps=1e-6)
    args.update(change)
    with pytest.raises(error, match='mhc_sinkhorn_fwd: ' + message):
        mhc_sinkhorn_fwd(**args)


@pytest.mark.parametrize('change, error, message', BAD_SINKHORN + [
    (dict(grad_out=torch.zeros(T + 1, N, N)), ValueError, "grad_out must have x's shape"),
    (dict(grad_out=torch.zeros(T, N, N, dtype=torch.float64)), TypeError, 'grad_out must be float32'),
    (dict(grad_out=misaligned(torch.zeros(T, N, N))), ValueError, 'grad_out must be 16-byte aligned'),
])
def test_sinkhorn_bwd_refuses(change, error, message):
    args = dict(grad_out=torch.zeros(T, N, N), x=torch.zeros(T, N, N), repeat=20, eps=1e-6)
    args.update(change)
    with pytest.raises(error, match='mhc_sinkhorn_bwd: ' + message):
        mhc_sinkhorn_bwd(**args)


BAD_HEAD = [
    (dict(input_mix=torch.zeros(T, N, dtype=torch.bfloat16)), TypeError, 'input_mix must be float32'),
    (dict(input_mix=torch.zeros(N, T).t()), ValueError, 'input_mix must be contiguous'),
    (dict(input_mix=misaligned(torch.zeros(T, N))), ValueError, 'input_mix must be 16-byte aligned'),
    (dict(scale=torch.ones(2)), ValueError, 'scale must have 1 elements'),
    (dict(base=torch.zeros(N + 1)), ValueError, 'base must have 4 elements'),
    (dict(base=torch.zeros(N, dtype=torch.float64)), TypeError, 'base must be float32'),
]


@pytest.mark.parametrize('change, error, message', BAD_HEAD + [
    (dict(pre_eps=math.inf), ValueError, 'pre_eps must be a finite float32 value'),
    (dict(pre_eps='x'), TypeError, 'pre_eps must be a float'),
])
def test_head_compute_mix_fwd_refuses(change, error, message):
    args = dict(input_mix=torch.zeros(T, N), scale=torch.ones(1), base=torch.zeros(N), pre_eps=1e-6)
    args.update(change)
    with pytest.raises(error, match='mhc_head_compute_mix_fwd: ' + message):
        mhc_head_compute_mix_fwd(**args)


@pytest.mark.parametrize('change, error, message', BAD_HEAD + [
    (dict(grad=torch.zeros(T + 1, N)), ValueError, "grad must have input_mix's shape"),
    (dict(grad=misaligned(torch.zeros(T, N))), ValueError, 'grad must be 16-byte aligned'),
])
def test_head_compute_mix_bwd_refuses(change, error, message):
    args = dict(grad=torch.zeros(T, N), input_mix=torch.zeros(T, N), scale=torch.ones(1), base=torch.zeros(N))
    args.update(change)
    with pytest.raises(error, match='mhc_head_compute_mix_bwd: ' + message):
        mhc_head_compute_mix_bwd(**args)


H = 256


def big_fuse_args(**change):
    args = dict(residual=torch.zeros(2, 3, N, H, dtype=torch.bfloat16), fn=torch.zeros(MHC3, N * H), mhc_scale=torch.ones(3),
                mhc_base=torch.zeros(MHC3), rms_eps=1e-6, mhc_pre_eps=1e-6, mhc_sinkhorn_eps=1e-6, mhc_post_mult_value=2.0,
                sinkhorn_repeat=20, n_splits=16)
    args.update(change)
    return args


BAD_BIG_FUSE = [
    (dict(residual=torch.zeros(2, 3, N, H)), TypeError, 'residual must be bfloat16'),
    (dict(residual=torch.zeros(N * H, dtype=torch.bfloat16)), ValueError, 'residual must have'),
    (dict(residual=torch.zeros(2, 3, 5, H, dtype=torch.bfloat16)), ValueError, r'residual.shape\[-2\] \(mhc\) must be in \[1, 4\]'),
    (dict(residual=torch.zeros(2, 3, H, N, dtype=torch.bfloat16).transpose(-1, -2)), ValueError, 'residual must be contiguous'),
    (dict(residual=misaligned(torch.zeros(2, 3, N, H, dtype=torch.bfloat16))), ValueError, 'residual must be 16-byte aligned'),
    (dict(fn=torch.zeros(MHC3, N * H, dtype=torch.bfloat16)), TypeError, 'fn must be float32'),
    (dict(fn=torch.zeros(MHC3, N * H + 8)), ValueError, r'fn must have shape \(24, 1024\)'),
    (dict(mhc_scale=torch.ones(1)), ValueError, 'mhc_scale must have 3 elements'),
    (dict(mhc_base=torch.zeros(N)), ValueError, 'mhc_base must have 24 elements'),
    (dict(rms_eps=math.nan), ValueError, 'rms_eps must be a finite float32 value'),
    (dict(mhc_pre_eps=1e300), ValueError, 'mhc_pre_eps must be a finite float32 value'),
    (dict(mhc_sinkhorn_eps='1e-6'), TypeError, 'mhc_sinkhorn_eps must be a float'),
    (dict(mhc_post_mult_value=math.inf), ValueError, 'mhc_post_mult_value must be a finite float32 value'),
    (dict(sinkhorn_repeat=0), ValueError, 'sinkhorn_repeat must be in'),
    (dict(sinkhorn_repeat=10.0), TypeError, 'sinkhorn_repeat must be an int'),
    (dict(n_splits=0), ValueError, 'n_splits must be in'),
    (dict(n_splits=100000), ValueError, 'n_splits must be in'),
]


@pytest.mark.parametrize('change, error, message', BAD_BIG_FUSE)
def test_pre_big_fuse_refuses(change, error, message):
    with pytest.raises(error, match='mhc_pre_big_fuse: ' + message):
        mhc_pre_big_fuse(**big_fuse_args(**change))


def test_good_cpu_input_gets_as_far_as_the_device_check():
    """Valid arguments pass every check but the last: CPU tensors are not on a CUDA device."""
    calls = [
        lambda: mhc_pre_split_mixes_fwd(**split_fwd_args()),
        lambda: mhc_pre_split_mixes_bwd(**split_bwd_args()),
        lambda: mhc_sinkhorn_fwd(torch.zeros(T, N, N), 1000, 0.0),
        lambda: mhc_sinkhorn_bwd(torch.zeros(2, 3, N, N), torch.zeros(2, 3, N, N), 20, 1e-6),
        lambda: mhc_head_compute_mix_fwd(torch.zeros(2, 3, N), torch.ones(1), torch.zeros(N), 1e-6),
        lambda: mhc_head_compute_mix_bwd(torch.zeros(T, N), torch.zeros(T, N), torch.ones(()).view(1), torch.zeros(N)),
        lambda: mhc_pre_big_fuse(**big_fuse_args()),
    ]
    for call in calls:
        with pytest.raises(ValueError, match='must be on a CUDA device'):
            call()


def test_unbuilt_specs_raise_spec_not_prebuilt(fake_device, monkeypatch):  # noqa: F811
    """With a package that has no mixing kernels (the CPU tests' subset build), each op names its kernel and spec."""
    fake_device[0] = ('NVIDIA H200', (9, 0))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    calls = {
        'mhc.pre_split_mixes_fwd': lambda: mhc_pre_split_mixes_fwd(**split_fwd_args()),
        'mhc.pre_split_mixes_bwd': lambda: mhc_pre_split_mixes_bwd(**split_bwd_args()),
        'mhc.sinkhorn_fwd': lambda: mhc_sinkhorn_fwd(torch.zeros(T, N, N), 20, 1e-6),
        'mhc.sinkhorn_bwd': lambda: mhc_sinkhorn_bwd(torch.zeros(T, N, N), torch.zeros(T, N, N), 20, 1e-6),
        'mhc.head_compute_mix_fwd': lambda: mhc_head_compute_mix_fwd(torch.zeros(T, N), torch.ones(1), torch.zeros(N), 1e-6),
        'mhc.head_compute_mix_bwd': lambda: mhc_head_compute_mix_bwd(torch.zeros(T, N), torch.zeros(T, N), torch.ones(1), torch.zeros(N)),
    }
    calls['mhc.pre_big_fuse'] = lambda: mhc_pre_big_fuse(**big_fuse_args())
    for kernel, call in calls.items():
        with pytest.raises(SpecNotPrebuiltError, match=f'{kernel} has no prebuilt sm_90a binary for mhc=4'
                                                       + (f', hidden={H}' if kernel == 'mhc.pre_big_fuse' else '')):
            call()


def test_empty_input_returns_empty_outputs_without_a_kernel(fake_device, monkeypatch):  # noqa: F811
    """T = 0 allocates the outputs and launches nothing: no binary is looked up (none is installed here)."""
    fake_device[0] = ('NVIDIA H200', (9, 0))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    pre, post, comb = mhc_pre_split_mixes_fwd(**split_fwd_args(mixes=torch.zeros(0, 3, MHC3)))
    assert pre.shape == (0, 3, N, 1) and post.shape == (0, 3, N, 1) and comb.shape == (0, 3, N, N)
    empty = dict(pre_grad=torch.zeros(0, N, 1), post_grad=torch.zeros(0, N, 1), comb_grad=torch.zeros(0, N, N),
                 mixes=torch.zeros(0, MHC3), post_mix=torch.zeros(0, N, 1))
    mixes_grad, scale_grad, base_grad = mhc_pre_split_mixes_bwd(**split_bwd_args(**empty))
    assert mixes_grad.shape == (0, MHC3) and scale_grad.tolist() == [0.0] * 3 and base_grad.tolist() == [0.0] * MHC3
    assert mhc_sinkhorn_fwd(torch.zeros(0, N, N), 20, 1e-6).shape == (0, N, N)
    assert mhc_sinkhorn_bwd(torch.zeros(5, 0, N, N), torch.zeros(5, 0, N, N), 20, 1e-6).shape == (5, 0, N, N)
    assert mhc_head_compute_mix_fwd(torch.zeros(0, N), torch.ones(1), torch.zeros(N), 0.0).shape == (0, N)
    input_grad, scale_grad, base_grad = mhc_head_compute_mix_bwd(torch.zeros(0, N), torch.zeros(0, N), torch.ones(1), torch.zeros(N))
    assert input_grad.shape == (0, N) and scale_grad.tolist() == [0.0] and base_grad.tolist() == [0.0] * N
    post, comb, layer_input = mhc_pre_big_fuse(**big_fuse_args(residual=torch.zeros(3, 0, N, H, dtype=torch.bfloat16)))
    assert post.shape == (3, 0, N, 1) and comb.shape == (3, 0, N, N) and layer_input.shape == (3, 0, H)
    assert layer_input.dtype == torch.bfloat16


MIX_KERNELS = ('mhc.pre_split_mixes_fwd', 'mhc.pre_split_mixes_bwd', 'mhc.sinkhorn_fwd', 'mhc.sinkhorn_bwd',
               'mhc.head_compute_mix_fwd', 'mhc.head_compute_mix_bwd')
FUSE_KERNELS = ('mhc.pre_big_fuse', 'mhc.pre_norm_fn_fwd_mul')  # the op runs the norm's GEMM first


@pytest.fixture(scope='module')
def mixes_build(tmp_path_factory):
    """sm_90a binaries of the mixing kernels at mhc 4 (big_fuse and its GEMM at H 256), tilelang + nvcc, no GPU."""
    pytest.importorskip('tilelang')
    from build_tools.build import BuildArgs, build
    from kernel_src.decl import Arch

    root = tmp_path_factory.mktemp('mhc_mixes')
    specs = root / 'specs.json'
    specs.write_text(json.dumps([{'kernel': k, 'params': {'mhc': N}} for k in MIX_KERNELS]
                                + [{'kernel': k, 'params': {'mhc': N, 'hidden': H}} for k in FUSE_KERNELS]))
    build(BuildArgs(archs=(Arch('sm_90a'),), kernels=MIX_KERNELS + FUSE_KERNELS, specs_file=specs, prebuilt=False, jobs=2,
                    out=root / 'dist', build_dir=root / 'build', wheels=False))
    return root / 'build' / 'sm_90a'


@pytest.mark.build
def test_ops_bind_their_tensors_to_the_built_entries(mixes_build, record_launches):
    """Each op's tensors, names and scalars satisfy its binaries' manifests (shapes, strides, dtypes, alignment); the
    launch itself is replaced by a record of the bound dims and the grids. The Sinkhorn backward's repeat limit comes
    from its binary."""
    launched = record_launches(mixes_build)
    tokens = 2 * 2001
    try:
        mhc_pre_split_mixes_fwd(**split_fwd_args(mixes=torch.zeros(2, 2001, MHC3)))
        empty = dict(pre_grad=torch.zeros(2, 2001, N, 1), post_grad=torch.zeros(2, 2001, N, 1), comb_grad=torch.zeros(2, 2001, N, N),
                     mixes=torch.zeros(2, 2001, MHC3), post_mix=torch.zeros(2, 2001, N, 1))
        mhc_pre_split_mixes_bwd(**split_bwd_args(**empty))
        mhc_sinkhorn_fwd(torch.zeros(2, 2001, N, N), 1000, 1e-6)
        mhc_sinkhorn_bwd(torch.zeros(2, 2001, N, N), torch.zeros(2, 2001, N, N), 24, 1e-6)
        with pytest.raises(ValueError, match=r'mhc_sinkhorn_bwd: repeat must be in \[1, 24\]'):
            mhc_sinkhorn_bwd(torch.zeros(2, N, N), torch.zeros(2, N, N), 25, 1e-6)
        mhc_head_compute_mix_fwd(torch.zeros(2, 2001, N), torch.ones(1), torch.zeros(N), 1e-6)
        mhc_head_compute_mix_bwd(torch.zeros(2, 2001, N), torch.zeros(2, 2001, N), torch.ones(1), torch.zeros(N))
        mhc_pre_big_fuse(**big_fuse_args(residual=torch.zeros(2, 2001, N, H, dtype=torch.bfloat16), n_splits=3))
    finally:
        _select.reset()
    assert [k for k, _, _ in launched] == list(MIX_KERNELS) + ['mhc.pre_norm_fn_fwd_mul', 'mhc.pre_big_fuse']
    for kernel, env, grids in launched:
        assert env['num_tokens'] == tokens, kernel
    grids = {k: g for k, _, g in launched}
    assert grids['mhc.pre_split_mixes_bwd'] == [(-(-tokens // 64), 1, 1), (1, 1, 1)]  # a partial per 64-token chunk, then one sum
    assert grids['mhc.head_compute_mix_bwd'] == [(-(-tokens // 64), 1, 1), (1, 1, 1)]
    manifest = json.loads((mixes_build / 'manifest.json').read_text())['kernels']
    per_block = manifest['mhc.sinkhorn_bwd']['entries'][f'mhc={N}']['constants']['tokens_per_block']
    assert grids['mhc.sinkhorn_bwd'] == [(-(-tokens // per_block), 1, 1)]
    assert grids['mhc.pre_big_fuse'] == [(tokens, 1, 1)]
    fuse_env = launched[-1][1]
    assert fuse_env['n_splits'] == 3 and fuse_env['width'] == N * H and fuse_env['sinkhorn_repeat'] == 20
