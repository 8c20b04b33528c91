"""per_token_requant's kernel: load all of a thread's chunks, then take each through its spec's path (e2m1_input,
f16_lanes, or scale's float32), which computes its amax, scale factor and codes and stores them."""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import INDEX_LIMIT, magic_quotient
from kernel_src.quant.common import E2M1_SIGNED_PRELUDE, FORMATS, RCP_DIV_PRELUDE, SF_FORMATS
from kernel_src.quant.nibbles import PRMT_PRELUDE
from kernel_src.quant.per_token_requant.e2m1_input import requant_e2m1_chunk
from kernel_src.quant.per_token_requant.f16_lanes import E4M3_TO_E2M1_F16_PRELUDE, requant_f16_chunk
from kernel_src.quant.per_token_requant.layout import (
    CHUNK, MIN_BLOCKS, MIN_BLOCKS_BY_FAMILY, NUM_THREADS, TILE_CHUNKS, TILE_ROWS, VEC_BYTES, ChunkSite, Dims, Paths, load_chunk,
)
from kernel_src.quant.per_token_requant.scale import requant_f32_chunk
from kernel_src.quant.token_sf import sf_flat_view


def check(in_fmt: str, fmt: str, in_sf_format: str, sf_format: str, vec_bytes: int) -> None:
    for name, value, allowed in (('in_fmt', in_fmt, FORMATS), ('fmt', fmt, FORMATS),
                                 ('in_sf_format', in_sf_format, SF_FORMATS), ('sf_format', sf_format, SF_FORMATS)):
        if value not in allowed:
            raise ValueError(f'{name} must be one of {sorted(allowed)}, got {value!r}')
    if vec_bytes not in VEC_BYTES:
        raise ValueError(f'vec_bytes must be one of {VEC_BYTES}, got {vec_bytes!r}')
    if vec_bytes != 16 and in_fmt != 'e4m3':
        raise ValueError('vec_bytes=32 is built for e4m3 input only (an e2m1 chunk is 16 bytes)')


