"""Run-time configuration shared with upstream TileKernels: the SM count that persistent grids use.

Kernels that loop over tokens with a fixed grid (group_count, aux_fi) size it as 2 x the SM count at
every call (fewer when the tokens fill fewer blocks); it is a launch argument, not baked into the binary, so set_num_sms takes effect at once and
one binary serves GPUs of any size. Results do not depend on it.

env_switch reads the package's 0/1 environment switches (TILE_KERNELS_AOT_CHECK_INDICES, TILE_KERNELS_AOT_LAUNCH_PLANS,
TILE_KERNELS_AOT_NATIVE_LAUNCH, TILE_KERNELS_AOT_TORCH_SHIM).
"""

from __future__ import annotations

import functools
import os

import torch

_num_sms = 0


@functools.cache
def get_device_num_sms(device: int | None = None) -> int:
    index = torch.cuda.current_device() if device is None else device
    return torch.cuda.get_device_properties(index).multi_processor_count


def set_num_sms(num_sms: int) -> None:
    """Use `num_sms` SMs for persistent grids (0 restores the device's own count)."""
    global _num_sms
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 0:
        raise ValueError(f'set_num_sms: num_sms must be a non-negative int, got {num_sms!r}')
    _num_sms = num_sms


def get_num_sms(device: int | None = None) -> int:
    return _num_sms or get_device_num_sms(device)


def env_switch(name: str, default: bool) -> bool:
    """A switch read from the environment variable `name` once, by the module that owns it: 1 on, 0 off, unset or
    empty the default."""
    value = os.environ.get(name, '').strip()
    if value not in ('', '0', '1'):
        raise ValueError(f'{name} must be 0 or 1, got {value!r}')
    return default if value == '' else value == '1'
