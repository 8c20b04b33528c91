"""Lower one (kernel, spec, arch) with tilelang and describe how to launch the result.

Runs in worker processes; this is the only module that imports tilelang. Its output is the CUDA C++
source of the device code and a JSON-ready description of the launch (buffers, argument order, grid and
block as expressions of the dynamic dims, shared memory, launch attributes, TMA recipes), read straight
from the lowered modules. Nothing is parsed out of generated text.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tilelang
import tvm
from tvm import tirx

from kernel_src.decl import Arch, KernelDecl
from tile_kernels_aot.manifest import expr_vars

_TIR_BINARY = {
    tirx.Add: '+',
    tirx.Sub: '-',
    tirx.Mul: '*',
    tirx.FloorDiv: '//',
    tirx.FloorMod: '%',
    tirx.Min: 'min',
    tirx.Max: 'max',
}

_DTYPE_NAMES = {
    'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'float16', 'float8_e4m3fn': 'float8_e4m3fn',
    'float8_e4m3': 'float8_e4m3fn', 'int64': 'int64', 'int32': 'int32', 'uint32': 'uint32', 'int8': 'int8',
    'uint8': 'uint8', 'bool': 'bool',
}


class LoweringError(RuntimeError):
    pass


def to_expr(node: Any) -> Any:
    """A TIR integer expression as a manifest expression tree (see tile_kernels_aot.manifest)."""
    if isinstance(node, int):
        return node
    if isinstance(node, tirx.IntImm):
        return int(node.value)
    if isinstance(node, tirx.Var):
        return node.name
    if isinstance(node, tirx.Cast):
        return to_expr(node.value)
    for cls, op in _TIR_BINARY.items():
        if isinstance(node, cls):
            return [op, to_expr(node.a), to_expr(node.b)]
    raise LoweringError(f'cannot express {type(node).__name__} `{node}` in the manifest')


def _contiguous_strides(shape: list[Any]) -> list[Any]:
    strides: list[Any] = []
    running: Any = 1
    for dim in reversed(shape):
        strides.append(running)
        running = dim if running == 1 else ['*', dim, running]
    return list(reversed(strides))


def buffer_name(param: tirx.Var) -> str:
    """A buffer's name in the manifest: its parameter's name in the program's signature (tilelang names the handle
    `<name>_handle`). The buffer object may carry another name: a body that binds a parameter to a new name
    (`x_in = x if strided else T.Tensor(...)`) renames the buffer itself, and the op passes tensors by the
    signature's names."""
    return param.name.removesuffix('_handle')


def _buffers(func: tirx.PrimFunc, alignment: dict[str, int]) -> list[dict]:
    out = []
    for p in func.params:
        if p not in func.buffer_map:
            continue
        buf, name = func.buffer_map[p], buffer_name(p)
        shape = [to_expr(d) for d in buf.shape]
        strides = [to_expr(s) for s in buf.strides] if len(buf.strides) else _contiguous_strides(shape)
        dtype = _DTYPE_NAMES.get(str(buf.dtype))
        if dtype is None:
            raise LoweringError(f'buffer {name}: dtype {buf.dtype} has no manifest name')
        out.append(dict(name=name, dtype=dtype, shape=shape, strides=strides, alignment=int(alignment.get(name, 16))))
    return out


def _tma_recipes(host_func: tirx.PrimFunc, data_to_buffer: dict[str, str]) -> dict[str, dict]:
    recipes = {}
    tma_args = host_func.attrs.get('tma_descriptor_args') if host_func.attrs else None
    for desc, args in (tma_args or {}).items():
        kind = str(args[0].value) if hasattr(args[0], 'value') else str(args[0])
        if kind != '__tvm_tensormap_create_tiled':
            raise LoweringError(f'TMA descriptor {desc.name}: only tiled descriptors are supported, got {kind}')
        _, _, dtype, rank, address, *rest = args
        rank = int(rank)
        dims = [to_expr(x) for x in rest[:rank]]
        strides = [to_expr(x) for x in rest[rank:2 * rank]]
        box = [int(x) for x in rest[2 * rank:3 * rank]]
        elem_strides = [int(x) for x in rest[3 * rank:4 * rank]]
        interleave, swizzle, l2, oob = (int(x) for x in rest[4 * rank:4 * rank + 4])
        recipes[desc.name] = dict(
            buffer=data_to_buffer[address.name], data_type=int(dtype), rank=rank, global_dims=dims,
            global_strides=strides[1:], box_dims=box, element_strides=elem_strides,
            interleave=interleave, swizzle=swizzle, l2_promotion=l2, oob_fill=oob,
        )
    return recipes


