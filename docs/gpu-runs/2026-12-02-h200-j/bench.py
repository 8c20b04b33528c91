"""A/B on the GPU: the op's kernel (A) against requant_pipe cubins (B), launched with A's own argument block plus
num_units. Bitwise check against A, then alternating timings with benchmarks.run's Timer. Usage:
python exp/pipe/bench.py CUBIN_DIR [ROUNDS]"""
import ctypes
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

import tile_kernels_aot
from benchmarks.run import Timer, copy_bandwidth, nbytes
from tile_kernels_aot import _driver

cubin_dir = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
drv = _driver.driver()
torch.zeros(1, device='cuda')
sms = torch.cuda.get_device_properties(0).multi_processor_count
original_launch = _driver.Driver.launch
use = {'b': None}


def launch(self, fn, grid, block, smem, stream, params):
    b = use['b']
    if b is None:
        return original_launch(self, fn, grid, block, smem, stream, params)
    kfn, ctas, units, threads = b
    arr = (ctypes.c_void_p * (len(params) + 1))(*params, ctypes.addressof(units))
    return original_launch(self, kfn, (min(units.value, sms * ctas), 1, 1), (threads, 1, 1), 0, stream, arr)


_driver.Driver.launch = launch
functions = {}
for path in sorted(cubin_dir.glob('*.cubin')):
    module = drv.load_module(path.read_bytes())
    fn = drv.get_function(module, 'requant_pipe')
    sf, sc = path.stem.rsplit('-', 1)
    stages, ctas = (int(v) for v in sc[1:].split('c'))
    threads = 128 if sc[0] == 'e' else 160
    occ = drv.max_active_blocks(fn, threads, 0)
    print(f'{path.stem}: {occ} CTAs an SM possible', flush=True)
    functions.setdefault(sf, []).append((path.stem, fn, min(ctas, occ), threads))

timer = Timer()
copy = copy_bandwidth(timer)
print(f'copy {copy:.0f} GB/s', flush=True)
tokens, hidden = 8192, 7168
x = torch.randn(tokens, hidden, device='cuda', dtype=torch.bfloat16)
results = {}
for sf_name, packed, round_sf in (('insff32-sff32', False, False), ('insff32-sff32', False, True), ('insfue8m0-sfue8m0', True, True)):
    flags = {'use_tma_aligned_col_major_sf': packed, 'round_sf': round_sf, 'use_packed_ue8m0': packed}
    q = tile_kernels_aot.quant.per_block_cast(x, 'e4m3', (128, 128), **flags)
    fn = partial(tile_kernels_aot.quant.per_token_cast, q, 'e2m1', 32, x_block_size=(128, 128), **flags)
    use['b'] = None
    ref = [t.clone() for t in fn()]
    moved = nbytes(*q, *ref)
    units = ctypes.c_int(-(-tokens * (hidden // 32) // 256))
    variants = [('A', None)] + [(name, (kfn, ctas, units, threads)) for name, kfn, ctas, threads in functions.get(sf_name, [])]
    label = f'{sf_name} round_sf={round_sf}'
    for name, b in variants:
        use['b'] = b
        got = fn()
        torch.cuda.synchronize()
        bits = lambda t: t.view(torch.int32) if t.dtype == torch.float32 else t  # (NaN-safe: a same-size view)
        same = all(torch.equal(bits(g), bits(r)) for g, r in zip(got, ref))
        print(f'{label} {name}: bitwise {"same" if same else "DIFFERENT"}', flush=True)
    for r in range(rounds):
        for name, b in variants:
            use['b'] = b
            results.setdefault((label, name), []).append(timer.device_us(fn))
    use['b'] = None
    for name, _ in variants:
        ts = results[(label, name)]
        med = statistics.median(ts)
        print(f'{label} {name}: {med:6.2f} us  {moved / med / 1e3 / copy * 100:5.1f}% of copy  runs {" ".join(f"{t:.2f}" for t in ts)}', flush=True)
