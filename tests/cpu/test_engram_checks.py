"""Engram on CPU: the references against a float64 (or Python-integer) formulation, the backward formulas the
kernel implements against autograd of the reference, and every op's argument checks (CPU tensors: each check
fires before a device is touched)."""

from __future__ import annotations

import json
import types

import pytest
import torch

from tile_kernels_aot import _checks, _select, engram
from tile_kernels_aot.errors import SpecNotPrebuiltError
from tile_kernels_aot.reference import engram as ref

HC, H, T = 4, 256, 6


# --- references ---------------------------------------------------------------------------------------------------

def _wrap64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


def _wrap32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


def test_hash_ref_matches_python_integers():
    gen = torch.Generator().manual_seed(0)
    num_tokens, n, layers, m = 37, 3, 2, 5
    ids = torch.randint(-2**31, 2**31 - 1, (num_tokens, n), dtype=torch.int32, generator=gen)
    ids[:8] = torch.randint(0, 100_000, (8, n), dtype=torch.int32, generator=gen)
    multipliers = torch.randint(-2**62, 2**62, (layers, n), dtype=torch.int64, generator=gen)
    vocab = torch.randint(1, 1_000_000, (layers, n - 1, m), dtype=torch.int32, generator=gen)
    vocab[0, 0, 0] = -7  # a negative modulus: the result takes its sign, as torch's remainder
    offsets = ref.make_offsets(vocab)
    out = ref.engram_hash_ref(ids, multipliers, vocab, offsets)
    assert out.dtype == torch.int32 and out.shape == (layers, num_tokens, (n - 1) * m)
    for layer in range(layers):
        flat = vocab[layer].flatten().tolist()
        assert offsets[layer].tolist() == [_wrap32(sum(flat[:j])) for j in range(len(flat))]
        for t in range(num_tokens):
            mixed = _wrap64(int(ids[t, 0]) * int(multipliers[layer, 0]))
            for i in range(1, n):
                mixed = _wrap64(mixed ^ _wrap64(int(ids[t, i]) * int(multipliers[layer, i])))
                for j in range(m):
                    expected = _wrap32(mixed % int(vocab[layer, i - 1, j]) + int(offsets[layer, (i - 1) * m + j]))
                    assert int(out[layer, t, (i - 1) * m + j]) == expected


def _gate_inputs(seed=0, num_tokens=T, hidden=H):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, HC, hidden, generator=gen).bfloat16()
    k = torch.randn(num_tokens, HC, hidden, generator=gen).bfloat16()
    v = torch.randn(num_tokens, hidden, generator=gen).bfloat16()
    wh = torch.randn(HC, hidden, generator=gen).bfloat16()
    we = torch.randn(HC, hidden, generator=gen).bfloat16()
    return x, k, v, wh, we


def _gate_f64(x, k, v, wh, we, clamp_value, eps):
    x, k, v, wh, we = (t.double() for t in (x, k, v, wh, we))
    hidden = x.shape[-1]
    rstd_x = (x.square().mean(-1) + eps).rsqrt()
    rstd_k = (k.square().mean(-1) + eps).rsqrt()
    dot = (x * wh * k * we).sum(-1)
    s = dot * rstd_x * rstd_k / hidden**0.5
    gate = torch.sigmoid(torch.sign(s) * s.abs().clamp_min(clamp_value).sqrt())
    return x + gate.unsqueeze(-1) * v.unsqueeze(-2), dot, gate, rstd_x, rstd_k


@pytest.mark.parametrize('eps, clamp_value', [(1e-20, 1e-6), (1e-6, 0.5)])
def test_gate_ref_matches_float64(eps, clamp_value):
    inputs = _gate_inputs()
    out, dot, gate, rstd_x, rstd_k = ref.engram_gate_ref(*inputs, clamp_value, eps, save_for_backward=True)
    expected = _gate_f64(*inputs, clamp_value, eps)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected[0], rtol=2**-8, atol=2**-8)
    for got, want in zip((dot, gate, rstd_x, rstd_k), expected[1:]):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(ref.engram_gate_ref(*inputs, clamp_value, eps), out)


