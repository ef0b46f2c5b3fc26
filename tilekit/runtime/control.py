"""Control flow on the CPU: loops, branches and scans run their regions with the executor.

A control op's regions are modules (`tilekit.ir.control.region_module`), so each is prepared
once by `tilekit.runtime.cpu.prepare` and run per iteration with the step's mode: the tiled
mode runs a region's ops tile by tile like any other op. Semantics (ONNX's):

- loop: `trip_count` and `cond` bound it when present (both absent: it runs until the
  `TILEKIT_MAX_LOOP_TRIPS` budget, an error); the body gets the iteration number, the
  condition and the carried values, and gives the next condition (used only when the loop
  has a `cond`), the next carried values and one slice per scan output; scan outputs are
  stacked on axis 0 of their declared `max_trips` rows, zero past the iterations run, and
  `count` records how many ran; running more than `max_trips` with scan outputs is an error;
- scan: one iteration per slice of the scan inputs along their axes (reversed where asked),
  the results stacked along the output axes (reversed where asked);
- if: the predicate's single element picks the region that runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from tilekit import limits
from tilekit.errors import TilekitError
from tilekit.ir.control import ControlOp, region_module
from tilekit.ir.graph import control_records
from tilekit.ir.model import Module, Tensor

#: Iterations a loop without a bound may run before it is stopped (a budget, not semantics).
LOOP_TRIPS = limits.LOOP_TRIPS


@dataclass(frozen=True)
class ControlPlan:
    """A control op made ready to run: its record and its regions as modules."""

    rec: ControlOp
    regions: tuple[Module, ...]
    where: str
    declared: Mapping[str, Tensor]      # what the op writes, as its scope declares it

    def run(self, env: Mapping[str, np.ndarray], mode: str, prepare) -> list[np.ndarray]:
        """The op's results in `rec.writes()` order; `prepare` is the executor's
        (tilekit.runtime.cpu.prepare), which runs each region."""
        return _RUNNERS[self.rec.kind](_Run(self, prepare), env, mode)


def control_plan(module: Module, index: int) -> ControlPlan:
    """The plan of control op `index` of `module` (regions verified with the module)."""
    op = module.ops[index]
    rec = control_records(module)[op.name]
    regions = tuple(region_module(module.tensors, region, op.name) for region in rec.regions)
    return ControlPlan(rec, regions, f"ops[{index}] ({op.name})",
                       {n: module.tensors[n] for n in rec.writes()})


def kept_counts(module: Module) -> dict[str, str]:
    """Module outputs whose length is known only at run time: {output: its count tensor}.
    The executor keeps the count alive and trims the output to it (rows past the count are
    padding of the declared maximum)."""
    out = {}
    for rec in control_records(module).values():
        if rec.kind == "loop" and rec.count:
            for name in rec.scans:
                if name in module.outputs:
                    out[name] = rec.count
    return out


@dataclass(frozen=True)
class _Run:
    """A plan with the executor that runs its regions."""

    plan: ControlPlan
    prepare: Callable

    @property
    def rec(self) -> ControlOp:
        return self.plan.rec

    @property
    def where(self) -> str:
        return self.plan.where

    @property
    def declared(self) -> Mapping[str, Tensor]:
        return self.plan.declared


def _run_region(plan: _Run, which: int, values: Mapping[str, np.ndarray],
                env: Mapping[str, np.ndarray], mode: str) -> dict[str, np.ndarray]:
    region = plan.plan.regions[which]
    inputs = dict(values)
    for name in region.inputs[len(values):]:      # the captures, after the region's inputs
        inputs[name] = env[name]
    try:
        program = plan.prepare(region)
    except TilekitError as exc:     # located in the region's record
        raise exc.located(f"control.{plan.rec.name}.{plan.rec.region_names()[which]}") \
            from None
    return program.run(inputs, {}, mode=mode)


def check_iteration(rec: ControlOp, i: int, where: str) -> None:
    """Iteration `i` (from 0) of a loop may start: within its max_trips and the budget."""
    if rec.max_trips is not None and i >= rec.max_trips:
        raise TilekitError(f"the loop runs more than its declared max_trips "
                           f"({rec.max_trips}) iterations", where,
                           "re-import with a larger bound (tk-import --max-trips N)")
    LOOP_TRIPS.check(i + 1, where, "the loop's iterations")


def check_trip_count(rec: ControlOp, trips: int | None, where: str) -> None:
    """A loop with a trip count and no condition runs exactly `trips` iterations: they are
    checked against its max_trips and the budget before the first, not after the ones under
    the bound have run (a constant count of 2**62 stopped at the budget after minutes)."""
    if trips is not None and trips > 0 and not rec.cond:
        check_iteration(rec, trips - 1, where)


def overrun_checks(module: Module) -> tuple:
    """(record, where) of each of the module's own loops that records a count under a
    `max_trips`. Placed inside compiled code, its kernel writes `max_trips + 1` there when it
    stopped at the maximum but would have gone on (tilekit.codegen.control), which
    `check_overruns` reports; a loop the host drives fails at that iteration itself, and
    writes at most the maximum. (A nested loop's count may be another run's: a branch not
    taken leaves it; those are not checked.)"""
    records = control_records(module)
    out = []
    for index, op in enumerate(module.ops):
        rec = records.get(op.name) if op.kind == "control" else None
        if rec is not None and rec.kind == "loop" and rec.count and rec.max_trips is not None:
            out.append((rec, f"ops[{index}] ({op.name})"))
    return tuple(out)


def check_overruns(checks, count_of: Callable[[str], int]) -> None:
    """Raise as the reference does (`check_iteration`, exit 2) where a placed loop ran into
    its `max_trips` (`count_of`: a count tensor's value after the run)."""
    for rec, where in checks:
        ran = count_of(rec.count)
        if ran > rec.max_trips:
            check_iteration(rec, ran - 1, where)


def _run_loop(plan: _Run, env: Mapping[str, np.ndarray], mode: str) -> list[np.ndarray]:
    rec, body = plan.rec, plan.rec.body
    trips = int(np.asarray(env[rec.trip_count]).reshape(-1)[0]) if rec.trip_count else None
    go = bool(np.asarray(env[rec.cond]).reshape(-1)[0]) if rec.cond else True
    carried = [env[name] for name in rec.carried]
    n = len(carried)
    stacks = [_zeros(plan, name) for name in rec.scans]
    results = body.outputs[1 + n:]
    check_trip_count(rec, trips, plan.where)
    i = 0
    while go and (trips is None or i < trips):
        check_iteration(rec, i, plan.where)
        values = {body.inputs[0]: np.asarray(i, dtype=np.int64),
                  body.inputs[1]: np.asarray(go, dtype=np.bool_)}
        values.update(zip(body.inputs[2:], carried))
        out = _run_region(plan, 0, values, env, mode)
        carried = [out[name] for name in body.outputs[1:1 + n]]
        for stack, name in zip(stacks, results):
            stack[i] = out[name]
        if rec.cond:
            go = bool(np.asarray(out[body.outputs[0]]).reshape(-1)[0])
        i += 1
    if rec.scans and rec.count is None and i != rec.max_trips:
        raise TilekitError(f"the loop ran {i} iterations, not its declared {rec.max_trips}, "
                           "and records no count", plan.where,
                           "give the loop a 'count' tensor for a data-dependent trip count")
    written = carried + stacks
    if rec.count:
        written.append(np.asarray(i, dtype=np.int64))
    return written


def _zeros(plan: _Run, name: str) -> np.ndarray:
    from tilekit.runtime.io import numpy_dtype

    t = plan.declared[name]
    return np.zeros(t.shape, dtype=numpy_dtype(t.dtype))


def _run_scan(plan: _Run, env: Mapping[str, np.ndarray], mode: str) -> list[np.ndarray]:
    rec, body = plan.rec, plan.rec.body
    n = len(rec.carried)
    sources = [np.asarray(env[name]) for name in rec.scan_inputs]
    trips = sources[0].shape[rec.input_axes[0]]
    carried = [env[name] for name in rec.carried]
    stacks = [_zeros(plan, name) for name in rec.scans]
    results = body.outputs[n:]
    for t in range(trips):
        values = dict(zip(body.inputs[:n], carried))
        for k, src in enumerate(sources):
            at = trips - 1 - t if rec.input_reverse[k] else t
            values[body.inputs[n + k]] = np.take(src, at, axis=rec.input_axes[k])
        out = _run_region(plan, 0, values, env, mode)
        carried = [out[name] for name in body.outputs[:n]]
        for j, (stack, name) in enumerate(zip(stacks, results)):
            at = trips - 1 - t if rec.output_reverse[j] else t
            index = [slice(None)] * stack.ndim
            index[rec.output_axes[j]] = at
            stack[tuple(index)] = out[name]
    return carried + stacks


def _run_if(plan: _Run, env: Mapping[str, np.ndarray], mode: str) -> list[np.ndarray]:
    rec = plan.rec
    which = 0 if bool(np.asarray(env[rec.cond]).reshape(-1)[0]) else 1
    out = _run_region(plan, which, {}, env, mode)
    return [out[name] for name in rec.regions[which].outputs]


_RUNNERS: dict[str, Callable] = {"loop": _run_loop, "scan": _run_scan, "if": _run_if}


__all__ = ["ControlPlan", "check_iteration", "check_overruns", "check_trip_count", "control_plan",
           "kept_counts", "overrun_checks"]
