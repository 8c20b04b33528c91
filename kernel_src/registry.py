"""Every kernel declaration, by name. Adding a kernel means adding its module here, nothing more."""

from kernel_src.decl import KernelDecl
from kernel_src.moe import topk_gate
from kernel_src.quant import per_token_cast
from kernel_src.transpose import batched_transpose

DECLS: dict[str, KernelDecl] = {m.DECL.name: m.DECL for m in (batched_transpose, topk_gate, per_token_cast)}
