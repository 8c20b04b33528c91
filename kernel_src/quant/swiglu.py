"""The SwiGLU fusions of quant: forward + per-token cast, forward + per-channel cast (+ transpose), and
backward + per-token cast of the input gradient, all to e4m3 (max 448).

SwiGLU of a row [l | r] (each half `hidden` wide), in float32 and in this order, as upstream's reference:
    l = l > c ? c : l;  r = r > c ? c : (r < -c ? -c : r)          (only with a clamp value c)
    act = l / (1 + exp(-l)) * r                                    (IEEE division, accurate expf)
Casts (§2.1 of the semantics notes): clamped = max(amax, floor), sf = clamped / 448 and multiplier
448 / clamped, or with round_sf the power of two at or above sf and its exact inverse;
q = e4m3_satfinite(v * multiplier).

* swiglu_forward: v = act * w (w = topk_weights[pos_to_token_topk[row]], 0 for a negative index, 1
  without weights); blocks of (1, 128) or one block per row (per_row). Rows with pos_to_expert < 0 are
  neither read nor written. Clamp counts are summed per thread in int32, per CTA through shared memory
  and added to the int64 counters with one atomic per CTA and counter: integer sums, so the result does
  not depend on the grid size (set_num_sms). The 128-wide blocks of all rows form one flat sequence that a
  persistent grid-stride loop deals out: a block is 8 adjacent lanes, each holding 16 of its elements (2
  bf16 or 4 fp32 16-byte vectors; lane i: vectors i, i + 8, ...), so that one row lookup, one butterfly
  and one scale serve 16 elements a thread, and each load instruction reads whole 128-byte runs. A thread
  computes one step at a time, with 8 (bf16) or 6 (fp32) warps a scheduler; fp32 loads it then (row lookups
  one step ahead), bf16 copied it into shared memory (cp.async) while computing the step before (row lookups
  two steps ahead). per_row is
  the same kernel with the row as the block: 2^tpr_log2 adjacent lanes (a
  run-time size, up to the CTA) of 16 elements each, the same element code, and the row amax across warps through
  named barriers (_ROW_MAX_PRELUDE).
* swiglu_forward_and_per_channel_cast: bf16 input only; act is rounded to bf16 (the rounding point of
  upstream), then cast in blocks of (num_per_tokens, 1) (32 or 128 tokens, a run-time choice). A CTA
  takes 128 tokens x 64 channels: a thread issues all of its loads (4 16-byte or 2 32-byte vectors of each half,
  `vec_bytes`) before the SwiGLU, then tests its gates' and ups' bf16 bits once (fast division in range; clamps without effect, so
  skipped) and takes one of three straight paths; act goes through shared memory, a thread then owns 32 tokens of one channel, and writes them
  (cast in pairs) as 32 contiguous bytes of the transposed output or as bytes of 32 rows.
* swiglu_backward: one CTA of 64 threads per row of the fused layout, 16 elements per thread-step;
  see the module docstring of tile_kernels_aot.quant.swiglu for the formulas. The (1, 32) or (1, 128) block
  width is a run-time argument.

Every dim (rows, hidden, token count, top-k) and every flag is a run-time argument.
"""

import tilelang  # noqa: F401  (puts its bundled tvm on the path)
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.common import IN_DTYPES, RCP_DIV_PRELUDE, SF_FORMATS, block_scale
from kernel_src.quant.token_sf import store_token_sf, token_sf_tensor

E4M3_MAX = 448.0

FWD_THREADS = 256
# How the persistent forward kernels split a step's work between CTAs. Each CTA used to take adjacent rows (per
# row) or blocks (flat); dealing the step's rows, or runs of DEAL_WARPS warps' blocks (4 warps: 16 blocks, one row
# of 2048), out across the CTAs instead (unit k of a step to CTA k mod num_ctas) measured faster for the bf16
# kernels at 8192 x 2048: per row 28.8-29.1 -> 26.8-27.4 us (6%), flat 28.6-29.3 -> 27.6-28.0 us (3-4%). Runs of 1, 2, 4 and
# 8 warps measured alike; single blocks (each warp's four blocks 132 apart) gained nothing. fp32 rows measured the same
# either way, and the fp32 flat kernel (3 CTAs of 256 an SM) 2% slower dealt out, so it keeps adjacent blocks.
# Dealt out, the flat kernel no longer gains from fetching its next step into L2 while it computes one (which
# took adjacent blocks from 29.7 to 28.8 us): without that prefetch it went from 27.7-28.1 to 26.1-26.5 us, as the
# per-row kernel, which never kept its prefetch, measured 1 us slower with it (GPU runs 1-4 and 6 of
# docs/gpu-runs/2026-12-01-h200-d.md). Both used to fetch their first step into L2 while they built the silu table;
# staged, they copy it into shared memory instead (see _STAGE_PRELUDE).
DEAL_WARPS = 4
FWD_ELEMENTS = 16  # flat kernel: elements of each half per thread and step (2 bf16 or 4 fp32 vectors), in one 128-wide block
# per_row: the flat kernel's step with one row as its block, 2^tpr_log2 adjacent threads of 16 elements each (tpr_log2
# a run-time argument), so a CTA of row_threads threads (a spec parameter) takes rows of up to 16 * row_threads. bf16
# runs the silu-table kernel (1024 threads, 63 registers: rows up to 16384). fp32 ships two: 256 threads (rows up to
# 4096) at the flat fp32 kernel's 80 registers and 3 CTAs an SM, 48.7 us at H 2048, and 512 (rows up to 8192), which
# needs about 120 registers, so one CTA of 16 warps an SM, 57.7 us at H 2048 (GPU run 2 of docs/gpu-runs/2026-11-30-h200-f.md);
# 1024 threads would have to fit 64 registers and spilled. The op takes the smallest CTA that holds the row.
BLOCK = 128  # channels per scale factor of the flat forward
# Flat kernel: CTAs per SM the register allocation must allow (the op asks the driver how many fit and makes its
# persistent grid that many per SM): bf16 fits 64 registers (8 warps a scheduler); fp32 holds twice the loaded
# bytes and spilled at 64 (one spill stored a row lookup as it arrived, a wait each step), none at 80.
FWD_MIN_BLOCKS = {'bfloat16': 4, 'float32': 3}
# sm_100a's ptxas spilled the fp32 flat kernel at 80 registers (112 bytes a thread) where sm_90a's does not.
FWD_MIN_BLOCKS_BY_TARGET = {('sm_100a', 'float32'): 2}
# Flat bf16 kernel: silu of the (clamped) gate from a shared-memory table instead of an exponential and a division
# per element (_SILU_TABLE_PRELUDE). Every CTA builds the table once, so the flat bf16 kernel runs one CTA of 1024
# threads an SM (the same 64 registers and 8 warps a scheduler as 4 CTAs of 256) and each thread builds 5 entries.
TABLE_THREADS = 1024
ROW_THREADS = {'bfloat16': (TABLE_THREADS,), 'float32': (256, 512)}  # per_row CTA sizes (see above)
TABLE_LOW_EXP, TABLE_HIGH_EXP = -16, 4  # the window of gate magnitudes the table holds: [2^-16, 2^4)
TABLE_LOW_BITS = (127 + TABLE_LOW_EXP) << 7
TABLE_HIGH_BITS = (127 + TABLE_HIGH_EXP) << 7
TABLE_PER_SIGN = TABLE_HIGH_BITS - TABLE_LOW_BITS  # 2560 gates of each sign
TABLE_SIGN_WORDS = 1 << 13  # bit 15 of a byte offset
TABLE_WORDS = TABLE_SIGN_WORDS + TABLE_PER_SIGN  # 42 KB of shared memory (the 22 KB between the signs unused)
assert 4 * TABLE_PER_SIGN <= 1 << 14 and 2 * TABLE_PER_SIGN % TABLE_THREADS == 0  # offsets below bit 14; 5 entries a thread

CH_THREADS = 256
CH_TOKENS = 128  # tokens per CTA (one block of 128 or four of 32)
CH_CHANNELS = 64  # channels per CTA
CH_SEGMENT = 32  # tokens per thread in the cast phase
CH_MIN_BLOCKS = 4  # CTAs per SM the register allocation must allow
# Bytes of x a vector of the load phase. The op takes 32 on sm_100a where x's pointer is 32-byte aligned (its rows,
# 4 * hidden bytes with hidden a multiple of 64, always are): one 256-bit load, as upstream's per-channel SwiGLU on
# SM100. Elsewhere 16: on sm_90a the 32-byte kernel (two 16-byte loads a vector) measured no faster (see
# tile_kernels_aot.quant.swiglu); the H200 runs it in the GPU tests.
CH_VEC_BYTES = (16, 32)

BWD_THREADS = 64
BWD_ELEMS = 16  # elements per thread-step (16 bytes of e4m3)
# CTAs per SM the register allocation must allow: 96 registers, 20 warps an SM. The branch-free divisions let
# nvcc overlap a step's 16 elements, which takes more registers than one element's chain at a time; at 80
# (12 CTAs, the count before) it spilled 24 bytes and recomputed predicates (~100 more instructions a step).
BWD_MIN_BLOCKS = 10


# NaN-propagating float32 min and max (PTX min.NaN / max.NaN, one FMNMX.NAN each on sm_80 and later): the
# clamps of the flat forward and the per-channel cast as min(l, c) and min(max(r, -c), c), where `l > c ? c : l` against a run-time c
# costs a compare and a select (nvcc cannot use FMNMX.NAN itself, as c might be NaN; the op never passes one).
_NAN_MIN_MAX_PRELUDE = """
__device__ __forceinline__ float tk_min_nan(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float tk_max_nan(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
"""


FAST_DIV_MAX = 80.0  # the range of |a| where tk_div_rn_fast is used (see below)
FAST_DIV_MIN = 2.0**-64

# Division a / b rounded to nearest (IEEE div.rn) for the SwiGLU's b = 1 + exp(-a) >= 1, without a branch: nvcc's
# own fast path for div.rn.f32 on sm_90 (MUFU.RCP, one Newton step, quotient, residual, correction), less its FCHK
# operand test and the branch to its slow path, which made each element's division a basic block of its own so
# that the elements of a step could not overlap. A step computes all of its elements this way and tests ONCE
# whether every operand pair was inside the range where the sequence is correctly rounded
# (tk_div_fast_in_range over the largest and smallest |a|; else the step is recomputed with `/`):
#   * 2^-64 <= |a| <= 80, so b = 1 + exp(-a) <= 1 + e^80 < 2^116 and every intermediate (1/b, the quotient, the
#     residual) is a normal float far from overflow, where every step scales exactly by powers of two;
#   * so the results are those of the same instructions on significands in [1, 2), where nvcc's FCHK (a range
#     check on the exponents) lets its div.rn.f32 take this path, which NVIDIA guarantees IEEE-correct;
#   * independently of nvcc: with MUFU.RCP correctly rounded, the Newton step gives y = RN(1/b) for every
#     significand of b, and then the residual a - b RN(a y) is exact and RN(q + (a - b q) y) = RN(a / b)
#     (Markstein's theorem; Cornea-Hasegan, Golliver, Markstein, ARITH 1999). tests/cpu/test_swiglu_division.py
#     checks this, and the GPU tests compare every bf16 gate, including the one SwiGLU operand pair
#     (a = 2^-23) that a reciprocal 1 ulp off (MUFU.RCP's documented bound) would get wrong.
# NaN (in a, hence in b), +-inf and zero fail the test. The residual is formed negated (b q - a) and the
# correction subtracted: the same values as nvcc's a - b q and its addition, and a zero would keep its sign.
# The sequence is RCP_DIV_PRELUDE's (kernel_src.quant.common): the reciprocal, then Markstein's correction.
_FAST_DIV_PRELUDE = RCP_DIV_PRELUDE + """
__device__ __forceinline__ float tk_div_rn_fast(float a, float b) { return tk_div_rn_fast_by(a, b, tk_rcp_rn_fast(b)); }
__device__ __forceinline__ int tk_div_fast_in_range(float largest, float smallest) {
  return largest <= FAST_DIV_MAXf && smallest >= FAST_DIV_MINf;
}
""".replace('FAST_DIV_MAX', FAST_DIV_MAX.hex()).replace('FAST_DIV_MIN', FAST_DIV_MIN.hex())

