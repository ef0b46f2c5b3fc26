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

The kernel is a tile program that composes the region's kernels, as generated for any
module (tilekit.codegen.module.generate on `region_module`), through `CallBody`, so a body
with more blocks than the persistent grid runs block-strided. A branch reads its predicate on the device and runs one side the same way.

The grid is tk-grind's (capped by co-residency); `cap_grid` caps it again with ptxas'
registers at compile time, and the runtime checks the driver's occupancy before launching.

For the CPU target (a loop tk-grind placed on a CPU profile, or on a GPU's and compiled for
the CPU) the same kernel is printed by the C++ printer with its blocks the threads of one
OpenMP team and `tk_grid_sync` the team's barrier (tilekit.tile.cpp): the body kernels run
as the program entry runs a sequence (`_Device._run_bodies_cpu`: one-block kernels on the
first thread, barriers only where a kernel depends on one since the last), the copies are
each thread's run of elements, and a loop whose every body kernel is one thread's work is a
kernel of the first thread with no barrier (`alone`). A nested loop or branch placed inside
compiled code is one of its parent's bodies (the team runs it).

A control op stays on the host (its regions' kernels generated as ordinary kernels, the note
says why) when it was placed there, when no grind decision exists, or when a body cannot be
composed: a body with fewer threads than the persistent block that uses `__syncthreads()`
(the extra threads would miss its barriers).
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from tilekit.codegen.cpu_program import barriers, on_first_thread
from tilekit.codegen.kernel import GeneratedKernel, c_name, generated
from tilekit.codegen.persistent import Params, block_threads, call
from tilekit.errors import TilekitError
from tilekit.ir.control import ControlOp, read_control, region_module
from tilekit.ir.graph import control_records
from tilekit.ir.model import Kernel as KernelGroup, Module
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder
from tilekit.tile.expr import BLOCK, NBLOCKS, Expr, Load
from tilekit.tile.nodes import Kernel, While

@dataclass(frozen=True)
class ControlCode:
    """What a control op's kernel group generates: the kernels, its `codegen.control`
    entry and notes."""

    kernels: tuple[GeneratedKernel, ...]
    record: Mapping[str, Any]
    notes: tuple[str, ...]


def control_code(module: Module, kernel: KernelGroup, generate: Callable, profile, arch: str,
                 where: str, target: str = "cuda") -> ControlCode:
    """The kernels of control op `kernel.ops[0]`; `generate` is tilekit.codegen.module's
    (a region is generated as a module of its own)."""
    name = kernel.ops[0]
    rec = control_records(module)[name]
    results = []
    for rname, r in zip(rec.region_names(), rec.regions):
        try:
            results.append(generate(region_module(module.tensors, r, name), profile, arch,
                                    target))
        except TilekitError as exc:   # located in the region's record, nested ones too
            raise exc.located(f"control.{name}.{rname}") from None
    notes = [n for result in results for n in result.notes]
    run = (rec.grind or {}).get("run", "host")
    if run == "device":
        made = _nested_host_op(results, target) or device_kernel(
            module, kernel, rec, [r.kernels for r in results], profile, target)
        if isinstance(made, GeneratedKernel):
            return ControlCode((made,), {"run": "device", "entry": made.entry,
                                         "grid": made.grid[0]}, tuple(notes))
        notes.append(f"{where}: {rec.kind} '{name}' runs on the host: {made}")
    elif not rec.grind:
        notes.append(f"{where}: {rec.kind} '{name}' runs on the host (no tk-grind placement)")
    kernels = tuple(g for result in results for g in result.kernels)
    return ControlCode(kernels, {"run": "host", "regions": [
        [g.entry for g in result.kernels] for result in results]}, tuple(notes))


def _nested_host_op(results, target: str) -> str | None:
    """Why a control op's regions cannot be one kernel's bodies because of a control op
    nested in them, or None: inside a CPU library a nested op must itself be a kernel of the
    team (placed on the device); a GPU's device loop holds none (tk-grind places such a parent
    on the host; an IR that says otherwise is refused here, not composed wrong)."""
    for result in results:
        for name, entry in ((result.module.codegen or {}).get("control") or {}).items():
            if target != "cpu":
                return f"its body holds control op '{name}' (a device loop holds none)"
            if entry.get("run") != "device":
                return f"its body holds control op '{name}', which runs on the host"
    return None


