"""Every way an installed artifact can be damaged raises a named ArtifactError with structured fields.

The arch packages here are synthetic (a manifest written by manifest_to_json, a few-hundred-byte ELF header and
section header table as the cubin), so no build is needed; the CUDA driver is faked where a test reaches it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from tile_kernels_aot import _launch, _select, targets
from tile_kernels_aot.cubin import check_layout
from tile_kernels_aot.errors import (
    ArchPackageMissingError, ArtifactError, CubinArchError, CubinChecksumError, CubinLoadError, CubinMissingError, CubinTruncatedError,
    CudaDriverError, KernelDirError, KernelIntegrityError, ManifestError, ManifestSchemaError, TileKernelsAOTError,
    UnsupportedDeviceError,
)
from tile_kernels_aot.manifest import SCHEMA_VERSION, KernelInfo, Manifest, ParamSchema, entry_from_plain, manifest_to_json

KERNEL = 'demo.copy'
CUBIN = 'cubins/demo.copy/h64.cubin'


def fake_cubin(sm: int, size: int = 512) -> bytes:
    """The header fields the loader reads (64-bit ELF, EM_CUDA, SM in e_flags), a section header table of two
    sections at bytes 256-383 (a null one, and one of bytes 64-255) and filler bytes."""
    data = bytearray(bytes(range(256)) * (size // 256 + 1))[:size]
    data[:5] = b'\x7fELF\x02'
    data[32:64] = bytes(32)
    struct.pack_into('<H', data, 18, 190)
    struct.pack_into('<I', data, 48, sm << 8)
    struct.pack_into('<Q', data, 40, 256)  # e_shoff
    struct.pack_into('<HHHH', data, 54, 0, 0, 64, 2)  # e_phentsize, e_phnum, e_shentsize, e_shnum
    data[256:384] = bytes(128)
    struct.pack_into('<I', data, 320 + 4, 1)  # section 1: PROGBITS
    struct.pack_into('<QQ', data, 320 + 24, 64, 192)  # its bytes: 64-255
    return bytes(data)


def make_package(folder: Path, target: str = 'sm_90a', cubin: bytes | None = None) -> Path:
    """An arch package folder: manifest.json and one cubin of kernel demo.copy."""
    data = fake_cubin(targets.parse_target(target)[0] * 10 + targets.parse_target(target)[1]) if cubin is None else cubin
    entry = entry_from_plain({
        'kernel': KERNEL, 'key': 'h=64', 'params': {'h': 64}, 'target': target, 'cubin': CUBIN,
        'sha256': hashlib.sha256(data).hexdigest(), 'source': 'sources/demo.copy/h64.cu', 'buffers': [], 'scalars': [],
        'launches': [{'symbol': 'copy_kernel', 'args': [], 'grid': [1, 1, 1], 'block': [128, 1, 1], 'dynamic_smem': 0,
                      'cooperative': False, 'cluster_dims': None, 'pdl': False, 'tma': []}],
        'constants': {},
    })
    manifest = Manifest(target, targets.package_for(target), '0.0.0', {}, {KERNEL: KernelInfo(KERNEL, (ParamSchema('h', 'int', 'h'),), {'h=64': entry})})
    (folder / 'cubins' / KERNEL).mkdir(parents=True)
    (folder / CUBIN).write_bytes(data)
    (folder / 'manifest.json').write_text(manifest_to_json(manifest))
    return folder


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A synthetic sm_90a package named by TILE_KERNELS_AOT_KERNEL_DIRS, on a faked H200."""
    root = make_package(tmp_path / 'sm_90a')
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
    monkeypatch.delenv(_select.VERIFY_ENV, raising=False)
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)  # ignore arch wheels installed here
    _select.reset()
    yield root
    _select.reset()


ORIGIN = f'{_select.KERNEL_DIRS_ENV} ({{}})'


class FakeDriver:
    """Loads only the image it was given as good; anything else gets the driver's answer to a damaged image."""

    def __init__(self, good: bytes, refusal: str = 'CUDA_ERROR_INVALID_IMAGE') -> None:
        self.good, self.refusal = good, refusal
        self.loads = 0  # images it was handed

    def load_module(self, image: bytes):
        self.loads += 1
        if image != self.good:
            raise CudaDriverError('cuModuleLoadData', 200 if self.refusal == 'CUDA_ERROR_INVALID_IMAGE' else 2, self.refusal, 'refused')
        return 1

    def get_function(self, module, symbol: str):
        return 2


