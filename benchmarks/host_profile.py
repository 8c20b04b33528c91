"""Where the host time of one op call goes: each layer of topk_gate timed alone (the op in full, and replaying its launch
plan, tile_kernels_aot._plans, in the runtime's C extension and in Python), then a cProfile of whole calls of topk_gate and of two ops with many tensors
(engram_gate_bwd: 13; mhc_pre_split_mixes_fwd: 6, three of them outputs).

    python -m benchmarks.host_profile
"""

import cProfile
import pstats

import torch

import tile_kernels_aot
from tile_kernels_aot import _checks, _plans, _torch_shim
from tile_kernels_aot._launch import _current_device, _current_stream
from tile_kernels_aot._select import find_kernel

from benchmarks.run import Timer

per_call_us = Timer.host_us


def main():
    scores = torch.randn(1, 256, device='cuda')
    idx = torch.empty(1, 8, dtype=torch.int64, device='cuda')
    kernel = find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, 0)
    tensors = {'scores': scores, 'topk_idx': idx}
    pointers = {}
    env = kernel._plan.bind(tensors, {}, pointers)
    kernel(0, tensors)  # loads the module and creates this thread's argument block
    launch, fn, pack = kernel.entry.launches[0], kernel.functions(0)[0], kernel._packs.value[0]
    topk_gate = tile_kernels_aot.moe.topk_gate
    nine = tuple(torch.empty(128, 4096, dtype=torch.bfloat16, device='cuda') for _ in range(9))  # an op of nine argument tensors
    native = kernel._driver.native
    rows = {
        'torch.neg (reference point)': per_call_us(lambda: torch.neg(scores)),
        'torch.empty(1, 8, int64)': per_call_us(lambda: torch.empty((1, 8), dtype=torch.int64, device=scores.device)),
        'argument checks': per_call_us(lambda: (_checks.tensor('op', 'scores', scores, ndim=2, dtypes=(torch.float32,)),
                                                _checks.integer('op', 'num_topk', 8, low=1, high=32), _checks.inner_contiguous('op', 'scores', scores),
                                                _checks.on_one_cuda_device('op', scores=scores))),
        'torch.empty_strided(1, 8)': per_call_us(lambda: torch.empty_strided((1, 8), (8, 1), dtype=torch.int64, device=scores.device)),
        'torch.empty(1, 8, device=0)': per_call_us(lambda: torch.empty((1, 8), dtype=torch.int64, device=0)),
        'torch.empty_like(1, 8)': per_call_us(lambda: torch.empty_like(idx)),
        'scores.new_empty(1, 8)': per_call_us(lambda: scores.new_empty((1, 8), dtype=torch.int64)),
        'torch.empty(64 bytes) + 2 views': per_call_us(lambda: torch.empty(64, dtype=torch.uint8, device=scores.device).view(torch.int64).view(1, 8)),
        'a view (as_strided)': per_call_us(lambda: idx.as_strided((1, 8), (8, 1), 0)),
        'data_ptr()': per_call_us(lambda: idx.data_ptr()),
        'current device': per_call_us(lambda: _current_device()),
        'find_kernel (memoised)': per_call_us(lambda: find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, 0)),
        'bind': per_call_us(lambda: kernel._plan.bind(tensors, {}, {})),
        'grid + scalars': per_call_us(lambda: kernel._bind_env(launch, pack, kernel._grids[0](env), env)),
        'LoadedKernel.launch (bound)': per_call_us(lambda: kernel.launch(0, pointers, env)),
        'current stream': per_call_us(lambda: _current_stream(0)),
        'cuLaunchKernel via ctypes': per_call_us(lambda: kernel._launch_one(0, launch, fn, (1, 1, 1), _current_stream(0), pack.pointers)),
        'cuLaunchKernel via the C extension': native and per_call_us(lambda: native.launch(fn.value, (1, 1, 1), launch.block,
                                                                                         launch.dynamic_smem, _current_stream(0), pack.address)),
        'LoadedKernel call': per_call_us(lambda: kernel(0, tensors)),
        "topk_gate's signature, made in C": _plans._native and per_call_us(lambda: _plans._native.signature((scores, 8), {}, None, False, [])),
        "9 tensors' signature, made in C": _plans._native and per_call_us(lambda: _plans._native.signature(nine, {}, None, False, [])),
        "9 tensors' signature, without DLPack": _plans._exchange and without_exchange(
            lambda: per_call_us(lambda: _plans._native.signature(nine, {}, None, False, []))),
        'topk_gate op, in full': per_call_us(lambda: topk_gate.__wrapped__(scores, 8)),
        'topk_gate op (its launch plan)': per_call_us(lambda: topk_gate(scores, 8)),
        'topk_gate op (its plan replayed in Python)': without_native_replay(lambda: per_call_us(lambda: topk_gate(scores, 8))),
        'topk_gate op (in C, without the shim)': without_shim(topk_gate, lambda: per_call_us(lambda: topk_gate(scores, 8))),
    }
    print(f"allocations of C replays: {'through torch C shim' if _plans._shim else 'through torch Python API'}")
    for name, us in rows.items():
        print(f'{name:40s} {us:6.2f} us' if us else f'{name:40s} (no C extension, or no shim)')
    weights = torch.rand(1, 8, device='cuda')
    for name, call in [('topk_gate', lambda: tile_kernels_aot.moe.topk_gate(scores, 8)),
                       ('normalize_weight', lambda: tile_kernels_aot.moe.normalize_weight(weights)), *many_tensor_calls()]:
        call()
        print(f'\n## {name}: {per_call_us(call):.2f} us a call')
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(5000):
            call()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats('tottime').print_stats(18)


def without_exchange(fn):
    """fn() with the C extension's signatures reading tensors through torch's Python API, not its DLPack exchange API."""
    _plans._native.bind_exchange(None)
    try:
        return fn()
    finally:
        _plans._native.bind_exchange(_plans._exchange)


def without_native_replay(fn):
    """fn() with every launch plan keyed and replayed in Python, as without the C extension."""
    native, native_replay = _plans._native, _plans._native_replay
    _plans._native = _plans._native_replay = None
    try:
        return fn()
    finally:
        _plans._native, _plans._native_replay = native, native_replay


def without_shim(op, fn):
    """fn() with `op`'s plans made again without torch's C shim: the C replay allocates through torch's Python API."""
    if not _plans._shim:
        return None
    allocation, _torch_shim.allocation = _torch_shim.allocation, lambda *args: None
    op.plans.clear()
    try:
        return fn()
    finally:
        _torch_shim.allocation = allocation
        op.plans.clear()


def many_tensor_calls():
    """Decode-sized calls of two ops whose host time grows with their tensor count."""
    from tile_kernels_aot import engram
    from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_fwd

    x, k, grad = (torch.randn(1, 4, 1024, device='cuda').bfloat16() for _ in range(3))
    v, weight = torch.randn(1, 1024, device='cuda').bfloat16(), torch.randn(4, 1024, device='cuda')
    saved = engram.engram_gate_fwd(x, k, v, weight, 1e-6, 10.0, True)[1:]
    mixes, scale, base = torch.randn(1, 24, device='cuda'), torch.randn(3, device='cuda'), torch.randn(24, device='cuda')
    return [('engram_gate_bwd', lambda: engram.engram_gate_bwd(grad, x, k, v, weight, *saved, 10.0)),
            ('mhc_pre_split_mixes_fwd', lambda: mhc_pre_split_mixes_fwd(mixes, scale, base, 4, 2.0, 1e-6))]


if __name__ == '__main__':
    main()
