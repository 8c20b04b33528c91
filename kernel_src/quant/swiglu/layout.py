"""Where the SwiGLU forward + per-token cast finds its elements: the step a thread computes, the vectors it holds,
and how the persistent grid deals steps out to its CTAs.

Flat kernel: the 128-wide blocks (BLOCK) of all rows form one sequence. A block is LANES (8) adjacent lanes, lane i
holding vectors i, i + 8, ... of the block (FWD_ELEMENTS = 16 elements of each half: 2 bf16 or 4 fp32 16-byte
vectors), so that one row lookup, one butterfly and one scale serve 16 elements a thread and each load instruction
reads whole 128-byte runs. per_row: the same step with the row as its block, 2^tpr_log2 adjacent lanes (a run-time
size, up to the CTA) of 16 elements each; the op takes the smallest 2^tpr_log2 whose lanes cover the row.
"""

import dataclasses

from tilelang import language as T

from kernel_src.quant.common import IN_DTYPES
from kernel_src.quant.swiglu.silu_table import TABLE_THREADS

FWD_THREADS = 256
FWD_ELEMENTS = 16  # elements of each half per thread and step
BLOCK = 128  # channels per scale factor of the flat kernel
LANES = BLOCK // FWD_ELEMENTS  # adjacent lanes of a flat block
LANES_LOG2 = LANES.bit_length() - 1
# How the persistent kernels deal a step's work out: the per-row kernels give row k of a step to CTA k mod num_ctas,
# and the bf16 flat kernel run k of DEAL_WARPS warps' blocks (16 blocks, one row of 2048), which spreads each step
# over every SM. The fp32 flat kernel (3 CTAs of 256 an SM) is faster with each CTA taking the step's adjacent blocks.
DEAL_WARPS = 4
# CTAs per SM the flat kernels' register allocation must allow (the op asks the driver how many fit and makes its
# persistent grid that many per SM): bf16 fits 64 registers; fp32 holds twice the loaded bytes and needs 80, at which
# SM100's ptxas spills, so it gets 2 CTAs of 256 there.
FWD_MIN_BLOCKS = {'bfloat16': 4, 'float32': 3}
FWD_MIN_BLOCKS_BY_FAMILY = {('sm_100', 'float32'): 2}
# per_row CTA sizes, rows of up to 16 * row_threads. bf16 runs the silu-table kernel (1024 threads, 64 registers).
# fp32 ships 256 threads at the flat fp32 kernel's 80 registers, and 512, which needs about 120 registers, so one CTA
# an SM; 1024 threads would have to fit 64 registers and spill.
ROW_THREADS = {'bfloat16': (TABLE_THREADS,), 'float32': (256, 512)}


@dataclasses.dataclass(frozen=True)
class ForwardLayout:
    """The compile-time shape of a forward kernel's step, and `hidden`, the run-time width of a half."""

    in_dtype: str
    per_row: bool
    threads: int
    hidden: object  # T.dynamic('hidden')

    @property
    def epv(self) -> int:
        """Elements per 16-byte vector."""
        return 16 // IN_DTYPES[self.in_dtype]

    @property
    def num_vectors(self) -> int:
        """Vectors of each half a thread holds in a step."""
        return FWD_ELEMENTS // self.epv

    @property
    def words(self) -> bool:
        """bf16 handled as 32-bit words (swiglu_words.cuh), silu from the shared table (silu_table), and the next
        step staged in shared memory (swiglu_stage.cuh)."""
        return self.in_dtype == 'bfloat16'

    @property
    def num_warps(self) -> int:
        return self.threads // 32

    @property
    def blocks_per_step(self) -> int:
        """Flat blocks a CTA computes in a step."""
        return self.threads // LANES

    @property
    def deal_blocks(self) -> int:
        """Flat: the adjacent blocks of one CTA in a step (a run of DEAL_WARPS warps' blocks for bf16)."""
        return DEAL_WARPS * 32 // LANES if self.words else self.blocks_per_step


class FormedRowVectors:
    """row_vectors[j] of the per-row forward written out as j * 2^tpr_log2 + lane at each use (the fp32 kernels; the
    staged bf16 kernel keeps them in registers)."""

    def __init__(self, lane, tpr_log2):
        self.lane, self.tpr_log2 = lane, tpr_log2

    def __getitem__(self, j):
        return (j << self.tpr_log2) + self.lane


def vector_in_row(layout, j, row_vectors):
    """per_row: whether the lane's vector j lies inside the row. The lanes cover the row with 2^tpr_log2 > hidden / 32
    (hidden >= 128, tpr_log2 >= 3), so a lane's first half of vectors, columns below 8 * 2^tpr_log2 < hidden, is always
    inside and only the second half is tested (with j an unrolled loop variable nvcc folds the rest away)."""
    return T.Or(j < layout.num_vectors // 2, row_vectors[j] * layout.epv < layout.hidden)


def in_step(layout, j, row_vectors):
    """Whether vector j of the lane holds the step's elements: per_row, vector_in_row; flat, always (a Python True,
    so no test is emitted)."""
    return vector_in_row(layout, j, row_vectors) if layout.per_row else True


def vector_col(layout, j, block, lane, row_vectors):
    """The first column of vector j of the lane's step: flat, in block `block` (vector j of lane i at j * LANES + i);
    per_row, in the row (row_vectors[j]). An expression written out at each use: bound to a name it becomes a let
    that tilelang's vectoriser does not see through, and every access is split into single elements."""
    if layout.per_row:
        return row_vectors[j] * layout.epv
    return block * BLOCK + (j * LANES + lane) * layout.epv


def flat_block(layout, step, pid, tid, num_ctas):
    """The flat kernel's block index of thread tid of CTA pid in step `step`."""
    deal = layout.deal_blocks
    return ((step * (layout.blocks_per_step // deal) + (tid >> LANES_LOG2) // deal) * num_ctas + pid) * deal + (
        (tid >> LANES_LOG2) % deal)


def row_of_step(layout, step, pid, tid, num_ctas, tpr_log2):
    """The per-row kernel's row of thread tid of CTA pid in step `step`: threads >> tpr_log2 rows a CTA and step,
    dealt out across the CTAs (row r of a step's rows to CTA r mod num_ctas)."""
    return (step * (layout.threads >> tpr_log2) + (tid >> tpr_log2)) * num_ctas + pid

