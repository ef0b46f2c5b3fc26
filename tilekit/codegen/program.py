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

from dataclasses import replace
from typing import Any, Mapping

from tilekit.codegen.emitter import check_line, comment_text
from tilekit.codegen.kernel import GeneratedKernel
from tilekit.codegen.persistent import (Params, body_call, body_functions, fits_block,
                                        smem_declaration)
from tilekit.errors import TilekitError
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.payloads import OpTile
from tilekit.ir.program import TASK, Program, Segment, read_program
from tilekit.schedule.defaults import STATIC_SMEM_LIMIT

_HINT = "the program does not match the kernels codegen makes: re-run tk-ram after the stages " \
        "before it"
#: Items per line of the generated tables.
_PER_LINE = 8


def program_module(module: Module) -> Module:
    """`module` with each operator's chosen variant as its op's tile (variant 0: as is)."""
    if module.program is None:
        return module
    from tilekit.ir.graph import graph

    program = read_program(module)
    kernels = module.kernels or default_kernels(module.ops)
    tiles: dict[str, dict[str, Any]] = {}
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


def _table(name: str, values: list[int]) -> list[str]:
    lines = [f"__device__ const int {name}[{len(values)}] = {{"]
    for k in range(0, len(values), _PER_LINE):
        lines.append("  " + ", ".join(str(v) for v in values[k:k + _PER_LINE]) + ",")
    lines.append("};")
    return lines


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
    smem = max(g.spec.smem_bytes for g in members)
    # Blocks each SM must hold for the grid to be co-resident: ptxas fits the registers to it.
    # Without a profile there is no SM count: no bound (the launch-time check still guards).
    per_sm = max(1, -(-seg.veus // profile.sm_count)) if profile is not None else 1
    lines = [f"// program segment {s}: {len(members)} operators as rTasks on {seg.veus} vEUs "
             f"of {seg.threads} threads",
             "// " + comment_text(f"co-residency at planning: {seg.residency}")]
    lines.append(body_functions(members, seg.threads).rstrip("\n"))
    lines += _table(f"{entry}_items", items) + _table(f"{entry}_start", start)
    counters = "unsigned* __restrict__ tk_counters"
    lines += [f'extern "C" __global__ void __launch_bounds__({seg.threads}, {per_sm})',
              f"{entry}({', '.join(params.declarations() + [counters])}) {{",
              f"  {smem_declaration(smem)}",

        f"  for (int i = {entry}_start[blockIdx.x]; i < {entry}_start[blockIdx.x + 1]; ++i) {{",
        f"    const int op = {entry}_items[3 * i];",
        f"    const int first = {entry}_items[3 * i + 1];",
        f"    const int count = {entry}_items[3 * i + 2];",
        "    if (count == 0) {  // a wait: until operator op has finished first rTasks",
        "      if (threadIdx.x == 0) {",
        "        while (tk_ld_acquire(&tk_counters[op]) < (unsigned)first) tk_spin();",
        "      }",
        "      __syncthreads();",
        "      continue;",
        "    }",
        "    for (int b = first; b < first + count; ++b) {",
        "      switch (op) {"]
    for k, g in enumerate(members):
        lines.append(f"        case {k}: {body_call(g, 'b', seg.threads)} break;"
                     f"  // {comment_text(g.group)}")
    lines += [
        "      }",
        "      __syncthreads();  // the next body reuses shared memory",
        "    }",
        "    if (threadIdx.x == 0) {  // release: the block's stores before the count",
        "      __threadfence();",
        "      atomicAdd(&tk_counters[op], (unsigned)count);",
        "    }",
        "  }",
        "}"]
    body = "\n".join(lines) + "\n"
    for line in body.splitlines():
        check_line(line)
    ops = tuple(op for g in members for op in g.ops)
    schedule = {"segment": s, "veus": seg.veus, "threads": seg.threads,
                "operators": [g.group for g in members], "min_blocks_per_sm": per_sm,
                "residency": seg.residency}
    return GeneratedKernel(
        name=f"program_{s}", group=f"program_{s}", entry=entry, ops=ops, shape="program",
        schedule=schedule, grid=(seg.veus, 1, 1), block=(seg.threads, 1, 1),
        smem_bytes=smem if smem > STATIC_SMEM_LIMIT else 0, smem_planned=max(smem, 16),
        args=tuple(params.order), writes=params.writes(), body=body,
        uses_half=any(g.uses_half for g in members), coresident=True,
        counters=len(seg.operators))


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