def test_gate_at_zero_dot_is_one_half():
    x, k, v, wh, we = _gate_inputs()
    _, dot, gate, _, _ = ref.engram_gate_ref(x, k, v, torch.zeros_like(wh), we, 1e-6, 1e-20, save_for_backward=True)
    assert torch.all(dot == 0) and torch.all(gate == 0.5)


def _bwd_formulas(grad_out, x, k, v, wf, dot, gate, rstd_x, rstd_k, clamp_value):
    """The backward engram_gate_bwd computes (kernel_src/engram/gate_bwd.py), in float64."""
    grad_out, x, k, v, wf, dot, gate, rstd_x, rstd_k = (t.double() for t in (grad_out, x, k, v, wf, dot, gate, rstd_x, rstd_k))
    hidden = x.shape[-1]
    c = rstd_x * rstd_k / hidden**0.5
    g = (grad_out * v.unsqueeze(1)).sum(-1)
    d = torch.where(dot.abs() * c < clamp_value, 0.0, g * gate * (1 - gate) * 0.5 * (c / dot.abs()).sqrt()).unsqueeze(-1)
    grad_x = grad_out + d * (k * wf - x * (dot * rstd_x**2 / hidden).unsqueeze(-1))
    grad_k = d * (x * wf - k * (dot * rstd_k**2 / hidden).unsqueeze(-1))
    grad_v = (grad_out * gate.unsqueeze(-1)).sum(1)
    grad_w = (d * x * k).sum(0)
    return grad_x, grad_k, grad_v, grad_w


