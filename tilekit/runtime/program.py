"""`tk-run --mode program`: a module's program (tk-ram) run rTask by rTask on the CPU.

The proof, without a GPU, that a plan computes the model: every rTask computes exactly the
output points its thread block computes on the device (`tilekit.ram.tasks.Layout`: its tile
of the grid, or its points of a grid-stride loop) with `tilekit.expr.evaluate` over those
boxes; every vEU walks its list in order; a wait holds its vEU until the awaited operator's
progress counter reaches its task count. Segments run one after another; an ordinary-kernel
segment runs its operator whole. A welded group's rTask runs its members over the regions its
block needs (tilekit.runtime.tiled.GroupBlocks), intermediates in per-tile buffers.

Every computed tensor carries a *produced* mask. Before an rTask runs, every region it reads
(the input box of each read, halo included, clamped to the tensor: `input_box`) must be
produced; otherwise the run stops with `ProgramOrderError` naming the vEU, the item, the
operator and the tensor. The vEUs are interleaved adversarially: of the vEUs that can make
progress, the one whose next task belongs to the latest operator (in module order) goes
first, so a consumer that a missing barrier lets run early does run before its producer and
is caught. Opaque operators (data-dependent reads) need their inputs whole before their first
task; each of their tasks then publishes its points.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from tilekit.errors import TilekitError
from tilekit.expr import evaluate
from tilekit.expr.analysis import input_box
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.program import TASK, Program, read_program
from tilekit.runtime.cpu import Step, prepare, run_op_whole
from tilekit.runtime.tiled import GroupBlocks


class ProgramOrderError(TilekitError):
    """A task would read data no earlier task produced: the plan lacks a barrier."""


@dataclass(frozen=True)
class _Op:
    steps: tuple[Step, ...]
    layout: object              # tilekit.ram.tasks.Layout
    kernel: str
    group: GroupBlocks | None = None   # a welded group: its blocks run members' regions


class ProgramRun:
    """The state of one run (tensors, produced masks, counters)."""

    def __init__(self, module: Module, program: Program, inputs, weights):
        from tilekit.ram.tasks import operators, program_profile

        cpu = prepare(module)
        steps = {s.op.name: s for s in cpu.steps}
        profile = program_profile(program)
        rops = operators(module, profile)
        self.program = program
        self.ops = []
        for i, (k, o) in enumerate(zip(module.kernels or default_kernels(module.ops),
                                       program.operators)):
            members = tuple(steps[n] for n in k.ops)
            # a welded group's blocks walk its members' regions back from the last op's box
            welded = not rops[i].fixed and members[0].index in cpu.groups
            self.ops.append(_Op(members, rops[i].variant(o.variant).layout, k.name,
                                GroupBlocks(k.name, k.tile, members) if welded else None))
        self.env: dict[str, np.ndarray] = {**weights, **inputs}
        self.made: dict[str, np.ndarray] = {}
        for s in cpu.steps:
            for name, dtype, shape in zip(s.writes, s.dtypes, s.shapes):
                if name:
                    fill = np.nan if np.dtype(dtype).kind == "f" else 0
                    self.env[name] = np.full(shape, fill, dtype=dtype)
                    self.made[name] = np.zeros(shape, dtype=bool)
        self.writer = {t: k.name for k in module.kernels or default_kernels(module.ops)
                       for n in k.ops for t in steps[n].writes if t}
        self.whole: dict[int, list[np.ndarray]] = {}
        self.outputs = cpu.outputs
        self.counts = cpu.counts or {}

    # -- checks ------------------------------------------------------------------------------
    def _need(self, tensor: str, region, where: str) -> None:
        mask = self.made.get(tensor)
        if mask is None:
            return
        index = tuple(slice(lo, hi) for lo, hi in region) if region is not None else ()
        if not mask[index].all():
            what = "" if region is None else "[" + ", ".join(f"{lo}:{hi}" for lo, hi in
                                                             region) + "]"
            raise ProgramOrderError(
                f"reads {tensor}{what} before operator {self.writer.get(tensor)} has produced "
                "it", where, "the plan lacks a barrier: re-run tk-ram (or verify the program)")

    # -- tasks ----------------------------------------------------------------------------------
    def run_task(self, i: int, first: int, count: int, where: str) -> None:
        """Blocks `first .. first+count-1` of operator `i` (one vEU item): adjacent blocks
        are evaluated as one box (the same points, fewer NumPy calls)."""
        op = self.ops[i]
        boxes = op.layout.boxes_of(first, count)
        what = f"{where}: blocks {first}..{first + count - 1} of {op.kernel}"
        if op.group is not None:
            for box in boxes:
                self._run_group_box(op.group, box, what)
            return
        for step in op.steps:
            if step.op.kind != "expr" or op.layout.kind == "whole":
                self._run_whole_step(i, step, boxes, what, first)
                continue
            for box in boxes:
                self._run_box(step, box, what)

    def _run_box(self, step: Step, box, where: str) -> None:
        a = step.analysis
        spatial = dict(zip((x for x, _ in a.spatial), box))
        for k, access in enumerate(a.accesses):
            if access.tensor in self.made:
                self._need(access.tensor, input_box(a, k, spatial, clamp=True), where)
        value = evaluate(a, self.env, pad=step.op.pad, box=spatial, out_dtype=step.dtypes[0])
        index = tuple(slice(lo, hi) for lo, hi in box)
        out = step.writes[0]
        self.env[out][index] = np.reshape(value, self.env[out][index].shape)
        self.made[out][index] = True

    def _run_group_box(self, group: GroupBlocks, box, where: str) -> None:
        """A fused group's blocks over `box` of its last op's output: each member's region
        in order (tilekit.runtime.tiled.GroupBlocks); reads from outside the group must be
        produced, stored results are published."""
        inside = set(group.outputs)

        def need(step: Step, ranges) -> None:
            a = step.analysis
            for k, access in enumerate(a.accesses):
                if access.tensor in self.made and access.tensor not in inside:
                    self._need(access.tensor, input_box(a, k, ranges, clamp=True), where)

        def sink(tensor: str, index, value) -> None:
            self.env[tensor][index] = np.reshape(value, self.env[tensor][index].shape)
            self.made[tensor][index] = True

        group.run(box, self.env, sink, need)

    def _run_whole_step(self, i: int, step: Step, boxes, where: str, b: int) -> None:
        """Opaque ops and unpacked groups: computed whole once its inputs are whole, then
        published box by box (an opaque op's points are flat indices of its first output)."""
        key = (i, step.index)
        if key not in self.whole:
            for t in step.reads:
                self._need(t, None, where)
            self.whole[key] = [np.asarray(r) for r in run_op_whole(step, self.env)]
        for name, value, dtype in zip(step.writes, self.whole[key], step.dtypes):
            if not name:
                continue
            target, made = self.env[name], self.made[name]
            value = np.broadcast_to(np.asarray(value, dtype=dtype), target.shape)
            if self.ops[i].layout.kind == "whole" or name != step.writes[0]:
                target[...] = value
                made[...] = True
                continue
            flat_t, flat_v, flat_m = target.reshape(-1), value.reshape(-1), made.reshape(-1)
            for (lo, hi), in boxes:
                flat_t[lo:hi] = flat_v[lo:hi]
                flat_m[lo:hi] = True

    # -- the schedule ---------------------------------------------------------------------------
    def run(self) -> dict[str, np.ndarray]:
        for s, seg in enumerate(self.program.segments):
            where = f"program.segments[{s}]"
            if seg.kind == "kernel":
                i = seg.operators[0]
                self.run_task(i, 0, self.ops[i].layout.blocks, where)
                continue
            self._persistent(seg, where)
        out = {name: self.env[name] for name in self.outputs}
        for name, count in self.counts.items():   # a loop's scan outputs, to its trip count
            out[name] = out[name][:int(self.env[count])]
        return out

    def _persistent(self, seg, where: str) -> None:
        """Interleave the vEUs (adversarially, see the module docstring)."""
        counters = {op: 0 for op in seg.operators}
        tasks = {op: self.program.operators[op].tasks for op in seg.operators}
        pos = [0] * seg.veus
        waiting: dict[int, list[int]] = {}
        ready: list[tuple[int, int]] = []

        def push(v: int) -> None:
            items = seg.lists[v]
            if pos[v] < len(items):
                heapq.heappush(ready, (-items[pos[v]].op, v))

        for v in range(seg.veus):
            push(v)
        while ready:
            _, v = heapq.heappop(ready)
            it = seg.lists[v][pos[v]]
            if it.kind != TASK:
                if counters[it.op] < tasks[it.op]:
                    waiting.setdefault(it.op, []).append(v)
                    continue
                pos[v] += 1
                push(v)
                continue
            self.run_task(it.op, it.first, it.count, f"{where}.lists[{v}] item {pos[v]}")
            counters[it.op] += it.count
            pos[v] += 1
            if counters[it.op] == tasks[it.op]:
                for w in waiting.pop(it.op, []):
                    push(w)
            push(v)
        stuck = [v for v in range(seg.veus) if pos[v] < len(seg.lists[v])]
        if stuck:
            raise ProgramOrderError(f"deadlock: vEUs {stuck[:8]} wait forever", where,
                                    "re-run tk-ram")


def run_program(module: Module, inputs: Mapping[str, np.ndarray],
                weights: Mapping[str, np.ndarray], program: Program | None = None
                ) -> dict[str, np.ndarray]:
    """Run `module`'s program (or `program`, unverified: tests pass broken ones) on the CPU;
    outputs in `module.outputs` order."""
    if program is None:
        program = read_program(module)
    return ProgramRun(module, program, inputs, weights).run()


def program_runner(module: Module):
    """`(run, trace)` for `tk-run --mode program` (tilekit.runtime.backend builds the
    Backend): the program is read and verified once."""
    program = read_program(module)

    def run(inputs, weights):
        return ProgramRun(module, program, inputs, weights).run()

    def trace(inputs, weights):
        state = ProgramRun(module, program, inputs, weights)
        state.run()
        return {t: state.env[t] for t in state.made}

    return run, trace


__all__ = ["ProgramOrderError", "ProgramRun", "program_runner", "run_program"]
