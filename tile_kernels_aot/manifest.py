"""The manifest: the one schema that the build writes and the loader reads.

Every arch package (``tile_kernels_aot_sm90a``, ...) carries one ``manifest.json``. It describes each
prebuilt binary completely enough that the loader never needs tilelang: the spec it was built for, the
exact target, the cubin and its sha256, the entry symbol and parameter order, how grid and block follow
from the dynamic dims, shared memory, launch attributes and TMA descriptor recipes, and the constants its
declaration gives the runtime (``Entry.constants``: tile sizes, elements per thread, index limits; see
``kernel_src.decl``), which the ops compute their run-time arguments and checks from.

Grid, block, shape and stride expressions are stored as small JSON trees (``["//", "num_tokens", 4]``)
and evaluated by :func:`compile_expr`, never by ``eval``.

This module is pure Python (no torch, no tilelang) so that ``build_tools`` can share it.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Union

from tile_kernels_aot.errors import ManifestError, ManifestSchemaError

SCHEMA_VERSION = 2  # 2: Entry.constants

Expr = Union[int, str, list]
ParamValue = Union[int, bool, str]

_BINARY_OPS: dict[str, Callable[[int, int], int]] = {
    '+': operator.add,
    '-': operator.sub,
    '*': operator.mul,
    '//': operator.floordiv,
    '%': operator.mod,
    'min': min,
    'max': max,
}


def compile_expr(expr: Expr) -> Callable[[Mapping[str, int]], int]:
    """Turn an expression tree into a function of the bound dynamic dims.

    An expression is an ``int``, the name of a dynamic dim, or ``[op, lhs, rhs]`` with ``op`` one of
    ``+ - * // % min max``. Anything else is rejected here, at load time, not at launch time.
    """
    if isinstance(expr, bool):
        raise ValueError(f'bad expression {expr!r}: booleans are not integers here')
    if isinstance(expr, int):
        return lambda env, _v=expr: _v
    if isinstance(expr, str):
        return lambda env, _k=expr: env[_k]
    if isinstance(expr, list) and len(expr) == 3 and expr[0] in _BINARY_OPS:
        fn = _BINARY_OPS[expr[0]]
        lhs, rhs = compile_expr(expr[1]), compile_expr(expr[2])
        return lambda env: fn(lhs(env), rhs(env))
    raise ValueError(f'bad expression {expr!r}')


def expr_vars(expr: Expr) -> set[str]:
    if isinstance(expr, str):
        return {expr}
    if isinstance(expr, list):
        return expr_vars(expr[1]) | expr_vars(expr[2])
    return set()


def format_expr(expr: Expr) -> str:
    if isinstance(expr, list):
        op, lhs, rhs = expr
        if op in ('min', 'max'):
            return f'{op}({format_expr(lhs)}, {format_expr(rhs)})'
        return f'({format_expr(lhs)} {op} {format_expr(rhs)})'
    return str(expr)


# --------------------------------------------------------------------------------------------------
# Spec keys


@dataclasses.dataclass(frozen=True)
class ParamSchema:
    """One compile-time parameter of a kernel: its name, type and the short tag used in file names."""

    name: str
    kind: str  # 'int' | 'bool' | 'str'
    tag: str

    def parse(self, text: str) -> ParamValue:
        if self.kind == 'int':
            return int(text)
        if self.kind == 'bool':
            if text not in ('0', '1', 'true', 'false', 'True', 'False'):
                raise ValueError(f'{self.name}: expected a boolean, got {text!r}')
            return text in ('1', 'true', 'True')
        return text

    def format(self, value: ParamValue) -> str:
        if self.kind == 'bool':
            return '1' if value else '0'
        return str(value)

    def check(self, value: Any) -> ParamValue:
        expected = {'int': int, 'bool': bool, 'str': str}[self.kind]
        if self.kind == 'int' and isinstance(value, bool) or not isinstance(value, expected):
            raise TypeError(f'parameter {self.name!r} must be {self.kind}, got {value!r}')
        return value


def spec_key(schema: tuple[ParamSchema, ...], params: Mapping[str, ParamValue]) -> str:
    """Canonical text of a spec: ``name=value,...`` in declaration order. Round-trips with parse_spec_key."""
    names = [p.name for p in schema]
    if sorted(names) != sorted(params):
        raise KeyError(f'spec parameters {sorted(params)} do not match the kernel parameters {names}')
    return ','.join(f'{p.name}={p.format(p.check(params[p.name]))}' for p in schema)


def parse_spec_key(schema: tuple[ParamSchema, ...], key: str) -> dict[str, ParamValue]:
    by_name = {p.name: p for p in schema}
    params: dict[str, ParamValue] = {}
    for item in key.split(','):
        name, sep, text = item.partition('=')
        if not sep or name not in by_name or name in params:
            raise ValueError(f'bad spec key {key!r} at {item!r}; parameters are {list(by_name)}')
        params[name] = by_name[name].parse(text)
    if len(params) != len(schema):
        raise ValueError(f'bad spec key {key!r}: missing {sorted(set(by_name) - set(params))}')
    return params


def spec_file_stem(schema: tuple[ParamSchema, ...], params: Mapping[str, ParamValue]) -> str:
    """Short, file-system-safe name of a spec: ``e256-k8`` (tag + value per parameter)."""
    return '-'.join(f'{p.tag}{p.format(params[p.name])}' for p in schema)


# --------------------------------------------------------------------------------------------------
# Entries


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """A tensor parameter of the TileLang program, with its shape and strides as expressions."""

    name: str
    dtype: str
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    alignment: int  # bytes the data pointer must be aligned to


@dataclasses.dataclass(frozen=True)
class TmaRecipe:
    """Arguments of cuTensorMapEncodeTiled, as expressions of the dynamic dims (innermost first)."""

    buffer: str
    data_type: int
    rank: int
    global_dims: tuple[Expr, ...]
    global_strides: tuple[Expr, ...]  # bytes, rank - 1 entries (the innermost stride is implicit)
    box_dims: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


@dataclasses.dataclass(frozen=True)
class KernelArg:
    """One parameter of the device entry point, in order: a buffer pointer, a scalar or a TMA descriptor."""

    name: str
    kind: str  # 'ptr' | 'int32' | 'int64' | 'float32' | 'tma'


@dataclasses.dataclass(frozen=True)
class Launch:
    symbol: str
    args: tuple[KernelArg, ...]
    grid: tuple[Expr, Expr, Expr]
    block: tuple[int, int, int]
    dynamic_smem: int
    cooperative: bool
    cluster_dims: tuple[int, int, int] | None
    pdl: bool
    tma: tuple[TmaRecipe, ...]


@dataclasses.dataclass(frozen=True)
class Entry:
    kernel: str
    key: str
    params: dict[str, ParamValue]
    target: str
    cubin: str
    sha256: str
    source: str
    buffers: tuple[BufferSpec, ...]
    scalars: tuple[KernelArg, ...]  # run-time scalar arguments that no buffer shape defines
    launches: tuple[Launch, ...]
    constants: dict[str, int]  # what the declaration tells the runtime about this binary (KernelDecl.constants)


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[ParamSchema, ...]
    entries: dict[str, Entry]  # by spec key


@dataclasses.dataclass(frozen=True)
class Manifest:
    target: str
    package: str
    version: str
    provenance: dict[str, Any]
    kernels: dict[str, KernelInfo]


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def _expr(value: Any) -> Expr:
    compile_expr(value)  # reject malformed trees when the manifest is read
    return value


def _launch_from_plain(d: dict) -> Launch:
    cluster = d['cluster_dims']
    return Launch(
        symbol=d['symbol'],
        args=tuple(KernelArg(**a) for a in d['args']),
        grid=tuple(_expr(g) for g in d['grid']),
        block=tuple(int(b) for b in d['block']),
        dynamic_smem=int(d['dynamic_smem']),
        cooperative=bool(d['cooperative']),
        cluster_dims=tuple(cluster) if cluster else None,
        pdl=bool(d['pdl']),
        tma=tuple(
            TmaRecipe(**{**t, **{k: tuple(t[k]) for k in ('global_dims', 'global_strides', 'box_dims', 'element_strides')}})
            for t in d['tma']
        ),
    )


def entry_from_plain(d: dict) -> Entry:
    return Entry(
        kernel=d['kernel'],
        key=d['key'],
        params=dict(d['params']),
        target=d['target'],
        cubin=d['cubin'],
        sha256=d['sha256'],
        source=d['source'],
        buffers=tuple(
            BufferSpec(b['name'], b['dtype'], tuple(map(_expr, b['shape'])), tuple(map(_expr, b['strides'])), int(b['alignment']))
            for b in d['buffers']
        ),
        scalars=tuple(KernelArg(**s) for s in d['scalars']),
        launches=tuple(_launch_from_plain(x) for x in d['launches']),
        constants=_constants(d['constants']),
    )


def _constants(d: Any) -> dict[str, int]:
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in d.items()):
        raise ValueError(f'bad constants {d!r}: expected {{name: int}}')
    return dict(d)


def manifest_from_json(text: str, *, package: str | None = None, file: str | None = None) -> Manifest:
    """Parse a manifest. Every fault raises ManifestError (or ManifestSchemaError) naming `file` and `package`
    where given: 'truncated' when the JSON ends early, 'malformed' for any other bad JSON or a missing or
    ill-typed field (with where it is), 'schema' for another schema version."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip())
        reason = 'truncated' if truncated else 'malformed'
        what = 'the JSON ends early' if truncated else 'bad JSON'
        raise ManifestError(reason, f'{reason} manifest: {what} ({exc.msg} at line {exc.lineno} column {exc.colno})',
                            package=package, file=file) from None
    if not isinstance(d, dict):
        raise ManifestError('malformed', f'malformed manifest: a JSON {type(d).__name__}, not an object', package=package, file=file)
    if d.get('schema') != SCHEMA_VERSION:
        raise ManifestSchemaError(SCHEMA_VERSION, d.get('schema'), package=package, file=file)
    where = 'the top level'
    try:
        kernels = {}
        for name, k in d['kernels'].items():
            where = f'kernels[{name!r}]'
            schema = tuple(ParamSchema(**p) for p in k['params'])
            entries = {}
            for key, e in k['entries'].items():
                where = f'kernels[{name!r}].entries[{key!r}]'
                entries[key] = entry_from_plain(e)
            kernels[name] = KernelInfo(name, schema, entries)
        where = 'the top level'
        return Manifest(d['target'], d['package'], d['version'], d['provenance'], kernels)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = f'no field {exc}' if isinstance(exc, KeyError) else f'{type(exc).__name__}: {exc}'
        raise ManifestError('malformed', f'malformed manifest at {where}: {problem}', package=package, file=file) from exc


def read_manifest(path: Path | str, *, package: str | None = None) -> Manifest:
    """Read and parse ``path``; a missing or unreadable file is a ManifestError too (reason 'missing')."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = 'missing' if isinstance(exc, FileNotFoundError) else 'malformed'
        detail = 'no manifest.json there' if reason == 'missing' else f'cannot read it: {exc}'
        raise ManifestError(reason, detail, package=package, file=str(path)) from exc
    return manifest_from_json(text, package=package, file=str(path))


def manifest_to_json(manifest: Manifest) -> str:
    plain = _to_plain(manifest)
    plain['schema'] = SCHEMA_VERSION
    return json.dumps(plain, indent=1, sort_keys=True) + '\n'