def device_kernel(module: Module, kernel: KernelGroup, rec: ControlOp,
                  regions: list[tuple[GeneratedKernel, ...]], profile=None,
                  target: str = "cuda") -> GeneratedKernel | str:
    """The persistent cooperative kernel of a device loop, scan or branch, or why not.

    `__launch_bounds__(threads, ceil(grid / SMs))`: ptxas fits the registers to the blocks
    each SM must hold for the grid to be co-resident (as for tk-ram's programs). The bare
    `__launch_bounds__(threads)` of a tiny block (3 threads) made ptxas spill 8-20 bytes with
    registers to spare (sm_80 and sm_90, loops of a few scalars)."""
    bodies = [g for side in regions for g in side]
    if not bodies:
        return "its regions hold no kernels"
    if any(g.program.tensor_maps for g in bodies):
        return ("a region kernel is a wgmma kernel (TMA descriptors as kernel parameters, warp "
                "roles), which does not compose into a persistent kernel")
    if any(g.counters or g.scratch for g in bodies):
        return ("a region kernel is split-K (partial sums in scratch, per-tile counters), "
                "which does not compose into a persistent kernel")
    threads = block_threads(bodies)
    if isinstance(threads, str):
        return threads
    grid = ((rec.grind or {}).get("estimate") or {}).get("grid") or 1   # checked on reading
    if target == "cpu":
        grid = 1    # recorded; its blocks are the team's threads at run time (cpp.py)
    per_sm = max(1, -(-grid // profile.sm_count)) if profile is not None else 1
    tensors = Params(_tensors_within(module.tensors, rec))
    kind = "branch" if rec.kind == "if" else "loop"
    entry = f"tk_{kind}_{c_name(rec.name)}"
    cpu = target == "cpu"
    # on a CPU, a loop whose every body kernel is one thread's work runs on one thread
    alone = cpu and all(on_first_thread(g) for g in bodies)
    d = _Device(Builder(), tensors, threads, cpu, alone)
    if rec.kind == "if":
        _branch(d, rec, regions)
    else:
        _loop(d, rec, regions)
    if not cpu:
        about = (f"{rec.kind} {rec.name} on the device: {len(bodies)} body kernel(s), a "
                 f"persistent grid of {grid} block(s) x {threads} threads, grid barriers")
    elif alone:
        about = (f"{rec.kind} {rec.name} inside the library: {len(bodies)} body kernel(s), "
                 "each one thread's work: on the team's first thread, no barriers")
    else:
        about = (f"{rec.kind} {rec.name} inside the library: {len(bodies)} body kernel(s), "
                 "its blocks the team's threads, the team's barriers")
    callees = _callees(g.program for g in bodies)
    program = Kernel(entry, tensors.buffers(), (), d.b.build(), threads, grid, per_sm, (about,),
                     calls=callees, grid_sync=not alone)
    smem = program.smem_bytes
    schedule = {"control": rec.name, "bodies": [g.entry for g in bodies], "grid": grid,
                "smem_bytes": max(smem, 16)}
    if alone:
        schedule["one_thread"] = True
    return generated(program, name=kernel.name, group=kernel.name, ops=tuple(kernel.ops),
                     shape=f"device_{kind}", schedule=schedule, args=tuple(tensors.order),
                     writes=tensors.writes(), coresident=not alone, target=target)


def _callees(programs) -> tuple[Kernel, ...]:
    """The body functions a kernel calling `programs` needs, each once, a callee before its
    caller (a nested loop's kernel calls its own bodies)."""
    out: dict[str, Kernel] = {}

    def visit(k: Kernel) -> None:
        for inner in k.calls:
            visit(inner)
        out.setdefault(k.name, k)
    for k in programs:
        visit(k)
    return tuple(out.values())


def _tensors_within(scope: Mapping, rec: ControlOp) -> dict:
    """The tensors `rec`'s kernel may touch: its scope's and its regions', nested control
    ops' regions included (a nested loop placed inside compiled code is one of its bodies)."""
    decl = dict(scope)
    for region in rec.regions:
        decl.update(region.tensors)
        for inner in read_control(region.control).values():
            decl.update(_tensors_within({}, inner))
    return decl


class _Device:
    """What the pieces of one device kernel share: its builder, tensors and block size, and
    whether it is printed for a CPU (`cpu`: its blocks are the threads of one team) and runs
    on one thread there (`alone`: no barriers)."""

    def __init__(self, b: Builder, tensors: Params, threads: int, cpu: bool = False,
                 alone: bool = False) -> None:
        self.b, self.tensors, self.threads, self.cpu = b, tensors, threads, cpu
        self.alone = alone

    def inner(self, b: Builder) -> "_Device":
        """The same kernel's pieces built by `b` (a loop's body)."""
        return _Device(b, self.tensors, self.threads, self.cpu, self.alone)

    def sync(self) -> None:
        """A grid barrier (none where the kernel runs on one thread)."""
        if not self.alone:
            self.b.evaluate(tx.call("grid_sync"))

    def load(self, tensor: str, at: Expr) -> Load:
        return Load(self.tensors.use(tensor), (at,), self.tensors.decl[tensor].dtype)

    def copy(self, dst: str, src: str, n: int, dst_index=None, src_index=None) -> None:
        """dst[dst_index(e)] = src[src_index(e)] for e < n, over every thread of the grid (on
        a CPU each thread of the team its run of `e`, `_share`, a vector loop)."""
        b = self.b
        if self.cpu:
            lo, hi = self._share(n, "int64")
            with b.loop("tk_e", lo, hi, kind="simd", dtype="int64") as e:
                value = self.load(src, src_index(e) if src_index else e)
                b.store(self.tensors.use(dst, True), (dst_index(e) if dst_index else e,),
                        tx.cast(self.tensors.decl[dst].dtype, value))
            return
        with b.threads(self.threads) as tid:
            first = b.let("tk_g", tx.cast("int64", BLOCK) * self.threads + tid, "int64")
            with b.loop("tk_e", first, tx.const(n, "int64"),
                        tx.cast("int64", NBLOCKS) * self.threads, dtype="int64") as e:
                value = self.load(src, src_index(e) if src_index else e)
                b.store(self.tensors.use(dst, True), (dst_index(e) if dst_index else e,),
                        tx.cast(self.tensors.decl[dst].dtype, value))

    def first_thread(self):
        """A thread region whose body runs on thread 0 of block 0 only."""
        return _FirstThread(self)

    def run_bodies(self, side: tuple[GeneratedKernel, ...]) -> None:
        """Each body kernel over a block-strided loop, a grid barrier after each (on a CPU,
        `_run_bodies_cpu`)."""
        b = self.b
        if self.cpu:
            self._run_bodies_cpu(side)
            return
        for g in side:
            self.tensors.use_body(g)
            blocks = math.prod(g.grid)
            with b.loop("tk_vb", BLOCK, blocks, NBLOCKS) as vb:
                b.emit(call(g, vb, tx.const(blocks)))
                b.barrier()
            self.sync()

    def _run_bodies_cpu(self, side: tuple[GeneratedKernel, ...]) -> None:
        """The body kernels as the CPU program runs a sequence (tilekit.codegen.cpu_program):
        a kernel the team's first thread runs whole (one block, or `one_thread`) on thread 0,
        the others' blocks shared out in runs (`_share`), and a team barrier only where a kernel
        depends on one since the last barrier, and after the last (the rule of `barriers`:
        a chain of first-thread kernels, such as an LSTM cell's elementwise steps, runs
        without one)."""
        b = self.b
        wait = barriers(side, range(len(side)))
        for g, sync in zip(side, wait):
            self.tensors.use_body(g)
            blocks = math.prod(g.grid)
            if g.coresident:    # a nested loop or branch: the team's kernel too
                b.emit(call(g, BLOCK, NBLOCKS))
            elif on_first_thread(g):
                with b.if_(tx.eq(BLOCK, 0)):
                    with b.loop("tk_vb", 0, blocks) as vb:
                        b.emit(call(g, vb, tx.const(blocks)))
            else:       # each thread a run of the blocks, as tk_run shares them (tk_share)
                lo, hi = self._share(blocks)
                with b.loop("tk_vb", lo, hi) as vb:
                    b.emit(call(g, vb, tx.const(blocks)))
            if sync:
                self.sync()

    def _share(self, count: int, dtype: str = "int32") -> tuple[Expr, Expr]:
        """This thread's run of `count` items (a kernel's blocks, a copy's elements), as
        OpenMP's static schedule (and tk_run's `tk_share`) gives it: the first
        `count % threads` threads one more."""
        b = self.b

        def typed(e: Expr) -> Expr:
            return e if dtype == "int32" else tx.cast(dtype, e)
        n, me, team = tx.const(count, dtype), typed(BLOCK), typed(NBLOCKS)
        q = b.let("tk_q_", tx.div(n, team), dtype)
        r = b.let("tk_r_", tx.mod(n, team), dtype)
        lo = b.let("tk_lo_", me * q + tx.call("min", me, r), dtype)
        hi = b.let("tk_hi_", lo + q + tx.select(tx.lt(me, r), tx.const(1, dtype),
                                                tx.const(0, dtype)), dtype)
        return lo, hi


class _FirstThread:
    def __init__(self, d: _Device) -> None:
        self.d = d
        self.stack = ExitStack()

    def __enter__(self):
        b = self.d.b
        tid = self.stack.enter_context(b.threads(self.d.threads))
        self.stack.enter_context(b.if_(tx.and_(tx.eq(BLOCK, 0), tx.eq(tid, 0))))
        return tid

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


def _axis_index(shape: tuple[int, ...], axis: int, at: Expr):
    """The flat index into a tensor of `shape` of element `e` of its slice at position `at`
    on `axis` (the slice's shape is `shape` without `axis`)."""
    inner = math.prod(shape[axis + 1:])
    return lambda e: (tx.div(e, inner) * shape[axis] + at) * inner + tx.mod(e, inner)


def _loop(d: _Device, rec: ControlOp, regions) -> None:
    b, tensors = d.b, d.tensors
    body, decl = rec.body, tensors.decl
    lead = 2 if rec.kind == "loop" else 0
    out0 = 1 if rec.kind == "loop" else 0
    n = len(rec.carried)
    params = body.inputs[lead:lead + n]
    nexts = body.outputs[out0:out0 + n]
    results = body.outputs[out0 + n:]
    for outer, param in zip(rec.carried, params):
        d.copy(param, outer, decl[outer].size)
    for outer in rec.scans:
        with b.threads(d.threads) as tid:
            first = b.let("tk_g", tx.cast("int64", BLOCK) * d.threads + tid, "int64")
            with b.loop("tk_e", first, tx.const(decl[outer].size, "int64"),
                        tx.cast("int64", NBLOCKS) * d.threads, dtype="int64") as e:
                b.store(tensors.use(outer, True), (e,), tx.cast(decl[outer].dtype, tx.const(0)))
    if rec.kind == "scan":
        src = decl[rec.scan_inputs[0]]
        trips: Expr = tx.const(src.shape[rec.input_axes[0]], "int64")
    else:
        trips = tx.cast("int64", d.load(rec.trip_count, tx.const(0))) if rec.trip_count \
            else tx.const(2 ** 63 - 1, "int64")
        if rec.max_trips is not None:
            cap = tx.const(rec.max_trips, "int64")
            trips = tx.select(tx.lt(trips, cap), trips, cap)
    tk_trips = b.let("tk_trips", trips, "int64")
    go = b.decl("tk_go", "bool", tx.ne(d.load(rec.cond, tx.const(0)), 0) if rec.cond
                else tx.const(True))
    it = b.decl("tk_it", "int64", tx.const(0, "int64"))
    d.sync()
    loop_body = Builder(b.names)
    d_inner = d.inner(loop_body)
    if rec.kind == "loop":
        with d_inner.first_thread():
            loop_body.store(tensors.use(body.inputs[0], True), (tx.const(0),),
                            tx.cast(decl[body.inputs[0]].dtype, it))
            loop_body.store(tensors.use(body.inputs[1], True), (tx.const(0),),
                            tx.cast(decl[body.inputs[1]].dtype, go))
    for k, outer in enumerate(rec.scan_inputs):
        slot = body.inputs[lead + n + k]
        at = tk_trips - 1 - it if rec.input_reverse[k] else it
        d_inner.copy(slot, outer, decl[slot].size,
                     src_index=_axis_index(decl[outer].shape, rec.input_axes[k], at))
    d_inner.sync()
    d_inner.run_bodies(regions[0])
    for param, nxt in zip(params, nexts):
        d_inner.copy(param, nxt, decl[param].size)
    for j, (outer, res) in enumerate(zip(rec.scans, results)):
        axis = rec.output_axes[j] if rec.kind == "scan" else 0
        at = tk_trips - 1 - it if rec.kind == "scan" and rec.output_reverse[j] else it
        d_inner.copy(outer, res, decl[res].size,
                     dst_index=_axis_index(decl[outer].shape, axis, at))
    d_inner.sync()
    if rec.kind == "loop" and rec.cond:
        loop_body.assign(go, tx.ne(d_inner.load(body.outputs[0], tx.const(0)), 0))
    loop_body.assign(it, it + 1)
    b.emit(While(tx.and_(go, tx.lt(it, tk_trips)), loop_body.build()))
    for outer, param in zip(rec.outputs, params):
        d.copy(outer, param, decl[outer].size)
    if rec.count:
        ran: Expr = it
        if rec.kind == "loop" and rec.max_trips is not None:
            # stopped by max_trips where it would have gone on: one more than the maximum,
            # which the runtime reports as the reference does (tilekit.runtime.control
            # check_overruns)
            more = go if not rec.trip_count else tx.and_(go, tx.lt(
                tx.const(rec.max_trips, "int64"),
                tx.cast("int64", d.load(rec.trip_count, tx.const(0)))))
            ran = tx.select(more, it + 1, it)
        with d.first_thread():
            b.store(tensors.use(rec.count, True), (tx.const(0),),
                    tx.cast(decl[rec.count].dtype, ran))


def _branch(d: _Device, rec: ControlOp, regions) -> None:
    b, tensors = d.b, d.tensors
    p = b.let("tk_p", tx.ne(d.load(rec.cond, tx.const(0)), 0))
    for which, region in enumerate(rec.regions):
        with (b.if_(p) if which == 0 else b.else_()):
            d.run_bodies(regions[which])
            for outer, res in zip(rec.outputs, region.outputs):
                d.copy(outer, res, tensors.decl[outer].size)


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
