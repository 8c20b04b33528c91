"""One-off: per_token_requant e4m3 (128, 128) -> e2m1 32 per sf with float32 scale factors that are not powers of
two (round_sf off on both sides), the float32 path of the kernel; timed as benchmarks.run times its cases."""
import torch

import tile_kernels_aot
from benchmarks.run import Timer, copy_bandwidth, nbytes

timer = Timer()
copy = copy_bandwidth(timer)
x = torch.randn(8192, 7168, device='cuda', dtype=torch.bfloat16)
q = tile_kernels_aot.quant.per_block_cast(x, 'e4m3', (128, 128))
fn = lambda: tile_kernels_aot.quant.per_token_cast(q, 'e2m1', 32, x_block_size=(128, 128))  # noqa: E731
out, sf = fn()
ref = tile_kernels_aot.reference.cast(q, 'e2m1', (1, 32), x_block_size=(128, 128))
same = torch.equal(out.view(torch.uint8), ref[0].view(torch.uint8)) and torch.equal(sf, ref[1])
moved = nbytes(*q, out, sf)
for _ in range(3):
    us = timer.device_us(fn)
    print(f'e4m3 (128,128) -> e2m1 32/sf, f32 sf, round_sf off: {us:.1f} us, {moved / us / 1e3 / copy * 100:.1f}% of copy ({copy:.0f} GB/s), same as reference: {same}')
