"""tile_kernels_aot.preload: which binaries it loads, and its errors, with a faked device and driver (no GPU; the
subset build serves as the installed package). tests/gpu/test_preload.py captures a graph after it on a GPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import _preload, _select
from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot.errors import TileKernelsAOTError

from .test_select import fake_device  # noqa: F401  (a fixture)

ALL = ['moe.topk_gate[num_experts=256,num_topk=8]',
       'quant.per_token_cast[in_dtype=bfloat16,fmt=e4m3,sf_format=f32,per_row=0,aligned=1,vec_bytes=32]',
       'transpose.batched_transpose[elem_bytes=2,vec_bytes=16,tile_m=64,tile_n=64]']


@pytest.fixture
def loads(fake_device, monkeypatch):  # noqa: F811
    """An H200 as device 0 of 2; the driver work of a load (module, attributes, occupancy) is recorded, not done."""
    fake_device[0] = ('NVIDIA H200', (9, 0))
    fake_device[1] = ('NVIDIA H200', (9, 0))
    done = []
    monkeypatch.setattr(LoadedKernel, 'blocks_per_sm', lambda self, device: done.append((self, device)) or 1)
    monkeypatch.setattr(_preload, '_on_device', lambda index: contextlib.nullcontext())
    monkeypatch.setattr(_preload, '_visible_devices', lambda: 2)
    return done


def test_everything_installed_by_default(loads):
    assert tile_kernels_aot.preload(0) == ALL
    assert [(k.entry.kernel, device) for k, device in loads] == [
        ('moe.topk_gate', 0), ('quant.per_token_cast', 0), ('transpose.batched_transpose', 0)]


def test_ops_then_find_the_preloaded_binaries(loads):
    tile_kernels_aot.preload('cuda:1', 'moe.topk_gate')
    ((loaded, device),) = loads
    assert device == 1
    assert _select.find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, 1) is loaded


@pytest.mark.parametrize('kernels, expected', [
    ('moe.*', ALL[:1]),
    (['transpose.batched_transpose', 'quant.*'], ALL[1:]),
    (('*cast*', '*_gate'), ALL[:2]),
])
def test_names_and_globs_choose(loads, kernels, expected):
    assert tile_kernels_aot.preload(0, kernels) == expected


@pytest.mark.parametrize('device', [None, 'cuda', 0, 'cuda:0'])
def test_device_forms(loads, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    assert tile_kernels_aot.preload(device, 'moe.*') == ALL[:1]
    assert loads[0][1] == 0


@pytest.mark.parametrize('kernels, message', [
    ('moe.topk_gat', r"no kernel of the sm_90a arch package \(TILE_KERNELS_AOT_KERNEL_DIRS .*\) matches 'moe.topk_gat'; "
                     'close names: moe.topk_gate$'),
    ('topk_gate', 'close names: moe.topk_gate'),
    (['moe.*', 'mhc.*'], "matches 'mhc.*'; python -m tile_kernels_aot list shows them all"),
])
def test_unknown_kernel_names_the_close_ones(loads, kernels, message):
    with pytest.raises(ValueError, match=message):
        tile_kernels_aot.preload(0, kernels)
    assert loads == []  # nothing loaded before the names are checked


@pytest.mark.parametrize('device, kernels, error, message', [
    (0, 5, TypeError, 'kernels must be a kernel name, a glob or a list of them, got 5'),
    (0, [], TypeError, 'kernels must be non-empty strings'),
    (0, ['moe.*', ''], TypeError, 'kernels must be non-empty strings'),
    (0, ['moe.*', 3], TypeError, 'kernels must be non-empty strings'),
    (True, None, TypeError, 'device must be None, an int, a str or a torch.device, got True'),
    (0.0, None, TypeError, 'device must be None, an int, a str or a torch.device'),
    (-1, None, ValueError, 'device must be a CUDA device index >= 0, got -1'),
    ('cpu', None, ValueError, "device must be a CUDA device, got 'cpu'"),
    ('cuda:x', None, ValueError, 'preload: .*cuda:x'),
    (2, None, ValueError, 'there is no CUDA device 2; torch sees 2'),
])
def test_bad_arguments(loads, device, kernels, error, message):
    with pytest.raises(error, match=message):
        tile_kernels_aot.preload(device, kernels)
    assert loads == []


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a host without a GPU')
def test_without_a_gpu_it_says_so():
    with pytest.raises(TileKernelsAOTError, match='preload: torch sees no CUDA GPU'):
        tile_kernels_aot.preload()
