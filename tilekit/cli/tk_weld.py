"""tk-weld: group the ops of a tile-IR module into fused kernels (Welder) for a profile.

    tk-import m.onnx | tk-roll --hw h100 | tk-weld | tk-codegen ...
    tk-weld m.rolled.yaml --top-k 5 --max-group 8 --no-fuse conv1 --report -o m.welded.yaml

The pass is `tilekit.weld.weld_module`; the group payload it writes is docs/weld.md.
`--report` prints a table per group and the model's totals on stderr only
(`--report-format json`: one JSON line).
"""

from __future__ import annotations

import click

from tilekit.cli.common import (Phases, dims_option, emit_report, format_option, hw_option,
                                input_argument, module_profile, output_option, print_table,
                                read_stage_input, report_format_option, time_passes_option,
                                tk_command, top_k_option, warn_dropped)

TOOL = "tk-weld"


def _op_list(ctx, param, value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    names = tuple(n.strip() for n in value.split(","))
    if any(not n for n in names):
        raise click.BadParameter("an empty op name; give names separated by commas",
                                 ctx=ctx, param=param)
    return names


@tk_command(TOOL)
@input_argument
@output_option
@format_option
@hw_option(required=False)
@top_k_option("group")
@click.option("--max-group", "max_group", type=click.IntRange(min=1, max=256), default=16,
              show_default=True, metavar="N", help="At most N ops per kernel group.")
@click.option("--no-fuse", "no_fuse", callback=_op_list, metavar="OP,...",
              help="Ops (by name) that run as kernels of their own.")
@click.option("--report", is_flag=True,
              help="Print a table per group and the totals (kernels, DRAM bytes, estimated "
                   "time, before and after) on stderr.")
@report_format_option
@time_passes_option
@dims_option
def main(input, output, fmt, hw, top_k, max_group, no_fuse, report, report_format,
         time_passes, dim_flags, quiet, debug):
    """Group the ops of the tile IR module IR (a file, or '-'/nothing for stdin) into
    kernels whose intermediates stay on chip."""
    from tilekit.ir import write_module
    from tilekit.ir.codec import rebase_files
    from tilekit.weld import weld_module

    phases = Phases(TOOL, quiet, time_passes)
    with phases.step("read"):
        module = read_stage_input(input, dim_flags)
    with phases.step("profile"):
        profile, hardware = module_profile(hw, module, input, output)
    with phases.step("weld", f"welding {module.model}: {len(module.ops)} ops for "
                             f"{profile.name}"):
        welded = weld_module(module, profile, top_k, max_group, no_fuse, hardware=hardware)
    warn_dropped(TOOL, module, welded)
    with phases.step("write"):
        write_module(rebase_files(welded, module, input, output), output, fmt)
    report = (report or report_format == "json") and not quiet
    if report:
        print_report(welded, report_format, phases)
    if not (report and report_format == "json"):
        phases.print()
    return 0


def print_report(module, report_format: str | None = None, phases: Phases | None = None
                 ) -> None:
    """The group table and the totals on stderr (tilekit.weld.report), or one JSON line."""
    from tilekit.weld.report import COLUMNS, report_data, report_rows, summary

    emit_report(TOOL, report_format,
                lambda: print_table(summary(module), COLUMNS, report_rows(module)),
                lambda: report_data(module), phases)


if __name__ == "__main__":  # pragma: no cover
    main()
