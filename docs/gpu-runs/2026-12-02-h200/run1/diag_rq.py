"""Persistent requant: time each case with the grid capped at k CTAs an SM (exp only)."""
import tile_kernels_aot
from benchmarks.run import Timer, cases_of, per_token_requant_case
from tile_kernels_aot import _launch
from tile_kernels_aot._select import prebuilt_specs

real = _launch.LoadedKernel.blocks_per_sm
cap = [None]
def capped(self, device):
    r = real(self, device)
    return r if cap[0] is None else min(r, cap[0])
_launch.LoadedKernel.blocks_per_sm = capped
timer = Timer()
for spec in prebuilt_specs('quant.per_token_requant'):
    for label, fn, nb in cases_of(per_token_requant_case, spec, 8192):
        k = tile_kernels_aot._select.find_kernel('quant.per_token_requant', spec, 0)
        row = []
        for c in (None, 1, 2, 3, 4, 6, 8, 10, 12, 16):
            cap[0] = c
            row.append(f'{c}:{timer.device_us(fn):.1f}')
        print(spec, label, 'real', real(k, 0), ' '.join(row), flush=True)
