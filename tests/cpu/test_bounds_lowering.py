"""Every kernel that reads an index, a position or a count from a tensor, and every gating kernel, lowers with its
device-side check (kernel_src/bounds.py): an assert, or where the README's table says so a predicated trap, on the
bound the table names; kernels whose warps shuffle check after the last shuffle; inplace_unique_group_indices, which
only compares its values, checks none (tilelang, no GPU, one spec of each on one target)."""

from __future__ import annotations

import re

import pytest

from kernel_src.decl import ARCHS
from kernel_src.registry import DECLS

pytestmark = pytest.mark.build

# kernel -> the bounds (patterns) the lowered source compares with, each before a check or inside one.
CHECKS = {
    'moe.topk_gate': [r'values\[\w+\] != values'],  # isnan(x) lowers to x != x
    'moe.topk_sum_and_topk_group_idx': ['isfinite'],
    'moe.top2_sum_gate': ['isfinite', r'winner\[0\] < ', 'replicas <= num_replicas'],
    'moe.group_count': ['num_bins'],
    'moe.aux_fi': ['num_bins'],
    'moe.get_fused_mapping': ['num_experts'],
    'moe.expand_to_fused': ['num_expanded_tokens'],
    'moe.reduce_fused': ['num_expanded_tokens'],
    'quant.per_channel_cast_fused': ['num_tokens'],
    'quant.swiglu_forward_and_per_token_cast': ['num_weights'],
    'quant.swiglu_backward_and_per_token_cast': ['num_weights'],
    'engram.engram_hash': ['vocab_sizes'],
}
CHECK = r'(?:device_assert|tk_trap_unless)\('


def checked(source: str, bound: str) -> bool:
    """Some check compares with `bound` itself, or tests a flag that an assignment compares with it."""
    for check in re.finditer(rf'{CHECK}(.*)\);', source):
        if re.search(bound, check[1]):
            return True
        for flag in set(re.findall(r'[A-Za-z_]\w*', check[1])):
            if re.search(rf'\b{flag}\b(\[0\])? = .*{bound}', source):
                return True
    return False


def _spec(kernel: str) -> dict:
    specs = list(DECLS[kernel].prebuilt())
    if kernel == 'quant.per_channel_cast_fused':  # the gather reads the positions
        specs = [s for s in specs if s.get('gather')]
    return specs[0]


@pytest.mark.parametrize('kernel', sorted(CHECKS))
def test_the_kernel_checks_what_it_reads(kernel):
    pytest.importorskip('tilelang')
    from build_tools.lower import lower

    body = lower(DECLS[kernel], _spec(kernel), ARCHS[0]).source.split('extern "C" __global__')[-1]
    for bound in CHECKS[kernel]:
        assert checked(body, bound), f'{kernel}: no check of {bound!r} in the lowered kernel'


def test_the_fp32_swiglu_forward_asserts_after_its_loop():
    pytest.importorskip('tilelang')
    from build_tools.lower import lower

    spec = {'in_dtype': 'float32', 'sf_format': 'f32', 'per_row': False, 'row_threads': 0}
    source = lower(DECLS['quant.swiglu_forward_and_per_token_cast'], spec, ARCHS[0]).source
    assert 'tk_trap_unless' not in source.split('extern "C" __global__')[-1]
    assert re.search(r'indices_ok\[0\] = .*num_weights', source) and re.search(r'device_assert\(.*indices_ok', source)


@pytest.mark.parametrize('kernel', ['moe.topk_gate', 'moe.topk_sum_and_topk_group_idx', 'moe.top2_sum_gate',
                                    'quant.swiglu_backward_and_per_token_cast'])
def test_the_check_comes_after_the_last_shuffle(kernel):
    pytest.importorskip('tilelang')
    from build_tools.lower import lower

    body = lower(DECLS[kernel], _spec(kernel), ARCHS[0]).source.split('extern "C" __global__')[-1]
    assert max(body.rfind('device_assert('), body.rfind('tk_trap_unless(')) > body.rfind('__shfl'), f'{kernel}: a check before a shuffle'


def test_the_counting_and_gating_kernels_trap_and_inplace_unique_checks_nothing():
    pytest.importorskip('tilelang')
    from build_tools.lower import lower

    for kernel in ('moe.topk_gate', 'moe.topk_sum_and_topk_group_idx', 'moe.top2_sum_gate', 'moe.group_count', 'moe.aux_fi'):
        body = lower(DECLS[kernel], _spec(kernel), ARCHS[0]).source.split('extern "C" __global__')[-1]
        assert 'tk_trap_unless(' in body and 'device_assert(' not in body, kernel
    body = lower(DECLS['moe.inplace_unique_group_indices'], _spec('moe.inplace_unique_group_indices'), ARCHS[0]).source
    assert not re.search(CHECK, body.split('extern "C" __global__')[-1])
