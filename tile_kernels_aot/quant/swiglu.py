"""The SwiGLU fusions of quant (upstream TileKernels v1 names, signatures and results), e4m3 output.

SwiGLU of a row ``[l | r]`` (two halves of ``hidden``), float32, in this order (upstream's reference):
``l = min(l, c)`` and ``r = clamp(r, -c, c)`` with a clamp value c, then ``act = l / (1 + exp(-l)) * r``.

* ``swiglu_forward_and_per_token_cast``: ``act * w`` (w = ``topk_weights.flatten()[pos_to_token_topk[row]]``,
  0 for a negative index) cast per (1, 128) block or per row; rows with ``pos_to_expert < 0`` are left
  unwritten (data and scale factors); ``clamped_count += [#l > c, #r > c, #r < -c]`` over the rows
  processed, exactly and whatever ``config.set_num_sms`` says.
* ``swiglu_forward_and_per_channel_cast_and_transpose``: act rounded to bf16, then cast per
  (num_per_tokens, 1) block, output (hidden, T) or (T, hidden).
* ``swiglu_backward_and_per_token_cast``: x = dequantised (q * sf) gate/up, clamped as the forward;
  s = 1 / (1 + exp(-l)); gws = g * w * s; ``out = bf16(act * w)``; ``dl = gws * r * fma(l, 1 - s, 1)`` (0 where
  l was clamped), ``dr = gws * l`` (0 where r was clamped); ``x_grad = bf16([dl | dr])`` and its e4m3 cast
  from the float32 values; ``weight_grad[t, k] = sum_h g * act`` of the row mapped to (t, k), 0 where
  ``token_topk_to_pos == -1``.

The clamp value, the hidden size, the token counts, top-k, the block widths and every flag are run-time
arguments of the binaries (upstream bakes the clamp value and the hidden size into its JIT kernels).
"""

from __future__ import annotations

from numbers import Real
from typing import Optional

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans, config, targets
from tile_kernels_aot import _index_checks
from tile_kernels_aot._select import find_kernel, kernel_constant, package_for_device, prebuilt_specs
from tile_kernels_aot.quant._common import (
    IN_DTYPES, MAX_GRID_Y, VECTOR_BYTES, QuantTensor, alloc_sf, check_bool, check_e4m3, check_sf_flags, dtype_name, magic, sf_format,
    unpack_quant, vector_bytes,
)

_E4M3_FLOOR = 1e-4  # amax floor of e4m3 scale factors (upstream's clamp_min)
_FMT_WHY = ' (the only format upstream fuses with SwiGLU)'
_FWD_KERNEL = 'quant.swiglu_forward_and_per_token_cast'


def _placeholders(device: torch.device) -> dict[str, torch.Tensor]:
    """Stand-ins for the tensors the forward kernel binds but never touches when the matching flag is 0."""
    def make():
        index = torch.zeros((1,), dtype=torch.int32, device=device)
        return {'pos_to_token_topk': index, 'pos_to_expert': index,
                'topk_weights': torch.zeros((1,), dtype=torch.float32, device=device),
                'clamped_count': torch.zeros((3,), dtype=torch.int64, device=device)}
    return _plans.stand_ins(('swiglu_forward_and_per_token_cast', device), make)


def _check_float(op: str, name: str, value: object, *, positive: bool = False) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f'{op}: {name} must be a float or None, got {type(value).__name__}')
    value = float(value)
    if value != value or (positive and not value > 0):
        raise ValueError(f'{op}: {name} must be {"a positive" if positive else "a"} number, got {value}')
    return value


def _index_tensor(op: str, name: str, t: object, length: int) -> torch.Tensor:
    _checks.tensor(op, name, t, ndim=1, dtypes=(torch.int32,))
    if t.shape[0] != length:
        raise ValueError(f'{op}: {name} must have {length} entries (one per row of x), got {t.shape[0]}')
    if length > 1 and t.stride(0) != 1:
        raise ValueError(f'{op}: {name} must be contiguous, got stride {t.stride(0)}')
    return t


def _contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f'{op}: {name} must be contiguous, got shape {tuple(t.shape)} and strides {t.stride()}')


def _per_row_sizes(in_dtype: str, device: int) -> list[int]:
    """The CTA sizes of the per-row forward kernels installed for the device, smallest first."""
    return sorted(s['row_threads'] for s in prebuilt_specs(_FWD_KERNEL, device) if s['per_row'] and s['in_dtype'] == in_dtype)


