"""Binary selection with faked devices, and the errors a user sees (uses the subset build)."""

import pytest
import torch

from tile_kernels_aot import targets, _select
from tile_kernels_aot.errors import SpecNotPrebuiltError, TileKernelsAOTError, UnsupportedDeviceError

from .conftest import SUBSET


@pytest.mark.parametrize('target, capability, ok', [
    ('sm_90a', (9, 0), True), ('sm_90a', (9, 1), False), ('sm_90a', (10, 0), False), ('sm_90a', (8, 9), False),
    ('sm_100a', (10, 0), True), ('sm_100a', (10, 3), False), ('sm_100f', (10, 3), True), ('sm_100f', (11, 0), False),
    ('sm_90', (9, 0), True), ('sm_80', (8, 6), True), ('sm_80', (9, 0), False),
])
def test_compatibility_rules(target, capability, ok):
    assert targets.runs_on(target, capability)[0] is ok


def test_choice_prefers_exact_then_family_then_plain():
    assert targets.choose_target((10, 0), ['sm_100', 'sm_100f', 'sm_100a'])[0] == 'sm_100a'
    assert targets.choose_target((10, 3), ['sm_100', 'sm_100f', 'sm_100a'])[0] == 'sm_100f'
    assert targets.choose_target((9, 0), ['sm_100a', 'sm_90a'])[0] == 'sm_90a'
    target, reasons = targets.choose_target((8, 0), ['sm_90a', 'sm_100a'])
    assert target is None and reasons == [
        'sm_90a: rejected (sm_90a runs only on compute capability 9.0)',
        'sm_100a: rejected (sm_100a runs only on compute capability 10.0)',
    ]


@pytest.fixture
def fake_device(built, monkeypatch):
    """Installs the subset build through the environment and fakes device 0's name and capability."""
    dirs = f"{built / 'build' / 'sm_90a'}:{built / 'build' / 'sm_100f'}"
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, dirs)
    facts = {}
    monkeypatch.setattr(_select, 'device_facts', lambda index: facts[index])
    _select.reset()
    yield facts
    _select.reset()


@pytest.mark.parametrize('capability, target', [((9, 0), 'sm_90a'), ((10, 0), 'sm_100f'), ((10, 3), 'sm_100f')])
def test_selects_by_compute_capability(fake_device, capability, target):
    fake_device[0] = ('NVIDIA Fake', capability)
    package = _select.package_for_device(0)
    assert package.target == target
    assert _select.prebuilt_specs('moe.topk_gate', 0) == [{'num_experts': 256, 'num_topk': 8}]
    kernel = _select.find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, 0)
    assert kernel.entry.target == target
    assert len(kernel.image()) > 1000  # sha256 and ELF arch verified on read


def test_unsupported_device_error_names_everything(fake_device):
    fake_device[0] = ('NVIDIA A100-SXM4-80GB', (8, 0))
    with pytest.raises(UnsupportedDeviceError) as info:
        _select.package_for_device(0)
    message = str(info.value)
    assert 'NVIDIA A100-SXM4-80GB (compute capability 8.0)' in message
    assert 'sm_90a: rejected (sm_90a runs only on compute capability 9.0)' in message
    assert 'sm_100f: rejected (sm_100f runs on compute capability 10.0 to 10.9)' in message
    assert ('serves sm_90a (compute capability 9.0: H100, H200, GH200); '
            'sm_100f (compute capability 10.0 to 10.9: B200, GB200, B300, GB300) only') in message


# The release's targets against every compute capability a current NVIDIA datacenter or workstation part has, with
# the reason the loader gives: Hopper 9.0, Blackwell datacenter 10.0 (B200, GB200) and 10.3 (B300, GB300) are served;
# Thor 11.0, RTX 50-series / RTX PRO 12.0, DGX Spark 12.1 and A100 8.0 are not.
@pytest.mark.parametrize('capability, served_by', [
    ((9, 0), 'sm_90a'), ((10, 0), 'sm_100f'), ((10, 3), 'sm_100f'), ((11, 0), None), ((12, 0), None), ((12, 1), None),
    ((8, 0), None),
])
def test_release_targets_by_compute_capability(capability, served_by):
    target, reasons = targets.choose_target(capability, list(targets.KNOWN_TARGETS))
    assert target == served_by
    cc = f'{capability[0]}.{capability[1]}'
    assert reasons == [
        f'sm_90a: {"accepted" if capability == (9, 0) else "rejected"} (sm_90a runs only on compute capability 9.0)',
        f'sm_100f: {"accepted" if capability[0] == 10 else "rejected"} (sm_100f runs on compute capability 10.0 to 10.9)',
    ], cc
    advice = targets.install_advice(capability)
    if served_by:
        assert f'pip install {targets.distribution_for(served_by)}' in advice
    else:
        assert 'H100, H200, GH200' in advice and 'B200, GB200, B300, GB300' in advice


