"""What a group of ops is as one kernel: its stages, each edge's memory level, each member's
propagated tile, the shared-memory footprint with liveness.

This is Welder's tile graph for one group (ops in module order, the last op's output tile
given):

- **stages and levels.** Walking the members in order (the same walk the code generator's
  `plan_group` does, so the two agree; tests/unit/test_weld_agreement.py checks it):
  an elementwise op that reads the current stage's result at the same point *chains* onto
  that stage (its input edge is **register**: the value never leaves the thread);
  an elementwise op whose result only the group reads, and whose every reader reads each of
  its points once (no reuse: a thread produces what it consumes), is *inlined* into its
  readers (edge **register**); anything else starts a new *stage*, and an edge from an
  earlier stage is **shared** (other threads of the block read it). A result read outside
  the group, or a module output, is also stored to **global** memory (`stored`).
- **propagation.** From the last op's block tile backwards, each member's *region* is the
  union of the boxes its in-group readers touch (`tilekit.expr.box`: halos included, a
  reduction's reader sees the whole reduced extent), clamped to its tensor: per dimension an
  origin linear in the block's tile origin and a fixed length. Recompute is the work the
  blocks do over the op's own work (halos overlap between neighbouring blocks).
- **footprint.** Shared buffers hold a stage result's region; a buffer lives from its stage
  to its last reader stage, and buffers whose lives do not overlap share bytes (best fit,
  `SMEM_ALIGN`-aligned offsets): what the fused kernel allocates.

A group this module cannot describe raises `NotFusible` with the reason (the fuser then
keeps the ops apart; the verifier reports it as bad input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from tilekit.errors import TilekitError
from tilekit.expr import index_map
from tilekit.expr.analysis import Analysis, IndexMap
from tilekit.expr.ast import Access, body_accesses, substitute
from tilekit.expr.box import Span, clamp, map_box, tile_spans, union
from tilekit.ir.graph import graph
from tilekit.ir.model import Module
from tilekit.schedule.defaults import KIND_BYTES, shared_bytes
from tilekit.schedule.shape import align_smem

#: Storage kind of each dtype in a kernel's shared memory (float16/bfloat16 compute as float).
DTYPE_KIND = {"float32": "f", "float16": "f", "bfloat16": "f", "float64": "d", "int64": "i",
              "int32": "i", "int16": "i", "int8": "i", "uint8": "i", "bool": "b"}
LEVELS = ("register", "shared", "global")
ROLES = ("stage", "chain", "inline")


class NotFusible(Exception):
    """These ops cannot be one kernel group (the message says why)."""


def smem_limit(profile) -> int:
    """Shared memory a block may use on `profile`; a profile without any is bad input."""
    limit = int(getattr(profile, "smem_per_block", 0) or 0)
    if limit <= 0:
        raise TilekitError(f"hardware profile '{profile.name}' has no shared memory per "
                           "block", "--hw", "tk-weld keeps intermediates in shared memory: "
                           "use a profile with memory[shared].per_block_optin")
    return limit


@dataclass(frozen=True)
class Edge:
    """A tensor one member writes and other members read."""

    tensor: str
    producer: str
    consumers: tuple[str, ...]
    level: str           # register | shared
    stored: bool         # also written to global memory (read outside, or an output)


@dataclass(frozen=True)
class Structure:
    """Stages, roles and edges of a group (no tile yet)."""

    members: tuple[int, ...]             # op indices, module order
    names: tuple[str, ...]
    roles: tuple[str, ...]               # per member: stage | chain | inline
    stage_of: tuple[int, ...]            # per member: its stage (inlined: its first reader's)
    edges: tuple[Edge, ...]
    stored: tuple[str, ...]              # tensors the group writes to global memory

    @property
    def stages(self) -> int:
        return 1 + max(self.stage_of)

    @property
    def shared(self) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.level == "shared")


def _analysis(module: Module, i: int) -> Analysis:
    a = graph(module).nodes[i].analysis
    if a is None:
        raise NotFusible(f"'{module.ops[i].name}' is opaque and runs alone")
    return a


def expanded_reads(module: Module, i: int, inline: Mapping[str, int], depth: int = 0
                    ) -> list[tuple[str, tuple[IndexMap, ...]]]:
    """(tensor, index maps over op i's axes) of every read of op i, with inlined producers
    replaced by their own reads at the composed indices (what plan_group expands)."""
    if depth > 64:
        raise NotFusible("elementwise inlining nested more than 64 deep")
    return _reads_of(module, _analysis(module, i).stmt.body, inline, depth)


def _reads_of(module, body, inline, depth):
    out = []
    for acc in body_accesses(body):
        if acc.tensor in inline:
            pa = _analysis(module, inline[acc.tensor])
            axes = {name: idx for (name, _), idx in zip(pa.spatial, acc.indices)}
            out.extend(_reads_of(module, substitute(pa.stmt.body, axes), inline, depth + 1))
        else:
            out.append((acc.tensor, tuple(index_map(x, acc.tensor) for x in acc.indices)))
    return out


def _identity(maps: Sequence[IndexMap], a: Analysis) -> bool:
    axes = [n for n, _ in a.spatial]
    return len(maps) == len(axes) and all(m.plain_axis == n for m, n in zip(maps, axes))


def _injective_reads(module: Module, producer: int, readers: Sequence[int]) -> bool:
    """True when every reader reads each point of the producer's output at most once over its
    whole iteration space (so inlining recomputes nothing)."""
    out = _analysis(module, producer).output
    size = module.tensors[out].size
    for r in readers:
        a = _analysis(module, r)
        points = math.prod(e for _, e in a.axes)
        for acc in a.accesses:
            if acc.tensor != out:
                continue
            used = {x for m in acc.maps for x in m.axes}
            if any(n not in used for n, _ in a.axes) or points > size:
                return False
    return True


def structure(module: Module, members: Sequence[int], levels: Mapping[str, str] | None = None
              ) -> Structure:
    """Stages, roles and edge levels of the group `members` (see the module docstring).
    `levels` (tensor -> level) are a group payload's recorded levels: a recorded "shared"
    keeps an elementwise result in a stage where the walk could inline it."""
    g = graph(module)
    members = tuple(sorted(members))
    inside = set(members)
    written = {_analysis(module, i).output: i for i in members}
    outputs = set(module.outputs)
    readers = {t: g.consumers.get(t, ()) for t in written}
    internal = {t for t, rs in readers.items()
                if t not in outputs and rs and all(r in inside for r in rs)}
    last = members[-1]
    inline: dict[str, int] = {}
    roles: dict[int, str] = {}
    stage_of: dict[int, int] = {}
    stage_outputs: list[set[str]] = []
    stage_main: list[int] = []
    for i in members:
        a = _analysis(module, i)
        elementwise = a.assign == "=" and not a.reduction
        if stage_outputs and elementwise and _chains(module, i, inline, stage_main[-1],
                                                     stage_outputs[-1], set(written)):
            roles[i], stage_of[i] = "chain", len(stage_outputs) - 1
            stage_outputs[-1].add(a.output)
            continue
        # Inlined only when no reader reuses a point (else each read would recompute it):
        # a reused elementwise result is a stage of its own, kept in shared memory.
        if (elementwise and a.output in internal and i != last
                and (levels or {}).get(a.output) != "shared"
                and _injective_reads(module, i, readers[a.output])):
            inline[a.output] = i
            roles[i] = "inline"
            continue
        roles[i], stage_of[i] = "stage", len(stage_outputs)
        stage_outputs.append({a.output})
        stage_main.append(i)
    for t, i in reversed(list(inline.items())):   # an inlined op: its first reader's stage
        first = min(r for r in readers[t])
        stage_of[i] = stage_of.get(first, 0)
    _check_same_stage_reads(module, members, inline, stage_of, written)
    edges = []
    for t, i in written.items():
        inner = tuple(module.ops[r].name for r in readers[t] if r in inside)
        if not inner:
            continue
        if roles[i] == "inline" or all(stage_of[r] == stage_of[i]
                                       for r in readers[t] if r in inside):
            level = "register"
        else:
            level = "shared"
        edges.append(Edge(t, module.ops[i].name, inner, level, t not in internal))
    stored = tuple(t for t in written if t not in internal)
    for t in stored:
        if written[t] in inline.values():  # pragma: no cover - inline needs internal
            raise NotFusible(f"'{t}' is stored but inlined")
    return Structure(members, tuple(module.ops[i].name for i in members),
                     tuple(roles[i] for i in members), tuple(stage_of[i] for i in members),
                     tuple(edges), stored)


def _chains(module, i, inline, main, outputs, written) -> bool:
    """plan_group's chain rule: same output shape as the stage's main op, every read of the
    stage's results at the same point, no read of another result of the group."""
    a = _analysis(module, i)
    if a.out_shape != _analysis(module, main).out_shape:
        return False
    reads_stage = False
    for tensor, maps in expanded_reads(module, i, inline):
        if tensor in outputs:
            if not _identity(maps, a):
                return False
            reads_stage = True
        elif tensor in written:
            return False
    return reads_stage


def _check_same_stage_reads(module, members, inline, stage_of, written) -> None:
    for i in members:
        if i in inline.values():
            continue
        a = _analysis(module, i)
        for tensor, maps in expanded_reads(module, i, inline):
            src = written.get(tensor)
            if src is None or src in inline.values():
                continue
            if stage_of[src] == stage_of[i] and src != i and not _identity(maps, a):
                raise NotFusible(f"'{module.ops[i].name}' reads '{tensor}' of its own stage "
                                 "at another point")


# -- propagation -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Propagation:
    """Each member's region for a block tile of the last op (see the module docstring)."""

    block: tuple[int, ...]
    blocks: int
    regions: tuple[tuple[Span, ...], ...]     # per member, per spatial axis of its output
    work: tuple[float, ...]                   # per member: blocks x region x reduction points
    own: tuple[float, ...]                    # per member: its op's iteration points

    @property
    def recompute(self) -> float:
        """Work done over work needed, the whole group (1.0: nothing computed twice)."""
        return sum(self.work) / max(1.0, sum(self.own))

    def lengths(self, k: int) -> tuple[int, ...]:
        return tuple(s.length for s in self.regions[k])


def propagate(module: Module, members: Sequence[int], block: Sequence[int]) -> Propagation:
    """Regions of every member for the last member's output tile `block` (one size per
    spatial axis of the last op)."""
    members = tuple(members)
    analyses = [_analysis(module, i) for i in members]
    last = analyses[-1]
    if len(block) != len(last.spatial):
        raise NotFusible(f"a block tile of {len(block)} sizes for an op with "
                         f"{len(last.spatial)} spatial axes")
    regions = walk_regions(analyses, tile_spans(block),
                           [module.ops[i].name for i in members])
    blocks = math.prod(-(-e // b) for (_, e), b in zip(last.spatial, block))
    work, own = [], []
    for a, region in zip(analyses, regions):
        red = math.prod(e for _, e in a.reduction)
        work.append(float(blocks) * math.prod(s.length for s in region) * red)
        own.append(float(math.prod(e for _, e in a.spatial)) * red)
    return Propagation(tuple(block), blocks, regions, tuple(work), tuple(own))


def walk_regions(analyses: Sequence[Analysis], last: Sequence[Span],
                 names: Sequence[str]) -> tuple[tuple[Span, ...], ...]:
    """Welder's backward propagation: each member's region from the last member's output
    spans `last` (symbolic for a block tile, concrete for one box): the union of the boxes
    its in-group readers touch, halos included, reduction axes whole, clamped."""
    position = {a.output: k for k, a in enumerate(analyses)}
    regions: list[tuple[Span, ...] | None] = [None] * len(analyses)
    regions[-1] = tuple(last)
    needs: dict[str, list[Span]] = {}
    for k in range(len(analyses) - 1, -1, -1):
        a = analyses[k]
        if regions[k] is None:
            need = needs.get(a.output)
            if need is None:
                raise NotFusible(f"'{names[k]}' computes nothing the group's last op reads")
            regions[k] = tuple(clamp(s, d) for s, d in zip(need, a.out_shape))
        spans = {n: s for (n, _), s in zip(a.spatial, regions[k])}
        spans.update({n: Span.whole(e) for n, e in a.reduction})
        for acc in a.accesses:
            j = position.get(acc.tensor)
            if j is None or j >= k:
                continue
            box = list(map_box(acc.maps, spans, acc.shape))
            old = needs.get(acc.tensor)
            needs[acc.tensor] = box if old is None else [
                union(x, y, d) for x, y, d in zip(old, box, acc.shape)]
    return tuple(regions)  # type: ignore[arg-type]


def covers(region: Sequence[Span], shape: Sequence[int], block: Sequence[int],
           extents: Sequence[int]) -> bool:
    """True when the union of every block's `region` covers a tensor of `shape` (a stored
    result must be computed everywhere)."""
    for s, dim in zip(region, shape):
        if not s.lo.coefs:
            if s.lo.const > 0 or s.lo.const + s.length < dim:
                return False
            continue
        if len(s.lo.coefs) != 1 or s.lo.coefs[0][1] != 1:
            return False
        q = s.lo.coefs[0][0]
        tiles = -(-extents[q] // block[q])
        if s.lo.const > 0 or s.length < block[q]:
            return False
        if (tiles - 1) * block[q] + s.lo.const + s.length < dim:
            return False
    return True


# -- footprint --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Buffer:
    tensor: str
    nbytes: int
    first: int        # stage writing it
    last: int         # last stage reading it
    offset: int = 0


def buffer_bytes(module: Module, tensor: str, lengths: Sequence[int]) -> int:
    """Bytes of the shared buffer holding `lengths` of `tensor` in its compute kind (as the
    fused kernel stores it)."""
    kind = DTYPE_KIND[module.tensors[tensor].dtype]
    return shared_bytes(math.prod(lengths), kind)


def allocate(buffers: Sequence[Buffer]) -> tuple[tuple[Buffer, ...], int]:
    """Best-fit offsets for buffers alive over stage intervals [first, last]: a buffer may
    take bytes whose previous holder's last reader ran in an earlier stage (a barrier ends
    every stage). Returns the placed buffers (input order) and the footprint."""
    placed: list[Buffer] = []
    order = sorted(range(len(buffers)), key=lambda k: (buffers[k].first, -buffers[k].nbytes,
                                                        buffers[k].tensor))
    out: dict[int, Buffer] = {}
    for k in order:
        b = buffers[k]
        busy = sorted((p.offset, p.offset + align_smem(p.nbytes)) for p in placed
                      if not (p.last < b.first or b.last < p.first))
        size = align_smem(b.nbytes)
        best, cursor, best_gap = None, 0, None
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, hi)
        offset = best if best is not None else cursor
        done = Buffer(b.tensor, b.nbytes, b.first, b.last, offset)
        placed.append(done)
        out[k] = done
    total = max((p.offset + align_smem(p.nbytes) for p in placed), default=0)
    return tuple(out[k] for k in range(len(buffers))), total


def shared_buffers(module: Module, s: Structure, prop: Propagation) -> tuple[Buffer, ...]:
    """The shared buffers of a group for a propagation, placed with liveness."""
    pos = {name: k for k, name in enumerate(s.names)}
    wanted = []
    for e in s.shared:
        k = pos[e.producer]
        last = max(s.stage_of[pos[c]] for c in e.consumers)
        wanted.append(Buffer(e.tensor, buffer_bytes(module, e.tensor, prop.lengths(k)),
                             s.stage_of[k], last))
    placed, _ = allocate(wanted)
    return placed


def footprint(buffers: Sequence[Buffer]) -> int:
    return max((b.offset + align_smem(b.nbytes) for b in buffers), default=0)


__all__ = ["Buffer", "DTYPE_KIND", "Edge", "KIND_BYTES", "LEVELS", "NotFusible", "Propagation",
           "ROLES", "Structure", "allocate", "buffer_bytes", "covers", "expanded_reads",
           "footprint",
           "propagate", "shared_buffers", "smem_limit", "structure", "walk_regions"]
