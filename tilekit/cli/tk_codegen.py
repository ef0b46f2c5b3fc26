"""tk-codegen: generate one kernel per kernel group of a tile-IR module, for CUDA or a CPU.

    tk-import m.onnx | tk-roll --hw h100 | tk-codegen | tk-run --device cuda
    tk-codegen m.yaml --hw a100 --compile --strict -o m.cuda.yaml --emit-dir build/m
    tk-import m.onnx | tk-codegen --target cpu | tk-run --check
    tk-import m.onnx | tk-roll --hw milan | tk-codegen | tk-run --check

A module rolled for a CPU profile (`kind: cpu`: its op tiles are CPU schedules, `target: cpu`)
is generated for the CPU by default, from its recorded tiles and with its recorded profile;
`--target cuda` on it is an error (exit 2), and so is `--hw` naming another profile.

Every kernel is a tile program (tilekit.tile) printed by the target's printer. The pass is
`tilekit.codegen.generate`; the `codegen` section it adds (kernel sources, launch geometry,
arguments, and with `--compile` ptxas' resources) is documented in docs/codegen.md.
Notes (a group split into several kernels, a shrunk reduction step) and `--compile` problems
(spills, limits) are warnings on stderr; `--strict` makes the problems errors (exit 2).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from tilekit.cli.common import (Phases, dims_option, emit_report, format_option, input_argument,
                                output_option, print_table, read_stage_input, report_format_option,
                                time_passes_option, tk_command, warn, warn_dropped)
from tilekit.errors import TilekitError
from tilekit.fileio import check_path
from tilekit.outputs import OutputSet

TOOL = "tk-codegen"


@tk_command(TOOL)
@input_argument
@output_option
@format_option
@click.option("--hw", "hw", metavar="NAME|PATH", default=None,
              help="Hardware profile (default: the IR's 'hardware'); sets the arch and the "
                   "shared-memory and register limits.")
@click.option("--target", type=click.Choice(["cuda", "cpu"]), default=None,
              help="The code to generate: CUDA C++ for NVIDIA GPUs, or C++ for CPUs (OpenMP "
                   "over the grid; tk-run --device cpu runs it). Default: cpu for a module "
                   "rolled for a CPU profile (or --hw naming one), else cuda.")
@click.option("--arch", metavar="sm_XY", default=None,
              help="CUDA arch recorded in the IR and used by --compile (default: the "
                   "profile's, else sm_90).")
@click.option("--emit-dir", "emit_dir", metavar="DIR", default=None,
              help="Also write each kernel as DIR/<entry>.cu (.cpp for the CPU), with the "
                   "headers it includes, for reading.")
@click.option("--compile", "compile_", is_flag=True,
              help="Compile every kernel: with nvcc for the arch, recording ptxas' registers, "
                   "shared memory and spills in the IR; for the CPU with the C++ compiler "
                   "(cached for tk-run).")
@click.option("--strict", is_flag=True,
              help="With --compile: a kernel that spills or exceeds the profile's limits is an "
                   "error, not a warning.")
@click.option("--report", is_flag=True,
              help="Print a table of the kernels (shape, grid, block, shared memory; with "
                   "--compile ptxas' resources) on stderr.")
@report_format_option
@time_passes_option
@dims_option
def main(input, output, fmt, hw, target, arch, emit_dir, compile_, strict, report,
         report_format, time_passes, dim_flags, quiet, debug):
    """Generate kernels for the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.codegen.module import run_codegen
    from tilekit.codegen.nvcc import check_arch
    from tilekit.ir.codec import rebase_files, write_module

    if strict and not compile_:
        raise TilekitError("--strict needs --compile", "--strict",
                           "add --compile, or drop --strict")
    check_cpu_flags(target, arch, strict)
    if arch is not None:
        check_arch(arch)
    if emit_dir is not None:
        check_path(emit_dir, f"--emit-dir {emit_dir}")
    if emit_dir and Path(emit_dir).exists() and not Path(emit_dir).is_dir():
        raise TilekitError("exists and is not a folder", f"--emit-dir {emit_dir}",
                           "give a folder name")
    phases = Phases(TOOL, quiet, time_passes)
    with phases.step("read"):
        module = read_stage_input(input, dim_flags)
    with phases.step("profile"):
        profile = None
        if hw:
            from tilekit.hw import load_profile
            profile = load_profile(hw)
        elif module.hardware:
            from tilekit.hw import load_recorded_profile
            profile = load_recorded_profile(module.hardware, input if input != "-" else None,
                                            module.hardware_sha256)
        target = cpu_target(module, profile, hw, target)
        check_cpu_flags(target, arch, strict)
        if profile is not None and arch is None and target == "cuda":
            no_cuda_arch(profile, "--hw" if hw else "hardware")
    tool = "nvcc" if target == "cuda" else "the C++ compiler"
    label = (f"generating and compiling {module.model}'s {len(module.kernels) or len(module.ops)}"
             f" kernels with {tool}" if compile_ else None)  # generating alone takes a moment
    with phases.step("codegen", label):
        result = run_codegen(module, profile, arch, compile=compile_, target=target)
    warn_dropped(TOOL, module, result.module)
    if not quiet:
        for note in result.notes:
            warn(TOOL, note)
    if result.problems:
        if strict:
            raise TilekitError(f"{len(result.problems)} kernel problem(s): "
                               + "; ".join(result.problems), "--strict",
                               "re-run the stage that shaped the kernel (tk-roll's tile, "
                               "tk-weld's group, tk-grind's or tk-ram's grid), or drop --strict")
        for problem in result.problems:
            warn(TOOL, problem)
    out = result.module
    # The IR and every source become visible together, or none of them (tilekit.outputs);
    # no output may be a file this command read (the input IR, its sidecars, the profile).
    created = emit_dir is not None and not Path(emit_dir).exists()
    try:
        with OutputSet() as files, phases.step("write"):
            files.check(output, f"-o {output}" if output != "-" else "-o")
            if emit_dir is not None:
                stage_sources(files, result.kernels, Path(emit_dir), target)
            write_module(rebase_files(out, module, input, output), output, fmt, outputs=files)
            files.commit()
    except BaseException:
        if created:  # a folder made for this run goes too, when nothing was written into it
            with contextlib.suppress(OSError):
                Path(emit_dir).rmdir()
        raise
    report = (report or report_format == "json") and not quiet
    if report:
        emit_report(TOOL, report_format, lambda: print_table(*report_table(result, profile)),
                    lambda: report_data(result, profile), phases)
    if not (report and report_format == "json"):
        phases.print()
    return 0


