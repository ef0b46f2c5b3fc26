"""What tk-ram on a CPU profile needs from the CPU code generator: each kernel group's kernels.

tk-ram sits below codegen in the layers, so its CPU planner (tilekit.ram.cpu) takes
`cpu_kernels` from its caller (tk-ram's command, the pipeline): the groups codegen makes ONE
CPU kernel of are packable, with that kernel's blocks as their rTasks.
"""

from __future__ import annotations

from tilekit.ir.payloads import KernelRecord


def cpu_kernels(module, profile) -> list:
    """What the CPU code generator makes of each kernel group of `module` (module.kernels
    order), for tk-ram's CPU plan (tilekit.ram.cpu.CpuKernel)."""
    from dataclasses import replace

    from tilekit.codegen.module import generate
    from tilekit.ir.model import default_kernels
    from tilekit.ir.payloads import CodegenSection
    from tilekit.ram.cpu import CpuKernel

    bare = replace(module, program=None, codegen=None)
    section = CodegenSection.read(generate(bare, profile, target="cpu").module.codegen)
    made: dict[str, list[KernelRecord]] = {}
    for k in section.kernels:
        made.setdefault(k.group, []).append(k)
    ops = {op.name: op for op in module.ops}
    out = []
    for group in module.kernels or default_kernels(module.ops):
        records = made.get(group.name, [])
        if any(ops[n].kind == "control" for n in group.ops):
            out.append(CpuKernel(group.name, 0, "a control op: a device loop or host-driven "
                                 "regions"))
        elif len(records) != 1:
            out.append(CpuKernel(group.name, 0, f"codegen makes {len(records)} CPU kernels "
                                 "of it (one per stage or op)"))
        else:
            g = records[0].grid
            out.append(CpuKernel(group.name, int(g[0]) * int(g[1]) * int(g[2])))
    return out


__all__ = ["cpu_kernels"]
