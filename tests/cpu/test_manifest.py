"""The manifest schema: expressions, spec keys and the JSON round trip (pure Python)."""

import pytest

from tile_kernels_aot.manifest import (
    ParamSchema, compile_expr, format_expr, parse_spec_key, spec_file_stem, spec_key,
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


def test_every_declared_kernel_has_valid_unique_specs():
    from kernel_src.registry import DECLS

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
    from kernel_src.registry import DECLS

    assert set(CASES) == set(DECLS)


def test_every_kernel_is_compared_with_upstream():
    # Every kernel here reimplements an upstream TileKernels v1 kernel; benchmarks/upstream.py runs both.
    from benchmarks.upstream import CASES
    from kernel_src.registry import DECLS

    assert set(CASES) == set(DECLS)
