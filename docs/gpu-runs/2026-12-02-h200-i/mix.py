"""Bandwidth of torch ops whose bytes mix reads and writes as per_token_requant e4m3 -> e2m1 does (two bytes read for
one written), against a copy, at that kernel's size (88 MB) and at the ceiling copy's (235 MB)."""
import torch

from benchmarks.run import Timer

timer = Timer()
for total_mb in (88, 235):
    n = total_mb * 2**20 // 12 * 4
    a = torch.randint(-100, 100, (n,), dtype=torch.int8, device='cuda')
    b = torch.randint(-100, 100, (n,), dtype=torch.int8, device='cuda')
    c = torch.empty_like(a)
    src = torch.empty(3 * n // 2, dtype=torch.int8, device='cuda')
    dst = torch.empty_like(src)
    add = timer.device_us(lambda: torch.add(a, b, out=c))  # noqa: B023 (called at once)
    copy = timer.device_us(lambda: dst.copy_(src))  # noqa: B023
    read = timer.device_us(lambda: torch.sum(a.view(torch.int32), dtype=torch.int32))  # noqa: B023
    print(f'{3 * n / 1e6:.0f} MB: add (2 read : 1 written) {3 * n / add / 1e3:.0f} GB/s ({add:.2f} us); '
          f'copy {3 * n / copy / 1e3:.0f} GB/s ({copy:.2f} us); read-only sum of a {n / read / 1e3:.0f} GB/s ({read:.2f} us)')
