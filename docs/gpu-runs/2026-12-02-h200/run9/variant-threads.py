"""Run 9's CTA-size variants of kernel_src/quant/per_token_requant.py (at 2f16af9): the untiled specs' CTAs of
`threads` threads (T256: 256, T64: 64), their MIN_BLOCKS scaled by 128 / threads; the tiled specs unchanged.
Usage: python variant-threads.py THREADS (edits the file in place; git checkout restores it)."""
import sys

threads = int(sys.argv[1])
path = 'kernel_src/quant/per_token_requant.py'
with open(path) as f:
    source = f.read()
source = source.replace('TILE_CHUNKS = NUM_THREADS // TILE_ROWS', 'TILE_CHUNKS = 128 // TILE_ROWS')
source = source.replace('    per_thread = CHUNKS_PER_THREAD.get(spec, 1)\n',
                        f'    per_thread = CHUNKS_PER_THREAD.get(spec, 1)\n    NUM_THREADS = 128 if tiled else {threads}\n')
source = source.replace('T.annotate_min_blocks_per_sm(MIN_BLOCKS_BY_TARGET.get((arch.target, *spec), MIN_BLOCKS[spec]))',
                        'T.annotate_min_blocks_per_sm(MIN_BLOCKS_BY_TARGET.get((arch.target, *spec), MIN_BLOCKS[spec]) * 128 // NUM_THREADS)')
with open(path, 'w') as f:
    f.write(source)
