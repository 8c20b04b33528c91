"""The runtime on a machine without a GPU: import hygiene and argument binding."""

import subprocess
import sys
import textwrap

import pytest
import torch

from tile_kernels_aot._launch import _BindingPlan
from tile_kernels_aot.manifest import entry_from_plain


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True)


def test_import_needs_no_tilelang_tvm_or_compiler():
    result = run_python('''
        import sys
        for blocked in ('tilelang', 'tvm', 'tvm_ffi', 'triton'):
            sys.modules[blocked] = None  # any import of them now raises ImportError
        import tile_kernels_aot, tile_kernels_aot.torch
        from tile_kernels_aot import _select, _launch, _driver
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm', 'tvm_ffi', 'kernel_src', 'build_tools') and sys.modules[m] is not None)
        print('loaded:', loaded)
        print('version', tile_kernels_aot.__version__)
    ''')
    assert result.returncode == 0, result.stderr
    assert 'loaded: []' in result.stdout


def test_every_public_submodule_is_reachable_after_a_plain_import():
    result = run_python('''
        import sys
        for blocked in ('tilelang', 'tvm', 'tvm_ffi', 'triton'):
            sys.modules[blocked] = None
        import tile_kernels_aot
        for name in ('config', 'cubin', 'errors', 'manifest', 'moe', 'quant', 'reference', 'targets', 'torch', 'transpose', 'version'):
            assert getattr(tile_kernels_aot, name).__name__ == f'tile_kernels_aot.{name}', name
        print(callable(tile_kernels_aot.torch.stable_topk), tile_kernels_aot.torch.__all__ == tile_kernels_aot.reference.__all__)
        star = {}
        exec('from tile_kernels_aot import *', star)
        print('torch' in star)  # a star import leaves the torch package alone
    ''')
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['True', 'True', 'False']


def test_import_does_not_touch_the_driver():
    result = run_python('''
        import ctypes, sys
        real = ctypes.CDLL
        def refuse(name, *a, **k):
            if 'libcuda' in str(name):
                raise OSError('no driver here')
            return real(name, *a, **k)
        ctypes.CDLL = refuse
        import tile_kernels_aot
        from tile_kernels_aot import _driver
        try:
            _driver.driver()
        except tile_kernels_aot.errors.CudaDriverError as exc:
            print('error:', exc)
    ''')
    assert result.returncode == 0, result.stderr
    assert 'error: dlopen failed: LIBCUDA_NOT_FOUND' in result.stdout and 'no driver here' in result.stdout


ENTRY = entry_from_plain({
    'kernel': 'demo.copy', 'key': 'h=64', 'params': {'h': 64}, 'target': 'sm_90a', 'cubin': 'x.cubin', 'sha256': '0' * 64,
    'source': 'x.cu', 'scalars': [{'name': 'num_sms', 'kind': 'int32'}], 'constants': {'tile': 4},
    'buffers': [
        {'name': 'x', 'dtype': 'bfloat16', 'shape': ['num_tokens', 64], 'strides': ['row_stride', 1], 'alignment': 16},
        {'name': 'out', 'dtype': 'float32', 'shape': ['num_tokens', ['//', 64, 32]], 'strides': [2, 1], 'alignment': 16},
    ],
    'launches': [{'symbol': 'k', 'args': [], 'grid': [['//', ['+', 'num_tokens', 3], 4], 1, 1], 'block': [128, 1, 1],
                  'dynamic_smem': 0, 'cooperative': False, 'cluster_dims': None, 'pdl': False, 'tma': []}],
})


def test_binding_reads_dims_and_checks_the_rest():
    plan = _BindingPlan(ENTRY)
    x = torch.zeros(10, 80, dtype=torch.bfloat16)[:, :64]
    out = torch.zeros(10, 2)
    assert plan.bind({'x': x, 'out': out}, {'num_sms': 132}) == {'num_tokens': 10, 'row_stride': 80, 'num_sms': 132}


@pytest.mark.parametrize('tensors, scalars, error, match', [
    ({'x': torch.zeros(10, 64), 'out': torch.zeros(10, 2)}, {'num_sms': 1}, TypeError, 'x must be a 2-d torch.bfloat16 tensor'),
    ({'x': torch.zeros(10, 64, dtype=torch.bfloat16), 'out': torch.zeros(9, 2)}, {'num_sms': 1}, ValueError, r'out.shape\(0\) must be 10'),
    ({'x': torch.zeros(10, 64, dtype=torch.bfloat16), 'out': torch.zeros(10, 3)[:, :2]}, {'num_sms': 1}, ValueError, r'out.stride\(0\) must be 2'),
    ({'x': torch.zeros(10, 65, dtype=torch.bfloat16)[:, 1:], 'out': torch.zeros(10, 2)}, {'num_sms': 1}, ValueError, '16-byte aligned'),
    ({'x': torch.zeros(10, 64, dtype=torch.bfloat16), 'out': torch.zeros(10, 2)}, {}, TypeError, "missing scalar 'num_sms'"),
    ({'out': torch.zeros(10, 2)}, {'num_sms': 1}, TypeError, "missing tensor 'x'"),
])
def test_binding_rejects_what_the_binary_was_not_built_for(tensors, scalars, error, match):
    with pytest.raises(error, match=match):
        _BindingPlan(ENTRY).bind(tensors, scalars)
