"""per_block_cast's e2m1 loads (kernel_src.quant.per_block_cast load_clamped): each thread reads its vectors from a
row clamped to num_tokens - 1 and a column clamped to hidden - vector, with no bounds branch. Over the thread
layout of every block shape and vector width, for partial row and column blocks:

* every clamped read lies inside x;
* a read stays in the thread's own scale-factor block whenever that block has a column inside x (so the block
  amax only sees the block's own elements);
* the reads of each such block cover every element of the block that lies inside x (so nothing is missed),
  which makes the amax the masked loads' amax: re-reads and zeros cannot change a max of magnitudes.
"""

import numpy as np
import pytest

from kernel_src.quant import per_block_cast as pbc

BLOCKS = [(128, 128), (32, 32), (128, 32), (32, 128)]
VECTORS = [(16, 8), (16, 4), (32, 16), (32, 8)]  # (vec_bytes, elements per vector): bfloat16, float32 of each width
SHAPES = [(1, 16), (33, 48), (127, 576), (128, 256), (200, 1040), (97, 7168 + 16)]


def _reads(block_m, block_k, vec_bytes, epv, num_tokens, hidden):
    """(thread row, thread col, read row, read col) of every vector of every thread of every CTA."""
    tile = pbc.TileShape.for_block(block_m, block_k // epv, vec_bytes)
    cols = tile.lanes * epv
    tid = np.arange(pbc.NUM_THREADS)
    bx = np.arange(-(-num_tokens // block_m))
    by = np.arange(-(-hidden // cols))
    rows = np.stack([tile.row(tid, j) for j in range(tile.vectors)])  # (vectors, threads)
    row = bx[:, None, None, None] * block_m + rows[None, None]
    col = by[None, :, None, None] * cols + (tile.lane_col(tid) * epv)[None, None, None]
    row, col = np.broadcast_arrays(row, col)
    read_row = np.minimum(row, num_tokens - 1)
    read_col = np.minimum(col, hidden - epv)
    return row.ravel(), col.ravel(), read_row.ravel(), read_col.ravel()


@pytest.mark.parametrize('block', BLOCKS)
@pytest.mark.parametrize('vector', VECTORS)
@pytest.mark.parametrize('shape', SHAPES)
def test_clamped_reads_stay_in_their_block_and_cover_it(block, vector, shape):
    block_m, block_k = block
    vec_bytes, epv = vector
    num_tokens, hidden = shape
    row, col, read_row, read_col = _reads(block_m, block_k, vec_bytes, epv, num_tokens, hidden)
    assert (read_row >= 0).all() and (read_row < num_tokens).all()
    assert (read_col >= 0).all() and (read_col + epv <= hidden).all() and (read_col % epv == 0).all()
    live = (col // block_k) * block_k < hidden  # the thread's block has a column inside x
    assert (read_row[live] // block_m == row[live] // block_m).all()
    assert (read_col[live] // block_k == col[live] // block_k).all()
    # Coverage: every element of x is read by some thread of its own block.
    covered = np.zeros((num_tokens, hidden), dtype=bool)
    for e in range(epv):
        covered[read_row[live], read_col[live] + e] = True
    assert covered.all()
