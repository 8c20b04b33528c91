"""Copy bandwidth against the bytes moved, with benchmarks/run.py's Timer (L2 flushed by reading, GPU kept busy)."""
import sys
sys.path.insert(0, 'benchmarks')
import torch
import importlib.util
spec = importlib.util.spec_from_file_location('bt', 'benchmarks/run.py')
# run.py imports tile_kernels_aot at the top: take the Timer class's source instead
src = open('benchmarks/run.py').read()
start = src.index('class Timer:')
end = src.index('def copy_bandwidth')
ns = {'torch': torch, 'statistics': __import__('statistics'), 'time': __import__('time'), 'ITERS': 30}
exec(src[start:end], ns)
Timer = ns['Timer']
t = Timer()
print(torch.cuda.get_device_name(0), torch.__version__)
for rep in range(2):
    for moved_mb in [16, 24, 32, 40, 48, 58.7, 64, 72, 84, 88, 96, 104, 128, 160, 200, 235, 470]:
        n = int(moved_mb * 2**20 / 2 / 2)  # bf16 elements: moved = 2 * n * 2 bytes
        n = (n // 7168) * 7168
        a = torch.randn(n // 7168, 7168, device='cuda').bfloat16()
        c = torch.empty_like(a)
        us = t.device_us(lambda: c.copy_(a), iters=50)
        # also a copy through int32 views via a custom-size tensor: same thing
        print(f'rep {rep} moved {2 * n * 2 / 1e6:8.1f} MB  {us:8.2f} us  {2 * n * 2 / us / 1e3:7.0f} GB/s', flush=True)
        del a, c
        torch.cuda.empty_cache()