@pytest.fixture
def fake_driver(monkeypatch):
    def install(good: bytes, refusal: str = 'CUDA_ERROR_INVALID_IMAGE') -> FakeDriver:
        drv = FakeDriver(good, refusal)
        monkeypatch.setattr(_launch._driver, 'driver', lambda: drv)
        monkeypatch.setattr(_launch, '_ensure_context', lambda device: None)
        return drv
    return install


def load(kernel_name: str = KERNEL):
    return _select.find_kernel(kernel_name, {'h': 64}, 0)


# -- manifests ---------------------------------------------------------------------------------------------


def test_a_sound_package_loads(package, fake_driver):
    kernel = load()
    fake_driver(kernel.image())
    assert kernel.functions(0) == [2]


def test_missing_manifest(package):
    (package / 'manifest.json').unlink()
    with pytest.raises(ManifestError) as info:
        load()
    e = info.value
    assert (e.reason, e.file, e.package) == ('missing', str(package / 'manifest.json'), ORIGIN.format(package))
    assert f'{package}/manifest.json ({ORIGIN.format(package)}' not in str(e)  # the origin is named once, as the arch package
    assert str(e).startswith(f'{package}/manifest.json (arch package {ORIGIN.format(package)}): no manifest.json there')
    assert isinstance(e, ArtifactError) and isinstance(e, ValueError) and isinstance(e, TileKernelsAOTError)


@pytest.mark.parametrize('keep', [0, 1, 100, -2])
def test_truncated_manifest(package, keep):
    path = package / 'manifest.json'
    text = path.read_text()
    path.write_text(text[:keep] if keep >= 0 else text[:keep].rstrip().rstrip('}'))
    with pytest.raises(ManifestError) as info:
        load()
    e = info.value
    assert (e.reason, e.file) == ('truncated', str(path))
    assert not isinstance(e, json.JSONDecodeError) and e.__cause__ is None
    assert 'truncated manifest: the JSON ends early' in str(e)


@pytest.mark.parametrize('damage, where', [
    (lambda text: text.replace('"kernels"', '"kernels" "', 1), None),  # bad JSON in the middle
    (lambda text: '[1, 2]', 'a JSON list, not an object'),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != 'target'}), "at the top level: no field 'target'"),
    (lambda text: text.replace('"sha256"', '"sha257"'), "at kernels['demo.copy'].entries['h=64']"),
    (lambda text: text.replace('"grid": [', '"grid": [1.5, '), "at kernels['demo.copy'].entries['h=64']: ValueError: bad expression 1.5"),
    (lambda text: text.replace('"constants": {}', '"constants": {"tile": "8"}'), "bad constants"),
])
def test_malformed_manifest(package, damage, where):
    path = package / 'manifest.json'
    path.write_text(damage(path.read_text()))
    with pytest.raises(ManifestError) as info:
        load()
    e = info.value
    assert (e.reason, e.file, e.package) == ('malformed', str(path), ORIGIN.format(package))
    assert 'malformed manifest' in str(e)
    if where:
        assert where in str(e)


def test_manifest_of_another_target(package):
    path = package / 'manifest.json'
    _select.installed_packages()  # the environment's folder is read for its target here
    path.write_text(path.read_text().replace('"target": "sm_90a"', '"target": "sm_100f"'))
    package_obj = _select.ArchPackage('sm_90a', package, 'test')
    with pytest.raises(ManifestError, match='the manifest is for sm_100f, not sm_90a') as info:
        package_obj.manifest
    assert info.value.file == str(path)


@pytest.mark.parametrize('schema', [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1, None, 'two'])
def test_unknown_schema(package, schema):
    path = package / 'manifest.json'
    plain = json.loads(path.read_text())
    if schema is None:
        del plain['schema']
    else:
        plain['schema'] = schema
    path.write_text(json.dumps(plain))
    with pytest.raises(ManifestSchemaError) as info:
        load()
    e = info.value
    assert (e.reason, e.file, e.package, e.expected_schema, e.found_schema) == ('schema', str(path), ORIGIN.format(package), SCHEMA_VERSION, schema)
    assert f'{path} (arch package {ORIGIN.format(package)}): manifest schema {schema!r} is not the supported schema {SCHEMA_VERSION}' in str(e)


