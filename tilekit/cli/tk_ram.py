"""tk-ram: place every kernel group's thread blocks (rTasks) on virtual execution units
(Rammer) and record the plan as the module's `program` section.

    tk-import m.onnx | tk-roll --hw h100 --top-k 4 | tk-ram | tk-codegen | tk-run ...
    tk-ram m.yaml --hw h100 --policy serial --svg serial.svg --report -o m.ram.yaml

The pass is `tilekit.ram.ram_module`; the program format and its verifier are
`tilekit.ir.program` (docs/ram.md). `--svg` draws the plan (vEUs x estimated time);
`--report` prints its figures on stderr (`--report-format json`: one JSON line); `--hw` with a
distributed profile (ipu) also reports the exchange volume between vEUs that the plan implies.
"""

from __future__ import annotations

import os

import click

from tilekit.cli.common import (Phases, dims_option, emit_report, format_option, hw_option,
                                input_argument, output_option, read_stage_input,
                                report_format_option, stderr_is_terminal, time_passes_option,
                                tk_command, warn_dropped)
from tilekit.errors import TilekitError
from tilekit.outputs import OutputSet

TOOL = "tk-ram"


@tk_command(TOOL)
@input_argument
@output_option
@format_option
@hw_option(required=False)
@click.option("--policy", type=click.Choice(["wavefront", "serial"]), default="wavefront",
              show_default=True,
              help="wavefront: the operators whose inputs are ready run side by side; serial: "
                   "one operator at a time (for comparison).")
@click.option("--svg", "svg", metavar="FILE", default=None,
              help="Also draw the plan: vEUs x estimated time, rTasks coloured by operator.")
@click.option("--report", is_flag=True, help="Print the plan's figures on stderr.")
@report_format_option
@time_passes_option
@dims_option
def main(input, output, fmt, hw, policy, svg, report, report_format, time_passes, dim_flags,
         quiet, debug):
    """Plan the rTasks of the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.hw import load_profile, load_recorded_profile, recorded_profile
    from tilekit.ir import write_module
    from tilekit.ir.codec import rebase_files
    from tilekit.ir.program import parse_program
    from tilekit.ram import ram_module

    phases = Phases(TOOL, quiet, time_passes)
    with phases.step("read"):
        module = read_stage_input(input, dim_flags)
    with phases.step("profile"):
        if hw:
            profile = load_profile(hw)
            hardware = recorded_profile(hw, profile, output)
        elif module.hardware:
            profile = load_recorded_profile(module.hardware, input, module.hardware_sha256)
            hardware = recorded_profile(os.path.abspath(profile.origin), profile, output)
        else:
            raise TilekitError("no hardware profile", "--hw",
                               "pass --hw NAME|PATH (e.g. --hw h100), or run tk-roll first")
    with phases.step("ram", f"planning {module.model}'s rTasks ({policy}) for "
                            f"{profile.name}"):
        from tilekit.codegen.cpu_ram import cpu_kernels
        planned = ram_module(module, profile, policy, hardware=profile.name,
                             cpu_kernels=cpu_kernels)
        if module.hardware is None:  # the first stage that needs a profile records it
            from dataclasses import replace
            planned = replace(planned, hardware=hardware,
                              hardware_sha256=profile.content_hash)
        program = parse_program(planned.program)
    warn_dropped(TOOL, module, planned)
    with OutputSet() as files:
        files.check(output, f"-o {output}" if output != "-" else "-o")
        if svg is not None:
            with phases.step("svg"):
                from tilekit.ram.svg import render
                files.put(svg, render(program, planned), f"--svg {svg}")
        with phases.step("write"):
            write_module(rebase_files(planned, module, input, output), output, fmt,
                         outputs=files)
            files.commit()
    report = (report or report_format == "json") and not quiet
    if report:
        emit_report(TOOL, report_format, lambda: print_report(planned, program, profile),
                    lambda: report_data(planned, program, profile), phases)
    if not (report and report_format == "json"):
        phases.print()
    return 0


def report_lines(module, program, profile) -> list[str]:
    est = program.estimate
    lines = [f"tk-ram: {module.model} on {program.hardware} ({program.policy}): "
             f"{program.tasks} rTasks of {len(program.operators)} operators, "
             f"{est['segments']} segments ({est['persistent_segments']} persistent, "
             f"{est['packed_operators']} operators packed), "
             + (f"up to {est['max_veus']} vEUs" if est['max_veus'] else
                "no vEUs (every operator runs as a kernel of its own)"),
             f"  estimated makespan {est['makespan_us']} us; serial policy "
             f"{est['serial_us']} us; one kernel per operator {est['per_op_kernels_us']} us "
             f"({est['per_op_launches']} launches of {program.launch_us} us: "
             f"{program.launch_source})"]
    others = [o for o in program.operators if o.variant]
    lines.append(f"  variants: {len(others)} of {len(program.operators)} operators run a runner-up "
                 "tile of tk-roll's top-k (the rest its first choice)")
    for s, seg in enumerate(program.segments):
        if seg.kind == "persistent":
            lines.append(f"  segment {s}: persistent, {len(seg.operators)} operators, "
                         f"{seg.veus} vEUs of {seg.threads} threads ({seg.residency})")
    if profile.kind == "distributed":
        from tilekit.ram.exchange import exchange_volume
        volume = exchange_volume(module, program)
        lines.append(f"  exchange between vEUs (tiles) the plan implies: "
                     f"{volume.bytes} bytes ({volume.describe()})")
    return lines


def report_data(module, program, profile) -> dict:
    """The plan's figures as data (tk-ram --report-format json)."""
    data = {"model": module.model, "hardware": program.hardware, "policy": program.policy,
            "rtasks": program.tasks, "operators": len(program.operators),
            "estimate": dict(program.estimate),
            "launch": {"us": program.launch_us, "source": program.launch_source},
            "variants": sum(1 for o in program.operators if o.variant),
            "segments": [{"kind": seg.kind, "operators": len(seg.operators),
                          **({"veus": seg.veus, "threads": seg.threads,
                              "residency": seg.residency} if seg.kind == "persistent" else {})}
                         for seg in program.segments]}
    if profile.kind == "distributed":
        from tilekit.ram.exchange import exchange_volume
        volume = exchange_volume(module, program)
        data["exchange_bytes"] = volume.bytes
    return data


def print_report(module, program, profile) -> None:
    lines = report_lines(module, program, profile)
    if stderr_is_terminal():
        from rich.console import Console
        console = Console(stderr=True, highlight=False)
        for line in lines:
            console.print(line, markup=False)
        return
    for line in lines:
        click.echo(line, err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
