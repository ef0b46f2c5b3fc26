"""Kernels of opaque op types (`tilekit.opaque`), one build rule per type, as tile programs.

An opaque op runs as its own kernel. Most are a grid-stride loop over the output with the
default schedule (`DEFAULT_THREADS` threads per block, one output element per thread per
pass); the scatters run in one block (their updates apply in order, as the reference's).
`OPAQUE_KERNELS` is the registry; a type that is not in it is an error at codegen that names
the op and lists what is implemented (there is no host fallback: a module either runs wholly
as kernels or is refused before anything runs, see docs/codegen.md).

Index semantics follow the NumPy reference: negative indices count from the end. An index
still out of range after that (the reference raises) reads 0 (a gather) or is skipped (a
scatter) here, because a kernel cannot raise; `tk-run --check` finds such inputs.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from tilekit.codegen.kernel import (GeneratedKernel, Signature, decompose, finish,
                                    grid_stride_end, index_type, strides, tvar)
from tilekit.codegen.plan import OpaquePlan
from tilekit.codegen.values import load_value
from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.model import Module
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid
from tilekit.schedule.shape import Target
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder
from tilekit.tile.expr import BLOCK, NBLOCKS, Expr, Load, Var

Rule = Callable[[Module, OpaquePlan, str, Target], GeneratedKernel]


def _spec(plan: OpaquePlan) -> tuple[list[str], list[str], Mapping]:
    spec = plan.op.opaque or {}
    return (list(spec.get("inputs", ())), list(spec.get("outputs", ())),
            dict(spec.get("attrs") or {}))


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


class _Elementwise:
    """A grid-stride loop over `total` output elements: `body(b, p)` for each."""

    def __init__(self, module: Module, plan: OpaquePlan, reads, writes, total: int,
                 target: Target) -> None:
        self.module, self.plan, self.total, self.target = module, plan, total, target
        self.sig = _signature(module, reads, writes)
        self.grid = default_grid(total, DEFAULT_THREADS)
        self.idx_t = index_type(module, self.sig.args,
                                grid_stride_end(total, self.grid, DEFAULT_THREADS))

    def build(self, entry: str, what: str, comment: str, body) -> GeneratedKernel:
        b = Builder()
        t = self.idx_t
        with b.threads(DEFAULT_THREADS) as tid:
            with b.loop("p", tx.cast(t, BLOCK) * DEFAULT_THREADS + tid, self.total,
                        tx.cast(t, NBLOCKS) * DEFAULT_THREADS, dtype=t) as p:
                body(b, p)
        return self._finish(b, entry, what, comment, DEFAULT_THREADS)

    def build_rows(self, entry: str, what: str, comment: str, rows_of: int,
                   row) -> GeneratedKernel:
        """The same grid over the output on a CPU, a block's points taken as runs within
        rows of `rows_of` points (`row(b, r, lo, hi)`: points lo .. hi - 1 of row r), each a
        vector loop, where the grid-stride loop computed every point's row and column."""
        b = Builder()
        t = self.idx_t
        span = tx.as_expr(DEFAULT_THREADS, t)
        with b.loop("p0", tx.cast(t, BLOCK) * DEFAULT_THREADS, self.total,
                    tx.cast(t, NBLOCKS) * DEFAULT_THREADS, dtype=t) as p0:
            end = b.let("pend", tx.call("min", p0 + span, tx.as_expr(self.total, t)), t)
            first = b.let("rfirst", tx.div(p0, rows_of), t)
            last = b.let("rlast", tx.div(end - 1, rows_of), t)
            with b.loop("r", first, last + 1, dtype=t) as r:
                base = b.let("rbase", r * rows_of, t)
                lo = b.let("lo", tx.call("max", p0 - base, tx.as_expr(0, t)), t)
                hi = b.let("hi", tx.call("min", end - base, tx.as_expr(rows_of, t)), t)
                row(b, r, lo, hi)
        return self._finish(b, entry, what, comment, 1, {"rows": rows_of})

    def _finish(self, b: Builder, entry: str, what: str, comment: str, threads: int,
                extra: Mapping | None = None) -> GeneratedKernel:
        return finish(self.plan, entry, self.sig, b.build(), shape=f"opaque:{what}",
                      schedule={"source": "default", "threads": DEFAULT_THREADS, "lanes": 1,
                                "points_per_block": DEFAULT_THREADS, **(extra or {})},
                      threads=threads, grid=self.grid, comments=[comment],
                      ops=(self.plan.op.name,), target=self.target)


