"""Persistent kernels from a tk-ram program: one per persistent segment, a block per vEU.

`program_module(module)` is the module codegen generates from: each operator's variant (a
runner-up tile of tk-roll, `program.operators[i].variant`) becomes its op's tile.
`compose(module, generated, profile)` then replaces the kernels of every persistent segment
by one `coresident` kernel and orders all kernels as the segments run.

The persistent kernel (docs/ram.md, "The barrier protocol"): block `v` walks vEU `v`'s items
from two tables in global memory (`<entry>_items`: operator, first block, count, with count 0
for a wait; `<entry>_start`: each vEU's first item). A task item calls the operator's
`__device__` body with each of its block indices, the operator's own grid size and the shared
memory base, then a block barrier (the next body reuses shared memory); at the end of the item
thread 0 fences and adds the count to the operator's progress counter:

    __syncthreads(); if (threadIdx.x == 0) { __threadfence(); atomicAdd(&counter[op], n); }

A wait item: thread 0 spins with an acquire load until the counter reaches the operator's task
count, then a block barrier releases the block:

    if (threadIdx.x == 0) while (tk_ld_acquire(&counter[op]) < tasks) tk_spin(); __syncthreads();

The counters are a workspace of one uint32 per operator of the segment, passed after the
tensors (`KernelRecord.counters`) and zeroed by the runtime before every launch. Which body
runs on which block size is the shared rule (tilekit.schedule.block, emitted by
tilekit.codegen.persistent): a body with barriers on exactly the block's threads, one without
on the first of them (`if (threadIdx.x < threads)`). `__launch_bounds__(threads, ceil(vEUs / SMs))` makes ptxas fit the registers that
co-residency needs; `--compile` checks the grid against the ptxas resources again
(`coresident_problems`) and the runtime against the driver's occupancy before launching.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

from tilekit.codegen.kernel import GeneratedKernel, generated
from tilekit.codegen.persistent import Params, call, fits_block
from tilekit.errors import TilekitError
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.payloads import OpTile, is_split
from tilekit.ir.program import TASK, Program, Segment, read_program
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder
from tilekit.tile.expr import BLOCK, Addr, Expr, Load
from tilekit.tile.nodes import Buffer, Continue, Evaluate, Kernel, Switch, Table, While

_HINT = "the program does not match the kernels codegen makes: re-run tk-ram after the stages " \
        "before it"


def program_module(module: Module) -> Module:
    """`module` with each operator's chosen variant as its op's tile (variant 0: as is)."""
    if module.program is None:
        return module
    from tilekit.ir.graph import graph

    program = read_program(module)
    kernels = module.kernels or default_kernels(module.ops)
    tiles: dict[str, dict[str, Any]] = {}
    # A persistent segment runs each operator's blocks as rTasks of one body: a split-K
    # tile (partial sums in scratch, per-tile counters, or a second kernel) runs unsplit
    # there (tk-ram keeps split operators out of persistent segments; a program written
    # otherwise still runs).
    for seg in program.segments:
        if seg.kind == "kernel":
            continue
        for i in seg.operators:
            for name in kernels[i].ops:
                op = module.op(name)
                if is_split(op.tile):
                    tiles[name] = {k: v for k, v in op.tile.items() if k != "split_k"}
    for o, kernel in zip(program.operators, kernels):
        if o.variant == 0:
            continue
        node = graph(module).node(kernel.ops[0])
        a = node.analysis
        rolled = OpTile.read(node.op.tile, a.spatial, a.reduction, f"{node.where}.tile")
        if o.variant > len(rolled.candidates):
            raise TilekitError(f"variant {o.variant} of {o.kernel}: the op has "
                               f"{len(rolled.candidates)} candidates", "program.operators",
                               _HINT)
        tile = rolled.candidates[o.variant - 1].tile
        tiles[node.op.name] = tile.sizes(rolled.spatial, rolled.reduction)
    if not tiles:
        return module
    return replace(module, ops=tuple(replace(op, tile=tiles[op.name]) if op.name in tiles
                                     else op for op in module.ops))


def compose(module: Module, by_group: Mapping[str, list[GeneratedKernel]], profile
            ) -> tuple[list[GeneratedKernel], dict[str, str]]:
    """The kernels in the program's order, persistent segments composed; and for each kernel
    group in a persistent segment, the entry of its program kernel. `by_group` maps each
    kernel group to the kernels generated for it (a control op's: its device loop, or its
    regions' kernels)."""
    program = read_program(module)
    kernels = module.kernels or default_kernels(module.ops)
    out: list[GeneratedKernel] = []
    entry_of: dict[str, str] = {}
    for s, seg in enumerate(program.segments):
        if seg.kind == "kernel":
            out.extend(by_group[kernels[seg.operators[0]].name])
            continue
        members = [_member(program, kernels[i].name, i, by_group, seg, f"program.segments[{s}]")
                   for i in seg.operators]
        kernel = _program_kernel(module, program, s, seg, members, profile)
        out.append(kernel)
        for i in seg.operators:
            entry_of[kernels[i].name] = kernel.entry
    return out, entry_of


def _member(program: Program, group: str, i: int, by_group, seg: Segment, where: str
            ) -> GeneratedKernel:
    made = by_group.get(group, [])
    if len(made) != 1:
        raise TilekitError(f"kernel group {group} became {len(made)} kernels", where, _HINT)
    g = made[0]
    o = program.operators[i]
    grid = g.grid[0] * g.grid[1] * g.grid[2]
    if grid != o.tasks:
        raise TilekitError(f"operator {i} ({group}) plans {o.tasks} rTasks, its kernel has "
                           f"{grid} blocks", where, _HINT)
    why = fits_block(g, seg.threads)
    if why:
        raise TilekitError(f"operator {i} ({group}): {why}", where, _HINT)
    return g


def _program_kernel(module: Module, program: Program, s: int, seg: Segment,
                    members: list[GeneratedKernel], profile) -> GeneratedKernel:
    entry = f"tk_program_{s}"
    local = {op: k for k, op in enumerate(seg.operators)}
    items, start = [], [0]
    for lst in seg.lists:
        for it in lst:
            items += ([local[it.op], it.first, it.count] if it.kind == TASK
                      else [local[it.op], program.operators[it.op].tasks, 0])
        start.append(len(items) // 3)
    params = Params(module.tensors)
    for g in members:
        params.use_body(g)
    counters = Buffer("tk_counters", "global", "uint32", (len(seg.operators),),
                      access="write", comment="progress counters")
    # Blocks each SM must hold for the grid to be co-resident: ptxas fits the registers to it.
    # Without a profile there is no SM count: no bound (the launch-time check still guards).
    per_sm = max(1, -(-seg.veus // profile.sm_count)) if profile is not None else 1
    items_t = Table(f"{entry}_items", tuple(items))
    start_t = Table(f"{entry}_start", tuple(start))
    b = Builder()

    def table(t: Table, at) -> Expr:
        return Load(t.name, (tx.as_expr(at),), "int32")

    with b.loop("i", table(start_t, BLOCK), table(start_t, BLOCK + 1)) as i:
        op = b.let("op", table(items_t, i * 3))
        first = b.let("first", table(items_t, i * 3 + 1))
        count = b.let("count", table(items_t, i * 3 + 2))
        with b.if_(tx.eq(count, 0)):    # a wait: until operator op has finished first rTasks
            with b.threads(seg.threads) as tid:
                with b.if_(tx.eq(tid, 0)):
                    done = tx.call("ld_acquire", Addr(counters.name, (op,)))
                    b.emit(While(tx.lt(done, tx.cast("uint32", first)),
                                 Evaluate(tx.call("spin"))))
            b.barrier()
            b.emit(Continue())
        with b.loop("blk", first, first + count) as blk:
            b.emit(Switch(op, tuple((k, call(g, blk, tx.const(math.prod(g.grid))))
                                    for k, g in enumerate(members))))
            b.barrier()     # the next body reuses shared memory
        with b.threads(seg.threads) as tid:
            with b.if_(tx.eq(tid, 0)):  # release: the block's stores before the count
                b.evaluate(tx.call("threadfence"))
                b.evaluate(tx.call("atomic_add", Addr(counters.name, (op,)),
                                   tx.cast("uint32", count)))
    kernel = Kernel(entry, params.buffers() + (counters,), (), b.build(), seg.threads,
                    seg.veus, per_sm,
                    (f"program segment {s}: {len(members)} operators as rTasks on {seg.veus} "
                     f"vEUs of {seg.threads} threads",
                     f"co-residency at planning: {seg.residency}"),
                    calls=tuple(g.program for g in members), tables=(items_t, start_t),
                    counters=len(seg.operators))
    ops = tuple(op for g in members for op in g.ops)
    schedule = {"segment": s, "veus": seg.veus, "threads": seg.threads,
                "operators": [g.group for g in members], "min_blocks_per_sm": per_sm,
                "residency": seg.residency}
    return generated(kernel, name=f"program_{s}", group=f"program_{s}", ops=ops,
                     shape="program", schedule=schedule, args=tuple(params.order),
                     writes=params.writes(), coresident=True)


def coresident_problems(name: str, threads: int, registers: int, smem: int, grid: int,
                        profile) -> list[str]:
    """A coresident kernel whose grid exceeds what its ptxas resources allow at once."""
    from tilekit.schedule.residency import residency

    if profile is None:
        return []
    r = residency(profile, threads, registers, smem)
    if grid > r.grid:
        return [f"{name} needs {grid} co-resident blocks; its compiled resources allow "
                f"{r.why()}: it could hang; re-run tk-ram"]
    return []


__all__ = ["compose", "coresident_problems", "program_module"]
