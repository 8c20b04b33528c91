"""Time the tuning variants of benchmarks/tuning.py on the GPU, each checked against the reference.

    python benchmarks/tune.py BUILD_DIR/sm_90a [--out tune.jsonl]

Variants are launched straight from their manifest with the loader (no op in front), on the same inputs
as the shipped kernels' benchmarks: 8192 tokens, hidden 7168, E 256 / K 8.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.run import DTYPE_OF_SIZE, Timer, copy_bandwidth, nbytes
from tile_kernels_aot import reference
from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot.manifest import manifest_from_json

TOKENS = 8192


def transpose_inputs(p):
    x = torch.randn(TOKENS, 7168, device='cuda').to(DTYPE_OF_SIZE[p['elem_bytes']])
    out = torch.empty(7168, TOKENS, dtype=x.dtype, device='cuda')
    tensors = {'x': x.unsqueeze(0).view(torch.uint32), 'out': out.unsqueeze(0).view(torch.uint32)}
    return tensors, {}, lambda: torch.equal(out.view(torch.uint8), x.t().contiguous().view(torch.uint8)), nbytes(x, out)


def cast_inputs(p):
    """e4m3 with 128 or e2m1 with 32 channels per scale factor, row-major float32 scale factors; the unaligned
    kernels read rows one element off 16-byte boundaries, as in benchmarks/run.py."""
    from tile_kernels_aot.quant._common import magic as _magic

    extra = 0 if p['aligned'] else 1
    x = torch.randn(TOKENS, 7168 + extra, device='cuda').to(getattr(torch, p['in_dtype']))[:, extra:]
    npc = 128 if p['fmt'] == 'e4m3' else 32
    out = torch.empty(TOKENS, 7168 // 2 if p['fmt'] == 'e2m1' else 7168, dtype=torch.int8 if p['fmt'] == 'e2m1' else torch.float8_e4m3fn, device='cuda')
    sf = torch.empty(TOKENS, 7168 // npc, device='cuda')
    vectors_per_row = 7168 * x.element_size() // p['vec_bytes']
    magic, shift = _magic(vectors_per_row)
    scalars = dict(vectors_per_row=vectors_per_row, row_magic=magic, row_shift=shift, npc_log2=npc.bit_length() - 1, round_sf=0, mode=0)

    def ok():
        ref, ref_sf = reference.cast(x, p['fmt'], (1, npc))
        return torch.equal(out.view(torch.uint8), ref.view(torch.uint8)) and torch.equal(sf, ref_sf)
    return {'x': x, 'out': out, 'out_sf': sf}, scalars, ok, nbytes(x, out, sf)


def topk_inputs(p):
    scores = torch.randn(TOKENS, p['num_experts'], device='cuda')
    idx = torch.empty(TOKENS, p['num_topk'], dtype=torch.int64, device='cuda')
    return {'scores': scores, 'topk_idx': idx}, {}, lambda: torch.equal(idx, reference.stable_topk(scores, p['num_topk'])), nbytes(scores, idx)


def reduce_inputs(p):
    """bf16 H 7168, 8192 tokens routed to 8 of 256 experts, segments aligned to 128, with weights."""
    import tile_kernels_aot

    idx = torch.rand(TOKENS, 256, device='cuda').topk(8, dim=-1).indices
    _, _, _, t2p, *_ = tile_kernels_aot.moe.get_fused_mapping(idx, 256, 0, 128)
    x = torch.randn(int(t2p.max()) + 1, 7168, device='cuda').bfloat16()
    weights = torch.rand(TOKENS, 8, device='cuda')
    out = torch.empty(TOKENS, 7168, dtype=torch.bfloat16, device='cuda')
    dummy = torch.ones(1, device='cuda')
    tensors = {'x': x, 'x_sf': dummy, 'topk_weights': weights, 'token_topk_to_pos': t2p, 'sf': dummy, 'out': out}
    ok = lambda: torch.equal(out, reference.reduce_fused(x, weights, t2p))  # noqa: E731
    return tensors, dict(with_weights=1, with_x_sf=0, with_sf=0), ok, nbytes(weights, t2p, out) + TOKENS * 8 * 7168 * 2


def cast_back_inputs(p):
    """upstream's case: e4m3 with 128 channels per packed UE8M0 scale factor, back to bf16, H 7168."""
    import tile_kernels_aot
    from tile_kernels_aot.quant._common import magic as _magic, packed_sf_bytes

    data, sf = tile_kernels_aot.quant.per_token_cast(torch.randn(TOKENS, 7168, device='cuda').bfloat16(), 'e4m3', 128,
                                                     use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    out = torch.empty(TOKENS, 7168, dtype=torch.bfloat16, device='cuda')
    row_magic, row_shift = _magic(7168 // 16)
    block_magic, block_shift = _magic(128 // 16)
    scalars = dict(vectors_per_row=7168 // 16, row_magic=row_magic, row_shift=row_shift, block_magic=block_magic, block_shift=block_shift,
                   sf_row_shift=0)
    ok = lambda: torch.equal(out, tile_kernels_aot.quant.cast_back((data, sf), 'bf16', (1, 128)))  # noqa: E731
    return {'x': data, 'x_sf': packed_sf_bytes(sf), 'out': out}, scalars, ok, nbytes(data, sf, out)


def per_channel_inputs(p):
    """benchmarks/run.py's cases (H 7168): bf16 (upstream's case), or e4m3 with (1, 128) scale factors and a gather
    of every row in random order, every 5th -1."""
    x = torch.randn(TOKENS, 7168, device='cuda')
    tensors, in_sf, pos = {}, None, None
    if p['in_dtype'] == 'float8_e4m3fn':
        x, in_sf = reference.cast(x.bfloat16(), 'e4m3', (1, 128))
        tensors['x_sf'] = in_sf
    else:
        x = x.to(getattr(torch, p['in_dtype']))
    if p['gather']:
        pos = torch.randint(0, TOKENS, (TOKENS,), dtype=torch.int32, device='cuda')
        pos[::5] = -1
        tensors['pos_to_token'] = pos
    out = torch.empty(TOKENS, 7168, dtype=torch.float8_e4m3fn, device='cuda')
    out_sf = torch.empty(TOKENS // 128, 7168, device='cuda')
    tensors.update(x=x, out=out, out_sf=out_sf)

    def ok():
        ref, ref_sf = reference.per_channel_cast_fused(x if in_sf is None else (x, in_sf), 128, None if in_sf is None else 128, False, pos)
        return torch.equal(out.view(torch.uint8), ref.view(torch.uint8)) and torch.equal(out_sf, ref_sf)
    return tensors, dict(round_sf=0), ok, nbytes(*tensors.values())


INPUTS = {'tune.transpose': transpose_inputs, 'tune.per_token_cast': cast_inputs, 'tune.topk_gate': topk_inputs, 'tune.reduce_fused': reduce_inputs,
          'tune.cast_back': cast_back_inputs, 'tune.per_channel_cast_fused': per_channel_inputs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('kernel_dir', type=Path)
    parser.add_argument('--out', default=None)
    args = parser.parse_args()
    manifest = manifest_from_json((args.kernel_dir / 'manifest.json').read_text())
    timer = Timer()
    copy_gbs = copy_bandwidth(timer)
    print(f'# copy bandwidth {copy_gbs:.0f} GB/s')
    rows = []
    for name, info in sorted(manifest.kernels.items()):
        for key, entry in sorted(info.entries.items()):
            kernel = LoadedKernel(entry, args.kernel_dir)
            tensors, scalars, ok, moved = INPUTS[name](entry.params)
            run = lambda: kernel(0, tensors, scalars)  # noqa: E731
            run()
            torch.cuda.synchronize()
            correct = bool(ok())
            us = timer.device_us(run)
            rows.append({'kernel': name, 'spec': key, 'us': us, 'gbs': moved / us / 1e3, 'of_copy': moved / us / 1e3 / copy_gbs, 'correct': correct})
            print(f'{name:20s} {key:95s} {us:8.1f} us {100 * moved / us / 1e3 / copy_gbs:5.1f}% {"ok" if correct else "WRONG"}', flush=True)
    if args.out:
        Path(args.out).write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return 0 if all(r['correct'] for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
