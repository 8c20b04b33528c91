import time, torch
t0 = time.time()
def p(*a): print(f'{time.time() - t0:7.2f}s', *a, flush=True)
p('start', torch.cuda.get_device_name(0))
x = (torch.randn(8192, 4096, device='cuda') * 3).bfloat16(); torch.cuda.synchronize(); p('randn')
for i in range(3):
    y = x.float().sum(); torch.cuda.synchronize(); p('sum', i)
import tile_kernels_aot; p('import')
for vb in (32, 16):
    xx = torch.empty(x.numel() + 8, dtype=x.dtype, device='cuda')[(0 if vb == 32 else 8):][:x.numel()].view(x.shape).copy_(x)
    for i in range(3):
        out = tile_kernels_aot.quant.swiglu_forward_and_per_channel_cast_and_transpose(xx, 'e4m3', 128, True, False, 10.0); torch.cuda.synchronize(); p('op', vb, i)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for i in range(100):
        tile_kernels_aot.quant.swiglu_forward_and_per_channel_cast_and_transpose(xx, 'e4m3', 128, True, False, 10.0)
    e.record(); torch.cuda.synchronize(); p('100 ops', vb, s.elapsed_time(e) * 10, 'us each')
f = torch.zeros(64 * 2**20, dtype=torch.int32, device='cuda')
for i in range(3):
    f.max(); torch.cuda.synchronize(); p('flush', i)
for i in range(3):
    torch.cuda._sleep(1_000_000); torch.cuda.synchronize(); p('sleep', i)
