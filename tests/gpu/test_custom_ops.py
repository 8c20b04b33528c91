"""torch.library.opcheck of every custom op on representative inputs (tests/fixtures/custom_ops.py): the schema's
mutation and alias declarations, the fake implementation against the real outputs (shapes, dtypes, strides) and the op
under AOTAutograd with dynamic shapes."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

from tests.fixtures.custom_ops import CASES, OpCalls

pytestmark = pytest.mark.gpu


def _cuda(args):
    return pytree.tree_map_only(torch.Tensor, lambda t: t.cuda(), args)


@pytest.mark.parametrize('case', CASES, ids=lambda c: c.name)
def test_opcheck(case):
    args = _cuda(case.args(case.tokens[0]))
    with OpCalls() as recorded:
        case.op(*args)
    assert len(recorded.calls) == 1
    func, op_args, op_kwargs = recorded.calls[0]
    torch.library.opcheck(func, op_args, op_kwargs)

