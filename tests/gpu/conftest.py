"""Fixtures of the GPU tests, the skip of those marked two_gpus on fewer GPUs, and the release of cached GPU memory after
each test under pytest-xdist (their plain helpers are in helpers.py)."""

import os

import pytest
import torch

from tile_kernels_aot import config


def pytest_runtest_setup(item):
    if item.get_closest_marker('two_gpus') and torch.cuda.device_count() < 2:
        pytest.skip('needs two GPUs')


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown, which frees what they hold
def pytest_runtest_teardown(item):
    """Under pytest-xdist the workers share one GPU: each gives the blocks its test freed back to the driver, so that
    what torch's allocator caches in one worker does not leave another's largest test without memory."""
    if os.environ.get('PYTEST_XDIST_WORKER') and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture
def restore_num_sms():
    """For a test that calls config.set_num_sms: the device's own SM count again afterwards."""
    yield
    config.set_num_sms(0)
