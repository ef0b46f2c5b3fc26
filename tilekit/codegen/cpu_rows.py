"""A row chain as one CPU kernel: softmax, layer norm, a scale and mask before them, row by row.

A row chain (`tilekit.weld.cpu.row_chain`: ops over the same rows of a last axis of `length`
points, each a row op, a reduction of a row or a per-row scalar op, reading each other only
at the same row) runs as `cpu_rows`: the rows in blocks (the unit of parallel work, as for
`cpu_loops`), and per row its ops in **passes** over the row's points:

- a pass is one loop over the row's `length` points running consecutive row ops and
  reductions: a row op's value stays in a register for the later ops of its pass, a
  reduction folds its value into `nr` partial accumulators (a `simd` loop of `nr` lanes over
  whole vectors, then the tail), folded into one value after the loop (in halves:
  `fold_lanes`);
- a new pass starts at an op that reads a reduction of the current pass (its value is whole
  only after the loop); per-row scalar ops run between passes on registers;
- a row op's result that a later pass reads is kept in a **row buffer** of `length` points
  (block memory: the row stays in L1 while the passes walk it); results read outside the
  group, or outputs, are stored to memory as they are computed.

Two rewrites of the ops' expressions save work per point:

- a division by a value that is the same for the whole row (a reduction's result, a per-row
  scalar op's, a constant: softmax's sum, layer norm's deviation, a mean's count) is a
  multiplication by its reciprocal, computed once per row before the pass (a float32
  result within an ulp or so of the division's, as onnxruntime computes them);
- a reduction's per-point value that a later row op computes again (softmax's
  `exp(x - max)`, summed, then divided) is kept in a row buffer by the reduction's pass and
  read back, when it calls a function (an exponential is worth a store and a load).

So softmax after a scale and a mask is three passes (scale, mask and max into a row buffer;
exp into another and sum; a multiply that writes); layer norm is a pass for the mean, one for
the variance and one that writes, each row read from memory once whatever form the exporter
wrote it in.
"""

from __future__ import annotations

import math
from typing import Mapping

from tilekit.codegen.kernel import (GeneratedKernel, c_name, decompose, finish, global_read,
                                    global_store, group_signature, index_type, tensor_kind,
                                    full_ranges, stored_value)
from tilekit.codegen.plan import GroupPlan, OpPlan
from tilekit.codegen.values import (ValueCompiler, accumulator_kind, combine, identity,
                                    literal)
