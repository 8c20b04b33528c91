"""Device-side checks of values a kernel reads from tensors: the package's one memory-safety rule.

Every index, position or count read from a tensor is checked on the device:

- an entry the op documents as padding (a negative index or position) is skipped, as upstream does;
- any other entry out of range stops the kernel at a device-side assert (PyTorch's convention for its own
  indexing kernels: the launch fails with "device-side assert triggered" and the CUDA context is lost), and
  is masked before it addresses memory, so that no thread reads or writes outside the tensors before the
  assert ends the grid.

The gating kernels follow the same rule for the scores they rank: an input that would make a ranking value
NaN stops the kernel at a device-side assert, and the masking that follows keeps every access in bounds.
That is a NaN score anywhere, and an infinite one where the kernel adds scores or applies a scoring function
(topk_sum_and_topk_group_idx, and top2_sum_gate, upstream's rule there); topk_gate only compares its scores,
so it ranks infinities as numbers.

`device_assert` is the assert; `index_as_int32` narrows an index read as int64 (or int32) to the int32
the kernels compute with, so that no int64 value wraps to another valid index. One loop has no register
to spare for an assert's call (the bf16 SwiGLU forward, at its register cap): it checks with a predicated
trap instead (kernel_src/cuda/trap_unless.cuh), which ends the kernel the same way, without the message.

A check gathered over a loop combines its terms with `all_of` and `any_of`, which evaluate every term: `and` and
`or` become C's short-circuit `&&` and `||`, which ptxas may compile to a branch per term on the kernel's hot path.

The counting, dedup and gating kernels gather their checks into a flag and assert once, after their last store,
where no value is live across the assert's call (an assert inside a loop or ahead of the stores makes ptxas keep
values alive around the call). The masking keeps every access in bounds until then. An assert (or trap) ahead of
a shuffle makes ptxas compile the shuffle twice, once for a warp no longer whole, so kernels whose warps shuffle
assert after the last one.
"""

import functools
import operator

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T
from tvm import tirx


def device_assert(cond):
    """A device-side assert of `cond` (CUDA `assert`, kept: the build does not define NDEBUG)."""
    # Returned, not just built: the script parser emits a call statement only for the value it gets back.
    return T.call_intrin('void', tirx.op.Op.get('tl.device_assert'), cond)


def all_of(*conditions):
    """Whether every condition holds, each evaluated (a bitwise and of booleans: no branch per term)."""
    return functools.reduce(operator.and_, conditions)


def any_of(*conditions):
    """Whether some condition holds, each evaluated (a bitwise or of booleans: no branch per term)."""
    return functools.reduce(operator.or_, conditions)


def index_as_int32(value, bound):
    """`value` clamped to [-1, bound] and cast to int32: a negative entry stays padding (-1), an entry at or
    past `bound` reads as `bound` (which fails the caller's assert and mask), and an int64 entry never wraps
    to another index."""
    return T.Cast('int32', T.max(T.min(value, T.Cast(value.dtype, bound)), T.Cast(value.dtype, -1)))
