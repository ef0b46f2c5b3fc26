"""Module analysis, once: every op's parsed and analysed expression, what it reads and writes,
and the data-flow graph of the module (producers, consumers, liveness).

This is the one place where stages, the verifier and the executors ask about a module:

    g = graph(module)
    g.nodes[i].analysis          # tilekit.expr.Analysis of an expr op (None for opaque ops)
    g.nodes[i].reads / .writes   # tensors, each once, in order of first use
    g.producer["t"]              # the op index writing t (absent for inputs and weights)
    g.consumers["t"]             # op indices reading t, in order
    g.last_reader("t")           # liveness: after which op nothing reads t
    g.internal_to({"a", "b"})    # tensors a group writes and only it reads (never outputs)

`graph(module)` is cached per module object and `op_analysis` per (statement, shapes of the
tensors it touches, axes, pad, dtypes), so a pass that copies a module (replacing tiles, adding
kernels) pays for the expressions once. Expression errors are located at the op:
`ops[3] (conv1).expr col 12: ...`.

The module must be structurally sound (the verifier's job, `tilekit.ir.verify`, which asks
this module for the expressions); ops are in topological order (a rule of the IR), so op
order is a topological order of the graph.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache
from tilekit.errors import ExprError, TilekitError
from tilekit.expr import Analysis, analyze, parse
from tilekit.expr.ast import body_accesses
from tilekit.ir.control import ControlOp, control_reads, read_control
from tilekit.ir.model import Module, Op


@dataclass(frozen=True)
class OpNode:
    """One op as the graph sees it."""

    index: int
    op: Op
    reads: tuple[str, ...]           # each once, in order of first use ("" inputs dropped)
    writes: tuple[str, ...]          # in the op's output order
    analysis: Analysis | None        # expr ops

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def where(self) -> str:
        return f"ops[{self.index}] ({self.op.name})"


def _located(exc: TilekitError, where: str) -> TilekitError:
    """`exc` located at `where` (`ops[i] (name).expr`), keeping a column (`col 12`); an
    inner location (a tensor name) is already part of the message."""
    col = exc.where if exc.where and exc.where.startswith("col ") else None
    return type(exc)(exc.what, f"{where} {col}" if col else where, exc.hint)


def op_analysis(module: Module, index: int, where: str | None = None) -> Analysis:
    """The analysis of expr op `index`; errors are located at `where` (default
    `ops[index] (name).expr`)."""
    op = module.ops[index]
    where = where or f"ops[{index}] ({op.name}).expr"
    if not isinstance(op.expr, str) or not op.expr.strip():
        raise ExprError("an expr op needs an expression", where,
                        "write a statement like 'y[i] = x[i] + 1' (specs/expressions.md)")
    try:
        stmt = parse(op.expr)
        names = (stmt.output.tensor, *(a.tensor for a in body_accesses(stmt.body)))
        known = tuple(dict.fromkeys(n for n in names if n in module.tensors))
        key = (tuple((n, module.tensors[n].shape, module.tensors[n].dtype) for n in known),
               tuple(sorted((op.axes or {}).items())), op.pad)
        return _analysis(op.expr, key)
    except TilekitError as exc:
        raise _located(exc, where) from None


@lru_cache(maxsize=8192)
def _analysis(expr: str, key) -> Analysis:
    tensors, axes, pad = key
    shapes = {n: shape for n, shape, _ in tensors}
    dtypes = {n: dtype for n, _, dtype in tensors}
    return analyze(parse(expr), shapes, axes=dict(axes) or None, pad=pad, dtypes=dtypes)


def op_tensors(op: Op, control=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(reads, writes) of an op from its statement or opaque record, without analysing it
    (what an importer needs before shapes are final). A control op's come from its record
    in `control` (its scope's section): explicit inputs and its regions' captures."""
    if op.kind == "control":
        rec = control_records_of(control).get(op.name)
        if rec is None:
            raise TilekitError(f"control op '{op.name}' has no record in 'control'",
                               f"control.{op.name}")
        return control_reads(rec), rec.writes()
    if op.kind == "opaque":
        spec = op.opaque or {}
        return (tuple(dict.fromkeys(n for n in spec.get("inputs", ()) if n)),
                tuple(n for n in spec.get("outputs", ()) if n))
    stmt = parse(op.expr)
    return (tuple(dict.fromkeys(a.tensor for a in body_accesses(stmt.body))),
            (stmt.output.tensor,))


