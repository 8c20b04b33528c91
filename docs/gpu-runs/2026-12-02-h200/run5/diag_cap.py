"""Time a kernel's benchmark cases with the persistent grid capped at k CTAs an SM (exp only): diag_cap.py KERNEL."""
import sys

from benchmarks.run import CASES, Timer, cases_of
from tile_kernels_aot import _launch
from tile_kernels_aot._select import find_kernel, prebuilt_specs

real = _launch.LoadedKernel.blocks_per_sm
cap = [None]
def capped(self, device):
    r = real(self, device)
    return r if cap[0] is None else min(r, cap[0])
_launch.LoadedKernel.blocks_per_sm = capped
timer = Timer()
name = sys.argv[1]
for spec in prebuilt_specs(name):
    for label, fn, nb in cases_of(CASES[name], spec, 8192)[:2]:
        k = find_kernel(name, spec, 0)
        row = []
        for c in (None, 1, 2, 3, 4):
            cap[0] = c
            row.append(f'{c}:{timer.device_us(fn):.1f}')
        print(spec, label, 'real', real(k, 0), k.entry.launches[0].dynamic_smem, ' '.join(row), flush=True)
