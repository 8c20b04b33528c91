"""Device-side checks of values a kernel reads from tensors: the package's one memory-safety rule.

Every index, position or count that a kernel reads from a tensor and addresses memory with is checked on the device:

- an entry the op documents as padding (a negative index or position) is skipped, as upstream does;
- any other entry out of range stops the kernel, and the CUDA context is lost (PyTorch's convention for its own
  indexing kernels), and is masked before it addresses memory, so that no thread reads or writes outside the
  tensors before the stop reaches the rest of the grid.

The gating kernels follow the same rule for the scores they rank: an input that would make a ranking value
NaN stops the kernel, and the masking that follows keeps every access in bounds. That is a NaN score anywhere,
and an infinite one where the kernel adds scores or applies a scoring function (topk_sum_and_topk_group_idx, and
top2_sum_gate, upstream's rule there); topk_gate only compares its scores, so it ranks infinities as numbers.

A kernel stops at `device_assert`, CUDA's assert: the host sees "device-side assert triggered". The counting and
gating kernels (group_count, aux_fi, topk_gate, topk_sum_and_topk_group_idx, top2_sum_gate) stop at `device_trap`
instead, a predicated trap (kernel_src/cuda/trap_unless.cuh): they take a few microseconds, and the assert's call
into __assertfail (a syscall, its message in a constant bank) costs them up to 2% of that more than the trap does.
The trap ends the kernel and the context the same way; the host sees "unspecified launch failure". The bf16 SwiGLU
forward traps too: its loop has no register to spare for an assert's call.

An index read as int64 is checked in 64 bits, so that no value wraps into range: `below` is the check's term
(negative values pass, as padding) and `counted` the mask of an index that addresses memory (0 <= value < bound,
one unsigned compare). A kernel that computes with a narrowed index uses `index_as_int32`, which clamps.

A check gathered over a loop combines its terms with `all_of` and `any_of` (or `all_below`, `all_finite` over a
buffer), which evaluate every term in a balanced tree: `and` and `or` become C's short-circuit `&&` and `||`, which
ptxas may compile to a branch per term, and a flag and-ed in term by term is a chain of dependent compares. Both sit on
the hot path of kernels that run a warp or two per scheduler, where every instruction's latency shows.

The counting and gating kernels gather their checks into a flag and stop once, after their last store (an assert
inside a loop or ahead of the stores makes ptxas keep values alive around its call); the masking keeps every access
in bounds until then. An assert or a trap ahead of a shuffle makes ptxas compile the shuffle twice, once for a warp
no longer whole, so kernels whose warps shuffle check after the last one.
"""

import operator

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T
from tvm import tirx

from kernel_src.cuda import prelude


def device_trap(cond):
    """A predicated trap unless `cond` (kernel_src/cuda/trap_unless.cuh; the kernel's T.Kernel takes TRAP_PRELUDE)."""
    return T.call_extern('void', 'tk_trap_unless', cond)


TRAP_PRELUDE = prelude('trap_unless.cuh')


def device_assert(cond):
    """A device-side assert of `cond` (CUDA `assert`, kept: the build does not define NDEBUG)."""
    # Returned, not just built: the script parser emits a call statement only for the value it gets back.
    return T.call_intrin('void', tirx.op.Op.get('tl.device_assert'), cond)


def all_of(*conditions):
    """Whether every condition holds, each evaluated: a bitwise and of booleans, as a balanced tree, so that the terms
    are independent (no branch per term, no chain of one compare waiting for the one before)."""
    return _balanced(operator.and_, conditions)


def any_of(*conditions):
    """Whether some condition holds, each evaluated (a balanced bitwise or of booleans, as all_of)."""
    return _balanced(operator.or_, conditions)


def _balanced(combine, terms):
    """`terms` combined pairwise by `combine`, as a balanced tree."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return combine(_balanced(combine, terms[:half]), _balanced(combine, terms[half:]))


def all_below(values, count, bound):
    """Whether values[0:count] (a local buffer, `count` a Python int) are all `below` bound."""
    return all_of(*(below(values[i], bound) for i in range(count)))


def all_finite(values, count):
    """Whether values[0:count] (a local float buffer, `count` a Python int) are all finite."""
    return all_of(*(T.isfinite(values[i]) for i in range(count)))


def below(value, bound):
    """Whether `value` is below `bound`, compared in value's own dtype (an int64 index in 64 bits, so that no value
    wraps into range): the check of an index whose negative values are padding."""
    return value < T.Cast(value.dtype, bound)


def counted(value, bound):
    """Whether 0 <= `value` < `bound`, by one unsigned compare in value's width (a negative value is a huge unsigned
    one): the mask of an index that addresses memory, which skips padding and anything out of range."""
    unsigned = 'uint64' if value.dtype == 'int64' else 'uint32'
    return T.Cast(unsigned, value) < T.Cast(unsigned, bound)


def index_as_int32(value, bound):
    """`value` clamped to [-1, bound] and cast to int32: a negative entry stays padding (-1), an entry at or
    past `bound` reads as `bound` (which fails the caller's assert and mask), and an int64 entry never wraps
    to another index."""
    return T.Cast('int32', T.max(T.min(value, T.Cast(value.dtype, bound)), T.Cast(value.dtype, -1)))
