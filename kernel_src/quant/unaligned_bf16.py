"""Loading 8 bf16 (16 bytes) from an address that is only 2-byte aligned, in two aligned 16-byte loads.

The unaligned kernel variants used to load such a run element by element: eight 2-byte loads (and four
merges) per 16 bytes, where the aligned variants issue one 16-byte load. Here a run starting at byte
address p (p even) is read from the two aligned vectors that cover it, lo = [a, a + 16) and hi =
[a + 16, a + 32) with a = p & ~15, and its four words are cut out of that 32-byte window: word k is bytes
[off + 4k, off + 4k + 4) of the window (off = p - a, even), a pick among the window's words by off / 4 (two
levels of selects) and a funnel shift by 0 or 16 bits. Two loads instead of eight; the neighbouring lane
loads the same two lines, so the extra vector is an L1 hit, not DRAM traffic.

No byte outside the run's row is ever read. The window sticks out of the row only at its ends, and only when
off != 0: lo starts before the row for the row's first run, hi ends past it for the row's last. Those loads
read the window's other vector instead (inside the row, because a row is at least two runs long: hidden % 16
== 0), and the run's first (16 - off) / 2 or last off / 2 elements, which that leaves wrong, are loaded one
by one (tk_bf16_run_reload) behind a warp vote, so that the warps without a row end (most: a row of H 7168
is 28 warps' spans) skip those loads with one vote and branch; left to nvcc, they became predicated loads that
every warp issued. With off == 0, hi is not needed and reads lo again. The loads of every run of a thread are
issued (tk_bf16_window_load) before any is assembled (tk_bf16_window_assemble), so that they are all in
flight together.

tests/cpu/test_unaligned_bf16.py replays both steps in numpy over every even offset and row lengths from two
runs up, against a plain slice, and checks that every byte read lies inside the row.
"""

from tilelang import language as T

PRELUDE = """
__device__ __forceinline__ void tk_bf16_window_load(const void *run, int first, int last, unsigned *window) {
  const unsigned long long address = reinterpret_cast<unsigned long long>(run);
  const unsigned off = static_cast<unsigned>(address) & 15u;
  const uint4 *aligned = reinterpret_cast<const uint4 *>(address - off);
  // The row's first run (off != 0): lo would start before the row, so it reads hi. The row's last run, and
  // any run with off == 0: hi would end past the row (or is not needed), so it reads lo.
  // __ldg: the generic pointer would otherwise become a generic LD rather than a global LDG.
  const uint4 lo = __ldg(aligned + ((first != 0 && off != 0u) ? 1 : 0));
  const uint4 hi = __ldg(aligned + ((last != 0 || off == 0u) ? 0 : 1));
  window[0] = lo.x; window[1] = lo.y; window[2] = lo.z; window[3] = lo.w;
  window[4] = hi.x; window[5] = hi.y; window[6] = hi.z; window[7] = hi.w;
}

__device__ __forceinline__ void tk_bf16_window_assemble(const void *run, const unsigned *window, unsigned *words) {
  const unsigned off = static_cast<unsigned>(reinterpret_cast<unsigned long long>(run)) & 15u;
  // Words off/4 .. off/4 + 4 of the window: first by 8 bytes (bit 3 of off), then by 4 (bit 2).
  unsigned by8[6], by4[5];
#pragma unroll
  for (int i = 0; i < 6; ++i) by8[i] = (off & 8u) ? window[i + 2] : window[i];
#pragma unroll
  for (int i = 0; i < 5; ++i) by4[i] = (off & 4u) ? by8[i + 1] : by8[i];
  const unsigned shift = (off & 2u) * 8u;  // 0 or 16 bits
#pragma unroll
  for (int k = 0; k < 4; ++k) words[k] = __funnelshift_r(by4[k], by4[k + 1], shift);
}

// Whether the run's window was clamped into the row (a row-end run with off != 0), so that its words from
// tk_bf16_window_assemble are wrong and tk_bf16_run_reload must load it.
__device__ __forceinline__ int tk_bf16_run_clamped(const void *run, int first, int last) {
  return (first != 0 || last != 0) && (static_cast<unsigned>(reinterpret_cast<unsigned long long>(run)) & 15u) != 0u;
}

// The run's elements one by one (all inside the row), where it was clamped.
__device__ __forceinline__ void tk_bf16_run_reload(const void *run, int clamped, unsigned *words) {
  if (clamped != 0) {
    const unsigned short *elements = static_cast<const unsigned short *>(run);
#pragma unroll
    for (int k = 0; k < 4; ++k) words[k] = __ldg(elements + 2 * k) | (static_cast<unsigned>(__ldg(elements + 2 * k + 1)) << 16);
  }
}
"""


def window_load(run_address, first, last, window_address):
    """Issue the two aligned loads of the run at run_address into the 8 uint32 at window_address."""
    return T.evaluate(T.call_extern('void', 'tk_bf16_window_load', run_address, T.Cast('int32', first), T.Cast('int32', last),
                                    window_address))


def window_assemble(run_address, window_address, words_address):
    """The run's 4 words (8 bf16, the first in the low half of word 0) from its window (wrong where clamped)."""
    return T.evaluate(T.call_extern('void', 'tk_bf16_window_assemble', run_address, window_address, words_address))


def run_clamped(run_address, first, last):
    """int32: 1 where the run's window was clamped into its row (a row-end run not 16-byte aligned)."""
    return T.call_extern('int32', 'tk_bf16_run_clamped', run_address, T.Cast('int32', first), T.Cast('int32', last))


def run_reload(run_address, clamped, words_address):
    """Where clamped: the run's words from element loads."""
    return T.evaluate(T.call_extern('void', 'tk_bf16_run_reload', run_address, clamped, words_address))


def warp_any(predicate):
    """int32, uniform over the warp: whether predicate holds on any lane (every lane must call it)."""
    return T.call_extern('int32', '__any_sync', T.uint32(0xFFFFFFFF), T.Cast('int32', predicate))
