"""Variants of the shipped kernels with their tuning knobs exposed as spec parameters.

Build them into their own folder and time them with benchmarks/tune.py; they never enter a wheel:

    python -m build_tools --arch sm90 --registry benchmarks.tuning --build-dir build-tune --no-wheels
"""

from kernel_src.decl import KernelDecl, param
from kernel_src.moe import reduce_fused, topk_gate
from kernel_src.quant import cast_back, per_channel_cast, per_token_cast
from kernel_src.transpose import batched_transpose

TRANSPOSE = KernelDecl(
    name='tune.transpose',
    params=batched_transpose.DECL.params + (param('max_warps', 'int', 'w'),),
    factory=batched_transpose.build,
    prebuilt=lambda: [
        dict(elem_bytes=eb, vec_bytes=v, tile_m=tm, tile_n=tn, max_warps=w)
        for eb, v in ((2, 16), (1, 8), (1, 16))
        for tm, tn, w in ((64, 64, 8), (64, 64, 1), (128, 128, 8), (128, 128, 2))
        if not batched_transpose.check_or_none(eb, v, tm, tn)
    ],
    check=lambda max_warps, **spec: batched_transpose.check(**spec),
    pass_configs=batched_transpose.DECL.pass_configs,
)

PER_TOKEN_CAST = KernelDecl(
    name='tune.per_token_cast',
    params=per_token_cast.DECL.params + (param('num_threads', 'int', 't'), param('num_vectors', 'int', 'n')),
    factory=per_token_cast.build,
    prebuilt=lambda: [
        dict(in_dtype=d, fmt=f, sf_format='f32', per_row=False, aligned=True, num_threads=t, num_vectors=n)
        for d in ('bfloat16', 'float32') for f in ('e4m3', 'e2m1')
        for t, n in ((128, 2), (128, 4), (128, 7), (256, 2), (256, 4))
    ],
    check=lambda num_threads, num_vectors, **spec: per_token_cast.check(**spec),
    pass_configs=per_token_cast.DECL.pass_configs,
)

TOPK_GATE = KernelDecl(
    name='tune.topk_gate',
    params=topk_gate.DECL.params + (param('warps_per_block', 'int', 'w'),),
    factory=topk_gate.build,
    prebuilt=lambda: [dict(num_experts=256, num_topk=8, warps_per_block=w) for w in (4,)],
    check=lambda warps_per_block, **spec: topk_gate.check(**spec),
    pass_configs=topk_gate.DECL.pass_configs,
)

REDUCE_FUSED = KernelDecl(
    name='tune.reduce_fused',
    params=reduce_fused.DECL.params + (param('threads', 'int', 't'), param('vectors', 'int', 'v'), param('topk_in_flight', 'int', 'f')),
    factory=reduce_fused.build,
    prebuilt=lambda: [
        dict(in_dtype='bfloat16', out_dtype='same', threads=t, vectors=v, topk_in_flight=f)
        for t, v, f in ((128, 2, 4), (64, 2, 4), (64, 2, 8), (128, 1, 8), (128, 4, 4), (256, 1, 8), (128, 7, 2))
    ],
    check=lambda threads, vectors, topk_in_flight, **spec: reduce_fused.check(**spec),
    pass_configs=reduce_fused.DECL.pass_configs,
)

# The two quant kernels still 1% behind upstream's (run 2 of docs/gpu-runs/2026-11-30-h200-e.md): loads in flight
# per SM against registers. cast_back: e4m3 -> bf16 with packed UE8M0 scale factors (upstream's case).
CAST_BACK = KernelDecl(
    name='tune.cast_back',
    params=cast_back.DECL.params + (param('num_units', 'int', 'u'), param('min_blocks', 'int', 'mb')),
    factory=cast_back.build,
    prebuilt=lambda: [
        dict(fmt='e4m3', out_dtype='bfloat16', sf_format='ue8m0', num_units=u, min_blocks=mb)
        for u, mb in ((8, 8), (8, 10), (12, 8), (12, 6), (16, 6), (16, 4), (4, 16))
    ],
    check=lambda num_units, min_blocks, **spec: cast_back.check(**spec),
    pass_configs=cast_back.DECL.pass_configs,
)

PER_CHANNEL_CAST = KernelDecl(
    name='tune.per_channel_cast_fused',
    params=per_channel_cast.FUSED.params + (param('min_blocks', 'int', 'mb'),),
    factory=per_channel_cast.build,
    prebuilt=lambda: [dict(in_dtype='bfloat16', gather=False, transpose=False, num_per_tokens=128, min_blocks=mb) for mb in (3, 4, 5, 6)],
    check=lambda min_blocks, **spec: per_channel_cast.check(**spec),
    pass_configs=per_channel_cast.FUSED.pass_configs,
)

DECLS = {d.name: d for d in (TRANSPOSE, PER_TOKEN_CAST, TOPK_GATE, REDUCE_FUSED, CAST_BACK, PER_CHANNEL_CAST)}