def _tensor(module: Module, name: str):
    return module.tensors[name]


def _index_value(module: Module, name: str, at: Expr) -> Expr:
    """An index tensor's element as int64."""
    dtype = _tensor(module, name).dtype
    return tx.cast("int64", load_value(Load(tvar(name), (at,), dtype), dtype))


def _wrapped(b: Builder, k: Expr, dim: int) -> Var:
    """`k` with a negative index counted from the end."""
    return b.let("k_", tx.select(tx.lt(k, 0), k + dim, k), "int64")


def _zero(dtype: str) -> Expr:
    if dtype == "bool":
        return tx.const(False)
    if dtype in ("float16", "bfloat16"):
        return tx.cast(dtype, tx.const(0.0))
    return tx.as_expr(0.0 if dtype.startswith("float") else 0, dtype)


def gather(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
    """out[o, q, i] = data[o, ind[q], i] with `o`/`i` the dimensions before/after `axis`."""
    (data, ind), (out,), attrs = _io(plan, 2, 1)
    dshape = tuple(_tensor(module, data).shape)
    axis = int(attrs.get("axis", 0)) % len(dshape)
    dim = dshape[axis]
    inner = math.prod(dshape[axis + 1:])
    count = _tensor(module, ind).size
    run = _Elementwise(module, plan, [data, ind], [out], _tensor(module, out).size,
                       target)
    dtype = _tensor(module, data).dtype

    def source(b: Builder, q: Expr, o: Expr, t: str) -> tuple[Var, Expr]:
        """Index `q` (wrapped) and where its run of `inner` values starts in row `o`."""
        k = _wrapped(b, _index_value(module, ind, q), dim)
        return k, tx.mul(tx.add(tx.mul(o, dim), tx.cast(t, k)), inner)

    def valid(k: Expr) -> Expr:
        return tx.call("in_range", k, tx.as_expr(dim, "int64"))

    def row(b: Builder, r: Expr, lo: Expr, hi: Expr) -> None:
        """Points lo .. hi - 1 of output row `r` (an index and the run after `axis`)."""
        k, start = source(b, b.let("q", tx.mod(r, count)), b.let("o", tx.div(r, count)),
                          r.dtype)
        src = b.let("src", start)
        ok = b.let("ok", valid(k), "bool")
        with b.loop("i", lo, hi, kind="simd", dtype=r.dtype) as i:
            b.store(tvar(out), (tx.add(tx.mul(r, inner), i),),
                    tx.select(ok, Load(tvar(data), (tx.add(src, i),), dtype), _zero(dtype)))

    def body(b: Builder, p: Var) -> None:
        i = b.let("i", tx.mod(p, inner))
        q = b.let("q", tx.mod(tx.div(p, inner), count))
        o = b.let("o", tx.div(p, tx.as_expr(inner * count, p.dtype)))
        k, start = source(b, q, o, p.dtype)
        b.store(tvar(out), (p,), tx.select(valid(k), Load(tvar(data), (tx.add(start, i),),
                                                          dtype), _zero(dtype)))
    what = f"opaque Gather (axis {axis}): {out} = take({data}, {ind})"
    if target.kind == "cpu":
        return run.build_rows(entry, "Gather", what, inner, row)
    return run.build(entry, "Gather", what, body)


def gather_elements(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
    """out[..., j, ...] = data[..., ind[..., j, ...], ...] along `axis` (take_along_axis)."""
    (data, ind), (out,), attrs = _io(plan, 2, 1)
    dshape = tuple(_tensor(module, data).shape)
    ishape = tuple(_tensor(module, ind).shape)
    axis = int(attrs.get("axis", 0)) % len(dshape)
    dstr = strides(dshape)
    dtype = _tensor(module, data).dtype
    run = _Elementwise(module, plan, [data, ind], [out], _tensor(module, out).size,
                       target)

    def body(b: Builder, p: Var) -> None:
        coords = decompose(b, p, list(ishape), ["c_"] * len(ishape), p.dtype)
        k = _wrapped(b, _index_value(module, ind, p), dshape[axis])
        checks = [tx.call("in_range", k, tx.as_expr(dshape[axis], "int64"))]
        checks += [tx.lt(c, dshape[d]) for d, c in enumerate(coords) if d != axis]
        at = tx.linear(((s, tx.cast(p.dtype, k) if d == axis else c)
                        for d, (s, c) in enumerate(zip(dstr, coords))), 0, p.dtype)
        b.store(tvar(out), (p,), tx.select(tx.and_(*checks), Load(tvar(data), (at,), dtype),
                                           _zero(dtype)))
    return run.build(entry, "GatherElements", f"opaque GatherElements (axis {axis}): {out} = "
                     f"take_along_axis({data}, {ind})", body)


def gather_nd(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
    """out[b, r, i] = data[b, ind[b, r, 0], ..., ind[b, r, m-1], i] with `batch_dims` b."""
    (data, ind), (out,), attrs = _io(plan, 2, 1)
    dshape = tuple(_tensor(module, data).shape)
    ishape = tuple(_tensor(module, ind).shape)
    nb = int(attrs.get("batch_dims", 0))
    m = ishape[-1]
    batch = math.prod(dshape[:nb])
    rows = math.prod(ishape[nb:-1])
    inner = math.prod(dshape[nb + m:])
    indexed = dshape[nb:nb + m]
    dtype = _tensor(module, data).dtype
    run = _Elementwise(module, plan, [data, ind], [out], _tensor(module, out).size,
                       target)
    per_batch = math.prod(dshape[nb:])

    def slice_at(b: Builder, n: Expr, tuple_at: Expr) -> tuple[Var, Var]:
        """Where the slice index tuple `tuple_at` of batch `n` selects starts, and whether
        every index of it is in range (negative ones wrapped)."""
        off = b.decl("off_", "int64", tx.cast("int64", n) * per_batch)
        ok = b.decl("ok_", "bool", tx.const(True))
        for j, dim in enumerate(indexed):
            k = _wrapped(b, _index_value(module, ind, tuple_at * m + j), dim)
            b.assign(ok, tx.and_(ok, tx.call("in_range", k, tx.as_expr(dim, "int64"))))
            b.assign(off, off + k * math.prod(indexed[j + 1:]) * inner)
        return off, ok

    def body(b: Builder, p: Var) -> None:
        i = b.let("i", tx.mod(p, inner))
        r = b.let("r", tx.mod(tx.div(p, inner), rows))
        n = b.let("n", tx.div(p, tx.as_expr(inner * rows, p.dtype)))
        off, ok = slice_at(b, n, n * rows + r)
        at = b.let("at", tx.select(ok, off + tx.cast("int64", i), tx.const(0, "int64")))
        b.store(tvar(out), (p,), tx.select(ok, Load(tvar(data), (at,), dtype), _zero(dtype)))

    def row(b: Builder, q: Expr, lo: Expr, hi: Expr) -> None:
        """Points lo .. hi - 1 of output row `q` (batch n, index tuple r: one slice)."""
        off, ok = slice_at(b, b.let("n", tx.div(q, rows)), q)
        src = b.let("src", tx.select(ok, off, tx.const(0, "int64")))
        with b.loop("i", lo, hi, kind="simd", dtype=q.dtype) as i:
            b.store(tvar(out), (tx.add(tx.mul(q, inner), i),),
                    tx.select(ok, Load(tvar(data), (src + tx.cast("int64", i),), dtype),
                              _zero(dtype)))
    what = f"opaque GatherND (batch_dims {nb}): {out} = {data}[{ind}]"
    if target.kind == "cpu":
        return run.build_rows(entry, "GatherND", what, inner, row)
    return run.build(entry, "GatherND", what, body)


def _arg(fn: str) -> Rule:
    def rule(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
        """out[o, i] = arg{max,min}_j x[o, j, i] (the first on ties and NaN, or the last with
        `select_last_index`), as int64."""
        (x,), (out,), attrs = _io(plan, 1, 1)
        shape = tuple(_tensor(module, x).shape)
        axis = int(attrs.get("axis", 0)) % len(shape)
        last = bool(attrs.get("select_last_index", 0))
        n, inner = shape[axis], math.prod(shape[axis + 1:])
        dtype = _tensor(module, x).dtype
        run = _Elementwise(module, plan, [x], [out], _tensor(module, out).size,
                       target)
        better = tx.gt if fn == "ArgMax" else tx.lt

        def body(b: Builder, p: Var) -> None:
            i = b.let("i", tx.mod(p, inner))
            o = b.let("o", tx.div(p, inner))
            base = b.let("base", o * (n * inner) + i)
            best = b.decl("best", "float64" if dtype == "float64" else (
                "float32" if dtype.startswith(("float", "bfloat")) else "int64"),
                load_value(Load(tvar(x), (base,), dtype), dtype))
            at = b.decl("at", "int64", tx.const(0, "int64"))
            with b.loop("j", 1, n) as j:
                v = b.let("v", tx.cast(best.dtype, load_value(
                    Load(tvar(x), (base + j * inner,), dtype), dtype)))
                wins = (tx.ge if fn == "ArgMax" else tx.le) if last else better
                if best.dtype.startswith("float"):
                    # NumPy: a NaN wins over every number (the first NaN, or the last one)
                    nan_v, nan_best = tx.call("isnan", v), tx.call("isnan", best)
                    over_number = tx.and_(tx.not_(nan_best), tx.or_(wins(v, best), nan_v))
                    take = tx.or_(over_number, tx.and_(nan_best, nan_v)) if last \
                        else over_number
                else:
                    take = wins(v, best)
                with b.if_(take):
                    b.assign(best, v)
                    b.assign(at, tx.cast("int64", j))
            b.store(tvar(out), (p,), at)
        return run.build(entry, fn, f"opaque {fn} (axis {axis}"
                         f"{', last index' if last else ''}): {out} = {fn.lower()}({x})", body)
    return rule


def topk(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
    """Values and indices of the k largest (or smallest) along `axis`, ties by lower index
    first, by k selection passes over each row (one thread a row)."""
    (x,), (values, indices), attrs = _io(plan, 1, 2)
    shape = tuple(_tensor(module, x).shape)
    axis = int(attrs["axis"]) % len(shape)
    k = int(attrs["k"])
    largest = bool(attrs.get("largest", 1))
    n, inner = shape[axis], math.prod(shape[axis + 1:])
    rows = math.prod(shape[:axis]) * inner
    dtype = _tensor(module, x).dtype
    cdtype = "float64" if dtype == "float64" else ("float32" if dtype.startswith(
        ("float", "bfloat")) else "int64")
    run = _Elementwise(module, plan, [x], [values, indices], rows,
                       target)
    better = tx.gt if largest else tx.lt

    def body(b: Builder, p: Var) -> None:
        i = b.let("i", tx.mod(p, inner))
        o = b.let("o", tx.div(p, inner))
        base = b.let("base", o * (n * inner) + i)
        out_base = b.let("out_base", o * (k * inner) + i)
        prev = b.decl("prev", cdtype, tx.const(0, cdtype) if cdtype == "int64"
                      else tx.const(0.0, cdtype))
        prev_at = b.decl("prev_at", "int64", tx.const(-1, "int64"))
        with b.loop("r", 0, k) as r:
            best = b.decl("best", cdtype)
            at = b.decl("at", "int64", tx.const(-1, "int64"))
            with b.loop("j", 0, n) as j:
                v = b.let("v", tx.cast(cdtype, load_value(
                    Load(tvar(x), (base + j * inner,), dtype), dtype)))
                jj = tx.cast("int64", j)
                # after the previous pick in the order (value desc, index asc)
                after = tx.or_(tx.lt(prev_at, 0), better(prev, v),
                               tx.and_(tx.eq(v, prev), tx.gt(jj, prev_at)))
                first = tx.lt(at, 0)
                with b.if_(tx.and_(after, tx.or_(first, better(v, best)))):
                    b.assign(best, v)
                    b.assign(at, jj)
            b.store(tvar(values), (out_base + r * inner,), tx.cast(dtype, best))
            b.store(tvar(indices), (out_base + r * inner,), at)
            b.assign(prev, best)
            b.assign(prev_at, at)
    return run.build(entry, "TopK", f"opaque TopK (axis {axis}, k {k}, "
                     f"{'largest' if largest else 'smallest'}): {values}, {indices}", body)


_COMBINE = {"add": "+", "mul": "*"}


def _combine(reduction: str, old: Expr, new: Expr) -> Expr:
    if reduction == "none":
        return new
    if reduction in _COMBINE:
        return tx.binary(_COMBINE[reduction], old, new, old.dtype)
    return tx.call(reduction, old, new)


def _scatter(module: Module, plan: OpaquePlan, entry: str, target: Target, what: str,
             comment: str, updates) -> GeneratedKernel:
    """One block: out = data (all threads), a barrier, then `updates(b, tid)` in order."""
    (data, ind, upd), (out,), attrs = _io(plan, 3, 1)
    sig = _signature(module, [data, ind, upd], [out])
    total = _tensor(module, data).size
    idx_t = index_type(module, sig.args, total + DEFAULT_THREADS)
    b = Builder()
    with b.threads(DEFAULT_THREADS) as tid:
        with b.loop("p", tid, total, DEFAULT_THREADS, dtype=idx_t) as p:
            b.store(tvar(out), (p,), Load(tvar(data), (p,), _tensor(module, data).dtype))
    b.barrier()
    updates(b, data, ind, upd, out, attrs)
    return finish(plan, entry, sig, b.build(), shape=f"opaque:{what}",
                  schedule={"source": "default", "threads": DEFAULT_THREADS, "lanes": 1,
                            "points_per_block": DEFAULT_THREADS},
                  threads=DEFAULT_THREADS, grid=1, comments=[comment], ops=(plan.op.name,),
                  target=target)


def scatter_nd(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
    """out = data; out[ind[r]] (op)= upd[r] for each index row r in order, the threads
    over the elements of a row's slice."""
    def updates(b, data, ind, upd, out, attrs) -> None:
        dshape = tuple(_tensor(module, data).shape)
        ishape = tuple(_tensor(module, ind).shape)
        m = ishape[-1]
        rows = math.prod(ishape[:-1])
        inner = math.prod(dshape[m:])
        reduction = str(attrs.get("reduction", "none"))
        dtype = _tensor(module, out).dtype
        with b.loop("r", 0, rows) as r:
            with b.threads(DEFAULT_THREADS) as tid:
                off = b.decl("off_", "int64", tx.const(0, "int64"))
                ok = b.decl("ok_", "bool", tx.const(True))
                for j in range(m):
                    k = _wrapped(b, _index_value(module, ind, r * m + j), dshape[j])
                    b.assign(ok, tx.and_(ok, tx.call("in_range", k,
                                                     tx.as_expr(dshape[j], "int64"))))
                    b.assign(off, off + k * (math.prod(dshape[j + 1:m]) * inner))
                with b.if_(ok):
                    with b.loop("e", tid, inner, DEFAULT_THREADS) as e:
                        at = b.let("at", off + tx.cast("int64", e))
                        new = Load(tvar(upd), (tx.cast("int64", r) * inner + e,), dtype)
                        b.store(tvar(out), (at,), _combine(reduction, Load(tvar(out), (at,),
                                                                           dtype), new))
            b.barrier()     # the next row may write the same elements
    return _scatter(module, plan, entry, target, "ScatterND", "opaque ScatterND: updates in order",
                    updates)


def scatter_elements(module: Module, plan: OpaquePlan, entry: str, target: Target) -> GeneratedKernel:
    """out = data; out[..., ind[pos], ...] (op)= upd[pos] along `axis`, every update in
    order by one thread (duplicate targets apply as the reference applies them)."""
    def updates(b, data, ind, upd, out, attrs) -> None:
        dshape = tuple(_tensor(module, data).shape)
        ishape = tuple(_tensor(module, ind).shape)
        axis = int(attrs.get("axis", 0)) % len(dshape)
        reduction = str(attrs.get("reduction", "none"))
        dtype = _tensor(module, out).dtype
        dstr = strides(dshape)
        with b.threads(DEFAULT_THREADS) as tid:
            with b.if_(tx.eq(tid, 0)):
                with b.loop("u", 0, math.prod(ishape), dtype="int64") as u:
                    coords = decompose(b, u, list(ishape), ["c_"] * len(ishape), "int64")
                    k = _wrapped(b, _index_value(module, ind, u), dshape[axis])
                    checks = [tx.call("in_range", k, tx.as_expr(dshape[axis], "int64"))]
                    checks += [tx.lt(c, dshape[d]) for d, c in enumerate(coords) if d != axis]
                    at = b.let("at", tx.linear(((s, k if d == axis else c) for d, (s, c) in
                                                enumerate(zip(dstr, coords))), 0, "int64"))
                    with b.if_(tx.and_(*checks)):
                        b.store(tvar(out), (at,), _combine(reduction,
                                                           Load(tvar(out), (at,), dtype),
                                                           Load(tvar(upd), (u,), dtype)))
    return _scatter(module, plan, entry, target, "ScatterElements",
                    "opaque ScatterElements: updates in order, one thread", updates)


#: type -> build rule. One line per type. Resize and ConvTranspose (the opaque cases: both
#: stride and dilation above 1) have none yet: docs/import.md lists them.
OPAQUE_KERNELS: dict[str, Rule] = {
    "Gather": gather,
    "GatherElements": gather_elements,
    "GatherND": gather_nd,
    "ArgMax": _arg("ArgMax"),
    "ArgMin": _arg("ArgMin"),
    "TopK": topk,
    "ScatterND": scatter_nd,
    "ScatterElements": scatter_elements,
}


def opaque_kernel(module: Module, plan: OpaquePlan, entry: str, target: Target
                  ) -> GeneratedKernel:
    kind = (plan.op.opaque or {}).get("type")
    rule = OPAQUE_KERNELS.get(kind)
    if rule is None:
        raise UnsupportedError(
            f"opaque op type '{kind}' has no kernel implementation",
            f"ops[{plan.index}] ({plan.op.name})",
            f"kernels exist for: {', '.join(sorted(OPAQUE_KERNELS))}; run this module with "
            "tk-run --device cpu (the reference executor)")
    return rule(module, plan, entry, target)


__all__ = ["OPAQUE_KERNELS", "opaque_kernel"]
