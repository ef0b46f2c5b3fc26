"""The codegen pass: `generate(module, profile) -> CodegenResult` (its `.module` has a `codegen`
section).

For every kernel group (`module.kernels`, or the explicit default of one kernel per op, which
is then written into the IR) it plans stages (`tilekit.codegen.plan`), picks a kernel shape,
generates the CUDA C++ and records how to launch it. Shape choice, in order:

1. one opaque op: its registered CUDA implementation (`tilekit.codegen.opaque`);
2. a row chain on the CPU target (softmax, layer norm: `tilekit.weld.cpu.row_chain`):
   `cpu_rows` (`tilekit.codegen.cpu_rows`), the rows' passes in one kernel;
3. one stage on the CPU target: `cpu_gemm` or `cpu_loops` (`tilekit.codegen.cpu`): the main
   op's CPU tile as tk-roll recorded it for a CPU profile (`target: cpu`: its kernel, micro
   and cache tiles and blocks, checked against the op), else decided from the profile's
   registers and caches (`tilekit.schedule.cpu.cpu_shape`; a GPU tile is set aside and
   recorded as `tile_ignored`);
4. one stage with a tile (the main op's tile from tk-roll, else the kernel's tile):
   the shape `tilekit.schedule.shape.decide` picks, the decision tk-roll's cost model also
   reads: `staged` when the op reduces with reuse; `default` with a warp per point for a
   reduction without reuse over a long contiguous axis (the tile is set aside:
   `schedule.tile_ignored`); else `tiled`;
5. one stage without a tile: `default`;
6. several stages: `flash` when tk-weld's group tile says so (attention with its key axis
   split, `tilekit.codegen.flash`), else `fused` (kernel.tile when tk-weld wrote it, else the
   fused default tile). A welded module's groups are checked first (`tilekit.weld.verify`).

A group that cannot be one kernel (an opaque op among others, shared buffers over the
profile's limit, a stored result the tiles would not cover) is split into one kernel per op,
and the reason is recorded (`launch.split`) and reported as a note.

The section's layout is documented in docs/codegen.md; everything in it is a pure function of
the IR, the profile and runtime.cuh, so the output is deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from tilekit.codegen.cpu import cpu_kernel
from tilekit.codegen.flash import FlashError, flash_kernel
from tilekit.codegen.fused import FusionError, fused_kernel
from tilekit.codegen.helpers import helpers_record
from tilekit.codegen.kernel import GeneratedKernel, c_name, default_kernel, tiled_kernel
from tilekit.codegen.nvcc import check_arch, unit_arch
from tilekit.codegen.opaque import opaque_kernel
from tilekit.codegen.plan import (GroupPlan, GroupSplit, OpaquePlan, plan_each, plan_group,
                                  readers)
from tilekit.codegen.program import compose, coresident_problems, program_module
from tilekit.ir.payloads import (CPU_BY_SIZE, CodegenSection, Launch, Tile, cpu_rolled,
                                 is_cpu_tile,
                                  read_split_k, read_tile)
from tilekit.schedule.cpu import cpu_shape, recorded_tiles
from tilekit.schedule.defaults import STATIC_SMEM_LIMIT
from tilekit.schedule.mma import recorded_precision
from tilekit.schedule.shape import Target, decide, kept_default
from tilekit.codegen.mma import mma_kernel
from tilekit.codegen.simt import simt_kernel
from tilekit.codegen.wgmma import wgmma_kernels
from tilekit.codegen.staged import op_facts, staged_kernel
from tilekit.errors import TilekitError
from tilekit.ir.model import Kernel, Module, default_kernels
from tilekit.ir.stages import run_stage
from tilekit.weld.verify import check_groups

#: Why a one-stage group's tile from tk-roll or tk-weld is not used on the CPU target.
CPU_TILE_NOTE = ("the CPU target tiles one-stage groups from the CPU's registers and caches "
                 "(tilekit.schedule.cpu), not from the GPU tile")

#: Why a one-stage group's CPU tile is decided afresh: producers inlined into its main op make
#: another loop body than the op tk-roll tiled alone.
CPU_INLINED_NOTE = ("producers are inlined into the op, so its kernel is decided for the "
                    "inlined body (tilekit.schedule.cpu), not taken from its CPU tile")

#: Arch recorded when neither --arch nor a hardware profile names one.
DEFAULT_ARCH = "sm_90"



@dataclass(frozen=True)
class CodegenResult:
    module: Module
    kernels: tuple[GeneratedKernel, ...]
    notes: tuple[str, ...]       # things a user should know (splits, shrunk steps)


def smem_limit(profile) -> int:
    """Shared memory one block may use: the profile's opt-in maximum, else the 48 KB that
    every NVIDIA GPU allows without opting in."""
    return int(profile.smem_per_block) if profile is not None else STATIC_SMEM_LIMIT


def generate(module: Module, profile=None, arch: str | None = None, target: str = "cuda",
             varying: frozenset[tuple[str, str]] | None = None) -> CodegenResult:
    """Generate every kernel of `module` for `target` (cuda | cpu); see the module
    docstring. `varying`: code for one size of a symbolic module, given the (op, axis)
    pairs whose extents change with its symbols: no decision that shapes the code reads
    them (`tilekit.schedule.shape.Target.varying`; on CPUs `tilekit.schedule.cpu.CpuTiles
    .varying`)."""
    kind = target
    if kind == "cuda":
        refuse_cpu_module(module, profile)
    the_arch = target_arch(arch, profile) if kind == "cuda" else "cpu"
    target = Target.of(profile, recorded_precision(module), kind,
                       the_arch if kind == "cuda" else None)
    if varying is not None:
        target = replace(target, varying=frozenset(varying))
        if target.cpu is not None:
            target = replace(target, cpu=replace(target.cpu, varying=frozenset(varying)))
    if module.program is not None or kind != "cuda":
        # tk-ram composes kernel bodies into persistent blocks; a wgmma body (warp roles,
        # TMA descriptors as kernel parameters) does not compose: mma.sync there
        target = replace(target, wgmma=frozenset())
    check_groups(module, profile)   # tk-weld's groups (a region's too) are one kernel as recorded
    kernels = module.kernels or default_kernels(module.ops)
    planned = module
    module = program_module(module)  # a tk-ram program's variants become the ops' tiles
    tensor_readers = readers(module)
    generated: list[GeneratedKernel] = []
    notes: list[str] = []
    launches: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    control: dict[str, Any] = {}
    made_of: dict[str, list[GeneratedKernel]] = {}   # kernel group -> its kernels
    ops_by_name = {op.name: op for op in module.ops}
    for k, kernel in enumerate(kernels):
        where = f"kernels[{k}] ({kernel.name})"
        if any(ops_by_name[n].kind == "control" for n in kernel.ops):
            code = _control_group(module, kernel, profile, arch, where, kind)
            generated.extend(code.kernels)
            made_of[kernel.name] = list(code.kernels)
            notes.extend(code.notes)
            control[kernel.ops[0]] = dict(code.record)
            one = code.kernels[0] if len(code.kernels) == 1 else None
            launches[kernel.name] = Launch(
                tuple(g.entry for g in code.kernels), one and one.grid, one and one.block,
                one and one.smem_bytes, one and one.shape, None).record()
            continue
        try:
            runs = _cpu_stage_runs(module, kernel, tensor_readers) if kind == "cpu" else None
            rows = _cpu_rows(module, kernel, tensor_readers, target, used) if runs else None
            if rows is not None:
                made, split = [rows], None
            elif runs is not None:
                split = CPU_STAGES_NOTE
                made = [g for n, run in enumerate(runs)
                        for g in _one_group(module, Kernel(name=f"{kernel.name}__s{n}",
                                                           ops=run),
                                            f"{kernel.name}__s{n}", tensor_readers, target,
                                            notes, used, where, group=kernel.name)]
            else:
                made = _one_group(module, kernel, kernel.name, tensor_readers, target, notes,
                                  used, where)
                split = None
        except (GroupSplit, FusionError, FlashError) as exc:
            split = str(exc)
            notes.append(f"{where}: split into one kernel per op: {split}")
            made = []
            for op in kernel.ops:
                sub = Kernel(name=f"{kernel.name}__{op}", ops=(op,))
                try:
                    made.extend(_one_group(module, sub, sub.name, tensor_readers, target,
                                           notes, used, where, group=kernel.name))
                except (GroupSplit, FusionError) as inner:  # pragma: no cover - singletons fuse
                    raise TilekitError(str(inner), where) from None
        generated.extend(made)
        made_of[kernel.name] = made
        one = made[0] if len(made) == 1 else None
        launches[kernel.name] = Launch(
            tuple(g.entry for g in made), one and one.grid, one and one.block,
            one and one.smem_bytes, one and one.shape, split).record()
    if planned.program is not None and kind == "cpu" and cpu_rolled(planned):
        notes.append("program: the compiled CPU runtime runs tk-ram's persistent segments on "
                     "their vEUs, one thread each, from these kernels' bodies "
                     "(tilekit.codegen.cpu_program)")
    elif planned.program is not None and kind == "cpu":
        notes.append("program: tk-ram's persistent segments run as their kernels, one after "
                     "another, on the CPU target (the variants it chose are kept)")
    elif planned.program is not None:  # persistent segments become one kernel each
        generated, entry_of = compose(planned, made_of, profile)
        for g in generated:
            if g.shape == "program":
                for name in g.schedule["operators"]:
                    launches[name] = Launch((g.entry,), g.grid, g.block, g.smem_bytes,
                                            g.shape).record()
    out_kernels = tuple(replace(kn, launch=launches[kn.name]) for kn in kernels)
    built_for = unit_arch(the_arch, (g.shape for g in generated))
    if built_for != the_arch:
        the_arch = built_for
        notes.append("codegen: wgmma kernels need the sm_90a target; the module is built for "
                     "sm_90a (Hopper GPUs run it)")
    if control:
        from tilekit.codegen.control import check_entries_unique
        check_entries_unique(generated)
    extra: dict[str, Any] = {"target": kind} if kind != "cuda" else {}
    if control:
        extra["control"] = control
    section = CodegenSection(the_arch, helpers_record(kind),
                             tuple(g.record() for g in generated), tuple(notes), extra=extra)
    result = replace(planned, kernels=out_kernels, codegen=section.record())
    return CodegenResult(result, tuple(generated), tuple(notes))


#: Why a multi-stage group is several kernels on the CPU target.
CPU_STAGES_NOTE = ("the CPU target runs a multi-stage group stage by stage (one kernel per "
                   "stage with its chain; intermediates between stages, and producers a "
                   "reduction reads, through memory)")


def refuse_cpu_module(module: Module, profile=None) -> None:
    """CUDA from a module rolled for a CPU profile (its tiles are CPU schedules) or with a
    CPU profile: a one-line error naming --target."""
    cpu = profile is not None and profile.is_cpu
    if cpu or cpu_rolled(module):
        name = profile.name if cpu else module.hardware
        raise TilekitError(f"the module is rolled for CPU profile '{name}' (its tiles are "
                           "CPU schedules), and --target cuda generates CUDA for NVIDIA GPUs",
                           "--target", "use --target cpu (the default for such a module), "
                           "or re-run tk-roll --hw with a GPU profile first")


def _cpu_one_kernel(plan) -> bool:
    """One CPU kernel: one stage, and no producer inlined into a reduction (a CPU kernel
    would recompute it at every reduction point: an exponential per multiply-add of the
    attention's second product; a GPU kernel computes it once into its staged tile)."""
    return isinstance(plan, GroupPlan) and len(plan.stages) == 1 and not (
        plan.stages[0].main.reduces and plan.inlined)


def _cpu_stage_runs(module: Module, kernel: Kernel, tensor_readers
                    ) -> list[tuple[str, ...]] | None:
    """A group that is not one CPU kernel (`_cpu_one_kernel`) cut into runs of its ops that
    each are, in order; None for a group that is one already (or not an expression group)."""
    if len(kernel.ops) < 2:
        return None
    try:
        whole = plan_group(module, kernel, kernel.name, tensor_readers)
    except GroupSplit:
        return None
    if not isinstance(whole, GroupPlan) or _cpu_one_kernel(whole):
        return None
    runs: list[tuple[str, ...]] = []
    current: tuple[str, ...] = ()
    for op in kernel.ops:
        grown = current + (op,)
        try:
            one = _cpu_one_kernel(plan_group(module, Kernel(name=kernel.name, ops=grown),
                                             kernel.name, tensor_readers))
        except GroupSplit:
            one = False
        if one or not current:
            current = grown
        else:
            runs.append(current)
            current = (op,)
    runs.append(current)
    return runs


def _cpu_rows(module: Module, kernel: Kernel, tensor_readers, target: Target, used: set[str]
              ) -> GeneratedKernel | None:
    """The `cpu_rows` kernel of a group that is a row chain (`tilekit.weld.cpu.row_chain`:
    softmax, layer norm), else None."""
    from tilekit.codegen.cpu_rows import rows_kernel
    from tilekit.weld.cpu import row_chain

    index = module.op_index()
    chain = row_chain(module, [index[o] for o in kernel.ops])
    if chain is None:
        return None
    plan = plan_each(module, kernel, kernel.name, tensor_readers)
    return rows_kernel(module, plan, chain, _unique_entry(kernel.name, used), target)


def _control_group(module: Module, kernel: Kernel, profile, arch: str | None, where: str,
                   kind: str):
    """A kernel group holding a control op (tilekit.codegen.control)."""
    from tilekit.codegen.control import control_code

    if len(kernel.ops) != 1:
        raise TilekitError("a control op shares its kernel group with other ops", where,
                           "a control op is a kernel group of its own")
    return control_code(module, kernel, generate, profile, arch, where, kind)


def target_arch(arch: str | None, profile=None) -> str:
    """The arch generated for: `arch` when given, else the profile's, else `DEFAULT_ARCH`."""
    if arch is not None:
        return check_arch(arch)
    if profile is not None:
        return check_arch(profile.arch, f"hardware profile '{profile.name}': arch")
    return DEFAULT_ARCH


@dataclass(frozen=True)
class CodegenRun:
    """The codegen stage's outcome: the module (its `codegen` section, kernel launches and
    the stage recorded), the generated kernels, notes, and with `compile` the kernels over a
    limit or spilling."""

    module: Module
    kernels: tuple[GeneratedKernel, ...]
    notes: tuple[str, ...]
    problems: tuple[str, ...] = ()


def run_codegen(module: Module, profile=None, arch: str | None = None,
                compile: bool = False, target: str = "cuda") -> CodegenRun:
    """The codegen stage: `generate`, with `compile` also `compile_module`, recorded through
    `tilekit.ir.stages.run_stage` (options: arch, compile, hw, target)."""
    the_arch = target_arch(arch, profile) if target == "cuda" else None
    done: dict[str, Any] = {}

    def work(m: Module) -> Module:
        result = generate(m, profile, the_arch, target)
        done["result"] = result
        if not compile:
            return result.module
        if target == "cpu":
            return compile_cpu(result)
        report = compile_module(result, None, profile)   # codegen.arch (sm_90a for wgmma)
        done["problems"] = report.problems
        return report.module

    options: dict[str, Any] = {"arch": the_arch or "cpu", "compile": bool(compile)}
    if target != "cuda":
        options["target"] = target
    if profile is not None:
        options["hw"] = profile.name
    out = run_stage(module, "codegen", work, options)
    result = done["result"]
    return CodegenRun(out, result.kernels, result.notes, tuple(done.get("problems", ())))


def _unique_entry(name: str, used: set[str]) -> str:
    base = f"tk_{c_name(name)}"
    entry, n = base, 1
    while entry in used:
        entry = f"{base}_{n}"
        n += 1
    used.add(entry)
    return entry


def _one_group(module: Module, kernel: Kernel, name: str, tensor_readers, target: Target,
               notes: list[str], used: set[str], where: str,
               group: str | None = None) -> list[GeneratedKernel]:
    """The group's kernel (two for a split-K contraction: partial sums, then their sum)."""
    plan = plan_group(module, kernel, name, tensor_readers)
    entry = _unique_entry(name, used)
    if isinstance(plan, OpaquePlan):
        g = opaque_kernel(module, plan, entry, target)
    elif len(plan.stages) == 1:
        made = _single_stage(module, plan, entry, target, notes, where,
                             lambda: _unique_entry(f"{name}_reduce", used))
        if len(made) > 1:
            return [replace(g, group=group) if group is not None else g for g in made]
        g = made[0]
    elif isinstance(plan.kernel.tile, dict) and plan.kernel.tile.get("flash"):
        # tk-weld's flash form of an attention group (checked by tilekit.weld.verify).
        from tilekit.weld.attention import match
        from tilekit.weld.structure import structure
        index = module.op_index()
        att = match(module, structure(module, [index[o] for o in plan.kernel.ops]))
        g = flash_kernel(module, plan, entry, _kernel_tile(plan, where),
                         int(plan.kernel.tile["flash"]["step"]), att, target)
    else:
        # A group's own tile (kernels[].tile) is tk-weld's fusion decision; without one the
        # fused shape picks its default tile.
        tile = _kernel_tile(plan, where)
        g = fused_kernel(module, plan, entry, tile, target)
    if isinstance(plan, GroupPlan) and plan.inlined:
        g = replace(g, schedule={**g.schedule, "inlined": list(plan.inlined)})
    if group is not None:
        g = replace(g, group=group)
    return [g]


def _kernel_tile(plan: GroupPlan, where: str) -> Tile | None:
    """kernel.tile (tk-weld: the last op's output tile), read over the last stage's axes."""
    if plan.kernel.tile is None:
        return None
    stage = plan.stages[-1]
    main, last = stage.main, stage.last
    return read_tile(plan.kernel.tile, main.spatial, main.reduction, f"{where}.tile", "weld",
                     rename=tuple(a for a, _ in last.spatial), require_step=False)


def _single_stage(module: Module, plan: GroupPlan, entry: str, target: Target, notes: list[str],
                  where: str, reduce_entry) -> list[GeneratedKernel]:
    """One stage: the kernel shape the shared decision picks (tilekit.schedule.shape), the
    same decision tk-roll's cost model priced (a split-K wgmma: two kernels)."""
    main = plan.stages[0].main
    if target.kind == "cpu" and is_cpu_tile(main.op.tile):
        return [_rolled_cpu_kernel(module, plan, entry, target)]
    # The main op's own tile first: a chain only adds an epilogue, so the tile chosen for the
    # main op's work is the right one.
    tile, split_k = None, 1
    if main.op.tile is not None and not kept_default(main.op.tile):
        # (tk-roll may have kept the default schedule over its best tile: kept_default)
        tile = read_tile(main.op.tile, main.spatial, main.reduction, f"{main.where}.tile",
                         "roll", unclamped=target.axes_varying(main.op.name))
        split_k = read_split_k(main.op.tile, f"{main.where}.tile")
    if tile is None and not kept_default(main.op.tile):
        tile = _kernel_tile(plan, where)
    if target.kind == "cpu":
        g = cpu_kernel(module, plan, entry, target.cpu, target)
        if tile is not None:
            g = replace(g, schedule={**g.schedule, "tile_ignored": CPU_TILE_NOTE})
        return [g]
    decision = decide(op_facts(main, target), tile, target, split_k)
    if decision.note and decision.shape != "default":
        notes.append(f"{where}: {decision.note}")
    if decision.shape == "mma":
        return [mma_kernel(module, plan, entry, decision, target)]
    if decision.shape == "wgmma":
        return wgmma_kernels(module, plan, entry, decision, target, reduce_entry)
    if decision.shape == "simt":
        return [simt_kernel(module, plan, entry, decision, target)]
    if decision.shape == "staged":
        return [staged_kernel(module, plan, entry, decision, target)]
    if decision.shape == "tiled":
        return [tiled_kernel(module, plan, entry, decision.tile, target)]
    g = default_kernel(module, plan, entry, target)
    if decision.note:
        g = replace(g, schedule={**g.schedule, "tile_ignored": decision.note})
    return [g]


def _rolled_cpu_kernel(module: Module, plan: GroupPlan, entry: str, target: Target
                      ) -> GeneratedKernel:
    """The CPU kernel of a one-stage group whose main op tk-roll tiled for a CPU profile: its
    recorded kernel, micro and cache tiles and blocks (IRError when they do not fit the op),
    unless producers are inlined into it (`CPU_INLINED_NOTE`)."""
    main = plan.stages[0].main
    where = f"{main.where}.tile"
    facts = op_facts(main)
    if plan.inlined:
        g = cpu_kernel(module, plan, entry, target.cpu, target)
        return replace(g, schedule={**g.schedule, "tile_ignored": CPU_INLINED_NOTE})
    tiles = replace(recorded_tiles(main.op.tile, target.cpu.machine, where),
                    varying=target.cpu.varying)
    recorded = main.op.tile.get("kernel") or {}
    if recorded.get("shape") == CPU_BY_SIZE:    # a symbolic module's roll: decided at these sizes
        recorded = None
    shape = cpu_shape(facts, tiles, recorded, where, free=tiles.free(main.op.name))
    g = cpu_kernel(module, plan, entry, shape, target)
    return replace(g, schedule={**g.schedule, "tiles": "rolled"})


# -- compiling ---------------------------------------------------------------------------

#: Limits checked when no profile is given (every NVIDIA GPU since sm_50).
GENERIC_LIMITS = {"max_regs_per_thread": 255, "regs_per_block": 65536,
                  "smem_per_block": STATIC_SMEM_LIMIT}


def unit_source(kernels) -> str:
    """All kernels of a module as one translation unit (one nvcc call per module)."""
    from tilekit.tile.cuda import unit_text

    return unit_text([k.body for k in kernels], [k.defines for k in kernels],
                     any(k.uses_half for k in kernels))


@dataclass(frozen=True)
class CompileReport:
    module: Module
    problems: tuple[str, ...]     # over a limit or spilling: warnings, errors under --strict
    command: str
    cached: bool


_COMMENT = re.compile(r"//[^\n]*")


def canonical_body(kernel: GeneratedKernel) -> str:
    """The kernel's text with comments dropped and its entry and tensor names replaced by
    placeholders: equal for kernels that compile to the same code. Identifiers derived from a
    tensor name (`t_x`, `s_x_0`) are renamed with it, consistently, so equal texts are the same
    program up to renaming. Longer names first, so that `x` never replaces part of `x1`."""
    text = _COMMENT.sub("", kernel.body).replace(kernel.entry, "@entry")
    for i, name in sorted(enumerate(kernel.args), key=lambda p: -len(p[1])):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", f"@{i}", text)
    return text


def compile_cpu(result: CodegenResult) -> Module:
    """Build the CPU kernels with the C++ compiler (cached: tk-run loads the same library)
    and record the compiler in `codegen.compiled`."""
    from tilekit.codegen.cpu_program import program_unit
    from tilekit.codegen.cxx import CXX_FLAGS, build, compiler_version, find_cxx

    section = CodegenSection.read(result.module.codegen)
    build(program_unit(result.module)[0])
    cxx = find_cxx() or "c++"
    section = replace(section, compiled={"target": "cpu", "cxx": compiler_version(cxx),
                                         "flags": " ".join(CXX_FLAGS)})
    return replace(result.module, codegen=section.record())


def compile_module(result: CodegenResult, arch: str | None = None, profile=None
                   ) -> CompileReport:
    """Compile every kernel with nvcc for `arch` (default: codegen.arch), record each kernel's
    `resources` in the IR and list the kernels over the profile's limits or that spill."""
    from tilekit.codegen.nvcc import compile_unit, find_nvcc, nvcc_version

    module = result.module
    arch = arch or module.codegen["arch"]
    # Kernels that differ only in names (ResNet's repeated blocks, DenseNet's layers) compile
    # once: the unit holds one representative of each, and the others share its resources.
    representative: dict[str, GeneratedKernel] = {}
    for g in result.kernels:
        representative.setdefault(canonical_body(g), g)
    compiled = compile_unit(unit_source(list(representative.values())), arch)
    entry_of = {g.entry: representative[canonical_body(g)].entry for g in result.kernels}
    limits = GENERIC_LIMITS if profile is None else {
        "max_regs_per_thread": profile.max_regs_per_thread,
        "regs_per_block": profile.regs_per_block, "smem_per_block": profile.smem_per_block}
    problems: list[str] = []
    records = []
    section = CodegenSection.read(module.codegen)
    for g, record in zip(result.kernels, section.kernels):
        res = compiled.resources.get(entry_of[g.entry])
        if res is None:  # pragma: no cover - ptxas reports every entry
            raise TilekitError(f"ptxas reported nothing for {g.entry}", "--compile")
        threads = g.block[0] * g.block[1] * g.block[2]
        # Registers are allocated per warp in units of 256 (sm_50+): round as the hardware does.
        regs_block = -(-res.registers * 32 // 256) * 256 * -(-threads // 32)
        if res.spills:
            problems.append(f"{g.name} ({g.entry}) spills: {res.spill_stores} bytes stored, "
                            f"{res.spill_loads} bytes loaded per thread")
        if res.registers > limits["max_regs_per_thread"]:
            problems.append(f"{g.name} uses {res.registers} registers per thread, over "
                            f"{limits['max_regs_per_thread']}")
        if regs_block > limits["regs_per_block"]:
            problems.append(f"{g.name} needs {regs_block} registers per block "
                            f"({res.registers} x {threads} threads), over "
                            f"{limits['regs_per_block']}: the launch would fail")
        device_loop = record.coresident and record.shape.startswith("device_")
        if g.coresident and not device_loop:  # a tk-ram program: its grid must stay co-resident
            problems.extend(coresident_problems(g.name, threads, res.registers,
                                                res.smem_static + g.smem_bytes,
                                                g.grid[0] * g.grid[1] * g.grid[2], profile))
        if res.smem_static + g.smem_bytes > limits["smem_per_block"]:
            problems.append(f"{g.name} uses {res.smem_static + g.smem_bytes} bytes of shared "
                            f"memory, over {limits['smem_per_block']}")
        record = replace(record, resources=res.record())
        if device_loop and profile is not None:  # block-strided bodies: the grid shrinks to fit
            from tilekit.codegen.control import cap_grid
            record, problem = cap_grid(record, profile, res.registers)
            if problem:
                problems.append(problem)
        records.append(record)
    nvcc = find_nvcc()
    section = replace(section, kernels=tuple(records),
                      compiled={"arch": arch, "nvcc": nvcc_version(nvcc) if nvcc else "unknown",
                                "flags": "-O3 -std=c++17"})
    return CompileReport(replace(module, codegen=section.record()), tuple(problems),
                         compiled.command, compiled.cached)
