"""CUDA implementations of opaque op types (`tilekit.opaque`), one emit rule per type.

An opaque op runs as its own kernel: a grid-stride loop over its output with the default
schedule (`DEFAULT_THREADS` threads per block). `CUDA_OPAQUE` is the registry; a type that is
not in it is an error at codegen that names the op and lists what is implemented (there is no
host fallback: a module either runs wholly on the device or is refused before anything runs,
see docs/codegen.md).

Index semantics follow the NumPy reference: negative indices count from the end. An index
still out of range after that (the reference raises) reads 0 here, because a kernel cannot
raise; `tk-run --check` finds such inputs.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from tilekit.codegen.builder import BLOCK, NBLOCKS, KernelBuilder
from tilekit.codegen.cexpr import load_value, storage
from tilekit.codegen.emitter import Emitter
from tilekit.codegen.kernel import (GeneratedKernel, Signature, finish, grid_stride_end,
                                    index_type, new_kernel, strides, tvar)
from tilekit.codegen.plan import OpaquePlan
from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.model import Module
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid

Rule = Callable[[Module, OpaquePlan, str], GeneratedKernel]


def _spec(plan: OpaquePlan) -> tuple[list[str], list[str], Mapping]:
    spec = plan.op.opaque or {}
    return (list(spec.get("inputs", ())), list(spec.get("outputs", ())),
            dict(spec.get("attrs") or {}))


def _grid_stride(e: Emitter, idx_t: str, total: int) -> str:
    return (f"for ({idx_t} p = ({idx_t}){BLOCK} * {DEFAULT_THREADS} + threadIdx.x; "
            f"p < {total}; p += ({idx_t}){NBLOCKS} * {DEFAULT_THREADS})")


def _index_type(module: Module, sig: Signature, total: int) -> str:
    grid = default_grid(total, DEFAULT_THREADS)
    return index_type(module, sig.args, grid_stride_end(total, grid, DEFAULT_THREADS))


def _kernel(plan: OpaquePlan, kb: KernelBuilder, sig: Signature, total: int,
            what: str) -> GeneratedKernel:
    return finish(kb, plan, f"opaque:{what}",
                  {"source": "default", "threads": DEFAULT_THREADS, "lanes": 1,
                   "points_per_block": DEFAULT_THREADS},
                  default_grid(total, DEFAULT_THREADS), sig, ops=(plan.op.name,))


def gather(module: Module, plan: OpaquePlan, entry: str) -> GeneratedKernel:
    """out[o, q, i] = data[o, ind[q], i] with `o`/`i` the dimensions before/after `axis`."""
    (data, ind), (out,), attrs = _io(plan, 2, 1)
    dshape = tuple(module.tensors[data].shape)
    axis = int(attrs.get("axis", 0)) % len(dshape)
    dim = dshape[axis]
    inner = math.prod(dshape[axis + 1:])
    count = module.tensors[ind].size
    total = module.tensors[out].size
    sig = _signature(module, [data, ind], [out])
    idx_t = _index_type(module, sig, total)
    kb = new_kernel(entry, sig, DEFAULT_THREADS,
                    [f"opaque Gather (axis {axis}): {out} = take({data}, {ind})"])
    e = kb.body
    with e.block(_grid_stride(e, idx_t, total)):
        e.line(f"const {idx_t} i = p % {inner};")
        e.line(f"const {idx_t} q = (p / {inner}) % {count};")
        e.line(f"const {idx_t} o = p / ({inner} * ({idx_t}){count});")
        e.line(f"long long k = {load_value(f'{tvar(ind)}[q]', module.tensors[ind].dtype)};")
        e.line(f"if (k < 0) k += {dim};")
        dtype = module.tensors[data].dtype
        zero = "0" if storage(dtype).kind != "b" else "false"
        e.line(f"{tvar(out)}[p] = tk_in(k, {dim}LL) ? "
               f"{tvar(data)}[(o * {dim} + ({idx_t})k) * {inner} + i] : "
               f"({storage(dtype).ctype}){zero};")
    return _kernel(plan, kb, sig, total, "Gather")


def gather_elements(module: Module, plan: OpaquePlan, entry: str) -> GeneratedKernel:
    """out[..., j, ...] = data[..., ind[..., j, ...], ...] along `axis` (take_along_axis)."""
    (data, ind), (out,), attrs = _io(plan, 2, 1)
    dshape = tuple(module.tensors[data].shape)
    ishape = tuple(module.tensors[ind].shape)
    axis = int(attrs.get("axis", 0)) % len(dshape)
    total = module.tensors[out].size
    sig = _signature(module, [data, ind], [out])
    idx_t = _index_type(module, sig, total)
    kb = new_kernel(entry, sig, DEFAULT_THREADS,
                    [f"opaque GatherElements (axis {axis}): {out} = take_along_axis({data}, "
                     f"{ind})"])
    e = kb.body
    dstr = strides(dshape)
    with e.block(_grid_stride(e, idx_t, total)):
        e.line(f"{idx_t} rem = p;")
        e.line(f"{idx_t} off = 0;")
        e.line(f"long long k = {load_value(f'{tvar(ind)}[p]', module.tensors[ind].dtype)};")
        e.line(f"if (k < 0) k += {dshape[axis]};")
        e.line(f"bool ok = tk_in(k, {dshape[axis]}LL);")
        for d in range(len(ishape) - 1, -1, -1):
            e.line(f"{{ const {idx_t} c = rem % {ishape[d]}; rem /= {ishape[d]};")
            coord = f"({idx_t})k" if d == axis else "c"
            if d != axis:
                e.line(f"  ok = ok && c < {dshape[d]};")
            e.line(f"  off += {coord} * {dstr[d]}; }}")
        dtype = module.tensors[data].dtype
        zero = "0" if storage(dtype).kind != "b" else "false"
        e.line(f"{tvar(out)}[p] = ok ? {tvar(data)}[off] : ({storage(dtype).ctype}){zero};")
    return _kernel(plan, kb, sig, total, "GatherElements")


def _io(plan: OpaquePlan, n_in: int, n_out: int):
    inputs, outputs, attrs = _spec(plan)
    if len(inputs) < n_in or any(not x for x in inputs[:n_in]) or len(outputs) != n_out:
        raise TilekitError(f"opaque {plan.op.opaque.get('type')} needs {n_in} inputs and "
                           f"{n_out} output(s)", f"ops[{plan.index}] ({plan.op.name}).opaque")
    return inputs[:n_in], outputs, attrs


def _signature(module: Module, reads: list[str], writes: list[str]) -> Signature:
    sig = Signature(module)
    for t in reads:
        sig.read(t)
    for t in writes:
        sig.write(t)
    return sig


#: type -> emit rule. One line per type.
CUDA_OPAQUE: dict[str, Rule] = {
    "Gather": gather,
    "GatherElements": gather_elements,
}


def opaque_kernel(module: Module, plan: OpaquePlan, entry: str) -> GeneratedKernel:
    kind = (plan.op.opaque or {}).get("type")
    rule = CUDA_OPAQUE.get(kind)
    if rule is None:
        raise UnsupportedError(
            f"opaque op type '{kind}' has no CUDA implementation",
            f"ops[{plan.index}] ({plan.op.name})",
            f"CUDA implementations exist for: {', '.join(sorted(CUDA_OPAQUE))}; run this "
            "module with tk-run --device cpu")
    return rule(module, plan, entry)
