"""The per-channel SwiGLU cast: 16- against 32-byte vectors on the SAME 32-byte aligned input (the op forced to the
16-byte spec by replacing its spec function), interleaved, with benchmarks/run.py's Timer; outputs compared bit for
bit. Then both on a pointer 16 bytes off (the 16-byte kernel's own inputs) for reference."""
import json
import sys
import torch
import tile_kernels_aot
import tile_kernels_aot.quant.swiglu as sw
from benchmarks.run import Timer

timer = Timer()
print(torch.cuda.get_device_name(0), flush=True)
orig = sw.swiglu_forward_and_per_channel_cast_spec
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def forced(vb):
    return lambda *a, **k: dict(orig(*a, **k), vec_bytes=vb)


cases = []
for hidden in (2048, 7168):
    x = (torch.randn(8192, 2 * hidden, device='cuda') * 3).bfloat16()
    for without_transpose in (False, True):
        for npt in (128, 32):
            cases.append((f'H{hidden} npt{npt} {"untransposed" if without_transpose else "transposed"}', x, (npt, True, without_transpose, 10.0)))
for rnd in range(rounds):
    for name, x, args in cases:
        res, outs = {}, {}
        fn = lambda: tile_kernels_aot.quant.swiglu_forward_and_per_channel_cast_and_transpose(x, 'e4m3', *args)  # noqa: E731
        for vb in (16, 32):
            sw.swiglu_forward_and_per_channel_cast_spec = forced(vb)
            outs[vb] = [t.clone() for t in fn()]
            res[vb] = timer.device_us(fn)
        sw.swiglu_forward_and_per_channel_cast_spec = orig
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(outs[16], outs[32]))
        print(json.dumps({'round': rnd, 'case': name, 'us16': round(res[16], 2), 'us32': round(res[32], 2),
                          'ratio': round(res[32] / res[16], 3), 'same': same}), flush=True)
