"""moe.normalize_weight: denominator = 1e-20 + w_0 + w_1 + ... (in k order), normalized = w / denominator.

One thread per token. The number of weights per token is a run-time dim like the token count: the sum
is taken in a first pass over the row and the divisions in a second (the row is still in L1), so one
binary serves every top-k.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

THREADS = 128
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
            if row < num_tokens:
                total = T.alloc_var(T.float32)
                total = T.float32(EPSILON)
                for k in T.serial(num_topk):
                    total = total + topk_weights[row, k]
                denominator[row] = total
                for k in T.serial(num_topk):
                    normalized_weights[row, k] = topk_weights[row, k] / total

    return KernelProgram(normalize_weight, alignment={'topk_weights': 4, 'denominator': 4, 'normalized_weights': 4})


DECL = KernelDecl(
    name='moe.normalize_weight',
    params=(param('dtype', 'str', ''),),
    factory=build,
    prebuilt=lambda: [{'dtype': 'float32'}],
    check=check,
    pass_configs={'tl.disable_warp_specialized': True},
)
