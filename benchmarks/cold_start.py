"""Cold start of a fresh process: the import plus the first call of headline ops, one JSON line.

    python benchmarks/cold_start.py [ops | mhc | mhc-upstream]

Torch is imported and CUDA initialised (inputs allocated) before the clock starts, so the figures are what
the kernel library adds on top of `import torch`: for tile-kernels-aot, finding the arch package, reading the
manifest, verifying and loading the cubins, and launching them; for upstream TileKernels (`mhc-upstream`, run
with upstream on PYTHONPATH and an empty TILELANG_CACHE_DIR), its JIT compiles.

  ops           topk_gate, transpose and per_token_cast (8192 tokens)
  mhc           mhc_pre of one DeepSeek-V4-Flash sublayer (8192 tokens, hidden 4096, four streams), grad off
                (the fused kernel), then grad on, with mhc_post and the backward of both
  mhc-upstream  the same through upstream's tile_kernels.modeling.mhc
"""

import json
import sys
import time

import torch

WHAT = sys.argv[1] if len(sys.argv) > 1 else 'ops'
if WHAT not in ('ops', 'mhc', 'mhc-upstream'):
    sys.exit(f'cold_start.py: unknown case {WHAT!r}; one of ops, mhc, mhc-upstream')


def elapsed_ms(start: float) -> float:
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def ops() -> dict:
    scores = torch.randn(8192, 256, device='cuda')
    x_t = torch.randn(8192, 7168, device='cuda').bfloat16()
    x_q = torch.randn(8192, 7168, device='cuda').bfloat16()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import tile_kernels_aot

    row = {'import_ms': elapsed_ms(t0)}
    for name, call in (('first_topk_gate_ms', lambda: tile_kernels_aot.moe.topk_gate(scores, 8)),
                       ('first_transpose_ms', lambda: tile_kernels_aot.transpose.transpose(x_t)),
                       ('first_per_token_cast_ms', lambda: tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128))):
        start = time.perf_counter()
        call()
        row[name] = elapsed_ms(start)
    row['total_ms'] = elapsed_ms(t0)
    start = time.perf_counter()  # a second call of each: what steady state costs, for contrast
    tile_kernels_aot.moe.topk_gate(scores, 8)
    tile_kernels_aot.transpose.transpose(x_t)
    tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128)
    row['second_calls_ms'] = elapsed_ms(start)
    return row


def mhc(module: str) -> dict:
    mhc_mult, hidden, rows = 4, 4096, 24
    residual = torch.randn(1, 8192, mhc_mult, hidden, device='cuda').bfloat16()
    fn = torch.randn(rows, mhc_mult * hidden, device='cuda') * hidden**-0.5
    scale, base = torch.ones(3, device='cuda'), torch.zeros(rows, device='cuda')
    kwargs = dict(sinkhorn_repeat=20, sinkhorn_eps=1e-6, pre_eps=1e-6, norm_eps=1e-6)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if module == 'ours':
        from tile_kernels_aot.modeling.mhc import mhc_post, mhc_pre
    else:
        from tile_kernels.modeling.mhc import mhc_pre
        from tile_kernels.modeling.mhc.ops import mhc_post
    row = {'import_ms': elapsed_ms(t0)}
    start = time.perf_counter()
    with torch.no_grad():
        mhc_pre(residual, fn, scale, base, **kwargs)
    row['first_mhc_pre_no_grad_ms'] = elapsed_ms(start)
    row['import_and_first_call_ms'] = elapsed_ms(t0)
    start = time.perf_counter()
    leaf = residual.clone().requires_grad_()
    layer_input, (post, comb) = mhc_pre(leaf, fn.requires_grad_(), scale, base, **kwargs)
    # With its post step, as in a model: upstream's backward expects the gradient mhc_post leaves for the pre ops.
    mhc_post(layer_input, leaf, post, comb).float().sum().backward()
    row['first_mhc_pre_with_backward_ms'] = elapsed_ms(start)
    row['total_ms'] = elapsed_ms(t0)
    return row


row = ops() if WHAT == 'ops' else mhc('ours' if WHAT == 'mhc' else 'upstream')
print(json.dumps({'what': WHAT, **row}))
