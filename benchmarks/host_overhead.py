"""Host time per call of every op, against a torch op on the same tensors and against upstream, in one process.

    python -m benchmarks.host_overhead [--out host.jsonl] [--kernels PATTERN] [--tokens 128]

For each case of benchmarks.upstream (one or more per kernel) that calls an op (not those marked
benchmarks.common.kernel_only), at a decode-sized token count: the host time per call
of our op (2000 calls timed on the host in short bursts, benchmarks.run.Timer.host_us: no call waits for the device,
so the time is the host's alone), of the same op with launch plans off (tile_kernels_aot._plans: every call checks its arguments and chooses its
binary again), of `torch.neg` on the largest floating-point tensor the case passes to the op (its input, so of the
op's shape), for an op that returns N > 1 new allocations of `torch._foreach_neg` over N references to that tensor
(one torch launch that allocates N outputs, as the op does: each output is an allocation torch's ops pay for too), and of
upstream's op when `tile_kernels` is importable (after one call, its JIT compile). Where the runtime's C
extension is installed (tile_kernels_aot._driver_native: it makes the driver call and replays simple launch plans),
ours is timed a second time as without it (ours_ctypes_us: the plan replayed in Python, the driver call made through
ctypes), so one run compares the two paths. They are timed
interleaved, three rounds, and each takes its lowest. The rows go to --out as JSON Lines, which benchmarks.record
condenses into 'host' lines; benchmarks.host_profile breaks one call down by layer.
"""

from __future__ import annotations

import argparse
import inspect
import sys

import torch
from torch.utils import _pytree as pytree

from benchmarks.common import RowWriter
from tile_kernels_aot import _driver, _plans
from benchmarks.run import Timer, cases_of, installed_kernels, select
from benchmarks.upstream import CASES


def _tensors_of(fn) -> list[torch.Tensor]:
    """The tensors a case's lambda closes over (its inputs), through functools.partial and nested lambdas."""
    found, seen, todo = [], set(), [fn]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, torch.Tensor):
            found.append(f)
        elif isinstance(f, (tuple, list)):
            todo.extend(f)
        elif hasattr(f, 'func') and hasattr(f, 'args'):  # functools.partial
            todo.extend([f.func, *f.args, *f.keywords.values()])
        elif inspect.isfunction(f):
            values = inspect.getclosurevars(f).nonlocals.values()
            todo.extend(v for v in values if isinstance(v, (torch.Tensor, tuple, list)) or callable(v))
    return found


