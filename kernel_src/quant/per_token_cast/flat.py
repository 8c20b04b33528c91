"""per_token_cast's flat kernel: the vectors of all rows as one sequence, a block's lanes adjacent in a warp."""

import dataclasses

from tilelang import language as T

from kernel_src.cuda import prelude
from kernel_src.decl import Arch, KernelProgram
from kernel_src.quant.addressing import magic_quotient, unsigned_index, unsigned_wide_mad
from kernel_src.quant.common import (
    FORMATS, IN_DTYPES, MODE_PRECOMPUTED, MODE_SF_ONLY, block_scale, e2m1_saturated, e2m1_vector_codes, products_bounded,
)
from kernel_src.quant.token_sf import bf16_amax_into, sf_flat_view, store_token_sf_flat, token_sf_tensor

NUM_THREADS = 128
NUM_VECTORS = 4  # 16-byte vectors per thread: 64 bytes of loads in flight
# Bytes a vector: 32 where the input's pointer and row stride allow, else 16. tilelang lowers a thread's 32 aligned
# bytes to one LDG / STG.E.ENL2.256 on SM100 (upstream's casts use 256-bit accesses there) and to two 16-byte ones
# on sm_90a, where the 32-byte kernels are still faster: two vectors a thread instead of four, so half the per-vector
# work (indices, masks, butterflies, scale factors) per byte.
VEC_BYTES = (16, 32)
# Resident CTAs per SM asked of ptxas (__launch_bounds__'s second argument). The kernel is latency-bound and every load
# of a CTA is issued at once, so the bytes in flight per SM grow with the resident CTAs. Unbounded, bf16 e2m1 takes 96
# registers (5 CTAs), capped at 80 with no spill (6 CTAs); the aligned e4m3 kernels are already under 80 (63), so the cap
# does not touch them; at 64 the unaligned bf16 e4m3 one spills 16 bytes. Every e2m1 kernel fits 64 registers (8 CTAs)
# without a spill, its encoding unclamped (E2M1_UNCLAMPED_BOUND); at 56 registers (9 CTAs) the bf16 ones spill.
FLAT_MIN_BLOCKS, E2M1_MIN_BLOCKS = 6, 8
# SM100's ptxas spills the bf16 e2m1 kernels with float32 scale factors at 64 registers (8 and 24 bytes a thread).
E2M1_MIN_BLOCKS_BY_FAMILY = {('sm_100', 'bfloat16', 'f32'): 7}
# The unaligned bf16 kernel's loads: a vector's eight elements as the five aligned words that cover them, funnelled
# into place by byte permutes (kernel_src/cuda/unaligned_bf16.cuh). Eight 2-byte loads a vector, each instruction of a
# warp touching the same 512 bytes, leave the kernel far below copy bandwidth; its integer pipe is its bound, which the
# header's address arithmetic (on the FMA pipe) and its permutes (tk_prmt, kernel_src.quant.nibbles) spare.
UNALIGNED_BF16_PRELUDE = prelude('prmt.cuh', 'unaligned_bf16.cuh')


