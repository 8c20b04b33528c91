"""Launch features no shipped kernel uses yet, on kernels built from tests/fixtures/launch_kernels.py:
TMA descriptors encoded per call, cooperative launch with a grid barrier, >48 KB of dynamic shared memory.
The GPU script in .ci/ points TILE_KERNELS_AOT_LAUNCH_TEST_DIR at their build."""

import os
from pathlib import Path

import pytest
import torch

from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot.manifest import manifest_from_json

from .helpers import assert_bitwise_equal

pytestmark = pytest.mark.gpu


@pytest.fixture(scope='module')
def kernels():
    folder = os.environ.get('TILE_KERNELS_AOT_LAUNCH_TEST_DIR')
    if not folder:
        pytest.skip('TILE_KERNELS_AOT_LAUNCH_TEST_DIR is not set (build tests.fixtures.launch_kernels first)')
    root = Path(folder)
    manifest = manifest_from_json((root / 'manifest.json').read_text())
    return {name: LoadedKernel(next(iter(info.entries.values())), root) for name, info in manifest.kernels.items()}


@pytest.mark.parametrize('rows', [1, 63, 64, 1000])
def test_tma_descriptor_per_call(kernels, rows):
    x = torch.randn(rows, 1024, device='cuda').bfloat16()
    y = torch.full_like(x, float('nan'))
    kernels['test.tma_copy'](0, {'x': x, 'y': y})
    assert_bitwise_equal(y, x)


def test_cooperative_launch(kernels):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.rand(1_000_003, device='cuda')
    partial = torch.empty(sms, device='cuda')
    total = torch.full((1,), float('nan'), device='cuda')
    kernels['test.grid_sum'](0, {'x': x, 'partial': partial, 'total': total})
    torch.testing.assert_close(total[0], x.double().sum().float(), rtol=1e-5, atol=0)
    too_many = torch.empty(sms * 64, device='cuda')
    with pytest.raises(ValueError, match='cooperative grid'):
        kernels['test.grid_sum'](0, {'x': x, 'partial': too_many, 'total': total})


def test_dynamic_shared_memory_above_48k(kernels):
    x = torch.randn(8, 24576, device='cuda')
    y = torch.empty_like(x)
    kernels['test.big_smem'](0, {'x': x, 'y': y})
    assert_bitwise_equal(y, x.flip(1))