@pytest.mark.parametrize('clamp_value', [1e-6, 0.3])
def test_backward_formulas_match_autograd_of_ref(clamp_value):
    eps = 1e-20
    x, k, v, wh, we = _gate_inputs(seed=1, num_tokens=16)
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).bfloat16()
    leaves = [x.double().requires_grad_(), k.double().requires_grad_(), v.double().requires_grad_(),
              wh.double().requires_grad_(), we.double().requires_grad_()]
    out, dot, gate, rstd_x, rstd_k = _gate_f64(*leaves, clamp_value, eps)
    out.backward(grad_out.double())
    wf = ref.fused_weight_ref(wh, we)
    grad_x, grad_k, grad_v, grad_w = _bwd_formulas(grad_out, x, k, v, wf, dot.detach(), gate.detach(), rstd_x.detach(),
                                                   rstd_k.detach(), clamp_value)
    for got, leaf in ((grad_x, leaves[0]), (grad_k, leaves[1]), (grad_v, leaves[2]),
                      (grad_w * we.double(), leaves[3]), (grad_w * wh.double(), leaves[4])):
        torch.testing.assert_close(got, leaf.grad, rtol=1e-9, atol=1e-9)
    # The fp32 autograd of the reference (the GPU tests' oracle) agrees too.
    fp32 = [x.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_(),
            wh.float().requires_grad_(), we.float().requires_grad_()]
    ref.engram_gate_ref(*fp32, clamp_value, eps).backward(grad_out)
    torch.testing.assert_close(fp32[3].grad.double(), leaves[3].grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(fp32[0].grad.double(), leaves[0].grad, rtol=2**-7, atol=2**-7)


def test_fused_weight_and_grad_w_reduce_refs():
    _, _, _, wh, we = _gate_inputs()
    assert torch.equal(ref.fused_weight_ref(wh, we).double(), wh.double() * we.double())  # exact in fp32
    partial = torch.randn(5, HC, H, generator=torch.Generator().manual_seed(3))
    gwh, gwe = torch.randn(HC, H), torch.randn(HC, H)
    expected_h = gwh.double() + partial.double().sum(0) * we.double()
    expected_e = gwe.double() + partial.double().sum(0) * wh.double()
    ref.grad_w_reduce_ref(partial, wh, we, gwh, gwe)
    torch.testing.assert_close(gwh.double(), expected_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gwe.double(), expected_e, rtol=1e-5, atol=1e-5)


def test_upstream_module_names():
    import tile_kernels_aot.torch.engram as upstream_name

    assert upstream_name.engram_gate_ref is ref.engram_gate_ref and upstream_name.make_offsets is ref.make_offsets
    from tile_kernels_aot.modeling.engram import EngramGateFn, engram_gate

    assert engram_gate == EngramGateFn.apply


def test_partial_tokens_depend_on_the_token_count_alone():
    assert engram.partial_tokens(1, 128, 32) == 1
    assert engram.partial_tokens(4001, 128, 32) == 32
    assert engram.partial_tokens(1000, 128, 32) == 8
    assert all(-(-t // engram.partial_tokens(t, 128, 32)) <= max(128, -(-t // 32)) for t in range(1, 5000, 7))


# --- argument checks ------------------------------------------------------------------------------------------------

def _hash_args(num_tokens=T, n=3, layers=2, m=8):
    vocab = torch.full((layers, n - 1, m), 1000, dtype=torch.int32)
    return [torch.zeros(num_tokens, n, dtype=torch.int32), torch.ones(layers, n, dtype=torch.int64), vocab, ref.make_offsets(vocab)]


def _fwd_args(num_tokens=T, hidden=H):
    x, k, v, wh, we = _gate_inputs(num_tokens=num_tokens, hidden=hidden)
    return [x, k, v, ref.fused_weight_ref(wh, we), 1e-20, 1e-6]


def _bwd_args(num_tokens=T, hidden=H):
    x, k, v, wf = _fwd_args(num_tokens, hidden)[:4]
    saved = [torch.zeros(num_tokens, HC) for _ in range(4)]
    return [x.clone(), x, k, v, wf, *saved, 1e-6]


def _reduce_args(hidden=H):
    _, _, _, wh, we = _gate_inputs(hidden=hidden)
    return [torch.zeros(3, HC, hidden), wh, we, torch.zeros(HC, hidden), torch.zeros(HC, hidden)]


def _misaligned(t):
    """t's values one element into a fresh buffer: a data pointer off the 16-byte grid."""
    return torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape).copy_(t)


OPS = {
    'engram_hash': (engram.engram_hash, _hash_args),
    'fused_weight': (engram.fused_weight, lambda: list(_gate_inputs()[3:])),
    'engram_gate_fwd': (engram.engram_gate_fwd, _fwd_args),
    'engram_gate_bwd': (engram.engram_gate_bwd, _bwd_args),
    'grad_w_reduce': (engram.grad_w_reduce, _reduce_args),
}


def _bad(index, value):
    return lambda args: args.__setitem__(index, value(args[index]) if callable(value) else value)


CASES = [
    # (op, change to the good arguments, error type, words the message names)
    ('engram_hash', _bad(0, lambda t: t.long()), TypeError, 'ngram_token_ids'),
    ('engram_hash', _bad(0, lambda t: t[:, :1]), ValueError, 'max_ngram_size'),
    ('engram_hash', _bad(1, lambda t: t.int()), TypeError, 'multipliers'),
    ('engram_hash', _bad(1, lambda t: t[:, :2]), ValueError, 'multipliers'),
    ('engram_hash', _bad(2, lambda t: t[:, :1]), ValueError, 'vocab_sizes'),
    ('engram_hash', _bad(3, lambda t: t[:, :-1]), ValueError, 'offsets'),
    ('engram_hash', _bad(3, lambda t: t.t().contiguous().t()), ValueError, 'offsets'),
    ('engram_hash', _bad(0, lambda t: t.t().contiguous().t()), ValueError, 'ngram_token_ids'),
    ('engram_hash', _bad(2, lambda t: t[:0]), ValueError, 'num_ngram_layers'),
    ('fused_weight', _bad(0, lambda t: t.float()), TypeError, 'weight_hidden'),
    ('fused_weight', _bad(0, lambda t: t[:2]), ValueError, 'weight_hidden'),
    ('fused_weight', _bad(1, lambda t: t[:, :128]), ValueError, 'weight_embed'),
    ('fused_weight', _bad(1, lambda t: t.t().contiguous().t()), ValueError, 'weight_embed'),
    ('fused_weight', _bad(1, _misaligned), ValueError, 'weight_embed'),
    ('engram_gate_fwd', _bad(0, lambda t: t.float()), TypeError, 'hidden_states'),
    ('engram_gate_fwd', _bad(0, lambda t: t[:, :2]), ValueError, 'hidden_states'),
    ('engram_gate_fwd', _bad(0, lambda t: t[0]), ValueError, 'hidden_states'),
    ('engram_gate_fwd', _bad(1, lambda t: t[:, :, :128]), ValueError, 'k'),
    ('engram_gate_fwd', _bad(1, lambda t: t.half()), TypeError, 'k'),
    ('engram_gate_fwd', _bad(2, lambda t: t[:-1]), ValueError, 'v'),
    ('engram_gate_fwd', _bad(3, lambda t: t[:2]), ValueError, 'weight_fused'),
    ('engram_gate_fwd', _bad(3, lambda t: t.bfloat16()), TypeError, 'weight_fused'),
    ('engram_gate_fwd', _bad(0, lambda t: t.transpose(0, 1).contiguous().transpose(0, 1)), ValueError, 'hidden_states'),
    ('engram_gate_fwd', _bad(0, _misaligned), ValueError, 'hidden_states'),
    # k and v: strided rows are fine, but not a stride off the 16-byte grid or a non-unit inner stride.
    ('engram_gate_fwd', _bad(1, lambda t: torch.zeros(T, HC, H + 4, dtype=t.dtype)[:, :, :H]), ValueError, 'k'),
    ('engram_gate_fwd', _bad(1, lambda t: torch.zeros(T, HC, 2 * H, dtype=t.dtype)[:, :, ::2]), ValueError, 'k'),
    ('engram_gate_fwd', _bad(2, lambda t: torch.zeros(T, H + 1, dtype=t.dtype)[:, 1:]), ValueError, 'v'),
    ('engram_gate_fwd', _bad(4, 'a'), TypeError, 'eps'),
    ('engram_gate_fwd', _bad(4, -1.0), ValueError, 'eps'),
    ('engram_gate_fwd', _bad(5, float('nan')), ValueError, 'clamp_value'),
    ('engram_gate_fwd', _bad(5, True), TypeError, 'clamp_value'),
    ('engram_gate_fwd', lambda args: args.append(1), TypeError, 'save_for_backward'),
    ('engram_gate_bwd', _bad(0, lambda t: t[:-1]), ValueError, 'grad_out'),
    ('engram_gate_bwd', _bad(0, lambda t: t.float()), TypeError, 'grad_out'),
    ('engram_gate_bwd', _bad(1, lambda t: t[:, :3]), ValueError, 'hidden_states'),
    ('engram_gate_bwd', _bad(5, lambda t: t[:, :3]), ValueError, 'dot'),
    ('engram_gate_bwd', _bad(6, lambda t: t.double()), TypeError, 'gate_score'),
    ('engram_gate_bwd', _bad(7, lambda t: t[:-1]), ValueError, 'rstd_x'),
    ('engram_gate_bwd', _bad(8, lambda t: t.t().contiguous().t()), ValueError, 'rstd_k'),
    ('engram_gate_bwd', _bad(9, None), TypeError, 'clamp_value'),
    ('engram_gate_bwd', _bad(3, lambda t: torch.zeros(T, H + 4, dtype=t.dtype)[:, :H]), ValueError, 'v'),
    ('grad_w_reduce', _bad(0, lambda t: t[:, :2]), ValueError, 'grad_w_partial'),
    ('grad_w_reduce', _bad(0, lambda t: t.double()), TypeError, 'grad_w_partial'),
    ('grad_w_reduce', _bad(1, lambda t: t[:3]), ValueError, 'weight_hidden'),
    ('grad_w_reduce', _bad(3, lambda t: t.bfloat16()), TypeError, 'grad_weight_hidden'),
    ('grad_w_reduce', _bad(4, lambda t: t[:, :128]), ValueError, 'grad_weight_embed'),
    ('grad_w_reduce', _bad(3, _misaligned), ValueError, 'grad_weight_hidden'),
]


@pytest.mark.parametrize('name, change, error, words', CASES, ids=[f'{c[0]}-{i}' for i, c in enumerate(CASES)])
def test_bad_arguments_are_named(name, change, error, words):
    op, good = OPS[name]
    args = good()
    change(args)
    with pytest.raises(error) as info:
        op(*args)
    message = str(info.value)
    assert message.startswith(f'{name}: ') and words in message, message


@pytest.mark.parametrize('name', OPS)
def test_good_cpu_arguments_reach_the_device_check(name):
    op, good = OPS[name]
    with pytest.raises(ValueError, match=f'{name}: .* must be on a CUDA device'):
        op(*good())


def test_strided_k_and_v_pass_the_checks():
    x, k, v, wf = _fwd_args()[:4]
    k_wide = torch.zeros(T, HC + 1, H + 8, dtype=k.dtype)[:, 1:, 8:]
    v_wide = torch.zeros(T, 2 * H, dtype=v.dtype)[:, H:]
    with pytest.raises(ValueError, match='must be on a CUDA device'):
        engram.engram_gate_fwd(x, k_wide, v_wide, wf, 1e-20, 1e-6)


# --- what happens after the checks: a fake device and a fake kernel -------------------------------------------------

@pytest.fixture
def empty_package(tmp_path, monkeypatch):
    """A device whose arch package has no Engram binaries: every op raises SpecNotPrebuiltError."""
    root = tmp_path / 'sm_90a'
    root.mkdir()
    (root / 'manifest.json').write_text(json.dumps({'schema': 2, 'target': 'sm_90a', 'package': 'tile_kernels_aot_sm90a',
                                                    'version': '0', 'provenance': {}, 'kernels': {}}))
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA Fake', (9, 0)))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    _select.reset()
    yield
    _select.reset()


@pytest.mark.parametrize('name, spec', [
    ('engram_hash', "max_ngram_size=3, tables_per_ngram=8"), ('fused_weight', 'hc=4'), ('engram_gate_fwd', f'hidden={H}, save=True'),
    ('engram_gate_bwd', f'hidden={H}'), ('grad_w_reduce', 'hc=4'),
])
def test_unbuilt_spec_raises_spec_not_prebuilt(empty_package, name, spec):
    op, good = OPS[name]
    with pytest.raises(SpecNotPrebuiltError) as info:
        op(*good())
    assert f'engram.{name} has no prebuilt sm_90a binary for {spec}' in str(info.value)
    assert 'python -m build_tools' in str(info.value)


class _FakeKernel:
    """Stands in for a loaded binary: the constants the ops read, and a record of launches."""

    def __init__(self, constants):
        self.entry = types.SimpleNamespace(constants=constants)
        self.launches = []

    def __call__(self, device, tensors, scalars=None):
        self.launches.append((tensors, scalars))


@pytest.fixture
def fake_kernels(monkeypatch):
    constants = {'ctas_per_sm': 4, 'max_tokens_per_partial': 32, 'min_partials': 128, 'elements_per_thread': 8, 'columns_per_thread': 4}
    kernels = {}

    def find(name, params, device):
        kernels.setdefault(name, _FakeKernel(constants))
        kernels[name].params = params
        return kernels[name]

    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    monkeypatch.setattr(engram, 'find_kernel', find)
    monkeypatch.setattr(engram, 'get_num_sms', lambda device: 132)
    return kernels


def test_zero_tokens_return_empty_outputs_without_a_launch(fake_kernels):
    assert engram.engram_hash(*_hash_args(num_tokens=0)).shape == (2, 0, 16)
    out, dot, gate, rstd_x, rstd_k = engram.engram_gate_fwd(*_fwd_args(num_tokens=0))
    assert out.shape == (0, HC, H) and out.dtype == torch.bfloat16 and all(t.shape == (0, HC) for t in (dot, gate, rstd_x, rstd_k))
    assert engram.engram_gate_fwd(*_fwd_args(num_tokens=0), save_for_backward=False)[1:] == (None,) * 4
    grad_x, grad_k, grad_v, partial = engram.engram_gate_bwd(*_bwd_args(num_tokens=0))
    assert grad_x.shape == grad_k.shape == (0, HC, H) and grad_v.shape == (0, H) and partial.shape == (0, HC, H)
    args = _reduce_args()
    args[0] = args[0][:0]
    engram.grad_w_reduce(*args)
    assert all(not k.launches for k in fake_kernels.values())


def test_launch_arguments(fake_kernels):
    num_tokens = 4001
    engram.engram_gate_fwd(*_fwd_args(num_tokens=num_tokens), save_for_backward=False)
    fwd = fake_kernels['engram.engram_gate_fwd']
    assert fwd.params == {'hidden': H, 'save': False}
    tensors, scalars = fwd.launches[-1]
    assert set(tensors) == {'x', 'k', 'v', 'weight_fused', 'out'}
    assert scalars == {'eps': 1e-20, 'clamp_value': 1e-6, 'num_blocks': 132 * 4}
    _, _, _, partial = engram.engram_gate_bwd(*_bwd_args(num_tokens=num_tokens))
    tensors, scalars = fake_kernels['engram.engram_gate_bwd'].launches[-1]
    assert partial.shape == (126, HC, H) and scalars['tokens_per_partial'] == 32 and scalars['num_blocks'] == 126 * HC
    engram.engram_gate_fwd(*_fwd_args(num_tokens=1))
    assert fwd.launches[-1][1]['num_blocks'] == HC  # never more CTAs than rows


@pytest.mark.parametrize('bad, error', [('x_dtype', 'hidden_states'), ('k_shape', 'k'), ('v_shape', 'v'), ('eps', 'eps'),
                                        ('clamp', 'clamp_value'), ('weights', 'weight_hidden')])
def test_engram_gate_refuses_bad_input_before_fused_weight_chooses_a_binary(monkeypatch, bad, error):
    """CPU tensors pass the device check and any binary lookup fails the test: engram_gate checks what engram_gate_fwd
    takes before fused_weight (its first op) chooses, and would launch, a binary."""
    from tile_kernels_aot import _checks, _select
    from tile_kernels_aot.modeling.engram import engram_gate

    def looked(*args, **kwargs):
        raise AssertionError('fused_weight looked up its binary before the gate was checked')

    _select.reset()  # no binary found before this test
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    monkeypatch.setattr(_select, 'package_for_device', looked)
    x, k, v = torch.zeros(2, 4, 256, dtype=torch.bfloat16), torch.zeros(2, 4, 256, dtype=torch.bfloat16), torch.zeros(2, 256, dtype=torch.bfloat16)
    wh = we = torch.ones(4, 256, dtype=torch.bfloat16)
    args = dict(x=x, k=k, v=v, wh=wh, we=we, clamp=1e-6, eps=1e-20)
    args.update({'x_dtype': dict(x=x.float()), 'k_shape': dict(k=k[:, :, :128]), 'v_shape': dict(v=v[:1]), 'eps': dict(eps=float('nan')),
                 'clamp': dict(clamp=-1.0), 'weights': dict(wh=torch.ones(4, 128, dtype=torch.bfloat16), we=torch.ones(4, 128, dtype=torch.bfloat16))}[bad])
    with pytest.raises((TypeError, ValueError), match=f'engram_gate.*{error}'):
        engram_gate(args['x'], args['k'], args['v'], args['wh'], args['we'], args['clamp'], args['eps'])
