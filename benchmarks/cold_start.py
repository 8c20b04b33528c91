"""Cold start of a fresh process: `import tile_kernels_aot` plus the first call of each headline op.

    python benchmarks/cold_start.py            # prints one JSON line

Torch is imported and CUDA initialised (inputs allocated) before the clock starts, so the figure is
what tile-kernels-aot adds on top of `import torch`: finding the arch package, reading the manifest,
verifying and loading three cubins, and launching them.
"""

import json
import time

import torch

scores = torch.randn(8192, 256, device='cuda')
x_t = torch.randn(8192, 7168, device='cuda').bfloat16()
x_q = torch.randn(8192, 7168, device='cuda').bfloat16()
torch.cuda.synchronize()

t0 = time.perf_counter()
import tile_kernels_aot  # noqa: E402

t_import = time.perf_counter()
tile_kernels_aot.moe.topk_gate(scores, 8)
torch.cuda.synchronize()
t_topk = time.perf_counter()
tile_kernels_aot.transpose.transpose(x_t)
torch.cuda.synchronize()
t_transpose = time.perf_counter()
tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128)
torch.cuda.synchronize()
t_cast = time.perf_counter()
# A second call of each: what steady state costs, for contrast.
tile_kernels_aot.moe.topk_gate(scores, 8)
tile_kernels_aot.transpose.transpose(x_t)
tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128)
torch.cuda.synchronize()
t_again = time.perf_counter()

print(json.dumps({
    'import_ms': (t_import - t0) * 1e3,
    'first_topk_gate_ms': (t_topk - t_import) * 1e3,
    'first_transpose_ms': (t_transpose - t_topk) * 1e3,
    'first_per_token_cast_ms': (t_cast - t_transpose) * 1e3,
    'total_ms': (t_cast - t0) * 1e3,
    'second_calls_ms': (t_again - t_cast) * 1e3,
}))
