"""torch.library.opcheck of every custom op on representative inputs (tests/fixtures/custom_ops.py): the schema's
mutation and alias declarations, the fake implementation against the real outputs (shapes, dtypes, strides) and the op
under AOTAutograd with dynamic shapes."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

from tests.fixtures.custom_ops import CASES, OpCalls

pytestmark = pytest.mark.gpu

_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu}


def _allclose_with_float8(allclose):
    """torch.allclose, comparing float8 tensors bit for bit: opcheck's test_schema (SchemaCheckMode) compares each input
    before and after the call with torch.allclose, which has no float8 kernel."""
    def compare(lhs, rhs, *args, **kwargs):
        if lhs.dtype in _FLOAT8 or rhs.dtype in _FLOAT8:
            return lhs.dtype == rhs.dtype and lhs.shape == rhs.shape and torch.equal(lhs.view(torch.uint8), rhs.view(torch.uint8))
        return allclose(lhs, rhs, *args, **kwargs)
    return compare


def _cuda(args):
    return pytree.tree_map_only(torch.Tensor, lambda t: t.cuda(), args)


@pytest.mark.parametrize('case', CASES, ids=lambda c: c.name)
def test_opcheck(case, monkeypatch):
    monkeypatch.setattr(torch, 'allclose', _allclose_with_float8(torch.allclose))
    args = _cuda(case.args(case.tokens[0]))
    with OpCalls() as recorded:
        case.op(*args)
    assert len(recorded.calls) == 1
    func, op_args, op_kwargs = recorded.calls[0]
    torch.library.opcheck(func, op_args, op_kwargs)