def build(arch: Arch, in_fmt: str, fmt: str, in_sf_format: str, sf_format: str, vec_bytes: int) -> KernelProgram:
    p = Paths(in_fmt, fmt, in_sf_format, sf_format, vec_bytes)
    d = Dims.of(p)
    in_fp4, out_fp4, in_packed, packed, f16_path = p.in_fp4, p.out_fp4, p.in_packed, p.packed, p.f16_path
    in_bytes, in_dtype, out_dtype, spec, per_thread = p.in_bytes, p.in_dtype, p.out_dtype, p.spec, p.per_thread
    tiled, strided, flat_sf_store = p.tiled, p.strided, p.flat_sf_store
    assert not tiled or (packed and per_thread == 1)
    num_tokens, in_width, row_stride, hidden, sf_word_stride = d.num_tokens, d.in_width, d.row_stride, d.hidden, d.sf_word_stride
    kernel_prelude = ((E4M3_TO_E2M1_F16_PRELUDE if f16_path else PRMT_PRELUDE if in_fp4 else '') + (E2M1_SIGNED_PRELUDE if p.finite_encoder else '')
                      + ('' if packed else RCP_DIV_PRELUDE))

    @T.prim_func
    def per_token_requant(
        x: T.StridedTensor[(num_tokens, in_width), (row_stride, 1), in_dtype],
        x_sf: d.in_sf_type,
        out: T.Tensor[(num_tokens, hidden // 2 if out_fp4 else hidden), out_dtype],
        out_sf: d.sf_type,
        chunks_per_row: T.int32,  # ceil(hidden / num_per_channels) * num_per_channels / 32, blocks padded to a multiple of 4 when packed
        row_magic: T.int64,  # with row_shift, the division of a chunk's index by chunks_per_row (unused when tiled)
        row_shift: T.int32,
        tile_magic: T.int64,  # with tile_shift, the division of a CTA's index by the tiles a row (used only when tiled)
        tile_shift: T.int32,
        npc_log2: T.int32,
        in_block_m_log2: T.int32,
        in_block_k_log2: T.int32,
        round_sf: T.int32,
    ):
        # (A 1-d grid when tiled too: a grid's y is limited to 65535, 524280 rows in tiles of eight.)
        num_ctas = (T.ceildiv(num_tokens, TILE_ROWS) * T.ceildiv(chunks_per_row, TILE_CHUNKS) if tiled
                    else T.ceildiv(num_tokens * chunks_per_row, NUM_THREADS * per_thread))
        with T.Kernel(num_ctas, threads=NUM_THREADS, prelude=kernel_prelude) as block_index:
            T.assume(in_width % in_bytes == 0)
            T.assume(row_stride % vec_bytes == 0)
            if tiled and packed:
                T.assume(sf_word_stride % 4 == 0)  # bytes of int32 words: a word is one 32-bit store
            if spec in MIN_BLOCKS:
                T.annotate_min_blocks_per_sm(MIN_BLOCKS_BY_FAMILY.get((arch.family, *spec, vec_bytes), MIN_BLOCKS[spec]))
            tid = T.get_thread_binding()
            # Load: where the thread's chunks lie, and all of their bytes and input scale factors.
            all_data = T.alloc_local((per_thread * in_bytes,), in_dtype)
            # The input scale factor of each chunk; packed, its exponent byte, which the exponent paths take as it is
            # (input_scale gives the float): its float bits and back would put three instructions a chunk on the chain
            # from the byte's load to the warp's vote.
            scales = T.alloc_local((per_thread,), T.int32 if in_packed else T.float32)
            if tiled:
                tile_row = T.alloc_var(T.int32)
                tile_chunk = T.alloc_var(T.int32)
                # Not `//`: an integer division ahead of every CTA's loads costs the tiled layout its gain.
                tile_row = magic_quotient(block_index, tile_magic, tile_shift)
                tile_chunk = (block_index - tile_row * T.ceildiv(chunks_per_row, TILE_CHUNKS)) * TILE_CHUNKS
                tile_row = tile_row * TILE_ROWS
                staged = T.alloc_shared((TILE_ROWS * TILE_CHUNKS,), T.uint8)  # [row][block of the tile]
            elif flat_sf_store:
                out_sf_flat, sf_row_step, sf_block_step = sf_flat_view(out_sf, packed)
            x_in = x if strided else T.Tensor(((num_tokens - 1) * row_stride + in_width,), in_dtype, x.data)
            x_sf_in = x_sf if strided else sf_flat_view(x_sf, in_packed)[0]
            # Per thread, not per chunk: whether its chunks are the first of their blocks (the lane that stores the
            # block's scale factor), and whether a block is one chunk.
            block_writer = T.alloc_var(T.bool)
            block_writer = (tid & ((1 << (npc_log2 - 5)) - 1)) == 0
            one_chunk_blocks = T.alloc_var(T.bool)
            one_chunk_blocks = npc_log2 == 5
            if per_thread == 1:
                # (Not the loop below with one turn, which gives these specs other code, and e2m1 -> e2m1 a slower one.)
                # Bound once (locals, not expressions pasted at each use): every address below derives from them.
                row = T.alloc_var(T.int32)
                chunk = T.alloc_var(T.int32)  # of the row; in chunks, not elements, so that the vectoriser still sees
                # every column a multiple of CHUNK
                active = T.alloc_var(T.bool)
                if tiled:
                    row = tile_row + tid // TILE_CHUNKS
                    chunk = tile_chunk + tid % TILE_CHUNKS
                else:
                    c = T.alloc_var(T.int32)
                    c = block_index * NUM_THREADS + tid
                    row = magic_quotient(c, row_magic, row_shift)
                    chunk = c - row * chunks_per_row
                col = chunk * CHUNK
                active = T.And(row < num_tokens, col < hidden)
                # int32 variables too, so that the scale factors' addresses widen to 64 bits only at the end.
                in_row = T.alloc_var(T.int32)
                in_block = T.alloc_var(T.int32)
                in_row = row >> in_block_m_log2
                in_block = col >> in_block_k_log2
                if not flat_sf_store:  # (the strided store's block; the flat one takes the column)
                    block = T.alloc_var(T.int32)
                    block = col >> npc_log2
                load_chunk(p, d, x_in, x_sf_in, all_data, scales, 0, row, chunk, active, in_row, in_block)
            else:
                # Every chunk's loads are issued before any is encoded; a thread's chunks are NUM_THREADS apart, so
                # each warp's loads stay one contiguous run.
                rows = T.alloc_local((per_thread,), T.int32)
                chunks = T.alloc_local((per_thread,), T.int32)
                actives = T.alloc_local((per_thread,), T.bool)
                for k in T.unroll(per_thread):
                    c = T.alloc_var(T.int32)
                    c = (block_index * per_thread + k) * NUM_THREADS + tid
                    rows[k] = magic_quotient(c, row_magic, row_shift)
                    chunks[k] = c - rows[k] * chunks_per_row
                    actives[k] = T.And(rows[k] < num_tokens, chunks[k] * CHUNK < hidden)
                    load_chunk(p, d, x_in, x_sf_in, all_data, scales, k, rows[k], chunks[k], actives[k], rows[k] >> in_block_m_log2,
                               (chunks[k] * CHUNK) >> in_block_k_log2)
            # Compute and store, chunk by chunk: amax, scale factor and codes by the spec's path.
            for k in T.unroll(per_thread):
                data = T.alloc_local((in_bytes,), in_dtype)
                for e in T.vectorized(in_bytes):
                    data[e] = all_data[k * in_bytes + e]
                if per_thread > 1:
                    row = rows[k]
                    chunk = chunks[k]
                    active = actives[k]
                    if not flat_sf_store:
                        block = (chunk * CHUNK) >> npc_log2
                site = ChunkSite(
                    k=k, row=row, chunk=chunk, active=active, block=None if flat_sf_store else block, tid=tid, npc_log2=npc_log2,
                    round_sf=round_sf, block_writer=block_writer, one_chunk_blocks=one_chunk_blocks, scales=scales, out=out, out_sf=out_sf,
                    out_sf_flat=out_sf_flat if flat_sf_store else None, sf_row_step=sf_row_step if flat_sf_store else None,
                    sf_block_step=sf_block_step if flat_sf_store else None, staged=staged if tiled else None,
                    tile_row=tile_row if tiled else None, tile_chunk=tile_chunk if tiled else None)
                values = T.alloc_local((CHUNK,), T.float32)
                amax = T.alloc_local((1,), T.float32)
                sf = T.alloc_local((1,), T.float32)
                multiplier = T.alloc_local((1,), T.float32)
                if in_fp4:
                    requant_e2m1_chunk(p, d, site, data, values, amax, sf, multiplier)
                elif f16_path:
                    requant_f16_chunk(p, d, site, data, values, amax, sf, multiplier)
                else:
                    requant_f32_chunk(p, d, site, data, values, amax, sf, multiplier)

    alignment = {'x': vec_bytes, 'x_sf': 1 if in_packed else 4, 'out': 16, 'out_sf': 4 if tiled or not packed else 1}
    return KernelProgram(per_token_requant, alignment=alignment)


def prebuilt():
    for in_fmt in FORMATS:
        for fmt in FORMATS:
            for sf_format in SF_FORMATS:
                for vec_bytes in VEC_BYTES if in_fmt == 'e4m3' else (16,):
                    yield dict(in_fmt=in_fmt, fmt=fmt, in_sf_format=sf_format, sf_format=sf_format, vec_bytes=vec_bytes)


DECL = KernelDecl(
    name='quant.per_token_requant',
    params=(param('in_fmt', 'str', 'in'), param('fmt', 'str', ''), param('in_sf_format', 'str', 'insf'), param('sf_format', 'str', 'sf'),
            param('vec_bytes', 'int', 'vb')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
    # The op's run-time arguments count chunks of `chunk` elements a row (chunks_per_row) and a tiled CTA's tiles of
    # tile_chunks chunks a row (its magic divisor); index_limit bounds the elements.
    constants={'chunk': CHUNK, 'tile_chunks': TILE_CHUNKS, 'index_limit': INDEX_LIMIT},
)
