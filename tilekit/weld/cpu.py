"""tk-weld on a CPU profile: an op with its elementwise consumers as one kernel.

The CPU target makes one kernel of two kinds of group:

- a one-stage group: a main op and the elementwise ops that read its result at the same
  point (`chain` in `tilekit.weld.structure`'s walk), run in the main kernel's epilogue on
  values in registers, so the intermediates never go to memory;
- a **row chain** (`row_chain`): ops over the same rows of a last axis of `length` points,
  each a row op (`y[rows, j] = ...`), a reduction of a row to one value
  (`s[rows] += f(x[rows, r])`) or a per-row scalar op (`sd[rows] = sqrt(var[rows] + eps)`),
  that read each other's results only at the same row (and the same point of it): softmax,
  layer norm (ONNX LayerNormalization, or the ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div form
  exporters write), a scale and mask before a softmax. The CPU codegen runs it row by row
  (`tilekit.codegen.cpu_rows`): the row's intermediates in a row buffer that stays in L1,
  the reductions' results in registers, each row read from memory once.

Any other multi-stage group would be split into one kernel per stage by the CPU codegen
(`tilekit.codegen.module`), so fusing it would buy nothing there. The walk is
connect-then-fuse (`tilekit.weld.fuse`) with that rule: ops in module order, the open group
takes the next op when it is an expression op that reads something the group writes, is not
named in `no_fuse`, the group stays within `max_group` ops, the grown group is one stage
whose members after the first are all chained, a row chain, or row ops alone (elementwise
ops over the same points: the codegen inlines them into the last, one kernel; and a row
chain's start), and the grown group's CPU estimate
(`tilekit.roll.schedule.cpu_group_estimate`: the members' flops and bytes less the
intermediates kept in registers, the main op's blocks, one fork/join) beats the open group
and the op apart.

A group is recorded as its ops and its estimate (`kernels[i].estimate`); it has no
`kernels[i].tile` (tk-weld's GPU group tile: shared tile, levels, shared memory), which a
CPU kernel has no use for: each member keeps its CPU op tile, and codegen runs the main
op's. Control ops' regions are welded the same way, each as a module of its own.

Absent on CPUs: fusing other stages (a reduction feeding a contraction, attention's flash
form, a reduction over more than one axis or not over the rows' last axis), inlining a
producer into its reader, and any search over tiles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tilekit.expr.analysis import Analysis, IndexMap
from tilekit.ir.control import region_module, with_control
from tilekit.ir.graph import control_records, graph
from tilekit.ir.model import Kernel, Module
from tilekit.ir.payloads import Estimate
from tilekit.roll.schedule import cpu_group_estimate
from tilekit.weld.model import op_estimate
from tilekit.weld.structure import NotFusible, structure


def one_cpu_kernel(module: Module, members: Sequence[int]) -> bool:
    """The CPU target makes one kernel of these ops: one stage, every member after the
    first chained onto it (no producer inlined: a CPU kernel would recompute it per read)."""
    try:
        s = structure(module, members)
    except NotFusible:
        return False
    return s.stages == 1 and s.roles[0] == "stage" and all(r == "chain" for r in s.roles[1:])


#: The roles of a row chain's ops (`RowOp.role`).
ROW_ROLES = ("row", "reduce", "scalar")


@dataclass(frozen=True)
class RowOp:
    """One op of a row chain: `role` row (its output is rows x length, `column` its last
    spatial axis), reduce (a row to one value per row, `column` its reduction axis) or scalar
    (one value per row); `row_axes` are its axes over the rows, in order."""

    index: int
    role: str
    row_axes: tuple[str, ...]
    column: str | None


@dataclass(frozen=True)
class RowChain:
    """Ops over the same rows (extents `rows`) of `length` points (module docstring)."""

    rows: tuple[int, ...]
    length: int
    ops: tuple[RowOp, ...]


def _row_op(index: int, a: Analysis, rows: tuple[int, ...], length: int) -> RowOp | None:
    spatial = [n for _, n in a.spatial]
    axes = tuple(x for x, _ in a.spatial)
    k = len(rows)
    if a.reduction:
        if len(a.reduction) != 1 or a.reduction[0][1] != length:
            return None
        if tuple(spatial[:k]) != rows or any(n != 1 for n in spatial[k:]):
            return None
        return RowOp(index, "reduce", axes[:k], a.reduction[0][0])
    if a.assign != "=":
        return None
    if tuple(spatial) == rows + (length,):
        return RowOp(index, "row", axes[:k], axes[k])
    if tuple(spatial[:k]) == rows and all(n == 1 for n in spatial[k:]):
        return RowOp(index, "scalar", axes[:k], None)
    return None


def _rows_of(a: Analysis, length: int | None) -> list[tuple[int, ...]]:
    """The rows a member may stand for: an elementwise op's extents but the last (when that
    is `length`); a reduction's spatial extents, less any number of trailing ones (`y[i]`
    and `mu[i, 0]` both reduce rows `(i,)`, and one row of `[1, 19]` is rows `(1,)`)."""
    spatial = [n for _, n in a.spatial]
    if not a.reduction:
        return [tuple(spatial[:-1])] if spatial and spatial[-1] == length else []
    out = [tuple(spatial)]
    while spatial and spatial[-1] == 1:
        spatial.pop()
        out.append(tuple(spatial))
    return out


def _row_read(m: tuple[IndexMap, ...], reader: RowOp, rows: tuple[int, ...], column: bool,
              ones: set[str]) -> bool:
    """The read is at the reader's row (and its column when `column`): each row dimension
    its row axis (or 0 where the rows' extent is 1), then the column axis, or zeros (an
    index 0 or an axis of the reader's of extent 1)."""
    k = len(rows)

    def zero(x: IndexMap) -> bool:
        return (x.affine and not x.terms and x.const == 0) or x.plain_axis in ones

    if len(m) < k:
        return False
    for d in range(k):
        if m[d].plain_axis != reader.row_axes[d] and not (rows[d] == 1 and zero(m[d])):
            return False
    if column:
        return len(m) == k + 1 and reader.column is not None \
            and m[k].plain_axis == reader.column
    return all(zero(x) for x in m[k:])


def row_chain(module: Module, members: Sequence[int], reduces: bool = True
              ) -> RowChain | None:
    """The row chain `members` make (module docstring), or None: two ops or more, float32
    expression ops, at least one reduction (with `reduces`; without, row ops alone: the
    start of a chain, a scale and a mask before a softmax), rows of at least two points each,
    every read of a member's result at the reader's row (and point of it, for a row op's
    result)."""
    if len(members) < 2:
        return None
    g = graph(module)
    analyses = [g.nodes[i].analysis for i in members]
    if any(a is None or module.tensors[a.output].dtype != "float32" for a in analyses):
        return None
    reductions = [a for a in analyses if a.reduction]
    if reductions:
        if len(reductions[0].reduction) != 1:
            return None
        length = reductions[0].reduction[0][1]
    elif reduces or not analyses[0].spatial:
        return None
    else:
        length = analyses[0].spatial[-1][1]
    if length < 2:
        return None
    candidates = dict.fromkeys(r for a in analyses for r in _rows_of(a, length))
    for rows in candidates:
        chain = _chain(analyses, members, rows, length, reduces)
        if chain is not None:
            return chain
    return None


def _chain(analyses: list[Analysis], members: Sequence[int], rows: tuple[int, ...],
           length: int, reduces: bool) -> RowChain | None:
    """The row chain over `rows` of `length` points, or None."""
    ops: list[RowOp] = []
    role_of: dict[str, str] = {}
    for i, a in zip(members, analyses):
        op = _row_op(i, a, rows, length)
        if op is None:
            return None
        for acc in a.accesses:
            role = role_of.get(acc.tensor)
            if role is None:
                if acc.tensor == a.output:
                    return None
                continue
            ones = {x for x, n in a.spatial if n == 1}
            if not _row_read(acc.maps, op, rows, role == "row", ones):
                return None
        role_of[a.output] = op.role
        ops.append(op)
    if not reduces and any(op.role != "row" for op in ops):
        return None
    return RowChain(rows, length, tuple(ops))


def group_estimate(module: Module, members: Sequence[int], profile) -> Estimate:
    """The CPU estimate of `members` run as one kernel."""
    names = [module.ops[i].name for i in members]
    parts = {module.ops[i].name: (module.ops[i].tile, op_estimate(module, i))
             for i in members}
    return cpu_group_estimate(module, names, parts, profile)


def cpu_groups(module: Module, profile, max_group: int, no_fuse: Sequence[str]
               ) -> list[tuple[list[int], Estimate]]:
    """The groups (op indices) with their estimates, in module order (module docstring)."""
    g = graph(module)
    blocked = set(no_fuse)
    groups: list[tuple[list[int], Estimate]] = []
    open_: list[int] = []
    open_est: Estimate | None = None
    for i, node in enumerate(g.nodes):
        joins = False
        if open_ and node.analysis is not None and len(open_) < max_group \
                and node.name not in blocked \
                and g.nodes[open_[0]].analysis is not None \
                and not any(module.ops[k].name in blocked for k in open_) \
                and any(t in node.reads for k in open_ for t in g.nodes[k].writes) \
                and (one_cpu_kernel(module, open_ + [i])
                     or row_chain(module, open_ + [i]) is not None
                     or row_chain(module, open_ + [i], reduces=False) is not None):
            grown = group_estimate(module, open_ + [i], profile)
            if grown.time_us < open_est.time_us + op_estimate(module, i).time_us:
                open_.append(i)
                open_est = grown
                joins = True
        if not joins:
            if open_:
                groups.append((open_, open_est))
            open_, open_est = [i], op_estimate(module, i)
    if open_:
        groups.append((open_, open_est))
    return groups


def weld_cpu(module: Module, profile, max_group: int, no_fuse: Sequence[str]) -> Module:
    """`module` (rolled for the CPU `profile`) with its kernel groups (module docstring)."""
    records = control_records(module)
    if records:
        welded = {}
        for name, rec in records.items():
            regions = []
            for region in rec.regions:
                sub = weld_cpu(region_module(module.tensors, region, name), profile,
                               max_group, no_fuse)
                regions.append(replace(region, kernels=sub.kernels, control=sub.control))
            welded[name] = rec.with_regions(tuple(regions))
        module = with_control(module, welded)
    kernels = tuple(Kernel(f"k_{module.ops[members[0]].name}",
                           tuple(module.ops[i].name for i in members), estimate=est.record())
                    for members, est in cpu_groups(module, profile, max_group, no_fuse))
    return replace(module, kernels=kernels)


__all__ = ["ROW_ROLES", "RowChain", "RowOp", "cpu_groups", "group_estimate", "one_cpu_kernel",
           "row_chain", "weld_cpu"]
