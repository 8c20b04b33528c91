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


def _store_under_condition(arch, shifted: int):
    """out[i] = 1 for the first 32 threads of each CTA, the bound written as tid // 8 < 4, or (shifted) as
    tid // 8 < (4 >> (s - 5)) with the kernel scalar s = 5 at run time: the same stores, which tilelang 0.1.15
    drops in the second form."""
    from tilelang import language as T

    from kernel_src.decl import KernelProgram

    n = T.dynamic('n')

    @T.prim_func
    def store_under_condition(out: T.Tensor[(n,), T.uint8], s: T.int32):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as pid:
            tid = T.get_thread_binding()
            if shifted:
                if tid // 8 < (4 >> (s - 5)) and pid * 128 + tid < n:
                    out[pid * 128 + tid] = T.uint8(1)
            else:
                if tid // 8 < 4 and pid * 128 + tid < n:
                    out[pid * 128 + tid] = T.uint8(1)

    return KernelProgram(store_under_condition, alignment={'out': 1})


def test_a_lowering_that_drops_every_store_to_an_output_is_refused():
    pytest.importorskip('tilelang')
    from build_tools.lower import LoweringError, lower
    from kernel_src.decl import KernelDecl, param

    decl = KernelDecl(name='test.store_under_condition', params=(param('shifted', 'int', 's'),), factory=_store_under_condition,
                      prebuilt=lambda: iter(()), check=lambda **_: None)
    assert 'out[' in lower(decl, {'shifted': 0}, Arch('sm_90a')).source
    with pytest.raises(LoweringError, match='stores to out, but the lowered device code no longer touches it'):
        lower(decl, {'shifted': 1}, Arch('sm_90a'))


@pytest.mark.parametrize('transpose', (True, False))
def test_per_channel_swiglu_has_only_its_own_barriers(transpose):
    """The per-channel SwiGLU cast takes one of three paths per thread (its gates' range), so a barrier inside them
    would hang a CTA whose threads split. tilelang's barrier insertion put one there for 32-byte vectors (two
    shared-memory stores of a thread it could not prove disjoint from other threads'), which is why the kernel
    turns it off: the source has exactly the kernel's own __syncthreads (act tile, amax of 128-token blocks, and
    untransposed the e4m3 tile)."""
    pytest.importorskip('tilelang')
    from build_tools.lower import lower
    from kernel_src.quant.swiglu import CHANNEL

    source = lower(CHANNEL, {'transpose': transpose, 'vec_bytes': 32}, Arch('sm_90a')).source
    assert source.count('__syncthreads()') == (2 if transpose else 3)


def _barrier_under(arch, condition: int):
    """A shared-memory round trip whose barrier sits under a condition: 0 the kernel scalar s (the same for every
    thread), 1 the thread index, 2 a value the thread loaded (neither is the same for every thread of a CTA)."""
    from tilelang import language as T

    from kernel_src.decl import KernelProgram

    n = T.dynamic('n')

    @T.prim_func
    def barrier_under(x: T.Tensor[(n,), T.float32], out: T.Tensor[(n,), T.float32], s: T.int32):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as pid:
            tid = T.get_thread_binding()
            tile = T.alloc_shared((128,), T.float32)
            value = T.alloc_local((1,), T.float32)
            value[0] = x[pid * 128 + tid]
            tile[tid] = value[0]
            if condition == 0:
                if s > 0:
                    T.sync_threads()
            elif condition == 1:
                if tid < 64:
                    T.sync_threads()
            else:
                if value[0] > 0:
                    T.sync_threads()
            out[pid * 128 + tid] = tile[127 - tid]

    return KernelProgram(barrier_under, alignment={'x': 4, 'out': 4})


def test_a_barrier_that_threads_of_a_cta_may_not_all_reach_is_refused():
    pytest.importorskip('tilelang')
    from build_tools.lower import LoweringError, lower
    from kernel_src.decl import KernelDecl, param

    decl = KernelDecl(name='test.barrier_under', params=(param('condition', 'int', 'c'),), factory=_barrier_under,
                      prebuilt=lambda: iter(()), check=lambda **_: None,
                      pass_configs={'tl.disable_thread_storage_sync': True})
    assert '__syncthreads()' in lower(decl, {'condition': 0}, Arch('sm_90a')).source
    for condition in (1, 2):
        with pytest.raises(LoweringError, match='__syncthreads.. under a condition that threads of one CTA'):
            lower(decl, {'condition': condition}, Arch('sm_90a'))


def test_the_per_channel_swiglu_with_tilelangs_barriers_is_refused():
    """tilelang's barrier pass puts a barrier under a thread-dependent condition in the 32-byte per-channel cast, which
    hangs the GPU: the build refuses it."""
    pytest.importorskip('tilelang')
    import dataclasses

    from build_tools.lower import LoweringError, lower
    from kernel_src.quant.swiglu import CHANNEL

    configs = {k: v for k, v in CHANNEL.pass_configs.items() if k != 'tl.disable_thread_storage_sync'}
    with pytest.raises(LoweringError, match='tk_clamps_are_identity|tk_gate_bits_in_div_range'):
        lower(dataclasses.replace(CHANNEL, pass_configs=configs), {'transpose': True, 'vec_bytes': 32}, Arch('sm_90a'))


def test_buffers_are_named_by_the_signature():
    """per_token_requant's e4m3 -> e4m3 body binds x to a new name (x_in), which renames the buffer itself; the manifest
    still names it x, as the op passes it, with the alignment the program declares for x (32 for 32-byte vectors)."""
    from build_tools.lower import _buffers
    from kernel_src.registry import DECLS

    spec = dict(in_fmt='e4m3', fmt='e4m3', in_sf_format='f32', sf_format='f32', vec_bytes=32)
    program = DECLS['quant.per_token_requant'].factory(Arch('sm_90a'), **spec)
    assert {program.func.buffer_map[p].name for p in program.func.params if p in program.func.buffer_map} >= {'x_in'}
    buffers = {b['name']: b['alignment'] for b in _buffers(program.func, dict(program.alignment))}
    assert list(buffers) == ['x', 'x_sf', 'out', 'out_sf']
    assert buffers['x'] == program.alignment['x'] == 32
