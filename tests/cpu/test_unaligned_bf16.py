"""Replay of kernel_src/quant/unaligned_bf16.py's device functions in numpy: a run of 8 bf16 at any even
byte offset, read as two aligned 16-byte vectors (clamped into the row at its ends), assembled by word picks
and a funnel shift, and reloaded element by element where clamped, must equal the plain slice, and no byte
outside the row may be read."""

import numpy as np
import pytest

from kernel_src.quant import unaligned_bf16



def _funnelshift_r(lo: int, hi: int, shift: int) -> int:
    """CUDA __funnelshift_r: the low 32 bits of (hi:lo) >> (shift & 31)."""
    return ((hi << 32 | lo) >> (shift & 31)) & 0xFFFFFFFF


class Memory:
    """Bytes of a row at address `start`, with every read recorded (16-byte aligned vectors and halves)."""

    def __init__(self, start: int, row: bytes):
        self.start, self.row, self.reads = start, row, []

    def read(self, address: int, size: int) -> bytes:
        assert address % size == 0, 'misaligned access'
        self.reads.append((address, size))
        lo = address - self.start
        return bytes(self.row[lo + i] if 0 <= lo + i < len(self.row) else 0xAB for i in range(size))


def window_load(memory: Memory, run: int, first: bool, last: bool) -> list[int]:
    off = run & 15
    aligned = run - off
    lo = memory.read(aligned + (16 if (first and off) else 0), 16)
    hi = memory.read(aligned + (0 if (last or off == 0) else 16), 16)
    return list(np.frombuffer(lo + hi, '<u4').astype(int))


def window_assemble(run: int, window: list[int]) -> list[int]:
    off = run & 15
    by8 = [window[i + 2] if off & 8 else window[i] for i in range(6)]
    by4 = [by8[i + 1] if off & 4 else by8[i] for i in range(5)]
    shift = (off & 2) * 8
    return [_funnelshift_r(by4[k], by4[k + 1], shift) for k in range(4)]


def run_clamped(run: int, first: bool, last: bool) -> bool:
    return (first or last) and (run & 15) != 0


def run_reload(memory: Memory, run: int, clamped: bool, words: list[int]) -> list[int]:
    if not clamped:
        return words
    halves = [int.from_bytes(memory.read(run + 2 * e, 2), 'little') for e in range(8)]
    return [halves[2 * k] | halves[2 * k + 1] << 16 for k in range(4)]


@pytest.mark.parametrize('row_start_mod16', range(0, 16, 2))
@pytest.mark.parametrize('hidden', [16, 32, 48, 128, 7168 // 8])
def test_runs_match_slice_and_stay_in_row(row_start_mod16, hidden):
    rng = np.random.default_rng(hidden * 16 + row_start_mod16)
    row = rng.integers(0, 256, size=2 * hidden, dtype=np.uint8).tobytes()
    start = 4096 + row_start_mod16
    runs = hidden // 8
    for c in range(runs):
        memory = Memory(start, row)
        run = start + 16 * c
        first, last = c == 0, c == runs - 1
        words = window_load(memory, run, first, last)
        words = window_assemble(run, words)
        words = run_reload(memory, run, run_clamped(run, first, last), words)
        expected = list(np.frombuffer(row[16 * c:16 * c + 16], '<u4').astype(int))
        assert words == expected, (row_start_mod16, hidden, c)
        for address, size in memory.reads:
            assert start <= address and address + size <= start + len(row), (row_start_mod16, hidden, c, address, size)
        # Only row-end runs off a 16-byte boundary reload element by element.
        assert run_clamped(run, first, last) == ((first or last) and row_start_mod16 != 0)


def test_replay_matches_the_device_code():
    """The replay's clamps and picks are the prelude's (a change there must change this file too)."""
    source = unaligned_bf16.PRELUDE
    for line in ('__ldg(aligned + ((first != 0 && off != 0u) ? 1 : 0))',
                 '__ldg(aligned + ((last != 0 || off == 0u) ? 0 : 1))',
                 'by8[i] = (off & 8u) ? window[i + 2] : window[i]',
                 'by4[i] = (off & 4u) ? by8[i + 1] : by8[i]',
                 'const unsigned shift = (off & 2u) * 8u;',
                 'words[k] = __funnelshift_r(by4[k], by4[k + 1], shift)',
                 'return (first != 0 || last != 0) && (static_cast<unsigned>(reinterpret_cast<unsigned long long>(run)) & 15u) != 0u;'):
        assert line in source, line
