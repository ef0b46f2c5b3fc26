"""The `fused` kernel shape: a group of several stages sharing one output tile.

The block owns a tile of the last stage's output (`block` per spatial axis: kernel.tile from
tk-weld, or the default below). Walking the stages backwards, each stage's **region** is the
box of its output that later stages read (Welder's backward propagation through the index
maps, halo included, exactly `tilekit.expr.input_box` for affine maps): per dimension an
origin that is linear in the block's tile origin and a fixed length. Regions of one tensor
read by several stages are unioned; a non-affine index takes the whole dimension.

Each stage then runs as one block-wide loop over its region (every thread one point, or one
lane group per point for a reduction over a contiguous axis), writes the results that later
stages read to shared memory (a buffer per tensor, the region's size; buffers whose lives,
from their stage to their last reader's, do not overlap share bytes: tk-weld's allocation)
and the results that leave the group to global memory, and ends with `__syncthreads()`. Points of a region outside
the tensor are not computed; a read there yields the reader's pad value, as everywhere.

Default tile (no kernel.tile): every outer axis 1 except the next-to-innermost, which grows to
fill `DEFAULT_THREADS` points, and the innermost axis whole; the innermost axis is halved until
the shared buffers fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from tilekit.codegen.cexpr import (IDENTITY, KIND_CTYPE, WARP_REDUCE, combine, index_code,
                                   linear, pad_literal, storage)
from tilekit.codegen.builder import BLOCK, KernelBuilder
from tilekit.codegen.emitter import Emitter
from tilekit.codegen.kernel import (GeneratedKernel, PointEmitter, avar, c_name,
                                    contiguous_reduction, decompose, finish, full_ranges,
                                    global_read, global_store, group_signature, index_type,
                                    needs_check, new_kernel, strides)
from tilekit.codegen.plan import GroupPlan, OpPlan, Read
from tilekit.expr.box import Span, clamp, map_box, tile_spans, union
from tilekit.ir.payloads import Tile
from tilekit.weld.structure import Buffer, allocate, covers
from tilekit.schedule.defaults import (DEFAULT_THREADS, KIND_BYTES, WARP, lane_count,
                                       shared_bytes)


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
        Buffer(t, shared_bytes(math.prod(x.length for x in spans[stage_of[t]]),
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


def fused_kernel(module, plan: GroupPlan, entry: str, tile: Tile | None, limit: int
                 ) -> GeneratedKernel:
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
    lanes = [stage_lanes(s.main, math.prod(x.length for x in regions.spans[k]), threads)
             for k, s in enumerate(plan.stages)]
    # The cross-warp partials (`_cross_warp`) are static shared memory beside the buffers.
    scratch = sum(cross_warp_bytes(threads) for n in lanes if n > WARP)
    smem = regions.smem + scratch
    if smem > limit:
        raise FusionError(f"its shared buffers need {smem} bytes, more than {limit}")
    block = regions.block
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    grid = math.prod(-(-n // b) for n, b in zip(extents, block)) if extents else 1
    stage_of = {t: k for k, s in enumerate(plan.stages) for t in s.outputs}
    axes = [a for a, _ in last.spatial]
    # A stage that contracts (a reduction over a product of tensors: a convolution or a
    # matmul in the chain) loops long per thread; ptxas' own occupancy target then capped a
    # fused conv chain at 32 registers and spilled (ResNet-50's 7x7 stage), so such kernels
    # take the register-tile launch bounds.
    contracts = any(s.main.reduction and len({r.tensor for r in s.main.reads.values()}) > 1
                    for s in plan.stages)
    kb = new_kernel(entry, sig, threads,
                    [f"fused: {len(plan.stages)} stages over a block tile "
                     + " x ".join(f"{a}:{b}" for a, b in zip(axes, block)) + f" (from {source})",
                     f"shared memory: {smem} bytes for "
                     f"{', '.join(sorted(plan.shared)) or 'nothing'}"
                     + (f" and {scratch} of cross-warp partials" if scratch else "")],
                    register_tile=contracts)
    e = kb.body
    buffers: dict[str, str] = {}
    for t in sorted(plan.shared):
        k = stage_of[t]
        kind = storage(module.tensors[t].dtype).kind
        lens = [x.length for x in regions.spans[k]]
        buffers[t] = kb.shared(f"s_{c_name(t)}", KIND_CTYPE[kind], math.prod(lens),
                               KIND_BYTES[kind], f"{t} region {lens}", at=regions.offsets[t])
    e.line("const int tid = threadIdx.x;")
    region_lo, bases = _declare_regions(e, plan, regions, extents, idx_t, stage_of)

    def resolve(p: OpPlan, node, axis_code) -> str:
        r = p.read(node)
        ranges = full_ranges(p)
        if r.tensor not in buffers:
            return global_read(r, axis_code, ranges)
        k = stage_of[r.tensor]
        lens = tuple(x.length for x in regions.spans[k])
        codes = [index_code(m.node, axis_code, ranges) for m in r.maps]
        offset = linear(zip(strides(lens), [f"({c})" if " " in c else c for c in codes]))
        value = f"{buffers[r.tensor]}[{offset} - {bases[r.tensor]}]"
        checks = [f"tk_in({c}, {d})" for c, d, n in
                  zip(codes, r.shape, needs_check(r, ranges)) if n]
        if not checks:
            return value
        return f"({' && '.join(checks)} ? {value} : {pad_literal(r.pad, r.dtype)})"

    for k, s in enumerate(plan.stages):
        _emit_stage(kb, e, module, plan, k, s, regions.spans[k], region_lo[k], threads,
                    lanes[k], idx_t, resolve, buffers, is_last=k == len(plan.stages) - 1)
    sched = {"source": source, "block": dict(zip(axes, block)), "threads": threads,
             "lanes": {s.main.op.name: n for s, n in zip(plan.stages, lanes)},
             "regions": {s.main.op.name: [x.length for x in regions.spans[k]]
                         for k, s in enumerate(plan.stages)},
             "shared": sorted(plan.shared)}
    kernel = finish(kb, plan, "fused", sched, grid, sig)
    assert kernel.smem_planned == smem, "the builder and the region plan disagree"
    return kernel


def _declare_regions(e: Emitter, plan: GroupPlan, regions: Regions, extents: list[int],
                     idx_t: str, stage_of: dict[str, int]
                     ) -> tuple[list[list[str]], dict[str, str]]:
    """Declare the block's tile origin, each stage's region origin (linear in it) and each
    shared buffer's base offset in element units; returns (region origins, buffer bases)."""
    block = regions.block
    origins = [e.tmp("o") for _ in extents]
    tiles = [e.tmp("b") for _ in extents]
    decompose(e, f"({idx_t}){BLOCK}", [-(-n // b) for n, b in zip(extents, block)], tiles,
              idx_t)
    for o, t, b in zip(origins, tiles, block):
        e.line(f"const {idx_t} {o} = {t} * {b};")
    region_lo: list[list[str]] = []
    for k in range(len(plan.stages)):
        names = []
        for q, span in enumerate(regions.spans[k]):
            name = f"r{k}_{q}"
            start = linear(((c, origins[p]) for p, c in span.lo.coefs), span.lo.const)
            e.line(f"const {idx_t} {name} = {start};")
            names.append(name)
        region_lo.append(names)
    bases: dict[str, str] = {}
    for t in sorted(plan.shared):
        k = stage_of[t]
        lens = [x.length for x in regions.spans[k]]
        name = f"sb_{c_name(t)}"
        e.line(f"const {idx_t} {name} = {linear(zip(strides(tuple(lens)), region_lo[k]))};")
        bases[t] = name
    return region_lo, bases


def stage_lanes(p: OpPlan, volume: int, threads: int) -> int:
    """Lanes per point of a stage: a warp's worth for a contiguous reduction (lane_count),
    more (up to the whole block) when the region has fewer points than warps, so that a
    block reducing one long row keeps every warp busy."""
    lanes = lane_count(p.reduction, contiguous_reduction(p))
    if lanes < WARP:
        return min(lanes, threads)
    extent = p.reduction[-1][1]
    points = 1 << max(0, (volume - 1).bit_length())          # next power of two
    wide = max(WARP, threads // points)
    # A lane group must divide the block (threads & -threads: its largest power-of-two
    # divisor, a multiple of WARP): a thread past the last whole group would take part in a
    # point that belongs to the next pass.
    wide = min(wide, threads & -threads, 1 << (extent.bit_length() - 1))
    return max(lanes, 1 << (wide.bit_length() - 1))


def cross_warp_bytes(threads: int) -> int:
    """Static shared memory of one `_cross_warp` partials array: a slot per warp, counted at
    8 bytes (the widest accumulator) so that the bound holds for every kind."""
    return shared_bytes(threads // WARP, "d")


def _cross_warp(kb: KernelBuilder, e: Emitter, assign: str, acc: str, kind: str, lanes: int,
                threads: int) -> None:
    """Combine the warps of each lane group through shared memory: warp leaders write their
    partial result, the group's first lane folds them. Two barriers, block-uniform."""
    warps = lanes // WARP
    # Counted at 8 bytes a slot (cross_warp_bytes) whatever the kind: one bound for all.
    red = kb.shared(e.tmp("red"), KIND_CTYPE[kind], threads // WARP, KIND_BYTES["d"],
                    "cross-warp partials")
    e.line(f"if (tid % {WARP} == 0) {red}[tid / {WARP}] = {acc};")
    e.line("__syncthreads();")
    with e.block("if (lane == 0)"):
        with e.block(f"for (int w = 1; w < {warps}; ++w)"):
            e.line(combine(assign, acc, f"{red}[tid / {WARP} + w]"))
    e.line("__syncthreads();  // the partials are read before the next pass rewrites them")


def _emit_stage(kb: KernelBuilder, e: Emitter, module, plan: GroupPlan, k: int, s, spans, lo_vars: list[str],
                threads: int, lanes: int, idx_t: str, resolve, buffers: dict[str, str],
                is_last: bool) -> None:
    p = s.main
    lens = [x.length for x in spans]
    volume = math.prod(lens)
    per_pass = threads // lanes
    names = ", ".join(q.op.name for q in s.ops)
    e.comment(f"stage {k}: {names}; region {lens}"
              + (f", {lanes} lanes per point" if lanes > 1 else ""))
    vars_ = [avar(a) for a, _ in p.spatial]
    with e.block():
        head = f"for (int base = 0; base < {volume}; base += {per_pass})"
        with e.block(head):
            e.line(f"const int pt = base + tid{f' / {lanes}' if lanes > 1 else ''};")
            if lanes > 1:
                e.line(f"const int lane = tid % {lanes};")
            locs = [e.tmp("l") for _ in spans]
            decompose(e, f"(pt < {volume} ? pt : 0)" if lanes > 1 else "pt", lens, locs, "int")
            for v, lo, loc in zip(vars_, lo_vars, locs):
                e.line(f"const {idx_t} {v} = {lo} + {loc};")
            checks = [f"pt < {volume}"] if volume % per_pass else []
            for v, span, (_, n) in zip(vars_, spans, p.spatial):
                if span.lo.coefs or span.lo.const < 0 or span.lo.const + span.length > n:
                    checks.append(f"tk_in({v}, {n})")
            ok = " && ".join(checks) or "true"
            e.line(f"const bool ok = {ok};")
            pe = PointEmitter(module, e, s, vars_, resolve)

            def sink(tensor: str, value: str, kind: str) -> None:
                if tensor in buffers:
                    e.line(f"{buffers[tensor]}[pt] = {value};")
                if tensor in plan.stored:
                    e.line(global_store(module, tensor, vars_, value, kind))

            if p.reduces:
                kind = pe.acc_kind(p)
                acc = e.tmp("acc")
                e.line(f"{KIND_CTYPE[kind]} {acc} = {IDENTITY[p.assign][kind]};")
                with e.block("if (ok)"):
                    pe.emit_reduction_loops(p, acc, kind, lanes)
                if lanes > 1:
                    e.line(f"{acc} = {WARP_REDUCE[p.assign]}<{min(lanes, WARP)}>({acc});")
                if lanes > WARP:
                    _cross_warp(kb, e, p.assign, acc, kind, lanes, threads)
                with e.block("if (ok && lane == 0)" if lanes > 1 else "if (ok)"):
                    pe.epilogue(pe.main_value(p, (acc, kind)), sink)
            else:
                with e.block("if (ok)"):
                    pe.epilogue(None, sink)
    if not is_last:
        e.line("__syncthreads();")
