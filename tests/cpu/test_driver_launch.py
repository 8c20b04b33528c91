"""Driver.launch passes every argument of cuLaunchKernel with its full value, both ways it can make the call: through the
C extension tile_kernels_aot._driver_native, and through ctypes without a prototype. Checked against a stand-in
libcuda, compiled here with the host C compiler, that records what it gets."""

from __future__ import annotations

import ctypes

import pytest

from tile_kernels_aot import _driver

from tests.fixtures import stub_driver


@pytest.fixture(scope='module')
def stub(tmp_path_factory) -> ctypes.CDLL:
    lib = stub_driver.build(tmp_path_factory.mktemp('stub'))
    if lib is None:
        pytest.skip('no C compiler')
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
