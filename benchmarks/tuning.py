"""Variants of the shipped kernels with their tuning knobs exposed as spec parameters.

Build them into their own folder and time them with benchmarks/tune.py; they never enter a wheel:

    python -m build_tools --arch sm90 --registry benchmarks.tuning --build-dir build-tune --no-wheels
"""

from kernel_src.decl import KernelDecl, param
from kernel_src.moe import reduce_fused, topk_gate
from kernel_src.quant import cast_back, per_channel_cast, per_token_cast
from kernel_src.transpose import batched_transpose


def variant(name: str, decl: KernelDecl, knobs: dict[str, str], specs) -> KernelDecl:
    """`decl` with the build arguments `knobs` (name -> short tag for file names) as int spec parameters, and
    `specs` (a function returning the specs to build) as its prebuilt list."""
    return KernelDecl(
        name=name,
        params=decl.params + tuple(param(knob, 'int', tag) for knob, tag in knobs.items()),
        factory=decl.factory,
        prebuilt=specs,
        check=lambda **spec: decl.check(**{k: v for k, v in spec.items() if k not in knobs}),
        pass_configs=decl.pass_configs,
    )


TRANSPOSE = variant('tune.transpose', batched_transpose.DECL, {'max_warps': 'w'}, lambda: [
    dict(elem_bytes=eb, vec_bytes=v, tile_m=tm, tile_n=tn, max_warps=w)
    for eb, v in ((2, 16), (1, 8), (1, 16))
    for tm, tn, w in ((64, 64, 8), (64, 64, 1), (128, 128, 8), (128, 128, 2))
    if not batched_transpose.check_or_none(eb, v, tm, tn)
])

# Threads and 16-byte vectors a thread (vec_bytes=16), for the aligned kernels and the unaligned bf16 ones
# (element-wise loads). More vectors (7 or 8 a thread, or 4 in CTAs of 256) spill under the kernels' register cap,
# and so do CTAs of 256 for the unaligned e2m1 kernels since their cap is 8 CTAs an SM (32 registers).
PER_TOKEN_CAST = variant('tune.per_token_cast', per_token_cast.DECL, {'num_threads': 't', 'num_vectors': 'n'}, lambda: [
    dict(in_dtype=d, fmt=f, sf_format='f32', per_row=False, aligned=aligned, vec_bytes=16, num_threads=t, num_vectors=n)
    for d in ('bfloat16', 'float32') for f in ('e4m3', 'e2m1') for aligned in (True, False)
    if aligned or d == 'bfloat16'
    for t, n in ((128, 2), (128, 4), (256, 2))
    if aligned or f == 'e4m3' or t == 128
])

TOPK_GATE = variant('tune.topk_gate', topk_gate.DECL, {'warps_per_block': 'w'}, lambda: [
    dict(num_experts=256, num_topk=8, warps_per_block=w) for w in (4,)
])

REDUCE_FUSED = variant('tune.reduce_fused', reduce_fused.DECL, {'threads': 't', 'vectors': 'v', 'topk_in_flight': 'f'}, lambda: [
    dict(in_dtype='bfloat16', out_dtype='same', threads=t, vectors=v, topk_in_flight=f)
    for t, v, f in ((128, 2, 4), (64, 2, 4), (64, 2, 8), (128, 1, 8), (128, 4, 4), (256, 1, 8), (128, 7, 2))
])

# Loads in flight per SM against registers. cast_back: e4m3 -> bf16 with packed UE8M0 scale factors (upstream's case).
CAST_BACK = variant('tune.cast_back', cast_back.DECL, {'num_units': 'u', 'min_blocks': 'mb'}, lambda: [
    dict(fmt='e4m3', out_dtype='bfloat16', sf_format='ue8m0', num_units=u, min_blocks=mb)
    for u, mb in ((8, 8), (8, 10), (12, 8), (12, 6), (16, 6), (16, 4), (4, 16))
])

# per_channel_cast_fused: thread layouts (rows, lanes_k, warps_k, vec_bytes) for every input, at the shipped CTAs per SM.
_CHANNEL_LAYOUTS = ((8, 4, 4, 16), (8, 16, 1, 16), (8, 8, 2, 16))
PER_CHANNEL_CAST = variant('tune.per_channel_cast_fused', per_channel_cast.FUSED,
                           {'min_blocks': 'mb', 'rows': 'r', 'lanes_k': 'lk', 'warps_k': 'wk', 'vec_bytes': 'vb'}, lambda: [
    dict(in_dtype=d, gather=g, transpose=False, num_per_tokens=128, min_blocks=0, rows=r, lanes_k=lk, warps_k=wk, vec_bytes=vb)
    for d in per_channel_cast.IN_DTYPES for g in (False, True)
    for r, lk, wk, vb in _CHANNEL_LAYOUTS
])

DECLS = {d.name: d for d in (TRANSPOSE, PER_TOKEN_CAST, TOPK_GATE, REDUCE_FUSED, CAST_BACK, PER_CHANNEL_CAST)}
