"""SwiGLU forward + per-channel cast to e4m3 (+ transpose): quant.swiglu_forward_and_per_channel_cast_and_transpose.

bf16 input only. act is rounded to bf16 (upstream's rounding point), then cast in blocks of (num_per_tokens, 1): 32
or 128 tokens, a run-time choice (npt_log2). A CTA takes CH_TOKENS tokens x CH_CHANNELS channels in two phases:
  1. load -> SwiGLU -> shared memory: a thread issues all of its loads (`vec_bytes` vectors of each half) before any
     arithmetic, tests its gates' and ups' bf16 bits once, takes one of three straight paths (fast division with or
     without the clamps, or IEEE division) and puts act, rounded to bf16, into act_shared;
  2. cast -> store: a thread then owns two channels of 16 tokens, reduces the block's amax, and writes the e4m3
     codes as whole 32-byte sectors of the transposed output, or through shared memory as whole rows.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.common import block_scale
from kernel_src.quant.swiglu.common import (
    E4M3_MAX,
    PASS_CONFIGS,
    clamp_gate,
    clamp_or_inf,
    clamped_swiglu,
    clamped_swiglu_fast,
    swiglu_prelude,
    warp_all,
)

CH_THREADS = 256
CH_TOKENS = 128  # tokens per CTA (one block of 128 or four of 32)
CH_CHANNELS = 64  # channels per CTA
CH_SEGMENT = 32  # tokens per segment (the smaller block) in the cast phase
CH_HALF = CH_SEGMENT // 2  # tokens per lane in the cast phase
CH_NUM_SEGMENTS = CH_TOKENS // CH_SEGMENT
# CTAs per SM the register allocation must allow: 64 registers a thread. The branch-free divisions overlap a
# vector's 8 elements, which needs more registers than one element's chain at a time (at 48 nvcc spills), and a warp
# with 8 independent chains needs fewer warps to hide the latency.
CH_MIN_BLOCKS = 4
# Bytes of x a vector of the load phase. The op takes 32 on SM100, where x's rows (4 * hidden bytes, hidden a
# multiple of 64) are 32-byte aligned: one 256-bit load, as upstream's per-channel SwiGLU on SM100. Elsewhere 16
# (tile_kernels_aot.quant.swiglu); the GPU tests run both.
CH_VEC_BYTES = (16, 32)

CHANNEL_PRELUDE = swiglu_prelude('swiglu_div.cuh', 'swiglu_words.cuh')
# The e4m3 tile gets memory of its own: placed over act_shared (dead by then), it would need a barrier between the
# last act_shared load and the first tile store. The kernel's barriers are all its own (T.sync_threads): tilelang's
# barrier insertion puts one between a thread's two act_shared stores of a 32-byte vector (it cannot prove them
# disjoint from other threads'), inside the per-thread division paths, which not every thread of a CTA reaches, and
# the kernel hangs. build_tools.lower._check_barriers_uniform refuses such a barrier, and tests/cpu/test_lowering.py
# counts this kernel's.
CHANNEL_PASS_CONFIGS = {**PASS_CONFIGS, 'tl.disable_shared_memory_reuse': True, 'tl.disable_thread_storage_sync': True}


def swizzled_chunk(token, chunk, vec_bytes: int):
    """Where the 16-byte chunk `chunk` (8 channels) of token `token` lies in its act_shared row: the two halves of
    the row swap on bit 4 of the token. The cast phase's lanes read one 32-bit word (two channels) of tokens 16 apart
    from the same half-row of channels; without the swap the lane pair of a word would hit the same bank. With
    32-byte vectors the two chunks of a vector also swap on bit 0 of the token: a thread stores its vector as two
    16-byte halves, and a quarter-warp's first store (4 vectors of each of two tokens) would otherwise put both
    tokens' even chunks on the same banks; the cast phase's loads stay conflict-free, as the swap only permutes
    chunks within a half-row."""
    swapped = T.bitwise_xor(chunk, ((token // 16) % 2) * (CH_CHANNELS // 16))
    return swapped if vec_bytes == 16 else T.bitwise_xor(swapped, token % 2)


def swizzled_byte(token, offset):
    """Where byte `offset` of token `token`'s e4m3 row (64 channels) lies in quantized_shared: the halves swap on bit
    4 of the token, as in swizzled_chunk. A sum modulo the row rather than an XOR, so that the vectoriser sees a
    16-byte run stay aligned and whole."""
    return (offset + ((token // 16) % 2) * (CH_CHANNELS // 2)) % CH_CHANNELS


@T.macro
def swiglu_chunk(vec_bytes, gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, token, chunk, i, first, fast, clamp):
    """Elements first .. first + 7 of the thread's vector i: 16-byte chunk `chunk` of token `token`."""
    T.evaluate(T.call_extern('void', 'tk_widen_bf16x8', T.address_of(gate[i, first]), T.address_of(gate_f32[0])))
    T.evaluate(T.call_extern('void', 'tk_widen_bf16x8', T.address_of(up[i, first]), T.address_of(up_f32[0])))
    for e in T.unroll(8):
        if fast and not clamp:
            act_f32[e] = T.call_extern('float32', 'tk_div_rn_fast', gate_f32[e], T.float32(1) + T.exp(-gate_f32[e])) * up_f32[e]
        elif fast:
            act_f32[e] = clamped_swiglu_fast(clamp_gate(gate_f32[e], clamp_c), up_f32[e], clamp_c)
        else:
            act_f32[e] = clamped_swiglu(gate_f32[e], up_f32[e], clamp_c)
    # A vectorised cast: one conversion instruction per pair, not one per element plus a merge.
    for e in T.vectorized(8):
        act[e] = T.Cast(T.bfloat16, act_f32[e])
    for e in T.vectorized(8):
        act_shared[token, swizzled_chunk(token, chunk, vec_bytes) * 8 + e] = act[e]


