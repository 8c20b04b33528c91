"""Fixtures of the GPU tests, and the skip of those marked two_gpus on fewer GPUs (their plain helpers are in helpers.py)."""

import pytest
import torch

from tile_kernels_aot import config


def pytest_runtest_setup(item):
    if item.get_closest_marker('two_gpus') and torch.cuda.device_count() < 2:
        pytest.skip('needs two GPUs')


@pytest.fixture
def restore_num_sms():
    """For a test that calls config.set_num_sms: the device's own SM count again afterwards."""
    yield
    config.set_num_sms(0)