def buffer_types(fp4: bool, packed: bool):
    """The run-time dims and buffer types both kernels take: num_tokens, hidden, row_stride (of x, in
    elements), num_sf_blocks, num_sf_words, then out's shape and dtype (e2m1 as int8 pairs) and out_sf's type."""
    num_tokens, hidden = T.dynamic('num_tokens'), T.dynamic('hidden')
    num_sf_blocks, num_sf_words = T.dynamic('num_sf_blocks'), T.dynamic('num_sf_words')
    sf_type = token_sf_tensor(packed, num_tokens, num_sf_blocks, num_sf_words, T.dynamic('sf_word_stride'),
                              T.dynamic('sf_stride_t'), T.dynamic('sf_stride_k'))
    out_type = (num_tokens, hidden // 2) if fp4 else (num_tokens, hidden)
    return num_tokens, hidden, T.dynamic('row_stride'), num_sf_blocks, num_sf_words, out_type, T.int8 if fp4 else T.float8_e4m3fn, sf_type


def pick(values, k):
    """values[k] for a run-time k in [0, len(values)): a tree of selects on the bits of k (len - 1 SEL),
    where a chain of `k == j` selects becomes branches around predicated moves in nvcc."""
    if len(values) == 1:
        return values[0]
    return T.Select((k & 1) != 0, pick(values[1::2], k >> 1), pick(values[0::2], k >> 1))


@dataclasses.dataclass(frozen=True, eq=False)
class Flat:
    """The flat kernel's compile-time shape and its run-time dims (TIR variables), which its macros read as plain
    Python attributes."""

    in_dtype: str
    fp4: bool
    packed: bool
    aligned: bool
    epv: int  # elements per vector
    num_threads: int
    num_vectors: int
    num_tokens: object
    hidden: object
    row_stride: object
    num_sf_blocks: object
    num_sf_words: object

    fmax = property(lambda self: FORMATS['e2m1' if self.fp4 else 'e4m3'][0])
    floor = property(lambda self: FORMATS['e2m1' if self.fp4 else 'e4m3'][1])
    slots = property(lambda self: self.num_threads * self.num_vectors)  # vectors a CTA
    group_log2 = property(lambda self: (self.num_vectors - 1).bit_length())  # lanes that share the scale work, log2
    code_word = property(lambda self: f'uint{4 * self.epv}')  # e2m1: the codes of one vector
    # bf16 to e2m1 is widened to float32 once (into `wide`) for the amax and the cast alike: converting at each use
    # leaves nvcc unpacking elements twice. bf16 to e4m3 takes its amax on bf16 pairs, as the per-row kernel does, and
    # widens only at the cast: a float32 copy holds 64-72 registers (7 CTAs an SM with packed UE8M0 scale factors),
    # where the pairs need 47-55.
    widen = property(lambda self: self.in_dtype != 'float32' and self.fp4)
    bf16_pairs = property(lambda self: self.in_dtype == 'bfloat16' and not self.fp4)
    word_loads = property(lambda self: not self.aligned and self.in_dtype == 'bfloat16')  # UNALIGNED_BF16_PRELUDE

    def as_float(self, values, wide, j, e):
        return wide[j, e] if self.widen else T.Cast('float32', values[j, e])


@T.macro
def locate(f: Flat, pid, tid, rows, vecs, vectors_per_row, row_magic, row_shift):
    """Row and column (in vectors) of each of the thread's vectors, computed once into int32 registers (the column as
    a vector index, so that tilelang still proves col = vec * epv a multiple of the vector and emits whole-vector
    accesses): row = v // vectors_per_row by a 32 x 32 -> 64-bit multiply and a shift (row_magic < 2^32 and v < 2^31,
    see tile_kernels_aot.quant), two instructions, where 64-bit arithmetic on the signed magic costs ~10 and is
    rematerialised at every use. Vectors past the last row get a row of num_tokens or more, which the masks treat as
    inactive."""
    for j in T.unroll(f.num_vectors):
        v = pid * f.slots + j * f.num_threads + tid
        rows[j] = magic_quotient(v, row_magic, row_shift)
        vecs[j] = v - rows[j] * vectors_per_row


@T.macro
def load_vectors(f: Flat, x, x_flat, values, rows, vecs):
    """The thread's vectors of x into values; aligned, a masked vector reads as zeros, which cannot raise an amax."""
    for j in T.unroll(f.num_vectors):
        if f.aligned:
            if rows[j] < f.num_tokens and vecs[j] * f.epv < f.hidden:
                # In whole vectors, unsigned: one IMAD.WIDE.U32 (row * stride + vector) where the signed int64
                # row * row_stride + col takes a sign extension and three multiplies.
                for e in T.vectorized(f.epv):
                    values[j, e] = x_flat[unsigned_wide_mad(rows[j], f.row_stride // f.epv, vecs[j]) * f.epv + e]
            else:
                for e in T.vectorized(f.epv):
                    values[j, e] = T.cast(0, f.in_dtype)
        else:
            # Element by element (bf16: as aligned words, UNALIGNED_BF16_PRELUDE), unconditionally, from the vector's
            # row and column clamped into x (a masked vector reads a valid one and its amax is zeroed in
            # vector_amaxes). Under the bounds `if` nvcc merges each vector's halves (PRMT) inside the branch, so that
            # each vector waits for its loads before the next vector's are issued; unconditional, all of a thread's
            # loads are in flight at once.
            row_in_x = T.min(rows[j], f.num_tokens - 1)
            col_in_x = T.min(vecs[j], f.hidden // f.epv - 1) * f.epv
            if f.word_loads:
                T.evaluate(T.call_extern('void', 'tk_load_bf16x8_words', x.data, row_in_x, f.row_stride, col_in_x,
                                         T.address_of(values[j, 0])))
            else:
                for e in T.unroll(f.epv):
                    values[j, e] = x[T.Cast('int64', row_in_x), col_in_x + e]


@T.macro
def vector_amaxes(f: Flat, values, wide, amax, rows, vecs, lanes_log2):
    """amax[j] = the amax of the block of the thread's vector j: the vector's own, then a butterfly over the block's
    2^lanes_log2 adjacent lanes. bf16 to e2m1 widens the values into `wide` first."""
    if f.widen:
        # A bf16 is the top half of its float32: the even element of each word is the word shifted up 16, the odd
        # one the word with its low half masked off, one instruction each. The plain conversion costs the odd
        # element a PRMT (moving it down) and then the same shift.
        words = T.view(values, (f.num_vectors, f.epv // 2), T.uint32)
        for j in T.unroll(f.num_vectors):
            for w in T.unroll(f.epv // 2):
                wide[j, 2 * w] = T.reinterpret(words[j, w] << T.uint32(16), T.float32)
                wide[j, 2 * w + 1] = T.reinterpret(words[j, w] & T.uint32(0xFFFF0000), T.float32)
    for j in T.unroll(f.num_vectors):
        if f.fp4:
            # Started from the first pair (one FMNMX of two |.|), not from 0: a vector of NaNs then has a NaN amax
            # instead of 0, which the butterfly's fmaxf skips and block_scale's max(amax, floor) turns into the
            # floor, as it does 0: the same scale factors.
            amax[j] = T.max(T.abs(f.as_float(values, wide, j, 0)), T.abs(f.as_float(values, wide, j, 1)))
            for e in T.unroll(2, f.epv):
                amax[j] = T.max(amax[j], T.abs(f.as_float(values, wide, j, e)))
        elif f.bf16_pairs:
            amax[j] = T.float32(0)
            bf16_amax_into(values, amax, 1, f.epv // 2, row=j, into=j)
        else:
            amax[j] = T.float32(0)
            for e in T.unroll(f.epv):
                amax[j] = T.max(amax[j], T.abs(f.as_float(values, wide, j, e)))
        if not f.aligned:
            # A masked vector's values are another vector's: as the aligned path's zeros, it must not raise its
            # block's amax (one select per vector; its casts are computed and dropped).
            amax[j] = T.Select(rows[j] < f.num_tokens and vecs[j] * f.epv < f.hidden, amax[j], T.float32(0))

    # The butterfly: one uniform branch per step for all vectors (not one per step and vector), and the vectors'
    # shuffles overlap.
    for s in T.unroll(5):
        if s < lanes_log2:
            for j in T.unroll(f.num_vectors):
                amax[j] = T.max(amax[j], T.shfl_xor(amax[j], 1 << s))


@T.macro
def scale_vectors(f: Flat, tid, amax, sf, multiplier, rows, vecs, unclamped: T.Ref, out_sf, out_sf_flat, sf_row_step, sf_block_step, lanes_log2,
                  npc_log2, round_sf, mode):
    """multiplier[j] of each vector's block, its scale factor stored (but with precomputed ones, mode 2, whose
    multiplier is 1 / sf), and for e2m1 `unclamped`: whether every product lies within E2M1_UNCLAMPED_BOUND (see
    cast_vectors), tested here, where the amaxes are still live: tested later, they stay live through the scale factors'
    stores and the unaligned bf16 kernel spills at its 64 registers."""
    group = 1 << f.group_log2
    if mode == MODE_PRECOMPUTED:
        if not f.packed:
            for j in T.unroll(f.num_vectors):
                if rows[j] < f.num_tokens and vecs[j] * f.epv < f.hidden and (vecs[j] * f.epv >> npc_log2) < f.num_sf_blocks:
                    multiplier[j] = T.float32(1) / out_sf[rows[j], vecs[j] * f.epv >> npc_log2]
            if f.fp4:
                unclamped = products_bounded([amax[j] for j in range(f.num_vectors)], [multiplier[j] for j in range(f.num_vectors)])
    else:
        # All lanes of a block hold its amax, so lane k of each aligned group of `group` lanes (inside one block when a
        # block has that many lanes) scales only its vector k and shuffles the multipliers to the group: two IEEE
        # divisions per thread, not per vector.
        if lanes_log2 >= f.group_log2:
            k = tid & (group - 1)
            block_scale(pick([amax[j] for j in range(f.num_vectors)], k), T.float32(f.floor), f.fmax, round_sf, f.packed, sf, multiplier, 0)
            own_sf = T.alloc_var(T.float32)
            own_sf = sf[0]
            own_mult = T.alloc_var(T.float32)
            own_mult = multiplier[0]
            for j in T.unroll(f.num_vectors):
                multiplier[j] = T.shfl_sync(own_mult, (tid & ~(group - 1)) + j)
            if f.fp4:
                # Each lane tests its own vector k; the warp's vote covers the group's (and more).
                own_bounded = products_bounded([pick([amax[j] for j in range(f.num_vectors)], k)], [own_mult])
                unclamped = T.call_extern('int32', '__all_sync', T.uint32(0xFFFFFFFF), own_bounded) != 0
            # The lanes at offsets 0..num_vectors-1 of a block store the scale factors of their own vector k (offset k
            # of the block is lane k of its group): one store per thread, where testing every vector's lane would cost
            # each thread all num_vectors store paths.
            if (tid & ((1 << lanes_log2) - 1)) < f.num_vectors:
                store_token_sf_flat(out_sf_flat, f.packed, pick([rows[j] for j in range(f.num_vectors)], k),
                                    pick([vecs[j] for j in range(f.num_vectors)], k) * f.epv, own_sf, npc_log2, f.hidden, f.num_tokens,
                                    f.num_sf_blocks, f.num_sf_words, sf_row_step, sf_block_step)
        else:
            for j in T.unroll(f.num_vectors):
                block_scale(amax[j], T.float32(f.floor), f.fmax, round_sf, f.packed, sf, multiplier, j)
            if f.fp4:
                unclamped = products_bounded([amax[j] for j in range(f.num_vectors)], [multiplier[j] for j in range(f.num_vectors)])  # noqa: F841  (a store to the caller's variable, through the T.Ref)
            # A block has fewer lanes than a group: its first lane stores each of its vectors'.
            for j in T.unroll(f.num_vectors):
                if (tid & ((1 << lanes_log2) - 1)) == 0:
                    store_token_sf_flat(out_sf_flat, f.packed, rows[j], vecs[j] * f.epv, sf[j], npc_log2, f.hidden, f.num_tokens, f.num_sf_blocks,
                                        f.num_sf_words, sf_row_step, sf_block_step)


@T.macro
def cast_e2m1(f: Flat, out_flat, values, wide, multiplier, rows, vecs):
    for j in T.unroll(f.num_vectors):
        # A vector's codes as one word (4 bits per element: 32 bits for bf16, 16 for fp32) that the byte-vector store
        # reads back whole, computed outside the store's condition: tilelang emits that store as a block of its own,
        # and bytes written one by one, or under another `if`, stay separate registers that nvcc merges back byte by
        # byte. A masked vector's codes are computed and dropped.
        codes = T.alloc_local((1,), f.code_word)
        codes[0] = e2m1_vector_codes([f.as_float(values, wide, j, e) * multiplier[j] for e in range(f.epv)], clamp=False)
        code_bytes = T.view(codes, (f.epv // 2,), T.int8)
        if rows[j] < f.num_tokens and vecs[j] * f.epv < f.hidden:
            # Addressed in code words by an unsigned 32-bit index (row * hidden + col < 2^31, the op's index limit): an
            # IMAD and one IMAD.WIDE.U32 from the base, where the 64-bit vector index takes seven instructions a store
            # and is rebuilt per store.
            for e in T.vectorized(f.epv // 2):
                out_flat[unsigned_index(rows[j] * (f.hidden // f.epv) + vecs[j]) * (f.epv // 2) + e] = code_bytes[e]


@T.macro
def cast_vectors(f: Flat, out_flat, values, wide, multiplier, rows, vecs, unclamped: T.Ref, mode):
    """The codes of the thread's vectors, stored (but for scale factors only, mode 1)."""
    if mode != MODE_SF_ONLY and f.fp4:
        # The codes without e2m1_top_nibble's clamp, one integer-pipe instruction an element fewer: every product lies
        # within E2M1_UNCLAMPED_BOUND where its vector's amax * multiplier does (always, in a plain cast of finite
        # values). Otherwise (NaN fails the test too) the products are clamped beforehand, in place, and the
        # multipliers become 1: one encoding path, where a second, clamped, copy of it makes nvcc spill (the unaligned
        # bf16 kernel at its 64 registers).
        if not unclamped:
            for j in T.unroll(f.num_vectors):
                for e in T.unroll(f.epv):
                    if f.widen:
                        wide[j, e] = e2m1_saturated(wide[j, e] * multiplier[j])
                    else:
                        values[j, e] = e2m1_saturated(values[j, e] * multiplier[j])
                multiplier[j] = T.float32(1)
        cast_e2m1(f, out_flat, values, wide, multiplier, rows, vecs)
    elif mode != MODE_SF_ONLY:
        for j in T.unroll(f.num_vectors):
            if rows[j] < f.num_tokens and vecs[j] * f.epv < f.hidden:
                # Vectorised, so that tilelang converts pairs (one F2FP per two elements, packed in place) instead of
                # one F2FP per element and a byte merge each.
                quantized = T.alloc_local((f.epv,), T.float8_e4m3fn)
                for e in T.vectorized(f.epv):
                    quantized[e] = T.Cast(T.float8_e4m3fn, f.as_float(values, wide, j, e) * multiplier[j])
                for e in T.vectorized(f.epv):
                    out_flat[unsigned_wide_mad(rows[j], f.hidden // f.epv, vecs[j]) * f.epv + e] = quantized[e]


def build_flat(arch: Arch, in_dtype: str, fmt: str, sf_format: str, aligned: bool, vec_bytes: int, num_threads: int,
               num_vectors: int) -> KernelProgram:
    """The flat kernel (per_row=False); num_vectors 0 takes 64 bytes of loads a thread."""
    elem_bytes = IN_DTYPES[in_dtype]
    epv = vec_bytes // elem_bytes
    fp4 = fmt == 'e2m1'
    packed = sf_format == 'ue8m0'
    num_vectors = num_vectors or NUM_VECTORS * 16 // vec_bytes
    min_blocks = E2M1_MIN_BLOCKS_BY_FAMILY.get((arch.family, in_dtype, sf_format), E2M1_MIN_BLOCKS) if fp4 else FLAT_MIN_BLOCKS
    num_tokens, hidden, row_stride, num_sf_blocks, num_sf_words, out_type, out_dtype, sf_type = buffer_types(fp4, packed)
    f = Flat(in_dtype, fp4, packed, aligned, epv, num_threads, num_vectors, num_tokens, hidden, row_stride, num_sf_blocks, num_sf_words)

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, hidden), (row_stride, 1), in_dtype],
        out: T.Tensor[out_type, out_dtype],
        out_sf: sf_type,
        vectors_per_row: T.int32,
        row_magic: T.int64,
        row_shift: T.int32,
        npc_log2: T.int32,
        round_sf: T.int32,
        mode: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * vectors_per_row, f.slots), threads=num_threads,
                      prelude=UNALIGNED_BF16_PRELUDE if f.word_loads else None) as pid:
            T.annotate_min_blocks_per_sm(min_blocks)
            T.assume(hidden % 16 == 0)
            if aligned:
                T.assume(row_stride % epv == 0)
            tid = T.get_thread_binding()
            values = T.alloc_local((num_vectors, epv), in_dtype)
            amax = T.alloc_local((num_vectors,), T.float32)
            multiplier = T.alloc_local((num_vectors,), T.float32)
            sf = T.alloc_local((num_vectors,), T.float32)
            rows = T.alloc_local((num_vectors,), T.int32)
            vecs = T.alloc_local((num_vectors,), T.int32)
            lanes_log2 = npc_log2 - (epv.bit_length() - 1)  # lanes per block, log2
            # Flat views of the rows (x up to its last row's start plus hidden, out whole), addressed in vectors by
            # unsigned_wide_mad.
            x_flat = T.Tensor(((num_tokens - 1) * row_stride + hidden,), in_dtype, x.data)
            out_flat = T.reshape(out, (num_tokens * out_type[1],))
            out_sf_flat, sf_row_step, sf_block_step = sf_flat_view(out_sf, packed)

            # Load every vector of the thread, then the blocks' amaxes, scale factors (stored) and codes (stored).
            locate(f, pid, tid, rows, vecs, vectors_per_row, row_magic, row_shift)
            load_vectors(f, x, x_flat, values, rows, vecs)
            wide = T.alloc_local((num_vectors, epv) if f.widen else (1,), T.float32)
            vector_amaxes(f, values, wide, amax, rows, vecs, lanes_log2)
            unclamped = T.alloc_var(T.bool)
            scale_vectors(f, tid, amax, sf, multiplier, rows, vecs, unclamped, out_sf, out_sf_flat, sf_row_step, sf_block_step, lanes_log2, npc_log2,
                          round_sf, mode)
            cast_vectors(f, out_flat, values, wide, multiplier, rows, vecs, unclamped, mode)

    return KernelProgram(per_token_cast, alignment={'x': vec_bytes if aligned else elem_bytes, 'out': 16, 'out_sf': 1 if packed else 4})
