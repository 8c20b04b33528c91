"""The SwiGLU fusions of quant, all to e4m3 (max 448):

* forward.py: forward + per-token cast (quant.swiglu_forward_and_per_token_cast), flat or one block per row; its
  step in forward_steps.py, its addressing in layout.py, the bf16 kernels' silu table in silu_table.py;
* channel.py: forward + per-channel cast, optionally transposed (quant.swiglu_forward_and_per_channel_cast_and_transpose);
* backward.py: backward + per-token cast of the input gradient (quant.swiglu_backward_and_per_token_cast);
* common.py: the SwiGLU in the reference's order, the clamps, and the fast division's range.

The CUDA helpers they call are kernel_src/cuda/swiglu_*.cuh. Casts (§2.1 of the semantics notes): clamped =
max(amax, floor), sf = clamped / 448 and multiplier 448 / clamped, or with round_sf the power of two at or above sf
and its exact inverse; q = e4m3_satfinite(v * multiplier). Every dim (rows, hidden, token count, top-k) and every
flag is a run-time argument.
"""

from kernel_src.quant.swiglu.backward import BACKWARD
from kernel_src.quant.swiglu.channel import CHANNEL
from kernel_src.quant.swiglu.forward import FORWARD

__all__ = ['BACKWARD', 'CHANNEL', 'FORWARD']
