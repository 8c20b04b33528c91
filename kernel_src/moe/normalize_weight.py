"""moe.normalize_weight: denominator = 1e-20 + w_0 + w_1 + ... (in k order), normalized = w / denominator.

One thread per token, 32 tokens per block (8192 tokens fill every SM). The number of weights per token is
a run-time dim like the token count, so one binary serves every top-k: the first UNROLLED weights are
loaded by predicated loads issued together (one memory latency, not K), the rest, if any, in a loop;
the sum runs in k order and the divisions follow.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

THREADS = 32
UNROLLED = 16  # covers the top-k of every model in kernel_src/models.py
EPSILON = 1e-20  # upstream's: it also keeps an all-zero row finite


def check(dtype: str) -> None:
    if dtype != 'float32':
        raise ValueError(f"dtype must be 'float32', got {dtype!r}")


def build(arch: Arch, dtype: str) -> KernelProgram:
    num_tokens = T.dynamic('num_tokens')
    num_topk = T.dynamic('num_topk')
    row_stride = T.dynamic('row_stride')

    @T.prim_func
    def normalize_weight(
        topk_weights: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), T.float32],
        denominator: T.Tensor[(num_tokens,), T.float32],
        normalized_weights: T.Tensor[(num_tokens, num_topk), T.float32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as pid:
            row = pid * THREADS + T.get_thread_binding()
            first = T.alloc_local((UNROLLED,), T.float32)
            if row < num_tokens:
                for k in T.unroll(UNROLLED):
                    first[k] = T.if_then_else(k < num_topk, topk_weights[row, T.min(k, num_topk - 1)], T.float32(0))
                total = T.alloc_var(T.float32)
                total = T.float32(EPSILON)
                for k in T.unroll(UNROLLED):
                    if k < num_topk:
                        total = total + first[k]
                for k in T.serial(T.max(num_topk - UNROLLED, 0)):
                    total = total + topk_weights[row, UNROLLED + k]
                denominator[row] = total
                for k in T.unroll(UNROLLED):
                    if k < num_topk:
                        normalized_weights[row, k] = first[k] / total
                for k in T.serial(T.max(num_topk - UNROLLED, 0)):
                    normalized_weights[row, UNROLLED + k] = topk_weights[row, UNROLLED + k] / total

    return KernelProgram(normalize_weight, alignment={'topk_weights': 4, 'denominator': 4, 'normalized_weights': 4})


DECL = KernelDecl(
    name='moe.normalize_weight',
    params=(param('dtype', 'str', ''),),
    factory=build,
    prebuilt=lambda: [{'dtype': 'float32'}],
    check=check,
    pass_configs={'tl.disable_warp_specialized': True},
)
