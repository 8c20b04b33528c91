"""Engram on the GPU: hashing and the fused weight bit for bit, the gate forward and backward with upstream's
tolerances (calc_diff against torch's reference and its fp32 autograd), gradients that do not depend on the SM
count, strided k and v, poisoned outputs, and a few training steps through EngramGateFn."""

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import config
from tile_kernels_aot.modeling.engram import engram_gate
from tile_kernels_aot.reference import engram as ref

from .helpers import assert_bitwise_equal, calc_diff, installed_specs, installed_values, poison_allocator, sm_counts

pytestmark = pytest.mark.gpu

HC = 4
TOKENS = (0, 1, 4001, 8192)
EPS, CLAMP = 1e-20, 1e-6  # upstream's test values
UPSTREAM_TOKENS = 4001  # the fewest tokens upstream's tests run


def assert_within_one_bf16_ulp(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Every element of bfloat16 `actual` within one bfloat16 ulp of `expected` (8 significant bits: 2^-7 of its
    magnitude at most)."""
    a, e = actual.float(), expected.float()
    error = (a - e).abs()
    ulp = torch.ldexp(torch.ones_like(e), torch.frexp(e).exponent - 8)
    assert bool((error <= ulp).all()), f'{int((error > ulp).sum())} elements off by more than one bf16 ulp, up to {float(error.max()):.3g}'
ops = tile_kernels_aot.engram


def sms_to_try() -> list[int]:
    return sorted({1, 7, *sm_counts()})


def gate_data(num_tokens: int, hidden: int, strided: bool):
    """x, k, v, wh, we, grad_out as upstream's tests draw them; with `strided`, k and v are views into wider rows."""
    x = torch.randn(num_tokens, HC, hidden, dtype=torch.bfloat16, device='cuda')
    k = torch.randn(num_tokens, HC, hidden, dtype=torch.bfloat16, device='cuda')
    v = torch.randn(num_tokens, hidden, dtype=torch.bfloat16, device='cuda')
    if strided:
        k = torch.zeros(num_tokens, HC + 1, hidden + 64, dtype=torch.bfloat16, device='cuda')[:, 1:, 32:32 + hidden].copy_(k)
        v = torch.zeros(num_tokens, 2 * hidden + 8, dtype=torch.bfloat16, device='cuda')[:, 8:8 + hidden].copy_(v)
    wh = torch.randn(HC, hidden, dtype=torch.bfloat16, device='cuda')
    we = torch.randn(HC, hidden, dtype=torch.bfloat16, device='cuda')
    grad_out = torch.randn(num_tokens, HC, hidden, dtype=torch.bfloat16, device='cuda')
    return x, k, v, wh, we, grad_out


@pytest.mark.parametrize('num_tokens', TOKENS)
@pytest.mark.parametrize('spec', installed_specs('engram.engram_hash'))
def test_engram_hash_bitwise(spec, num_tokens):
    n, m, layers = spec['max_ngram_size'], spec['tables_per_ngram'], 2
    ids = torch.randint(0, 100_000, (num_tokens, n + 1), dtype=torch.int32, device='cuda')[:, 1:]  # strided rows
    multipliers = torch.randint(0, 100_000, (layers, n), dtype=torch.int64, device='cuda')
    vocab = torch.randint(100_000, 1_000_000, (layers, n - 1, m), dtype=torch.int32, device='cuda')
    offsets = ref.make_offsets(vocab)
    poison_allocator(((layers, num_tokens, (n - 1) * m), torch.int32))
    assert_bitwise_equal(ops.engram_hash(ids, multipliers, vocab, offsets), ref.engram_hash_ref(ids, multipliers, vocab, offsets))
    # Every int32 id and int64 multiplier: the products wrap and the hash goes negative, the modulus is floored.
    ids = torch.randint(-2**31, 2**31 - 1, (num_tokens, n), dtype=torch.int32, device='cuda')
    multipliers = torch.randint(-2**62, 2**62, (layers, n), dtype=torch.int64, device='cuda')
    assert_bitwise_equal(ops.engram_hash(ids, multipliers, vocab, offsets), ref.engram_hash_ref(ids, multipliers, vocab, offsets))


@pytest.mark.parametrize('hidden', installed_values('engram.engram_gate_bwd', 'hidden'))
def test_fused_weight_bitwise(hidden):
    _, _, _, wh, we, _ = gate_data(0, hidden, False)
    poison_allocator(((HC, hidden), torch.float32))
    assert_bitwise_equal(ops.fused_weight(wh, we), ref.fused_weight_ref(wh, we))


@pytest.mark.parametrize('strided', (False, True))
@pytest.mark.parametrize('num_tokens', TOKENS)
@pytest.mark.parametrize('spec', installed_specs('engram.engram_gate_fwd'))
def test_engram_gate_fwd(spec, num_tokens, strided, restore_num_sms):
    hidden, save = spec['hidden'], spec['save']
    x, k, v, wh, we, _ = gate_data(num_tokens, hidden, strided)
    expected = ref.engram_gate_ref(x, k, v, wh, we, CLAMP, EPS, save_for_backward=True)
    weight_fused = ops.fused_weight(wh, we)
    own_gate = ops.engram_gate_fwd(x, k, v, weight_fused, EPS, CLAMP, save_for_backward=True)[2]
    first = None
    for num_sms in sms_to_try():
        config.set_num_sms(num_sms)
        poison_allocator(((num_tokens, HC, hidden), torch.bfloat16), *[((num_tokens, HC), torch.float32)] * 4)
        got = ops.engram_gate_fwd(x, k, v, weight_fused, EPS, CLAMP, save_for_backward=save)
        assert got[0].shape == (num_tokens, HC, hidden) and got[0].dtype == torch.bfloat16
        if not save:
            assert got[1:] == (None,) * 4
        for name, a, b in zip(('out', 'dot', 'gate', 'rstd_x', 'rstd_k'), got, expected):
            if a is None or not num_tokens:
                continue
            if name == 'out' and num_tokens < UPSTREAM_TOKENS:
                # Upstream's bound holds over its 4001 and 8001 tokens; over one token's 4 x hidden values a single
                # bf16 rounding flip exceeds it. A small output is held instead to one bf16 ulp an element of the exact
                # x + gate * v (float64) with the kernel's own gate, which is held to upstream's bound against the
                # reference's. The kernel forms out with one fused multiply-add; where x and gate * v nearly cancel,
                # the reference's rounded product puts its out many ulps away from the exact value.
                exact = x.double() + own_gate.double().unsqueeze(-1) * v.double().unsqueeze(-2)
                assert_within_one_bf16_ulp(a, exact.bfloat16())
            else:
                assert calc_diff(a, b) < 2e-10, name
        if first is None:
            first = got
        for a, b in zip(got, first):
            if a is not None:
                assert_bitwise_equal(a, b)  # rows are independent of the grid


@pytest.mark.parametrize('strided', (False, True))
@pytest.mark.parametrize('num_tokens', TOKENS)
@pytest.mark.parametrize('hidden', installed_values('engram.engram_gate_bwd', 'hidden'))
def test_engram_gate_bwd(hidden, num_tokens, strided, restore_num_sms):
    x, k, v, wh, we, grad_out = gate_data(num_tokens, hidden, strided)
    leaves = [x.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_(),
              wh.float().requires_grad_(), we.float().requires_grad_()]
    out, dot, gate, rstd_x, rstd_k = ref.engram_gate_ref(*leaves, CLAMP, EPS, save_for_backward=True)
    out.backward(grad_out)
    saved = [t.detach() for t in (dot, gate, rstd_x, rstd_k)]
    weight_fused = ops.fused_weight(wh, we)
    first = None
    for num_sms in sms_to_try():
        config.set_num_sms(num_sms)
        poison_allocator(((num_tokens, HC, hidden), torch.bfloat16), ((num_tokens, HC, hidden), torch.bfloat16),
                         ((num_tokens, hidden), torch.bfloat16))
        grad_x, grad_k, grad_v, partial = ops.engram_gate_bwd(grad_out, x, k, v, weight_fused, *saved, CLAMP)
        grad_wh = torch.zeros(HC, hidden, device='cuda')
        grad_we = torch.zeros(HC, hidden, device='cuda')
        ops.grad_w_reduce(partial, wh, we, grad_wh, grad_we)
        got = (grad_x, grad_k, grad_v, grad_wh, grad_we)
        if num_tokens:
            for name, a, leaf in zip(('grad_x', 'grad_k', 'grad_v', 'grad_wh', 'grad_we'), got, leaves):
                assert calc_diff(a, leaf.grad) < 1e-8, name
        if first is None:
            first = got + (partial,)
        for a, b in zip(got + (partial,), first):
            assert_bitwise_equal(a, b)  # partials per token chunk: the SM count changes no bit


@pytest.mark.parametrize('num_partials', (0, 1, 7, 132, 257))
@pytest.mark.parametrize('hidden', installed_values('engram.engram_gate_bwd', 'hidden'))
def test_grad_w_reduce(hidden, num_partials):
    partial = torch.randn(num_partials, HC, hidden, device='cuda')
    wh = torch.randn(HC, hidden, dtype=torch.bfloat16, device='cuda')
    we = torch.randn(HC, hidden, dtype=torch.bfloat16, device='cuda')
    grad_wh, grad_we = torch.randn(HC, hidden, device='cuda'), torch.randn(HC, hidden, device='cuda')
    expected_wh, expected_we = grad_wh.clone(), grad_we.clone()
    ref.grad_w_reduce_ref(partial, wh, we, expected_wh, expected_we)
    ops.grad_w_reduce(partial, wh, we, grad_wh, grad_we)
    assert calc_diff(grad_wh, expected_wh) < 1e-10
    assert calc_diff(grad_we, expected_we) < 1e-10


class EngramBlock(torch.nn.Module):
    """A projection of embeddings into k and v, gated into x: the shape of an Engram layer."""

    def __init__(self, hidden: int, embed: int, gate):
        super().__init__()
        self.key = torch.nn.Linear(embed, HC * hidden, bias=False, dtype=torch.bfloat16, device='cuda')
        self.value = torch.nn.Linear(embed, hidden, bias=False, dtype=torch.bfloat16, device='cuda')
        self.weight_hidden = torch.nn.Parameter(torch.ones(HC, hidden, dtype=torch.bfloat16, device='cuda'))
        self.weight_embed = torch.nn.Parameter(torch.ones(HC, hidden, dtype=torch.bfloat16, device='cuda'))
        self.gate = gate

    def forward(self, x, embeddings):
        batch, seq = embeddings.shape[:2]
        k = self.key(embeddings).view(batch, seq, HC, -1)
        v = self.value(embeddings)
        return self.gate(x, k, v, self.weight_hidden, self.weight_embed, CLAMP, 1e-6)


def _reference_gate(x, k, v, wh, we, clamp_value, eps):
    hidden = x.shape[-1]
    out = ref.engram_gate_ref(x.reshape(-1, HC, hidden), k.reshape(-1, HC, hidden), v.reshape(-1, hidden), wh, we, clamp_value, eps)
    return out.view(x.shape)


@pytest.mark.parametrize('main_grad', (False, True))
@pytest.mark.parametrize('hidden', installed_values('engram.engram_gate_bwd', 'hidden'))
def test_training_steps_match_the_reference(hidden, main_grad):
    torch.manual_seed(0)
    ours, theirs = EngramBlock(hidden, 64, engram_gate), EngramBlock(hidden, 64, _reference_gate)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 33, HC, hidden, dtype=torch.bfloat16, device='cuda', requires_grad=True)
    embeddings = torch.randn(2, 33, 64, dtype=torch.bfloat16, device='cuda')
    if main_grad:
        for p in (ours.weight_hidden, ours.weight_embed):
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device='cuda')
    for step in range(3):
        losses, grads = [], []
        for model in (ours, theirs):
            model.zero_grad()
            x.grad = None
            loss = model(x, embeddings).float().square().mean()
            loss.backward()
            losses.append(loss.detach())
            grads.append([x.grad] + [p.grad for p in (model.key.weight, model.value.weight)])
        assert calc_diff(losses[0], losses[1]) < 1e-8, step
        for a, b in zip(*grads):
            assert calc_diff(a, b) < 1e-6, step
        weight_grads = [(p.main_grad if main_grad else p.grad).float() for p in (ours.weight_hidden, ours.weight_embed)]
        if main_grad:
            assert ours.weight_hidden.grad is None and ours.weight_embed.grad is None
        for a, p in zip(weight_grads, (theirs.weight_hidden, theirs.weight_embed)):
            # main_grad is float32, the reference's gradient bf16 as its weight: compared at the reference's precision
            assert calc_diff(a.to(p.grad.dtype), p.grad) < 1e-6, step
        with torch.no_grad():  # plain SGD; main_grad, where present, holds the weights' gradients
            for model in (ours, theirs):
                for p in model.parameters():
                    p -= 0.5 * getattr(p, 'main_grad', p.grad).to(p.dtype)
            for p in (ours.weight_hidden, ours.weight_embed):
                if main_grad:
                    p.main_grad.zero_()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert calc_diff(a, b) < 1e-6