#: The launch figures the kernel table shows first (a kernel's other launch keys follow in
#: the JSON report).
_LAUNCH = ("shape", "grid", "block", "smem_bytes")


def report_data(result, profile=None) -> dict:
    """What tk-codegen made, as data: the arch, each kernel group's launch record (with
    --compile, ptxas' resources as recorded), the notes and the problems; for CUDA, each
    generated kernel's counters from the tile interpreter on sampled blocks (coalescing, bank
    conflicts, work per unit: tilekit.codegen.report)."""
    from tilekit.codegen.report import kernel_reports

    module = result.module
    section = module.codegen or {}
    data = {"model": module.model, "hardware": module.hardware, "arch": section.get("arch"),
            "target": section.get("target", "cuda"),
            "kernels": [{"kernel": k.name, "ops": list(k.ops), **dict(k.launch or {}),
                         **_tile_schedule(result.kernels, k.name)}
                        for k in module.kernels],
            "notes": list(result.notes), "problems": list(result.problems)}
    if data["target"] == "cuda":
        compiled = {k.get("entry"): (k.get("resources") or {}).get("registers")
                    for k in section.get("kernels", ())}
        data["counters"] = kernel_reports(result.kernels, profile,
                                          {e: r for e, r in compiled.items() if r})
    return data


def _tile_schedule(kernels, group: str) -> dict:
    """A group's kernels' work split as their schedules record it: a wgmma kernel's tiles
    per block (tilekit.schedule.mma.WgmmaPlan.record), e.g. `{"tiles": "512 on 132 blocks,
    persistent"}`; a split-K kernel's reduction slices (a staged one's:
    tilekit.schedule.shape.StagedSplit; a wgmma one's), e.g. `{"split_k": "4 slices of 3
    steps of c"}`; nothing for the other kernels."""
    out: dict = {}
    for g in kernels:
        if g.group != group:
            continue
        wgmma = g.schedule.get("wgmma") or {}
        sched = wgmma.get("schedule")
        if sched:
            out["tiles"] = (f"{sched['tiles']} on {sched['blocks']} blocks"
                            + (", persistent" if sched["persistent"] else ""))
        split = g.schedule.get("split_k") or wgmma.get("split_k")
        if isinstance(split, dict) and split.get("slices", 1) > 1:
            out["split_k"] = (f"{split['slices']} slices of {split['steps']} steps"
                              + (f" of {split['axis']}" if split.get("axis") else ""))
    return out


def report_table(result, profile=None) -> tuple[str, tuple[str, ...], list[tuple[str, ...]]]:
    data = report_data(result, profile)
    counters = data.get("counters", {})
    entries = {k.entry: k.name for k in result.kernels}
    rows = []
    for k in data["kernels"]:
        extra = {key: v for key, v in k.items() if key not in ("kernel", "ops", "entries",
                                                                *_LAUNCH)}
        first = next((entries[e] for e in k.get("entries", ()) if e in entries), None)
        c = counters.get(first, {}) if first else {}
        rows.append((k["kernel"], str(len(k["ops"])), str(k.get("shape", "")),
                     "x".join(map(str, k.get("grid", []))),
                     "x".join(map(str, k.get("block", []))), str(k.get("smem_bytes", "")),
                     _fraction(c.get("coalescing")), _fraction(c.get("bank_conflict_degree")),
                     _fraction((c.get("estimate") or {}).get("time_us")),
                     " ".join(f"{key} {v}" for key, v in extra.items())))
    title = (f"tk-codegen: {data['model']} for {data['arch']}: {len(rows)} kernel groups, "
             f"{len(data['notes'])} notes, {len(data['problems'])} problems"
             + ("; coalescing (1.0 best) and bank-conflict degree (1.0 best) from the tile "
                "interpreter on each kernel's first and last blocks" if counters else ""))
    return title, ("kernel", "ops", "shape", "grid", "block", "smem", "coalesced",
                   "conflicts", "est_us", "other"), rows


