"""tk-roll: give every op of a tile-IR module its tiles (Roller) for a hardware profile.

    tk-import m.onnx | tk-roll --hw h100 | tk-codegen ...
    tk-roll m.yaml --hw v100 --top-k 10 -o m.rolled.yaml --report

The pass is `tilekit.roll.roll_module`; the tile contract it writes is docs/roll.md. `--report`
prints one row per op (tiles per level, grid, estimate, bound) on stderr only
(`tilekit.roll.schedule.report_rows`); `--report-format json` prints it as one JSON line.
"""

from __future__ import annotations

import click

from tilekit.cli.common import (Phases, dims_option, emit_report, format_option, hw_option,
                                input_argument, module_profile, output_option, print_table,
                                read_stage_input, report_format_option, time_passes_option,
                                tk_command, top_k_option, warn_dropped)

TOOL = "tk-roll"


@tk_command(TOOL)
@input_argument
@output_option
@format_option
@hw_option(required=False)
@top_k_option("op")
@click.option("--precision", type=click.Choice(["fp32", "tf32"]), default="fp32",
              show_default=True,
              help="fp32 contractions on CUDA cores (fp32), or on TF32 tensor cores (tf32: "
                   "10 mantissa bits per operand, fp32 accumulation). fp16/bf16 contractions "
                   "use tensor cores whenever the profile has them.")
@click.option("--report", is_flag=True,
              help="Print a table of ops, tiles, grids and estimates on stderr.")
@report_format_option
@time_passes_option
@dims_option
def main(input, output, fmt, hw, top_k, precision, report, report_format, time_passes, dim_flags,
         quiet, debug):
    """Tile every op of the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.ir import write_module
    from tilekit.ir.codec import rebase_files
    from tilekit.roll.schedule import roll_module

    phases = Phases(TOOL, quiet, time_passes)
    with phases.step("read"):
        module = read_stage_input(input, dim_flags)
    with phases.step("profile"):
        profile, hardware = module_profile(hw, module, input, output)
    with phases.step("roll", f"rolling {module.model}: {len(module.ops)} ops for "
                             f"{profile.name}"):
        rolled = roll_module(module, profile, top_k, hardware=hardware, precision=precision)
    warn_dropped(TOOL, module, rolled)
    with phases.step("write"):
        # read_stage_input noted the IR and the files it names: -o never overwrites them
        write_module(rebase_files(rolled, module, input, output), output, fmt)
    report = (report or report_format == "json") and not quiet
    if report:
        print_report(rolled, report_format, phases)
    if not (report and report_format == "json"):
        phases.print()
    return 0


def print_report(module, report_format: str | None = None, phases: Phases | None = None
                 ) -> None:
    """The report on stderr: a table (rich on a terminal, aligned plain text otherwise), or
    one JSON line."""
    from tilekit.roll.schedule import REPORT_COLUMNS, report_data, report_rows, report_title

    emit_report(TOOL, report_format,
                lambda: print_table(report_title(module), REPORT_COLUMNS, report_rows(module)),
                lambda: report_data(module), phases)


if __name__ == "__main__":  # pragma: no cover
    main()