def _launches(art: Any, data_to_buffer: dict[str, str]) -> list[dict]:
    ((_, host_func),) = art.host_mod.functions.items()
    if host_func.attrs and host_func.attrs.get('l2_persistent_map'):
        raise LoweringError('l2_persistent_map is not supported by the loader')
    host_text = str(host_func)
    tma = _tma_recipes(host_func, data_to_buffer)
    launches = []
    for gv, dev in art.device_mod.functions.items():
        attrs = dev.attrs
        extent = {str(k): v for k, v in attrs['thread_extent'].items()}
        grid = [to_expr(extent.get(f'blockIdx.{a}', 1)) for a in 'xyz']
        block = []
        for a in 'xyz':
            b = to_expr(extent.get(f'threadIdx.{a}', 1))
            if not isinstance(b, int):
                raise LoweringError(f'{gv.name_hint}: block size threadIdx.{a} = {b} is not a constant')
            block.append(b)
        args = []
        for p in dev.params:
            name = p.name
            if name in tma:
                args.append(dict(name=name, kind='tma'))
            elif str(p.dtype) == 'handle':
                if name not in data_to_buffer:
                    raise LoweringError(f'{gv.name_hint}: pointer parameter {name} is not a buffer of the program')
                args.append(dict(name=data_to_buffer[name], kind='ptr'))
            elif str(p.dtype) in ('int32', 'int64', 'float32'):
                args.append(dict(name=name, kind=str(p.dtype)))
            else:
                raise LoweringError(f'{gv.name_hint}: parameter {name} of type {p.dtype} is not supported')
        cluster = attrs.get('cluster_dims')
        cluster = [int(c) for c in cluster] if cluster is not None else None
        if cluster is not None and all(c == 1 for c in cluster):
            cluster = None
        cooperative = bool(attrs.get('use_cooperative_groups', False))
        if cooperative and cluster:
            raise LoweringError(f'{gv.name_hint}: a cooperative launch cannot use clusters')
        # Where the host function calls the kernel decides the launch order of a multi-kernel program.
        marker = f'T.call_packed("{gv.name_hint}"'
        position = host_text.find(marker)
        if position < 0:
            position = host_text.find(f'"{gv.name_hint}"')
        launches.append((position, dict(
            symbol=gv.name_hint, args=args, grid=grid, block=block,
            dynamic_smem=int(attrs.get('dyn_shared_memory_buf', 0) or 0),
            cooperative=cooperative, cluster_dims=cluster, pdl=bool(attrs.get('has_cuda_pdl_sync', False)),
            tma=[tma[a['name']] for a in args if a['kind'] == 'tma'],
        )))
    return [launch for _, launch in sorted(launches, key=lambda item: item[0])]


@dataclasses.dataclass
class Lowered:
    source: str
    launch: dict


def lower(decl: KernelDecl, params: dict, arch: Arch) -> Lowered:
    program = decl.factory(arch, **params)
    func = program.func
    target = tvm.target.Target({'kind': 'cuda', 'arch': arch.target})
    with target, tvm.transform.PassContext(opt_level=3, config=dict(decl.pass_configs)):
        art = tilelang.lower(func, target=target)
    buffers = _buffers(func, dict(program.alignment))
    data_to_buffer = {func.buffer_map[p].data.name: buffer_name(p) for p in func.params if p in func.buffer_map}
    scalars = [dict(name=p.name, kind=str(p.dtype)) for p in func.params if p not in func.buffer_map]
    launch = dict(buffers=buffers, scalars=scalars, launches=_launches(art, data_to_buffer))
    _check_solvable(launch)
    _check_stores_kept(func, art)
    for gv, dev in art.device_mod.functions.items():
        _check_barriers_uniform(gv.name_hint, dev)
    return Lowered(source=art.kernel_source, launch=launch)