# -- kernel folders and arch packages ----------------------------------------------------------------------


def test_an_installed_arch_package_without_its_manifest(tmp_path, monkeypatch):
    """An arch wheel whose folder is there but whose manifest.json is gone: the error names the distribution."""
    root = make_package(tmp_path / 'site' / 'tile_kernels_aot_sm90a')
    (root / 'manifest.json').unlink()
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, '')
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: root if target == 'sm_90a' else None)
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    _select.reset()
    try:
        with pytest.raises(ManifestError) as info:
            load()
    finally:
        _select.reset()
    assert (info.value.reason, info.value.package, info.value.file) == ('missing', 'tile-kernels-aot-sm90a', str(root / 'manifest.json'))


def test_kernel_dirs_naming_a_missing_folder(package, monkeypatch, tmp_path):
    missing = tmp_path / 'no-such-build' / 'sm_90a'
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, f'{package}:{missing}')
    _select.reset()
    with pytest.raises(KernelDirError) as info:
        load()
    e = info.value
    assert (e.file, e.variable) == (str(missing), _select.KERNEL_DIRS_ENV)
    assert isinstance(e, FileNotFoundError) and isinstance(e, ArtifactError)
    assert str(e) == f'{_select.KERNEL_DIRS_ENV} names {missing}, which is not a folder; fix or unset {_select.KERNEL_DIRS_ENV}'


def test_kernel_dirs_naming_a_file(package, monkeypatch):
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(package / 'manifest.json'))
    _select.reset()
    with pytest.raises(KernelDirError):
        load()


def test_arch_package_absent(package, monkeypatch):
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA B200', (10, 0)))
    _select.reset()
    with pytest.raises(ArchPackageMissingError) as info:
        load()
    e = info.value
    assert (e.target, e.package, e.file, e.device, e.capability) == ('sm_100f', 'tile-kernels-aot-sm100f', None, 'NVIDIA B200', (10, 0))
    assert isinstance(e, UnsupportedDeviceError) and isinstance(e, ArtifactError)
    assert 'pip install tile-kernels-aot-sm100f' in str(e)


def test_no_release_target_is_not_a_missing_package(package, monkeypatch):
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA A100', (8, 0)))
    _select.reset()
    with pytest.raises(UnsupportedDeviceError) as info:
        load()
    assert not isinstance(info.value, ArchPackageMissingError)


# -- cubins ------------------------------------------------------------------------------------------------


def expected_fields(package: Path) -> dict:
    plain = json.loads((package / 'manifest.json').read_text())
    return {'kernel': f'{KERNEL}[h=64]', 'package': ORIGIN.format(package), 'file': str(package / CUBIN), 'target': 'sm_90a',
            'expected_sha256': plain['kernels'][KERNEL]['entries']['h=64']['sha256']}


def fields(e: KernelIntegrityError) -> dict:
    return {'kernel': e.kernel, 'package': e.package, 'file': e.file, 'target': e.target, 'expected_sha256': e.expected_sha256}