def _fraction(value) -> str:
    return "" if value is None else f"{value:.2f}"


def check_cpu_flags(target: str | None, arch: str | None, strict: bool) -> None:
    """Flags the CPU target has no use for."""
    if arch is not None and target == "cpu":
        raise TilekitError("--arch names a CUDA arch; the CPU target has none", "--arch",
                           "drop --arch, or use --target cuda")
    if strict and target == "cpu":
        raise TilekitError("--strict checks ptxas' resources; the CPU target has none",
                           "--strict", "drop --strict, or use --target cuda")


def cpu_target(module, profile, hw: str | None, target: str | None) -> str:
    """The target: as given, else cpu for a module rolled for a CPU profile or a CPU `--hw`,
    else cuda. A module rolled for a CPU profile takes no other profile (its tiles are that
    CPU's) and no CUDA (`tilekit.codegen.module.refuse_cpu_module`)."""
    from tilekit.codegen.module import refuse_cpu_module
    from tilekit.ir.payloads import cpu_rolled

    rolled = cpu_rolled(module)
    if rolled and hw and profile is not None and module.hardware_sha256 not in (
            None, profile.content_hash):
        raise TilekitError(f"the module is rolled for CPU profile '{module.hardware}', and its "
                           f"tiles are that CPU's; '{profile.name}' is another profile", "--hw",
                           f"drop --hw, or re-run tk-roll --hw {hw} first")
    if target is None:
        return "cpu" if rolled or (profile is not None and profile.is_cpu) else "cuda"
    if target == "cuda":
        refuse_cpu_module(module, profile)
    return target


def no_cuda_arch(profile, where: str) -> None:
    """Refuse a profile with no CUDA arch (an IPU-like machine) before generating: say what it
    is and what to do, rather than what an `sm_XY` looks like."""
    from tilekit.hw.profile import compute_capability

    if compute_capability(profile.arch) is not None:
        return
    try:
        from tilekit.hw import list_profiles
        nvidia = [p.name for p in list_profiles() if compute_capability(p.arch) is not None]
    except TilekitError:
        nvidia = []
    names = f" ({', '.join(nvidia)})" if nvidia else ""
    raise TilekitError(f"hardware profile '{profile.name}' ({profile.vendor} {profile.arch}, "
                       f"{profile.kind}) has no CUDA arch, and tk-codegen generates CUDA for "
                       "NVIDIA GPUs", where,
                       f"pass --hw with an NVIDIA profile{names}, after tk-roll --hw with the "
                       "same one so that the tiles fit it; or --arch sm_XY to generate for "
                       "that arch within this profile's limits")


def stage_sources(files, kernels, folder: Path, target: str = "cuda") -> None:
    """Stage each kernel's source as <entry>.cu (.cpp for the CPU), plus the headers it
    includes, in `files`. An entry is an identifier (`tilekit.ir.names`), so each file lands
    in `folder` and nowhere else."""
    from tilekit.codegen.helpers import CPU_HEADERS, HELPERS, HELPERS_NAME
    from tilekit.ir.names import IDENTIFIER

    where = f"--emit-dir {folder}"
    check_path(str(folder), where)
    if folder.exists() and not folder.is_dir():
        raise TilekitError("exists and is not a folder", where, "give a folder name")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TilekitError(f"cannot create the folder: {exc.strerror}", where) from None
    headers = CPU_HEADERS if target == "cpu" else (HELPERS,)
    for path in headers:
        files.put(str(folder / path.name), path.read_text(encoding="utf-8"),
                  f"{where}: {path.name}", follow_links=False)
    from tilekit.tile.text import format_kernel

    suffix = ".cpp" if target == "cpu" else ".cu"
    for k in kernels:
        if not IDENTIFIER.match(k.entry) or len(k.entry) > 250:  # a bug if ever true
            raise RuntimeError(f"kernel entry {k.entry[:60]!r}... is not a file name")
        files.put(str(folder / f"{k.entry}{suffix}"), k.source, f"{where}: {k.entry}{suffix}",
                  follow_links=False)
        text = ("# the tile program as built\n" + format_kernel(k.built or k.program)
                + f"\n# lowered for {target}\n" + format_kernel(k.program))
        files.put(str(folder / f"{k.entry}.tile"), text, f"{where}: {k.entry}.tile",
                  follow_links=False)


if __name__ == "__main__":  # pragma: no cover
    main()