@T.macro
def swiglu_vector(vec_bytes, gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, idx, i, fast, clamp):
    """act of the thread's vector i (token idx // vectors_per_row), rounded to bf16, into act_shared, 8 channels at a
    time; fast: with tk_div_rn_fast (exact only if tk_gate_bits_in_div_range passed), else IEEE division; clamp:
    False only where tk_clamps_are_identity passed (and with fast)."""
    epv = vec_bytes // 2
    vectors_per_row = CH_CHANNELS // epv
    for part in T.unroll(epv // 8):
        swiglu_chunk(vec_bytes, gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, idx // vectors_per_row,
                     (idx % vectors_per_row) * (epv // 8) + part, i, part * 8, fast, clamp)


def check_channel(transpose: bool, vec_bytes: int) -> None:
    if not isinstance(transpose, bool):
        raise ValueError(f'transpose must be a bool, got {transpose!r}')
    if vec_bytes not in CH_VEC_BYTES:
        raise ValueError(f'vec_bytes must be one of {CH_VEC_BYTES}, got {vec_bytes!r}')


def build_channel(arch: Arch, transpose: bool, vec_bytes: int) -> KernelProgram:
    num_tokens = T.dynamic('num_tokens')
    width = T.dynamic('width')
    hidden = T.dynamic('hidden')
    num_sf_rows = T.dynamic('num_sf_rows')
    out_shape = (hidden, num_tokens) if transpose else (num_tokens, hidden)
    epv = vec_bytes // 2  # channels a vector
    vectors_per_row = CH_CHANNELS // epv
    loads = CH_TOKENS * vectors_per_row // CH_THREADS  # vectors of each half per thread
    num_segments, HALF = CH_NUM_SEGMENTS, CH_HALF

    @T.prim_func
    def swiglu_forward_and_per_channel_cast(
        x: T.Tensor[(num_tokens, width), T.bfloat16],
        out: T.Tensor[out_shape, T.float8_e4m3fn],
        out_sf: T.Tensor[(num_sf_rows, hidden), T.float32],
        npt_log2: T.int32,
        round_sf: T.int32,
        use_clamp: T.int32,
        clamp_value: T.float32,
    ):
        with T.Kernel(hidden // CH_CHANNELS, num_tokens // CH_TOKENS, threads=CH_THREADS, prelude=CHANNEL_PRELUDE) as (pid_h, pid_t):
            T.assume(num_tokens % CH_TOKENS == 0)
            T.assume(hidden % CH_CHANNELS == 0)
            T.assume(width % 64 == 0)
            T.annotate_min_blocks_per_sm(CH_MIN_BLOCKS)
            tid = T.get_thread_binding()
            act_shared = T.alloc_shared((CH_TOKENS, CH_CHANNELS), T.bfloat16)
            amax_shared = T.alloc_shared((num_segments, CH_CHANNELS), T.float32)
            quantized_shared = None if transpose else T.alloc_shared((CH_TOKENS, CH_CHANNELS), T.float8_e4m3fn)
            gate = T.alloc_local((loads, epv), T.bfloat16)
            up = T.alloc_local((loads, epv), T.bfloat16)
            act = T.alloc_local((8,), T.bfloat16)
            act_f32 = T.alloc_local((8,), T.float32)
            t0 = pid_t * CH_TOKENS
            h0 = pid_h * CH_CHANNELS

            # Phase 1, load: all of the thread's vectors, so that its bytes are in flight together rather than a
            # vector at a time behind each one's exponentials and divisions.
            for i in T.unroll(loads):
                idx = i * CH_THREADS + tid
                for e in T.vectorized(epv):
                    gate[i, e] = x[t0 + idx // vectors_per_row, h0 + (idx % vectors_per_row) * epv + e]
                for e in T.vectorized(epv):
                    up[i, e] = x[t0 + idx // vectors_per_row, hidden + h0 + (idx % vectors_per_row) * epv + e]
            clamp_c = T.alloc_var(T.float32)
            clamp_c = clamp_or_inf(use_clamp, clamp_value)
            # Phase 1, compute: the divisions without branches (tk_div_rn_fast), so that the elements overlap, under
            # one range test of all of the thread's gates made on their bf16 bits before any arithmetic
            # (tk_track_gate_bits_bf16x8, tk_gate_bits_in_div_range), and the clamps skipped where no gate or up
            # reaches c (tk_track_magnitude_bf16x8, tk_clamps_are_identity); a thread with any gate outside the range
            # (rare) computes all of its vectors with IEEE division.
            gate_bits = T.alloc_local((3,), T.uint32)  # largest and smallest |gate| bits, largest |up| bits
            gate_f32 = T.alloc_local((8,), T.float32)
            up_f32 = T.alloc_local((8,), T.float32)
            gate_bits[0] = T.uint32(0)
            gate_bits[1] = T.uint32(0xFFFFFFFF)
            gate_bits[2] = T.uint32(0)
            for i in T.unroll(loads):
                for part in T.unroll(epv // 8):
                    T.evaluate(T.call_extern('void', 'tk_track_gate_bits_bf16x8', T.address_of(gate[i, part * 8]),
                                             T.address_of(gate_bits[0]), T.address_of(gate_bits[1])))
                    T.evaluate(T.call_extern('void', 'tk_track_magnitude_bf16x8', T.address_of(up[i, part * 8]),
                                             T.address_of(gate_bits[2])))
            # One path a warp: a warp whose threads disagree would run two or three paths one after the other. The
            # exact division and the clamps are right for every value, so the warp takes the most general path any
            # of its threads needs.
            if warp_all('tk_gate_bits_in_div_range', gate_bits[0], gate_bits[1], clamp_c):
                # No value beyond the clamp (the usual case, and always without one): the clamps are identities.
                if warp_all('tk_clamps_are_identity', gate_bits[0], gate_bits[2], clamp_c):
                    for i in T.unroll(loads):
                        swiglu_vector(vec_bytes, gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, i * CH_THREADS + tid, i,
                                      True, False)
                else:
                    for i in T.unroll(loads):
                        swiglu_vector(vec_bytes, gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, i * CH_THREADS + tid, i,
                                      True, True)
            else:
                for i in T.unroll(loads):
                    swiglu_vector(vec_bytes, gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, i * CH_THREADS + tid, i,
                                  False, True)
            T.sync_threads()

            # Phase 2, load: lane pair (2 * q, 2 * q + 1) of warp w owns channels 2p, 2p + 1 (p = (w % 2) * 16 + q)
            # of the 32 tokens of segment w // 2; lane half h takes their tokens h * 16 .. h * 16 + 15. Each shared
            # load is one 32-bit word (two channels), and each transposed store instruction writes 16 whole 32-byte
            # sectors (the two lanes of a pair write the two halves of a channel's 32 tokens together).
            lane = tid % 32
            h = lane % 2
            p = ((tid // 32) % 2) * 16 + lane // 2
            s = tid // 64
            pair_bf16 = T.alloc_local((2,), T.bfloat16)
            pair_f32 = T.alloc_local((2,), T.float32)
            # values[j, i]: channel 2p + j, token i of the lane's 16; laid out so that the fp8 casts pair the
            # elements that are stored together (tokens of a channel transposed, the two channels otherwise).
            values = T.alloc_local((2, HALF) if transpose else (HALF, 2), T.float32)
            quantized = T.alloc_local((2, HALF) if transpose else (HALF, 2), T.float8_e4m3fn)
            amax2 = T.alloc_local((2,), T.float32)
            sf2 = T.alloc_local((2,), T.float32)
            multiplier2 = T.alloc_local((2,), T.float32)
            amax2[0] = T.float32(0)
            amax2[1] = T.float32(0)
            for i in T.unroll(HALF):
                token = s * CH_SEGMENT + h * HALF + i
                for j in T.vectorized(2):
                    pair_bf16[j] = act_shared[token, swizzled_chunk(token, p // 4, vec_bytes) * 8 + (p % 4) * 2 + j]
                # One SHF and one LOP3 (the word's halves as floats).
                T.evaluate(T.call_extern('void', 'tk_widen_bf16x2', T.address_of(pair_bf16[0]), T.address_of(pair_f32[0])))
                for j in T.unroll(2):
                    if transpose:
                        values[j, i] = pair_f32[j]
                    else:
                        values[i, j] = pair_f32[j]
                    amax2[j] = T.max(amax2[j], T.abs(pair_f32[j]))
            # Phase 2, compute: the segment's amax from the two halves of the lane pair. From here on lane h works on
            # channel 2p + h only (its amax, the block's amax across segments, the scale factor and its store), and
            # takes the partner's multiplier with one shuffle. max() is NaN-skipping, commutative and associative
            # here (amax starts at +0), so the order of the maxima does not change a bit.
            own_amax = T.alloc_var(T.float32)
            own_amax = T.max(T.if_then_else(h == 0, amax2[0], amax2[1]),
                             T.shfl_xor(T.if_then_else(h == 0, amax2[1], amax2[0]), 1))
            if npt_log2 == 7:  # blocks of 128 tokens: the four segments together
                amax_shared[s, 2 * p + h] = own_amax
                T.sync_threads()
                for k in T.unroll(num_segments):
                    own_amax = T.max(own_amax, amax_shared[k, 2 * p + h])
            block_scale(own_amax, T.float32(1e-4), E4M3_MAX, round_sf, False, sf2, multiplier2, 0)
            own_multiplier = T.alloc_var(T.float32)
            own_multiplier = multiplier2[0]
            partner_multiplier = T.alloc_var(T.float32)
            partner_multiplier = T.shfl_xor(own_multiplier, 1)
            multiplier2[0] = T.if_then_else(h == 0, own_multiplier, partner_multiplier)
            multiplier2[1] = T.if_then_else(h == 0, partner_multiplier, own_multiplier)
            # Phase 2, store: lane h writes the scale factor of channel 2p + h (a warp's 32 lanes write 32
            # consecutive floats), then the codes: products first, then the casts as a vectorised loop (one
            # conversion instruction per pair).
            if npt_log2 == 7:
                if s == 0:
                    out_sf[pid_t, h0 + 2 * p + h] = sf2[0]
            else:
                out_sf[pid_t * num_segments + s, h0 + 2 * p + h] = sf2[0]
            if transpose:
                for j in T.unroll(2):
                    for i in T.unroll(HALF):
                        values[j, i] = values[j, i] * multiplier2[j]
                for j in T.unroll(2):
                    for i in T.vectorized(HALF):
                        quantized[j, i] = T.Cast(T.float8_e4m3fn, values[j, i])
                for j in T.unroll(2):
                    for i in T.vectorized(HALF):
                        out[h0 + 2 * p + j, t0 + s * CH_SEGMENT + h * HALF + i] = quantized[j, i]
            else:
                for i in T.unroll(HALF):
                    for j in T.unroll(2):
                        values[i, j] = values[i, j] * multiplier2[j]
                for i in T.unroll(HALF):
                    for j in T.vectorized(2):
                        quantized[i, j] = T.Cast(T.float8_e4m3fn, values[i, j])
                # Through shared memory to whole rows: a lane holds two channels of 16 tokens, whose 2-byte stores
                # to global memory would take 16 instructions a thread; from the tile, two 16-byte stores a thread
                # write whole rows of the block.
                for i in T.unroll(HALF):
                    token = s * CH_SEGMENT + h * HALF + i
                    for j in T.vectorized(2):
                        quantized_shared[token, swizzled_byte(token, 2 * p) + j] = quantized[i, j]
                T.sync_threads()
                for k in T.unroll(CH_TOKENS * CH_CHANNELS // 16 // CH_THREADS):
                    idx = k * CH_THREADS + tid
                    row = idx // (CH_CHANNELS // 16)
                    chunk = idx % (CH_CHANNELS // 16)
                    for e in T.vectorized(16):
                        out[t0 + row, h0 + chunk * 16 + e] = quantized_shared[row, swizzled_byte(row, chunk * 16) + e]

    return KernelProgram(swiglu_forward_and_per_channel_cast, alignment={'x': vec_bytes, 'out': 16, 'out_sf': 4})


def prebuilt_channel():
    for transpose in (True, False):
        for vec_bytes in CH_VEC_BYTES:
            yield {'transpose': transpose, 'vec_bytes': vec_bytes}


CHANNEL = KernelDecl(
    name='quant.swiglu_forward_and_per_channel_cast_and_transpose',
    params=(param('transpose', 'bool', 'tr'), param('vec_bytes', 'int', 'vb')),
    factory=build_channel,
    prebuilt=prebuilt_channel,
    check=check_channel,
    pass_configs=CHANNEL_PASS_CONFIGS,
    constants={'tile_tokens': CH_TOKENS},  # a CTA's tokens: the grid's y is num_tokens / tile_tokens
)
