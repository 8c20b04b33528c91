"""Fixtures of the GPU tests (their plain helpers are in helpers.py)."""

import pytest

from tile_kernels_aot import config


@pytest.fixture
def restore_num_sms():
    """For a test that calls config.set_num_sms: the device's own SM count again afterwards."""
    yield
    config.set_num_sms(0)
