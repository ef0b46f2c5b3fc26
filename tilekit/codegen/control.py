"""CUDA for control ops: a device loop or branch as one persistent cooperative kernel, or the
regions' kernels for the host to drive.

A control op that tk-grind placed on the device (`grind.run: device`) becomes one kernel whose
blocks are all resident (`coresident`: launched cooperatively after the occupancy check):

    extern "C" __global__ void tk_loop_<op>(<every tensor it touches>) {
      TK_STATIC_SMEM(tk_smem, <largest body's shared memory>);
      <carried <- initial values; scan outputs zeroed>          grid-strided over elements
      trips = <trip count, on the device>; go = <condition, on the device>
      tk_grid_sync();
      while (go && it < trips) {
        <iteration number and condition into the body's inputs>; tk_grid_sync();
        for (vb = blockIdx.x; vb < G0; vb += gridDim.x) {
          k0_body(..., vb, G0, tk_smem); __syncthreads(); }
        tk_grid_sync();                                          one barrier after each body
        ...
        <carried <- next values; scan rows <- results>; tk_grid_sync();
        go = <the body's condition>; ++it;
      }
      <outputs <- carried; count <- it>
    }

The body kernels are the region's kernels as generated for any module (tilekit.codegen.
module.generate on `region_module`), composed through their `__device__ <entry>_body`
functions (tilekit.codegen.builder), so a body with more blocks than the persistent grid runs
block-strided. A branch reads its predicate on the device and runs one side the same way.

The grid is tk-grind's (capped by co-residency); `cap_grid` caps it again with ptxas'
registers at compile time, and the runtime checks the driver's occupancy before launching.
A control op stays on the host (its regions' kernels generated as ordinary kernels, the note
says why) when it was placed there, when no grind decision exists, or when a body cannot be
composed: a body with fewer threads than the persistent block that uses `__syncthreads()`
(the extra threads would miss its barriers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from tilekit.codegen.emitter import Emitter, check_line, comment_text
from tilekit.codegen.kernel import GeneratedKernel, c_name
from tilekit.codegen.persistent import (Params, block_threads, body_call, body_functions,
                                        smem_declaration)
from tilekit.errors import TilekitError
from tilekit.ir.control import ControlOp, region_module
from tilekit.ir.graph import control_records
from tilekit.ir.model import Kernel, Module
from tilekit.schedule.defaults import STATIC_SMEM_LIMIT

@dataclass(frozen=True)
class ControlCode:
    """What a control op's kernel group generates: the kernels, its `codegen.control`
    entry and notes."""

    kernels: tuple[GeneratedKernel, ...]
    record: Mapping[str, Any]
    notes: tuple[str, ...]


def control_code(module: Module, kernel: Kernel, generate: Callable, profile, arch: str,
                 where: str) -> ControlCode:
    """The kernels of control op `kernel.ops[0]`; `generate` is tilekit.codegen.module's
    (a region is generated as a module of its own)."""
    name = kernel.ops[0]
    rec = control_records(module)[name]
    results = []
    for rname, r in zip(rec.region_names(), rec.regions):
        try:
            results.append(generate(region_module(module.tensors, r, name), profile, arch))
        except TilekitError as exc:   # located in the region's record, nested ones too
            raise exc.located(f"control.{name}.{rname}") from None
    notes = [n for result in results for n in result.notes]
    run = (rec.grind or {}).get("run", "host")
    if run == "device":
        made = device_kernel(module, kernel, rec, [r.kernels for r in results], profile)
        if isinstance(made, GeneratedKernel):
            return ControlCode((made,), {"run": "device", "entry": made.entry,
                                         "grid": made.grid[0]}, tuple(notes))
        notes.append(f"{where}: {rec.kind} '{name}' runs on the host: {made}")
    elif not rec.grind:
        notes.append(f"{where}: {rec.kind} '{name}' runs on the host (no tk-grind placement)")
    kernels = tuple(g for result in results for g in result.kernels)
    return ControlCode(kernels, {"run": "host", "regions": [
        [g.entry for g in result.kernels] for result in results]}, tuple(notes))


def device_kernel(module: Module, kernel: Kernel, rec: ControlOp,
                  regions: list[tuple[GeneratedKernel, ...]], profile=None
                  ) -> GeneratedKernel | str:
    """The persistent cooperative kernel of a device loop, scan or branch, or why not.

    `__launch_bounds__(threads, ceil(grid / SMs))`: ptxas fits the registers to the blocks
    each SM must hold for the grid to be co-resident (as for tk-ram's programs). The bare
    `__launch_bounds__(threads)` of a tiny block (3 threads) made ptxas spill 8-20 bytes with
    registers to spare (sm_80 and sm_90, loops of a few scalars)."""
    bodies = [g for side in regions for g in side]
    if not bodies:
        return "its regions hold no kernels"
    threads = block_threads(bodies)
    if isinstance(threads, str):
        return threads
    smem = max(g.spec.smem_bytes for g in bodies)
    grid = int(((rec.grind or {}).get("estimate") or {}).get("grid") or 1)
    per_sm = max(1, -(-grid // profile.sm_count)) if profile is not None else 1
    decl = dict(module.tensors)
    for region in rec.regions:
        decl.update(region.tensors)
    tensors = Params(decl)
    kind = "branch" if rec.kind == "if" else "loop"
    entry = f"tk_{kind}_{c_name(rec.name)}"
    e = Emitter()
    with e.block():
        e.line(smem_declaration(smem))
        e.line("const int tk_b = (int)blockIdx.x, tk_nb = (int)gridDim.x;")
        e.line(f"const long long tk_tid = (long long)tk_b * {threads} + threadIdx.x;")
        e.line(f"const long long tk_nthreads = (long long)tk_nb * {threads};")
        if rec.kind == "if":
            _branch(e, rec, regions, tensors, threads)
        else:
            _loop(e, rec, regions, tensors, threads)
    body_text = body_functions(bodies, threads)
    about = (f"{rec.kind} {rec.name} on the device: {len(bodies)} body kernel(s), a persistent "
             f"grid of {grid} block(s) x {threads} threads, grid barriers")
    head = (f"// {comment_text(about)}\n"
            f'extern "C" __global__ void __launch_bounds__({threads}, {per_sm})\n'
            f"{entry}({', '.join(tensors.declarations())})")
    text = body_text + head + " " + e.text().lstrip()
    for line in text.splitlines():
        check_line(line)
    return GeneratedKernel(
        name=kernel.name, group=kernel.name, entry=entry, ops=tuple(kernel.ops),
        shape=f"device_{kind}",
        schedule={"control": rec.name, "bodies": [g.entry for g in bodies], "grid": grid,
                  "smem_bytes": smem},
        grid=(grid, 1, 1), block=(threads, 1, 1),
        smem_bytes=smem if smem > STATIC_SMEM_LIMIT else 0, smem_planned=smem,
        args=tuple(tensors.order), writes=tensors.writes(),
        body=text, uses_half=any(g.uses_half for g in bodies), coresident=True)


def _run_bodies(e: Emitter, side: tuple[GeneratedKernel, ...], tensors: Params,
                threads: int) -> None:
    """Each body kernel over a block-strided loop, a grid barrier after each."""
    for g in side:
        tensors.use_body(g)
        blocks = g.grid[0] * g.grid[1] * g.grid[2]
        with e.block(f"for (int tk_vb = tk_b; tk_vb < {blocks}; tk_vb += tk_nb)"):
            e.line(body_call(g, "tk_vb", threads))
            e.line("__syncthreads();")
        e.line("tk_grid_sync();")


def _copy(e: Emitter, dst: str, src: str, n: int, dst_index: str = "tk_e",
          src_index: str = "tk_e") -> None:
    with e.block(f"for (long long tk_e = tk_tid; tk_e < {n}LL; tk_e += tk_nthreads)"):
        e.line(f"{dst}[{dst_index}] = {src}[{src_index}];")


def _axis_index(shape: tuple[int, ...], axis: int, at: str) -> str:
    """The flat index into a tensor of `shape` of element `tk_e` of its slice at position
    `at` on `axis` (the slice's shape is `shape` without `axis`)."""
    inner = math.prod(shape[axis + 1:])
    return f"(tk_e / {inner}LL * {shape[axis]}LL + ({at})) * {inner}LL + tk_e % {inner}LL"


def _loop(e: Emitter, rec: ControlOp, regions, tensors: Params, threads: int) -> None:
    body, decl = rec.body, tensors.decl
    lead = 2 if rec.kind == "loop" else 0
    out0 = 1 if rec.kind == "loop" else 0
    n = len(rec.carried)
    params = body.inputs[lead:lead + n]
    nexts = body.outputs[out0:out0 + n]
    results = body.outputs[out0 + n:]
    for outer, param in zip(rec.carried, params):
        _copy(e, tensors.use(param, True), tensors.use(outer), decl[outer].size)
    for outer in rec.scans:
        with e.block(f"for (long long tk_e = tk_tid; tk_e < {decl[outer].size}LL; "
                     "tk_e += tk_nthreads)"):
            e.line(f"{tensors.use(outer, True)}[tk_e] = 0;")
    if rec.kind == "scan":
        src = decl[rec.scan_inputs[0]]
        trips = str(src.shape[rec.input_axes[0]])
    else:
        trips = f"(long long){tensors.use(rec.trip_count)}[0]" if rec.trip_count else "LLONG_MAX"
        if rec.max_trips is not None:
            trips = f"({trips} < {rec.max_trips}LL ? {trips} : {rec.max_trips}LL)"
    e.line(f"const long long tk_trips = {trips};")
    e.line(f"bool tk_go = {'(bool)' + tensors.use(rec.cond) + '[0]' if rec.cond else 'true'};")
    e.line("long long tk_it = 0;")
    e.line("tk_grid_sync();")
    with e.block("while (tk_go && tk_it < tk_trips)"):
        if rec.kind == "loop":
            with e.block("if (tk_tid == 0)"):
                e.line(f"{tensors.use(body.inputs[0], True)}[0] = tk_it;")
                e.line(f"{tensors.use(body.inputs[1], True)}[0] = tk_go;")
        for k, outer in enumerate(rec.scan_inputs):
            slot = body.inputs[lead + n + k]
            at = "tk_trips - 1 - tk_it" if rec.input_reverse[k] else "tk_it"
            _copy(e, tensors.use(slot, True), tensors.use(outer), decl[slot].size,
                  src_index=_axis_index(decl[outer].shape, rec.input_axes[k], at))
        e.line("tk_grid_sync();")
        _run_bodies(e, regions[0], tensors, threads)
        for param, nxt in zip(params, nexts):
            _copy(e, tensors.use(param, True), tensors.use(nxt), decl[param].size)
        for j, (outer, res) in enumerate(zip(rec.scans, results)):
            axis = rec.output_axes[j] if rec.kind == "scan" else 0
            at = ("tk_trips - 1 - tk_it" if rec.kind == "scan" and rec.output_reverse[j]
                  else "tk_it")
            _copy(e, tensors.use(outer, True), tensors.use(res), decl[res].size,
                  dst_index=_axis_index(decl[outer].shape, axis, at))
        e.line("tk_grid_sync();")
        if rec.kind == "loop" and rec.cond:
            e.line(f"tk_go = (bool){tensors.use(body.outputs[0])}[0];")
        e.line("++tk_it;")
    for outer, param in zip(rec.outputs, params):
        _copy(e, tensors.use(outer, True), tensors.use(param), decl[outer].size)
    if rec.count:
        with e.block("if (tk_tid == 0)"):
            e.line(f"{tensors.use(rec.count, True)}[0] = tk_it;")


def _branch(e: Emitter, rec: ControlOp, regions, tensors: Params, threads: int) -> None:
    e.line(f"const bool tk_p = (bool){tensors.use(rec.cond)}[0];")
    for which, (head, region) in enumerate(zip(("if (tk_p)", "else"), rec.regions)):
        with e.block(head):
            _run_bodies(e, regions[which], tensors, threads)
            for outer, res in zip(rec.outputs, region.outputs):
                _copy(e, tensors.use(outer, True), tensors.use(res), tensors.decl[outer].size)


def cap_grid(record, profile, registers: int) -> tuple[Any, str | None]:
    """A device loop's kernel record with its grid capped by co-residency from ptxas'
    `registers` (block-strided bodies run on any grid); a problem when no block fits."""
    from tilekit.schedule.residency import residency

    res = residency(profile, record.threads, registers,
                    int(record.schedule.get("smem_bytes", record.smem_bytes)))
    if res.grid < 1:
        return record, (f"{record.name} ({record.entry}) cannot run co-resident: "
                        f"{res.why()}")
    if record.grid[0] <= res.grid:
        return record, None
    schedule = {**record.schedule, "grid": res.grid, "grid_capped": res.why()}
    return replace(record, grid=(res.grid, 1, 1), schedule=schedule), None


def check_entries_unique(kernels) -> None:
    seen: dict[str, str] = {}
    for g in kernels:
        if g.entry in seen:
            raise TilekitError(f"two kernels are named {g.entry} ({seen[g.entry]}, {g.name})",
                               "codegen", "rename one of the ops")
        seen[g.entry] = g.name
