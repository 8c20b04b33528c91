"""engram.engram_hash: n-gram hash indices of Engram's embedding tables.

For layer l and token t with ids id_0 .. id_{N-1}: h_0 = id_0 * m[l, 0] and h_n = h_{n-1} XOR (id_n * m[l, n])
in int64 arithmetic that wraps; for n >= 1 and table j < M, out[l, t, (n-1) * M + j] =
int32(h_n mod vocab[l, n-1, j]) + offsets[l, (n-1) * M + j], the modulus floored (its sign follows the
divisor) and the int32 sum wrapping, as torch computes them, so every int32 id and int64 multiplier gives
torch's answer. A table size below 1 fails a device assert (kernel_src/bounds.py).

One thread per token and layer: a CTA of THREADS threads takes THREADS consecutive tokens of one layer,
reads the layer's multipliers, table sizes and offsets (the same addresses across the CTA: broadcast loads)
and writes its token's (N-1) * M indices as 16-byte vectors. N and M are the spec; the token count, the
layer count L and the row stride of the ids are run-time.
"""

from tilelang import language as T

from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.models import engram_hash_shapes

THREADS = 128
OUT_VEC = 4  # int32 indices a store
MAX_NGRAM = 8
MAX_TABLES = 32


def build(arch: Arch, max_ngram_size: int, tables_per_ngram: int) -> KernelProgram:
    n, m = max_ngram_size, tables_per_ngram
    cols = (n - 1) * m
    num_tokens, num_layers, ids_stride = T.dynamic('num_tokens'), T.dynamic('num_layers'), T.dynamic('ids_stride')

    @T.prim_func
    def engram_hash(
        ngram_token_ids: T.StridedTensor[(num_tokens, n), (ids_stride, 1), T.int32],
        multipliers: T.Tensor[(num_layers, n), T.int64],
        vocab_sizes: T.Tensor[(num_layers, n - 1, m), T.int32],
        offsets: T.Tensor[(num_layers, cols), T.int32],
        output: T.Tensor[(num_layers, num_tokens, cols), T.int32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), num_layers, threads=THREADS) as (pid_t, layer):
            tid = T.get_thread_binding()
            token = pid_t * THREADS + tid
            ids = T.alloc_local((n,), T.int32)
            out = T.alloc_local((cols,), T.int32)
            mixed = T.alloc_var(T.int64)
            sizes_ok = T.alloc_var(T.bool)
            if token < num_tokens:
                sizes_ok = True
                for i in T.unroll(n):
                    ids[i] = ngram_token_ids[token, i]
                mixed = T.Cast(T.int64, ids[0]) * multipliers[layer, 0]
                for i in T.unroll(1, n):
                    mixed = T.bitwise_xor(mixed, T.Cast(T.int64, ids[i]) * multipliers[layer, i])
                    for j in T.unroll(m):
                        sizes_ok = sizes_ok and vocab_sizes[layer, i - 1, j] > 0
                        vocab = T.Cast(T.int64, T.max(vocab_sizes[layer, i - 1, j], 1))  # masked: no modulus by 0
                        out[(i - 1) * m + j] = T.Cast(T.int32, T.floormod(mixed, vocab)) + offsets[layer, (i - 1) * m + j]
                device_assert(sizes_ok)
                for c in T.unroll(cols // OUT_VEC):
                    for e in T.vectorized(OUT_VEC):
                        output[layer, token, c * OUT_VEC + e] = out[c * OUT_VEC + e]
                for c in T.unroll(cols // OUT_VEC * OUT_VEC, cols):
                    output[layer, token, c] = out[c]

    vec_bytes = 16 if cols % OUT_VEC == 0 else 4
    return KernelProgram(engram_hash, alignment={'ngram_token_ids': 4, 'multipliers': 8, 'vocab_sizes': 4, 'offsets': 4,
                                                 'output': vec_bytes})


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
