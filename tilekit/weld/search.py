"""The tile level of Welder's scheduling: the output tile of one group.

- **One stage**: the kernel is the main op's rolled kernel with an epilogue, so its tile is
  the main op's rolled tile (Roller already searched it); the main op's runners-up are the
  group's, each priced as a group.
- **Attention** with a key axis longer than `FLASH_STEP` (tilekit.weld.attention): the flash
  form, block tiles of rows (the innermost row axis 1, 2, 4, ...) times every column.
- **Several stages** (the fused shape): best-first search over block tiles of the last op,
  starting from the smallest tile (1 on every axis) and growing one axis at a time (doubling,
  or straight to the whole extent), by priority DRAM traffic x waves (ties: estimated time).
  A tile is valid when its shared buffers fit the block's shared memory, it has at most
  1,024 threads, every stored result is covered by the blocks' regions, and the group's
  recompute stays within `MAX_RECOMPUTE`; tiles over the shared-memory limit are not grown
  further (a larger tile only needs more), tiles over the recompute bound are (halos shrink
  relative to a larger tile). At most `MAX_VISITS` tiles are priced. The valid tiles are
  ranked by estimated time; the first is the group's tile, the next `top_k - 1` its
  runners-up.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from tilekit.ir.model import Module
from tilekit.ir.payloads import MAX_THREADS, Candidate, Estimate, OpTile, Tile
from tilekit.schedule.shape import align_smem
from tilekit.weld.model import group_estimate, op_estimate, threads_for
from tilekit.weld.structure import (Buffer, NotFusible, Propagation, Structure, covers,
                                    footprint, propagate, shared_buffers)
from tilekit.ir.graph import graph
from tilekit.weld.attention import (FLASH_POINTS_PER_THREAD, FLASH_STEP, FLASH_THREADS,
                                    Attention, match)

#: Work the blocks of a group may do over the work of its ops (halo recompute), at most.
MAX_RECOMPUTE = 1.25
#: Tiles priced per group, at most (Welder's search stops near 2,000 in its own artifact;
#: ours prices each in microseconds, but groups are searched many times while connecting).
MAX_VISITS = 48


@dataclass(frozen=True)
class TileChoice:
    """A priced tile of a group."""

    tile: Tile                       # over the last op's spatial axes; step: last stage's
    prop: Propagation | None         # None for a one-stage group (the rolled kernel)
    buffers: tuple[Buffer, ...]
    smem: int
    estimate: Estimate
    flash: Attention | None = None   # the flash form of an attention group (key axis split)


def _rolled(module: Module, i: int) -> OpTile:
    node = graph(module).nodes[i]
    a = node.analysis
    return OpTile.read(node.op.tile, a.spatial, a.reduction,
                       f"ops[{i}] ({node.op.name}).tile")


def one_stage(module: Module, s: Structure, profile, top_k: int) -> list[TileChoice]:
    """The tiles of a one-stage group: the main op's rolled tile and its runners-up."""
    main = s.members[s.roles.index("stage")]
    rolled = _rolled(module, main)
    prop = propagate(module, s.members, rolled.tile.block) if len(s.members) > 1 else None
    best = group_estimate(module, s, None, profile)
    out = [TileChoice(Tile(rolled.tile.block, rolled.tile.thread, rolled.tile.step, "weld"),
                      prop, (), 0, best)]
    for c in rolled.candidates[:top_k - 1]:
        parts_est = _with_main(module, s, main, c.estimate, profile)
        out.append(TileChoice(Tile(c.tile.block, c.tile.thread, c.tile.step, "weld"), None,
                              (), 0, parts_est))
    return out


def _with_main(module, s: Structure, main: int, est: Estimate, profile) -> Estimate:
    """The group's estimate with the main op run at another of its rolled tiles."""
    from tilekit.roll.cost import combine_estimates
    from tilekit.weld.model import saved_bytes

    parts = [est if i == main else op_estimate(module, i) for i in s.members]
    return combine_estimates(profile, parts, saved_bytes(module, s), est)


