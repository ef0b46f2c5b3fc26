"""tk-grind: place each control op (loop, branch, scan) on the device or the host (Cocktailer).

    tk-import m.onnx | tk-roll --hw h100 | tk-grind | tk-codegen --compile --strict
    tk-grind m.rolled.yaml --hw h100 --report -o m.ground.yaml
    tk-import m.onnx | tk-roll --hw icelake | tk-grind | tk-codegen | tk-run   # on a CPU:
                                           # device loops run inside the compiled library

The pass is `tilekit.grind.grind_module`; docs/grind.md describes the decision. `--report`
prints one row per control op (placement, figures, why) on stderr only.
"""

from __future__ import annotations

import click

from tilekit.cli.common import (Phases, dims_option, emit_report, format_option, hw_option,
                                input_argument, output_option, print_table, read_stage_input,
                                report_format_option, time_passes_option, tk_command, warn_dropped)
from tilekit.errors import TilekitError

TOOL = "tk-grind"


@tk_command(TOOL)
@input_argument
@output_option
@format_option
@hw_option(required=False)
@click.option("--place", type=click.Choice(["auto", "host", "device"]), default="auto",
              show_default=True, help="auto: the cost model decides; host or device force the "
                                      "placement (device only where it can be made).")
@click.option("--report", is_flag=True,
              help="Print a table of control ops, placements and estimates on stderr.")
@report_format_option
@time_passes_option
@dims_option
def main(input, output, fmt, hw, place, report, report_format, time_passes, dim_flags,
         quiet, debug):
    """Place every control op of the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.grind.plan import grind_module
    from tilekit.hw import load_profile, load_recorded_profile
    from tilekit.ir import write_module
    from tilekit.ir.codec import rebase_files

    phases = Phases(TOOL, quiet, time_passes)
    with phases.step("read"):
        module = read_stage_input(input, dim_flags)
    with phases.step("profile"):
        if hw:
            profile = load_profile(hw)
        elif module.hardware:
            profile = load_recorded_profile(module.hardware, input, module.hardware_sha256)
        else:
            raise TilekitError("no hardware profile", "--hw",
                               "pass --hw NAME|PATH, or run tk-roll --hw first (it records one)")
    with phases.step("grind", f"placing {module.model}'s control ops for {profile.name}"):
        ground = grind_module(module, profile, place)
    warn_dropped(TOOL, module, ground)
    with phases.step("write"):
        write_module(rebase_files(ground, module, input, output), output, fmt)
    report = (report or report_format == "json") and not quiet
    if report:
        print_report(ground, profile, report_format, phases)
    if not (report and report_format == "json"):
        phases.print()
    return 0


def print_report(module, profile, report_format: str | None = None,
                 phases: Phases | None = None) -> None:
    """One row per control op on stderr (tilekit.grind.plan.report_rows), or one JSON line."""
    from tilekit.grind.plan import REPORT_COLUMNS, report_rows
    from tilekit.ir.control import walk

    def text() -> None:
        rows = report_rows(module)
        title = (f"tk-grind: {module.model} on {profile.name}: {len(rows)} control op(s), "
                 f"{sum(r[2] == 'device' for r in rows)} on the device")
        print_table(title, REPORT_COLUMNS, rows)

    def data() -> dict:
        return {"model": module.model, "hardware": profile.name,
                "control": [{"op": path, "kind": rec.kind, "run": (rec.grind or {}).get("run"),
                             "why": (rec.grind or {}).get("why"),
                             "estimate": (rec.grind or {}).get("estimate", {})}
                            for path, rec, _ in walk(module)]}

    emit_report(TOOL, report_format, text, data, phases)


if __name__ == "__main__":  # pragma: no cover
    main()
