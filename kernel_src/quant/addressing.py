"""Index arithmetic the quant kernels share.

Its own module (not common.py), so that a change here re-lowers only its users.
"""

from tilelang import language as T

# The flat indices of the ops' largest tensors (elements, or chunks of them), plus the overrun of a CTA past the last
# one, stay below 2^31: int32 in the kernels and in magic_quotient's range. Declared as the kernels' `index_limit`
# constant, which the ops check their tensors against.
INDEX_LIMIT = 2**31 - 2**16


def _u64(v):
    """An int32 >= 0 as uint64, through uint32 (no sign extension)."""
    return T.Cast('uint64', T.Cast('uint32', v))


def unsigned_wide_mad(a, b, c):
    """a * b + c for int32 a, b, c >= 0, as int64 through unsigned 32 x 32 -> 64-bit arithmetic: one
    IMAD.WIDE.U32, where signed int64 operands cost sign extensions and a multiply per half."""
    return T.Cast('int64', _u64(a) * _u64(b) + _u64(c))


def unsigned_wide_dot(a, b, c, d):
    """a * b + c * d for int32 a, b, c, d >= 0, as int64 through unsigned 32 x 32 -> 64-bit arithmetic (two
    IMAD.WIDE.U32): a two-dimensional offset in any strides, which no product can overflow."""
    return T.Cast('int64', _u64(a) * _u64(b) + _u64(c) * _u64(d))


def magic_quotient(n, magic, shift):
    """n // d for int32 0 <= n < 2^31, from the (magic, shift) pair the op computes for d
    (tile_kernels_aot.quant._common.magic): one unsigned 32 x 32 -> 64-bit multiply-high, where an integer
    division costs some 30 instructions, some on the slow XU pipe."""
    return T.Cast('int32', (_u64(n) * _u64(magic)) >> T.Cast('uint64', shift))


def unsigned_index(index):
    """An int32 element index of a flat view, widened as unsigned 32-bit (one IMAD.WIDE.U32 from the base where a
    signed 64-bit row * stride + column * stride takes about 15 instructions), for indices the ops keep below 2^31."""
    return T.Cast('int64', T.Cast('uint32', index))
