"""The pre-norm ops (fn_normw_merge, pre_norm_fn gemm / fwd / bwd, round_to_tf32) refuse bad input with CPU tensors,
naming the op and the argument, before anything is allocated or launched; a spec that is not built raises
SpecNotPrebuiltError. No GPU: the device is faked where a test gets as far as choosing a binary."""

from __future__ import annotations

import math

import pytest
import torch

from tile_kernels_aot import _checks
from tile_kernels_aot.errors import SpecNotPrebuiltError
from tile_kernels_aot.mhc.norm_fn import (
    MAX_N_SPLITS,
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_fwd,
    mhc_pre_norm_fn_bwd,
    mhc_pre_norm_fn_fwd,
    mhc_pre_norm_fn_gemm,
    round_to_tf32,
)

from .test_select import fake_device  # noqa: F401  (a fixture)

N, H, T = 4, 64, 6
MHC3, WIDTH = N * (N + 2), N * H


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t that does not start on a 16-byte boundary."""
    flat = torch.zeros(t.numel() + 16, dtype=t.dtype)
    start = next(i for i in range(1, 16) if (flat.data_ptr() + i * t.element_size()) % 16)
    return flat[start:start + t.numel()].view(t.shape).copy_(t)


def residual(*lead, mhc=N, hidden=H):
    return torch.zeros(*lead, mhc, hidden, dtype=torch.bfloat16)


def fwd_args(**change):
    args = dict(residual=residual(2, T // 2), fn=torch.zeros(MHC3, WIDTH), norm_eps=1e-6, n_splits=16)
    args.update(change)
    return args


def bwd_args(**change):
    args = dict(out_grad=torch.zeros(2, T // 2, MHC3), residual=residual(2, T // 2), fn_tf32=torch.zeros(MHC3, WIDTH),
                out_mul=torch.zeros(T, MHC3), sqrsum=torch.zeros(T), norm_eps=1e-6, x_grad=residual(2, T // 2))
    args.update(change)
    return args


def merge_bwd_args(**change):
    args = dict(fn=torch.zeros(MHC3, WIDTH), normw=torch.zeros(WIDTH), out_fn_grad=torch.zeros(MHC3, WIDTH),
                fn_grad=torch.zeros(MHC3, WIDTH), normw_grad=torch.zeros(WIDTH))
    args.update(change)
    return args


BAD_FWD = [
    (dict(residual=residual(T).float()), TypeError, 'residual must be bfloat16'),
    (dict(residual=torch.zeros(H, dtype=torch.bfloat16)), ValueError, r'residual must have at least 2 dimensions \(\.\.\., mhc, H\)'),
    (dict(residual=residual(T, mhc=5)), ValueError, r'residual.shape\[-2\] \(mhc\) must be in \[1, 4\]'),
    (dict(residual=residual(T, hidden=2 * H)[..., :H]), ValueError, 'residual must be contiguous'),
    (dict(residual=misaligned(residual(T))), ValueError, 'residual must be 16-byte aligned'),
    (dict(residual=[0.0]), TypeError, 'residual must be a torch.Tensor'),
    (dict(fn=torch.zeros(MHC3, WIDTH, dtype=torch.bfloat16)), TypeError, 'fn must be float32'),
    (dict(fn=torch.zeros(MHC3 + 8, WIDTH)), ValueError, rf'fn must have shape \({MHC3}, {WIDTH}\)'),
    (dict(fn=torch.zeros(MHC3, WIDTH + 4)), ValueError, rf'fn must have shape \({MHC3}, {WIDTH}\)'),
    (dict(residual=residual(T, mhc=2)), ValueError, rf'fn must have shape \(8, {2 * H}\)'),
    (dict(norm_eps=math.nan), ValueError, 'norm_eps must be a finite float32 value'),
    (dict(norm_eps=1e39), ValueError, 'norm_eps must be a finite float32 value'),
    (dict(norm_eps='1e-6'), TypeError, 'norm_eps must be a float'),
    (dict(norm_eps=True), TypeError, 'norm_eps must be a float'),
    (dict(n_splits=0), ValueError, rf'n_splits must be in \[1, {MAX_N_SPLITS}\]'),
    (dict(n_splits=MAX_N_SPLITS + 1), ValueError, rf'n_splits must be in \[1, {MAX_N_SPLITS}\]'),
    (dict(n_splits=16.0), TypeError, 'n_splits must be an int'),
]


@pytest.mark.parametrize('change, error, message', BAD_FWD)
def test_pre_norm_fn_fwd_refuses(change, error, message):
    with pytest.raises(error, match='mhc_pre_norm_fn_fwd: ' + message):
        mhc_pre_norm_fn_fwd(**fwd_args(**change))


BAD_GEMM = [
    (dict(residual_flat=residual(2, T)), ValueError, 'residual_flat must have 3 dimensions'),
    (dict(residual_flat=misaligned(residual(T))), ValueError, 'residual_flat must be 16-byte aligned'),
    (dict(fn_tf32=torch.zeros(WIDTH, MHC3).t()), ValueError, 'fn_tf32 must be contiguous'),
    (dict(fn_tf32=misaligned(torch.zeros(MHC3, WIDTH))), ValueError, 'fn_tf32 must be 16-byte aligned'),
    (dict(fn_tf32=torch.zeros(MHC3, WIDTH, dtype=torch.float64)), TypeError, 'fn_tf32 must be float32'),
    (dict(n_splits=-1), ValueError, 'n_splits must be in'),
]


@pytest.mark.parametrize('change, error, message', BAD_GEMM)
def test_pre_norm_fn_gemm_refuses(change, error, message):
    args = dict(residual_flat=residual(T), fn_tf32=torch.zeros(MHC3, WIDTH), n_splits=4)
    args.update(change)
    with pytest.raises(error, match='mhc_pre_norm_fn_gemm: ' + message):
        mhc_pre_norm_fn_gemm(**args)


BAD_BWD = [
    (dict(out_grad=torch.zeros(T, MHC3)), ValueError, 'out_grad must have 3 dimensions'),
    (dict(out_grad=torch.zeros(2, T // 2, MHC3 - 1)), ValueError, rf'out_grad must have shape \(2, 3, {MHC3}\)'),
    (dict(out_grad=torch.zeros(2, MHC3, T // 2).transpose(1, 2)), ValueError, 'out_grad must be contiguous'),
    (dict(out_grad=torch.zeros(2, T // 2, MHC3, dtype=torch.bfloat16)), TypeError, 'out_grad must be float32'),
    (dict(fn_tf32=torch.zeros(MHC3, WIDTH - 4)), ValueError, 'fn_tf32 must have shape'),
    (dict(out_mul=torch.zeros(T + 1, MHC3)), ValueError, rf'out_mul must have shape \({T}, {MHC3}\)'),
    (dict(out_mul=torch.zeros(MHC3, T).t()), ValueError, 'out_mul must be contiguous'),
    (dict(sqrsum=torch.zeros(T, 1)), ValueError, 'sqrsum must have 1 dimensions'),
    (dict(sqrsum=torch.zeros(T, dtype=torch.float64)), TypeError, 'sqrsum must be float32'),
    (dict(norm_eps=math.inf), ValueError, 'norm_eps must be a finite'),
    (dict(x_grad=residual(2, T // 2).float()), TypeError, 'x_grad must be bfloat16'),
    (dict(x_grad=residual(T)), ValueError, 'x_grad must have 4 dimensions'),
    (dict(x_grad=residual(3, 2)), ValueError, r'x_grad must have shape \(2, 3, 4, 64\)'),
    (dict(x_grad=misaligned(residual(2, T // 2))), ValueError, 'x_grad must be 16-byte aligned'),
    (dict(residual=residual(2, T // 2, hidden=H + 1)), ValueError, 'out_grad|fn_tf32|x_grad'),
]


@pytest.mark.parametrize('change, error, message', BAD_BWD)
def test_pre_norm_fn_bwd_refuses(change, error, message):
    with pytest.raises(error, match='mhc_pre_norm_fn_bwd: (' + message + ')'):
        mhc_pre_norm_fn_bwd(**bwd_args(**change))


BAD_MERGE = [
    (dict(fn=torch.zeros(MHC3 - 1, WIDTH)), ValueError, r'fn must have mhc \* \(mhc \+ 2\) rows'),
    (dict(fn=torch.zeros(MHC3, WIDTH + 2), normw=torch.zeros(WIDTH + 2)), ValueError, 'fn must have a multiple of 4 columns'),
    (dict(fn=torch.zeros(WIDTH, MHC3).t()), ValueError, 'fn must be contiguous'),
    (dict(fn=torch.zeros(MHC3, WIDTH, dtype=torch.float16)), TypeError, 'fn must be float32'),
    (dict(normw=torch.zeros(WIDTH + 4)), ValueError, rf'normw must have shape \({WIDTH},\)'),
    (dict(normw=misaligned(torch.zeros(WIDTH))), ValueError, 'normw must be 16-byte aligned'),
    (dict(normw=torch.zeros(1, WIDTH)), ValueError, 'normw must have 1 dimensions'),
]


@pytest.mark.parametrize('change, error, message', BAD_MERGE)
def test_fn_normw_merge_refuses(change, error, message):
    fwd = dict(fn=torch.zeros(MHC3, WIDTH), normw=torch.zeros(WIDTH))
    fwd.update(change)
    with pytest.raises(error, match='mhc_fn_normw_merge_fwd: ' + message):
        mhc_fn_normw_merge_fwd(**fwd)
    with pytest.raises(error, match='mhc_fn_normw_merge_bwd: ' + message):
        mhc_fn_normw_merge_bwd(**merge_bwd_args(**change))


@pytest.mark.parametrize('name', ['out_fn_grad', 'fn_grad', 'normw_grad'])
def test_fn_normw_merge_bwd_refuses_bad_gradients(name):
    like = merge_bwd_args()[name]
    for bad, error, message in ((like[..., :-4].clone(), ValueError, 'must have shape'), (like.double(), TypeError, 'must be float32'),
                                (misaligned(like), ValueError, 'must be 16-byte aligned')):
        with pytest.raises(error, match=f'mhc_fn_normw_merge_bwd: {name} {message}'):
            mhc_fn_normw_merge_bwd(**merge_bwd_args(**{name: bad}))


def test_cpu_tensors_are_refused_last():
    with pytest.raises(ValueError, match='mhc_pre_norm_fn_fwd: residual must be on a CUDA device'):
        mhc_pre_norm_fn_fwd(**fwd_args())
    with pytest.raises(ValueError, match='mhc_pre_norm_fn_bwd: out_grad must be on a CUDA device'):
        mhc_pre_norm_fn_bwd(**bwd_args())
    with pytest.raises(ValueError, match='mhc_fn_normw_merge_bwd: fn must be on a CUDA device'):
        mhc_fn_normw_merge_bwd(**merge_bwd_args())


def test_round_to_tf32_adds_0x1000_to_the_bits():
    x = torch.tensor([1.0, -1.0, 1 + 2**-11, 1 + 2**-10 - 2**-23, 0.0])
    rounded = round_to_tf32(x)
    assert torch.equal(rounded.view(torch.int32), x.view(torch.int32) + 0x1000)
    truncated = (rounded.view(torch.int32) & ~0x1FFF).view(torch.float32)  # what the TF32 MMA reads
    assert truncated.tolist() == [1.0, -1.0, 1 + 2**-10, 1 + 2**-10, 0.0]
    assert round_to_tf32(torch.ones(8, 4).t()).is_contiguous()
    with pytest.raises(TypeError, match='round_to_tf32: x must be a float32 torch.Tensor, got torch.float64'):
        round_to_tf32(x.double())


def test_unbuilt_specs_raise_spec_not_prebuilt(fake_device, monkeypatch):  # noqa: F811
    """With a package that has no pre-norm kernels (the CPU tests' subset build), each op names its kernel and spec."""
    fake_device[0] = ('NVIDIA H200', (9, 0))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    calls = [
        (f'mhc.pre_norm_fn_fwd_mul has no prebuilt sm_90a binary for mhc=4, hidden={H}', lambda: mhc_pre_norm_fn_fwd(**fwd_args())),
        (f'mhc.pre_norm_fn_fwd_mul has no prebuilt sm_90a binary for mhc=4, hidden={H}',
         lambda: mhc_pre_norm_fn_gemm(residual(T), torch.zeros(MHC3, WIDTH), 3)),
        ('mhc.pre_norm_fn_bwd_norm has no prebuilt sm_90a binary for mhc=4', lambda: mhc_pre_norm_fn_bwd(**bwd_args())),
        ('mhc.fn_normw_merge_fwd has no prebuilt sm_90a binary for mhc=4',
         lambda: mhc_fn_normw_merge_fwd(torch.zeros(MHC3, WIDTH), torch.zeros(WIDTH))),
        ('mhc.fn_normw_merge_bwd has no prebuilt sm_90a binary for mhc=4', lambda: mhc_fn_normw_merge_bwd(**merge_bwd_args())),
    ]
    for message, call in calls:
        with pytest.raises(SpecNotPrebuiltError, match=message):
            call()


def test_empty_input_returns_empty_outputs_without_a_kernel(fake_device, monkeypatch):  # noqa: F811
    """T = 0 allocates the outputs and launches nothing: no binary is looked up (none is installed here)."""
    fake_device[0] = ('NVIDIA H200', (9, 0))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    fn = torch.randn(MHC3, WIDTH)
    mixes, fn_tf32, out_mul, sqrsum = mhc_pre_norm_fn_fwd(**fwd_args(residual=residual(0, 5), fn=fn))
    assert mixes.shape == (0, 5, MHC3) and out_mul.shape == (0, MHC3) and sqrsum.shape == (0,)
    assert torch.equal(fn_tf32, round_to_tf32(fn))
    partial_mul, partial_sqrsum = mhc_pre_norm_fn_gemm(residual(0), fn_tf32, 7)
    assert partial_mul.shape == (7, 0, MHC3) and partial_sqrsum.shape == (7, 0)
    empty = dict(out_grad=torch.zeros(0, MHC3), residual=residual(0), out_mul=torch.zeros(0, MHC3), sqrsum=torch.zeros(0),
                 x_grad=residual(0))
    fn_grad = mhc_pre_norm_fn_bwd(**bwd_args(**empty))
    assert fn_grad.shape == (MHC3, WIDTH) and not fn_grad.any()
    assert mhc_fn_normw_merge_fwd(torch.zeros(MHC3, 0), torch.zeros(0)).shape == (MHC3, 0)
