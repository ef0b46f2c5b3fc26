"""tk-weld on a CPU profile: an op with its elementwise consumers as one kernel.

The CPU target makes one kernel of a one-stage group: a main op and the elementwise ops that
read its result at the same point (`chain` in `tilekit.weld.structure`'s walk), run in the
main kernel's epilogue on values in registers, so the intermediates never go to memory
(`tilekit.codegen.module`: a multi-stage group is split into one kernel per stage on the
CPU, so fusing stages would buy nothing there). The walk is connect-then-fuse
(`tilekit.weld.fuse`) with that rule: ops in module order, the open group takes the next op
when it is an expression op that reads something the group writes, is not named in
`no_fuse`, the group stays within `max_group` ops, the grown group is one stage whose
members after the first are all chained, and the grown group's CPU estimate
(`tilekit.roll.schedule.cpu_group_estimate`: the members' flops and bytes less the
intermediates kept in registers, the main op's blocks, one fork/join) beats the open group
and the op apart.

A group is recorded as its ops and its estimate (`kernels[i].estimate`); it has no
`kernels[i].tile` (tk-weld's GPU group tile: shared tile, levels, shared memory), which a
CPU kernel has no use for: each member keeps its CPU op tile, and codegen runs the main
op's. Control ops' regions are welded the same way, each as a module of its own.

Absent on CPUs: fusing several stages (a reduction feeding another, attention's flash form),
inlining a producer into its reader, and any search over tiles.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tilekit.ir.control import region_module, with_control
from tilekit.ir.graph import control_records, graph
from tilekit.ir.model import Kernel, Module
from tilekit.ir.payloads import Estimate
from tilekit.roll.schedule import cpu_group_estimate
from tilekit.weld.model import op_estimate
from tilekit.weld.structure import NotFusible, structure


def one_cpu_kernel(module: Module, members: Sequence[int]) -> bool:
    """The CPU target makes one kernel of these ops: one stage, every member after the
    first chained onto it (no producer inlined: a CPU kernel would recompute it per read)."""
    try:
        s = structure(module, members)
    except NotFusible:
        return False
    return s.stages == 1 and s.roles[0] == "stage" and all(r == "chain" for r in s.roles[1:])


def group_estimate(module: Module, members: Sequence[int], profile) -> Estimate:
    """The CPU estimate of `members` run as one kernel."""
    names = [module.ops[i].name for i in members]
    parts = {module.ops[i].name: (module.ops[i].tile, op_estimate(module, i))
             for i in members}
    return cpu_group_estimate(module, names, parts, profile)


def cpu_groups(module: Module, profile, max_group: int, no_fuse: Sequence[str]
               ) -> list[tuple[list[int], Estimate]]:
    """The groups (op indices) with their estimates, in module order (module docstring)."""
    g = graph(module)
    blocked = set(no_fuse)
    groups: list[tuple[list[int], Estimate]] = []
    open_: list[int] = []
    open_est: Estimate | None = None
    for i, node in enumerate(g.nodes):
        joins = False
        if open_ and node.analysis is not None and len(open_) < max_group \
                and node.name not in blocked \
                and g.nodes[open_[0]].analysis is not None \
                and not any(module.ops[k].name in blocked for k in open_) \
                and any(t in node.reads for k in open_ for t in g.nodes[k].writes) \
                and one_cpu_kernel(module, open_ + [i]):
            grown = group_estimate(module, open_ + [i], profile)
            if grown.time_us < open_est.time_us + op_estimate(module, i).time_us:
                open_.append(i)
                open_est = grown
                joins = True
        if not joins:
            if open_:
                groups.append((open_, open_est))
            open_, open_est = [i], op_estimate(module, i)
    if open_:
        groups.append((open_, open_est))
    return groups


def weld_cpu(module: Module, profile, max_group: int, no_fuse: Sequence[str]) -> Module:
    """`module` (rolled for the CPU `profile`) with its kernel groups (module docstring)."""
    records = control_records(module)
    if records:
        welded = {}
        for name, rec in records.items():
            regions = []
            for region in rec.regions:
                sub = weld_cpu(region_module(module.tensors, region, name), profile,
                               max_group, no_fuse)
                regions.append(replace(region, kernels=sub.kernels, control=sub.control))
            welded[name] = rec.with_regions(tuple(regions))
        module = with_control(module, welded)
    kernels = tuple(Kernel(f"k_{module.ops[members[0]].name}",
                           tuple(module.ops[i].name for i in members), estimate=est.record())
                    for members, est in cpu_groups(module, profile, max_group, no_fuse))
    return replace(module, kernels=kernels)


__all__ = ["cpu_groups", "group_estimate", "one_cpu_kernel", "weld_cpu"]
