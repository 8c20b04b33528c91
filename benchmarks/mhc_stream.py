"""Benchmark cases of the mHC stream kernels (expand, pre_apply_mix, post, multilayer_recompute): RUN_CASES for
benchmarks.run (spec, tokens) and UPSTREAM_CASES for benchmarks.upstream (tk, tokens), on the same inputs.

mhc_post forward's bandwidth against a copy is a target of issue 37 (at least 90%). multilayer_recompute runs a stack
of LAYERS layers, each with a post (as upstream's benchmark of it), and with the last post left out. Upstream's side runs
at mhc 4 and the hidden sizes of UPSTREAM_HIDDEN (DeepSeek-V3's 7168, DeepSeek-V4-Flash's 4096).
"""

from __future__ import annotations

import torch

from benchmarks.common import nbytes

LAYERS = 10
UPSTREAM_HIDDEN = (7168, 4096)
MHC = 4


def _bf16(*shape):
    return torch.randn(*shape, device='cuda').bfloat16()


def _mix(tokens, mhc, cols=1):
    return torch.rand(tokens, mhc, cols, device='cuda')


def _recompute_inputs(tokens, mhc, hidden, num_layers, num_post):
    return dict(
        initial_residual=_bf16(tokens, mhc, hidden),
        pre_mix_list=[_mix(tokens, mhc) for _ in range(num_layers)],
        layer_output_list=[_bf16(tokens, hidden) for _ in range(num_post)],
        post_mix_list=[_mix(tokens, mhc) for _ in range(num_post)],
        comb_mix_list=[_mix(tokens, mhc, mhc) for _ in range(num_post)],
        layer_input_list=[torch.empty(tokens, hidden, dtype=torch.bfloat16, device='cuda') for _ in range(num_layers)],
        residual_list=[torch.empty(tokens, mhc, hidden, dtype=torch.bfloat16, device='cuda') for _ in range(num_post)],
    )


def _recompute_moved(inputs) -> int:
    return nbytes(inputs['initial_residual'], *(t for name, tensors in inputs.items() if name != 'initial_residual' for t in tensors))


# -- benchmarks.run: spec -> (label, fn, bytes moved) ---------------------------------------------------------------


def expand_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.expand import expand_to_mhc_fwd

    mhc, h = spec['mhc'], spec['hidden']
    x = _bf16(tokens, h)
    fn = lambda: expand_to_mhc_fwd(x, mhc)
    return f'T={tokens}, H={h}', fn, nbytes(x, fn())


def expand_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.expand import expand_to_mhc_bwd

    mhc, h = spec['mhc'], spec['hidden']
    grad = _bf16(tokens, mhc, h)
    fn = lambda: expand_to_mhc_bwd(grad)
    return f'T={tokens}, H={h}', fn, nbytes(grad, fn())


def pre_apply_mix_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_fwd

    mhc, h = spec['mhc'], spec['hidden']
    x, mix = _bf16(tokens, mhc, h), _mix(tokens, mhc)
    fn = lambda: mhc_pre_apply_mix_fwd(x, mix)
    return f'T={tokens}, H={h}', fn, nbytes(x, mix, fn())


def pre_apply_mix_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_bwd

    mhc, h = spec['mhc'], spec['hidden']
    o_grad, x, mix, x_grad = _bf16(tokens, h), _bf16(tokens, mhc, h), _mix(tokens, mhc), _bf16(tokens, mhc, h)
    fn = lambda: mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    return f'T={tokens}, H={h}', fn, nbytes(o_grad, x, mix, x_grad, x_grad, fn())  # x_grad is read and written


def post_fwd_case(spec, tokens):
    from tile_kernels_aot.mhc.post import mhc_post_fwd

    mhc, h = spec['mhc'], spec['hidden']
    args = (_bf16(tokens, h), _bf16(tokens, mhc, h), _mix(tokens, mhc), _mix(tokens, mhc, mhc))
    fn = lambda: mhc_post_fwd(*args)
    return f'T={tokens}, H={h}', fn, nbytes(*args, fn())


