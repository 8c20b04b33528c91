"""The flat bf16 SwiGLU forward's silu table (kernel_src/cuda/swiglu_silu_table.cuh).

The table holds silu(min.NaN(g, c)) for every bf16 gate g whose magnitude lies in [2^TABLE_LOW_EXP, 2^TABLE_HIGH_EXP).
Each CTA builds it at its start (build_silu_table) with the exact path's expression (the same expf; the division by
tk_div_rn_fast where its range test passes, where it is correctly rounded, else `/`), so a lookup returns the bits
that path computes. A step whose gates all lie in the window (tk_gate_bits_in_table; else the step takes the exact
path) then spends two integer instructions and one LDS on each gate's silu instead of the clamp, the exponential and
the division. act = silu * clamped up * weight, in the exact path's order, so results do not change.

Every CTA builds the whole table, so the kernel runs one CTA of TABLE_THREADS threads an SM, each thread building
2 * TABLE_PER_SIGN / TABLE_THREADS entries.
"""

from tilelang import language as T

from kernel_src.quant.swiglu.common import clamp_gate, clamp_up, silu, track_division_range, unsigned_literal

TABLE_THREADS = 1024
TABLE_LOW_EXP, TABLE_HIGH_EXP = -16, 4  # the window of gate magnitudes the table holds: [2^-16, 2^4)
TABLE_LOW_BITS = (127 + TABLE_LOW_EXP) << 7
TABLE_HIGH_BITS = (127 + TABLE_HIGH_EXP) << 7
TABLE_PER_SIGN = TABLE_HIGH_BITS - TABLE_LOW_BITS  # 2560 gates of each sign
# Positive gates at float index bits - TABLE_LOW_BITS, negative ones TABLE_SIGN_WORDS further on: bit 15 of a byte
# offset, the gate's own sign bit (see the header).
TABLE_SIGN_WORDS = 1 << 13
TABLE_WORDS = TABLE_SIGN_WORDS + TABLE_PER_SIGN  # 42 KB of shared memory (the 22 KB between the signs unused)
assert 4 * TABLE_PER_SIGN <= 1 << 14 and 2 * TABLE_PER_SIGN % TABLE_THREADS == 0  # offsets below bit 14; whole entries a thread
TABLE_ENTRIES_PER_THREAD = 2 * TABLE_PER_SIGN // TABLE_THREADS

TABLE_DEFINES = {
    'TK_TABLE_LOW_BITS': unsigned_literal(TABLE_LOW_BITS),
    'TK_TABLE_HIGH_BITS': unsigned_literal(TABLE_HIGH_BITS),
    'TK_TABLE_MINUS_LOW_OFFSETS': unsigned_literal(-4 * TABLE_LOW_BITS * 0x10001 % 2**32),
}


def table_entry_bits(entry, negative):
    """The bf16 bits of the gate of table entry `entry` (0 .. 2 * TABLE_PER_SIGN - 1; negative: entry >= TABLE_PER_SIGN)."""
    return negative * 0x8000 + TABLE_LOW_BITS + entry - negative * TABLE_PER_SIGN


def table_entry_slot(entry, negative):
    """The float index in the table of entry `entry`."""
    return negative * TABLE_SIGN_WORDS + entry - negative * TABLE_PER_SIGN


@T.macro
def build_silu_table(silu_table, table_gates, table_silu, div_range_build, clamp_c, tid):
    """The table, TABLE_ENTRIES_PER_THREAD entries a thread (entry k * TABLE_THREADS + tid), with the branch-free
    division where all of the thread's clamped gates pass its range test (the exact path's results there; with
    c >= 2^-64, always), else with `/`, the exact path's own expression."""
    div_range_build[0] = T.float32(0)
    div_range_build[1] = T.float32(float('inf'))
    for k in T.unroll(TABLE_ENTRIES_PER_THREAD):
        entry = k * TABLE_THREADS + tid
        negative = T.Cast(T.int32, entry >= TABLE_PER_SIGN)
        table_gates[k] = clamp_gate(T.call_extern('float32', 'tk_bf16_bits_to_float', table_entry_bits(entry, negative)), clamp_c)
        track_division_range(div_range_build, table_gates[k])
        table_silu[k] = T.call_extern('float32', 'tk_div_rn_fast', table_gates[k], T.float32(1) + T.exp(-table_gates[k]))
    if T.call_extern('int32', 'tk_div_fast_in_range', div_range_build[0], div_range_build[1]) == 0:
        for k in T.unroll(TABLE_ENTRIES_PER_THREAD):
            table_silu[k] = silu(table_gates[k])
    for k in T.unroll(TABLE_ENTRIES_PER_THREAD):
        entry = k * TABLE_THREADS + tid
        negative = T.Cast(T.int32, entry >= TABLE_PER_SIGN)
        silu_table[table_entry_slot(entry, negative)] = table_silu[k]


@T.macro
def table_step(layout, gate, up, act, up_wide, silu_table, step_weight, clamp_c, clamp):
    """act of the step from the table: silu * up * weight, with up clamped to [-c, c] where `clamp` (a compile-time
    flag: False only where tk_up_clamp_is_identity passed)."""
    for j in T.unroll(layout.num_vectors):
        T.evaluate(T.call_extern('void', 'tk_silu_lookup_bf16x8', T.address_of(gate[j, 0]),
                                 T.address_of(silu_table[0]), T.address_of(act[j, 0])))
        T.evaluate(T.call_extern('void', 'tk_widen_bf16x8', T.address_of(up[j, 0]), T.address_of(up_wide[0])))
        for e in T.unroll(layout.epv):
            if clamp:
                r = clamp_up(up_wide[e], clamp_c)
                act[j, e] = act[j, e] * r * step_weight[0]
            else:
                act[j, e] = act[j, e] * up_wide[e] * step_weight[0]
