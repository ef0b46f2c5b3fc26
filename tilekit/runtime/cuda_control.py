"""Control flow in the CUDA runtime: host-driven loops and branches, and the cooperative
launch of device loops.

`build_steps(module, section, launches)` turns a module's kernel groups into steps:

- a kernel group: its kernels, launched in order (`KernelStep`);
- a control op that tk-grind placed on the device: its persistent kernel, launched
  cooperatively; its grid was checked against the driver's occupancy when the module was
  loaded (`tilekit.runtime.cuda.coresident_launch`, the one path of every kernel whose blocks
  wait on each other: a grid that does not fit is refused, never launched);
- a control op on the host (`ControlStep`): the host drives it like the CPU executor
  (tilekit.runtime.control) does, launching its regions' kernels per iteration: it reads the
  trip count and the condition back (host synchronisations), copies carried values and scan
  rows on the device (`buffer[...] = other`), runs the taken side of a branch.

`run_steps(program, steps)` runs them and counts kernel launches and host synchronisations
in `program.counts` (the figures tk-grind estimates, measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilekit.ir.control import ControlOp, region_module
from tilekit.ir.graph import control_records
from tilekit.ir.model import Module, default_kernels
from tilekit.runtime.control import check_iteration, check_trip_count


@dataclass(frozen=True)
class KernelStep:
    launches: tuple[Any, ...]          # tilekit.runtime.cuda.Launch
    coresident: bool
    where: str


@dataclass(frozen=True)
class ControlStep:
    rec: ControlOp
    regions: tuple[tuple[Any, ...], ...]   # steps of each region
    where: str


def build_steps(module: Module, control_entries, by_group, sequence=None) -> tuple[Any, ...]:
    """The steps of `module` (a module or a region as one); `by_group` maps a kernel group
    name to its launches, `control_entries` the codegen section's `control` entries;
    `sequence` the kernel groups in the order they run (default: the module's)."""
    ops = {op.name: op for op in module.ops}
    records = control_records(module)
    steps = []
    for k, kernel in enumerate(sequence or module.kernels or default_kernels(module.ops)):
        where = f"kernels[{k}] ({kernel.name})"
        op = ops[kernel.ops[0]]
        if op.kind != "control":
            steps.append(KernelStep(tuple(by_group.get(kernel.name, ())), False, where))
            continue
        rec = records[op.name]
        if (control_entries.get(op.name) or {}).get("run") == "device" or (
                control_entries.get(op.name) is None and kernel.name in by_group):
            steps.append(KernelStep(tuple(by_group[kernel.name]), True, where))
            continue
        regions = tuple(build_steps(region_module(module.tensors, r, op.name), {}, by_group)
                        for r in rec.regions)
        steps.append(ControlStep(rec, regions, where))
    return tuple(steps)


def run_steps(program, steps) -> None:
    for step in steps:
        if isinstance(step, KernelStep):
            for launch in step.launches:
                _launch(program, launch)
        else:
            _RUNNERS[step.rec.kind](program, step)


def _launch(program, launch) -> None:
    """One kernel; a device loop's is cooperative, its grid checked when it was loaded
    (tilekit.runtime.cuda.coresident_launch)."""
    program.counts["launches"] += getattr(launch, "kernels", 1)  # a CPU run stands for several
    launch(program.buffers)


def _read(program, name: str) -> np.ndarray:
    """A small tensor read back to the host: a host synchronisation."""
    program.counts["syncs"] += 1
    return np.asarray(program.buffers[name].get()).reshape(-1)


def _put(program, name: str, value) -> None:
    buffer = program.buffers[name]
    buffer.set(np.asarray(value, dtype=buffer.dtype).reshape(buffer.shape))


def _copy(program, dst: str, src: str) -> None:
    program.buffers[dst][...] = program.buffers[src]


def _run_loop(program, step: ControlStep) -> None:
    rec, body = step.rec, step.rec.body
    trips = int(_read(program, rec.trip_count)[0]) if rec.trip_count else None
    go = bool(_read(program, rec.cond)[0]) if rec.cond else True
    n = len(rec.carried)
    for outer, param in zip(rec.carried, body.inputs[2:2 + n]):
        _copy(program, param, outer)
    for outer in rec.scans:
        program.buffers[outer].fill(0)
    check_trip_count(rec, trips, step.where)
    i = 0
    while go and (trips is None or i < trips):
        check_iteration(rec, i, step.where)
        _put(program, body.inputs[0], i)
        _put(program, body.inputs[1], go)
        run_steps(program, step.regions[0])
        for param, nxt in zip(body.inputs[2:2 + n], body.outputs[1:1 + n]):
            _copy(program, param, nxt)
        for outer, res in zip(rec.scans, body.outputs[1 + n:]):
            program.buffers[outer][i] = program.buffers[res]
        if rec.cond:
            go = bool(_read(program, body.outputs[0])[0])
        i += 1
    for outer, param in zip(rec.outputs, body.inputs[2:2 + n]):
        _copy(program, outer, param)
    if rec.count:
        _put(program, rec.count, i)


def _run_scan(program, step: ControlStep) -> None:
    rec, body = step.rec, step.rec.body
    n = len(rec.carried)
    src0 = program.buffers[rec.scan_inputs[0]]
    trips = src0.shape[rec.input_axes[0]]
    for outer, param in zip(rec.carried, body.inputs[:n]):
        _copy(program, param, outer)
    for t in range(trips):
        for k, outer in enumerate(rec.scan_inputs):
            at = trips - 1 - t if rec.input_reverse[k] else t
            index = (slice(None),) * rec.input_axes[k] + (at,)
            program.buffers[body.inputs[n + k]][...] = program.buffers[outer][index]
        run_steps(program, step.regions[0])
        for param, nxt in zip(body.inputs[:n], body.outputs[:n]):
            _copy(program, param, nxt)
        for j, (outer, res) in enumerate(zip(rec.scans, body.outputs[n:])):
            at = trips - 1 - t if rec.output_reverse[j] else t
            index = (slice(None),) * rec.output_axes[j] + (at,)
            program.buffers[outer][index] = program.buffers[res]
    for outer, param in zip(rec.outputs, body.inputs[:n]):
        _copy(program, outer, param)


def _run_if(program, step: ControlStep) -> None:
    rec = step.rec
    which = 0 if bool(_read(program, rec.cond)[0]) else 1
    run_steps(program, step.regions[which])
    for outer, res in zip(rec.outputs, rec.regions[which].outputs):
        _copy(program, outer, res)


_RUNNERS = {"loop": _run_loop, "scan": _run_scan, "if": _run_if}
