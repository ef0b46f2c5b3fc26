"""What one kernel group computes and where each tensor lives: stages, chains, inlining.

A kernel group (`module.kernels[i]`, or one op when the module lists none) becomes a
`GroupPlan`, decided by walking its ops in order:

- an elementwise op (`=`) that consumes the current stage's result *at the same point*
  (`h[i,j] = max(t[i,j] + b[j], 0)` after `t[i,j] += ...`) joins that stage's **chain**: it
  runs in the stage's epilogue on values held in registers;
- otherwise an elementwise op whose result only this group reads is **inlined**: every read of
  its output is replaced by its expression (with the reader's indices substituted, guarded by
  the reader's padding); nothing is stored, the value is recomputed where it is read; except
  where tk-weld's group tile keeps that result in *shared* memory (a reader reuses it): then
  it is a stage of its own (`tilekit.weld.structure` makes the same walk);
- anything else starts a new **stage** (a reduction, a contraction, a broadcast).

A stage's results that later stages read live in shared memory; results that ops outside the
group (or the module's outputs) read are stored to global memory. A group with one stage is
emitted as one of the single-stage kernel shapes, several stages as the fused shape
(`tilekit.codegen.kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tilekit.codegen.values import storage
from tilekit.errors import UnsupportedError
from tilekit.expr import index_map
from tilekit.expr.analysis import Analysis, IndexMap
from tilekit.expr.ast import (Access, Axis, Binary, Call, Node, Num, Unary, body_accesses,
                              substitute)
from tilekit.expr.ops import PAD_VALUES
from tilekit.ir.graph import graph
from tilekit.ir.model import Kernel, Module, Op


@dataclass(frozen=True)
class Read:
    """One tensor read in an (expanded) body, with the padding that applies to it."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str
    maps: tuple[IndexMap, ...]
    pad: str | None
    node: Access

    @property
    def affine(self) -> bool:
        return all(m.affine for m in self.maps)


@dataclass(frozen=True)
class OpPlan:
    """An expr op ready to emit: axes, assignment and its body with group-local elementwise
    producers inlined. `reads` is keyed by `id()` of the Access nodes of `body`."""

    op: Op
    index: int
    output: str
    out_shape: tuple[int, ...]
    out_dtype: str
    spatial: tuple[tuple[str, int], ...]
    reduction: tuple[tuple[str, int], ...]
    assign: str
    body: Node
    reads: Mapping[int, Read]

    @property
    def where(self) -> str:
        return f"ops[{self.index}] ({self.op.name})"

    def read(self, node: Access) -> Read:
        return self.reads[id(node)]

    def read_list(self) -> list[Read]:
        """Reads in body order (each occurrence once)."""
        return [self.reads[id(n)] for n in _accesses(self.body)]

    @property
    def reduces(self) -> bool:
        return bool(self.reduction)

    @property
    def points(self) -> int:
        n = 1
        for _, e in self.spatial:
            n *= e
        return n


@dataclass(frozen=True)
class Stage:
    """A main op and the elementwise ops chained onto its result at the same point."""

    main: OpPlan
    chain: tuple[OpPlan, ...] = ()

    @property
    def ops(self) -> tuple[OpPlan, ...]:
        return (self.main,) + self.chain

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(p.output for p in self.ops)

    @property
    def last(self) -> OpPlan:
        return self.ops[-1]


@dataclass(frozen=True)
class GroupPlan:
    name: str
    kernel: Kernel
    stages: tuple[Stage, ...]
    inlined: tuple[str, ...]          # ops whose expressions were inlined into readers
    stored: frozenset[str]            # tensors this group writes to global memory
    shared: frozenset[str]            # stage results later stages read (shared memory)

    @property
    def ops(self) -> tuple[OpPlan, ...]:
        return tuple(p for s in self.stages for p in s.ops)


@dataclass(frozen=True)
class OpaquePlan:
    """A group made of one opaque op."""

    name: str
    kernel: Kernel
    op: Op
    index: int


def _accesses(node: Node) -> list[Access]:
    """Access nodes in a body, including inside select guards, never inside indices."""
    return body_accesses(node)


# -- analysis of expr ops ----------------------------------------------------------------

def _copy(node: Node) -> Node:
    """A structural copy with fresh Access objects (reads are keyed by identity)."""
    return substitute(node, {})