def _check_barriers_uniform(symbol: str, dev: tirx.PrimFunc) -> None:
    """Refuse a CTA-wide barrier (`__syncthreads()`) under a condition that threads of one CTA can answer differently.
    Such a barrier is undefined behaviour: tilelang's barrier pass can put one inside a kernel's per-thread paths, where
    it hangs the GPU and the compute-sanitizers, at their small inputs, see nothing. A condition counts as uniform when
    it reads only the kernel's parameters, the block index, constants, and variables bound (or loop variables ranging)
    over those; any load (a local, shared or global buffer) or the thread index makes it per-thread. Named barriers
    inside extern helpers (bar.sync with a thread count) are not seen here."""
    uniform = set(dev.params)

    def is_uniform(expr) -> bool:
        ok = [True]

        def visit(node):
            if isinstance(node, tirx.BufferLoad) or (isinstance(node, tirx.Var) and node not in uniform):
                ok[0] = False

        tirx.stmt_functor.post_order_visit(tirx.Evaluate(expr), visit)
        return ok[0]

    def walk(stmt, conditions):
        if isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == 'thread_extent' and stmt.node.thread_tag.startswith('blockIdx'):
            uniform.add(stmt.node.var)
        elif isinstance(stmt, tirx.For) and is_uniform(stmt.min) and is_uniform(stmt.extent):
            uniform.add(stmt.loop_var)
        elif type(stmt).__name__ in ('Bind', 'LetStmt') and is_uniform(stmt.value):
            uniform.add(stmt.var)
        if isinstance(stmt, tirx.IfThenElse):
            inner = conditions if is_uniform(stmt.condition) else conditions + [stmt.condition]
            walk(stmt.then_case, inner)
            if stmt.else_case is not None:
                walk(stmt.else_case, inner)
            return
        if isinstance(stmt, tirx.While):
            walk(stmt.body, conditions if is_uniform(stmt.condition) else conditions + [stmt.condition])
            return
        if isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tirx.Call) and stmt.value.op.name.endswith('tvm_storage_sync'):
            if conditions:
                raise LoweringError(f'{symbol}: a __syncthreads() under a condition that threads of one CTA can answer '
                                    f'differently ({conditions[-1]}): undefined, and a hang when they disagree')
            return
        for attr in ('body', 'seq', 'then_case', 'else_case', 'block'):
            child = getattr(stmt, attr, None)
            if child is None:
                continue
            for node in [child] if isinstance(child, tirx.Stmt) else child:
                walk(node, conditions)

    walk(dev.body, [])


def _check_stores_kept(func, art) -> None:
    """Refuse a lowering that lost every access to a buffer the program stores to. tilelang 0.1.15 can drop a whole
    branch of stores (a condition on the thread index against a constant shifted by a kernel scalar); the kernel then
    builds, launches and leaves that output unwritten. A stored-to buffer the device code still touches in some other
    way is not caught; one it no longer touches at all is."""
    param_data = {func.buffer_map[p].data: buffer_name(p) for p in func.params if p in func.buffer_map}
    stored = {}  # data variable's name -> buffer name

    def visit_program(node):
        if isinstance(node, tirx.BufferStore) and node.buffer.data in param_data:
            stored[node.buffer.data.name] = param_data[node.buffer.data]

    tirx.stmt_functor.post_order_visit(func.body, visit_program)
    if not stored:
        return
    touched = set()

    def visit_device(node):
        if isinstance(node, tirx.Var):
            touched.add(node.name)
        elif isinstance(node, (tirx.BufferStore, tirx.BufferLoad)):
            touched.add(node.buffer.data.name)

    for dev in art.device_mod.functions.values():
        tirx.stmt_functor.post_order_visit(dev.body, visit_device)
    lost = sorted(stored[d] for d in stored.keys() - touched)
    if lost:
        raise LoweringError(f'the program stores to {", ".join(lost)}, but the lowered device code '
                            f'no longer touches {"it" if len(lost) == 1 else "them"}: tilelang dropped those stores')


def _check_solvable(launch: dict) -> None:
    """The loader reads every dynamic dim off a tensor (a bare name in some buffer's shape or stride)
    or takes it as a scalar argument; refuse a program whose shapes, grid or arguments need anything else."""
    bound = {e for b in launch['buffers'] for e in b['shape'] + b['strides'] if isinstance(e, str)}
    known = bound | {s['name'] for s in launch['scalars']}
    for b in launch['buffers']:
        for e in b['shape'] + b['strides']:
            if expr_vars(e) - bound:
                raise LoweringError(f'buffer {b["name"]} uses {sorted(expr_vars(e) - bound)}, which no buffer dim defines')
    for kernel in launch['launches']:
        unknown = set().union(*(expr_vars(g) for g in kernel['grid'])) | {a['name'] for a in kernel['args'] if a['kind'] in ('int32', 'int64', 'float32')}
        if unknown - known:
            raise LoweringError(f'{kernel["symbol"]}: {sorted(unknown - known)} are neither buffer dims nor program parameters')


def lower_job(job: tuple[str, str, dict, str]) -> tuple[str, Lowered | None, str | None]:
    """Process-pool entry point: (registry module, kernel name, params, target) -> (key, result, error text)."""
    import importlib
    import traceback

    registry, name, params, target = job
    decl = importlib.import_module(registry).DECLS[name]
    key = decl.key(params)
    try:
        return key, lower(decl, params, Arch(target)), None
    except Exception:  # noqa: BLE001 - reported with the kernel, spec and arch by the caller
        return key, None, traceback.format_exc()