class ModuleGraph:
    """The data-flow graph of one module (see the module docstring)."""

    def __init__(self, module: Module):
        nodes = []
        for index, op in enumerate(module.ops):
            if op.kind == "expr":
                analysis = op_analysis(module, index)
                nodes.append(OpNode(index, op, analysis.inputs, (analysis.output,), analysis))
            else:
                reads, writes = op_tensors(op, module.control)
                nodes.append(OpNode(index, op, reads, writes, None))
        self.nodes: tuple[OpNode, ...] = tuple(nodes)
        self.producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        for node in nodes:
            for t in node.writes:
                self.producer.setdefault(t, node.index)
            for t in node.reads:
                consumers.setdefault(t, []).append(node.index)
        self.consumers: dict[str, tuple[int, ...]] = {t: tuple(v) for t, v in consumers.items()}
        self.outputs = frozenset(module.outputs)
        self.given = frozenset(n for n, t in module.tensors.items()
                               if t.role in ("input", "weight"))
        self._index = {node.name: node.index for node in nodes}

    def node(self, name: str) -> OpNode:
        return self.nodes[self._index[name]]

    def index(self, name: str) -> int:
        return self._index[name]

    def last_reader(self, tensor: str) -> int | None:
        readers = self.consumers.get(tensor)
        return readers[-1] if readers else None

    def dies_after(self) -> tuple[tuple[str, ...], ...]:
        """Per op, the computed tensors that no later op reads (never outputs, inputs or
        weights): a tensor dies after its last reader, or right after its writer when nothing
        reads it."""
        dead: dict[int, list[str]] = {}
        for t, w in self.producer.items():
            if t in self.outputs or t in self.given:
                continue
            last = self.last_reader(t)
            dead.setdefault(w if last is None else max(w, last), []).append(t)
        return tuple(tuple(sorted(dead.get(i, ()))) for i in range(len(self.nodes)))

    def internal_to(self, ops) -> tuple[str, ...]:
        """Tensors written by one of `ops` (names) and read only by them, never outputs:
        what a group of ops can keep on chip."""
        inside = {self._index[name] for name in ops}
        out = []
        for i in sorted(inside):
            for t in self.nodes[i].writes:
                readers = self.consumers.get(t, ())
                if t not in self.outputs and all(r in inside for r in readers):
                    out.append(t)
        return tuple(out)

    def readers_outside(self, tensor: str, ops) -> tuple[int, ...]:
        inside = {self._index[name] for name in ops}
        return tuple(r for r in self.consumers.get(tensor, ()) if r not in inside)


_GRAPHS: dict[int, ModuleGraph] = {}
_CONTROL: dict[int, dict[str, ControlOp]] = {}


def control_records(module: Module) -> dict[str, ControlOp]:
    """The module's control records, typed (tilekit.ir.control), read once per module."""
    return per_module(_CONTROL, module, lambda m: read_control(m.control))


def control_records_of(control) -> dict[str, ControlOp]:
    return read_control(control) if control else {}


def graph(module: Module) -> ModuleGraph:
    """The graph of `module`, built once per module object (cached by identity; the entry
    goes away with the module)."""
    return per_module(_GRAPHS, module, ModuleGraph)


def per_module(cache: dict, module: Module, build):
    """`cache[id(module)]`, built by `build(module)` on first use and dropped with the module:
    the one pattern for analyses cached per module object (a Module is not hashable)."""
    hit = cache.get(id(module))
    if hit is None:
        hit = build(module)
        cache[id(module)] = hit
        weakref.finalize(module, cache.pop, id(module), None)
    return hit


__all__ = ["ModuleGraph", "OpNode", "control_records", "graph", "op_analysis", "op_tensors",
           "per_module"]
