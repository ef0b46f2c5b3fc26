"""The `fused` kernel shape: a group of several stages sharing one output tile.

The block owns a tile of the last stage's output (`block` per spatial axis: kernel.tile from
tk-weld, or the default below). Walking the stages backwards, each stage's **region** is the
box of its output that later stages read (Welder's backward propagation through the index
maps, halo included, exactly `tilekit.expr.input_box` for affine maps): per dimension an
origin that is linear in the block's tile origin and a fixed length. Regions of one tensor
read by several stages are unioned; a non-affine index takes the whole dimension.

Each stage then runs as a block-level loop over passes of its region (every thread one point
per pass, or one lane group per point for a reduction over a contiguous axis, each pass a
thread region), writes the results that later stages read to shared memory (a buffer per
tensor, the region's size, indexed by the point's position in the region; buffers whose
lives, from their stage to their last reader's, do not overlap share bytes: tk-weld's
allocation) and the results that leave the group to global memory, and ends with a barrier.
Lane groups wider than a warp combine their warps' partial results through shared memory
between two thread regions. Points of a region outside
the tensor are not computed; a read there yields the reader's pad value, as everywhere.

Default tile (no kernel.tile): every outer axis 1 except the next-to-innermost, which grows to
fill `DEFAULT_THREADS` points, and the innermost axis whole; the innermost axis is halved until
the shared buffers fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, avar, c_name,
                                    contiguous_reduction, decompose, finish, full_ranges,
                                    global_read, global_store, group_signature, guarded,
                                    index_type, needs_check)
from tilekit.codegen.plan import GroupPlan, OpPlan, Read
from tilekit.codegen.values import (combine, identity, index_expr, pad_literal, storage,
                                    storage_kind)
from tilekit.expr.box import Span, clamp, map_box, tile_spans, union
from tilekit.ir.payloads import Tile
from tilekit.schedule.shape import Target
from tilekit.schedule.defaults import (DEFAULT_THREADS, KIND_BYTES, WARP, fused_lanes,
                                       shared_bytes)
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import BLOCK, ITEMSIZE, KIND_DTYPE, Expr, Load, Var
from tilekit.tile.functions import WARP_REDUCERS
from tilekit.tile.nodes import Buffer
from tilekit.weld.structure import Buffer as LiveBuffer, allocate, covers


class FusionError(Exception):
    """The group cannot be one fused kernel (the caller splits it, with this reason)."""


def _read_box(r: Read, p: OpPlan, region: list[Span]) -> list[Span]:
    """The box of `r`'s tensor that op `p` reads when its spatial axes cover `region`
    (reduction axes whole; tilekit.expr.box)."""
    spans = {a: s for (a, _), s in zip(p.spatial, region)}
    spans.update({a: Span.whole(n) for a, n in p.reduction})
    return list(map_box(r.maps, spans, r.shape))


@dataclass(frozen=True)
class Regions:
    block: tuple[int, ...]
    spans: tuple[tuple[Span, ...], ...]   # per stage, per spatial position of its main op
    smem: int                              # bytes of all shared buffers, with liveness
    offsets: Mapping[str, int]             # each shared buffer's byte offset


def plan_regions(module, plan: GroupPlan, block: tuple[int, ...]) -> Regions:
    stages = plan.stages
    last = stages[-1]
    spans: list[list[Span] | None] = [None] * len(stages)
    spans[-1] = list(tile_spans(block))
    needs: dict[str, list[Span]] = {}
    stage_of = {t: k for k, s in enumerate(stages) for t in s.outputs}
    for k in range(len(stages) - 1, -1, -1):
        s = stages[k]
        if spans[k] is None:
            shape = s.main.out_shape
            region = None
            for t in s.outputs:
                if t in needs:
                    region = needs[t] if region is None else [
                        union(a, b, d) for a, b, d in zip(region, needs[t], shape)]
            if region is None:
                raise FusionError(f"stage '{s.main.op.name}' computes nothing the group's "
                                  "last op reads")
            spans[k] = [clamp(x, d) for x, d in zip(region, shape)]
        for p in s.ops:
            for r in p.read_list():
                src = stage_of.get(r.tensor)
                if src is None or src >= k:
                    continue
                box = _read_box(r, p, spans[k])
                old = needs.get(r.tensor)
                needs[r.tensor] = box if old is None else [
                    union(a, b, d) for a, b, d in zip(old, box, r.shape)]
    # Buffers live from their stage to their last reader's stage and share bytes otherwise
    # (tk-weld's best-fit allocation: what its footprint counted).
    last_read = {t: stage_of[t] for t in plan.shared}
    for k, s in enumerate(stages):
        for p in s.ops:
            for r in p.read_list():
                if r.tensor in last_read:
                    last_read[r.tensor] = max(last_read[r.tensor], k)
    placed, smem = allocate([
        LiveBuffer(t, shared_bytes(math.prod(x.length for x in spans[stage_of[t]]),
                               storage(module.tensors[t].dtype).kind), stage_of[t],
               last_read[t]) for t in sorted(plan.shared)])
    # Results stored to global memory must be computed everywhere by some block.
    extents = [n for _, n in last.main.spatial]
    for k, s in enumerate(stages[:-1]):
        for t in s.outputs:
            if t in plan.stored and not covers(spans[k], s.main.out_shape, block, extents):
                raise FusionError(f"'{t}' leaves the group but the blocks' regions do not "
                                  "cover it")
    return Regions(tuple(block), tuple(tuple(x) for x in spans), smem,
                   {b.tensor: b.offset for b in placed})


def default_block(module, plan: GroupPlan, limit: int) -> Regions:
    """The default tile (module docstring): the largest that fits `limit` bytes."""
    extents = [n for _, n in plan.stages[-1].main.spatial]
    if not extents:
        return plan_regions(module, plan, ())
    inner = extents[-1]
    while True:
        block = [1] * len(extents)
        block[-1] = inner
        if len(extents) > 1:
            grow = max(1, DEFAULT_THREADS // inner)
            block[-2] = min(extents[-2], 1 << (grow.bit_length() - 1))
        regions = plan_regions(module, plan, tuple(block))
        if regions.smem <= limit:
            return regions
        if len(extents) > 1 and block[-2] > 1:
            # Fewer outer rows first, then a narrower innermost axis.
            regions = plan_regions(module, plan, tuple(block[:-2] + [1, inner]))
            if regions.smem <= limit:
                return regions
        if inner == 1:
            raise FusionError(f"its shared buffers need {regions.smem} bytes even for a "
                              f"1-point tile, more than {limit}")
        inner = -(-inner // 2)


def fused_kernel(module, plan: GroupPlan, entry: str, tile: Tile | None, target: Target
                 ) -> GeneratedKernel:
    limit = target.smem_limit
    last = plan.stages[-1].main
    extents = [n for _, n in last.spatial]
    if tile is not None:
        regions = plan_regions(module, plan, tile.block)
        # Whole warps only: the shuffles use the full mask 0xffffffff, which is undefined on a
        # partial warp. The extra threads take further points (the stage loops guard pt).
        threads = -(-tile.threads // WARP) * WARP
        source = tile.source
    else:
        regions = default_block(module, plan, limit)
        threads = DEFAULT_THREADS
        source = "default"
    lanes = [stage_lanes(s.main, math.prod(x.length for x in regions.spans[k]), threads,
                         target.varies(s.main.op.name, s.main.reduction))
             if target.lanes else 1 for k, s in enumerate(plan.stages)]
    # The cross-warp partials (`_cross_warp`) are shared memory beside the buffers.
    scratch = sum(cross_warp_bytes(threads) for n in lanes if n > WARP)
    smem_total = regions.smem + scratch
    if smem_total > limit:
        raise FusionError(f"its shared buffers need {smem_total} bytes, more than {limit}")
    block = regions.block
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    grid = math.prod(-(-n // s) for n, s in zip(extents, block)) if extents else 1
    stage_of = {t: k for k, s in enumerate(plan.stages) for t in s.outputs}
    axes = [a for a, _ in last.spatial]
    # A stage that contracts (a reduction over a product of tensors: a convolution or a
    # matmul in the chain) loops long per thread; ptxas' own occupancy target then capped a
    # fused conv chain at 32 registers and spilled (ResNet-50's 7x7 stage), so such kernels
    # take the register-tile launch bounds.
    contracts = any(s.main.reduction and len({r.tensor for r in s.main.reads.values()}) > 1
                    for s in plan.stages)
    smem = SharedMemory()
    buffers: dict[str, Buffer] = {}
    for t in sorted(plan.shared):
        k = stage_of[t]
        kind = storage_kind(module.tensors[t].dtype)
        lens = tuple(x.length for x in regions.spans[k])
        buffers[t] = smem.carve(f"s_{c_name(t)}", KIND_DTYPE[kind], lens,
                                f"{t} region {list(lens)}", at=regions.offsets[t])
    b = Builder()
    region_lo = _declare_regions(b, plan, regions, extents, idx_t)

    def resolve(p: OpPlan, node, axis) -> Expr:
        r = p.read(node)
        ranges = full_ranges(p)
        if r.tensor not in buffers:
            return global_read(r, axis, ranges)
        k = stage_of[r.tensor]
        codes = [index_expr(m.node, axis, ranges) for m in r.maps]
        value = Load(buffers[r.tensor].name,
                     tuple(tx.sub(c, lo) for c, lo in zip(codes, region_lo[k])),
                     buffers[r.tensor].dtype)
        checks = [tx.call("in_range", c, tx.as_expr(d, c.dtype)) for c, d, n in
                  zip(codes, r.shape, needs_check(r, ranges)) if n]
        return guarded(checks, value, pad_literal(r.pad, r.dtype))

    for k, s in enumerate(plan.stages):
        _stage(b, smem, module, plan, k, s, regions.spans[k], region_lo[k], threads,
               lanes[k], idx_t, resolve, buffers, is_last=k == len(plan.stages) - 1)
    sched = {"source": source, "block": dict(zip(axes, block)), "threads": threads,
             "lanes": {s.main.op.name: n for s, n in zip(plan.stages, lanes)},
             "regions": {s.main.op.name: [x.length for x in regions.spans[k]]
                         for k, s in enumerate(plan.stages)},
             "shared": sorted(plan.shared)}
    kernel = finish(plan, entry, sig, b.build(), shape="fused", schedule=sched,
                    threads=threads, grid=grid, shared=smem.all(), register_tile=contracts,
                    target=target,
                    comments=[f"fused: {len(plan.stages)} stages over a block tile "
                              + " x ".join(f"{a}:{s}" for a, s in zip(axes, block))
                              + f" (from {source})",
                              f"shared memory: {smem_total} bytes for "
                              f"{', '.join(sorted(plan.shared)) or 'nothing'}"
                              + (f" and {scratch} of cross-warp partials" if scratch else "")])
    assert kernel.smem_planned == smem_total, "the program and the region plan disagree"
    return kernel


def _declare_regions(b: Builder, plan: GroupPlan, regions: Regions, extents: list[int],
                     idx_t: str) -> list[list[Var]]:
    """Declare the block's tile origin and each stage's region origin (linear in it)."""
    block = regions.block
    tiles = decompose(b, tx.cast(idx_t, BLOCK), [-(-n // s) for n, s in zip(extents, block)],
                      ["b_"] * len(extents), idx_t)
    origins = [b.let("o_", tx.mul(t, s), idx_t) for t, s in zip(tiles, block)]
    region_lo: list[list[Var]] = []
    for k in range(len(plan.stages)):
        names = []
        for q, span in enumerate(regions.spans[k]):
            start = tx.linear(((c, origins[p]) for p, c in span.lo.coefs), span.lo.const,
                              idx_t)
            names.append(b.let(f"r{k}_{q}", start, idx_t))
        region_lo.append(names)
    return region_lo


def stage_lanes(p: OpPlan, volume: int, threads: int, varies: bool = False) -> int:
    """Lanes per point of a stage (tilekit.schedule.defaults.fused_lanes, the count tk-weld
    prices; `varies`: its innermost reduction axis's extent moves with a symbol)."""
    return fused_lanes(p.reduction, contiguous_reduction(p), volume, threads, varies)


def cross_warp_bytes(threads: int) -> int:
    """Static shared memory of one `_cross_warp` partials array: a slot per warp, counted at
    8 bytes (the widest accumulator) so that the bound holds for every kind."""
    return shared_bytes(threads // WARP, "d")


def _stage(b: Builder, smem: SharedMemory, module, plan: GroupPlan, k: int, s,
           spans, lo_vars: list[Var], threads: int, lanes: int, idx_t: str, resolve,
           buffers: dict[str, Buffer], is_last: bool) -> None:
    """One stage: a block-level loop over passes of its region's points, each pass a thread
    region (one point per thread, or a lane group per point), then a barrier."""
    p = s.main
    lens = [x.length for x in spans]
    volume = math.prod(lens)
    per_pass = threads // lanes
    names = ", ".join(q.op.name for q in s.ops)
    b.comment(f"stage {k}: {names}; region {lens}"
              + (f", {lanes} lanes per point" if lanes > 1 else ""))
    kind = PointBuilder(module, b, s, [Var(avar(a), idx_t) for a, _ in p.spatial],
                        resolve).acc_kind(p) if p.reduces else None
    red = None
    if lanes > WARP:
        # Counted at 8 bytes a slot (cross_warp_bytes) whatever the kind: one bound for all.
        dtype = KIND_DTYPE[kind]
        red = smem.carve(f"red{k}", dtype, (threads // WARP * 8 // ITEMSIZE[dtype],),
                         "cross-warp partials")
    with b.loop("base_", 0, volume, per_pass) as base:
        partial = b.alloc(f"part{k}_", KIND_DTYPE[kind], (1,)) if red is not None else None
        with b.threads(threads) as tid:
            pt, lane, ok, locs, vars_, pb = _point(b, module, s, spans, lo_vars, lens, volume,
                                                   per_pass, lanes, idx_t, resolve, tid, base)

            def sink(tensor: str, value: Expr, vkind: str) -> None:
                if tensor in buffers:
                    buf = buffers[tensor]
                    b.store(buf, tuple(locs), tx.cast(buf.dtype, value))
                if tensor in plan.stored:
                    global_store(module, b, tensor, vars_, value)

            if p.reduces:
                acc = b.decl("acc_", KIND_DTYPE[kind], identity(p.assign, kind))
                with b.if_(ok):
                    pb.reduction_loops(p, acc, kind, lanes, lane)
                if lanes > 1:
                    b.assign(acc, tx.call(WARP_REDUCERS[p.assign], acc,
                                          tx.const(min(lanes, WARP))))
                if red is not None:
                    with b.if_(tx.eq(tx.mod(tid, WARP), 0)):
                        b.store(red, (tx.div(tid, WARP),), acc)
                    b.store(partial, (tx.const(0),), acc)
                else:
                    with b.if_(tx.and_(ok, tx.eq(lane, 0)) if lanes > 1 else ok):
                        pb.epilogue(pb.main_value(p, (acc, kind)), sink)
            else:
                with b.if_(ok):
                    pb.epilogue(None, sink)
        if red is not None:
            # The warps of each lane group combine through shared memory: warp leaders wrote
            # their partial result, the group's first lane folds them.
            b.barrier()
            with b.threads(threads) as tid:
                pt, lane, ok, locs, vars_, pb = _point(b, module, s, spans, lo_vars, lens,
                                                       volume, per_pass, lanes, idx_t, resolve,
                                                       tid, base)

                def sink2(tensor: str, value: Expr, vkind: str) -> None:
                    if tensor in buffers:
                        buf = buffers[tensor]
                        b.store(buf, tuple(locs), tx.cast(buf.dtype, value))
                    if tensor in plan.stored:
                        global_store(module, b, tensor, vars_, value)

                with b.if_(tx.eq(lane, 0)):
                    acc = b.decl("acc_", KIND_DTYPE[kind], Load(partial.name, (tx.const(0),),
                                                                 partial.dtype))
                    with b.loop("w", 1, lanes // WARP) as w:
                        b.assign(acc, combine(p.assign, acc,
                                              Load(red.name, (tx.div(tid, WARP) + w,),
                                                   red.dtype)))
                    with b.if_(ok):
                        pb.epilogue(pb.main_value(p, (acc, kind)), sink2)
            b.barrier()     # the partials are read before the next pass rewrites them
    if not is_last:
        b.barrier()


def _point(b: Builder, module, s, spans, lo_vars, lens, volume, per_pass, lanes, idx_t,
           resolve, tid, base):
    """This thread's point of the pass at `base`: (pt, lane, in range, its position in the
    region, axis values, its point builder)."""
    p = s.main
    pt = b.let("pt", base + (tx.div(tid, lanes) if lanes > 1 else tid))
    lane = b.let("lane", tx.mod(tid, lanes)) if lanes > 1 else None
    locs = decompose(b, tx.select(tx.lt(pt, volume), pt, tx.const(0)) if lanes > 1 else pt,
                     lens, ["l_"] * len(lens), "int32")
    vars_ = [b.let(avar(a), tx.add(lo, loc), idx_t)
             for (a, _), lo, loc in zip(p.spatial, lo_vars, locs)]
    checks = [tx.lt(pt, volume)] if volume % per_pass else []
    for v, span, (_, n) in zip(vars_, spans, p.spatial):
        if span.lo.coefs or span.lo.const < 0 or span.lo.const + span.length > n:
            checks.append(tx.call("in_range", v, tx.as_expr(n, v.dtype)))
    ok = b.let("ok", tx.and_(*checks))
    return pt, lane, ok, locs, vars_, PointBuilder(module, b, s, vars_, resolve)