def _widest_row(row_threads: int, device: int) -> int:
    """The widest row a per-row forward kernel of `row_threads` threads holds: thread_elements a thread."""
    return row_threads * kernel_constant(_FWD_KERNEL, 'thread_elements', device)


def per_row_threads(in_dtype: str, hidden: int, device: int) -> int:
    """The CTA size of the per-row forward kernel that serves rows of `hidden` elements (0: none holds them). A row is
    2^tpr_log2 threads of the kernel's thread_elements elements, and the smallest installed CTA that holds it wins (more
    warps an SM); the GPU tests and benchmarks ask it which widths each per-row spec serves."""
    return next((t for t in _per_row_sizes(in_dtype, device) if _widest_row(t, device) >= hidden), 0)


@_plans.launch_plan
def swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    pos_to_token_topk: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    pos_to_expert: Optional[torch.Tensor] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    swiglu_clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
    sf_clamp_min: Optional[float] = None,
) -> QuantTensor:
    """SwiGLU forward fused with a per-token e4m3 cast.

    Args:
        x: ``[num_expanded_tokens, 2 * hidden]`` bfloat16 or float32 CUDA tensor, contiguous, ``[gate | up]``;
            hidden a multiple of 128.
        fmt: ``'e4m3'``.
        num_per_channels: 128, or ``hidden`` (one scale factor per row; hidden at most 16384 for bfloat16
            and 8192 for float32 input).
        pos_to_token_topk: optional int32 ``[num_expanded_tokens]``: index into ``topk_weights.flatten()``
            of each row's routing weight (negative: weight 0; one past its end fails a device-side assert, for
            bfloat16 input a trap: "unspecified launch failure"). Without it ``topk_weights`` is ignored, as upstream.
        topk_weights: float32 ``[num_tokens, num_topk]``, contiguous; required with ``pos_to_token_topk``.
        pos_to_expert: optional int32 ``[num_expanded_tokens]``; rows with a negative entry are skipped:
            neither their data nor their scale factors are written.
        use_tma_aligned_col_major_sf: column-major float32 scale factors, the row dim padded to 4
            (only with ``num_per_channels == 128``).
        round_sf: round scale factors up to powers of two.
        use_packed_ue8m0: four UE8M0 exponents per int32 (needs the column-major layout and round_sf);
            the bytes of a word past the last block are zero.
        swiglu_clamp_value: optional clamp c: ``gate = min(gate, c)``, ``up = clamp(up, -c, c)``.
        clamped_count: optional int64 ``[3]`` CUDA tensor (needs ``swiglu_clamp_value``), incremented by the
            counts of ``gate > c``, ``up > c`` and ``up < -c`` over the rows not skipped.
        sf_clamp_min: amax floor of the scale factors (default 1e-4).

    Returns:
        ``(out, sf)``: ``out`` float8_e4m3fn ``[num_expanded_tokens, hidden]``; ``sf`` float32
        ``[num_expanded_tokens, hidden / num_per_channels]`` row-major, or column-major with strides
        ``(1, align(num_expanded_tokens, 4))``, or packed int32 ``[num_expanded_tokens, ceil(hidden / 512)]``
        with strides ``(1, align(num_expanded_tokens, 4))``.
    """
    if is_compiling():
        return _custom_ops.swiglu_forward_and_per_token_cast(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                                                             use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value,
                                                             clamped_count, sf_clamp_min)
    op = 'swiglu_forward_and_per_token_cast'
    check_e4m3(op, fmt, _FMT_WHY)
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(IN_DTYPES))
    _checks.integer(op, 'num_per_channels', num_per_channels, low=1)
    col_major, round_sf, packed = check_sf_flags(op, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    clamp = _check_float(op, 'swiglu_clamp_value', swiglu_clamp_value)
    floor = _check_float(op, 'sf_clamp_min', sf_clamp_min, positive=True)
    num_rows, width = x.shape
    hidden = width // 2
    if width % 256:
        raise ValueError(f'{op}: x must have 2 * hidden columns with hidden a multiple of 128, got {width} columns')
    if num_per_channels not in (128, hidden):
        raise ValueError(f'{op}: num_per_channels must be 128 or hidden ({hidden}), got {num_per_channels}')
    per_row = num_per_channels != 128
    if col_major and per_row:
        raise ValueError(f'{op}: use_tma_aligned_col_major_sf needs num_per_channels == 128, got {num_per_channels}')
    if packed and not (col_major and round_sf):
        raise ValueError(f'{op}: use_packed_ue8m0 needs use_tma_aligned_col_major_sf=True and round_sf=True')
    _contiguous(op, 'x', x)
    tensors = {'x': x}
    with_weight = pos_to_token_topk is not None
    if with_weight:
        tensors['pos_to_token_topk'] = _index_tensor(op, 'pos_to_token_topk', pos_to_token_topk, num_rows)
        if topk_weights is None:
            raise ValueError(f'{op}: topk_weights is required with pos_to_token_topk')
        _checks.tensor(op, 'topk_weights', topk_weights, ndim=2, dtypes=(torch.float32,))
        _contiguous(op, 'topk_weights', topk_weights)
        tensors['topk_weights'] = topk_weights.view(-1)
    if pos_to_expert is not None:
        tensors['pos_to_expert'] = _index_tensor(op, 'pos_to_expert', pos_to_expert, num_rows)
    if clamped_count is not None:
        if clamp is None:
            raise ValueError(f'{op}: clamped_count needs swiglu_clamp_value')
        _checks.tensor(op, 'clamped_count', clamped_count, ndim=1, dtypes=(torch.int64,))
        if clamped_count.shape[0] != 3:
            raise ValueError(f'{op}: clamped_count must have 3 entries, got {clamped_count.shape[0]}')
        tensors['clamped_count'] = clamped_count
    device = _checks.on_one_cuda_device(op, **tensors)
    if with_weight and _index_checks.enabled:
        _index_checks.below(op, 'pos_to_token_topk', pos_to_token_topk, topk_weights.numel(),
                            what=f'the {topk_weights.numel()} entries of topk_weights')
    spec = dict(in_dtype=IN_DTYPES[x.dtype], sf_format=sf_format(packed), per_row=per_row, row_threads=0)
    if per_row:
        spec['row_threads'] = per_row_threads(spec['in_dtype'], hidden, device)
        if not spec['row_threads']:
            sizes = _per_row_sizes(spec['in_dtype'], device)
            widest = _widest_row(sizes[-1], device) if sizes else 0
            raise ValueError(f'{op}: num_per_channels == hidden supports hidden up to {widest} for {dtype_name(x.dtype)} input, '
                             f'got {hidden}')
    if x.data_ptr() % 16:
        raise ValueError(f'{op}: x.data_ptr() must be 16-byte aligned, got {x.data_ptr():#x}')

    blocks_per_row = hidden // 128
    num_blocks = 1 if per_row else blocks_per_row
    if num_rows:
        kernel = find_kernel(_FWD_KERNEL, spec, device)
        num_sms = config.get_num_sms(device)
        tpr_log2 = 0
        threads = kernel.entry.launches[0].block
        threads = threads[0] * threads[1] * threads[2]
        elements = kernel.entry.constants['thread_elements']  # of each half, a thread and step
        if per_row:
            # The flat kernel's step with the row as its block: 2^tpr_log2 adjacent threads of `elements`
            # elements (the last ones partly past the row's end), threads >> tpr_log2 rows per CTA and step.
            tpr_log2 = (-(-hidden // elements) - 1).bit_length()
            rows_per_step = threads >> tpr_log2
            num_ctas = min(-(-num_rows // rows_per_step), num_sms * kernel.blocks_per_sm(device))
            num_iters = -(-num_rows // (num_ctas * rows_per_step))
        else:
            # 128-wide blocks per CTA and step: a block is 128 / `elements` adjacent threads, and the CTA size is
            # the kernel's own (the bf16 kernel's CTAs are larger, see kernel_src.quant.swiglu). The grid is as
            # many CTAs per SM as fit at once (the kernel's register and shared-memory budget sets it), so none
            # waits for a second wave.
            blocks_per_step = threads * elements // 128
            total = num_rows * blocks_per_row
            num_ctas = min(-(-total // blocks_per_step), num_sms * kernel.blocks_per_sm(device))
            num_iters = -(-total // (num_ctas * blocks_per_step))
            if num_iters * num_ctas * blocks_per_step >= kernel.entry.constants['index_limit']:
                raise ValueError(f'{op}: x is too large: {num_rows} rows of {blocks_per_row} blocks of 128 reach the 32-bit index range')
    out = torch.empty((num_rows, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    returned, sf_arg = alloc_sf(num_rows, num_blocks, col_major, packed, x.device)
    if num_rows:
        row_magic, row_shift = magic(blocks_per_row)
        scalars = dict(num_ctas=num_ctas, num_iters=num_iters, blocks_per_row=blocks_per_row, row_magic=row_magic, row_shift=row_shift,
                       with_weight=int(with_weight), with_pos_to_expert=int(pos_to_expert is not None), use_clamp=int(clamp is not None),
                       count_clamp=int(clamped_count is not None), round_sf=int(round_sf), tpr_log2=tpr_log2,
                       clamp_value=0.0 if clamp is None else clamp,
                       sf_floor=_E4M3_FLOOR if floor is None else floor)
        kernel(device, {**_placeholders(x.device), **tensors, 'out': out, 'out_sf': sf_arg}, scalars)
    return out, returned


# Families whose per-channel SwiGLU cast takes 32-byte vectors where x allows: one 256-bit load each on SM100
# (upstream's choice there). On sm_90a a 32-byte vector is two 16-byte loads, and the 32-byte kernel is no faster
# there than the 16-byte one on the same input (slower untransposed), so sm_90a keeps 16-byte vectors.
_CHANNEL_WIDE_FAMILIES = ('sm_100',)


def swiglu_forward_and_per_channel_cast_spec(x: torch.Tensor, without_transpose: bool, target: str) -> dict:
    """The prebuilt spec of the per-channel SwiGLU cast that serves the (checked) ``x`` on a GPU that runs the
    ``target`` binaries: 32-byte vectors on the targets that gain from them where x's pointer is 32-byte aligned (its
    rows always are), else 16-byte ones."""
    wide = targets.family(target) in _CHANNEL_WIDE_FAMILIES
    return dict(transpose=not without_transpose, vec_bytes=vector_bytes(x) if wide else VECTOR_BYTES)


@_plans.launch_plan
def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    without_transpose: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> QuantTensor:
    """SwiGLU forward, rounded to bfloat16, fused with a per-channel e4m3 cast and (by default) a transpose.

    Args:
        x: ``[num_tokens, 2 * hidden]`` bfloat16 CUDA tensor, contiguous, ``[gate | up]``; num_tokens a multiple
            of 128 and hidden of 64.
        fmt: ``'e4m3'``.
        num_per_tokens: tokens per scale factor, 32 or 128.
        round_sf: round scale factors up to powers of two.
        without_transpose: keep the ``[num_tokens, hidden]`` layout instead of ``[hidden, num_tokens]``.
        swiglu_clamp_value: optional clamp c: ``gate = min(gate, c)``, ``up = clamp(up, -c, c)``.

    Returns:
        ``(out, sf)``: ``out`` float8_e4m3fn ``[hidden, num_tokens]`` (or ``[num_tokens, hidden]``), contiguous;
        ``sf`` float32 ``[num_tokens / num_per_tokens, hidden]``, contiguous.
    """
    if is_compiling():
        return _custom_ops.swiglu_forward_and_per_channel_cast_and_transpose(x, fmt, num_per_tokens, round_sf, without_transpose,
                                                                             swiglu_clamp_value)
    op = 'swiglu_forward_and_per_channel_cast_and_transpose'
    check_e4m3(op, fmt, _FMT_WHY)
    _checks.tensor(op, 'x', x, ndim=2, dtypes=(torch.bfloat16,))
    _checks.integer(op, 'num_per_tokens', num_per_tokens, low=1)
    round_sf = check_bool(op, 'round_sf', round_sf)
    without_transpose = check_bool(op, 'without_transpose', without_transpose)
    clamp = _check_float(op, 'swiglu_clamp_value', swiglu_clamp_value)
    num_tokens, width = x.shape
    if num_per_tokens not in (32, 128):
        raise ValueError(f'{op}: num_per_tokens must be 32 or 128, got {num_per_tokens}')
    if num_tokens % 128 or width % 128:
        raise ValueError(f'{op}: x must have a multiple of 128 rows and of 128 columns, got shape {tuple(x.shape)}')
    _contiguous(op, 'x', x)
    device = _checks.on_one_cuda_device(op, x=x)
    if x.data_ptr() % 16:
        raise ValueError(f'{op}: x.data_ptr() must be 16-byte aligned, got {x.data_ptr():#x}')
    if num_tokens:
        spec = swiglu_forward_and_per_channel_cast_spec(x, without_transpose, package_for_device(device).target)
        kernel = find_kernel('quant.swiglu_forward_and_per_channel_cast_and_transpose', spec, device)
        tile_tokens = kernel.entry.constants['tile_tokens']  # a CTA's; the grid's y counts the tiles
        if num_tokens // tile_tokens > MAX_GRID_Y:
            raise ValueError(f'{op}: x has too many rows for one launch: {num_tokens} > {MAX_GRID_Y * tile_tokens}')
    hidden = width // 2
    out = torch.empty((num_tokens, hidden) if without_transpose else (hidden, num_tokens), dtype=torch.float8_e4m3fn, device=x.device)
    out_sf = torch.empty((num_tokens // num_per_tokens, hidden), dtype=torch.float32, device=x.device)
    if num_tokens:
        scalars = dict(npt_log2=num_per_tokens.bit_length() - 1, round_sf=int(round_sf), use_clamp=int(clamp is not None),
                       clamp_value=0.0 if clamp is None else clamp)
        kernel(device, {'x': x, 'out': out, 'out_sf': out_sf}, scalars)
    return out, out_sf


@_plans.launch_plan
def swiglu_backward_and_per_token_cast(
    x: QuantTensor,
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    num_per_channels: int,
    round_sf: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> tuple[torch.Tensor, QuantTensor, torch.Tensor, torch.Tensor]:
    """SwiGLU backward from the e4m3 forward input, fused with a per-token e4m3 cast of the input gradient.

    Args:
        x: ``(data, sf)``: data float8_e4m3fn ``[num_expand_tokens, 2 * hidden]`` (or 3-D, flattened to that),
            contiguous; sf float32 ``[num_expand_tokens, 2 * hidden / num_per_channels]``, contiguous.
        grad_out: bfloat16 ``[num_expand_tokens, hidden]`` (any shape with that many elements), contiguous.
        weight: float32 ``[num_tokens, num_topk]`` routing weights, contiguous.
        pos_to_token_topk: int32 ``[num_expand_tokens]``: index into ``weight.flatten()`` (negative: weight 0; one
            past its end fails a device-side assert).
        token_topk_to_pos: int32 ``[num_tokens, num_topk]``, contiguous; -1 marks a (token, topk) slot
            without a row (its weight gradient is 0).
        num_per_channels: 32 or 128 (the block width of both ``x`` and the returned cast); hidden must be a
            multiple of it.
        round_sf: round the returned scale factors up to powers of two.
        swiglu_clamp_value: the forward's clamp value, or None.

    Returns:
        ``(out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad)``: out bfloat16 ``[N, hidden]`` = act * w;
        x_grad_fp8 float8_e4m3fn ``[N, 2 * hidden]`` and x_grad_sf float32 ``[N, 2 * hidden / num_per_channels]``
        (row-major), cast from the float32 gradient; x_grad bfloat16 ``[N, 2 * hidden]``; weight_grad float32
        ``[num_tokens, num_topk]``.
    """
    if is_compiling():
        return _custom_ops.swiglu_backward_and_per_token_cast(x, grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels,
                                                              round_sf, swiglu_clamp_value)
    op = 'swiglu_backward_and_per_token_cast'
    data, sf = unpack_quant(op, x)
    _checks.tensor(op, 'x[0] (data)', data, ndim=(2, 3), dtypes=(torch.float8_e4m3fn,))
    _checks.tensor(op, 'x[1] (sf)', sf, ndim=2, dtypes=(torch.float32,))
    _checks.tensor(op, 'grad_out', grad_out, ndim=(1, 2, 3), dtypes=(torch.bfloat16,))
    _checks.tensor(op, 'weight', weight, ndim=2, dtypes=(torch.float32,))
    _checks.tensor(op, 'pos_to_token_topk', pos_to_token_topk, ndim=1, dtypes=(torch.int32,))
    _checks.tensor(op, 'token_topk_to_pos', token_topk_to_pos, ndim=2, dtypes=(torch.int32,))
    _checks.integer(op, 'num_per_channels', num_per_channels, low=1)
    round_sf = check_bool(op, 'round_sf', round_sf)
    clamp = _check_float(op, 'swiglu_clamp_value', swiglu_clamp_value)
    if num_per_channels not in (32, 128):
        raise ValueError(f'{op}: num_per_channels must be 32 or 128, got {num_per_channels}')
    width = data.shape[-1]
    if not width or width % (2 * num_per_channels):  # zero columns: no hidden size to view the rows by
        raise ValueError(f'{op}: x data must have 2 * hidden columns with hidden a positive multiple of num_per_channels '
                         f'({num_per_channels}), got {width} columns')
    for name, t in (('x[0] (data)', data), ('x[1] (sf)', sf), ('grad_out', grad_out), ('weight', weight),
                    ('token_topk_to_pos', token_topk_to_pos)):
        _contiguous(op, name, t)
    hidden = width // 2
    data = data.view(-1, width)
    num_rows = data.shape[0]
    num_tokens, num_topk = token_topk_to_pos.shape
    num_sf = width // num_per_channels
    if tuple(sf.shape) != (num_rows, num_sf):
        raise ValueError(f'{op}: x[1] (sf) must have shape ({num_rows}, {num_sf}), got {tuple(sf.shape)}')
    if grad_out.numel() != num_rows * hidden or grad_out.shape[-1] != hidden:
        raise ValueError(f'{op}: grad_out must have shape ({num_rows}, {hidden}), got {tuple(grad_out.shape)}')
    if tuple(weight.shape) != (num_tokens, num_topk):
        raise ValueError(f'{op}: weight must have the shape of token_topk_to_pos, ({num_tokens}, {num_topk}), got {tuple(weight.shape)}')
    _index_tensor(op, 'pos_to_token_topk', pos_to_token_topk, num_rows)
    device = _checks.on_one_cuda_device(op, data=data, sf=sf, grad_out=grad_out, weight=weight, pos_to_token_topk=pos_to_token_topk,
                                        token_topk_to_pos=token_topk_to_pos)
    if _index_checks.enabled:  # the kernel reads weight and writes weight_grad at these
        _index_checks.below(op, 'pos_to_token_topk', pos_to_token_topk, weight.numel(), what=f'the {weight.numel()} entries of weight')
    grad_out = grad_out.view(num_rows, hidden)
    for name, t in (('x[0] (data)', data), ('grad_out', grad_out)):
        if t.numel() and t.data_ptr() % 16:
            raise ValueError(f'{op}: {name}.data_ptr() must be 16-byte aligned, got {t.data_ptr():#x}')

    out = torch.empty((num_rows, hidden), dtype=torch.bfloat16, device=data.device)
    x_grad_fp8 = torch.empty((num_rows, width), dtype=torch.float8_e4m3fn, device=data.device)
    x_grad_sf = torch.empty((num_rows, num_sf), dtype=torch.float32, device=data.device)
    x_grad = torch.empty((num_rows, width), dtype=torch.bfloat16, device=data.device)
    weight_grad = torch.empty((num_tokens, num_topk), dtype=torch.float32, device=data.device)
    num_ctas = max(num_rows, num_tokens * num_topk)  # a CTA per row, and one per weight slot to zero
    if num_ctas:
        tensors = {'x': data, 'x_sf': sf, 'grad_out': grad_out, 'weight': weight.view(-1), 'pos_to_token_topk': pos_to_token_topk,
                   'token_topk_to_pos': token_topk_to_pos.view(-1), 'out': out, 'x_grad_fp8': x_grad_fp8, 'x_grad_sf': x_grad_sf,
                   'x_grad': x_grad, 'weight_grad': weight_grad.view(-1)}
        kernel = find_kernel('quant.swiglu_backward_and_per_token_cast', dict(grad_dtype='bfloat16'), device)
        # A CTA steps over a row, block[0] threads of thread_elements each a step.
        row_step = kernel.entry.launches[0].block[0] * kernel.entry.constants['thread_elements']
        scalars = dict(num_ctas=num_ctas, num_iters=-(-hidden // row_step), npc_log2=num_per_channels.bit_length() - 1,
                       round_sf=int(round_sf), use_clamp=int(clamp is not None), clamp_value=0.0 if clamp is None else clamp)
        kernel(device, tensors, scalars)
    return out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad
