"""Deliberately broken kernels, to check that the build names what failed and writes no wheel."""

from kernel_src.decl import KernelDecl, param
from kernel_src.moe import topk_gate


def _broken_factory(arch, size):
    raise ValueError(f'deliberately broken factory (size={size})')


BROKEN_LOWERING = KernelDecl(
    name='test.broken_lowering', params=(param('size', 'int', 's'),), factory=_broken_factory,
    prebuilt=lambda: [{'size': 3}], check=lambda size: None,
)
BROKEN_NVCC = KernelDecl(
    name='test.broken_nvcc', params=topk_gate.DECL.params, factory=topk_gate.build,
    prebuilt=lambda: [{'num_experts': 8, 'num_topk': 2}], check=topk_gate.check,
    pass_configs={'tl.disable_warp_specialized': True, 'tl.device_compile_flags': ['--no-such-nvcc-flag']},
)
DECLS = {d.name: d for d in (BROKEN_LOWERING, BROKEN_NVCC)}