class _Expander:
    """Builds OpPlans, inlining the bodies of elementwise producers marked inlinable."""

    def __init__(self, module: Module):
        self.module = module
        self.analyses: dict[int, Analysis] = {}
        self.inline: dict[str, int] = {}  # tensor -> op index of its inlinable producer

    def analysis(self, index: int) -> Analysis:
        if index not in self.analyses:
            self.analyses[index] = graph(self.module).nodes[index].analysis
        return self.analyses[index]

    def plan(self, index: int) -> OpPlan:
        a = self.analysis(index)
        op = self.module.ops[index]
        reads: dict[int, Read] = {}
        body = self._expand(_copy(a.stmt.body), op.pad, reads, depth=0)
        out = self.module.tensors[a.output]
        return OpPlan(op, index, a.output, tuple(out.shape), out.dtype, a.spatial, a.reduction,
                      a.assign, body, reads)

    def _expand(self, node: Node, pad: str | None, reads: dict[int, Read], depth: int) -> Node:
        if isinstance(node, Access):
            if node.tensor in self.inline:
                return self._inline(node, pad, reads, depth)
            t = self.module.tensors[node.tensor]
            maps = tuple(index_map(i, node.tensor) for i in node.indices)
            reads[id(node)] = Read(node.tensor, tuple(t.shape), t.dtype, maps, pad, node)
            return node
        if isinstance(node, Unary):
            return Unary(node.op, self._expand(node.arg, pad, reads, depth))
        if isinstance(node, Binary):
            return Binary(node.op, self._expand(node.lhs, pad, reads, depth),
                          self._expand(node.rhs, pad, reads, depth))
        if isinstance(node, Call):
            return Call(node.fn, tuple(self._expand(a, pad, reads, depth) for a in node.args))
        return node

    def _inline(self, node: Access, pad: str | None, reads: dict[int, Read],
                depth: int) -> Node:
        """The producer's body at the read's indices, guarded by the reader's padding."""
        if depth > 64:
            raise UnsupportedError("elementwise inlining nested more than 64 deep",
                                   node.tensor)
        producer = self.module.ops[self.inline[node.tensor]]
        pa = self.analysis(self.inline[node.tensor])
        axes = {name: idx for (name, _), idx in zip(pa.spatial, node.indices)}
        body = substitute(_copy(pa.stmt.body), axes)
        body = self._expand(body, producer.pad, reads, depth + 1)
        out = self.module.tensors[node.tensor]
        # A reader sees the value as stored: cast to the tensor's dtype (a no-op when the
        # producer already computes in that kind; a rounding for float16).
        body = Call(out.dtype, (body,))
        guard = _range_guard(node, tuple(out.shape))
        if guard is None:
            return body
        return Call("select", (guard, body, _pad_node(pad, out.dtype)))


def _pad_node(pad: str | None, dtype: str) -> Node:
    import math
    value = PAD_VALUES.get(pad, 0.0) if pad is not None else 0.0
    kind = storage(dtype).kind
    if kind == "i" and math.isinf(value):
        from tilekit.codegen.values import _INT_LIMITS
        lo, hi = _INT_LIMITS[dtype]
        return Num(lo if value < 0 else hi)
    if kind == "b":
        return Call("bool", (Num(1 if value > 0 else 0),))
    if kind == "i":
        return Num(0)
    return Num(value)


def _range_guard(node: Access, shape: tuple[int, ...]) -> Node | None:
    """`0 <= idx_d < dim_d` for every dimension whose index is not a plain in-range axis.

    Returned as an expression so that it is compiled like any body condition; the kernel's
    own interval analysis cannot see through inlining, so the guard is always explicit for
    compound indices (cheap: integer compares, and the C compiler folds constant ones).
    """
    terms: list[Node] = []
    for idx, dim in zip(node.indices, shape):
        if isinstance(idx, Axis):
            continue  # a plain axis of the reader: its extent equals a dimension it indexes
        terms.append(Binary("&&", Binary(">=", idx, Num(0)), Binary("<", idx, Num(dim))))
    if not terms:
        return None
    guard = terms[0]
    for t in terms[1:]:
        guard = Binary("&&", guard, t)
    return guard


# -- grouping ----------------------------------------------------------------------------

def readers(module: Module) -> Mapping[str, tuple[int, ...]]:
    """tensor -> indices of the ops that read it (the module graph's consumers)."""
    return graph(module).consumers


