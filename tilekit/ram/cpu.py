"""tk-ram on a CPU profile: Rammer's vEUs as cores.

On a GPU a vEU is a co-resident thread-block slot; on a CPU it is one core (one thread of
the team the compiled code runs in), and an rTask is one block of a CPU kernel (a block of
rows of a `cpu_loops` nest, an `mc x nc` tile of a `cpu_gemm`: the unit of work one core
takes). The plan is the same `program` section as for a GPU (tilekit.ir.program, verified
by the same verifier), planned by the same packing (`tilekit.ram.plan.pack_segment`: each
task to the vEU that frees first, no earlier than its producers end; waits on whole
operators only where a task reads what another writes). What differs:

- the operators' blocks and durations: a kernel group is packable when codegen makes it ONE
  CPU kernel (`CpuKernel.blocks`, which the caller gets from the CPU code generator: this
  layer sits below it); its rTasks are that kernel's blocks and one lasts the group's
  estimate from tk-roll / tk-weld for the CPU profile (`tile.estimate`, `kernels[].estimate`)
  less the fork/join, divided by its waves over the cores. A group codegen makes several
  kernels of, and a control op, stay ordinary kernels (`kernel` segments, run op by op);
- every vEU runs any body (no slot to fit: one thread, the block memory its own), so
  persistent segments are cut only at those kernels, in wave order;
- one variant per operator: the CPU target decides its kernel's blocks from the registers
  and caches, not from tk-roll's candidates.

The runtime (tilekit.runtime.compiled) runs a persistent segment as one OpenMP team, thread
v walking vEU v's list, with a counter per operator (tilekit.codegen.cpu_program).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tilekit.errors import TilekitError
from tilekit.ir.keys import read_number
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.payloads import round_sig
import numpy as np

from tilekit.ir.program import (TASK, WAIT, Item, Operator, Program, Segment, operator_flow,
                                verify_program)
from tilekit.ram.tasks import Layout, ROperator, Variant

_HINT = "run tk-roll --hw with the CPU profile first (tk-ram prices rTasks by its estimates)"


@dataclass(frozen=True)
class CpuKernel:
    """What the CPU code generator makes of one kernel group: its one kernel's blocks (0: not
    one kernel) and why it is not packable ("" when it is)."""

    kernel: str
    blocks: int
    fixed: str = ""


def fork_join_us(profile) -> tuple[float, str]:
    """The profile's fork/join (one empty parallel region on all cores) in microseconds and
    its source: what a segment costs to start, as a launch does on a GPU."""
    try:
        source = profile.source("parallel.fork_join")
    except TilekitError:
        source = "not in the profile: 0"
    return float(profile.launch_overhead or 0.0) * 1e6, source


def group_busy_us(module: Module, k: int, profile) -> float:
    """Kernel group k alone on all cores, fork/join left out, from the estimates tk-roll and
    tk-weld recorded for the CPU profile (the group's, else the sum of its ops')."""
    kernels = module.kernels or default_kernels(module.ops)
    kernel = kernels[k]
    fork, _ = fork_join_us(profile)
    recorded = kernel.estimate
    ops = {op.name: op for op in module.ops}
    times = []
    if isinstance(recorded, Mapping) and "time_us" in recorded:
        times = [_time_us(recorded["time_us"], f"kernels[{k}].estimate.time_us")]
    else:
        for name in kernel.ops:
            tile = ops[name].tile or {}
            est = tile.get("estimate") if isinstance(tile, Mapping) else None
            if not isinstance(est, Mapping) or "time_us" not in est:
                raise TilekitError(f"op {name} of kernel group {kernel.name} has no CPU "
                                   "estimate", f"kernels[{k}]", _HINT)
            times.append(_time_us(est["time_us"], f"ops.{name}.tile.estimate.time_us"))
    return max(sum(t - fork for t in times), 1e-3)


#: The longest estimate the planner takes (about 11.6 days): past it, float spacing leaves
#: the packing no room to place a task.
_MAX_TIME_US = 1e12


def _time_us(value, where: str) -> float:
    """A recorded estimate's time, refused (exit 2) when it is not a number of microseconds
    in [0, _MAX_TIME_US]."""
    time = read_number(value, where, 0, _HINT)
    if time > _MAX_TIME_US:
        raise TilekitError(f"estimate of {time:g} us is over the planner's limit of "
                           f"{_MAX_TIME_US:g} us", where, _HINT)
    return time


def cpu_operators(module: Module, profile, kernels: Sequence[CpuKernel]
                  ) -> tuple[ROperator, ...]:
    """Every kernel group as an rOperator of one variant (module.kernels order)."""
    groups = module.kernels or default_kernels(module.ops)
    if len(kernels) != len(groups):
        raise TilekitError(f"{len(kernels)} CPU kernels for {len(groups)} kernel groups",
                           "kernels", "re-run the stages before tk-ram")
    cores = max(1, int(profile.sm_count))
    out = []
    for k, (group, made) in enumerate(zip(groups, kernels)):
        fixed = made.fixed
        tasks = made.blocks if not fixed and made.blocks > 0 else 1
        busy = group_busy_us(module, k, profile) if not fixed else _fixed_busy(module, k,
                                                                               profile)
        waves = -(-tasks // cores)
        variant = Variant(0, tasks, 1, 0, 0, busy, busy / waves,
                          "kernel" if fixed else "cpu", Layout("whole", ()))
        out.append(ROperator(k, group.name, tuple(group.ops), (variant,), fixed))
    return tuple(out)


def _fixed_busy(module: Module, k: int, profile) -> float:
    """An ordinary kernel's time for the estimate: its ops' estimates where there are, else 0
    (a control op's regions are not priced here)."""
    try:
        return group_busy_us(module, k, profile)
    except TilekitError:
        return 1e-3


def cut_segments(ops: Sequence[ROperator], level: list[int]) -> list[tuple[str, list[int]]]:
    """(kind, operators) per segment in run order: operators in wave order join one
    persistent segment until an ordinary kernel cuts it; a persistent segment of one
    operator is that operator's kernel (nothing to overlap)."""
    out: list[tuple[str, list[int]]] = []
    current: list[int] = []
    for i in sorted(range(len(ops)), key=lambda i: (level[i], i)):
        if ops[i].fixed:
            if current:
                out.append(("persistent", current))
                current = []
            out.append(("kernel", [i]))
        else:
            current.append(i)
    if current:
        out.append(("persistent", current))
    return [("kernel", m) if kind == "persistent" and len(m) == 1 else (kind, m)
            for kind, m in out]


def pack_cpu(ops: Sequence[ROperator], members: list[int], level: list[int],
             producers: list[set[int]], veus: int, sync_us: float, policy: str
             ) -> list[list[Item]]:
    """The vEU lists of one persistent segment on a CPU: Rammer's packing with whole
    operators. Wave by wave (the largest operator of a wave first), an operator whose time is
    at most its wave's per-core share (the wave's work / `veus`) runs whole on the vEU where
    it ends first; a larger one is spread, its tasks on the vEUs that free first (as
    `tilekit.ram.plan.pack_segment`). Every wait on a producer that ran on another core costs
    `sync_us` (a cache-line handoff and, when the waiter slept, a wake-up). So the small
    operators of the branches of a wave run side by side, one core each, and a branch's chain
    tends to stay on its core without waits; an operator that alone could fill the cores
    still does. The serial policy spreads every operator, one after another (op by op, for
    comparison)."""
    from tilekit.ram.plan import _trial

    free = np.zeros(veus)
    finish: dict[int, float] = {}
    home: dict[int, int | None] = {}       # the one vEU an operator ran on, else None
    lists: list[list[Item]] = [[] for _ in range(veus)]
    waited: list[set[int]] = [set() for _ in range(veus)]
    ran: list[dict[int, int]] = [{} for _ in range(veus)]
    inside = set(members)
    work = {i: ops[i].best.tasks * ops[i].best.task_us for i in members}
    wave_work: dict[int, float] = {}
    for i in members:
        wave_work[level[i]] = wave_work.get(level[i], 0.0) + work[i]
    previous_end = 0.0
    order = sorted(members, key=lambda i: (level[i], -work[i], i) if policy != "serial"
                   else (level[i], i))
    for i in order:
        deps = producers[i] & inside
        v0 = ops[i].best

        def ready_on(v: int) -> float:
            return max((finish[p] + (0.0 if home[p] == v else sync_us) for p in deps),
                       default=0.0)

        if policy == "serial":
            ready = max(max((finish[p] + sync_us for p in deps), default=0.0), previous_end)
            _, counts = _trial(free, v0.tasks, v0.task_us, ready)
            starts = {v: max(free[v], ready) for v, _ in counts}
        elif work[i] <= wave_work[level[i]] / veus:
            one = min(range(veus), key=lambda v: (max(free[v], ready_on(v)) + work[i], v))
            counts = [(one, v0.tasks)]
            starts = {one: max(free[one], ready_on(one))}
        else:
            ready = max((finish[p] + sync_us for p in deps), default=0.0)
            _, counts = _trial(free, v0.tasks, v0.task_us, ready)
            starts = {v: max(free[v], ready_on(v)) for v, _ in counts}
        home[i] = counts[0][0] if len(counts) == 1 else None
        first = 0
        for v, n in counts:
            for p in sorted(deps):
                if p not in waited[v] and ran[v].get(p, 0) < ops[p].best.tasks:
                    lists[v].append(Item(WAIT, p, 0, ops[p].best.tasks))
                    waited[v].add(p)
            lists[v].append(Item(TASK, i, first, n))
            ran[v][i] = n
            first += n
            free[v] = starts[v] + n * v0.task_us
        finish[i] = max(free[v] for v, _ in counts)
        previous_end = finish[i]
    return lists


def plan_cpu(module: Module, profile, kernels: Sequence[CpuKernel], policy: str = "wavefront",
             hardware: str | None = None, verify: bool = True) -> tuple[Program, tuple]:
    """The program of `module` on CPU profile `profile` (see the module docstring), and its
    rOperators (for the estimate)."""
    from tilekit.ram.plan import waves
    
    ops = cpu_operators(module, profile, kernels)
    producers, _ = operator_flow(module)
    cut = waves(ops, producers, "wavefront")
    level = waves(ops, producers, policy)
    launch, source = fork_join_us(profile)
    cores = max(1, int(profile.sm_count))
    segment_of: dict[int, int] = {}
    segments: list[Segment] = []
    for s, (kind, members) in enumerate(cut_segments(ops, cut)):
        for i in members:
            segment_of[i] = s
        if kind == "kernel":
            segments.append(Segment("kernel", tuple(members)))
            continue
        lists = pack_cpu(ops, members, level, producers, cores, launch, policy)
        while lists and not lists[-1]:
            lists.pop()
        segments.append(Segment("persistent", tuple(sorted(members)), 1, len(lists),
                                f"one vEU per core: {cores} cores of {profile.name}",
                                tuple(tuple(items) for items in lists)))
    program_ops = tuple(Operator(op.kernel, 0, op.best.tasks, 1, round_sig(op.best.task_us),
                                 round_sig(op.best.busy_us), segment_of[i])
                        for i, op in enumerate(ops))
    program = Program(policy, hardware or profile.name, round_sig(launch), source, program_ops,
                      tuple(segments))
    if verify:
        verify_program(module, program)
    return program, ops


def plan_cpu_module(module: Module, profile, kernels: Sequence[CpuKernel],
                    policy: str = "wavefront", hardware: str | None = None) -> Program:
    """The CPU program with its estimate (the serial policy planned too, for comparison). A
    module not rolled for a CPU profile is refused: its durations would be another device's,
    and the compiled runtime runs only plans of CPU-rolled modules."""
    from tilekit.ir.payloads import cpu_rolled
    from tilekit.ram.plan import makespan_us, with_estimate

    if not cpu_rolled(module):
        raise TilekitError(f"the module is not rolled for a CPU profile, and {profile.name} is "
                           "one", "ops", _HINT)

    program, ops = plan_cpu(module, profile, kernels, policy, hardware)
    serial = program if policy == "serial" else plan_cpu(module, profile, kernels, "serial",
                                                         hardware, verify=False)[0]
    launch, _ = fork_join_us(profile)
    return with_estimate(program, ops, makespan_us(serial), launch)


__all__ = ["CpuKernel", "cpu_operators", "cut_segments", "fork_join_us", "group_busy_us",
           "pack_cpu", "plan_cpu",
           "plan_cpu_module"]
