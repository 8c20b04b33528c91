"""quant.per_token_cast to e4m3 with row-major fp32 scale factors, blocks of (1, num_per_channels).

Per block: amax = max |x|, clamped = max(amax, 1e-4), sf = clamped / 448 and the multiplier
448 / clamped (two IEEE divisions, as upstream), or with `round_sf` sf rounded up to a power of two and
the multiplier its exact inverse. out = e4m3_satfinite(x * multiplier).

A row, padded to whole blocks, is a run of 16-byte vectors. A CTA owns `num_vectors` vectors per thread:
a slice of one row when rows are long, several whole rows when they are short; the grid is (row groups,
row slices), so no thread ever divides by a run-time or 64-bit quantity. All of a thread's loads are
issued before any arithmetic. The lanes holding one block are adjacent in a warp, so the block amax is a
butterfly of shuffles and never touches shared memory; the padding is masked and reads as zero, which
cannot raise an amax. The row stride is a run-time argument; the `aligned` variant assumes a 16-byte
aligned pointer and row stride, the other loads element by element.
"""

from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

E4M3_MAX = 448.0
E4M3_AMAX_FLOOR = 1e-4
NUM_THREADS = 128
IN_DTYPES = {'bfloat16': 2, 'float32': 4}


def check(in_dtype: str, hidden: int, num_per_channels: int, round_sf: bool, aligned: bool) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if num_per_channels not in (16, 32, 64, 128):
        raise ValueError(f'num_per_channels must be 16, 32, 64 or 128, got {num_per_channels}')
    if hidden <= 0 or hidden % 16:
        raise ValueError(f'hidden must be a positive multiple of 16, got {hidden}')


