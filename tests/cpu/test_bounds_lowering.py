"""Every kernel that reads an index, a position or a count from a tensor, and every gating kernel, lowers with its
device-side check (kernel_src/bounds.py): an assert, or for the SwiGLU forward the predicated trap, on the bound the
README's table names (tilelang, no GPU, one spec of each on one target)."""

from __future__ import annotations

import re

import pytest

from kernel_src.decl import ARCHS
from kernel_src.registry import DECLS

pytestmark = pytest.mark.build

# kernel -> a pattern the lowered source must hold: the check and the bound it compares with.
CHECKS = {
    'moe.topk_gate': r'device_assert\(.*isfinite',
    'moe.topk_sum_and_topk_group_idx': r'device_assert\(.*isfinite',
    'moe.top2_sum_gate': r'device_assert\(.*isfinite[\s\S]*device_assert\(.*winner[\s\S]*device_assert\(.*num_replicas',
    'moe.group_count': r'device_assert\(.*num_bins',
    'moe.aux_fi': r'device_assert\(.*num_bins',
    'moe.inplace_unique_group_indices': r'device_assert\(.*num_groups',
    'moe.get_fused_mapping': r'device_assert\(.*num_experts',
    'moe.expand_to_fused': r'device_assert\(.*num_expanded_tokens',
    'moe.reduce_fused': r'device_assert\(.*num_expanded_tokens',
    'quant.per_channel_cast_fused': r'device_assert\(.*num_tokens',
    'quant.swiglu_forward_and_per_token_cast': r'tk_trap_unless\(.*num_weights',
    'quant.swiglu_backward_and_per_token_cast': r'device_assert\(.*num_weights',
    'engram.engram_hash': r'device_assert\(.*vocab_sizes',
}


def _spec(kernel: str) -> dict:
    specs = list(DECLS[kernel].prebuilt())
    if kernel == 'quant.per_channel_cast_fused':  # the gather reads the positions
        specs = [s for s in specs if s.get('gather')]
    return specs[0]


@pytest.mark.parametrize('kernel', sorted(CHECKS))
def test_the_kernel_checks_what_it_reads(kernel):
    pytest.importorskip('tilelang')
    from build_tools.lower import lower

    source = lower(DECLS[kernel], _spec(kernel), ARCHS[0]).source
    assert re.search(CHECKS[kernel], source), f'{kernel}: no {CHECKS[kernel]!r} in the lowered source'
