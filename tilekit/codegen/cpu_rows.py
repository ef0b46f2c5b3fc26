"""A row chain as one CPU kernel: softmax, layer norm, a scale and mask before them, row by row.

A row chain (`tilekit.weld.cpu.row_chain`: ops over the same rows of a last axis of `length`
points, each a row op, a reduction of a row or a per-row scalar op, reading each other only
at the same row) runs as `cpu_rows`: the rows in blocks (the unit of parallel work, as for
`cpu_loops`), and per row its ops in **passes** over the row's points:

- a pass is one loop over the row's `length` points running consecutive row ops and
  reductions: a row op's value stays in a register for the later ops of its pass, a
  reduction folds its value into `nr` partial accumulators (a `simd` loop of `nr` lanes over
  whole vectors, then the tail), folded into one value after the loop;
- a new pass starts at an op that reads a reduction of the current pass (its value is whole
  only after the loop); per-row scalar ops run between passes on registers;
- a row op's result that a later pass reads is kept in a **row buffer** of `length` points
  (block memory: the row stays in L1 while the passes walk it); results read outside the
  group, or outputs, are stored to memory as they are computed.

So softmax after a scale and a mask is two passes (scale, mask and max into the row buffer;
exp and sum) and a third that writes; layer norm is a pass for the mean, one for the
variance and one that writes, each row read from memory once whatever form the exporter
wrote it in. Nothing is recomputed across passes but what an op's own expression holds
(softmax's last op computes its exponential again rather than keeping a second row).
"""

from __future__ import annotations

import math
from typing import Mapping

from tilekit.codegen.kernel import (GeneratedKernel, c_name, decompose, finish, global_read,
                                    global_store, group_signature, index_type, tensor_kind,
                                    full_ranges, stored_value)
from tilekit.codegen.plan import GroupPlan, OpPlan
from tilekit.codegen.values import (ValueCompiler, accumulator_kind, combine, identity)
from tilekit.expr.ast import Access
from tilekit.schedule.cpu import rows_per_block
from tilekit.schedule.shape import Target
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import BLOCK, KIND_DTYPE, Expr, Load
from tilekit.weld.cpu import RowChain, RowOp


def passes(plan: GroupPlan, chain: RowChain) -> list[tuple[str, list[int]]]:
    """The kernel's passes, in order: ("loop", member positions) or ("scalar", ...)."""
    out: list[tuple[str, list[int]]] = []
    reduced: set[str] = set()          # reductions of the open loop pass
    for k, (stage, op) in enumerate(zip(plan.stages, chain.ops)):
        p = stage.main
        kind = "scalar" if op.role == "scalar" else "loop"
        reads = {r.tensor for r in p.read_list()}
        if out and out[-1][0] == kind and not (kind == "loop" and reads & reduced):
            out[-1][1].append(k)
        else:
            out.append((kind, [k]))
            reduced = set()
        if op.role == "reduce":
            reduced.add(p.output)
    return out