# The backward's two divisions of an element, 1 / b (the sigmoid) and a / b, share one reciprocal:
#   * tk_rcp_rn_fast (MUFU.RCP and the Newton step, the first half of tk_div_rn_fast) is instruction for
#     instruction nvcc's fast path for rcp.rn.f32 (1.0f / b: MUFU.RCP, r = b y0 - 1, y0 - y0 r), which nvcc takes
#     for every b whose exponent field is in [1, 252] (an integer test on b's bits, then a branch). For
#     b = 1 + exp(-a) in [1, 2^116] it is therefore 1 / b correctly rounded: NVIDIA's guarantee, no assumption of
#     ours (r = b y0 - 1 is a multiple of 2^-47 there, so nvcc's flush of a subnormal -r never applies);
#   * tk_div_rn_fast_by(a, b, y) is the rest of tk_div_rn_fast, so tk_div_rn_fast_by(a, b, tk_rcp_rn_fast(b)) is
#     tk_div_rn_fast(a, b), with the range argument above.
# The step's range test also lets a = +-0 through (tk_div_fast_in_range_or_zero): b = 1 + exp(-0) = 2 exactly
# (CUDA's expf(+-0) = 1; in SASS the 1 + is fused into the exponential's last FFMA, 1 * 1 + 1), y = 1/2 from any
# MUFU.RCP result within an ulp, and the quotient is a zero of a's sign, as IEEE 0 / 2 (test_signed_zero). So the
# smallest |a| is taken over nonzero gates only: tk_abs_below_or_nan_at_zero(a) is |a| one ulp toward zero (its
# bits less one), and NaN for +-0 (0x00000000 - 1 and 0x80000000 - 1 are NaN bit patterns), which min skips; it
# is compared against FAST_DIV_MIN_BELOW, the float just below FAST_DIV_MIN. tk_opaque_zero (0, hidden from
# nvcc in a volatile asm) keeps the redo's loads from being merged with the step's own.
FAST_DIV_MIN_BELOW = FAST_DIV_MIN * (1 - 2.0**-24)
_BACKWARD_DIV_PRELUDE = RCP_DIV_PRELUDE + """__device__ __forceinline__ float tk_abs_below_or_nan_at_zero(float a) { return fabsf(__int_as_float(__float_as_int(a) - 1)); }
__device__ __forceinline__ int tk_div_fast_in_range_or_zero(float largest, float smallest_below) {
  return largest <= FAST_DIV_MAXf && smallest_below >= FAST_DIV_MIN_BELOWf;
}
__device__ __forceinline__ int tk_opaque_zero() { int z; asm volatile("mov.u32 %0, 0;" : "=r"(z)); return z; }
""".replace('FAST_DIV_MAX', FAST_DIV_MAX.hex()).replace('FAST_DIV_MIN_BELOW', FAST_DIV_MIN_BELOW.hex())


# per_row: the row amax of rows of a warp or more (2^tpr_log2 >= 32 lanes). amax is a max of |act| from +0 through max(),
# which skips NaN: +0 or above (+inf included), never NaN or -0, so its bits as unsigned integers order as the floats and
# one redux.sync.max.u32 (__reduce_max_sync) is the warp's max, bit for bit the max a butterfly of FMNMX gives (a max of
# the same values). That replaced 5 shuffles and maxes behind uniform branches, and the loop over the row's warps below.
# Rows wider than a warp: a named barrier (bar.sync id, count) joins only the warps of one row group (ids 1.. ; 0 is
# __syncthreads), so warps of other rows never wait; a group is the row's warps, or 4 warps holding several rows (so
# that at most 8 ids are used). The partials go through one of two buffers by step parity: the next step's barrier
# keeps a fast warp from overwriting values a slow one still reads. Lane i then reads the partial of the row's warp
# i mod (its warps), at most 32 of them, and a second redux gives the row's max. Written in CUDA, so tilelang's
# shared-memory sync pass does not put a __syncthreads of the whole CTA around them.
_ROW_MAX_PRELUDE = """
__device__ __forceinline__ float tk_row_max_wide(float* partials, float amax, int tid, int tpr_log2, int parity) {
  const unsigned warp_max = __reduce_max_sync(0xffffffffu, __float_as_uint(amax));
  if (tpr_log2 == 5) return __uint_as_float(warp_max);
  unsigned* slot = reinterpret_cast<unsigned*>(partials) + parity * NUM_WARPS;
  if ((tid & 31) == 0) slot[tid >> 5] = warp_max;
  const int group_log2 = max(tpr_log2, 7);
  asm volatile("bar.sync %0, %1;" :: "r"(1 + (tid >> group_log2)), "r"(1 << group_log2) : "memory");
  const int row_warps_log2 = tpr_log2 - 5;
  const unsigned partial = slot[((tid >> tpr_log2) << row_warps_log2) + (tid & 31 & ((1 << row_warps_log2) - 1))];
  return __uint_as_float(__reduce_max_sync(0xffffffffu, partial));
}
"""


# The bf16 forward kernels' staging of their next step in shared memory: each thread copies its own four 16-byte
# vectors of step t + 1 with cp.async (cp.async.cg: through L2, not L1) while it computes step t, and reads only what
# it copied itself after its own cp.async.wait_group, so no barrier joins the threads. Without it, a warp's loads of a
# step were only in flight while that warp waited on them (64 registers a thread at 1024 threads leave no room for a
# second step in registers), and the kernels spent about half their time with the issue slots idle.
_STAGE_PRELUDE = """
__device__ __forceinline__ void tk_stage16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void tk_stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tk_stage_wait_previous() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
"""


def _bf16_bits(value: float) -> int:
    """The bf16 bit pattern of a float32 that bf16 holds exactly."""
    import struct
    bits = struct.unpack('<I', struct.pack('<f', value))[0]
    assert bits & 0xFFFF == 0, value
    return bits >> 16


# The flat forward's bf16 input, handled as the 32-bit words that hold two elements each:
# * widening: a bf16 is the upper half of its float32, so the element in the high half is the word with its low half
#   cleared (one LOP3) and the one in the low half the word shifted up (one SHF), where the vectorised cast spent a
#   PRMT and a shift on each high half;
# * the step's window test of the silu table (_SILU_TABLE_PRELUDE) on the gate's magnitude bits (word & 0x7fff7fff,
#   one LOP3 a word), folded four elements at a time by Hopper's three-input 16x2 integer max and min
#   (VIMNMX3.U16x2): for bf16 magnitudes, integer order is value order, and zero, subnormals, inf and NaN (above inf)
#   all lie outside the window;
# * the clamp-count reach: the signed 16x2 max over gate words and |up| words (VIMNMX3.S16x2, one for 4 elements):
#   positive bf16 are ordered as their signed 16-bit patterns and every negative one is below every positive one,
#   so some l > c >= 0 or |r| > c makes the max exceed c; a NaN max (or c < 0) sends the step to the exact recount
#   as well, which counts with the float compares (counts never depend on this test, only the cost does).
# * the per-channel kernel's division range test on the raw gates' magnitude bits (the same VIMNMX3 folds):
#   tk_div_rn_fast needs every clamped gate a = min.NaN(g, c) in [FAST_DIV_MIN, FAST_DIV_MAX]. If every |g| is
#   (bf16 bits in [0x1f80, 0x42a0]: integer order is value order; zero, subnormals, inf and NaN fall outside) and
#   c >= FAST_DIV_MIN (+inf without a clamp; NaN fails), then a = g, or a = c with FAST_DIV_MIN <= c < g <= FAST_DIV_MAX.
#   A vector that fails only because of its raw gates (a gate far above a small clamp) takes the exact path, which
#   gives the same bits (both paths are correctly rounded), only slower.
# * the per-channel kernel's clamp skip: with every |gate| and every |up| at most c (their largest magnitude bits,
#   folded by VIMNMX3.U16x2, read as floats: NaN fails) and c > 0, min.NaN(g, c) = g and min.NaN(max.NaN(r, -c), c) = r
#   for every element, signed zeros included (c > 0 rules out c = -0, where min.NaN(+0, -0) = -0), so the three
#   FMNMX.NAN of each element can go; 6 instructions a vector decide it. A thread with some value beyond c keeps them.
_BF16_WORDS_PRELUDE = """
__device__ __forceinline__ void tk_widen_bf16x8(const void* src, float* dst) {
  const unsigned* w = (const unsigned*)src;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    dst[2 * i] = __uint_as_float(w[i] << 16);
    dst[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void tk_widen_bf16x2(const void* src, float* dst) {
  const unsigned w = *(const unsigned*)src;
  dst[0] = __uint_as_float(w << 16);
  dst[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void tk_track_gate_bits_bf16x8(const void* gate, unsigned* largest, unsigned* smallest) {
  const unsigned* g = (const unsigned*)gate;
  const unsigned m0 = g[0] & 0x7fff7fffu, m1 = g[1] & 0x7fff7fffu, m2 = g[2] & 0x7fff7fffu, m3 = g[3] & 0x7fff7fffu;
  largest[0] = __vimax3_u16x2(__vimax3_u16x2(largest[0], m0, m1), m2, m3);
  smallest[0] = __vimin3_u16x2(__vimin3_u16x2(smallest[0], m0, m1), m2, m3);
}
__device__ __forceinline__ void tk_track_reach_bf16x8(const void* gate, const void* up, unsigned* reach) {
  const unsigned* g = (const unsigned*)gate;
  const unsigned* u = (const unsigned*)up;
  #pragma unroll
  for (int i = 0; i < 4; ++i) reach[0] = __vimax3_s16x2(reach[0], g[i], u[i] & 0x7fff7fffu);
}
__device__ __forceinline__ int tk_gate_bits_in_table(unsigned largest, unsigned smallest) {
  return max(largest & 0xffffu, largest >> 16) < TABLE_HIGH_BITSu && min(smallest & 0xffffu, smallest >> 16) >= TABLE_LOW_BITSu;
}
__device__ __forceinline__ int tk_gate_bits_in_div_range(unsigned largest, unsigned smallest, float c) {
  return max(largest & 0xffffu, largest >> 16) <= DIV_MAX_BITSu && min(smallest & 0xffffu, smallest >> 16) >= DIV_MIN_BITSu
      && c >= FAST_DIV_MINf;
}
__device__ __forceinline__ void tk_track_magnitude_bf16x8(const void* src, unsigned* largest) {
  const unsigned* w = (const unsigned*)src;
  largest[0] = __vimax3_u16x2(__vimax3_u16x2(largest[0], w[0] & 0x7fff7fffu, w[1] & 0x7fff7fffu), w[2] & 0x7fff7fffu,
                              w[3] & 0x7fff7fffu);
}
// Both bf16 halves of w, read as floats, at most c (a NaN half, or a NaN c, is not).
__device__ __forceinline__ int tk_halves_at_most(unsigned w, float c) {
  return __uint_as_float(w & 0xffff0000u) <= c && __uint_as_float(w << 16) <= c;
}
__device__ __forceinline__ int tk_clamps_are_identity(unsigned gate_largest, unsigned up_largest, float c) {
  return tk_halves_at_most(__vmaxu2(gate_largest, up_largest), c) && c > 0.0f;
}
__device__ __forceinline__ int tk_reach_exceeds(unsigned reach, float c) { return !tk_halves_at_most(reach, c); }
// Whether pred holds on every lane that runs this with it (a vote of the active lanes: some of the forward's tests sit
// under per-lane conditions). A path test that lanes of one warp answer differently makes the warp run both paths one
// after the other; where the other path is right for every value too (IEEE division, the clamps), the warp takes it
// whenever one lane needs it.
__device__ __forceinline__ int tk_warp_all(int pred) { return __all_sync(__activemask(), pred); }
__device__ __forceinline__ int tk_up_clamp_is_identity(unsigned reach, float c) { return tk_halves_at_most(reach, c) && c > 0.0f; }
// c rounded down to bf16, in both halves: for a bf16 x, x > c exactly when x > that (no bf16 lies strictly between
// c and the bf16 below it), and x < -c when x < its negation; a NaN c stays NaN, which compares false as c does.
__device__ __forceinline__ unsigned tk_bf16x2_clamp_pair(float c) {
  const unsigned bits = __float_as_uint(c);
  unsigned h = bits >> 16;  // toward zero: down for c >= 0
  if ((bits >> 31) != 0 && (bits & 0xffffu) != 0) h += 1;  // below zero, down is away from it
  if ((bits & 0x7fffffffu) > 0x7f800000u) h = 0x7fc0u;  // NaN
  return h | (h << 16);
}
// The clamp counts of 8 gates and ups (g > c, u > c, u < -c, the float compares' results), a bf16x2 compare a pair
// of elements for each: a mask of 16 bits a true half, so each count is a population count over 16.
__device__ __forceinline__ void tk_count_clamped_bf16x8(const void* gate, const void* up, unsigned c_pair, int* counts) {
  const unsigned* g = (const unsigned*)gate;
  const unsigned* u = (const unsigned*)up;
  const unsigned minus_c_pair = c_pair ^ 0x80008000u;
  int gate_above = 0, up_above = 0, up_below = 0;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned mask;
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(g[i]), "r"(c_pair));
    gate_above += __popc(mask);
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(u[i]), "r"(c_pair));
    up_above += __popc(mask);
    asm("set.lt.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(u[i]), "r"(minus_c_pair));
    up_below += __popc(mask);
  }
  counts[0] += gate_above >> 4;
  counts[1] += up_above >> 4;
  counts[2] += up_below >> 4;
}
""".replace('TABLE_HIGH_BITS', hex(TABLE_HIGH_BITS)).replace('TABLE_LOW_BITS', hex(TABLE_LOW_BITS)).replace(
    'DIV_MAX_BITS', hex(_bf16_bits(FAST_DIV_MAX))).replace('DIV_MIN_BITS', hex(_bf16_bits(FAST_DIV_MIN))).replace(
    'FAST_DIV_MIN', FAST_DIV_MIN.hex())