def thread_tile(block: tuple[int, ...]) -> tuple[int, ...]:
    """Per-axis thread sizes that bring a block's threads to at most `threads_for` its
    points: the axis with the most threads is folded by its smallest factor first."""
    want = threads_for(math.prod(block))
    thread = [1] * len(block)
    while math.prod(b // t for b, t in zip(block, thread)) > want:
        order = sorted(range(len(block)), key=lambda q: -(block[q] // thread[q]))
        for q in order:
            rest = block[q] // thread[q]
            f = next((f for f in range(2, rest + 1) if rest % f == 0), None)
            if f is not None:
                thread[q] *= f
                break
        else:  # pragma: no cover - every block of more than one point has a factor
            break
    return tuple(thread)


def several_stages(module: Module, s: Structure, profile, top_k: int, limit: int
                   ) -> list[TileChoice]:
    """Best-first search over the last op's block tiles (module docstring)."""
    last = graph(module).nodes[s.members[-1]].analysis
    extents = tuple(e for _, e in last.spatial)
    start = tuple(1 for _ in extents)
    seen = {start}
    heap: list[tuple[tuple[float, float], tuple[int, ...]]] = []
    valid: list[TileChoice] = []
    first = _price(module, s, start, extents, profile, limit)
    heapq.heappush(heap, (first[0], start))
    priced = {start: first}
    visits = 0
    while heap and visits < MAX_VISITS:
        _, block = heapq.heappop(heap)
        visits += 1
        key, choice, grow = priced[block]
        if choice is not None:
            valid.append(choice)
        if not grow:
            continue
        for q, e in enumerate(extents):
            for size in {min(block[q] * 2, e), e}:
                if size == block[q]:
                    continue
                nxt = block[:q] + (size,) + block[q + 1:]
                if nxt in seen:
                    continue
                seen.add(nxt)
                priced[nxt] = _price(module, s, nxt, extents, profile, limit)
                heapq.heappush(heap, (priced[nxt][0], nxt))
    if not valid:
        raise NotFusible("no block tile fits shared memory with recompute within "
                         f"{MAX_RECOMPUTE}x")
    valid.sort(key=lambda c: (c.estimate.time_us, c.estimate.dram_bytes, c.tile.block))
    return valid[:top_k]


def _price(module, s: Structure, block, extents, profile, limit):
    """(priority, a valid TileChoice or None, whether to grow it)."""
    prop = propagate(module, s.members, block)
    buffers = shared_buffers(module, s, prop)
    smem = footprint(buffers)
    thread = thread_tile(block)
    tile = Tile(tuple(block), thread, (), "weld")
    if smem > limit or tile.threads > MAX_THREADS:
        return (math.inf, math.inf), None, False
    est = group_estimate(module, s, prop, profile, tile.threads, smem)
    key = (est.dram_bytes * est.waves, est.time_us)
    if prop.recompute > MAX_RECOMPUTE or not _stored_covered(module, s, prop, extents):
        return key, None, True
    return key, TileChoice(tile, prop, buffers, smem, est), True


def _stored_covered(module, s: Structure, prop: Propagation, extents) -> bool:
    g = graph(module)
    for k, i in enumerate(s.members[:-1]):
        out = g.nodes[i].writes[0]
        if out in s.stored and not covers(prop.regions[k], module.tensors[out].shape,
                                          prop.block, extents):
            return False
    return True


def choose(module: Module, s: Structure, profile, top_k: int, limit: int) -> list[TileChoice]:
    """The group's tile first, then its runners-up (at most `top_k` in all)."""
    if s.stages == 1:
        return one_stage(module, s, profile, top_k)
    att = match(module, s)
    if att is not None and att.key_extent > FLASH_STEP and _all_float32(module, s):
        return flash_tiles(module, s, att, profile, top_k, limit)
    return several_stages(module, s, profile, top_k, limit)


def _all_float32(module: Module, s: Structure) -> bool:
    g = graph(module)
    return all(module.tensors[t].dtype == "float32"
               for i in s.members for t in (*g.nodes[i].reads, *g.nodes[i].writes))


def flash_footprint(rows: int) -> int:
    """Shared bytes of the flash form: a step of scores and three floats per row."""
    return align_smem(rows * FLASH_STEP * 4) + 3 * align_smem(rows * 4)


def flash_tiles(module: Module, s: Structure, att: Attention, profile, top_k: int,
                limit: int) -> list[TileChoice]:
    """Tiles of the flash form: every row axis 1 but the innermost, which takes 1, 2, 4, ...
    rows while a thread keeps at most `FLASH_POINTS_PER_THREAD` accumulators and the
    footprint fits; every column whole. Ranked by estimated time (the work is the whole-row
    group's: the same scores, computed once per row)."""
    last = graph(module).nodes[s.members[-1]].analysis
    axes = [a for a, _ in last.spatial]
    o = graph(module).nodes[s.members[att.stages[4]]].analysis
    o_axes = [a for a, _ in o.spatial]
    extents = [e for _, e in last.spatial]
    rows = [o_axes.index(a) for a in att.rows]
    cols = [q for q in range(len(axes)) if q not in rows]
    n_cols = math.prod(extents[q] for q in cols)
    inner = rows[-1]
    out = []
    size = 1
    while size <= extents[inner]:
        block = tuple(extents[q] if q in cols else (size if q == inner else 1)
                      for q in range(len(axes)))
        smem = flash_footprint(size)
        if size * n_cols > FLASH_POINTS_PER_THREAD * FLASH_THREADS or smem > limit:
            break
        prop = propagate(module, s.members, block)
        est = group_estimate(module, s, prop, profile, FLASH_THREADS, smem)
        out.append(TileChoice(Tile(block, tuple(1 for _ in block), (), "weld"), prop, (),
                              smem, est, att))
        size *= 2
    if not out:
        raise NotFusible(f"one row of {n_cols} output columns needs more than "
                         f"{FLASH_POINTS_PER_THREAD} accumulators per thread")
    out.sort(key=lambda c: (c.estimate.time_us, -math.prod(c.tile.block)))
    return out[:top_k]


__all__ = ["MAX_RECOMPUTE", "MAX_VISITS", "TileChoice", "Candidate", "choose", "thread_tile"]
