"""What the SwiGLU kernels share: the SwiGLU in the reference's order, its clamps, the fast division's range, and
the CUDA headers they call (kernel_src/cuda/swiglu_*.cuh).

SwiGLU of a row [l | r] (each half `hidden` wide), in float32 and in this order, as upstream's reference:
    l = l > c ? c : l;  r = r > c ? c : (r < -c ? -c : r)          (only with a clamp value c)
    act = l / (1 + exp(-l)) * r                                    (IEEE division, accurate expf)
The kernels clamp against c, or +inf without a clamp value (clamp_or_inf): the same results, NaN included, and no
use_clamp test in the element loops.
"""

import struct

from tilelang import language as T

from kernel_src.cuda import prelude
from kernel_src.quant.common import RCP_DIV_PRELUDE

E4M3_MAX = 448.0

# The range of |a| where the branch-free division a / (1 + exp(-a)) is correctly rounded (swiglu_div.cuh).
FAST_DIV_MAX = 80.0
FAST_DIV_MIN = 2.0**-64
FAST_DIV_MIN_BELOW = FAST_DIV_MIN * (1 - 2.0**-24)  # the float just below FAST_DIV_MIN (swiglu_backward_div.cuh)

# Every access is masked explicitly (against the run-time dims); tilelang's own per-element guards would
# stop the 16-byte vectorisation.
PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True}


def bf16_bits(value: float) -> int:
    """The bf16 bit pattern of a float32 that bf16 holds exactly."""
    bits = struct.unpack('<I', struct.pack('<f', value))[0]
    assert bits & 0xFFFF == 0, value
    return bits >> 16


def float_literal(value: float) -> str:
    """A float32 literal of CUDA that is exactly `value` (hexadecimal, so no rounding in the printing)."""
    return value.hex() + 'f'


def unsigned_literal(value: int) -> str:
    return hex(value) + 'u'


# The macros of the division headers (swiglu_div.cuh, swiglu_backward_div.cuh, swiglu_words.cuh).
DIV_DEFINES = {
    'TK_FAST_DIV_MAX': float_literal(FAST_DIV_MAX),
    'TK_FAST_DIV_MIN': float_literal(FAST_DIV_MIN),
    'TK_FAST_DIV_MIN_BELOW': float_literal(FAST_DIV_MIN_BELOW),
    'TK_DIV_MAX_BITS': unsigned_literal(bf16_bits(FAST_DIV_MAX)),
    'TK_DIV_MIN_BITS': unsigned_literal(bf16_bits(FAST_DIV_MIN)),
}


def swiglu_prelude(*headers: str, **defines: object) -> str:
    """A SwiGLU kernel's prelude: the NaN-propagating clamps (swiglu_min_max.cuh), the reciprocal and division
    sequence (RCP_DIV_PRELUDE), then `headers`, with DIV_DEFINES and `defines` as macros."""
    return prelude('swiglu_min_max.cuh') + RCP_DIV_PRELUDE + prelude(*headers, **DIV_DEFINES, **defines)


def clamp_or_inf(use_clamp, clamp_value):
    """The clamp bound: clamp_value, or +inf without a clamp."""
    return T.if_then_else(use_clamp != 0, clamp_value, T.float32(float('inf')))


def clamp_gate(l, c):
    """min(l, c) as one FMNMX.NAN (tk_min_nan: a NaN l stays NaN, as torch.clamp keeps it)."""
    return T.call_extern('float32', 'tk_min_nan', l, c)


def clamp_up(r, c):
    """torch.clamp(r, -c, c), low bound first, as two FMNMX.NAN."""
    return T.call_extern('float32', 'tk_min_nan', T.call_extern('float32', 'tk_max_nan', r, -c), c)


def silu(l):
    """silu of the clamped gate in the reference's order (IEEE division, expf)."""
    return l / (T.float32(1) + T.exp(-l))


def clamped_swiglu(l, r, c):
    """act of float32 gate l and up r in the reference's order, with the clamp always on, against c (+inf for no
    clamp: the same results), in three FMNMX.NAN.

    Bit-exact with the compare-and-select form for any non-NaN c > 0 and +inf: a NaN l or r stays NaN (as
    torch.clamp keeps it), a value past a bound becomes the bound, any other value is kept; only at c = 0
    could a signed zero differ, and there min/max are the instructions of torch's own clamp."""
    return silu(clamp_gate(l, c)) * clamp_up(r, c)


def clamped_swiglu_fast(a, r, c):
    """clamped_swiglu of an already clamped gate a, dividing by tk_div_rn_fast: exact only where a passes the
    step's range test (tk_div_fast_in_range)."""
    return T.call_extern('float32', 'tk_div_rn_fast', a, T.float32(1) + T.exp(-a)) * clamp_up(r, c)


def warp_all(test: str, *args):
    """Whether the int32 CUDA test `test`(args) holds on every active lane of the warp (tk_warp_all): a path
    choice the whole warp then takes together."""
    return T.call_extern('int32', 'tk_warp_all', T.call_extern('int32', test, *args)) != 0


@T.macro
def track_division_range(div_range, a):
    """div_range[0], div_range[1]: the largest (max.NaN: a NaN fails the range test) and smallest |a| so far."""
    div_range[0] = T.call_extern('float32', 'tk_max_nan', div_range[0], T.abs(a))
    div_range[1] = T.min(div_range[1], T.abs(a))