def rows_kernel(module, plan: GroupPlan, chain: RowChain, entry: str, target: Target
                ) -> GeneratedKernel:
    """The `cpu_rows` kernel of a row chain (module docstring); `plan` is
    `tilekit.codegen.plan.plan_each` of its group."""
    tiles = target.cpu
    length = chain.length
    nrows = math.prod(chain.rows)
    ops = [s.main for s in plan.stages]
    steps = passes(plan, chain)
    pass_of = {ops[k].output: n for n, (_, ks) in enumerate(steps) for k in ks}
    buffered = [ops[k].output for n, (_, ks) in enumerate(steps) for k in ks
                if chain.ops[k].role == "row"
                and any(pass_of[r.tensor] < pass_of[p.output] for p in ops
                        for r in p.read_list() if r.tensor == ops[k].output)]
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    per = rows_per_block(nrows, length * len(ops), tiles)
    grid = -(-nrows // per)
    smem = SharedMemory()
    rowbuf = {t: smem.carve(f"s_{c_name(t)}", "float32", (length,),
                            f"{t}: the row, kept for a later pass") for t in buffered}
    b = Builder()
    first = b.let("r0", tx.mul(tx.cast(idx_t, BLOCK), per), idx_t)
    stop = b.let("r1", tx.call("min", tx.add(first, per), tx.const(nrows, idx_t)), idx_t)
    with b.loop("r", first, stop, dtype=idx_t) as r:
        row_vars = decompose(b, r, list(chain.rows), [f"w{k}_" for k in range(len(chain.rows))],
                             idx_t)
        scalars: dict[str, Expr] = {}
        for kind, ks in steps:
            members = [(ops[k], chain.ops[k]) for k in ks]
            if kind == "scalar":
                for p, op in members:
                    axis = _axes(p, op, row_vars, None, idx_t)
                    value, vkind = _value(module, p, axis, {}, scalars, rowbuf, None)
                    v = b.let(f"v_{c_name(p.output)}_", value, KIND_DTYPE[vkind])
                    scalars[p.output] = v
                    _store(module, b, plan, p, axis, v)
            else:
                _loop_pass(module, b, plan, members, row_vars, scalars, rowbuf, length,
                           tiles.nr, idx_t)
    names = [[ops[k].op.name for k in ks] for _, ks in steps]
    sched = {"source": "cpu", "rows": nrows, "rows_per_block": per, "length": length,
             "passes": names, "row_buffers": list(buffered)}
    return finish(plan, entry, sig, b.build(), shape="cpu_rows", schedule=sched, threads=1,
                  grid=grid, shared=smem.all(), target=target,
                  comments=[f"cpu rows: {nrows} rows of {length} points in blocks of {per}, "
                            f"{sum(1 for k, _ in steps if k == 'loop')} passes over a row"
                            + (f", row buffers {', '.join(buffered)}" if buffered else "")])


def _axes(p: OpPlan, op: RowOp, row_vars, column: Expr | None, idx_t: str) -> dict[str, Expr]:
    """The op's axes at a row (and a point of it): row axes, its column, zeros elsewhere."""
    axis: dict[str, Expr] = {a: tx.const(0, idx_t) for a, _ in p.spatial + p.reduction}
    axis.update(zip(op.row_axes, row_vars))
    if op.column is not None and column is not None:
        axis[op.column] = column
    return axis


def _value(module, p: OpPlan, axis: Mapping[str, Expr], registers: Mapping[str, Expr],
           scalars: Mapping[str, Expr], rowbuf, column: Expr | None) -> tuple[Expr, str]:
    """The op's body at `axis`: the group's results from registers, scalars and row
    buffers, anything else from memory; (value, kind)."""
    ranges = full_ranges(p)

    def read(node: Access) -> Expr:
        t = p.read(node).tensor
        if t in registers:
            return registers[t]
        if t in scalars:
            return scalars[t]
        if t in rowbuf:
            return Load(rowbuf[t].name, (column,), "float32")
        return global_read(p.read(node), axis, ranges)

    comp = ValueCompiler(axis, tensor_kind(module), read, ranges)
    kind = comp.kind(p.body)[0]
    if p.reduces:
        kind = accumulator_kind(p.assign, kind)
    return comp.emit(p.body, kind), kind


def _store(module, b: Builder, plan: GroupPlan, p: OpPlan, axis: Mapping[str, Expr],
           value: Expr) -> None:
    if p.output in plan.stored:
        global_store(module, b, p.output, [axis[a] for a, _ in p.spatial], value)


def _loop_pass(module, b: Builder, plan: GroupPlan, members, row_vars, scalars: dict,
               rowbuf, length: int, nr: int, idx_t: str) -> None:
    """One loop over the row's points (module docstring); the reductions' values become
    scalars."""
    reductions = [(p, op) for p, op in members if op.role == "reduce"]
    parts = {}
    for p, _ in reductions:
        kind = _value(module, p, _axes(p, _op_of(members, p), row_vars, tx.const(0, idx_t),
                                       idx_t), {}, scalars, rowbuf, tx.const(0, idx_t))[1]
        parts[p.output] = (b.alloc(f"part_{c_name(p.output)}", KIND_DTYPE[kind], (nr,),
                                   f"{p.output}: partial accumulators, one per lane"), kind)
        with b.loop("l", 0, nr, kind="simd") as l_:
            b.store(parts[p.output][0], (l_,), identity(p.assign, kind))

    def body(j: Expr, slot: Expr) -> None:
        registers: dict[str, Expr] = {}
        for p, op in members:
            axis = _axes(p, op, row_vars, j, idx_t)
            value, kind = _value(module, p, axis, registers, scalars, rowbuf, j)
            if op.role == "reduce":
                part, pkind = parts[p.output]
                b.store(part, (slot,), combine(p.assign, Load(part.name, (slot,), part.dtype),
                                               tx.cast(part.dtype, value)))
                continue
            stored, vkind = stored_value(value, p.out_dtype)
            v = b.let(f"v_{c_name(p.output)}_", stored, KIND_DTYPE[vkind])
            registers[p.output] = v
            if p.output in rowbuf:
                b.store(rowbuf[p.output], (j,), v)
            _store(module, b, plan, p, axis, v)

    if not reductions:
        with b.loop("j", 0, length, kind="simd", dtype=idx_t) as j:
            body(j, j)
        return
    whole = length // nr * nr
    if whole:
        with b.loop("jb", 0, whole, nr, dtype=idx_t) as jb:
            with b.loop("l", 0, nr, kind="simd", dtype=idx_t) as l_:
                body(b.let("j", tx.add(jb, l_), idx_t), l_)
    if whole < length:
        with b.loop("j", whole, length, dtype=idx_t) as j:
            body(j, tx.sub(j, whole))
    for p, op in reductions:
        part, kind = parts[p.output]
        acc = b.decl(f"acc_{c_name(p.output)}_", part.dtype,
                     Load(part.name, (tx.const(0),), part.dtype))
        with b.loop("l", 1, nr) as l_:
            b.assign(acc, combine(p.assign, acc, Load(part.name, (l_,), part.dtype)))
        stored, vkind = stored_value(acc, p.out_dtype)
        v = b.let(f"v_{c_name(p.output)}_", stored, KIND_DTYPE[vkind])
        scalars[p.output] = v
        _store(module, b, plan, p, _axes(p, op, row_vars, None, idx_t), v)


def _op_of(members, p: OpPlan) -> RowOp:
    return next(op for q, op in members if q is p)


__all__ = ["passes", "rows_kernel"]
