"""tk-ram: Rammer (OSDI'20). rTasks (thread blocks of kernel groups) placed on virtual execution
units (co-resident thread-block slots) and run as persistent kernels.

    from tilekit.ram import ram_module
    module = ram_module(module, profile, policy="wavefront")   # adds the `program` section

`tasks` turns kernel groups into rOperators with variants, `plan` cuts segments and packs
rTasks (wavefront or serial), `timeline` replays a program with the estimated durations,
`svg` draws it, `exchange` measures what a distributed profile's tiles would exchange. The
program format and its verifier are `tilekit.ir.program`; codegen composes the persistent
kernels (`tilekit.codegen.program`); `tk-run --mode program` runs the plan on the CPU
(`tilekit.runtime.program`). docs/ram.md.
"""

from __future__ import annotations

from tilekit.errors import IRError
from tilekit.ir.model import Module
from tilekit.ir.program import POLICIES, Program
from tilekit.ir.stages import run_stage

STAGE = "ram"


def plan_module(module: Module, profile, policy: str = "wavefront",
                hardware: str | None = None) -> Program:
    """The program of `module` with its estimate (the serial policy is planned too, for the
    comparison)."""
    from tilekit.ram.plan import makespan_us, plan, with_estimate
    from tilekit.ram.tasks import launch_us, operators

    if policy not in POLICIES:
        raise IRError(f"unknown policy '{policy}'", "--policy",
                      f"known policies: {', '.join(POLICIES)}")
    ops = operators(module, profile)
    program = plan(module, profile, policy, hardware, ops=ops)
    serial = program if policy == "serial" else plan(module, profile, "serial", hardware,
                                                            verify=False, ops=ops)
    launch, _ = launch_us(profile)
    return with_estimate(program, ops, makespan_us(serial), launch)


def ram_module(module: Module, profile, policy: str = "wavefront",
               hardware: str | None = None, cpu_kernels=None) -> Module:
    """The ram stage: `module` with its `program` section, recorded through `run_stage`. On
    a CPU profile (tilekit.ram.cpu) `cpu_kernels(module, profile)` says what the CPU code
    generator makes of each kernel group (the caller passes
    tilekit.codegen.cpu_ram.cpu_kernels: codegen sits above this layer)."""
    from dataclasses import replace

    if "import" not in module.stage_names():
        raise IRError("the input has no 'import' stage", "stages",
                      "produce it with tk-import")

    def work(m: Module) -> Module:
        if profile.is_cpu:
            from tilekit.errors import InternalError
            from tilekit.ram.cpu import plan_cpu_module

            if policy not in POLICIES:
                raise IRError(f"unknown policy '{policy}'", "--policy",
                              f"known policies: {', '.join(POLICIES)}")
            if cpu_kernels is None:
                raise InternalError("tk-ram on a CPU profile needs the CPU kernels")
            return replace(m, program=plan_cpu_module(
                m, profile, cpu_kernels(m, profile), policy, hardware).record())
        return replace(m, program=plan_module(m, profile, policy, hardware).record())

    return run_stage(module, STAGE, work, {"policy": policy, "hw": profile.name})


__all__ = ["STAGE", "plan_module", "ram_module"]