def reference_tensor(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The largest floating-point tensor of a case's (:func:`_tensors_of`), else a bf16 tensor of one 7168-element row."""
    floats = [t for t in tensors if t.is_floating_point() and t.dtype.itemsize >= 2]
    return max(floats, key=torch.Tensor.numel) if floats else torch.randn(1, 7168, device='cuda').bfloat16()


def _describe(t: torch.Tensor) -> str:
    return f'{tuple(t.shape)} {str(t.dtype).removeprefix("torch.")}'


def torch_reference(t: torch.Tensor) -> tuple[str, object]:
    """torch.neg on `t` (:func:`reference_tensor`)."""
    return f'torch.neg {_describe(t)}', lambda: torch.neg(t)


# One launch of ATen's multi_tensor_apply, for a foreach op with one input and one output a tensor: at most 320 blocks
# (its depth-2 limit), each a chunk of 65536 elements.
_FOREACH_BLOCKS, _FOREACH_CHUNK = 320, 65536


def new_outputs(result: object, inputs: list[torch.Tensor]) -> int:
    """How many allocations an op's result holds: the storages of the tensors it returns (through tuples and lists),
    each counted once, other than its inputs' (an op that returns an argument, or two views of one buffer)."""
    given = {t.untyped_storage().data_ptr() for t in inputs}
    returned = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    return len({t.untyped_storage().data_ptr() for t in returned} - given)


def torch_outputs_reference(t: torch.Tensor, count: int) -> tuple[str, object]:
    """torch._foreach_neg over `count` references to `t`: one torch launch that allocates `count` outputs of its shape.
    A tensor too large for one launch at that count is cut to its first elements (the host time of an allocation does
    not depend on its size)."""
    t = t.contiguous()
    per_tensor = _FOREACH_BLOCKS // count * _FOREACH_CHUNK
    if t.numel() > per_tensor:
        t = t.reshape(-1)[:per_tensor]
    tensors = [t] * count
    return f'torch._foreach_neg {count} x {_describe(t)}', lambda: torch._foreach_neg(tensors)


def cases_and_upstream(case, tk, tokens: int) -> tuple[list, object]:
    """A kernel's cases with upstream's op, and upstream; where upstream's op does not build or run here (the case
    builder raises with it), the cases built without upstream, and None: ours is timed without it."""
    try:
        return cases_of(case, tk, tokens), tk
    except Exception as exc:
        if tk is None:
            raise
        print(f'upstream not timed: {str(exc).splitlines()[0]}', file=sys.stderr, flush=True)
        return cases_of(case, None, tokens), None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None)
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--tokens', type=int, default=128)
    args = parser.parse_args()
    try:
        import tile_kernels as tk  # upstream, for its host time; absent on most hosts
    except ImportError:
        tk = None
    timer = Timer()
    drv = _driver.driver()
    native = drv.native  # the C extension, where it is installed; None makes the driver call through ctypes
    native_replay, native_extension = _plans._native_replay, _plans._native  # its replay of simple plans, its keys; None: Python
    record = RowWriter(args.out)
    kernels, _ = select(CASES, args.kernels, installed_kernels())
    for kernel in kernels:
        if getattr(CASES[kernel], 'kernel_only', False):  # a kernel launched through the loader, not an op
            continue
        cases, upstream = cases_and_upstream(CASES[kernel], tk, args.tokens)
        for label, mine, theirs, _, _ in cases:
            inputs = _tensors_of(mine)
            t = reference_tensor(inputs)
            reference, torch_op = torch_reference(t)
            timed = {'ours': mine, 'ours_in_full': mine, 'torch': torch_op}
            outputs = new_outputs(mine(), inputs)
            outputs_reference = None
            if outputs > 1:
                outputs_reference, timed['torch_outputs'] = torch_outputs_reference(t, outputs)
            if native is not None:
                timed['ours_ctypes'] = mine
            if upstream is not None:
                theirs()  # its JIT compile, outside the timing
                timed['upstream'] = theirs
            best: dict[str, float] = {}
            for _ in range(3):  # interleaved rounds
                for side, fn in timed.items():
                    _plans.enable(side != 'ours_in_full')
                    if side == 'ours_ctypes':  # keyed, replayed and launched as without the extension
                        drv.native, _plans._native, _plans._native_replay = None, None, None
                    try:
                        best[side] = min(best.get(side, float('inf')), timer.host_us(fn))
                    finally:
                        _plans.enable(True)
                        drv.native, _plans._native, _plans._native_replay = native, native_extension, native_replay
            row = {'what': 'host', 'kernel': kernel, 'shape': label, 'tokens': args.tokens, 'ours_us': best['ours'],
                   'ours_in_full_us': best['ours_in_full'], 'ours_ctypes_us': best.get('ours_ctypes'), 'torch_us': best['torch'],
                   'torch_op': reference, 'outputs': outputs, 'torch_outputs_us': best.get('torch_outputs'), 'torch_outputs_op': outputs_reference,
                   'upstream_us': best.get('upstream')}
            record(row)
            their_us = f'upstream {row["upstream_us"]:6.1f} us' if upstream is not None else 'upstream -'
            ctypes_us = f', ctypes {row["ours_ctypes_us"]:6.1f}' if native is not None else ''
            outputs_us = f'  {outputs_reference} {row["torch_outputs_us"]:6.1f} us' if outputs_reference else ''
            print(f'{kernel:34s} {label:38s} ours {row["ours_us"]:6.1f} us (in full {row["ours_in_full_us"]:6.1f}{ctypes_us})  {reference} '
                  f'{row["torch_us"]:6.1f} us{outputs_us}  {their_us}', flush=True)
    record.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