def plan_group(module: Module, kernel: Kernel, name: str,
               tensor_readers: Mapping[str, tuple[int, ...]]) -> GroupPlan | OpaquePlan:
    """Decide stages, chains and inlining for one kernel group (see the module docstring)."""
    index = module.op_index()
    members = [index[o] for o in kernel.ops]
    for i in members:
        if module.ops[i].kind == "opaque":
            if len(members) > 1:
                raise GroupSplit(f"opaque op '{module.ops[i].name}' cannot share a kernel")
            return OpaquePlan(name, kernel, module.ops[i], i)
    member_set = set(members)
    outputs = set(module.outputs)
    # tk-weld's edge levels: an elementwise result it keeps in shared memory (read with
    # reuse by a later stage) is a stage of its own, never inlined (recomputed per read).
    levels = weld_levels(kernel)
    g = graph(module)
    written = {t: i for i in members for t in g.nodes[i].writes}
    internal = {t for t, w in written.items()
                if t not in outputs and tensor_readers.get(t)
                and all(r in member_set for r in tensor_readers[t])}
    expander = _Expander(module)
    stages: list[Stage] = []
    inlined: list[str] = []
    last = members[-1]
    for i in members:
        op = module.ops[i]
        a = expander.analysis(i)
        out = a.output
        if stages and a.assign == "=" and not a.reduction:
            candidate = expander.plan(i)
            if _chains_onto(candidate, stages[-1], set(written)):
                stages[-1] = Stage(stages[-1].main, stages[-1].chain + (candidate,))
                continue
        if a.assign == "=" and not a.reduction and out in internal and i != last \
                and levels.get(out) != "shared":
            expander.inline[out] = i
            inlined.append(op.name)
            continue
        stages.append(Stage(expander.plan(i)))
    # Inlining decided after some plans were built would leave stale reads: rebuild in order.
    rebuilt: list[Stage] = []
    for s in stages:
        rebuilt.append(Stage(expander.plan(s.main.index),
                             tuple(expander.plan(c.index) for c in s.chain)))
    stage_of = {t: k for k, s in enumerate(rebuilt) for t in s.outputs}
    shared: set[str] = set()
    for k, s in enumerate(rebuilt):
        for p in s.ops:
            for r in p.read_list():
                src = stage_of.get(r.tensor)
                if src is not None and src < k:
                    shared.add(r.tensor)
                elif src is not None and src == k and r.tensor in s.outputs:
                    if not _identity_read(r, p):
                        raise GroupSplit(f"op '{p.op.name}' reads '{r.tensor}' of its own stage "
                                     "at another point")
    stored = frozenset(t for t in stage_of if t not in internal)
    return GroupPlan(name, kernel, tuple(rebuilt), tuple(inlined), stored, frozenset(shared))


def plan_each(module: Module, kernel: Kernel, name: str,
              tensor_readers: Mapping[str, tuple[int, ...]]) -> GroupPlan:
    """The group with every op a stage of its own (nothing chained, nothing inlined), for a
    kernel shape that places each intermediate itself (the CPU's row chains,
    `tilekit.codegen.cpu_rows`). `stored`: results read outside the group or outputs;
    `shared`: results a later member reads."""
    index = module.op_index()
    members = [index[o] for o in kernel.ops]
    expander = _Expander(module)
    stages = tuple(Stage(expander.plan(i)) for i in members)
    member_set = set(members)
    outputs = set(module.outputs)
    written = [s.main.output for s in stages]
    stored = frozenset(t for t in written if t in outputs or not tensor_readers.get(t)
                       or any(r not in member_set for r in tensor_readers[t]))
    shared = frozenset(t for t in written if any(r.tensor == t for s in stages
                                                  for r in s.main.read_list()))
    return GroupPlan(name, kernel, stages, (), stored, shared)


def weld_levels(kernel: Kernel) -> Mapping[str, str]:
    """tensor -> memory level from the kernel's weld tile (empty without one); the payload's
    form is checked by the weld verifier before codegen plans the group."""
    tile = kernel.tile if isinstance(kernel.tile, Mapping) else {}
    if tile.get("source") != "weld":
        return {}
    return {e["tensor"]: e["level"] for e in tile.get("edges", ())
            if isinstance(e, Mapping) and "tensor" in e and "level" in e}


class GroupSplit(Exception):
    """This group cannot be one kernel; the caller splits it into one kernel per op."""


def _identity_read(r: Read, p: OpPlan) -> bool:
    axes = [a for a, _ in p.spatial]
    return len(r.maps) == len(axes) and all(m.plain_axis == a for m, a in zip(r.maps, axes))


def _chains_onto(candidate: OpPlan, stage: Stage, group_written: set[str]) -> bool:
    """True when `candidate` can run in `stage`'s epilogue on its registers."""
    if candidate.out_shape != stage.main.out_shape:
        return False
    reads_stage = False
    for r in candidate.read_list():
        if r.tensor in stage.outputs:
            if not _identity_read(r, candidate):
                return False
            reads_stage = True
        elif r.tensor in group_written:
            return False
    return reads_stage
