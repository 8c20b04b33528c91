"""mhc_multilayer_recompute: every layer input and residual of a stack of mHC layers, recomputed in one launch
(upstream TileKernels' ``mhc_multilayer_recompute``, same signature)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _stream_checks as checks

KERNEL = 'mhc.multilayer_recompute'


def _tensor_list(op: str, name: str, value: object) -> list:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f'{op}: {name} must be a list of tensors, got {type(value).__name__}')
    return list(value)


@_plans.launch_plan
def mhc_multilayer_recompute(
    initial_residual: torch.Tensor,
    pre_mix_list: list[torch.Tensor],
    layer_output_list: list[torch.Tensor],
    post_mix_list: list[torch.Tensor],
    comb_mix_list: list[torch.Tensor],
    layer_input_list: list[torch.Tensor],
    residual_list: list[torch.Tensor],
) -> None:
    """Recompute, for L layers, ``layer_input[i] = mhc_pre_apply_mix_fwd(res, pre_mix[i])`` and, for the first Lp,
    ``res = residual[i] = mhc_post_fwd(layer_output[i], res, post_mix[i], comb_mix[i])``, starting from
    ``res = initial_residual``; bit for bit what that loop of the two ops writes.

    Args:
        initial_residual: ``[..., mhc, H]`` bfloat16.
        pre_mix_list: L tensors ``[..., mhc, 1]`` float32.
        layer_output_list, post_mix_list, comb_mix_list: Lp (L or L - 1) tensors each, ``[..., H]`` bfloat16,
            ``[..., mhc, 1]`` and ``[..., mhc, mhc]`` float32.
        layer_input_list: L ``[..., H]`` bfloat16 outputs, written.
        residual_list: Lp ``[..., mhc, H]`` bfloat16 outputs, written.

    Every tensor contiguous, on initial_residual's device, with its token dims; bf16 ones 16-byte aligned,
    float32 ones aligned to 4 * gcd(mhc, 4) bytes. L and Lp are run-time: the tensors' addresses go to the GPU as
    a table, from pinned memory without a host sync (so a CUDA graph can capture the call).
    """
    if is_compiling():
        return _custom_ops.mhc_multilayer_recompute(initial_residual, pre_mix_list, layer_output_list, post_mix_list,
                                                    comb_mix_list, layer_input_list, residual_list)
    op = 'mhc_multilayer_recompute'
    mhc, h = checks.streams(op, 'initial_residual', initial_residual)
    lead = checks.leading(initial_residual, 2)
    _checks.contiguous(op, 'initial_residual', initial_residual)
    lists = {name: _tensor_list(op, name, value) for name, value in (
        ('pre_mix_list', pre_mix_list), ('layer_output_list', layer_output_list), ('post_mix_list', post_mix_list),
        ('comb_mix_list', comb_mix_list), ('layer_input_list', layer_input_list), ('residual_list', residual_list))}
    num_layers, num_post = len(lists['pre_mix_list']), len(lists['layer_output_list'])
    if num_layers < 1:
        raise ValueError(f'{op}: pre_mix_list must hold at least one layer, got none')
    for name, like in (('layer_input_list', 'pre_mix_list'), ('post_mix_list', 'layer_output_list'), ('comb_mix_list', 'layer_output_list'),
                       ('residual_list', 'layer_output_list')):
        if len(lists[name]) != len(lists[like]):
            raise ValueError(f'{op}: {name} must hold {len(lists[like])} tensors (as {like}), got {len(lists[name])}')
    if num_post not in (num_layers - 1, num_layers):
        raise ValueError(f'{op}: layer_output_list must hold L or L - 1 tensors with L = {num_layers} layers, got {num_post}')
    tails = {'pre_mix_list': (torch.float32, (mhc, 1)), 'layer_output_list': (torch.bfloat16, (h,)), 'post_mix_list': (torch.float32, (mhc, 1)),
             'comb_mix_list': (torch.float32, (mhc, mhc)), 'layer_input_list': (torch.bfloat16, (h,)), 'residual_list': (torch.bfloat16, (mhc, h))}
    devices = {'initial_residual': initial_residual}
    for name, tensors in lists.items():
        dtype, tail = tails[name]
        for i, t in enumerate(tensors):
            item = f'{name}[{i}]'
            checks.tail_tensor(op, item, t, dtype, len(tail))
            checks.expect_shape(op, item, t, (*lead, *tail), f"initial_residual's token dims, then {tail}")
            _checks.contiguous(op, item, t)
            devices[item] = t
    device = _checks.on_one_cuda_device(op, **devices)
    tokens = checks.num_tokens(lead)
    if tokens == 0:
        return
    kernel = find_kernel(KERNEL, {'mhc': mhc, 'hidden': h}, device)
    vectors = {k: t for k, t in devices.items() if t.dtype == torch.bfloat16}
    checks.aligned(op, kernel, vectors, {k: t for k, t in devices.items() if t.dtype == torch.float32})
    # One table, one asynchronous copy: rows (pre_mix, layer_input) for every layer, then rows (layer_output, post_mix,
    # comb_mix, residual) for the layers with a post.
    rows = [t for i in range(num_layers) for t in (lists['pre_mix_list'][i], lists['layer_input_list'][i])]
    rows += [t for i in range(num_post) for t in (lists['layer_output_list'][i], lists['post_mix_list'][i], lists['comb_mix_list'][i],
                                                  lists['residual_list'][i])]
    tables = _plans.address_table(rows, initial_residual.device)
    kernel(device, {'initial_residual': initial_residual.view(tokens, mhc, h),
                    'layer_tables': tables[:2 * num_layers].view(num_layers, 2),
                    'post_tables': tables[2 * num_layers:].view(num_post, 4)})
