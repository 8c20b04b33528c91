"""What the lowering reads off tilelang for the launch features the loader supports (no nvcc, no GPU)."""

import pytest

from kernel_src.decl import Arch

pytestmark = pytest.mark.build


@pytest.fixture(scope='module')
def lowered():
    pytest.importorskip('tilelang')
    from build_tools.lower import lower
    from tests.fixtures.launch_kernels import DECLS

    return {name: lower(d, d.specs()[0], Arch('sm_90a')).launch for name, d in DECLS.items()}


def test_tma_descriptor_recipe(lowered):
    (launch,) = lowered['test.tma_copy']['launches']
    assert {'name': 'y_desc', 'kind': 'tma'} in launch['args']
    (recipe,) = launch['tma']
    assert recipe == {'buffer': 'y', 'data_type': 9, 'rank': 2, 'global_dims': [1024, 'rows'], 'global_strides': [2048],
                      'box_dims': [64, 64], 'element_strides': [1, 1], 'interleave': 0, 'swizzle': 3, 'l2_promotion': 2, 'oob_fill': 0}
    assert launch['dynamic_smem'] > 0


def test_cooperative_launch_and_runtime_grid(lowered):
    (launch,) = lowered['test.grid_sum']['launches']
    assert launch['cooperative'] is True and launch['cluster_dims'] is None
    assert launch['grid'] == ['num_blocks', 1, 1]
    partial = next(b for b in lowered['test.grid_sum']['buffers'] if b['name'] == 'partial')
    assert partial['shape'] == ['num_blocks']  # the grid size is read off a buffer, not baked in


def test_dynamic_shared_memory_over_48k(lowered):
    (launch,) = lowered['test.big_smem']['launches']
    assert launch['dynamic_smem'] == 96 * 1024


def test_unsupported_expressions_are_refused():
    pytest.importorskip('tilelang')
    from tvm import tirx

    from build_tools.lower import LoweringError, to_expr

    n = tirx.Var('n', 'int32')
    assert to_expr((n + 63) // 64) == ['//', ['+', 'n', 63], 64]
    with pytest.raises(LoweringError, match='cannot express'):
        to_expr(tirx.Select(n > 1, n, 1))
