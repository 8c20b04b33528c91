"""The manifest schema: expressions, spec keys, constants and the JSON round trip; the declarations' specs and constants."""

import json
import re
from pathlib import Path

import pytest

import tile_kernels_aot
from kernel_src.decl import ARCHS
from kernel_src.registry import DECLS
from tile_kernels_aot.manifest import (
    SCHEMA_VERSION, KernelInfo, Manifest, ParamSchema, compile_expr, entry_from_plain, format_expr, manifest_from_json, manifest_to_json,
    parse_spec_key, spec_file_stem, spec_key,
)

SCHEMA = (ParamSchema('in_dtype', 'str', ''), ParamSchema('hidden', 'int', 'h'), ParamSchema('round_sf', 'bool', 'rsf'))


@pytest.mark.parametrize('expr, env, value', [
    (7, {}, 7),
    ('n', {'n': 5}, 5),
    (['//', ['+', 'num_tokens', 3], 4], {'num_tokens': 4001}, 1001),
    (['%', 'a', 8], {'a': 13}, 5),
    (['min', ['*', 'a', 2], ['-', 'b', 1]], {'a': 4, 'b': 6}, 5),
    (['max', 'a', 'b'], {'a': 4, 'b': 6}, 6),
])
def test_expressions_evaluate(expr, env, value):
    assert compile_expr(expr)(env) == value


@pytest.mark.parametrize('bad', [['**', 2, 3], ['+', 1], 1.5, True, {'op': '+'}, ['+', 1, ['eval', 'x', 1]]])
def test_malformed_expressions_are_rejected_when_read(bad):
    with pytest.raises(ValueError, match='bad expression'):
        compile_expr(bad)


def test_format_expr():
    assert format_expr(['//', ['+', 'num_tokens', 3], 4]) == '((num_tokens + 3) // 4)'


@pytest.mark.parametrize('params', [
    {'in_dtype': 'bfloat16', 'hidden': 7168, 'round_sf': True},
    {'in_dtype': 'float32', 'hidden': 576, 'round_sf': False},
])
def test_spec_keys_round_trip(params):
    key = spec_key(SCHEMA, params)
    assert parse_spec_key(SCHEMA, key) == params
    assert spec_key(SCHEMA, parse_spec_key(SCHEMA, key)) == key
    assert '/' not in spec_file_stem(SCHEMA, params) and ',' not in spec_file_stem(SCHEMA, params)


def test_spec_key_rejects_wrong_names_and_types():
    with pytest.raises(KeyError):
        spec_key(SCHEMA, {'in_dtype': 'bfloat16', 'hidden': 7168})
    with pytest.raises(TypeError):
        spec_key(SCHEMA, {'in_dtype': 'bfloat16', 'hidden': True, 'round_sf': False})
    with pytest.raises(ValueError):
        parse_spec_key(SCHEMA, 'in_dtype=bfloat16,hidden=7168,colour=red')


def plain_entry(**changes) -> dict:
    entry = {'kernel': 'demo.copy', 'key': 'h=64', 'params': {'h': 64}, 'target': 'sm_90a', 'cubin': 'x.cubin', 'sha256': '0' * 64,
             'source': 'x.cu', 'buffers': [], 'scalars': [], 'launches': [], 'constants': {'tile_m': 128}}
    return {**entry, **changes}


def demo_manifest() -> Manifest:
    info = KernelInfo('demo.copy', (ParamSchema('h', 'int', 'h'),), {'h=64': entry_from_plain(plain_entry())})
    return Manifest('sm_90a', 'tile_kernels_aot_sm90a', '0.1.0', {}, {'demo.copy': info})


def test_manifest_round_trip_keeps_the_constants():
    again = manifest_from_json(manifest_to_json(demo_manifest()))
    assert again == demo_manifest()
    assert again.kernels['demo.copy'].entries['h=64'].constants == {'tile_m': 128}


@pytest.mark.parametrize('constants', [{'tile_m': 1.5}, {'tile_m': True}, {'tile_m': '128'}, [['tile_m', 128]]])
def test_bad_constants_are_rejected_when_read(constants):
    with pytest.raises(ValueError, match='bad constants'):
        entry_from_plain(plain_entry(constants=constants))


def test_a_manifest_of_another_schema_is_refused():
    plain = json.loads(manifest_to_json(demo_manifest()))
    plain['schema'] = SCHEMA_VERSION - 1
    with pytest.raises(ValueError, match=f'schema {SCHEMA_VERSION - 1} is not the supported schema {SCHEMA_VERSION}'):
        manifest_from_json(json.dumps(plain))


def test_every_declared_constant_is_an_int_for_every_spec_and_arch():
    for decl in DECLS.values():
        for arch in ARCHS:
            for spec in decl.specs():
                assert all(isinstance(v, int) for v in decl.constants_for(arch, spec).values())  # constants_for raises otherwise


def test_every_constant_the_runtime_reads_is_declared():
    """The ops read constants by name, from the entry they launch (``entry.constants['name']``) or, before they choose
    one, from all the entries of a kernel (``kernel_constant('kernel', 'name', device)``, which needs one value)."""
    declared: dict[tuple[str, str, str], set[int]] = {}  # (kernel, target, name) -> the values of its specs
    for decl in DECLS.values():
        for arch in ARCHS:
            for spec in decl.specs():
                for name, value in decl.constants_for(arch, spec).items():
                    declared.setdefault((decl.name, arch.target, name), set()).add(value)
    names = {name for _, _, name in declared}
    read, before_choosing = set(), set()
    for path in Path(tile_kernels_aot.__file__).parent.rglob('*.py'):
        text = path.read_text()
        read |= set(re.findall(r"constants\['(\w+)'\]", text))
        before_choosing |= set(re.findall(r"kernel_constant\('([\w.]+)', '(\w+)'", text))
    assert read and before_choosing
    assert read <= names, f'read but never declared: {sorted(read - names)}'
    for kernel, name in before_choosing:
        for arch in ARCHS:
            assert len(declared.get((kernel, arch.target, name), ())) == 1, f'{kernel} has no single {name} for {arch.target}'


def test_every_declared_kernel_has_valid_unique_specs():
    for decl in DECLS.values():
        specs = decl.specs()
        assert specs, decl.name
        keys = [decl.key(s) for s in specs]
        assert len(set(keys)) == len(keys)
        stems = [decl.file_stem(s) for s in specs]
        assert len(set(stems)) == len(stems), f'{decl.name}: two specs share a file name'
        for s in specs:
            assert parse_spec_key(decl.params, decl.key(s)) == s


def test_every_kernel_has_a_benchmark_case():
    from benchmarks.run import CASES

    assert set(CASES) == set(DECLS)


def test_every_kernel_is_compared_with_upstream():
    # Every kernel here reimplements an upstream TileKernels v1 kernel; benchmarks/upstream.py runs both.
    from benchmarks.upstream import CASES, MHC_COMPOSITES

    assert set(CASES) - set(MHC_COMPOSITES) == set(DECLS)
    assert not set(MHC_COMPOSITES) & set(DECLS)  # a composite's name is no kernel's