def vectors_per_thread(vectors_per_row: int, num_threads: int) -> int:
    """Vectors per thread (1..7) for rows of `vectors_per_row` vectors, from the H200 sweep in
    docs/benchmarks.md: rows shorter than a CTA get one vector per thread (several rows per CTA);
    longer rows get the count that leaves the fewest idle slots per row slice, the largest on a tie
    (more loads in flight), as long as one slice never spans two rows."""
    if vectors_per_row < num_threads:
        return 1

    def idle(n: int) -> float:
        slots = num_threads * n
        return 1 - vectors_per_row / (-(-vectors_per_row // slots) * slots)

    fits = [n for n in range(1, 8) if num_threads * n < 2 * vectors_per_row]
    return min(fits, key=lambda n: (round(idle(n), 6), -n))


def build(arch: Arch, in_dtype: str, hidden: int, num_per_channels: int, round_sf: bool, aligned: bool,
          num_threads: int = NUM_THREADS, num_vectors: int = 0) -> KernelProgram:
    elems_per_vector = 16 // IN_DTYPES[in_dtype]
    lanes_per_block = num_per_channels // elems_per_vector
    padded_hidden = (hidden + num_per_channels - 1) // num_per_channels * num_per_channels
    vectors_per_row = padded_hidden // elems_per_vector
    num_blocks = (hidden + num_per_channels - 1) // num_per_channels
    num_vectors = num_vectors or vectors_per_thread(vectors_per_row, num_threads)
    slots = num_threads * num_vectors
    rows_per_cta = max(slots // vectors_per_row, 1)
    slices_per_row = -(-vectors_per_row // slots) if rows_per_cta == 1 else 1

    num_tokens = T.dynamic('num_tokens')
    row_stride = T.dynamic('row_stride')
    load_loop = T.vectorized if aligned else T.unroll  # unaligned rows load element by element

    # Row and column (in elements) of a thread's j-th vector, as plain expressions so that tilelang can
    # prove the column is a multiple of the vector and emit 16-byte accesses.
    def row_of(pid_row, j, tid):
        if rows_per_cta == 1:
            return pid_row
        group_row = (j * num_threads + tid) // vectors_per_row
        # Slots past the last whole row of the group get a row past the end: they are inactive.
        return T.if_then_else(group_row < rows_per_cta, pid_row * rows_per_cta + group_row, num_tokens)

    def col_of(pid_slice, j, tid):
        if rows_per_cta == 1:
            return (pid_slice * slots + j * num_threads + tid) * elems_per_vector
        return (j * num_threads + tid) % vectors_per_row * elems_per_vector

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, hidden), (row_stride, 1), in_dtype],
        out: T.Tensor[(num_tokens, hidden), T.float8_e4m3fn],
        out_sf: T.Tensor[(num_tokens, num_blocks), T.float32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows_per_cta), slices_per_row, threads=num_threads) as (pid_row, pid_slice):
            if aligned:
                T.assume(row_stride % elems_per_vector == 0)
            tid = T.get_thread_binding()
            values = T.alloc_local((num_vectors, elems_per_vector), in_dtype)
            quantized = T.alloc_local((num_vectors, elems_per_vector), T.float8_e4m3fn)
            amax = T.alloc_local((num_vectors,), T.float32)
            multiplier = T.alloc_local((num_vectors,), T.float32)
            for j in T.unroll(num_vectors):
                row, col = row_of(pid_row, j, tid), col_of(pid_slice, j, tid)
                if row < num_tokens and col < hidden:
                    for e in load_loop(elems_per_vector):
                        values[j, e] = x[row, col + e]
                else:
                    for e in T.vectorized(elems_per_vector):
                        values[j, e] = T.cast(0, in_dtype)
            for j in T.unroll(num_vectors):
                amax[j] = T.float32(0)
                for e in T.unroll(elems_per_vector):
                    amax[j] = T.max(amax[j], T.abs(T.Cast('float32', values[j, e])))
                for s in T.unroll(lanes_per_block.bit_length() - 1):
                    amax[j] = T.max(amax[j], T.shfl_xor(amax[j], lanes_per_block >> (s + 1)))
            for j in T.unroll(num_vectors):
                row, col = row_of(pid_row, j, tid), col_of(pid_slice, j, tid)
                clamped = T.max(amax[j], T.float32(E4M3_AMAX_FLOOR))
                sf = T.alloc_var(T.float32)
                sf = clamped / T.float32(E4M3_MAX)
                if round_sf:
                    # (bits - 1) >> 23, plus one, is ceil(log2(sf)) for a positive normal sf.
                    exponent = ((T.reinterpret(sf, T.uint32) - T.uint32(1)) >> T.uint32(23)) + T.uint32(1)
                    sf = T.reinterpret(exponent << T.uint32(23), T.float32)
                    multiplier[j] = T.reinterpret((T.uint32(254) - exponent) << T.uint32(23), T.float32)
                else:
                    multiplier[j] = T.float32(E4M3_MAX) / clamped
                if row < num_tokens and col < hidden and tid % lanes_per_block == 0:
                    out_sf[row, col // num_per_channels] = sf
            for j in T.unroll(num_vectors):
                for e in T.unroll(elems_per_vector):
                    quantized[j, e] = T.Cast(T.float8_e4m3fn, T.Cast('float32', values[j, e]) * multiplier[j])
                row, col = row_of(pid_row, j, tid), col_of(pid_slice, j, tid)
                if row < num_tokens and col < hidden:
                    for e in T.vectorized(elems_per_vector):
                        out[row, col + e] = quantized[j, e]

    return KernelProgram(per_token_cast, alignment={'x': 16 if aligned else IN_DTYPES[in_dtype], 'out': 16, 'out_sf': 4})


def prebuilt():
    for in_dtype in IN_DTYPES:
        for hidden in models.hidden_sizes():
            for num_per_channels in (32, 128):
                for round_sf in (False, True):
                    for aligned in (True, False):
                        yield dict(in_dtype=in_dtype, hidden=hidden, num_per_channels=num_per_channels, round_sf=round_sf, aligned=aligned)


DECL = KernelDecl(
    name='quant.per_token_cast',
    params=(
        param('in_dtype', 'str', ''),
        param('hidden', 'int', 'h'),
        param('num_per_channels', 'int', 'c'),
        param('round_sf', 'bool', 'rsf'),
        param('aligned', 'bool', 'al'),
    ),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True},
)
