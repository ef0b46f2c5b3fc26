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
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.payloads import round_sig
from tilekit.ir.program import Operator, Program, Segment, operator_flow, verify_program
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
        times = [float(recorded["time_us"])]
    else:
        for name in kernel.ops:
            tile = ops[name].tile or {}
            est = tile.get("estimate") if isinstance(tile, Mapping) else None
            if not isinstance(est, Mapping) or "time_us" not in est:
                raise TilekitError(f"op {name} of kernel group {kernel.name} has no CPU "
                                   "estimate", f"kernels[{k}]", _HINT)
            times.append(float(est["time_us"]))
    return max(sum(t - fork for t in times), 1e-3)


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


def plan_cpu(module: Module, profile, kernels: Sequence[CpuKernel], policy: str = "wavefront",
             hardware: str | None = None, verify: bool = True) -> tuple[Program, tuple]:
    """The program of `module` on CPU profile `profile` (see the module docstring), and its
    rOperators (for the estimate)."""
    from tilekit.ram.plan import pack_segment, waves
    
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
        lists, _ = pack_segment(ops, members, level, producers, cores, 0, 0, 0, policy)
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
    """The CPU program with its estimate (the serial policy planned too, for comparison)."""
    from tilekit.ram.plan import makespan_us, with_estimate

    program, ops = plan_cpu(module, profile, kernels, policy, hardware)
    serial = program if policy == "serial" else plan_cpu(module, profile, kernels, "serial",
                                                         hardware, verify=False)[0]
    launch, _ = fork_join_us(profile)
    return with_estimate(program, ops, makespan_us(serial), launch)


__all__ = ["CpuKernel", "cpu_operators", "cut_segments", "fork_join_us", "group_busy_us", "plan_cpu",
           "plan_cpu_module"]