from tilekit.expr.ast import Access, Axis, Binary, Call, Node, Unary, format_node, substitute
from tilekit.schedule.cpu import one_thread, rows_per_block
from tilekit.schedule.shape import Target
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import BLOCK, KIND_DTYPE, Expr, Load, Var
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
    bodies, kept = _reuse(ops, chain, pass_of)
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    per = rows_per_block(nrows, length * len(ops), tiles)
    grid = -(-nrows // per)
    # sizes that vary with a symbolic module's symbols: one code structure for all of them
    free = any(tiles.free(p.op.name) for p in ops)
    smem = SharedMemory()
    rowbuf = {t: smem.carve(f"s_{c_name(t)}", "float32", (length,),
                            f"{t}: the row, kept for a later pass") for t in buffered}
    for t, k in kept.items():
        rowbuf[t] = smem.carve(f"s_{c_name(ops[k].output)}_points", "float32", (length,),
                               f"{ops[k].output}'s value at each point, read again later")
    b = Builder()
    per_ = b.let("per", tx.const(per, idx_t), idx_t) if free else per
    first = b.let("r0", tx.mul(tx.cast(idx_t, BLOCK), per_), idx_t)
    stop = b.let("r1", tx.call("min", tx.add(first, per_), tx.const(nrows, idx_t)), idx_t)
    with b.loop("r", first, stop, dtype=idx_t) as r:
        row_vars = decompose(b, r, list(chain.rows), [f"w{k}_" for k in range(len(chain.rows))],
                             idx_t, named=free)
        scalars: dict[str, Expr] = {}
        for kind, ks in steps:
            members = [(ops[k], chain.ops[k], bodies[k]) for k in ks]
            if kind == "scalar":
                for p, op, body in members:
                    axis = _axes(p, op, row_vars, None, idx_t)
                    value, _ = _value(module, p, body, axis, {}, scalars, rowbuf, None)
                    stored, vkind = stored_value(value, p.out_dtype)
                    v = b.let(f"v_{c_name(p.output)}_", stored, KIND_DTYPE[vkind])
                    scalars[p.output] = v
                    _store(module, b, plan, p, axis, v)
            else:
                members = [(p, op, _reciprocals(module, b, p, op, body, row_vars, scalars,
                                                idx_t)) for p, op, body in members]
                keep = {k_: t for t, k_ in kept.items()}
                _loop_pass(module, b, plan, members, row_vars, scalars, rowbuf, length,
                           tiles.nr, idx_t, {ops[k].output: keep[k] for k in ks if k in keep})
    names = [[ops[k].op.name for k in ks] for _, ks in steps]
    buffers = list(buffered) + [f"{ops[k].output}:points" for k in kept.values()]
    sched = {"source": "cpu", "rows": nrows, "rows_per_block": per, "length": length,
             "passes": names, "row_buffers": buffers}
    if grid > 1 and one_thread(nrows * length * len(ops), tiles):
        sched["one_thread"] = True
    return finish(plan, entry, sig, b.build(), shape="cpu_rows", schedule=sched, threads=1,
                  grid=grid, shared=smem.all(), target=target,
                  comments=[f"cpu rows: {nrows} rows of {length} points in blocks of {per}, "
                            f"{sum(1 for k, _ in steps if k == 'loop')} passes over a row"
                            + (f", row buffers {', '.join(buffers)}" if buffers else "")])


#: The prefix of the names the rewrites give their values (no tensor's: a tensor name is an
#: identifier of the IR, which never starts with two underscores and a dollar).
PSEUDO = "__$"


def _canonical(node: Node, op: RowOp, column: str | None) -> str:
    """`node` as text with the op's row axes and column renamed alike for every op."""
    names = {a: Axis(f"{PSEUDO}row{k}") for k, a in enumerate(op.row_axes)}
    if column is not None:
        names[column] = Axis(f"{PSEUDO}col")
    return format_node(substitute(node, names))


def _calls(node: Node) -> bool:
    if isinstance(node, Call):
        return True
    if isinstance(node, Unary):
        return _calls(node.arg)
    if isinstance(node, Binary):
        return _calls(node.lhs) or _calls(node.rhs)
    return False


def _replace(node: Node, match) -> Node:
    """`node` with every subtree `match` maps to a node replaced (the others kept as they
    are: the plan's reads are keyed by their Access objects)."""
    new = match(node)
    if new is not None:
        return new
    if isinstance(node, Unary):
        arg = _replace(node.arg, match)
        return node if arg is node.arg else Unary(node.op, arg)
    if isinstance(node, Binary):
        lhs, rhs = _replace(node.lhs, match), _replace(node.rhs, match)
        return node if lhs is node.lhs and rhs is node.rhs else Binary(node.op, lhs, rhs)
    if isinstance(node, Call):
        args = tuple(_replace(a, match) for a in node.args)
        return node if all(x is y for x, y in zip(args, node.args)) else Call(node.fn, args)
    return node


def _reuse(ops: list[OpPlan], chain: RowChain, pass_of: Mapping[str, int]
           ) -> tuple[list[Node], dict[str, int]]:
    """The ops' bodies with a reduction's per-point value that a row op of a later pass
    computes again read from a row buffer instead (module docstring), and those buffers:
    name -> the reduction's position."""
    values: dict[str, tuple[int, str]] = {}
    bodies: list[Node] = []
    kept: dict[str, int] = {}
    for k, (p, op) in enumerate(zip(ops, chain.ops)):
        if op.role == "reduce":
            if _calls(p.body):
                values[_canonical(p.body, op, op.column)] = (k, f"{PSEUDO}{p.output}")
            bodies.append(p.body)
            continue
        if op.role != "row" or not values:
            bodies.append(p.body)
            continue

        def match(node: Node, p=p, op=op) -> Node | None:
            if not _calls(node):
                return None
            hit = values.get(_canonical(node, op, op.column))
            if hit is None or pass_of[ops[hit[0]].output] >= pass_of[p.output]:
                return None
            kept[hit[1]] = hit[0]
            return Access(hit[1], ())

        bodies.append(_replace(p.body, match))
    return bodies, kept


def _reciprocals(module, b: Builder, p: OpPlan, op: RowOp, body: Node, row_vars,
                 scalars: dict, idx_t: str) -> Node:
    """`body` with each float division by a value the same for the whole row (module
    docstring) a multiplication by its reciprocal, declared here (before the pass)."""
    group = set(scalars)
    comp = ValueCompiler({}, _kinds(module), lambda node: None)

    def invariant(node: Node) -> bool:
        if isinstance(node, Axis):
            return False
        if isinstance(node, Access):
            return node.tensor in group and not any(
                isinstance(i, Axis) and i.name == op.column for i in node.indices)
        if isinstance(node, Unary):
            return invariant(node.arg)
        if isinstance(node, Binary):
            return invariant(node.lhs) and invariant(node.rhs)
        if isinstance(node, Call):
            return all(invariant(a) for a in node.args)
        return True

    def match(node: Node) -> Node | None:
        if not (isinstance(node, Binary) and node.op == "/" and invariant(node.rhs)
                and comp.kind(node)[0] == "f"
                and comp.kind(node.rhs) in (("f", False), ("f", True), ("i", True))):
            return None         # (a float32 division; an integer literal divides as float)
        name = f"{PSEUDO}rcp{len(scalars)}"
        axis = _axes(p, op, row_vars, None, idx_t)
        value, _ = _value(module, p, node.rhs, axis, {}, scalars, {}, None)
        scalars[name] = b.let("rcp_", tx.div(literal(1.0, "f"), tx.cast("float32", value)),
                              "float32")
        return Binary("*", _replace(node.lhs, match), Access(name, ()))

    return _replace(body, match)


def _kinds(module):
    """The compute kind of a tensor, or of a rewrite's value (float32)."""
    kind = tensor_kind(module)
    return lambda name: "f" if name.startswith(PSEUDO) else kind(name)


def _axes(p: OpPlan, op: RowOp, row_vars, column: Expr | None, idx_t: str) -> dict[str, Expr]:
    """The op's axes at a row (and a point of it): row axes, its column, zeros elsewhere."""
    axis: dict[str, Expr] = {a: tx.const(0, idx_t) for a, _ in p.spatial + p.reduction}
    axis.update(zip(op.row_axes, row_vars))
    if op.column is not None and column is not None:
        axis[op.column] = column
    return axis


def _value(module, p: OpPlan, body: Node, axis: Mapping[str, Expr],
           registers: Mapping[str, Expr], scalars: Mapping[str, Expr], rowbuf,
           column: Expr | None) -> tuple[Expr, str]:
    """The op's `body` (its own or rewritten) at `axis`: the group's results from registers,
    scalars and row buffers, anything else from memory; (value, kind)."""
    ranges = full_ranges(p)

    def read(node: Access) -> Expr:
        t = node.tensor if node.tensor.startswith(PSEUDO) else p.read(node).tensor
        if t in registers:
            return registers[t]
        if t in scalars:
            return scalars[t]
        if t in rowbuf:
            return Load(rowbuf[t].name, (column,), "float32")
        return global_read(p.read(node), axis, ranges)

    comp = ValueCompiler(axis, _kinds(module), read, ranges)
    kind = comp.kind(body)[0]
    if p.reduces:
        kind = accumulator_kind(p.assign, kind)
    return comp.emit(body, kind), kind


def _store(module, b: Builder, plan: GroupPlan, p: OpPlan, axis: Mapping[str, Expr],
           value: Expr) -> None:
    if p.output in plan.stored:
        global_store(module, b, p.output, [axis[a] for a, _ in p.spatial], value)


def _loop_pass(module, b: Builder, plan: GroupPlan, members, row_vars, scalars: dict,
               rowbuf, length: int, nr: int, idx_t: str, keep: Mapping[str, str]) -> None:
    """One loop over the row's points (module docstring); the reductions' values become
    scalars, their per-point values go to row buffers where `keep` (output -> buffer)
    says."""
    reductions = [(p, op, body) for p, op, body in members if op.role == "reduce"]
    parts = {}
    for p, op, body in reductions:
        zero = tx.const(0, idx_t)
        kind = _value(module, p, body, _axes(p, op, row_vars, zero, idx_t), {}, scalars,
                      rowbuf, zero)[1]
        parts[p.output] = (b.alloc(f"part_{c_name(p.output)}", KIND_DTYPE[kind], (nr,),
                                   f"{p.output}: partial accumulators, one per lane"), kind)
        with b.loop("l", 0, nr, kind="simd") as l_:
            b.store(parts[p.output][0], (l_,), identity(p.assign, kind))

    def body(j: Expr, slot: Expr) -> None:
        registers: dict[str, Expr] = {}
        for p, op, body in members:
            axis = _axes(p, op, row_vars, j, idx_t)
            value, kind = _value(module, p, body, axis, registers, scalars, rowbuf, j)
            if op.role == "reduce":
                part, pkind = parts[p.output]
                if p.output in keep:
                    value = b.let(f"e_{c_name(p.output)}_", value, part.dtype)
                    b.store(rowbuf[keep[p.output]], (j,), value)
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
    for p, op, _ in reductions:
        part, kind = parts[p.output]
        acc = fold_lanes(b, part, nr, p.assign, f"acc_{c_name(p.output)}_")
        stored, vkind = stored_value(acc, p.out_dtype)
        v = b.let(f"v_{c_name(p.output)}_", stored, KIND_DTYPE[vkind])
        scalars[p.output] = v
        _store(module, b, plan, p, _axes(p, op, row_vars, None, idx_t), v)


def fold_lanes(b: Builder, part, lanes: int, assign: str, name: str) -> Var:
    """The `lanes` partial accumulators in `part` folded into one, declared as `name`: in
    halves while the count is even (a vector loop each: lane l takes lane l + half), then
    the rest in order. The same order on every machine and for every point, so a point's
    sum is the same alone or beside others. Folded one by one, each a scalar add on the last
    one's result, 32 lanes cost 31 adds' latency per output point: the LSTM's recurrent
    product (2048 dot products of 512 a step) took 0.88x as long with halves on two cores of
    an AVX-512 Xeon, the whole LSTM 1.80-1.83 against 1.94-1.96 ms at best."""
    dtype = part.dtype
    n = lanes
    while n > 1 and n % 2 == 0:
        n //= 2
        with b.loop("l", 0, n, kind="simd") as l_:
            b.store(part, (l_,), combine(assign, Load(part.name, (l_,), dtype),
                                         Load(part.name, (tx.add(l_, n),), dtype)))
    acc = b.decl(name, dtype, Load(part.name, (tx.const(0),), dtype))
    if n > 1:
        with b.loop("l", 1, n) as l_:
            b.assign(acc, combine(assign, acc, Load(part.name, (l_,), dtype)))
    return acc


__all__ = ["fold_lanes", "passes", "rows_kernel"]
