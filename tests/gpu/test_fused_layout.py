"""The fused (expert-major) layout ops: get_fused_mapping against upstream's structural checks and, bit
for bit, against the reference's stable order for several SM counts; expand_to_fused(_with_sf) and
reduce_fused bit for bit against their references, for every installed spec."""

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import config, reference

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, installed_specs, poison_allocator, sm_counts
from .test_moe_routing import ROUTING, routing_indices

pytestmark = pytest.mark.gpu

ELEM_DTYPES = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}


def check_structure(outputs, topk_idx: torch.Tensor, num_experts: int, alignment: int) -> None:
    """Upstream's test_get_fused_mapping checks, vectorised."""
    p2e, p2t, p2tk, t2p, start, end, aligned, as_list = outputs
    num_topk = topk_idx.shape[1]
    counts = torch.bincount(topk_idx[topk_idx >= 0].flatten(), minlength=num_experts)
    assert aligned.tolist() == as_list
    assert torch.equal(aligned.long(), (counts + alignment - 1) // alignment * alignment)
    assert torch.equal(start.long(), torch.cumsum(aligned.long(), 0) - aligned.long())
    assert torch.equal(end, start + aligned)
    assert p2e.numel() == sum(as_list)
    seg_of_pos = torch.repeat_interleave(torch.arange(num_experts, device='cuda'), aligned.long())
    assert torch.equal(p2e[p2e >= 0].long(), seg_of_pos[p2e >= 0])  # every routed position in its expert's segment
    assert torch.equal(torch.bincount(p2e[p2e >= 0].long(), minlength=num_experts), counts)
    routed = p2e >= 0
    flat = p2tk[routed].long()
    assert torch.equal(t2p.flatten()[flat].long(), torch.arange(p2e.numel(), device='cuda')[routed])
    assert torch.equal(topk_idx.flatten()[flat], p2e[routed].to(topk_idx.dtype))
    assert torch.equal(flat // num_topk, p2t[routed].long())
    assert torch.equal(~routed, p2t < 0) and torch.equal(~routed, p2tk < 0)
    assert torch.equal(t2p < 0, topk_idx < 0)


def assert_mapping_equal(actual, expected) -> None:
    for a, e in zip(actual[:7], expected[:7]):
        assert_bitwise_equal(a, e)
    assert actual[7] == expected[7]


@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('num_topk, num_experts, num_ep_ranks', ROUTING)
@pytest.mark.parametrize('alignment', (1, 64, 128))
def test_get_fused_mapping(num_tokens, num_topk, num_experts, num_ep_ranks, alignment, restore_num_sms):
    idx = routing_indices(num_tokens, num_topk, num_experts, num_ep_ranks)
    expected = reference.get_fused_mapping(idx, num_experts, 0, alignment)
    for sms in sm_counts():
        config.set_num_sms(sms)
        bound = reference.fused_num_expanded_tokens(idx.shape[0], num_topk, num_experts, alignment)
        poison_allocator(*[((bound,), torch.int32)] * 3, ((idx.shape[0], num_topk), torch.int32), *[((num_experts,), torch.int32)] * 3)
        out = tile_kernels_aot.moe.get_fused_mapping(idx, num_experts, 0, alignment)
        check_structure(out, idx, num_experts, alignment)
        assert_mapping_equal(out, expected)  # the order within a segment is flat order, whatever the grid


@pytest.mark.parametrize('num_tokens', (1, 4001))
def test_get_fused_mapping_sizes_and_index_layouts(num_tokens, restore_num_sms):
    idx = routing_indices(num_tokens, 8, 32, 8)
    rows = idx.shape[0]
    bound = reference.fused_num_expanded_tokens(rows, 8, 32, 16)
    # No sync: bound-sized outputs, -1 past the used positions, no list.
    out = tile_kernels_aot.moe.get_fused_mapping(idx, 32, 0, 16, force_no_sync=True)
    assert out[0].shape == (bound,) and out[7] == []
    assert_mapping_equal(out, reference.get_fused_mapping(idx, 32, 0, 16, force_no_sync=True))
    # An explicit size larger than needed.
    out = tile_kernels_aot.moe.get_fused_mapping(idx, 32, bound + 1000, 16)
    assert_mapping_equal(out, reference.get_fused_mapping(idx, 32, bound + 1000, 16))
    # int32 indices with a row stride.
    wide = torch.full((rows, 11), -1, dtype=torch.int32, device='cuda')
    wide[:, 2:10] = idx
    expected = reference.get_fused_mapping(idx, 32, 0, 16)
    for sms in (1, 7):
        config.set_num_sms(sms)
        assert_mapping_equal(tile_kernels_aot.moe.get_fused_mapping(wide[:, 2:10], 32, 0, 16), expected)


def _mapping(num_tokens: int, num_topk: int, num_experts: int, alignment: int):
    idx = routing_indices(num_tokens, num_topk, num_experts, 8)
    p2e, _, _, t2p, *_ = tile_kernels_aot.moe.get_fused_mapping(idx, num_experts, 0, alignment)
    return idx.shape[0], p2e, t2p


ELEM_SIZE = {torch.float8_e4m3fn: 1, torch.bfloat16: 2, torch.float32: 4}


def _rows(num_tokens: int, hidden: int, dtype: torch.dtype, aligned: bool) -> torch.Tensor:
    """Random bits (NaN patterns included: the copy must keep them); for the unaligned spec a view one
    element off a 16-byte boundary whose row stride is not a multiple of 16 bytes either."""
    size = ELEM_SIZE[dtype]
    wide = torch.randint(0, 256, (num_tokens, (hidden + 9) * size), dtype=torch.uint8, device='cuda').view(dtype)
    return wide[:, :hidden].contiguous() if aligned else wide[:, 1:hidden + 1]


@pytest.mark.parametrize('spec', installed_specs('moe.expand_to_fused'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('num_topk, num_experts', [(8, 256), (6, 9), (2, 32)])
def test_expand_to_fused(spec, num_tokens, num_topk, num_experts):
    dtype = ELEM_DTYPES[spec['elem_bytes']]
    for hidden in ((576, 2880, 7168) if spec['aligned'] else (7168, 2879)):
        rows, p2e, t2p = _mapping(num_tokens, num_topk, num_experts, 16)
        x = _rows(rows, hidden, dtype, spec['aligned'])
        poison_allocator(((p2e.shape[0], hidden), dtype))
        out = tile_kernels_aot.moe.expand_to_fused(x, t2p, p2e)
        assert_bitwise_equal(out, reference.expand_to_fused(x, t2p, p2e))


@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('hidden', (576, 2048, 7168))
@pytest.mark.parametrize('num_per_channels', (32, 128))
@pytest.mark.parametrize('col_major, packed', [(False, False), (True, False), (True, True)])
def test_expand_to_fused_with_sf(num_tokens, hidden, num_per_channels, col_major, packed):
    rows, p2e, t2p = _mapping(num_tokens, 8, 64, 16)
    x = _rows(rows, hidden, torch.float8_e4m3fn, True)
    hidden_sf = -(-hidden // num_per_channels)
    if packed:
        sf = torch.randint(-2**31, 2**31 - 1, (rows, -(-hidden_sf // 4)), dtype=torch.int32, device='cuda')
    else:
        sf = torch.rand(rows, hidden_sf, device='cuda') * 2.0 ** torch.randint(-20, 20, (rows, hidden_sf), device='cuda')
    n = p2e.shape[0]
    poison_allocator(((n, hidden), torch.float8_e4m3fn), ((sf.shape[1], n + 3), sf.dtype))
    out, out_sf = tile_kernels_aot.moe.expand_to_fused_with_sf((x, sf), num_per_channels, t2p, p2e, col_major)
    ref, ref_sf = reference.expand_to_fused_with_sf((x, sf), num_per_channels, t2p, p2e, col_major)
    assert_bitwise_equal(out, ref)
    assert_bitwise_equal(out_sf, ref_sf)
    assert out_sf.stride() == ref_sf.stride()  # upstream's layout, also for a dimension of size 1


def _padded_rows(n: int, hidden: int, dtype: torch.dtype, p2e: torch.Tensor, row_pad: int) -> torch.Tensor:
    """Expanded rows with NaN in the padding rows, which reduce_fused must never read."""
    x = torch.randn(n, hidden + row_pad, device='cuda').to(dtype)[:, :hidden]
    x[p2e < 0] = float('nan')
    return x


@pytest.mark.alone  # about 80k expanded rows of 7168 floats, several copies: beside other workers it runs out of memory
@pytest.mark.parametrize('spec', installed_specs('moe.reduce_fused'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('num_topk', (6, 8, 9))
def test_reduce_fused(spec, num_tokens, num_topk):
    in_dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[spec['in_dtype']]
    fp8_format = '' if spec['out_dtype'] == 'same' else 'e4m3'
    rows, p2e, t2p = _mapping(num_tokens, num_topk, 72, 128)
    n = p2e.shape[0]
    for hidden, row_pad in ((7168, 0), (2048, 64), (576, 0)):
        x = _padded_rows(n, hidden, in_dtype, p2e, row_pad)
        x_sf = torch.randn(n, device='cuda')
        weights = torch.rand(rows, num_topk, device='cuda')
        for with_weights in (True, False):
            for with_x_sf in (True, False):
                for sf in ((None, torch.randn(1, device='cuda')) if fp8_format else (None,)):
                    args = ((x, x_sf) if with_x_sf else x, weights if with_weights else None, t2p, fp8_format, sf)
                    expected = reference.reduce_fused(*args)
                    poison_allocator(((rows, hidden), expected.dtype))
                    assert_bitwise_equal(tile_kernels_aot.moe.reduce_fused(*args), expected)
                    out = torch.empty_like(expected)
                    assert tile_kernels_aot.moe.reduce_fused(*args, out=out) is out
                    assert_bitwise_equal(out, expected)


def test_reduce_fused_fp8_saturates():
    t2p = torch.tensor([[0, 1]], dtype=torch.int32, device='cuda')
    x = torch.tensor([[300.0] * 8 + [-300.0] * 8, [300.0] * 16], device='cuda').bfloat16()
    out = tile_kernels_aot.moe.reduce_fused(x, None, t2p, 'e4m3')
    assert out.float().tolist() == [[448.0] * 8 + [0.0] * 8]
    assert_bitwise_equal(out, reference.reduce_fused(x, None, t2p, 'e4m3'))


def test_round_trip_through_fused_layout():
    """expand then reduce without weights gives back x times the number of routed slots."""
    rows, p2e, t2p = _mapping(4001, 8, 64, 128)
    x = torch.randint(-1000, 1000, (rows, 2048), device='cuda').float()  # small integers: every sum is exact
    expanded = tile_kernels_aot.moe.expand_to_fused(x, t2p, p2e)
    back = tile_kernels_aot.moe.reduce_fused(expanded, None, t2p)
    assert torch.equal(back, x * (t2p >= 0).sum(1, keepdim=True).float())


def test_fused_layout_ops_reject_bad_input():
    idx = torch.zeros(4, 8, dtype=torch.int64, device='cuda')
    moe = tile_kernels_aot.moe
    with pytest.raises(ValueError, match='num_experts must be in \\[1, 1024\\]'):
        moe.get_fused_mapping(idx, 2000, 0, 128)
    with pytest.raises(ValueError, match='alignment must be'):
        moe.get_fused_mapping(idx, 8, 0, 0)
    with pytest.raises(ValueError, match='num_expanded_tokens must be'):
        moe.get_fused_mapping(idx, 8, -1, 16)
    with pytest.raises(TypeError, match='int64 or int32'):
        moe.get_fused_mapping(idx.float(), 8, 0, 16)
    with pytest.raises(ValueError, match='contiguous in its last dimension'):
        moe.get_fused_mapping(idx.t(), 8, 0, 16)
    with pytest.raises(ValueError, match='CUDA'):
        moe.get_fused_mapping(idx.cpu(), 8, 0, 16)
    p2e, _, _, t2p, *_ = moe.get_fused_mapping(idx, 8, 0, 16)
    x = torch.randn(4, 256, device='cuda')
    with pytest.raises(ValueError, match='token_topk_to_pos has 3 rows'):
        moe.expand_to_fused(x, t2p[:3], p2e)
    with pytest.raises(TypeError, match='token_topk_to_pos must be int32'):
        moe.expand_to_fused(x, t2p.long(), p2e)
    with pytest.raises(TypeError, match='1-, 2- or 4-byte'):
        moe.expand_to_fused(x.double(), t2p, p2e)
    with pytest.raises(ValueError, match='num_topk must be at most 64'):
        moe.expand_to_fused(x, torch.zeros(4, 65, dtype=torch.int32, device='cuda'), p2e)
    fp8 = x.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match='num_per_channels must be 32 or 128'):
        moe.expand_to_fused_with_sf((fp8, torch.ones(4, 4, device='cuda')), 64, t2p, p2e)
    with pytest.raises(ValueError, match='sf must have shape \\(4, 2\\)'):
        moe.expand_to_fused_with_sf((fp8, torch.ones(4, 4, device='cuda')), 128, t2p, p2e)
    with pytest.raises(ValueError, match='packed UE8M0'):
        moe.expand_to_fused_with_sf((fp8, torch.ones(4, 1, dtype=torch.int32, device='cuda')), 128, t2p, p2e)
    with pytest.raises(ValueError, match='must be contiguous'):
        moe.expand_to_fused_with_sf((fp8, torch.ones(2, 4, device='cuda').t()), 128, t2p, p2e)
    expanded = torch.randn(p2e.shape[0], 256, device='cuda')
    with pytest.raises(ValueError, match='sf is only for fp8 output'):
        moe.reduce_fused(expanded, None, t2p, '', torch.ones(1, device='cuda'))
    with pytest.raises(ValueError, match="fp8_format must be '' or 'e4m3'"):
        moe.reduce_fused(expanded, None, t2p, 'e5m2')
    with pytest.raises(ValueError, match='topk_weights must have shape'):
        moe.reduce_fused(expanded, torch.ones(4, 7, device='cuda'), t2p)
    with pytest.raises(ValueError, match='x_sf must have'):
        moe.reduce_fused((expanded, torch.ones(3, device='cuda')), None, t2p)
    with pytest.raises(ValueError, match='hidden must be a multiple of 4'):
        moe.reduce_fused(expanded[:, :255], None, t2p)
    with pytest.raises(ValueError, match='16-byte boundaries'):
        moe.reduce_fused(expanded[:, 1:253], None, t2p)
    with pytest.raises(TypeError, match='out must be float8_e4m3fn'):
        moe.reduce_fused(expanded, None, t2p, 'e4m3', out=torch.empty(4, 256, device='cuda'))
    with pytest.raises(ValueError, match='out must have shape'):
        moe.reduce_fused(expanded, None, t2p, out=torch.empty(4, 128, device='cuda'))