def post_bwd_case(spec, tokens):
    from tile_kernels_aot.mhc.post import mhc_post_bwd

    mhc, h = spec['mhc'], spec['hidden']
    args = (_bf16(tokens, h), _bf16(tokens, mhc, h), _mix(tokens, mhc), _mix(tokens, mhc, mhc), _bf16(tokens, mhc, h))
    fn = lambda: mhc_post_bwd(*args, fuse_grad_acc=False)
    return f'T={tokens}, H={h}', fn, nbytes(*args, *fn())


def multilayer_recompute_case(spec, tokens):
    from tile_kernels_aot.mhc.multilayer_recompute import mhc_multilayer_recompute

    mhc, h = spec['mhc'], spec['hidden']
    cases = []
    for num_post in (LAYERS, LAYERS - 1):
        inputs = _recompute_inputs(tokens, mhc, h, LAYERS, num_post)
        cases.append((f'T={tokens}, H={h}, L={LAYERS}, Lp={num_post}', (lambda inputs=inputs: mhc_multilayer_recompute(**inputs)),
                      _recompute_moved(inputs)))
    return cases


RUN_CASES = {
    'mhc.expand_to_mhc_fwd': expand_fwd_case,
    'mhc.expand_to_mhc_bwd': expand_bwd_case,
    'mhc.pre_apply_mix_fwd': pre_apply_mix_fwd_case,
    'mhc.pre_apply_mix_bwd': pre_apply_mix_bwd_case,
    'mhc.post_fwd': post_fwd_case,
    'mhc.post_bwd': post_bwd_case,
    'mhc.multilayer_recompute': multilayer_recompute_case,
}


# -- benchmarks.upstream: tk -> (label, ours, theirs, compare, bytes moved), per hidden size ---------------------------


def _same_bits(a, b):
    return all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
               for x, y in zip(a, b, strict=True))


def _close_to(rtol, atol):
    def compare(a, b):
        return all(x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True))
    return compare


def _close_and_bitwise(rtol, atol):
    """The tolerance check, plus whether the two sides agree bit for bit (a layer kernel that does not makes
    multilayer_recompute's layers drift apart from upstream's)."""
    close = _close_to(rtol, atol)
    return lambda a, b: {'same_result': close(a, b), 'bitwise': _same_bits(a, b)}


def upstream_expand_fwd_case(tk, tokens):
    from tile_kernels.mhc.expand_kernel import expand_to_mhc_fwd_tl

    from tile_kernels_aot.mhc.expand import expand_to_mhc_fwd

    cases = []
    for h in UPSTREAM_HIDDEN:
        x, kernel = _bf16(tokens, h), expand_to_mhc_fwd_tl(h, MHC)

        def theirs(x=x, kernel=kernel, h=h):
            out = x.new_empty(tokens, MHC, h)
            kernel(x, out)
            return (out,)

        cases.append((f'mhc 4 H {h}', lambda x=x: (expand_to_mhc_fwd(x, MHC),), theirs, _same_bits, nbytes(x) * (1 + MHC)))
    return cases


def upstream_expand_bwd_case(tk, tokens):
    from tile_kernels.mhc.expand_kernel import expand_to_mhc_bwd_tl

    from tile_kernels_aot.mhc.expand import expand_to_mhc_bwd

    cases = []
    for h in UPSTREAM_HIDDEN:
        grad, kernel = _bf16(tokens, MHC, h), expand_to_mhc_bwd_tl(h, MHC)

        def theirs(grad=grad, kernel=kernel, h=h):
            x_grad = grad.new_empty(tokens, h)
            kernel(grad, x_grad)
            return (x_grad,)

        cases.append((f'mhc 4 H {h}', lambda grad=grad: (expand_to_mhc_bwd(grad),), theirs, _close_to(1e-2, 1e-2),
                      nbytes(grad) * (1 + MHC) // MHC))
    return cases


def upstream_pre_apply_mix_fwd_case(tk, tokens):
    from tile_kernels.mhc.pre_apply_mix_kernel import _mhc_pre_apply_mix_fwd

    from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_fwd

    cases = []
    for h in UPSTREAM_HIDDEN:
        x, mix, kernel = _bf16(tokens, MHC, h), _mix(tokens, MHC), _mhc_pre_apply_mix_fwd(MHC, h)

        def theirs(x=x, mix=mix, kernel=kernel, h=h):
            out = x.new_empty(tokens, h)
            kernel(x, mix.view(tokens, MHC), out)
            return (out,)

        cases.append((f'mhc 4 H {h}', lambda x=x, mix=mix: (mhc_pre_apply_mix_fwd(x, mix),), theirs, _close_and_bitwise(1e-3, 1e-2),
                      nbytes(x, mix) + tokens * h * 2))
    return cases


def upstream_pre_apply_mix_bwd_case(tk, tokens):
    from tile_kernels.mhc.pre_apply_mix_kernel import _mhc_pre_apply_mix_bwd

    from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_bwd

    cases = []
    for h in UPSTREAM_HIDDEN:
        o_grad, x, mix, kernel = _bf16(tokens, h), _bf16(tokens, MHC, h), _mix(tokens, MHC), _mhc_pre_apply_mix_bwd(MHC, h)
        ours_x_grad, their_x_grad = torch.zeros_like(x), torch.zeros_like(x)  # each side accumulates into its own

        def theirs(o_grad=o_grad, x=x, mix=mix, kernel=kernel, x_grad=their_x_grad):
            return kernel(o_grad, x, mix.view(tokens, MHC), x_grad).view(tokens, MHC, 1), x_grad

        def ours(o_grad=o_grad, x=x, mix=mix, x_grad=ours_x_grad):
            return mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad), x_grad

        cases.append((f'mhc 4 H {h}', ours, theirs, _close_to(1e-3, 1e-2), nbytes(o_grad, x, mix, mix) + 2 * nbytes(x)))
    return cases


def _post_inputs(tokens, h):
    # Upstream's mhc_post takes (n0, n1, ...) tensors: one sequence of `tokens` tokens.
    return _bf16(1, tokens, h), _bf16(1, tokens, MHC, h), _mix(tokens, MHC).view(1, tokens, MHC, 1), _mix(tokens, MHC, MHC).view(1, tokens, MHC, MHC)


def upstream_post_fwd_case(tk, tokens):
    from tile_kernels.mhc.post_kernel import mhc_post_fwd as their_post_fwd

    from tile_kernels_aot.mhc.post import mhc_post_fwd

    cases = []
    for h in UPSTREAM_HIDDEN:
        args = _post_inputs(tokens, h)
        cases.append((f'mhc 4 H {h}', lambda args=args: (mhc_post_fwd(*args),), lambda args=args: (their_post_fwd(*args),),
                      _close_and_bitwise(1.6e-2, 1e-5), nbytes(*args, args[1])))
    return cases


def upstream_post_bwd_case(tk, tokens):
    from tile_kernels.mhc.post_kernel import mhc_post_bwd as their_post_bwd

    from tile_kernels_aot.mhc.post import mhc_post_bwd

    cases = []
    for h in UPSTREAM_HIDDEN:
        args = (*_post_inputs(tokens, h), _bf16(1, tokens, MHC, h))
        moved = nbytes(*args) + nbytes(*args[:4])
        cases.append((f'mhc 4 H {h}', lambda args=args: mhc_post_bwd(*args, fuse_grad_acc=False),
                      lambda args=args: their_post_bwd(*args, fuse_grad_acc=False), _close_to(1.6e-2, 1e-4), moved))
    return cases


def _layer_loop(inputs, apply, post):
    """The layer loop multilayer_recompute stands for, on its inputs: apply(res, pre (T, mhc, 1)) -> layer input (T, H),
    post(layer output, res, post mix, comb mix), each with a leading dim of 1 (upstream's mhc_post signature) -> res."""
    res = inputs['initial_residual']
    tokens, mhc, hidden = res.shape
    layer_inputs, residuals = [], []
    for i, pre in enumerate(inputs['pre_mix_list']):
        layer_inputs.append(apply(res, pre.view(tokens, mhc, 1)))
        if i < len(inputs['layer_output_list']):
            res = post(inputs['layer_output_list'][i].view(1, tokens, hidden), res.view(1, tokens, mhc, hidden),
                       inputs['post_mix_list'][i].view(1, tokens, mhc, 1),
                       inputs['comb_mix_list'][i].view(1, tokens, mhc, mhc)).view(tokens, mhc, hidden)
            residuals.append(res)
    return (*layer_inputs, *residuals)


def _our_layer_loop(inputs):
    """Ours: mhc_pre_apply_mix_fwd and mhc_post_fwd."""
    from tile_kernels_aot.mhc.post import mhc_post_fwd
    from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_fwd

    return _layer_loop(inputs, mhc_pre_apply_mix_fwd, mhc_post_fwd)


def _upstream_layer_loop(inputs):
    """Upstream's own pre_apply_mix and post kernels."""
    from tile_kernels.mhc.post_kernel import mhc_post_fwd as their_post_fwd
    from tile_kernels.mhc.pre_apply_mix_kernel import _mhc_pre_apply_mix_fwd

    tokens, mhc, hidden = inputs['initial_residual'].shape
    kernel = _mhc_pre_apply_mix_fwd(mhc, hidden)

    def apply(res, pre):
        out = res.new_empty(tokens, hidden)
        kernel(res, pre.view(tokens, mhc), out)
        return out

    return _layer_loop(inputs, apply, their_post_fwd)


def upstream_multilayer_recompute_case(tk, tokens):
    """Ours against upstream's kernel within the post's tolerance; the row also says whether each side equals, bit for bit,
    upstream's own layer loop (its pre_apply_mix and post kernels), which tells rounding-order drift over the layers from
    a difference in what is computed."""
    from tile_kernels.mhc.multilayer_recompute_kernel import mhc_multilayer_recompute as their_recompute

    from tile_kernels_aot.mhc.multilayer_recompute import mhc_multilayer_recompute

    cases = []
    for h in UPSTREAM_HIDDEN:
        ours_inputs = _recompute_inputs(tokens, MHC, h, LAYERS, LAYERS)
        their_inputs = {**ours_inputs, 'layer_input_list': [torch.empty_like(t) for t in ours_inputs['layer_input_list']],
                        'residual_list': [torch.empty_like(t) for t in ours_inputs['residual_list']]}

        def run(fn, inputs):
            fn(**inputs)
            return (*inputs['layer_input_list'], *inputs['residual_list'])

        def compare(a, b, inputs=ours_inputs):
            loop = _upstream_layer_loop(inputs)
            return {'same_result': _close_to(1.6e-2, 1e-5)(a, b), 'ours_bitwise_upstream_loop': _same_bits(a, loop),
                    'upstream_bitwise_upstream_loop': _same_bits(b, loop), 'ours_bitwise_our_loop': _same_bits(a, _our_layer_loop(inputs))}

        cases.append((f'mhc 4 H {h} L={LAYERS}', lambda inputs=ours_inputs: run(mhc_multilayer_recompute, inputs),
                      lambda inputs=their_inputs: run(their_recompute, inputs), compare, _recompute_moved(ours_inputs)))
    return cases


UPSTREAM_CASES = {
    'mhc.expand_to_mhc_fwd': upstream_expand_fwd_case,
    'mhc.expand_to_mhc_bwd': upstream_expand_bwd_case,
    'mhc.pre_apply_mix_fwd': upstream_pre_apply_mix_fwd_case,
    'mhc.pre_apply_mix_bwd': upstream_pre_apply_mix_bwd_case,
    'mhc.post_fwd': upstream_post_fwd_case,
    'mhc.post_bwd': upstream_post_bwd_case,
    'mhc.multilayer_recompute': upstream_multilayer_recompute_case,
}
