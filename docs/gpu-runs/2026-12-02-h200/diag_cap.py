"""Time a kernel's benchmark cases with its persistent grid capped at k CTAs an SM: diag_cap.py KERNEL CAP...
(run 2: quant.per_token_requant 1 2 3 4 6 8 10 12 16; run 6: the per-channel SwiGLU cast 1 2 3 4)."""
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
name, caps = sys.argv[1], [int(c) for c in sys.argv[2:]]
for spec in prebuilt_specs(name):
    for label, fn, nb in cases_of(CASES[name], spec, 8192)[:2]:
        k = find_kernel(name, spec, 0)
        row = []
        for c in (None, *caps):
            cap[0] = c
            row.append(f'{c}:{timer.device_us(fn):.1f}')
        print(spec, label, 'real', real(k, 0), k.entry.launches[0].dynamic_smem, ' '.join(row), flush=True)
