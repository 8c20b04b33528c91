"""engram.engram_hash: n-gram hash indices of Engram's embedding tables.

For layer l and token t with ids id_0 .. id_{N-1}: h_0 = id_0 * m[l, 0] and h_n = h_{n-1} XOR (id_n * m[l, n])
in int64 arithmetic that wraps; for n >= 1 and table j < M, out[l, t, (n-1) * M + j] =
int32(h_n mod vocab[l, n-1, j]) + offsets[l, (n-1) * M + j], the modulus floored (its sign follows the
divisor) and the int32 sum wrapping, as torch computes them, so every int32 id and int64 multiplier gives
torch's answer. A table size below 1 fails a device assert (kernel_src/bounds.py).

One thread per output index: a CTA of THREADS threads (rounded down to whole tokens) takes consecutive tokens of
one layer, thread c of a token computing column c = (n-1) * M + j. It reruns the hash up to order n from the
token's ids (the same addresses across the token's threads: broadcast loads), so every int64 modulus, the cost
of the kernel, runs on its own thread and a CTA's stores cover one contiguous span. N and M are the spec; the
token count, the layer count L and the row stride of the ids are run-time.
"""

from tilelang import language as T

from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.models import engram_hash_shapes

THREADS = 128  # threads of a CTA, at most: whole tokens of (N - 1) * M threads each
MAX_NGRAM = 8
MAX_TABLES = 32


def build(arch: Arch, max_ngram_size: int, tables_per_ngram: int) -> KernelProgram:
    n, m = max_ngram_size, tables_per_ngram
    cols = (n - 1) * m
    tokens = max(1, THREADS // cols)  # tokens of a CTA
    num_tokens, num_layers, ids_stride = T.dynamic('num_tokens'), T.dynamic('num_layers'), T.dynamic('ids_stride')

    @T.prim_func
    def engram_hash(
        ngram_token_ids: T.StridedTensor[(num_tokens, n), (ids_stride, 1), T.int32],
        multipliers: T.Tensor[(num_layers, n), T.int64],
        vocab_sizes: T.Tensor[(num_layers, n - 1, m), T.int32],
        offsets: T.Tensor[(num_layers, cols), T.int32],
        output: T.Tensor[(num_layers, num_tokens, cols), T.int32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, tokens), num_layers, threads=tokens * cols) as (pid_t, layer):
            tid = T.get_thread_binding()
            token = pid_t * tokens + tid // cols
            col = tid % cols
            order = col // m + 1  # the column hashes ids 0 .. order
            mixed = T.alloc_var(T.int64)
            if token < num_tokens:
                mixed = T.Cast(T.int64, ngram_token_ids[token, 0]) * multipliers[layer, 0]
                for i in T.unroll(1, n):
                    if i <= order:
                        mixed = T.bitwise_xor(mixed, T.Cast(T.int64, ngram_token_ids[token, i]) * multipliers[layer, i])
                size = vocab_sizes[layer, order - 1, col % m]
                device_assert(size > 0)
                vocab = T.Cast(T.int64, T.max(size, 1))  # masked: no modulus by 0
                output[layer, token, col] = T.Cast(T.int32, T.floormod(mixed, vocab)) + offsets[layer, col]

    return KernelProgram(engram_hash, alignment={'ngram_token_ids': 4, 'multipliers': 8, 'vocab_sizes': 4, 'offsets': 4,
                                                 'output': 4})


def check(max_ngram_size: int, tables_per_ngram: int) -> None:
    if not 2 <= max_ngram_size <= MAX_NGRAM:
        raise ValueError(f'max_ngram_size must be in [2, {MAX_NGRAM}], got {max_ngram_size}')
    if not 1 <= tables_per_ngram <= MAX_TABLES:
        raise ValueError(f'tables_per_ngram must be in [1, {MAX_TABLES}], got {tables_per_ngram}')


def prebuilt():
    return [{'max_ngram_size': n, 'tables_per_ngram': m} for n, _, m in engram_hash_shapes()]


DECL = KernelDecl(
    name='engram.engram_hash',
    params=(param('max_ngram_size', 'int', 'n'), param('tables_per_ngram', 'int', 'm')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True},
)
