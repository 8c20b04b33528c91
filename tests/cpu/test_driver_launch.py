"""Driver.launch passes every argument of cuLaunchKernel with its full value, both ways it can make the call: through the
C extension tile_kernels_aot._driver_native, and through ctypes without a prototype. Checked against a stand-in
libcuda, compiled here with the host C compiler, that records what it gets."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from tile_kernels_aot import _driver

STUB = r'''
#include <stdint.h>
static uint64_t seen[11];
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem,
                   void *stream, void **params, void **extra) {
  uint64_t v[11] = {(uint64_t)f, gx, gy, gz, bx, by, bz, smem, (uint64_t)stream, (uint64_t)params, (uint64_t)extra};
  for (int i = 0; i < 11; ++i) seen[i] = v[i];
  return gx == 7 ? 700 : 0;  /* an error code for the test of the error path */
}
uint64_t seen_argument(int i) { return seen[i]; }
int cuGetErrorName(int code, const char **name) { *name = "CUDA_ERROR_STUB"; return 0; }
int cuGetErrorString(int code, const char **text) { *text = "a stub error"; return 0; }
'''
OTHERS = [name for name in _driver._SIGNATURES if name not in ('cuGetErrorName', 'cuGetErrorString')]


@pytest.fixture(scope='module')
def stub(tmp_path_factory) -> ctypes.CDLL:
    cc = shutil.which('cc') or shutil.which('gcc')
    if cc is None:
        pytest.skip('no C compiler')
    folder = tmp_path_factory.mktemp('stub')
    source = folder / 'stub.c'
    source.write_text(STUB + ''.join(f'int {name}() {{ return 0; }}\n' for name in OTHERS))
    subprocess.run([cc, '-shared', '-fPIC', '-O1', '-o', str(folder / 'libstub.so'), str(source)], check=True)
    lib = ctypes.CDLL(str(folder / 'libstub.so'))
    lib.seen_argument.restype = ctypes.c_uint64
    return lib


@pytest.fixture(params=['native', 'ctypes'])
def drv(request, stub, monkeypatch) -> _driver.Driver:
    if request.param == 'ctypes':
        monkeypatch.setenv(_driver.NATIVE_ENV, '0')
    drv = _driver.Driver(stub)
    if request.param == 'native' and drv.native is None:
        pytest.fail('tile_kernels_aot._driver_native is not built: `pip install -e .` builds it (it needs a C compiler)')
    assert (drv.native is None) == (request.param == 'ctypes')
    return drv


def test_every_argument_arrives_whole(drv, stub):
    params = (ctypes.c_void_p * 3)()
    fn = _driver.CUfunction(0x7F12_3456_7890)
    stream = 0xFFFF_8000_1234_5678  # all 64 bits matter
    drv.launch(fn, (2**31 - 1, 65535, 3), (1024, 1, 1), 227 * 1024, stream, params)
    got = [stub.seen_argument(i) for i in range(11)]
    assert got == [0x7F12_3456_7890, 2**31 - 1, 65535, 3, 1024, 1, 1, 227 * 1024, stream, ctypes.addressof(params), 0]
    drv.launch(fn, (1, 1, 1), (32, 1, 1), 0, 0, params)  # the default stream is a null handle
    assert stub.seen_argument(8) == 0


def test_an_error_code_raises_with_the_drivers_name(drv):
    with pytest.raises(_driver.CudaDriverError, match='CUDA_ERROR_STUB'):
        drv.launch(_driver.CUfunction(1), (7, 1, 1), (32, 1, 1), 0, 0, (ctypes.c_void_p * 1)())


def test_the_extension_refuses_what_does_not_fit(stub):
    drv = _driver.Driver(stub)
    assert drv.native is not None
    params = (ctypes.c_void_p * 1)()
    with pytest.raises(OverflowError, match='grid'):
        drv.launch(_driver.CUfunction(1), (2**32, 1, 1), (32, 1, 1), 0, 0, params)
    with pytest.raises(TypeError, match='block must be a tuple of 3 ints'):
        drv.native.launch(1, (1, 1, 1), [32, 1, 1], 0, 0, ctypes.addressof(params))
    with pytest.raises(TypeError, match='6 arguments'):
        drv.native.launch(1, (1, 1, 1))