def test_tuning_family():
    assert [targets.family(t) for t in ('sm_90a', 'sm_100a', 'sm_100f', 'sm_103a', 'sm_120f')] == [
        'sm_90', 'sm_100', 'sm_100', 'sm_100', 'sm_120']


def test_missing_arch_package_names_the_package_to_install(built, monkeypatch):
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(built / 'build' / 'sm_90a'))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA B200', (10, 0)))
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)  # ignore arch wheels installed here
    _select.reset()
    try:
        with pytest.raises(UnsupportedDeviceError, match='pip install tile-kernels-aot-sm100f'):
            _select.package_for_device(0)
    finally:
        _select.reset()


def test_spec_not_prebuilt_error_names_nearest_and_build_command(fake_device):
    fake_device[0] = ('NVIDIA H200', (9, 0))
    with pytest.raises(SpecNotPrebuiltError) as info:
        _select.find_kernel('moe.topk_gate', {'num_experts': 200, 'num_topk': 8}, 0)
    message = str(info.value)
    assert 'moe.topk_gate has no prebuilt sm_90a binary for num_experts=200, num_topk=8' in message
    assert 'Nearest prebuilt specs: num_experts=256,num_topk=8' in message
    assert '[{"kernel": "moe.topk_gate", "params": {"num_experts": 200, "num_topk": 8}}]' in message
    assert 'python -m build_tools --arch sm90 --specs my_specs.json' in message
    assert '--kernels' not in message  # its wheel would hold that kernel only and replace the installed one


def test_tampered_cubin_is_refused(fake_device, tmp_path):
    import shutil

    from tile_kernels_aot.errors import KernelIntegrityError

    fake_device[0] = ('NVIDIA H200', (9, 0))
    package = _select.package_for_device(0)
    copy = tmp_path / 'sm_90a'
    shutil.copytree(package.root, copy)
    cubin = next(copy.rglob('e256-k8.cubin'))
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0xFF
    cubin.write_bytes(bytes(data))
    tampered = _select.ArchPackage('sm_90a', copy, 'test')
    entry = next(iter(tampered.manifest.kernels['moe.topk_gate'].entries.values()))
    with pytest.raises(KernelIntegrityError, match='sha256 does not match'):
        tampered.kernel(entry).image()


def test_constants_come_from_the_entries(fake_device):
    from kernel_src.quant.addressing import INDEX_LIMIT

    fake_device[0] = ('NVIDIA Fake', (9, 0))
    params = next(item['params'] for item in SUBSET if item['kernel'] == 'quant.per_token_cast')
    assert _select.find_kernel('quant.per_token_cast', params, 0).entry.constants['index_limit'] == INDEX_LIMIT
    assert _select.kernel_constant('quant.per_token_cast', 'index_limit', 0) == INDEX_LIMIT
    with pytest.raises(TileKernelsAOTError, match=r'quant.cast_back: the sm_90a arch package \(.*\) has no binaries of it'):
        _select.kernel_constant('quant.cast_back', 'index_limit', 0)
    with pytest.raises(TileKernelsAOTError, match='moe.topk_gate: .* has binaries that do not declare index_limit'):
        _select.kernel_constant('moe.topk_gate', 'index_limit', 0)