# The flat bf16 forward's silu table: silu(min.NaN(g, c)) for every bf16 gate g whose magnitude lies in
# [2^TABLE_LOW_EXP, 2^TABLE_HIGH_EXP), built by each CTA at its start (build_silu_table) with the exact path's
# expression (_silu: the same expf; the division by tk_div_rn_fast where its range test passes, where it is
# correctly rounded, else `/`), so a lookup returns the bits that path computes; a step whose 16 gates all
# lie in the window (tk_gate_bits_in_table; else the step takes the exact path) then spends two integer
# instructions and one LDS on each gate's silu instead of the clamp, the exponential (8 instructions) and the
# division (6). act = silu * clamped up * weight, in the exact path's order, so results do not change.
# Layout: positive gates at float index (bits - TABLE_LOW_BITS), negative ones TABLE_SIGN_WORDS further on. Then a
# word of two gates gives both byte offsets at once: 4 * (magnitude - low) in each 16-bit half (one LEA or IMAD:
# the two halves' products do not interfere, as 4 * (m - low) < 2^14 in the window) and the gate's own sign bit
# (bit 15 of each half) kept in place (one LOP3), i.e. 2^15 bytes = TABLE_SIGN_WORDS floats further on.
# tests/cpu/test_swiglu_bf16_words.py checks the mapping over every bf16 pattern.
_SILU_TABLE_PRELUDE = """
__device__ __forceinline__ void tk_silu_lookup_bf16x8(const void* gate, const float* table, float* dst) {
  const unsigned* g = (const unsigned*)gate;
  const char* base = (const char*)table;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    // 4 * magnitude - 4 * low in each half as one multiply-add (written in PTX: nvcc turned the C form into a
    // shift, a mask and an add).
    unsigned scaled;
    asm("mad.lo.u32 %0, %1, 4, %2;" : "=r"(scaled) : "r"(g[i] & 0x7fff7fffu), "r"(TABLE_MINUS_LOW_OFFSETSu));
    const unsigned offsets = scaled | (g[i] & 0x80008000u);
    dst[2 * i] = *(const float*)(base + (offsets & 0xffffu));
    dst[2 * i + 1] = *(const float*)(base + (offsets >> 16));
  }
}
__device__ __forceinline__ float tk_bf16_bits_to_float(int bits) { return __uint_as_float((unsigned)bits << 16); }
""".replace('TABLE_MINUS_LOW_OFFSETS', hex(-4 * TABLE_LOW_BITS * 0x10001 % 2**32))


def _warp_all(test: str, *args):
    """Whether the prelude's int32 test `test`(args) holds on every active lane of the warp (tk_warp_all): a path
    choice the whole warp then takes together."""
    return T.call_extern('int32', 'tk_warp_all', T.call_extern('int32', test, *args)) != 0


def _clamped_swiglu(l, r, c):
    """act of float32 gate l and up r in the reference's order (IEEE division, expf), with the clamp always on,
    against c (+inf for no clamp: the same results), in three FMNMX.NAN.

    Bit-exact with the compare-and-select form for any non-NaN c > 0 and +inf: a NaN l or r stays NaN (as
    torch.clamp keeps it), a value past a bound becomes the bound, any other value is kept; only at c = 0
    could a signed zero differ, and there min/max are the instructions of torch's own clamp."""
    l = T.call_extern('float32', 'tk_min_nan', l, c)
    r = T.call_extern('float32', 'tk_min_nan', T.call_extern('float32', 'tk_max_nan', r, -c), c)
    return _silu(l) * r


def _silu(l):
    """silu of the clamped gate, as the exact path computes it (IEEE division, expf); the silu table holds these."""
    return l / (T.float32(1) + T.exp(-l))


def _clamped_swiglu_fast(a, r, c):
    """_clamped_swiglu of an already clamped gate a, with tk_div_rn_fast: exact only where a passes the step's
    range test (track_division_range, then tk_div_fast_in_range)."""
    r = T.call_extern('float32', 'tk_min_nan', T.call_extern('float32', 'tk_max_nan', r, -c), c)
    return T.call_extern('float32', 'tk_div_rn_fast', a, T.float32(1) + T.exp(-a)) * r


