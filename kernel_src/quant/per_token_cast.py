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

Layout (`per_row=False`): each row is padded to whole blocks and cut into vectors of `vec_bytes` (32 where the input's
pointer and row stride are 32-byte aligned, else 16, see VEC_BYTES); the vectors of all rows form one flat sequence
of `num_tokens * vectors_per_row`, and CTA b owns vectors [b * slots, (b + 1) * slots) with thread t holding vectors
b * slots + j * 128 + t. So no slot is idle
whatever the hidden size, and a block's lanes are adjacent in a warp (a row is a whole number of blocks),
which makes the block amax a butterfly of shuffles. The row of a flat vector index comes from a
multiply-shift by a host-computed magic number, not a division. Padding reads as zero, which cannot raise
an amax. `per_row=True` (num_per_channels == hidden) is its own kernel (build_per_row): a row to a CTA,
held in registers in chunks of 128 x ROW_VECTORS vectors (one chunk for bf16 rows up to 8192 channels and
every float32 row; wider bf16 rows are read twice), the amax reduced through shared memory.

The `aligned` variant assumes a pointer and row stride aligned to the vector; the other (16-byte vectors) loads element by
element (bf16: by the aligned 4-byte words that hold them), unconditionally from indices clamped into x,
and zeroes a masked vector's amax instead of its values. Every store is masked against the buffer dims, so no run-time argument can make it write
out of bounds.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import magic_quotient, unsigned_index, unsigned_wide_mad
from kernel_src.quant.common import (
    FORMATS, IN_DTYPES, MODE_PRECOMPUTED, MODE_SF_ONLY, SF_FORMATS, block_scale, e2m1_saturated, e2m1_vector_codes,
    products_bounded,
)
from kernel_src.quant.nibbles import PRMT_PRELUDE
from kernel_src.quant.token_sf import bf16_amax_into, cta_max, sf_flat_view, store_token_sf, store_token_sf_flat, token_sf_tensor

NUM_THREADS = 128
NUM_VECTORS = 4  # 16-byte vectors per thread in the flat layout: 64 bytes of loads in flight
# Bytes a vector of the flat aligned kernel: 32 where the input's pointer and row stride allow, else 16. tilelang
# lowers a thread's 32 aligned bytes to one LDG / STG.E.ENL2.256 on sm_100a (upstream's casts use 256-bit accesses
# there) and to two 16-byte ones on sm_90a, where the 32-byte kernels still measured faster: two vectors a thread
# instead of four, so half the per-vector work (indices, masks, butterflies, scale factors) per byte; bf16 -> e2m1
# 81.2-81.7% -> 87.7-88.3% of copy with float32 scale factors, 79.1-79.6% -> 84.7-85.2% with packed UE8M0, float32
# -> e2m1 95% -> 98-99%, e4m3 level near the ceiling (run 3 of docs/gpu-runs/2026-12-02-h200-c.md).
VEC_BYTES = (16, 32)
# per_row: 16-byte vectors a thread holds in registers (a chunk of 128 x that many vectors of the row). A
# CTA loads its chunk, then reduces and casts with nothing in flight, so the rows resident per SM are what
# hides the load latency, and the registers a row needs decide how many fit. bf16: 8 vectors (rows of up
# to 8192 channels in one chunk; 7168 fills 7 of them), 8 rows an SM; 16 vectors took 147 registers (3
# rows an SM, 56% of copy at H=7168). float32: 16 vectors (8192 channels, its limit), 4 rows an SM, where
# it already reaches 97% of copy bandwidth.
ROW_VECTORS = {'bfloat16': 8, 'float32': 16}
# Resident CTAs per SM asked of ptxas (__launch_bounds__'s second argument). Both kernels are latency-bound
# (Nsight: issue 0.47 per_row, 0.70 flat e2m1) and every load of a CTA is issued at once, so the bytes in
# flight per SM grow with the resident CTAs. Flat bf16 e2m1 took 96 registers (5 CTAs), capped 80 with no
# spill (6 CTAs); the aligned e4m3 kernels are already under 80 (63), so the cap does not touch them; at 64 the
# unaligned bf16 e4m3 one spills 16 bytes. Every flat e2m1 kernel fits 64 registers (8 CTAs) without a spill
# since its encoding dropped the clamp (E2M1_UNCLAMPED_BOUND): aligned bf16 e2m1 went from 80 registers (6 CTAs)
# to 66 (7) and measured 5% faster, up to 1% more at 8 CTAs (GPU runs 2-3 of docs/gpu-runs/2026-12-01-h200-h.md); at
# 56 registers (9 CTAs) the bf16 ones spill.
ROW_MIN_BLOCKS = {'bfloat16': 8, 'float32': 5}
FLAT_MIN_BLOCKS, E2M1_MIN_BLOCKS = 6, 8
# sm_100a's ptxas spills the bf16 e2m1 kernels with float32 scale factors at 64 registers (8 and 24 bytes a thread).
E2M1_MIN_BLOCKS_BY_TARGET = {('sm_100a', 'bfloat16', 'f32'): 7}