def test_ops_validate_before_touching_a_device():
    import tile_kernels_aot as tk

    cpu = torch.randn(64, 256)
    with pytest.raises(ValueError, match='topk_gate: scores must be on a CUDA device, got cpu'):
        tk.moe.topk_gate(cpu, 8)
    with pytest.raises(ValueError, match='topk_gate: num_topk must be in \\[1, 32\\], got 40'):
        tk.moe.topk_gate(cpu, 40)
    with pytest.raises(TypeError, match='scores must be float32, got bfloat16'):
        tk.moe.topk_gate(cpu.bfloat16(), 8)
    with pytest.raises(ValueError, match='transpose: x must have both transposed dimensions divisible by 64, got 64 x 100'):
        tk.transpose.transpose(torch.zeros(64, 100))
    with pytest.raises(ValueError, match='x must be on a CUDA device'):
        tk.transpose.transpose(torch.zeros(64, 128))
    with pytest.raises(ValueError, match='batched_transpose: x must have 3 dimensions'):
        tk.transpose.batched_transpose(torch.zeros(64, 128))
    with pytest.raises(ValueError, match='per_token_cast: x must have hidden divisible by 16, got 100'):
        tk.quant.per_token_cast(torch.zeros(4, 100, dtype=torch.bfloat16), 'e4m3', 32)
    with pytest.raises(ValueError, match='per_token_cast: num_per_channels must be 16, 32, 64 or 128, got 100'):
        tk.quant.per_token_cast(torch.zeros(4, 128, dtype=torch.bfloat16), 'e4m3', 100)
    with pytest.raises(TypeError, match='per_token_cast: x must be a torch.Tensor, got list'):
        tk.quant.per_token_cast([1.0], 'e4m3', 128)
    with pytest.raises(ValueError, match='scores must be contiguous in its last two dimensions'):
        tk.moe.topk_sum_and_topk_group_idx(torch.randn(4, 8, 32).transpose(1, 2), 2, 4)
    with pytest.raises(ValueError, match='topk_sum_and_topk_group_idx: scores must be on a CUDA device'):
        tk.moe.topk_sum_and_topk_group_idx(torch.randn(4, 8, 32), 2, 4)
    with pytest.raises(ValueError, match='group_count: group_idx must be on a CUDA device'):
        tk.moe.group_count(torch.zeros(4, 8, dtype=torch.int64), 256)


@pytest.mark.parametrize('capability, offset, vec_bytes', [
    ((10, 0), 0, 32),  # SM100: one 256-bit load a vector
    ((10, 3), 0, 32),
    ((10, 0), 8, 16),  # the pointer 16 bytes past a 32-byte boundary
    ((9, 0), 0, 16),  # sm_90a: a 32-byte vector is two 16-byte loads there, no faster than the 16-byte kernel
    ((9, 0), 8, 16),
])
def test_per_channel_swiglu_vector_width_by_device_and_pointer(fake_device, capability, offset, vec_bytes):
    """The choice as the op makes it: from the target of the binaries the device runs."""
    from tile_kernels_aot.quant.swiglu import swiglu_forward_and_per_channel_cast_spec

    fake_device[0] = ('NVIDIA Fake', capability)
    target = _select.package_for_device(0).target
    x = torch.empty(128 * 4096 + 64, dtype=torch.bfloat16)
    x = x[(-x.data_ptr() % 32) // 2 + offset:][:128 * 4096].view(128, 4096)
    for without_transpose in (False, True):
        spec = swiglu_forward_and_per_channel_cast_spec(x, without_transpose, target)
        assert spec == {'transpose': not without_transpose, 'vec_bytes': vec_bytes}


@pytest.mark.parametrize('dtype, offset, rows, width, vec_bytes', [
    (torch.float8_e4m3fn, 0, 8, 7168, 32),  # a whole e4m3 chunk a load (one 256-bit load on SM100)
    (torch.float8_e4m3fn, 16, 8, 7168, 16),  # the pointer 16 bytes past a 32-byte boundary
    (torch.float8_e4m3fn, 0, 8, 7168 + 16, 16),  # rows of 16-byte multiples
    (torch.float8_e4m3fn, 16, 1, 7168, 16),  # one row: only the pointer counts
    (torch.int8, 0, 8, 3584, 16),  # e2m1 pairs: 16-byte chunks
])
def test_requant_vector_width_by_pointer_and_rows(dtype, offset, rows, width, vec_bytes):
    """per_token_cast of quantised data picks 32-byte vectors where its pointer and row stride allow them, on every
    target (on sm_90a the two widths compile to the same SASS)."""
    from tile_kernels_aot.quant.per_token import per_token_requant_spec

    base = torch.empty(rows * width + 64, dtype=torch.uint8)
    data = base[-base.data_ptr() % 32 + offset:][:rows * width].view(rows, width).view(dtype)[:, :7168 if dtype != torch.int8 else width]
    spec = per_token_requant_spec(data, 'e2m1', False, True)
    assert spec == {'in_fmt': 'e4m3' if dtype != torch.int8 else 'e2m1', 'fmt': 'e2m1', 'in_sf_format': 'f32', 'sf_format': 'ue8m0',
                    'vec_bytes': vec_bytes}
