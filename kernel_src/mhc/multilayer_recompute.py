"""mhc.multilayer_recompute: the layer inputs and residuals of a stack of mHC layers, recomputed in one pass.

    res = initial_residual
    for i in 0 .. L - 1:
        layer_input[i] = pre_apply_mix(res, pre_mix[i])                        (bf16)
        if i < Lp: res = residual[i] = post(layer_output[i], res, post_mix[i], comb_mix[i])   (bf16)

with Lp = L or L - 1. The sums are pre_apply_mix.mix_streams and post.post_streams, and the residual is kept as the bf16
values it is stored as, so every output equals, bit for bit, the loop of mhc.pre_apply_mix_fwd and mhc.post_fwd.

The layer count is run-time: the tensors of layer i are found through two device tables of addresses (int64),
`layer_tables[i] = (pre_mix[i], layer_input[i])` for i < L and `post_tables[i] = (layer_output[i], post_mix[i],
comb_mix[i], residual[i])` for i < Lp, which the op uploads without a host sync. Every tensor of a list has the shape
(and contiguity) of its layer-0 counterpart in the upstream op: pre/post mix (T, mhc), comb (T, mhc * mhc), layer
input and output (T, hidden), residual (T, mhc, hidden).

Grid (tokens, row slices): a block of row_slices.threads threads owns one slice of one token's row and carries it
through all the layers; a thread keeps its vector of every stream in registers as float32 and, while it computes
layer i, has the loads of layer i + 1 (its layer-output vector and the token's mixes) in flight.
"""

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc.post import post_streams
from kernel_src.mhc.pre_apply_mix import mix_streams
from kernel_src.mhc.row_slices import VEC, check_mhc_hidden, load_row, mix_vector, row_slices, stream_constants

PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True}
LAYER_COLUMNS = 2  # layer_tables: pre_mix, layer_input
POST_COLUMNS = 4  # post_tables: layer_output, post_mix, comb_mix, residual


def build(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, 1)
    mv = mix_vector(mhc)
    num_tokens, num_layers, num_post = T.dynamic('num_tokens'), T.dynamic('num_layers'), T.dynamic('num_post')

    @T.macro
    def load_post_layer(layer_out, post_w, comb_w, pre_w, post_tables, layer_tables, index, token, col):
        """Layer `index`'s inputs to post (its layer-output vector, post and comb mixes) and its pre mix."""
        layer_output = T.make_tensor(post_tables[index, 0], (num_tokens, hidden), T.bfloat16)
        for v in T.vectorized(VEC):
            layer_out[0, v] = layer_output[token, col + v]
        load_row(post_w, T.make_tensor(post_tables[index, 1], (num_tokens, mhc), T.float32), token, mhc, mv)
        load_row(comb_w, T.make_tensor(post_tables[index, 2], (num_tokens, mhc * mhc), T.float32), token, mhc * mhc, mv)
        load_row(pre_w, T.make_tensor(layer_tables[index, 0], (num_tokens, mhc), T.float32), token, mhc, mv)

    @T.macro
    def store_layer_input(res, pre_w, acc, result, layer_tables, index, token, col):
        mix_streams(acc, pre_w, res, 0, mhc)
        for v in T.unroll(VEC):
            result[v] = T.cast(acc[v], T.bfloat16)
        layer_input = T.make_tensor(layer_tables[index, 1], (num_tokens, hidden), T.bfloat16)
        for v in T.vectorized(VEC):
            layer_input[token, col + v] = result[v]

    @T.prim_func
    def multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        layer_tables: T.Tensor[(num_layers, LAYER_COLUMNS), T.int64],
        post_tables: T.Tensor[(num_post, POST_COLUMNS), T.int64],
    ):
        with T.Kernel(num_tokens, rs.slices, threads=rs.threads) as (token, s):
            tid = T.get_thread_binding()
            col = rs.column(s, tid, 0)
            res = T.alloc_local((1, mhc, VEC), T.float32)  # bf16 values
            loaded = T.alloc_local((mhc, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            result = T.alloc_local((VEC,), T.bfloat16)
            new_res = T.alloc_local((mhc, VEC), T.float32)
            stored = T.alloc_local((mhc, VEC), T.bfloat16)
            pre_w = T.alloc_local((mhc,), T.float32)
            post_w = T.alloc_local((mhc,), T.float32)
            comb_w = T.alloc_local((mhc * mhc,), T.float32)
            layer_out = T.alloc_local((1, VEC), T.bfloat16)
            next_pre_w = T.alloc_local((mhc,), T.float32)
            next_post_w = T.alloc_local((mhc,), T.float32)
            next_comb_w = T.alloc_local((mhc * mhc,), T.float32)
            next_layer_out = T.alloc_local((1, VEC), T.bfloat16)
            if not rs.ragged or col < hidden:
                for i in T.unroll(mhc):
                    for v in T.vectorized(VEC):
                        loaded[i, v] = initial_residual[token, i, col + v]
                for i in T.unroll(mhc):
                    for v in T.unroll(VEC):
                        res[0, i, v] = T.cast(loaded[i, v], T.float32)
                if num_post > 0:
                    load_post_layer(layer_out, post_w, comb_w, pre_w, post_tables, layer_tables, 0, token, col)
                for layer in T.serial(num_post):
                    if layer + 1 < num_post:
                        load_post_layer(next_layer_out, next_post_w, next_comb_w, next_pre_w, post_tables, layer_tables, layer + 1, token, col)
                    store_layer_input(res, pre_w, acc, result, layer_tables, layer, token, col)
                    post_streams(new_res, post_w, comb_w, layer_out, res, 0, mhc)
                    for i in T.unroll(mhc):
                        for v in T.unroll(VEC):
                            stored[i, v] = T.cast(new_res[i, v], T.bfloat16)
                            res[0, i, v] = T.cast(stored[i, v], T.float32)
                    residual = T.make_tensor(post_tables[layer, 3], (num_tokens, mhc, hidden), T.bfloat16)
                    for i in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            residual[token, i, col + v] = stored[i, v]
                    for k in T.unroll(mhc):
                        pre_w[k] = next_pre_w[k]
                        post_w[k] = next_post_w[k]
                    for k in T.unroll(mhc * mhc):
                        comb_w[k] = next_comb_w[k]
                    for v in T.unroll(VEC):
                        layer_out[0, v] = next_layer_out[0, v]
                if num_layers > num_post:  # the last layer has no post: num_post == num_layers - 1
                    load_row(pre_w, T.make_tensor(layer_tables[num_layers - 1, 0], (num_tokens, mhc), T.float32), token, mhc, mv)
                    store_layer_input(res, pre_w, acc, result, layer_tables, num_layers - 1, token, col)

    return KernelProgram(multilayer_recompute, alignment={'initial_residual': 16, 'layer_tables': 8, 'post_tables': 8})


def check(mhc: int, hidden: int) -> None:
    check_mhc_hidden(mhc, hidden)


def prebuilt():
    from kernel_src.models import mhc_shapes

    for mhc, hidden in mhc_shapes():
        yield dict(mhc=mhc, hidden=hidden)


DECL = KernelDecl('mhc.multilayer_recompute', (param('mhc', 'int', 'm'), param('hidden', 'int', 'h')), build, prebuilt, check,
                  PASS_CONFIGS, constants=stream_constants)
