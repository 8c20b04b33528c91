"""Test settings shared by every test: the gpu marker, per-test seeds, and what ran where."""

from __future__ import annotations

import hashlib

import pytest
import torch


def pytest_report_header(config):
    import tile_kernels_aot

    lines = [f'tile_kernels_aot {tile_kernels_aot.__version__} from {tile_kernels_aot.__file__}', f'torch {torch.__version__}']
    if torch.cuda.is_available():
        lines.append(f'GPU: {torch.cuda.get_device_name(0)}, compute capability {torch.cuda.get_device_capability(0)}')
    else:
        lines.append('GPU: none (tests marked gpu are skipped)')
    return lines


def pytest_runtest_setup(item):
    if item.get_closest_marker('gpu') and not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU')


@pytest.fixture(autouse=True)
def _seed(request):
    # A seed per test id: reruns are reproducible and tests do not depend on their order.
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:4], 'little')
    torch.manual_seed(seed)
