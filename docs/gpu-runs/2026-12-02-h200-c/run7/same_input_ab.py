"""16- against 32-byte vectors on the SAME 32-byte aligned input (the op forced to the 16-byte spec by replacing its
spec function), interleaved, with benchmarks/run.py's Timer; outputs compared bit for bit."""
import json
import torch
import tile_kernels_aot
import tile_kernels_aot.quant.per_block as pb
import tile_kernels_aot.quant.per_token as pt
from benchmarks.run import Timer

timer = Timer()
print(torch.cuda.get_device_name(0), flush=True)
orig_pb, orig_pt = pb.per_block_cast_spec, pt.per_token_cast_spec


def forced(fn, vb):
    def f(*a, **k):
        s = fn(*a, **k)
        if s.get('aligned', True) and not s.get('per_row', False):
            s = dict(s, vec_bytes=vb)
        return s
    return f


cases = []
for dt in (torch.bfloat16, torch.float32):
    x = torch.randn(8192, 7168, device='cuda').to(dt)
    for fmt in ('e4m3', 'e2m1'):
        for packed in (False, True):
            flags = dict(use_tma_aligned_col_major_sf=packed, round_sf=packed, use_packed_ue8m0=packed)
            for block in ((128, 128), (32, 32)):
                cases.append((f'per_block_cast {dt} {fmt} {block} packed={packed}', 'pb', lambda x=x, fmt=fmt, block=block, flags=flags: tile_kernels_aot.quant.per_block_cast(x, fmt, block, **flags)))
            npc = 128 if fmt == 'e4m3' else 32
            cases.append((f'per_token_cast {dt} {fmt} {npc} packed={packed}', 'pt', lambda x=x, fmt=fmt, npc=npc, flags=flags: tile_kernels_aot.quant.per_token_cast(x, fmt, npc, **flags)))
for rnd in range(3):
    for name, which, fn in cases:
        res = {}
        outs = {}
        for vb in (16, 32):
            if which == 'pb':
                pb.per_block_cast_spec = forced(orig_pb, vb)
            else:
                pt.per_token_cast_spec = forced(orig_pt, vb)
            outs[vb] = [t.clone() for t in fn()]
            res[vb] = timer.device_us(fn)
        pb.per_block_cast_spec, pt.per_token_cast_spec = orig_pb, orig_pt
        same = all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) for a, b in zip(outs[16], outs[32]))
        print(json.dumps({'round': rnd, 'case': name, 'us16': round(res[16], 2), 'us32': round(res[32], 2), 'ratio': round(res[32] / res[16], 3), 'same': same}), flush=True)