def _max_tree(values):
    """The largest of `values` (float32 expressions) as a balanced tree of max: a dependency chain log2(n) long. A
    running max over a step's 16 act was a chain of 16 FMNMX (~70 cycles) between the last product and the block's
    shuffles, on every step's critical path. max (fmaxf) skips NaN and is exact, so the order does not change the
    result: the largest non-NaN value, or NaN only if every value is NaN."""
    while len(values) > 1:
        values = [T.max(values[i], values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def _step_abs_max(act, num_vectors: int, epv: int, vector_kept=None, *kept_args):
    """max |act[j, e]| over a step (float32 [num_vectors, epv]) as one _max_tree; vector_kept(j, *kept_args), a
    run-time condition, leaves vector j out (as 0, which no |act| is below) where it is false."""
    def vector_max(j):
        return _max_tree([T.abs(act[j, e]) for e in range(epv)])
    if vector_kept is None:
        return _max_tree([vector_max(j) for j in range(num_vectors)])
    return _max_tree([T.if_then_else(vector_kept(j, *kept_args), vector_max(j), T.float32(0)) for j in range(num_vectors)])


@T.macro
def track_division_range(div_range, a):
    """div_range[0], div_range[1]: the largest (max.NaN: a NaN fails the range test) and smallest |a| so far."""
    div_range[0] = T.call_extern('float32', 'tk_max_nan', div_range[0], T.abs(a))
    div_range[1] = T.min(div_range[1], T.abs(a))


class _FormedRowVectors:
    """row_vectors[j] of the per-row forward written out as j * 2^tpr_log2 + lane at each use (see build_forward)."""

    def __init__(self, lane, tpr_log2):
        self.lane, self.tpr_log2 = lane, tpr_log2

    def __getitem__(self, j):
        return (j << self.tpr_log2) + self.lane


def check_forward(in_dtype: str, sf_format: str, per_row: bool, row_threads: int) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')
    if per_row and sf_format != 'f32':
        raise ValueError('per_row (one scale factor per row) stores row-major float32 scale factors only')
    allowed = ROW_THREADS[in_dtype] if per_row else (0,)
    if row_threads not in allowed:
        raise ValueError(f'row_threads must be one of {allowed} for {in_dtype} with per_row={per_row}, got {row_threads}')


def build_forward(arch: Arch, in_dtype: str, sf_format: str, per_row: bool, row_threads: int) -> KernelProgram:
    """row_threads: the per_row kernel's CTA size (0 for the flat kernel, whose CTA size is fixed)."""
    epv = 16 // IN_DTYPES[in_dtype]  # elements per 16-byte vector
    words = in_dtype == 'bfloat16'  # flat kernel: bf16 handled as 32-bit words (_BF16_WORDS_PRELUDE)
    packed = sf_format == 'ue8m0'
    num_vectors = FWD_ELEMENTS // epv
    # Flat kernel: a 128-wide block is `lanes` (8) adjacent lanes, lane i holding its vectors i, i + lanes, ...
    # so that each load instruction reads whole 128-byte runs.
    lanes = BLOCK // FWD_ELEMENTS
    lanes_log2 = lanes.bit_length() - 1
    table = words  # bf16: silu from the shared table (_SILU_TABLE_PRELUDE)
    staged = table  # bf16: the next step staged in shared memory (_STAGE_PRELUDE)
    threads = row_threads if per_row else TABLE_THREADS if table else FWD_THREADS
    min_blocks = max(1, FWD_MIN_BLOCKS_BY_TARGET.get((arch.target, in_dtype), FWD_MIN_BLOCKS[in_dtype]) * FWD_THREADS // threads)
    blocks_per_step = threads // lanes
    num_warps = threads // 32

    num_rows = T.dynamic('num_rows')
    width = T.dynamic('width')
    hidden = T.dynamic('hidden')
    num_p2t = T.dynamic('num_p2t')
    num_weights = T.dynamic('num_weights')
    num_p2e = T.dynamic('num_p2e')
    num_sf_blocks, num_sf_words = T.dynamic('num_sf_blocks'), T.dynamic('num_sf_words')
    sf_type = token_sf_tensor(packed, num_rows, num_sf_blocks, num_sf_words, T.dynamic('sf_word_stride'),
                              T.dynamic('sf_stride_t'), T.dynamic('sf_stride_k'))

    @T.macro
    def count_into(counts, clamped_count, red_counts, tid):
        """Adds the threads' int32 clamp counts to the int64 counters: warp sums, then one atomic per CTA."""
        for c in T.unroll(3):
            for s in T.unroll(5):
                counts[c] = counts[c] + T.shfl_xor(counts[c], 16 >> s)
        if tid % 32 == 0:
            for c in T.unroll(3):
                red_counts[tid // 32, c] = counts[c]
        T.sync_threads()
        if tid < 3:
            total = T.alloc_var(T.int64)
            total = T.int64(0)
            for w in T.unroll(num_warps):
                total = total + T.Cast(T.int64, red_counts[w, tid])
            if total != 0:
                T.atomic_add(clamped_count[tid], total)

    @T.macro
    def table_step(gate, up, act, up_wide, silu_table, step_weight, clamp_c, clamp_up):
        """act of the step from the silu table (_SILU_TABLE_PRELUDE): silu * up * weight, with up clamped to
        [-c, c] where clamp_up (a compile-time flag: False only where tk_up_clamp_is_identity passed)."""
        for j in T.unroll(num_vectors):
            T.evaluate(T.call_extern('void', 'tk_silu_lookup_bf16x8', T.address_of(gate[j, 0]),
                                     T.address_of(silu_table[0]), T.address_of(act[j, 0])))
            T.evaluate(T.call_extern('void', 'tk_widen_bf16x8', T.address_of(up[j, 0]), T.address_of(up_wide[0])))
            for e in T.unroll(epv):
                if clamp_up:
                    r = T.call_extern('float32', 'tk_min_nan', T.call_extern('float32', 'tk_max_nan', up_wide[e], -clamp_c), clamp_c)
                    act[j, e] = act[j, e] * r * step_weight[0]
                else:
                    act[j, e] = act[j, e] * up_wide[e] * step_weight[0]

    @T.macro
    def count_vector(gate, up, counts, clamp_c, clamp_pair, j):
        """The exact clamp counts of vector j (bf16 words: by pairs against clamp_pair, tk_count_clamped_bf16x8)."""
        if words:
            T.evaluate(T.call_extern('void', 'tk_count_clamped_bf16x8', T.address_of(gate[j, 0]), T.address_of(up[j, 0]),
                                     clamp_pair, T.address_of(counts[0])))
        else:
            for e in T.unroll(epv):
                l = T.Cast(T.float32, gate[j, e])
                r = T.Cast(T.float32, up[j, e])
                counts[0] = counts[0] + T.Cast(T.int32, l > clamp_c)
                counts[1] = counts[1] + T.Cast(T.int32, r > clamp_c)
                counts[2] = counts[2] + T.Cast(T.int32, r < -clamp_c)

    # per_row: the op takes the smallest 2^tpr_log2 lanes whose 16 elements each cover the row, so that
    # 2^tpr_log2 > hidden / 32 (hidden >= 128, tpr_log2 >= 3): a lane's first half of vectors, columns below
    # epv * (num_vectors / 2) * 2^tpr_log2 = 8 * 2^tpr_log2 < hidden, is always inside the row, and only the second half
    # is tested (with j a loop variable, nvcc folds the test of the first half away after unrolling; without it each
    # of those vectors paid a compare, filler moves and a branch around its store a step).
    def vector_in_row(j, row_vectors):
        return T.Or(j < num_vectors // 2, row_vectors[j] * epv < hidden)

    def in_step(j, row_vectors):
        """Whether vector j of the lane holds the step's elements: per_row, vector_in_row; flat, always (a Python
        True, so the test is not emitted)."""
        return vector_in_row(j, row_vectors) if per_row else True

    def step_is_live(next_live, next_expert, with_pos_to_expert):
        """Whether a looked-up step (look_up_step) is processed: its row exists and pos_to_expert does not skip it."""
        return T.Cast(T.int32, T.And(next_live[0] != 0, T.Or(with_pos_to_expert == 0, next_expert[0] >= 0)))

    def weight_of(topk_weights, index):
        """A row's weight from its pos_to_token_topk entry: 0 for a negative index."""
        return T.if_then_else(index >= 0, topk_weights[T.max(index, 0)], T.float32(0))

    def vector_col(j, block, lane, row_vectors):
        """The first column of vector j of the lane's step: flat, in 128-wide block `block` (vector j of lane i at
        j * lanes + i); per_row, in the row (row_vectors[j]). An expression, not a bound name (see load_step)."""
        if per_row:
            return row_vectors[j] * epv
        return block * BLOCK + (j * lanes + lane) * epv

    @T.macro
    def fill_past_row(gate, up, j):
        """per_row: vector j, past the row's end, as gate 1 and up 0 (see load_row_step)."""
        for e in T.unroll(epv):
            gate[j, e] = T.Cast(in_dtype, T.float32(1))
            up[j, e] = T.Cast(in_dtype, T.float32(0))

    @T.macro
    def load_step(x, gate, up, row, block, lane):
        """The flat kernel's vectors of one step: the lane's part of 128-wide block `block` of row `row`, gate
        and up (the column is written out, not bound to a name: a bound one became a let that tilelang could
        not see through, and it split every access into single elements). All gates, then all ups: in
        load_row_step's order, vector by vector, the flat cubins change (not measured, so kept apart)."""
        for j in T.unroll(num_vectors):
            for e in T.vectorized(epv):
                gate[j, e] = x[T.Cast(T.int64, row), vector_col(j, block, lane, None) + e]
        for j in T.unroll(num_vectors):
            for e in T.vectorized(epv):
                up[j, e] = x[T.Cast(T.int64, row), hidden + vector_col(j, block, lane, None) + e]

    @T.macro
    def load_row_step(x, gate, up, row, row_vectors):
        """per_row: load_step with the row as the block, 2^tpr_log2 lanes (vector j of lane i at j * 2^tpr_log2 + i).
        A vector past the row's end gets gate 1 and up 0: inside the silu table's window and the fast division's
        range, so it sends no step to the exact path; the amax, the clamp recount and the stores skip it."""
        for j in T.unroll(num_vectors):
            if vector_in_row(j, row_vectors):
                for e in T.vectorized(epv):
                    gate[j, e] = x[T.Cast(T.int64, row), vector_col(j, None, None, row_vectors) + e]
                for e in T.vectorized(epv):
                    up[j, e] = x[T.Cast(T.int64, row), hidden + vector_col(j, None, None, row_vectors) + e]
            else:
                fill_past_row(gate, up, j)

    @T.macro
    def load_from_x(x, gate, up, row, block, lane, row_vectors):
        """The lane's vectors of a step read from x in the kernel's layout: load_row_step per row, else load_step."""
        if per_row:
            load_row_step(x, gate, up, row, row_vectors)
        else:
            load_step(x, gate, up, row, block, lane)

    @T.macro
    def stage_vector(stage, x, slot, row, block, lane, row_vectors, tid, j):
        T.evaluate(T.call_extern('void', 'tk_stage16', T.address_of(stage[slot, j, tid, 0]),
                                 T.address_of(x[T.Cast(T.int64, row), vector_col(j, block, lane, row_vectors)])))
        T.evaluate(T.call_extern('void', 'tk_stage16', T.address_of(stage[slot, num_vectors + j, tid, 0]),
                                 T.address_of(x[T.Cast(T.int64, row), hidden + vector_col(j, block, lane, row_vectors)])))

    @T.macro
    def unstage_vector(stage, gate, up, slot, tid, j):
        for e in T.vectorized(epv):
            gate[j, e] = stage[slot, j, tid, e]
        for e in T.vectorized(epv):
            up[j, e] = stage[slot, num_vectors + j, tid, e]

    @T.macro
    def stage_step(stage, x, slot, row, block, lane, row_vectors, tid):
        """_STAGE_PRELUDE: the lane's vectors of a step, gate j at stage[slot, j, tid] and up j at
        stage[slot, num_vectors + j, tid] (a warp's copies and reads are then 512 contiguous bytes: no bank
        conflicts); per_row, only the vectors inside the row."""
        for j in T.unroll(num_vectors):
            if in_step(j, row_vectors):
                stage_vector(stage, x, slot, row, block, lane, row_vectors, tid, j)

    @T.macro
    def unstage_step(stage, gate, up, slot, row_vectors, tid):
        """load_step / load_row_step from the staged copy of the step (the filler of load_row_step past the row)."""
        for j in T.unroll(num_vectors):
            if in_step(j, row_vectors):
                unstage_vector(stage, gate, up, slot, tid, j)
            else:
                fill_past_row(gate, up, j)

    @T.macro
    def build_silu_table(silu_table, table_gates, table_silu, div_range_build, clamp_c, tid):
        """The silu table (_SILU_TABLE_PRELUDE): 5 entries a thread, with the branch-free division where all of the
        thread's clamped gates pass its range test (the exact path's results there; with c >= 2^-64, always), else
        with `/`, the exact path's own expression."""
        div_range_build[0] = T.float32(0)
        div_range_build[1] = T.float32(float('inf'))
        for k in T.unroll(2 * TABLE_PER_SIGN // threads):
            entry = k * threads + tid
            negative = T.Cast(T.int32, entry >= TABLE_PER_SIGN)
            table_gates[k] = T.call_extern('float32', 'tk_min_nan', T.call_extern(
                'float32', 'tk_bf16_bits_to_float', negative * 0x8000 + TABLE_LOW_BITS + entry - negative * TABLE_PER_SIGN), clamp_c)
            track_division_range(div_range_build, table_gates[k])
            table_silu[k] = T.call_extern('float32', 'tk_div_rn_fast', table_gates[k], T.float32(1) + T.exp(-table_gates[k]))
        if T.call_extern('int32', 'tk_div_fast_in_range', div_range_build[0], div_range_build[1]) == 0:
            for k in T.unroll(2 * TABLE_PER_SIGN // threads):
                table_silu[k] = _silu(table_gates[k])
        for k in T.unroll(2 * TABLE_PER_SIGN // threads):
            entry = k * threads + tid
            negative = T.Cast(T.int32, entry >= TABLE_PER_SIGN)
            silu_table[negative * TABLE_SIGN_WORDS + entry - negative * TABLE_PER_SIGN] = table_silu[k]

    # The flat kernel's blocks of a step: bf16 (the table kernel) deals runs of DEAL_WARPS warps' blocks out across
    # the CTAs (run k of a step to CTA k mod num_ctas), fp32 gives each CTA the step's adjacent blocks.
    deal_blocks = DEAL_WARPS * 32 // lanes if table else blocks_per_step
    assert blocks_per_step % deal_blocks == 0

    def flat_block(step, pid, tid, num_ctas):
        """The flat kernel's block index of thread tid of CTA pid in step `step`."""
        return ((step * (blocks_per_step // deal_blocks) + (tid >> lanes_log2) // deal_blocks) * num_ctas + pid) * deal_blocks + (
            (tid >> lanes_log2) % deal_blocks)

    def row_of_step(step, pid, tid, num_ctas, tpr_log2):
        """The per-row kernel's row of thread tid of CTA pid in step `step`: threads >> tpr_log2 rows a CTA and step,
        dealt out across the CTAs (row r of a step's rows to CTA r mod num_ctas; see DEAL_WARPS)."""
        return (step * (threads >> tpr_log2) + (tid >> tpr_log2)) * num_ctas + pid

    @T.macro
    def look_up_step(step, next_row, next_block, next_live, next_expert, next_index, pos_to_expert, pos_to_token_topk,
                     with_pos_to_expert, with_weight, pid, tid, num_ctas, num_iters, num_rows, blocks_per_row, row_magic, row_shift,
                     tpr_log2):
        """Step `step`'s row (and flat: block) and its lookups, issued now and read an iteration or two later. Steps
        past the last are not live (and their block index is not formed, so it never overflows)."""
        if per_row:
            next_row[0] = row_of_step(T.min(step, num_iters - 1), pid, tid, num_ctas, tpr_log2)
        else:
            blk = flat_block(T.min(step, num_iters - 1), pid, tid, num_ctas)
            next_row[0] = T.Cast(T.int32, (T.Cast(T.int64, blk) * row_magic) >> T.Cast(T.int64, row_shift))
            next_block[0] = blk - next_row[0] * blocks_per_row
        next_live[0] = T.Cast(T.int32, T.And(step < num_iters, next_row[0] < num_rows))
        if next_live[0] != 0:
            if with_pos_to_expert != 0:
                next_expert[0] = pos_to_expert[next_row[0]]
            if with_weight != 0:
                next_index[0] = pos_to_token_topk[next_row[0]]

    @T.prim_func
    def swiglu_forward(
        x: T.Tensor[(num_rows, width), in_dtype],
        out: T.Tensor[(num_rows, hidden), T.float8_e4m3fn],
        out_sf: sf_type,
        pos_to_token_topk: T.Tensor[(num_p2t,), T.int32],
        topk_weights: T.Tensor[(num_weights,), T.float32],
        pos_to_expert: T.Tensor[(num_p2e,), T.int32],
        clamped_count: T.Tensor[(3,), T.int64],
        num_ctas: T.int32,
        num_iters: T.int32,
        blocks_per_row: T.int32,
        row_magic: T.int64,
        row_shift: T.int32,
        with_weight: T.int32,
        with_pos_to_expert: T.int32,
        use_clamp: T.int32,
        count_clamp: T.int32,
        round_sf: T.int32,
        tpr_log2: T.int32,
        clamp_value: T.float32,
        sf_floor: T.float32,
    ):
        prelude = _NAN_MIN_MAX_PRELUDE + _FAST_DIV_PRELUDE + (_BF16_WORDS_PRELUDE + _SILU_TABLE_PRELUDE if words else '') + (
            _ROW_MAX_PRELUDE.replace('NUM_WARPS', str(num_warps)) if per_row else '') + (_STAGE_PRELUDE if staged else '')
        with T.Kernel(num_ctas, threads=threads, prelude=prelude) as pid:
            # The table kernel: one CTA an SM of 4x the threads, the same 64-register budget.
            T.annotate_min_blocks_per_sm(min_blocks)
            T.assume(hidden % BLOCK == 0)
            T.assume(width % 64 == 0)
            tid = T.get_thread_binding()
            gate = T.alloc_local((num_vectors, epv), in_dtype)
            up = T.alloc_local((num_vectors, epv), in_dtype)
            act = T.alloc_local((num_vectors, epv), T.float32)
            amax = T.alloc_local((num_vectors,), T.float32)
            multiplier = T.alloc_local((num_vectors,), T.float32)
            sf = T.alloc_local((num_vectors,), T.float32)
            live = T.alloc_local((num_vectors,), T.int32)
            counts = T.alloc_local((3,), T.int32)
            red_counts = T.alloc_shared((num_warps, 3), T.int32)
            if per_row:
                row_partials = T.alloc_shared((2 * num_warps,), T.float32)  # _ROW_MAX_PRELUDE: a warp's partial by step parity
            for c in T.unroll(3):
                counts[c] = 0

            # One grid-stride step computed at a time per thread, and more warps instead of a software pipeline in
            # registers: the SwiGLU of an element is a serial chain (exponential, reciprocal, Newton steps and the
            # division's slow-path branch, ~100 cycles for ~28 instructions), so a warp issues about one
            # instruction in three cycles by itself and the scheduler needs several warps computing at
            # once. Two steps in registers per thread took 128 registers (2 CTAs, 4 warps a scheduler);
            # one step of 16 elements fits 64 for bf16 (4 CTAs of 256, or 1 of 1024 with the silu table: 8 warps a
            # scheduler; fp32: 80, 6 warps).
            # fp32: the row lookups run a step ahead (their values are used one step later, so the dependent x
            # loads never wait for them): iteration t looks up step t and loads and computes step t - 1, whose
            # lookups arrived during iteration t - 1; the warps waiting for their loads keep the memory system
            # busy while the others compute.
            # bf16 (staged, _STAGE_PRELUDE): the next step's x is copied into shared memory while the current one
            # computes, so a warp no longer waits for its loads at each step: 4-5% faster (flat 26.3-26.6 ->
            # 25.4-25.6 us, per row 27.3-27.6 -> 26.2-26.4 us at 8192 x 2048; GPU run 2 of
            # docs/gpu-runs/2026-12-01-h200-k.md), and step 0 copied before the table's build, not prefetched into
            # L2, 1-3% more for the flat kernels, under 1% per row (run 4). The staging takes 128 KB of shared
            # memory beside the 42 KB table.
            # fp32 (3-4 CTAs of 256 an SM) already runs at 82-87% of copy and is left as it was.
            next_row = T.alloc_local((1,), T.int32)
            next_block = T.alloc_local((1,), T.int32)
            next_live = T.alloc_local((1,), T.int32)
            next_expert = T.alloc_local((1,), T.int32)
            next_index = T.alloc_local((1,), T.int32)
            step_weight = T.alloc_local((1,), T.float32)
            reach = T.alloc_local((2,), T.float32)
            div_range = T.alloc_local((2,), T.float32)  # largest and smallest |clamped gate| of the step
            # bf16: the largest and smallest gate magnitude bits and the clamp-count reach, as 16x2 words.
            gate_bits = T.alloc_local((3,), T.uint32)
            gate_clamped = T.alloc_local((1,), T.float32)
            # One vector of each half widened to float32 by a vectorised cast.
            gate_wide = T.alloc_local((epv,), T.float32)
            up_wide = T.alloc_local((epv,), T.float32)
            quantized = T.alloc_local((epv,), T.float8_e4m3fn)
            # The clamp against c, or +inf without a clamp (the same results, NaN included), so that the
            # element loop does not test use_clamp.
            clamp_c = T.alloc_var(T.float32)
            clamp_c = T.if_then_else(use_clamp != 0, clamp_value, T.float32(float('inf')))
            clamp_pair = None  # (bf16 words only: the float32 kernels count element by element)
            if words:
                clamp_pair = T.alloc_var(T.uint32)
                clamp_pair = T.call_extern('uint32', 'tk_bf16x2_clamp_pair', clamp_c)
            if per_row:
                lane = tid & ((1 << tpr_log2) - 1)
            else:
                lane = tid & (lanes - 1)
            # per_row: vector j of this lane (j * 2^tpr_log2 + lane, in vectors of the row), the same every step. The
            # staged kernel binds it once rather than forming it from the run-time tpr_log2 at each copy, load, test
            # and store of every step (per row bf16 26.6 -> 26.3 us, GPU run 2 of docs/gpu-runs/2026-12-01-h200-k.md);
            # for the fp32 kernels that measured 3% faster at 256 threads but 2% slower at 512, so they form it.
            if staged and per_row:
                row_vectors = T.alloc_local((num_vectors,), T.int32)
                for j in T.unroll(num_vectors):
                    row_vectors[j] = (j << tpr_log2) + lane
            else:
                row_vectors = _FormedRowVectors(lane, tpr_log2)
            next_row[0] = 0
            next_block[0] = 0
            next_live[0] = 0
            next_expert[0] = 0
            next_index[0] = 0
            if staged:
                # Staged: the lookups run two steps ahead, the copy one: iteration t looks up step t + 1, copies
                # step t (its lookups arrived during iteration t - 1, so that a skipped row is not read) and loads
                # its weight, then computes step t - 1 from its copy. Step 0 is looked up and copied before the silu
                # table is built (about 150 instructions a thread, which would otherwise leave the memory system
                # idle), its row whether skipped or not, as its lookups have not arrived yet.
                stage = T.alloc_shared((2, 2 * num_vectors, threads, epv), in_dtype)
                staged_row = T.alloc_local((1,), T.int32)
                staged_block = T.alloc_local((1,), T.int32)
                staged_live = T.alloc_local((1,), T.int32)
                staged_weight = T.alloc_local((1,), T.float32)
                staged_row[0] = 0
                staged_block[0] = 0
                staged_live[0] = 0
                staged_weight[0] = T.float32(1)
                look_up_step(0, next_row, next_block, next_live, next_expert, next_index, pos_to_expert, pos_to_token_topk,
                             with_pos_to_expert, with_weight, pid, tid, num_ctas, num_iters, num_rows, blocks_per_row, row_magic,
                             row_shift, tpr_log2)
                if next_live[0] != 0:
                    stage_step(stage, x, 0, next_row[0], next_block[0], lane, row_vectors, tid)
                T.evaluate(T.call_extern('void', 'tk_stage_commit'))
            if table:
                # The silu table (_SILU_TABLE_PRELUDE), built before the loop: built inside it at t = 1, so as
                # to overlap step 0's loads, tilelang put a barrier before the table stores of every iteration.
                silu_table = T.alloc_shared((TABLE_WORDS,), T.float32)
                table_gates = T.alloc_local((2 * TABLE_PER_SIGN // threads,), T.float32)
                table_silu = T.alloc_local((2 * TABLE_PER_SIGN // threads,), T.float32)
                div_range_build = T.alloc_local((2,), T.float32)
                build_silu_table(silu_table, table_gates, table_silu, div_range_build, clamp_c, tid)
                T.sync_threads()
            row = T.alloc_var(T.int32)
            block = T.alloc_var(T.int32)
            live = T.alloc_var(T.int32)
            index = T.alloc_var(T.int32)
            for t in T.serial(num_iters + 1):
                # Step t - 1: its row and block (worked out once, with its lookups), and whether it is
                # processed. The block, not the column, is carried: block * 128 + lane * epv keeps the
                # vector alignment visible to tilelang, which then emits 16-byte loads and stores (the column
                # is written out at each use: bound to a name it becomes a let that the vectoriser does not
                # see through, and every access was split into single elements).
                if staged:
                    row = staged_row[0]
                    block = staged_block[0]
                    live = staged_live[0]
                    step_weight[0] = staged_weight[0]
                    staged_row[0] = next_row[0]
                    staged_block[0] = next_block[0]
                    staged_live[0] = step_is_live(next_live, next_expert, with_pos_to_expert)
                    index = next_index[0]
                    look_up_step(t + 1, next_row, next_block, next_live, next_expert, next_index, pos_to_expert, pos_to_token_topk,
                                 with_pos_to_expert, with_weight, pid, tid, num_ctas, num_iters, num_rows, blocks_per_row, row_magic,
                                 row_shift, tpr_log2)
                    staged_weight[0] = T.float32(1)
                    if staged_live[0] != 0:
                        if t > 0:  # (step 0 was copied before the table's build)
                            stage_step(stage, x, t & 1, staged_row[0], staged_block[0], lane, row_vectors, tid)
                        if with_weight != 0:
                            staged_weight[0] = weight_of(topk_weights, index)
                    if t > 0:
                        T.evaluate(T.call_extern('void', 'tk_stage_commit'))
                        T.evaluate(T.call_extern('void', 'tk_stage_wait_previous'))
                    if live != 0:
                        unstage_step(stage, gate, up, (t + 1) & 1, row_vectors, tid)
                else:
                    row = next_row[0]
                    block = next_block[0]
                    live = step_is_live(next_live, next_expert, with_pos_to_expert)
                    index = next_index[0]
                    step_weight[0] = T.float32(1)
                    if live != 0:
                        load_from_x(x, gate, up, row, block, lane, row_vectors)
                        if with_weight != 0:
                            step_weight[0] = weight_of(topk_weights, index)
                    # Lookups of step t, issued now and read at the start of the next iteration.
                    look_up_step(t, next_row, next_block, next_live, next_expert, next_index, pos_to_expert, pos_to_token_topk,
                                 with_pos_to_expert, with_weight, pid, tid, num_ctas, num_iters, num_rows, blocks_per_row, row_magic,
                                 row_shift, tpr_log2)
                # The SwiGLU of step t - 1.
                amax[0] = T.float32(0)
                if live != 0:
                    # Clamp counts: the largest gate and |up| (two FMNMX an element rather than three
                    # compare-and-adds); fmaxf skips NaN, which no count includes either.
                    reach[0] = T.float32(float('-inf'))
                    reach[1] = T.float32(0)
                    # The divisions without branches (tk_div_rn_fast), so that the 16 elements overlap,
                    # and the largest and smallest |clamped gate| for the step's one range test.
                    div_range[0] = T.float32(0)
                    div_range[1] = T.float32(float('inf'))
                    if words:
                        # The gate's magnitude bits for the table's window test, and the clamp-count reach.
                        gate_bits[0] = T.uint32(0)
                        gate_bits[1] = T.uint32(0xFFFFFFFF)
                        # gate_bits[2]: the clamp-count reach (the signed 16-bit maximum of the gates and |up|s,
                        # from -0.0 in both halves, the signed minimum), or without counters the largest |up| bits.
                        # Either at or below c (and c > 0) makes the clamp of every up of the step an identity.
                        gate_bits[2] = T.if_then_else(count_clamp != 0, T.uint32(0x80008000), T.uint32(0))
                        for j in T.unroll(num_vectors):
                            T.evaluate(T.call_extern('void', 'tk_track_gate_bits_bf16x8', T.address_of(gate[j, 0]),
                                                     T.address_of(gate_bits[0]), T.address_of(gate_bits[1])))
                            if count_clamp != 0:
                                T.evaluate(T.call_extern('void', 'tk_track_reach_bf16x8', T.address_of(gate[j, 0]),
                                                         T.address_of(up[j, 0]), T.address_of(gate_bits[2])))
                            else:
                                T.evaluate(T.call_extern('void', 'tk_track_magnitude_bf16x8', T.address_of(up[j, 0]),
                                                         T.address_of(gate_bits[2])))
                        if _warp_all('tk_gate_bits_in_table', gate_bits[0], gate_bits[1]):
                            # silu(min(g, c)) of every gate from the table (the test above keeps every offset
                            # inside it), then the exact path's products: silu * clamped up * weight, without
                            # the up clamp's two FMNMX an element where the step shows it is an identity.
                            if _warp_all('tk_up_clamp_is_identity', gate_bits[2], clamp_c):
                                table_step(gate, up, act, up_wide, silu_table, step_weight, clamp_c, False)
                            else:
                                table_step(gate, up, act, up_wide, silu_table, step_weight, clamp_c, True)
                        else:
                            # A gate outside the window (zero, tiny, large, inf, NaN: rare): the exact path.
                            for j in T.unroll(num_vectors):
                                for e in T.unroll(epv):
                                    act[j, e] = _clamped_swiglu(T.Cast(T.float32, gate[j, e]), T.Cast(T.float32, up[j, e]),
                                                                clamp_c) * step_weight[0]
                    else:
                        for j in T.unroll(num_vectors):
                            for e in T.vectorized(epv):
                                gate_wide[e] = T.Cast(T.float32, gate[j, e])
                            for e in T.vectorized(epv):
                                up_wide[e] = T.Cast(T.float32, up[j, e])
                            for e in T.unroll(epv):
                                l = gate_wide[e]
                                r = up_wide[e]
                                if count_clamp != 0:
                                    reach[0] = T.max(reach[0], l)
                                    reach[1] = T.max(reach[1], T.abs(r))
                                gate_clamped[0] = T.call_extern('float32', 'tk_min_nan', l, clamp_c)
                                track_division_range(div_range, gate_clamped[0])
                                act[j, e] = _clamped_swiglu_fast(gate_clamped[0], r, clamp_c) * step_weight[0]
                        # Outside the range (a zero, tiny or large gate, inf, NaN: rare), the step again with
                        # IEEE division, from x read again (in cache) rather than loaded vectors kept live.
                        fast_ok = T.call_extern('int32', 'tk_div_fast_in_range', div_range[0], div_range[1]) != 0
                        if not fast_ok:
                            load_from_x(x, gate, up, row, block, lane, row_vectors)
                            for j in T.unroll(num_vectors):
                                for e in T.unroll(epv):
                                    act[j, e] = _clamped_swiglu(T.Cast(T.float32, gate[j, e]), T.Cast(T.float32, up[j, e]),
                                                                clamp_c) * step_weight[0]
                    if per_row:
                        # Not the filler past the row's end: its act is 0 for c >= 0, not for a negative c.
                        amax[0] = T.max(amax[0], _step_abs_max(act, num_vectors, epv, vector_in_row, row_vectors))
                    else:
                        amax[0] = T.max(amax[0], _step_abs_max(act, num_vectors, epv))
                    # Only a step that reaches the clamp is counted exactly, from its vectors read again:
                    # keeping the loaded ones for this rare case would hold 32 registers through the element
                    # loop. Staged, from the thread's own slots of the stage, which the next step's copy
                    # overwrites only in the next iteration: from x (in L2) the recounting thread waited for a
                    # load of its own at each such step, and per row its whole CTA with it, at the amax's barrier.
                    if count_clamp != 0:
                        if words:
                            reach_exceeds = T.call_extern('int32', 'tk_reach_exceeds', gate_bits[2], clamp_c) != 0
                        else:
                            reach_exceeds = T.Or(reach[0] > clamp_c, reach[1] > clamp_c)
                        if reach_exceeds:
                            if staged:
                                unstage_step(stage, gate, up, (t + 1) & 1, row_vectors, tid)
                            else:
                                load_from_x(x, gate, up, row, block, lane, row_vectors)
                            for j in T.unroll(num_vectors):
                                if in_step(j, row_vectors):  # (not the filler past a row's end)
                                    count_vector(gate, up, counts, clamp_c, clamp_pair, j)
                # Block amax: a butterfly over the block's lanes (adjacent; every lane takes part: a
                # skipped or missing row is a whole number of blocks, all with amax 0).
                if per_row:
                    # Row amax: rows of a warp or more by warp reductions (_ROW_MAX_PRELUDE), narrower rows by a
                    # butterfly over their lanes. Every thread takes part (uniform branches).
                    if tpr_log2 >= 5:
                        amax[0] = T.call_extern('float32', 'tk_row_max_wide', T.address_of(row_partials[0]), amax[0], tid, tpr_log2, t & 1)
                    else:
                        for s in T.unroll(4):
                            if s < tpr_log2:
                                amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
                else:
                    for s in T.unroll(lanes_log2):
                        amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
                if live != 0:
                    block_scale(amax[0], sf_floor, E4M3_MAX, round_sf, packed, sf, multiplier, 0)
                    if lane == 0:
                        store_token_sf(out_sf, packed, T.Cast(T.int64, row), block, sf[0], block + 1 == blocks_per_row,
                                       num_sf_blocks, num_sf_words)
                    for j in T.unroll(num_vectors):
                        # Products first, then the casts as a vectorised loop: one F2FP (satfinite,
                        # round to nearest even, as the scalar cast) converts a pair in place.
                        for e in T.unroll(epv):
                            act[j, e] = act[j, e] * multiplier[0]
                        for e in T.vectorized(epv):
                            quantized[e] = T.Cast(T.float8_e4m3fn, act[j, e])
                        if in_step(j, row_vectors):
                            for e in T.vectorized(epv):
                                out[T.Cast(T.int64, row), vector_col(j, block, lane, row_vectors) + e] = quantized[e]
            if count_clamp != 0:
                count_into(counts, clamped_count, red_counts, tid)

    alignment = {'x': 16, 'out': 16, 'out_sf': 1 if packed else 4, 'pos_to_token_topk': 4, 'topk_weights': 4, 'pos_to_expert': 4,
                 'clamped_count': 8}
    return KernelProgram(swiglu_forward, alignment=alignment)


def prebuilt_forward():
    for in_dtype in IN_DTYPES:
        for sf_format in SF_FORMATS:
            yield dict(in_dtype=in_dtype, sf_format=sf_format, per_row=False, row_threads=0)
        for row_threads in ROW_THREADS[in_dtype]:
            yield dict(in_dtype=in_dtype, sf_format='f32', per_row=True, row_threads=row_threads)


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
    num_segments = CH_TOKENS // CH_SEGMENT
    epv = vec_bytes // 2  # channels a vector
    vectors_per_row = CH_CHANNELS // epv
    loads = CH_TOKENS * vectors_per_row // CH_THREADS  # vectors of each half per thread
    HALF = CH_SEGMENT // 2  # tokens per lane in the cast phase

    def swizzled_chunk(token, chunk):
        """Where the 16-byte chunk `chunk` (8 channels) of token `token` lies in its act_shared row: the two
        halves of the row swap on bit 4 of the token. The cast phase's lanes read one 32-bit word (two channels)
        of tokens 16 apart from the same half-row of channels; without the swap the lane pair of a word would
        hit the same bank (2-way conflicts on every load). With 32-byte vectors the two chunks of a vector also
        swap on bit 0 of the token: a thread stores its vector as two 16-byte halves, and a quarter-warp's first
        store (4 vectors of each of two tokens) would otherwise put both tokens' even chunks on the same banks;
        the cast phase's loads stay conflict-free, as the swap only permutes chunks within a half-row."""
        swapped = T.bitwise_xor(chunk, ((token // 16) % 2) * (CH_CHANNELS // 16))
        return swapped if vec_bytes == 16 else T.bitwise_xor(swapped, token % 2)

    def swizzled_byte(token, offset):
        """Where byte `offset` of token `token`'s e4m3 row (64 channels) lies in quantized_shared: the halves swap on
        bit 4 of the token, for the reason of swizzled_chunk (a lane pair's tokens lie 16 apart). A sum modulo the
        row rather than an XOR: the vectoriser sees that a 16-byte run stays aligned and whole."""
        return (offset + ((token // 16) % 2) * (CH_CHANNELS // 2)) % CH_CHANNELS

    @T.macro
    def swiglu_chunk(gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, token, chunk, i, first, fast, clamp):
        """Elements first .. first + 7 of the thread's vector i: 16-byte chunk `chunk` of token `token`."""
        T.evaluate(T.call_extern('void', 'tk_widen_bf16x8', T.address_of(gate[i, first]), T.address_of(gate_f32[0])))
        T.evaluate(T.call_extern('void', 'tk_widen_bf16x8', T.address_of(up[i, first]), T.address_of(up_f32[0])))
        for e in T.unroll(8):
            if fast and not clamp:
                act_f32[e] = T.call_extern('float32', 'tk_div_rn_fast', gate_f32[e], T.float32(1) + T.exp(-gate_f32[e])) * up_f32[e]
            elif fast:
                act_f32[e] = _clamped_swiglu_fast(T.call_extern('float32', 'tk_min_nan', gate_f32[e], clamp_c), up_f32[e], clamp_c)
            else:
                act_f32[e] = _clamped_swiglu(gate_f32[e], up_f32[e], clamp_c)
        # A vectorised cast: one conversion instruction per pair, not one per element plus a merge.
        for e in T.vectorized(8):
            act[e] = T.Cast(T.bfloat16, act_f32[e])
        for e in T.vectorized(8):
            act_shared[token, swizzled_chunk(token, chunk) * 8 + e] = act[e]

    @T.macro
    def swiglu_vector(gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, idx, i, fast, clamp):
        """act of the thread's vector i (token idx // vectors_per_row), rounded to bf16, into act_shared, 8 channels
        at a time; fast: with tk_div_rn_fast (exact only if tk_gate_bits_in_div_range passed), else IEEE division;
        clamp: False only where tk_clamps_are_identity passed (and with fast)."""
        for part in T.unroll(epv // 8):
            swiglu_chunk(gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, idx // vectors_per_row,
                         (idx % vectors_per_row) * (epv // 8) + part, i, part * 8, fast, clamp)

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
        with T.Kernel(hidden // CH_CHANNELS, num_tokens // CH_TOKENS, threads=CH_THREADS,
                      prelude=_NAN_MIN_MAX_PRELUDE + _FAST_DIV_PRELUDE + _BF16_WORDS_PRELUDE) as (pid_h, pid_t):
            T.assume(num_tokens % CH_TOKENS == 0)
            T.assume(hidden % CH_CHANNELS == 0)
            T.assume(width % 64 == 0)
            # 64 registers a thread (4 CTAs per SM): the branch-free divisions overlap a vector's 8 elements,
            # which needs more registers than one element's chain at a time, and at 48 (5 CTAs) nvcc spilled
            # 40 bytes. A warp now has 8 independent chains, so fewer warps hide the latency.
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

            # Phase 1: SwiGLU, rounded to bf16 (upstream's rounding point), into shared memory. All of the
            # thread's loads are issued before any arithmetic, so its 128 bytes are in flight together rather
            # than 32 bytes at a time behind each step's exponentials and divisions.
            for i in T.unroll(loads):
                idx = i * CH_THREADS + tid
                for e in T.vectorized(epv):
                    gate[i, e] = x[t0 + idx // vectors_per_row, h0 + (idx % vectors_per_row) * epv + e]
                for e in T.vectorized(epv):
                    up[i, e] = x[t0 + idx // vectors_per_row, hidden + h0 + (idx % vectors_per_row) * epv + e]
            # The clamp against c, or +inf without a clamp (the same results, NaN included): the element loop
            # then has no use_clamp test, which nvcc compiled to a branch around the up clamp of every element.
            clamp_c = T.alloc_var(T.float32)
            clamp_c = T.if_then_else(use_clamp != 0, clamp_value, T.float32(float('inf')))
            # The divisions without branches (tk_div_rn_fast), so that the elements overlap, under ONE range test
            # of all of the thread's gates, made before any arithmetic on their bf16 bits
            # (tk_track_gate_bits_bf16x8, tk_gate_bits_in_div_range: 4 LOP3 and 4 VIMNMX3 a vector where float max
            # and min of each clamped |gate| took 16 FMNMX, plus one test a thread instead of one a vector); a
            # thread with any gate outside the range (rare) computes all of its vectors with IEEE division. The
            # halves are widened as words (tk_widen_bf16x8: one SHF or LOP3 an element, where the casts spent a
            # PRMT, often a MOV, and a shift on each high half).
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
            # One path a warp: each thread's tests pass or fail on its own values, and a warp whose threads
            # disagreed ran two or three paths one after the other (on inputs with values beyond the clamp, most
            # warps). The exact division and the clamps are right for every value, so the warp takes the most
            # general path any of its threads needs.
            if _warp_all('tk_gate_bits_in_div_range', gate_bits[0], gate_bits[1], clamp_c):
                # No value beyond the clamp (the usual case, and always without one): the clamps are identities.
                if _warp_all('tk_clamps_are_identity', gate_bits[0], gate_bits[2], clamp_c):
                    for i in T.unroll(loads):
                        swiglu_vector(gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, i * CH_THREADS + tid, i, True,
                                      False)
                else:
                    for i in T.unroll(loads):
                        swiglu_vector(gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, i * CH_THREADS + tid, i, True,
                                      True)
            else:
                for i in T.unroll(loads):
                    swiglu_vector(gate, up, gate_f32, up_f32, act_f32, act, act_shared, clamp_c, i * CH_THREADS + tid, i, False,
                                  True)
            T.sync_threads()

            # Phase 2: lane pair (2 * q, 2 * q + 1) of warp w owns channels 2p, 2p + 1 (p = (w % 2) * 16 + q) of
            # the 32 tokens of segment w // 2; lane half h takes their tokens h * 16 .. h * 16 + 15. So each
            # shared load is one 32-bit word (two channels, 16 a thread where one channel took 32 16-bit loads),
            # and each transposed store instruction writes 16 whole 32-byte sectors (the two lanes of a pair
            # write the two halves of a channel's 32 tokens together) where a lane's 32 tokens took two
            # instructions that each wrote half of 32 sectors; untransposed, the e4m3 codes go through shared
            # memory to whole rows (quantized_shared, below).
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
                    pair_bf16[j] = act_shared[token, swizzled_chunk(token, p // 4) * 8 + (p % 4) * 2 + j]
                # One SHF and one LOP3 (the word's halves as floats), where the bf16x2 cast took a PRMT and two SHF.
                T.evaluate(T.call_extern('void', 'tk_widen_bf16x2', T.address_of(pair_bf16[0]), T.address_of(pair_f32[0])))
                for j in T.unroll(2):
                    if transpose:
                        values[j, i] = pair_f32[j]
                    else:
                        values[i, j] = pair_f32[j]
                    amax2[j] = T.max(amax2[j], T.abs(pair_f32[j]))
            # The segment's amax: the two halves of the lane pair. From here on lane h works on channel 2p + h only
            # (its amax, the block's amax across segments, the scale factor and its store, one block_scale where
            # each lane computed both channels'), and takes the partner's multiplier with one shuffle. max() is
            # NaN-skipping, commutative and associative here (amax starts at +0), so the order of the maxima does
            # not change a bit.
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
            # Lane h writes the scale factor of channel 2p + h: a warp's 32 lanes write 32 consecutive floats.
            if npt_log2 == 7:
                if s == 0:
                    out_sf[pid_t, h0 + 2 * p + h] = sf2[0]
            else:
                out_sf[pid_t * num_segments + s, h0 + 2 * p + h] = sf2[0]
            # Products first, then the casts as a vectorised loop: one conversion instruction per pair.
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
                # Through shared memory to the rows: a lane holds two channels of 16 tokens, whose 2-byte stores
                # to global memory took 16 instructions a thread (a warp's 64 bytes each); from the tile, two
                # 16-byte stores a thread write whole rows of the block (a warp's 512 bytes each). 27.0 -> 26.6 us
                # at 8192 x 2048 (docs/gpu-runs/2026-12-01-h200.md, run 2).
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
            yield dict(transpose=transpose, vec_bytes=vec_bytes)


def check_backward(grad_dtype: str) -> None:
    if grad_dtype != 'bfloat16':
        raise ValueError(f"grad_dtype must be 'bfloat16' (upstream's only gradient dtype), got {grad_dtype!r}")


def build_backward(arch: Arch, grad_dtype: str) -> KernelProgram:
    num_rows = T.dynamic('num_rows')
    width = T.dynamic('width')
    hidden = T.dynamic('hidden')
    num_sf = T.dynamic('num_sf')
    num_weights = T.dynamic('num_weights')
    num_warps = BWD_THREADS // 32
    n = BWD_ELEMS

    @T.macro
    def load_step(x, grad_out, xq, yq, g, row, col):
        """The thread's 16 gates, 16 ups and 16 output gradients of row `row` from channel `col`."""
        for e in T.vectorized(n):
            xq[e] = x[row, col + e]
        for e in T.vectorized(n):
            yq[e] = x[row, hidden + col + e]
        for e in T.vectorized(n):
            g[e] = grad_out[row, col + e]

    @T.macro
    def step_elements(xq, yq, g, sfx, sfy, w, clamp_c, fast, xf, yf, xc, yc, denominator, sig, quotient, gws, out_f32, gx, gy,
                      amax, acc, div_range):
        """The 16 elements of a step: out_f32, gx, gy, their block amax and the weight_grad sum acc. fast: the
        divisions by tk_rcp_rn_fast and tk_div_rn_fast_by, with the range of the clamped gates in div_range
        (exact only if tk_div_fast_in_range_or_zero passes); else IEEE division."""
        # Vectorised fp8 -> float32 conversions: one unpack a pair, not a mask, shift and unpack an element.
        for e in T.vectorized(n):
            xf[e] = T.Cast(T.float32, xq[e])
        for e in T.vectorized(n):
            yf[e] = T.Cast(T.float32, yq[e])
        for e in T.unroll(n):
            xv = xf[e] * sfx
            yv = yf[e] * sfy
            go = T.Cast(T.float32, g[e])
            # Selects against clamp_c (+inf without a clamp), each value bound once through a register array:
            # if_then_else on use_clamp became if/else blocks pasted at every use (the exponential four times),
            # which nvcc did not fold back.
            xc[e] = T.Select(xv > clamp_c, clamp_c, xv)
            # torch.clamp(r, -c, c), low bound first, as the flat forward's (_clamped_swiglu): two FMNMX.NAN where
            # the selects took two compares and two selects.
            yc[e] = T.call_extern('float32', 'tk_min_nan', T.call_extern('float32', 'tk_max_nan', yv, -clamp_c), clamp_c)
            denominator[e] = T.float32(1) + T.exp(-xc[e])
            if fast:
                div_range[0] = T.call_extern('float32', 'tk_max_nan', div_range[0], T.abs(xc[e]))
                div_range[1] = T.min(div_range[1], T.call_extern('float32', 'tk_abs_below_or_nan_at_zero', xc[e]))
                sig[e] = T.call_extern('float32', 'tk_rcp_rn_fast', denominator[e])
                quotient[e] = T.call_extern('float32', 'tk_div_rn_fast_by', xc[e], denominator[e], sig[e])
            else:
                sig[e] = T.float32(1) / denominator[e]
                quotient[e] = xc[e] / denominator[e]
            act = quotient[e] * yc[e]
            acc[0] = acc[0] + go * act
            gws[e] = go * w * sig[e]
            out_f32[e] = act * w
            # 1 + x (1 - s) with one rounding, as the reference's compiled FMA.
            dx = gws[e] * yc[e] * T.call_extern('float32', '__fmaf_rn', xc[e], T.float32(1) - sig[e], T.float32(1))
            gx[e] = T.Select(xv > clamp_c, T.float32(0), dx)
            # r > c or r < -c is |r| > c for any non-NaN c (for c < 0 both hold for every non-NaN r): one compare.
            gy[e] = T.Select(T.abs(yv) > clamp_c, T.float32(0), gws[e] * xc[e])
            amax[0] = T.max(amax[0], T.abs(gx[e]))
            amax[1] = T.max(amax[1], T.abs(gy[e]))

    @T.prim_func
    def swiglu_backward(
        x: T.Tensor[(num_rows, width), T.float8_e4m3fn],
        x_sf: T.Tensor[(num_rows, num_sf), T.float32],
        grad_out: T.Tensor[(num_rows, hidden), T.bfloat16],
        weight: T.Tensor[(num_weights,), T.float32],
        pos_to_token_topk: T.Tensor[(num_rows,), T.int32],
        token_topk_to_pos: T.Tensor[(num_weights,), T.int32],
        out: T.Tensor[(num_rows, hidden), T.bfloat16],
        x_grad_fp8: T.Tensor[(num_rows, width), T.float8_e4m3fn],
        x_grad_sf: T.Tensor[(num_rows, num_sf), T.float32],
        x_grad: T.Tensor[(num_rows, width), T.bfloat16],
        weight_grad: T.Tensor[(num_weights,), T.float32],
        num_ctas: T.int32,
        num_iters: T.int32,
        npc_log2: T.int32,
        round_sf: T.int32,
        use_clamp: T.int32,
        clamp_value: T.float32,
    ):
        with T.Kernel(num_ctas, threads=BWD_THREADS, prelude=_NAN_MIN_MAX_PRELUDE + _BACKWARD_DIV_PRELUDE) as pid:
            # Issue-bound (exponential and the divisions per element): as many warps as fit without a spill
            # (see BWD_MIN_BLOCKS).
            T.annotate_min_blocks_per_sm(BWD_MIN_BLOCKS)
            T.assume(hidden % 32 == 0)
            T.assume(width % 64 == 0)
            tid = T.get_thread_binding()
            xq = T.alloc_local((n,), T.float8_e4m3fn)
            yq = T.alloc_local((n,), T.float8_e4m3fn)
            g = T.alloc_local((n,), T.bfloat16)
            gx = T.alloc_local((n,), T.float32)
            gy = T.alloc_local((n,), T.float32)
            xf = T.alloc_local((n,), T.float32)
            yf = T.alloc_local((n,), T.float32)
            xc = T.alloc_local((n,), T.float32)
            yc = T.alloc_local((n,), T.float32)
            denominator = T.alloc_local((n,), T.float32)
            sig = T.alloc_local((n,), T.float32)
            quotient = T.alloc_local((n,), T.float32)
            gws = T.alloc_local((n,), T.float32)
            out_f32 = T.alloc_local((n,), T.float32)
            out_local = T.alloc_local((n,), T.bfloat16)
            gx16 = T.alloc_local((n,), T.bfloat16)
            gy16 = T.alloc_local((n,), T.bfloat16)
            qx = T.alloc_local((n,), T.float8_e4m3fn)
            qy = T.alloc_local((n,), T.float8_e4m3fn)
            amax = T.alloc_local((2,), T.float32)
            sf = T.alloc_local((2,), T.float32)
            multiplier = T.alloc_local((2,), T.float32)
            acc = T.alloc_local((1,), T.float32)
            acc_before = T.alloc_local((1,), T.float32)  # acc at the start of the step, for its IEEE redo
            div_range = T.alloc_local((2,), T.float32)  # largest |clamped gate| and smallest nonzero one, less an ulp
            w_local = T.alloc_local((1,), T.float32)
            sf_in = T.alloc_local((2,), T.float32)
            red = T.alloc_shared((num_warps,), T.float32)
            lanes_log2 = npc_log2 - 4  # lanes per block, log2: 1 (32 channels) or 3 (128)
            # The clamp against c, or +inf without a clamp (the same results and masks, NaN included).
            clamp_c = T.alloc_var(T.float32)
            clamp_c = T.if_then_else(use_clamp != 0, clamp_value, T.float32(float('inf')))

            # A (token, topk) slot no row maps to gets a zero gradient, as upstream.
            if pid < num_weights:
                if tid == 0 and token_topk_to_pos[pid] == -1:
                    weight_grad[pid] = T.float32(0)
            if pid < num_rows:  # uniform over the CTA
                index = pos_to_token_topk[pid]
                w_local[0] = T.if_then_else(index >= 0, weight[T.max(index, 0)], T.float32(0))
                w = w_local[0]
                acc[0] = T.float32(0)
                for it in T.serial(num_iters):
                    col = (it * BWD_THREADS + tid) * n
                    amax[0] = T.float32(0)
                    amax[1] = T.float32(0)
                    if col < hidden:  # a whole block is in or out
                        load_step(x, grad_out, xq, yq, g, pid, col)
                        # Into registers once: a load bound to a Python name is re-emitted at every use, and
                        # the lowered ld.global intrinsics are not merged (16 loads of each a step before).
                        sf_in[0] = x_sf[pid, col >> npc_log2]
                        sf_in[1] = x_sf[pid, (hidden + col) >> npc_log2]
                        sfx = sf_in[0]
                        sfy = sf_in[1]
                        # The divisions without branches (tk_rcp_rn_fast, tk_div_rn_fast_by: one reciprocal for
                        # the sigmoid and the quotient), so that the 16 elements overlap, and the largest and
                        # smallest nonzero |clamped gate| for the step's one range test; outside the range (a
                        # tiny or large gate, inf, NaN: rare) the step again with IEEE division, from the row
                        # read again (in cache) rather than loaded vectors kept live through the element loop.
                        acc_before[0] = acc[0]
                        div_range[0] = T.float32(0)
                        div_range[1] = T.float32(float('inf'))
                        step_elements(xq, yq, g, sfx, sfy, w, clamp_c, True, xf, yf, xc, yc, denominator, sig, quotient, gws, out_f32,
                                      gx, gy, amax, acc, div_range)
                        if T.call_extern('int32', 'tk_div_fast_in_range_or_zero', div_range[0], div_range[1]) == 0:
                            acc[0] = acc_before[0]
                            amax[0] = T.float32(0)
                            amax[1] = T.float32(0)
                            # The row index plus a zero nvcc cannot see through: the same loads would be merged
                            # with the step's, keeping its 48 widened inputs live through the fast element loop.
                            load_step(x, grad_out, xq, yq, g, pid + T.call_extern('int32', 'tk_opaque_zero'), col)
                            step_elements(xq, yq, g, sfx, sfy, w, clamp_c, False, xf, yf, xc, yc, denominator, sig, quotient, gws,
                                          out_f32, gx, gy, amax, acc, div_range)
                        # Vectorised casts: one conversion instruction per pair.
                        for e in T.vectorized(n):
                            out_local[e] = T.Cast(T.bfloat16, out_f32[e])
                        for e in T.vectorized(n):
                            gx16[e] = T.Cast(T.bfloat16, gx[e])
                        for e in T.vectorized(n):
                            gy16[e] = T.Cast(T.bfloat16, gy[e])
                        for e in T.vectorized(n):
                            out[pid, col + e] = out_local[e]
                        for e in T.vectorized(n):
                            x_grad[pid, col + e] = gx16[e]
                        for e in T.vectorized(n):
                            x_grad[pid, hidden + col + e] = gy16[e]
                    # Block amax over its adjacent lanes (uniform loop: every lane takes part).
                    for s in T.unroll(3):
                        if s < lanes_log2:
                            amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
                            amax[1] = T.max(amax[1], T.shfl_xor(amax[1], 1 << s))
                    if col < hidden:
                        block_scale(amax[0], T.float32(1e-4), E4M3_MAX, round_sf, False, sf, multiplier, 0)
                        block_scale(amax[1], T.float32(1e-4), E4M3_MAX, round_sf, False, sf, multiplier, 1)
                        if (tid & ((1 << lanes_log2) - 1)) == 0:
                            x_grad_sf[pid, col >> npc_log2] = sf[0]
                            x_grad_sf[pid, (hidden + col) >> npc_log2] = sf[1]
                        # Products first, then the casts as vectorised loops: one conversion per pair.
                        for e in T.unroll(n):
                            gx[e] = gx[e] * multiplier[0]
                            gy[e] = gy[e] * multiplier[1]
                        for e in T.vectorized(n):
                            qx[e] = T.Cast(T.float8_e4m3fn, gx[e])
                        for e in T.vectorized(n):
                            qy[e] = T.Cast(T.float8_e4m3fn, gy[e])
                        for e in T.vectorized(n):
                            x_grad_fp8[pid, col + e] = qx[e]
                        for e in T.vectorized(n):
                            x_grad_fp8[pid, hidden + col + e] = qy[e]
                # weight_grad = sum over the row of grad_out * act (fp32; the order is the kernel's).
                for s in T.unroll(5):
                    acc[0] = acc[0] + T.shfl_xor(acc[0], 16 >> s)
                if tid % 32 == 0:
                    red[tid // 32] = acc[0]
                T.sync_threads()
                if tid == 0 and index >= 0:
                    total = T.alloc_var(T.float32)
                    total = red[0]
                    for k in T.unroll(1, num_warps):
                        total = total + red[k]
                    weight_grad[index] = total

    alignment = {'x': 16, 'x_sf': 4, 'grad_out': 16, 'weight': 4, 'pos_to_token_topk': 4, 'token_topk_to_pos': 4, 'out': 16,
                 'x_grad_fp8': 16, 'x_grad_sf': 4, 'x_grad': 16, 'weight_grad': 4}
    return KernelProgram(swiglu_backward, alignment=alignment)


def prebuilt_backward():
    yield dict(grad_dtype='bfloat16')


# Every access is masked explicitly (against the run-time dims); tilelang's own per-element guards would
# stop the 16-byte vectorisation.
PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True}
# The per-channel cast's e4m3 tile gets memory of its own: placed over act_shared (dead by then), it needed a
# barrier between the last act_shared load and the first tile store, one more a CTA. Its barriers are all its own
# (T.sync_threads): tilelang's barrier insertion, which added none to the 16-byte kernels, put one between a
# thread's two act_shared stores of a 32-byte vector (it could not prove them disjoint from other threads'), inside
# the per-thread division paths, which not every thread of a CTA reaches: the kernel hung (GPU runs 1-3 of
# docs/gpu-runs/2026-12-02-h200-d.md). The build now refuses such a barrier (build_tools.lower._check_barriers_uniform),
# and tests/cpu/test_lowering.py counts this kernel's.
CHANNEL_PASS_CONFIGS = {**PASS_CONFIGS, 'tl.disable_shared_memory_reuse': True, 'tl.disable_thread_storage_sync': True}

FORWARD = KernelDecl(
    name='quant.swiglu_forward_and_per_token_cast',
    params=(param('in_dtype', 'str', ''), param('sf_format', 'str', 'sf'), param('per_row', 'bool', 'row'),
            param('row_threads', 'int', 'rt')),
    factory=build_forward,
    prebuilt=prebuilt_forward,
    check=check_forward,
    pass_configs=PASS_CONFIGS,
)

CHANNEL = KernelDecl(
    name='quant.swiglu_forward_and_per_channel_cast_and_transpose',
    params=(param('transpose', 'bool', 'tr'), param('vec_bytes', 'int', 'vb')),
    factory=build_channel,
    prebuilt=prebuilt_channel,
    check=check_channel,
    pass_configs=CHANNEL_PASS_CONFIGS,
)

BACKWARD = KernelDecl(
    name='quant.swiglu_backward_and_per_token_cast',
    params=(param('grad_dtype', 'str', ''),),
    factory=build_backward,
    prebuilt=prebuilt_backward,
    check=check_backward,
    pass_configs=PASS_CONFIGS,
)
