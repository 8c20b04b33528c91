"""get_fused_mapping's kernel time by grid size, the data behind the op's block-count rule.

    python -m benchmarks.fused_mapping_blocks [--blocks 8,16,...] [--tokens 128,8192,32768]

The kernel is launched through the loader exactly as the op launches it, except that the grid (the rows
of the block_counts scratch) is chosen here. Each grid's result is checked against the op's, which does
not depend on the grid. Times are per launch from torch.profiler (kernel only: no host sync, no
allocation), E 256, K 8, alignment 128, int64 indices.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.profile_kernels import kernel_times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--blocks', default='8,16,24,32,48,64,96,132')
    parser.add_argument('--tokens', default='128,8192,32768')
    args = parser.parse_args()
    import tile_kernels_aot
    from tile_kernels_aot._select import find_kernel

    experts, topk, alignment = 256, 8, 128
    kernel = find_kernel('moe.get_fused_mapping', {'index_dtype': 'int64'}, 0)
    blocks = [int(b) for b in args.blocks.split(',') if int(b) <= torch.cuda.get_device_properties(0).multi_processor_count]
    print('tokens', *blocks, sep='\t')
    ok = True
    for tokens in (int(t) for t in args.tokens.split(',')):
        idx = torch.rand(tokens, experts, device='cuda').topk(topk, dim=-1).indices
        expected = tile_kernels_aot.moe.get_fused_mapping(idx, experts, 0, alignment, force_no_sync=True)[:7]
        row = []
        for num_blocks in blocks:
            outs = [torch.empty_like(t) for t in expected]
            names = ('pos_to_expert', 'pos_to_token', 'pos_to_token_topk', 'token_topk_to_pos', 'expert_start', 'expert_end', 'num_tokens_per_expert')
            tensors = dict(zip(names, outs), topk_idx=idx, block_counts=torch.empty(num_blocks, experts, dtype=torch.int32, device='cuda'))
            launch = lambda: kernel(0, tensors, {'alignment': alignment})  # noqa: E731
            row.append(sum(t for _, t in kernel_times(launch, repeats=20)))
            same = all(torch.equal(a, b) for a, b in zip(outs, expected))
            ok &= same
            if not same:
                print(f'# {tokens} tokens, {num_blocks} blocks: result differs from the op', flush=True)
        print(tokens, *(f'{t:.1f}' for t in row), sep='\t', flush=True)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