# The unaligned bf16 kernel's loads: a vector's eight elements at a 2-byte aligned address as the five aligned
# words that cover them (four when the address is 4-byte aligned: the fifth load repeats the fourth), funnelled
# into place by one byte permute a word. Eight 2-byte loads a vector, each instruction of a warp touching the
# same 512 bytes, took the kernel to 70% of copy bandwidth. Every word read holds an element of the vector, so
# no read leaves the memory the vector lies in. __ldg keeps them global loads (the address went through an
# integer, which made plain loads generic ones).
# The kernel's integer (ALU) pipe is its bound (80-82% busy, and its time tracked that pipe's instruction count
# against the aligned kernel's), so the address is formed on the FMA pipe, by two unsigned 32 x 32 -> 64-bit
# multiply-adds (row * 2 row_stride onto base + 2 col, both int32 >= 0), the fifth word is one of two predicated
# loads at fixed offsets (no address of its own), and the permute's selector is a multiply-add of the half-word
# bit (its permutes tk_prmt's, kernel_src.quant.nibbles): where the signed 64-bit index, its shifts and the selects took
# about seven ALU instructions a vector more (GPU run 1 of docs/gpu-runs/2026-12-01-h200-i.md: e2m1 50.5 -> 48.8 us).
_UNALIGNED_BF16_PRELUDE = """
template <typename T> __device__ __forceinline__ void tk_load_bf16x8_words(const T* base, int row, int row_stride, int col, void* dst) {
  const unsigned long long address = (unsigned long long)(unsigned)row * (2u * (unsigned)row_stride)
                                     + ((unsigned long long)base + 2ull * (unsigned)col);
  const unsigned* w = (const unsigned*)(address & ~3ull);
  const unsigned half_word = (unsigned)address & 2u;  // 2 when the vector starts in the high half of a word
  const unsigned w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3);
  unsigned w4;
  asm("{.reg .pred p; setp.ne.u32 p, %2, 0; @p ld.global.nc.u32 %0, [%1+16]; @!p ld.global.nc.u32 %0, [%1+12];}"
      : "=r"(w4) : "l"(w), "r"(half_word));
  // 0x5432 from the high half. tk_prmt (PRMT_PRELUDE), not __byte_perm, whose selector nvcc masks.
  const unsigned selector = 0x3210u + half_word * 0x1111u;
  unsigned* d = (unsigned*)dst;
  d[0] = tk_prmt(w0, w1, selector);
  d[1] = tk_prmt(w1, w2, selector);
  d[2] = tk_prmt(w2, w3, selector);
  d[3] = tk_prmt(w3, w4, selector);
}
"""


def pick(values, k):
    """values[k] for a run-time k in [0, len(values)): a tree of selects on the bits of k (len - 1 SEL),
    where a chain of `k == j` selects became branches around predicated moves in nvcc."""
    if len(values) == 1:
        return values[0]
    return T.Select((k & 1) != 0, pick(values[1::2], k >> 1), pick(values[0::2], k >> 1))


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


