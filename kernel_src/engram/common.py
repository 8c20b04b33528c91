"""What the Engram kernels share: the stream count, the hidden sizes they are built for, how a row of H
elements is spread over a CTA, and the CTA-wide sum.

A row of H bf16 elements (one token and stream) is read by a CTA of `warps` warps in 16-byte vectors of
VEC elements: vector i of thread `tid` covers elements (i * threads + tid) * VEC .. + VEC, so each load
instruction of a warp covers 512 contiguous bytes. H must be a multiple of 32 * VEC = 256; the number of
warps is the largest divisor of H / 256 up to a kernel's cap, and each thread holds H / (256 * warps)
vectors of the row in registers.
"""

from tilelang import language as T

from kernel_src.decl import param
from kernel_src.models import engram_hidden_sizes

HC = 4  # streams (hc_mult) the gate kernels are built for
VEC = 8  # bf16 elements per 16-byte vector
ROW_QUANTUM = 32 * VEC  # H must be a multiple: one vector per lane of a warp
MAX_VECS = 8  # vectors of a row a thread may hold (the registers a kernel keeps per row)

HIDDEN_PARAMS = (param('hidden', 'int', 'h'),)
HC_PARAMS = (param('hc', 'int', 'hc'),)


def warps_for(hidden: int, max_warps: int) -> int:
    """Warps of a CTA that reads rows of `hidden` elements: the largest divisor of hidden / 256 up to max_warps."""
    units = hidden // ROW_QUANTUM
    return max(w for w in range(1, max_warps + 1) if units % w == 0)


def check_hidden(hidden: int, max_warps: int) -> None:
    if hidden <= 0 or hidden % ROW_QUANTUM:
        raise ValueError(f'hidden must be a positive multiple of {ROW_QUANTUM}, got {hidden}')
    vecs = hidden // (ROW_QUANTUM * warps_for(hidden, max_warps))
    if vecs > MAX_VECS:
        raise ValueError(f'hidden={hidden} leaves {vecs} vectors a thread with at most {max_warps} warps a CTA (at most {MAX_VECS})')


def hidden_specs(max_warps: int) -> list[dict]:
    """The models' hidden sizes (kernel_src/models.py) that rows of `max_warps` warps can take."""
    specs = []
    for hidden in engram_hidden_sizes():
        try:
            check_hidden(hidden, max_warps)
        except ValueError:
            continue
        specs.append({'hidden': hidden})
    return specs


def check_hc(hc: int) -> None:
    if hc != HC:
        raise ValueError(f'hc must be {HC}, got {hc}')


def hc_specs() -> list[dict]:
    return [{'hc': HC}]


@T.macro
def block_sum(values, count, shared, parity, tid, warps):
    """Sum values[0:count] over the CTA; every thread gets the same bits. A warp adds with a butterfly (each
    add commutes, so all lanes agree), then each thread adds the warps' sums in warp order from
    shared[parity]. Alternating `parity` between consecutive calls lets one barrier a call suffice: a
    thread can only overwrite shared[parity] two calls later, after every thread passed the barrier of the
    call in between and so finished reading it."""
    for s in T.unroll(5):
        for j in T.unroll(count):
            values[j] = values[j] + T.shfl_xor(values[j], 16 >> s)
    if warps > 1:
        if tid % 32 == 0:
            for j in T.unroll(count):
                shared[parity, tid // 32, j] = values[j]
        T.sync_threads()
        for j in T.unroll(count):
            values[j] = shared[parity, 0, j]
            for w in T.unroll(1, warps):
                values[j] = values[j] + shared[parity, w, j]