@pytest.mark.parametrize('verify', ['1', '0'])
def test_missing_cubin(package, monkeypatch, verify):
    monkeypatch.setenv(_select.VERIFY_ENV, verify)
    _select.reset()
    (package / CUBIN).unlink()
    with pytest.raises(CubinMissingError) as info:
        load().image()
    assert fields(info.value) == expected_fields(package)
    assert info.value.found_sha256 is None and 'No such file or directory' in str(info.value)
    assert isinstance(info.value, KernelIntegrityError)


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def flip(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize('damage', [lambda p: truncate(p, 300), lambda p: truncate(p, 10), lambda p: truncate(p, 0), flip, lambda p: flip(p, 0)],
                         ids=['truncated', 'truncated-to-10-bytes', 'empty', 'flipped-last-byte', 'flipped-magic'])
def test_damaged_cubin_with_sha256_verification(package, damage):
    damage(package / CUBIN)
    with pytest.raises(CubinChecksumError) as info:
        load().image()
    e = info.value
    assert fields(e) == expected_fields(package)
    data = (package / CUBIN).read_bytes()
    assert (e.found_sha256, e.size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert f'expected {e.expected_sha256}, found {e.found_sha256}' in str(e) and str(package / CUBIN) in str(e)


@pytest.mark.parametrize('keep', [300, 200])  # the section header table cut; that and a section's bytes
def test_truncated_cubin_without_verification_never_reaches_the_driver(package, monkeypatch, fake_driver, keep):
    """The driver may crash the process on a truncated image rather than refuse it: the loader's layout check
    refuses it first."""
    drv = fake_driver((package / CUBIN).read_bytes())
    truncate(package / CUBIN, keep)
    monkeypatch.setenv(_select.VERIFY_ENV, '0')
    _select.reset()
    with pytest.raises(CubinTruncatedError) as info:
        load().functions(0)
    e = info.value
    assert fields(e) == expected_fields(package) and e.found_sha256 is None and e.size == keep
    assert str(package / CUBIN) in str(e) and f'of {keep}: the file is truncated' in str(e)
    assert isinstance(e, KernelIntegrityError) and drv.loads == 0


def test_a_sound_cubin_passes_the_layout_check():
    check_layout(fake_cubin(90))
    with pytest.raises(ValueError, match='section header table ends at byte 384 of 300'):
        check_layout(fake_cubin(90)[:300])
    long_section = bytearray(fake_cubin(90))
    struct.pack_into('<QQ', long_section, 320 + 24, 384, 200)  # section 1's bytes said to run to byte 584
    with pytest.raises(ValueError, match='section 1 ends at byte 584 of 512'):
        check_layout(bytes(long_section))


@pytest.mark.parametrize('damage', [flip, lambda p: flip(p, 100)], ids=['flipped-last-byte', 'flipped-section-byte'])
def test_damaged_cubin_without_verification_names_the_file_when_the_driver_refuses_it(package, monkeypatch, fake_driver, damage):
    good = (package / CUBIN).read_bytes()
    damage(package / CUBIN)
    monkeypatch.setenv(_select.VERIFY_ENV, '0')
    _select.reset()
    fake_driver(good)
    kernel = load()
    assert kernel.image() == (package / CUBIN).read_bytes()  # no sha256 check
    with pytest.raises(CubinLoadError) as info:
        kernel.functions(0)
    e = info.value
    assert fields(e) == expected_fields(package) and e.found_sha256 is None
    assert (e.function, e.name, e.code) == ('cuModuleLoadData', 'CUDA_ERROR_INVALID_IMAGE', 200)
    assert isinstance(e, CudaDriverError) and isinstance(e, KernelIntegrityError)
    assert str(package / CUBIN) in str(e) and 'cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE' in str(e)


def test_a_driver_failure_that_is_not_the_image_s_still_names_the_file(package, fake_driver):
    fake_driver(b'', refusal='CUDA_ERROR_OUT_OF_MEMORY')
    with pytest.raises(CudaDriverError) as info:
        load().functions(0)
    assert not isinstance(info.value, KernelIntegrityError)
    assert info.value.name == 'CUDA_ERROR_OUT_OF_MEMORY' and f'(loading {package / CUBIN})' in str(info.value)


@pytest.mark.parametrize('verify', ['1', '0'])
def test_truncated_below_the_elf_header_without_verification(package, monkeypatch, verify):
    truncate(package / CUBIN, 10)
    monkeypatch.setenv(_select.VERIFY_ENV, verify)
    _select.reset()
    with pytest.raises(CubinChecksumError if verify == '1' else CubinArchError) as info:
        load().image()
    if verify == '0':
        assert info.value.found_sm is None and 'not a 64-bit ELF file, not a cubin' in str(info.value)


def test_wrong_elf_arch(tmp_path, monkeypatch):
    """A cubin for sm_100 filed in the sm_90a package, with a manifest that agrees with its bytes."""
    root = make_package(tmp_path / 'sm_90a', cubin=fake_cubin(100))
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    _select.reset()
    try:
        with pytest.raises(CubinArchError) as info:
            load().image()
    finally:
        _select.reset()
    e = info.value
    assert (e.found_sm, e.target, e.file) == (100, 'sm_90a', str(root / CUBIN))
    assert 'ELF is for sm_100, the manifest says sm_90a' in str(e)


def test_not_an_elf_file(tmp_path, monkeypatch):
    root = make_package(tmp_path / 'sm_90a', cubin=b'PK\x03\x04' + bytes(200))
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    _select.reset()
    try:
        with pytest.raises(CubinArchError, match='not a 64-bit ELF file, not a cubin') as info:
            load().image()
    finally:
        _select.reset()
    assert info.value.found_sm is None
