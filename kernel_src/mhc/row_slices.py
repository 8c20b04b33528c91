"""How the mHC stream kernels (expand, pre_apply_mix, post, multilayer_recompute) split a hidden row over threads.

A row of `hidden` bf16 values is cut into 16-byte vectors of VEC values; a thread owns whole vectors, so every global
access is one 16-byte load or store. `hidden` is a spec parameter (a multiple of VEC), so the split is fixed at build
time: `threads` per block and `vectors` per thread are chosen to leave as few threads idle as possible, and the
bound check on the last slice is compiled in only where the slices do not tile the row exactly.
"""

from __future__ import annotations

import dataclasses
import math

from tilelang import language as T

VEC = 8  # bf16 values per 16-byte vector
THREAD_CHOICES = (128, 160, 96, 64)  # block sizes tried, preferred first among equally tight fits
MAX_MHC = 8  # stream counts the kernels build for: their per-thread state grows with mhc (mhc * VEC floats per array)


@dataclasses.dataclass(frozen=True)
class RowSlices:
    """`threads` threads of a block each own `vectors` vectors of a slice of `threads * vectors * VEC` columns; a row
    has `slices` slices, the last one cut at `hidden` when `ragged`."""

    hidden: int
    threads: int
    vectors: int

    @property
    def width(self) -> int:
        return self.threads * self.vectors * VEC

    @property
    def slices(self) -> int:
        return -(-self.hidden // self.width)

    @property
    def ragged(self) -> bool:
        return self.hidden % self.width != 0

    def column(self, slice_index, tid, j):
        """First column of the j-th vector of thread `tid` in slice `slice_index`: consecutive threads own
        consecutive vectors, so a warp's accesses are contiguous."""
        return (slice_index * (self.threads * self.vectors) + j * self.threads + tid) * VEC


def row_slices(hidden: int, vectors: int) -> RowSlices:
    """The split of a row into slices of `vectors` vectors per thread that leaves the fewest threads idle."""
    count = hidden // VEC
    best = min(THREAD_CHOICES, key=lambda t: (-(-count // (t * vectors)) * t * vectors - count, THREAD_CHOICES.index(t)))
    return RowSlices(hidden, best, vectors)


def stream_constants(arch, mhc: int, hidden: int) -> dict[str, int]:
    """What the ops check pointers against: `vector_alignment` for every bf16 tensor (rows are read in 16-byte
    vectors), `mix_alignment` for every float32 mix tensor (see mix_vector)."""
    return {'vector_alignment': 2 * VEC, 'mix_alignment': 4 * mix_vector(mhc)}


def check_mhc_hidden(mhc: int, hidden: int) -> None:
    if not 1 <= mhc <= MAX_MHC:
        raise ValueError(f'mhc must be in [1, {MAX_MHC}], got {mhc}')
    if hidden <= 0 or hidden % VEC:
        raise ValueError(f'hidden must be a positive multiple of {VEC}, got {hidden}')


@T.macro
def block_sum(values, count, scratch, warps):
    """Sum values[0:count] (each thread's local partials) over the block, in an order fixed by the block size alone:
    a butterfly within each warp, then the warps' sums in ascending warp order. The totals land in
    scratch[0, 0:count] (shared, (warps, count)), which every thread may read after this returns."""
    tid = T.get_thread_binding()
    for i in T.unroll(count):
        values[i] = T.warp_reduce_sum(values[i])
    if tid % 32 == 0:
        for i in T.unroll(count):
            scratch[tid // 32, i] = values[i]
    T.sync_threads()
    for k in T.unroll(-(-count // (32 * warps))):
        i = k * 32 * warps + tid
        if i < count:
            for w in T.serial(1, warps):
                scratch[0, i] = scratch[0, i] + scratch[w, i]
    T.sync_threads()


def mix_vector(mhc: int) -> int:
    """float32 values of a token's mix row loaded together: rows of mhc (or mhc * mhc) floats are read in vectors of
    up to 16 bytes, which the ops' alignment checks guarantee (a mix tensor's pointer 4 * mix_vector(mhc) bytes
    aligned)."""
    return math.gcd(mhc, 4)


@T.macro
def load_streams(rs, streams, src, token, s, tid, mhc):
    """streams[j, m, :] = src[token, m, the j-th vector of thread `tid` in slice `s`] for every stream m: the
    thread's vectors of a token's (mhc, hidden) rows, columns past hidden left as they are."""
    for j in T.unroll(rs.vectors):
        col = rs.column(s, tid, j)
        if not rs.ragged or col < rs.hidden:
            for m in T.unroll(mhc):
                for v in T.vectorized(VEC):
                    streams[j, m, v] = src[token, m, col + v]


@T.macro
def load_row(dst, src, token, count, width):
    """dst[0:count] = src[token, 0:count] (float32), `width` values a load."""
    for k in T.unroll(count // width):
        for v in T.vectorized(width):
            dst[k * width + v] = src[token, k * width + v]
