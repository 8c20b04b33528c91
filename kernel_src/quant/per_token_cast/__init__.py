"""quant.per_token_cast: bf16/fp32 rows to e4m3 or e2m1 with one scale factor per (1, num_per_channels) block.

Per block: amax = max |x|, clamped = max(amax, floor), sf = clamped / max and the multiplier max / clamped
(two IEEE divisions, as upstream), or with `round_sf` sf rounded up to a power of two and the multiplier
its exact inverse. e4m3: max 448, floor 1e-4, out = e4m3_satfinite(x * multiplier). e2m1: max 6, floor
6 * 2^-126, out = e2m1 RTNE saturated at 6, two codes per byte, the even column in the low nibble.

Only the number format, the scale-factor storage (float32, or packed UE8M0 bytes), the input dtype, the
input alignment and whether a block is a whole row are compile time. The hidden size, the block width
(16..128, a power of two), round_sf, the scale-factor strides (row-major or TMA-aligned column-major
float32) and the mode (cast, scale factors only, or cast with precomputed scale factors, whose multiplier
is 1 / sf) are run-time arguments, so a handful of binaries serve every model.

Layout (`per_row=False`, flat.py): each row is padded to whole blocks and cut into vectors of `vec_bytes` (32 where
the input's pointer and row stride are 32-byte aligned, else 16, see VEC_BYTES); the vectors of all rows form one flat
sequence of `num_tokens * vectors_per_row`, and CTA b owns vectors [b * slots, (b + 1) * slots) with thread t holding
vectors b * slots + j * 128 + t. So no slot is idle whatever the hidden size, and a block's lanes are adjacent in a
warp (a row is a whole number of blocks), which makes the block amax a butterfly of shuffles. The row of a flat vector
index comes from a multiply-shift by a host-computed magic number, not a division. Padding reads as zero, which cannot
raise an amax. `per_row=True` (num_per_channels == hidden) is its own kernel (per_row.py): a row to a CTA, held in
registers in chunks of 128 x ROW_VECTORS vectors (one chunk for bf16 rows up to 8192 channels and every float32 row;
wider bf16 rows are read twice), the amax reduced through shared memory.

The `aligned` variant assumes a pointer and row stride aligned to the vector; the other (16-byte vectors) loads element
by element (bf16: by the aligned 4-byte words that hold them), unconditionally from indices clamped into x, and zeroes
a masked vector's amax instead of its values. Every store is masked against the buffer dims, so no run-time argument
can make it write out of bounds.
"""

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import INDEX_LIMIT
from kernel_src.quant.common import FORMATS, IN_DTYPES, SF_FORMATS
from kernel_src.quant.per_token_cast.flat import NUM_THREADS, NUM_VECTORS, VEC_BYTES, build_flat
from kernel_src.quant.per_token_cast.per_row import ROW_VECTORS, build_per_row

__all__ = ['DECL', 'NUM_THREADS', 'NUM_VECTORS', 'ROW_VECTORS', 'VEC_BYTES', 'build', 'check', 'prebuilt']


def check(in_dtype: str, fmt: str, sf_format: str, per_row: bool, aligned: bool, vec_bytes: int) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if fmt not in FORMATS:
        raise ValueError(f'fmt must be one of {sorted(FORMATS)}, got {fmt!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')
    if vec_bytes not in VEC_BYTES:
        raise ValueError(f'vec_bytes must be one of {VEC_BYTES}, got {vec_bytes!r}')
    if vec_bytes != 16 and (per_row or not aligned):
        raise ValueError('vec_bytes=32 is built for the flat aligned kernel only')


def build(arch: Arch, in_dtype: str, fmt: str, sf_format: str, per_row: bool, aligned: bool, vec_bytes: int,
          num_threads: int = NUM_THREADS, num_vectors: int = 0) -> KernelProgram:
    """num_threads and num_vectors (0: 64 bytes of loads a thread) are tuning knobs of the flat kernel (benchmarks/tuning.py)."""
    if per_row:
        return build_per_row(in_dtype, fmt, sf_format)
    return build_flat(arch, in_dtype, fmt, sf_format, aligned, vec_bytes, num_threads, num_vectors)


def prebuilt():
    for in_dtype in IN_DTYPES:
        for fmt in FORMATS:
            for sf_format in SF_FORMATS:
                for vec_bytes in VEC_BYTES:
                    yield dict(in_dtype=in_dtype, fmt=fmt, sf_format=sf_format, per_row=False, aligned=True, vec_bytes=vec_bytes)
                yield dict(in_dtype=in_dtype, fmt=fmt, sf_format=sf_format, per_row=False, aligned=False, vec_bytes=16)
                yield dict(in_dtype=in_dtype, fmt=fmt, sf_format=sf_format, per_row=True, aligned=True, vec_bytes=16)


DECL = KernelDecl(
    name='quant.per_token_cast',
    params=(
        param('in_dtype', 'str', ''),
        param('fmt', 'str', ''),
        param('sf_format', 'str', 'sf'),
        param('per_row', 'bool', 'row'),
        param('aligned', 'bool', 'al'),
        param('vec_bytes', 'int', 'vb'),
    ),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    # Every access is masked explicitly (against the buffer dims); tilelang's own per-element guards would
    # stop the 16-byte vectorisation, since it cannot prove that a vector never straddles the run-time hidden.
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
    constants={'index_limit': INDEX_LIMIT},  # bounds the elements of x, rows padded to whole blocks: flat indices stay int32
)