def _buffer_types(fp4: bool, packed: bool):
    """The run-time dims and buffer types both kernels take: num_tokens, hidden, row_stride (of x, in
    elements), num_sf_blocks, num_sf_words, then out's shape and dtype (e2m1 as int8 pairs) and out_sf's type."""
    num_tokens, hidden = T.dynamic('num_tokens'), T.dynamic('hidden')
    num_sf_blocks, num_sf_words = T.dynamic('num_sf_blocks'), T.dynamic('num_sf_words')
    sf_type = token_sf_tensor(packed, num_tokens, num_sf_blocks, num_sf_words, T.dynamic('sf_word_stride'),
                              T.dynamic('sf_stride_t'), T.dynamic('sf_stride_k'))
    out_type = (num_tokens, hidden // 2) if fp4 else (num_tokens, hidden)
    return num_tokens, hidden, T.dynamic('row_stride'), num_sf_blocks, num_sf_words, out_type, T.int8 if fp4 else T.float8_e4m3fn, sf_type


def build(arch: Arch, in_dtype: str, fmt: str, sf_format: str, per_row: bool, aligned: bool, vec_bytes: int,
          num_threads: int = NUM_THREADS, num_vectors: int = 0) -> KernelProgram:
    if per_row:
        return build_per_row(in_dtype, fmt, sf_format)
    elem_bytes = IN_DTYPES[in_dtype]
    epv = vec_bytes // elem_bytes  # elements per vector
    fp4 = fmt == 'e2m1'
    packed = sf_format == 'ue8m0'
    fmax, floor = FORMATS[fmt]
    num_vectors = num_vectors or NUM_VECTORS * 16 // vec_bytes  # 64 bytes of loads a thread either way
    min_blocks = E2M1_MIN_BLOCKS_BY_TARGET.get((arch.target, in_dtype, sf_format), E2M1_MIN_BLOCKS) if fp4 else FLAT_MIN_BLOCKS
    slots = num_threads * num_vectors
    group_log2 = (num_vectors - 1).bit_length()  # lanes that share the scale work, log2
    group = 1 << group_log2
    code_word = f'uint{4 * epv}'  # e2m1: the codes of one vector

    num_tokens, hidden, row_stride, num_sf_blocks, num_sf_words, out_type, out_dtype, sf_type = _buffer_types(fp4, packed)

    # Row and column (in elements) of a thread's j-th vector, computed once into int32 registers (the
    # column as a vector index, so that tilelang still proves col = vec * epv a multiple of the vector and
    # emits 16-byte accesses). Flat layout: row = v // vectors_per_row by a 32 x 32 -> 64-bit multiply and a
    # shift (row_magic < 2^32 and v < 2^31, see tile_kernels_aot.quant), two instructions, where 64-bit
    # arithmetic on the signed magic cost ~10 and was rematerialised at every use; vectors past the last
    # row get a row of num_tokens or more, which the masks treat as inactive.
    @T.macro
    def locate(pid, tid, rows, vecs, vectors_per_row, row_magic, row_shift):
        for j in T.unroll(num_vectors):
            v = pid * slots + j * num_threads + tid
            rows[j] = magic_quotient(v, row_magic, row_shift)
            vecs[j] = v - rows[j] * vectors_per_row

    # bf16 to e2m1 is widened to float32 once (into `wide`) for the amax and the cast alike: converting at each use
    # left nvcc unpacking elements twice. bf16 to e4m3 takes its amax on bf16 pairs, as the per-row kernel does, and
    # widens only at the cast: the float32 copy held 64-72 registers, 7 CTAs an SM with packed UE8M0 scale factors,
    # where the pairs need 47-55: aligned 44.9 -> 43.2 us packed (ahead of upstream's 43.9), 43.2 -> 42.8 float32,
    # unaligned 4.3-4.6% faster (GPU run 1 of docs/gpu-runs/2026-12-01-h200-j.md).
    widen = in_dtype != 'float32' and fp4
    bf16_pairs = in_dtype == 'bfloat16' and not fp4

    def as_float(values, wide, j, e):
        return wide[j, e] if widen else T.Cast('float32', values[j, e])

    @T.macro
    def cast_e2m1(out_flat, values, wide, multiplier, rows, vecs, hidden, num_tokens):
        for j in T.unroll(num_vectors):
            # A vector's codes as one word (4 bits per element: 32 bits for bf16, 16 for fp32) that the
            # byte-vector store reads back whole, computed outside the store's condition: tilelang emits
            # that store as a block of its own, and bytes written one by one, or under another `if`, stay
            # separate registers that nvcc merges back byte by byte. A masked vector's codes are computed
            # and dropped.
            codes = T.alloc_local((1,), code_word)
            codes[0] = e2m1_vector_codes([as_float(values, wide, j, e) * multiplier[j] for e in range(epv)], clamp=False)
            code_bytes = T.view(codes, (epv // 2,), T.int8)
            if rows[j] < num_tokens and vecs[j] * epv < hidden:
                # Addressed in code words by an unsigned 32-bit index (row * hidden + col < 2^31, the op's
                # index limit): an IMAD and one IMAD.WIDE.U32 from the base, where the 64-bit vector index
                # took seven instructions a store and was rebuilt per store.
                for e in T.vectorized(epv // 2):
                    out_flat[unsigned_index(rows[j] * (hidden // epv) + vecs[j]) * (epv // 2) + e] = code_bytes[e]

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
        word_loads = not aligned and in_dtype == 'bfloat16'
        with T.Kernel(T.ceildiv(num_tokens * vectors_per_row, slots), threads=num_threads,
                      prelude=PRMT_PRELUDE + _UNALIGNED_BF16_PRELUDE if word_loads else None) as pid:
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
            # Flat views of the rows (x up to its last row's start plus hidden, out whole), addressed in
            # vectors by unsigned_wide_mad.
            x_flat = T.Tensor(((num_tokens - 1) * row_stride + hidden,), in_dtype, x.data)
            out_flat = T.reshape(out, (num_tokens * out_type[1],))
            out_sf_flat, sf_row_step, sf_block_step = sf_flat_view(out_sf, packed)

            locate(pid, tid, rows, vecs, vectors_per_row, row_magic, row_shift)
            for j in T.unroll(num_vectors):
                if aligned:
                    if rows[j] < num_tokens and vecs[j] * epv < hidden:
                        # In whole vectors, unsigned: one IMAD.WIDE.U32 (row * stride + vector) where the
                        # signed int64 row * row_stride + col took a sign extension and three multiplies.
                        for e in T.vectorized(epv):
                            values[j, e] = x_flat[unsigned_wide_mad(rows[j], row_stride // epv, vecs[j]) * epv + e]
                    else:
                        for e in T.vectorized(epv):
                            values[j, e] = T.cast(0, in_dtype)
                else:
                    # Element by element (bf16: as aligned words, _UNALIGNED_BF16_PRELUDE), unconditionally, from the
                    # vector's row and column clamped into x (a masked vector reads a valid one and its amax is
                    # zeroed below). Under the bounds `if`
                    # nvcc merged each vector's halves (PRMT) inside the branch, so each vector waited for its
                    # loads before the next vector's were issued: one round trip per vector (Nsight: 0.46
                    # issue, 15 cycles per instruction). Now all of a thread's loads are in flight at once.
                    row_in_x = T.min(rows[j], num_tokens - 1)
                    col_in_x = T.min(vecs[j], hidden // epv - 1) * epv
                    if word_loads:
                        T.evaluate(T.call_extern('void', 'tk_load_bf16x8_words', x.data, row_in_x, row_stride, col_in_x,
                                                 T.address_of(values[j, 0])))
                    else:
                        for e in T.unroll(epv):
                            values[j, e] = x[T.Cast('int64', row_in_x), col_in_x + e]
            wide = T.alloc_local((num_vectors, epv) if widen else (1,), T.float32)
            if widen:
                # A bf16 is the top half of its float32: the even element of each word is the word shifted
                # up 16, the odd one the word with its low half masked off, one instruction each. The plain
                # conversion cost the odd element a PRMT (moving it down) and then the same shift.
                words = T.view(values, (num_vectors, epv // 2), T.uint32)
                for j in T.unroll(num_vectors):
                    for w in T.unroll(epv // 2):
                        wide[j, 2 * w] = T.reinterpret(words[j, w] << T.uint32(16), T.float32)
                        wide[j, 2 * w + 1] = T.reinterpret(words[j, w] & T.uint32(0xFFFF0000), T.float32)
            for j in T.unroll(num_vectors):
                if fp4:
                    # Started from the first pair (one FMNMX of two |.|), not from 0: a vector of NaNs then has
                    # a NaN amax instead of 0, which the butterfly's fmaxf skips and block_scale's
                    # max(amax, floor) turns into the floor, as it does 0: the same scale factors.
                    amax[j] = T.max(T.abs(as_float(values, wide, j, 0)), T.abs(as_float(values, wide, j, 1)))
                    for e in T.unroll(2, epv):
                        amax[j] = T.max(amax[j], T.abs(as_float(values, wide, j, e)))
                elif bf16_pairs:
                    amax[j] = T.float32(0)
                    bf16_amax_into(values, amax, 1, epv // 2, row=j, into=j)
                else:
                    amax[j] = T.float32(0)
                    for e in T.unroll(epv):
                        amax[j] = T.max(amax[j], T.abs(as_float(values, wide, j, e)))
                if not aligned:
                    # A masked vector's values are another vector's: as the aligned path's zeros, it must not
                    # raise its block's amax (one select per vector; its casts are computed and dropped).
                    amax[j] = T.Select(rows[j] < num_tokens and vecs[j] * epv < hidden, amax[j], T.float32(0))

            # Block amax: a butterfly over the block's 2^lanes_log2 adjacent lanes. One uniform branch per step
            # for all vectors (not one per step and vector), and the vectors' shuffles overlap.
            for s in T.unroll(5):
                if s < lanes_log2:
                    for j in T.unroll(num_vectors):
                        amax[j] = T.max(amax[j], T.shfl_xor(amax[j], 1 << s))
            # e2m1: whether every product lies within E2M1_UNCLAMPED_BOUND (see the cast below), tested where the
            # amaxes are still live: tested later, they stayed live through the scale factors' stores and the
            # unaligned bf16 kernel spilled at its 64 registers.
            unclamped = T.alloc_var(T.bool)
            if mode == MODE_PRECOMPUTED:
                if not packed:
                    for j in T.unroll(num_vectors):
                        if rows[j] < num_tokens and vecs[j] * epv < hidden and (vecs[j] * epv >> npc_log2) < num_sf_blocks:
                            multiplier[j] = T.float32(1) / out_sf[rows[j], vecs[j] * epv >> npc_log2]
                    if fp4:
                        unclamped = products_bounded([amax[j] for j in range(num_vectors)], [multiplier[j] for j in range(num_vectors)])
            else:
                # All lanes of a block hold its amax, so lane k of each aligned group of `group` lanes
                # (inside one block when a block has that many lanes) scales only its vector k and
                # shuffles the multipliers to the group: two IEEE divisions per thread, not per vector.
                if lanes_log2 >= group_log2:
                    k = tid & (group - 1)
                    block_scale(pick([amax[j] for j in range(num_vectors)], k), T.float32(floor), fmax, round_sf, packed, sf, multiplier, 0)
                    own_sf = T.alloc_var(T.float32)
                    own_sf = sf[0]
                    own_mult = T.alloc_var(T.float32)
                    own_mult = multiplier[0]
                    for j in T.unroll(num_vectors):
                        multiplier[j] = T.shfl_sync(own_mult, (tid & ~(group - 1)) + j)
                    if fp4:
                        # Each lane tests its own vector k; the warp's vote covers the group's (and more).
                        own_bounded = products_bounded([pick([amax[j] for j in range(num_vectors)], k)], [own_mult])
                        unclamped = T.call_extern('int32', '__all_sync', T.uint32(0xFFFFFFFF), own_bounded) != 0
                    # The lanes at offsets 0..num_vectors-1 of a block store the scale factors of their
                    # own vector k (offset k of the block is lane k of its group): one store per thread,
                    # where testing every vector's lane cost each thread all num_vectors store paths.
                    if (tid & ((1 << lanes_log2) - 1)) < num_vectors:
                        store_token_sf_flat(out_sf_flat, packed, pick([rows[j] for j in range(num_vectors)], k),
                                 pick([vecs[j] for j in range(num_vectors)], k) * epv, own_sf, npc_log2, hidden, num_tokens,
                                 num_sf_blocks, num_sf_words, sf_row_step, sf_block_step)
                else:
                    for j in T.unroll(num_vectors):
                        block_scale(amax[j], T.float32(floor), fmax, round_sf, packed, sf, multiplier, j)
                    if fp4:
                        unclamped = products_bounded([amax[j] for j in range(num_vectors)], [multiplier[j] for j in range(num_vectors)])
                    # A block has fewer lanes than a group: its first lane stores each of its vectors'.
                    for j in T.unroll(num_vectors):
                        if (tid & ((1 << lanes_log2) - 1)) == 0:
                            store_token_sf_flat(out_sf_flat, packed, rows[j], vecs[j] * epv, sf[j], npc_log2, hidden, num_tokens, num_sf_blocks, num_sf_words,
                                     sf_row_step, sf_block_step)

            if mode != MODE_SF_ONLY and fp4:
                # The codes without e2m1_top_nibble's clamp, one integer-pipe instruction an element fewer: every
                # product lies within E2M1_UNCLAMPED_BOUND where its vector's amax * multiplier does (always, in a
                # plain cast of finite values). Otherwise (NaN fails the test too) the products are clamped
                # beforehand, in place, and the multipliers become 1: one encoding path, where a second,
                # clamped, copy of it made nvcc spill (the unaligned bf16 kernel at its 64 registers).
                if not unclamped:
                    for j in T.unroll(num_vectors):
                        for e in T.unroll(epv):
                            if widen:
                                wide[j, e] = e2m1_saturated(wide[j, e] * multiplier[j])
                            else:
                                values[j, e] = e2m1_saturated(values[j, e] * multiplier[j])
                        multiplier[j] = T.float32(1)
                cast_e2m1(out_flat, values, wide, multiplier, rows, vecs, hidden, num_tokens)
            elif mode != MODE_SF_ONLY:
                for j in T.unroll(num_vectors):
                    if rows[j] < num_tokens and vecs[j] * epv < hidden:
                        # Vectorised, so that tilelang converts pairs (one F2FP per two elements, packed in
                        # place) instead of one F2FP per element and a byte merge each.
                        quantized = T.alloc_local((epv,), T.float8_e4m3fn)
                        for e in T.vectorized(epv):
                            quantized[e] = T.Cast(T.float8_e4m3fn, as_float(values, wide, j, e) * multiplier[j])
                        for e in T.vectorized(epv):
                            out_flat[unsigned_wide_mad(rows[j], hidden // epv, vecs[j]) * epv + e] = quantized[e]

    return KernelProgram(per_token_cast, alignment={'x': vec_bytes if aligned else elem_bytes, 'out': 16, 'out_sf': 1 if packed else 4})


def build_per_row(in_dtype: str, fmt: str, sf_format: str) -> KernelProgram:
    """One scale factor per row (num_per_channels == hidden): a CTA of NUM_THREADS threads owns a row.

    Thread t holds vectors j * NUM_THREADS + t (j < ROW_VECTORS[in_dtype]) of a chunk of the row, so that
    each warp load is one contiguous span. A row of one chunk is read once and cast from registers; a
    wider one (bf16 rows over 8192 channels) is read twice, chunk by chunk, for its amax and then to cast.
    Same arguments as the flat kernel (the op passes one set of scalars); the 16-byte aligned variant only.
    """
    elem_bytes = IN_DTYPES[in_dtype]
    epv = 16 // elem_bytes  # elements per vector
    fp4 = fmt == 'e2m1'
    packed = sf_format == 'ue8m0'
    fmax, floor = FORMATS[fmt]
    num_vectors = ROW_VECTORS[in_dtype]
    chunk_vectors = NUM_THREADS * num_vectors
    num_warps = NUM_THREADS // 32
    code_word = f'uint{4 * epv}'  # e2m1: the codes of one vector

    num_tokens, hidden, row_stride, num_sf_blocks, num_sf_words, out_type, out_dtype, sf_type = _buffer_types(fp4, packed)

    @T.macro
    def load_chunk(x_flat, row, chunk, tid, values, hidden, row_stride):
        # Vectors past the row's end read as zeros, which cannot raise the amax.
        for j in T.unroll(num_vectors):
            vec = chunk * chunk_vectors + j * NUM_THREADS + tid
            if vec * epv < hidden:
                for e in T.vectorized(epv):
                    values[j, e] = x_flat[unsigned_wide_mad(row, row_stride // epv, vec) * epv + e]
            else:
                for e in T.vectorized(epv):
                    values[j, e] = T.cast(0, in_dtype)

    @T.macro
    def chunk_amax(values, amax):
        if in_dtype == 'bfloat16':
            bf16_amax_into(values, amax, num_vectors, epv // 2)
        else:
            for j in T.unroll(num_vectors):
                for e in T.unroll(epv):
                    amax[0] = T.max(amax[0], T.abs(values[j, e]))

    @T.macro
    def cast_chunk(out, out_flat, row, chunk, tid, values, multiplier, hidden):
        for j in T.unroll(num_vectors):
            vec = chunk * chunk_vectors + j * NUM_THREADS + tid
            if fp4:
                # The vector's codes as one word that the byte-vector store reads back whole (see the flat
                # kernel); a masked vector's codes are computed and dropped.
                codes = T.alloc_local((1,), code_word)
                codes[0] = e2m1_vector_codes([T.Cast('float32', values[j, e]) * multiplier[0] for e in range(epv)])
                code_bytes = T.view(codes, (epv // 2,), T.int8)
                if vec * epv < hidden:
                    for e in T.vectorized(epv // 2):
                        out[row, vec * (epv // 2) + e] = code_bytes[e]
            elif vec * epv < hidden:
                # Vectorised: tilelang converts pairs (one F2FP per two elements).
                quantized = T.alloc_local((epv,), T.float8_e4m3fn)
                for e in T.vectorized(epv):
                    quantized[e] = T.Cast(T.float8_e4m3fn, T.Cast('float32', values[j, e]) * multiplier[0])
                for e in T.vectorized(epv):
                    out_flat[unsigned_wide_mad(row, hidden // epv, vec) * epv + e] = quantized[e]

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
        with T.Kernel(num_tokens, threads=NUM_THREADS) as row:
            T.annotate_min_blocks_per_sm(ROW_MIN_BLOCKS[in_dtype])
            T.assume(hidden % 16 == 0)
            T.assume(row_stride % epv == 0)
            tid = T.get_thread_binding()
            values = T.alloc_local((num_vectors, epv), in_dtype)
            amax = T.alloc_local((1,), T.float32)
            multiplier = T.alloc_local((1,), T.float32)
            sf = T.alloc_local((1,), T.float32)
            red = T.alloc_shared((num_warps,), T.float32)
            x_flat = T.Tensor(((num_tokens - 1) * row_stride + hidden,), in_dtype, x.data)
            out_flat = T.reshape(out, (num_tokens * out_type[1],))
            num_chunks = T.ceildiv(hidden // epv, chunk_vectors)  # uniform over the CTA

            amax[0] = T.float32(0)
            for chunk in T.serial(num_chunks):
                load_chunk(x_flat, row, chunk, tid, values, hidden, row_stride)
                chunk_amax(values, amax)
            # Thread maxima, a warp butterfly, then across warps.
            cta_max(amax, red, tid, num_warps)
            if mode == MODE_PRECOMPUTED:
                if not packed:
                    if num_sf_blocks > 0:
                        multiplier[0] = T.float32(1) / out_sf[row, 0]
            else:
                block_scale(amax[0], T.float32(floor), fmax, round_sf, packed, sf, multiplier, 0)
                if tid == 0:
                    store_token_sf(out_sf, packed, row, 0, sf[0], True, num_sf_blocks, num_sf_words)

            if mode != MODE_SF_ONLY:
                for chunk in T.serial(num_chunks):
                    if num_chunks > 1:  # a row of one chunk is still in registers
                        load_chunk(x_flat, row, chunk, tid, values, hidden, row_stride)
                    cast_chunk(out, out_flat, row, chunk, tid, values, multiplier, hidden)

    return KernelProgram(per_token_cast, alignment={'x': 16, 'out': 16, 'out_sf': 1 if packed else 4})


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
)
