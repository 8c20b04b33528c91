"""What a kernel declaration is.

One ``KernelDecl`` per kernel drives everything downstream: ``build_tools`` lowers ``factory`` for every
spec that ``prebuilt`` yields (plus any the user adds with ``--specs``), the manifest records ``params``
as the spec schema, the loader dispatches on those names, and the tests and benchmarks enumerate the
specs that the manifest lists. Nothing else keeps a list of kernels or specs.

``constants`` are the kernel's facts that the runtime computes with but cannot read off the launch: tile
sizes, elements per thread, chunk counts, index limits. The build writes them into every manifest entry
(``Entry.constants``) and the ops read them from there, so each such number is written once, here in
kernel_src, beside the code that relies on it. They are declared, not compiled: changing one changes no
binary, only what the op computes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tile_kernels_aot.targets import KNOWN_TARGETS, cli_arch, family
from tile_kernels_aot.manifest import ParamSchema, ParamValue, spec_file_stem, spec_key


@dataclasses.dataclass(frozen=True)
class Arch:
    """A build target: ``sm_90a`` runs on compute capability 9.0 only, ``sm_100f`` on the SM100 family (10.0
    and 10.3). Per-arch tuning (register caps, vector widths) is keyed by ``family`` so that every target of
    a family gets the same choices."""

    target: str  # 'sm_90a', 'sm_100f'

    @property
    def family(self) -> str:
        return family(self.target)

    @property
    def sm(self) -> int:
        return int(self.target[3:].rstrip('af'))

    @property
    def cli_name(self) -> str:
        return cli_arch(self.target)

    @property
    def compute(self) -> str:
        return 'compute_' + self.target[3:]


ARCHS = tuple(Arch(t) for t in KNOWN_TARGETS)  # the runtime's list of targets is the build's too


@dataclasses.dataclass(frozen=True)
class KernelProgram:
    """What a factory returns: the TileLang program and the pointer alignment each buffer needs."""

    func: Any  # tvm PrimFunc
    alignment: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class KernelDecl:
    name: str  # public id, '<family>.<op>' as in the Python API, e.g. 'moe.topk_gate'
    params: tuple[ParamSchema, ...]
    factory: Callable[..., KernelProgram]  # factory(arch, **params)
    prebuilt: Callable[[], Iterable[Mapping[str, ParamValue]]]
    check: Callable[..., None]  # check(**params): raises ValueError for a spec the factory cannot build
    pass_configs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # {name: int} for every spec, or constants(arch, **params) -> {name: int} where a value depends on the spec
    # (see the module docstring); the manifest entry of each binary holds them.
    constants: Mapping[str, int] | Callable[..., Mapping[str, int]] = dataclasses.field(default_factory=dict)

    def normalize(self, params: Mapping[str, Any]) -> dict[str, ParamValue]:
        known = {p.name for p in self.params}
        unknown = set(params) - known
        missing = known - set(params)
        if unknown or missing:
            raise ValueError(f'{self.name}: spec {dict(params)} has unknown {sorted(unknown)} / missing {sorted(missing)} parameters')
        out = {p.name: p.check(params[p.name]) for p in self.params}
        self.check(**out)
        return out

    def key(self, params: Mapping[str, ParamValue]) -> str:
        return spec_key(self.params, params)

    def file_stem(self, params: Mapping[str, ParamValue]) -> str:
        return spec_file_stem(self.params, params)

    def constants_for(self, arch: Arch, params: Mapping[str, ParamValue]) -> dict[str, int]:
        """The constants of the binary for `params` on `arch`, by name."""
        values = self.constants(arch, **params) if callable(self.constants) else self.constants
        out = {}
        for name, value in sorted(values.items()):
            if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f'{self.name}: constant {name!r} must be an int with a str name, got {value!r}')
            out[name] = value
        return out

    def specs(self) -> list[dict[str, ParamValue]]:
        """The prebuilt specs, validated and without duplicates, in a stable order."""
        seen: dict[str, dict[str, ParamValue]] = {}
        for params in self.prebuilt():
            norm = self.normalize(params)
            seen.setdefault(self.key(norm), norm)
        return [seen[k] for k in sorted(seen)]


def param(name: str, kind: str, tag: str) -> ParamSchema:
    return ParamSchema(name=name, kind=kind, tag=tag)
