"""Sums over tokens that do not depend on the grid: the scale and base gradients of the mixing kernels' backward.

The backward programs (mhc.pre_split_mixes_bwd, mhc.head_compute_mix_bwd) run two kernels. The first has one
CTA per chunk of CHUNK tokens, a thread per token; each thread puts its token's K terms in shared memory and
thread k < K adds term k of the chunk's tokens in token order, writing the chunk's partial[chunk, k]. The second
is one CTA with a warp per term: lane l adds partial[c, k] for c = l, l + 32, ... in order, then the 32 lanes
combine with a butterfly of shuffles. Every addition's operands are fixed by the token count alone, so the
result is bitwise the same on every GPU and at every SM count; a second launch keeps the whole sum on the GPU
without atomics, fences or a zeroed counter.
"""

from tilelang import language as T

CHUNK = 64  # tokens per partial sum: threads of the first kernel's CTA
WARP = 32


def num_chunks(num_tokens):
    return T.ceildiv(num_tokens, CHUNK)


@T.macro
def write_chunk_partial(terms, partial, num_terms, chunk, tid):
    """terms: shared (num_terms, CHUNK), every thread's column written (zeros for tokens past the end).
    Thread k < num_terms writes partial[chunk, k], the sum of row k in token order."""
    T.sync_threads()
    if tid < num_terms:
        total = T.alloc_var(T.float32)
        total = terms[tid, 0]
        for i in T.unroll(1, CHUNK):
            total = total + terms[tid, i]
        partial[chunk, tid] = total


@T.macro
def reduce_chunk_partials(partial, chunks, term, lane, out, index):
    """out[index] = sum over c < chunks of partial[c, term]: lane-strided sums in order, then a butterfly."""
    total = T.alloc_var(T.float32)
    total = T.float32(0)
    for step in T.serial(T.ceildiv(chunks, WARP)):
        c = step * WARP + lane
        if c < chunks:
            total = total + partial[c, term]
    for s in T.unroll(5):
        total = total + T.shfl_xor(total, 16 >> s)
    if lane == 0:
        out[index] = total
