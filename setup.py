# All metadata lives in pyproject.toml. This file adds the runtime's optional C extension, tile_kernels_aot._driver_native
# (cuLaunchKernel without ctypes' argument conversion; the runtime falls back to ctypes without it). It is built where
# its source is present: a checkout, and the native runtime wheel's stage; build_tools stages the pure-Python wheel
# without it. It uses Python's limited API, so the wheel is tagged cp311-abi3 and serves every CPython from 3.11 on.
from pathlib import Path

from setuptools import Extension, setup

SOURCE = 'tile_kernels_aot/_driver_native.c'

if Path(SOURCE).exists():
    setup(
        ext_modules=[Extension('tile_kernels_aot._driver_native', [SOURCE], py_limited_api=True, optional=True, extra_compile_args=['-O2', '-g0'])],
        options={'bdist_wheel': {'py_limited_api': 'cp311'}},
    )
else:
    setup()
