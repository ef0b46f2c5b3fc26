"""tk-weld: group the ops of a tile-IR module into fused kernels (Welder) for a profile.

    tk-import m.onnx | tk-roll --hw h100 | tk-weld | tk-codegen ...
    tk-weld m.rolled.yaml --top-k 5 --max-group 8 --no-fuse conv1 --report -o m.welded.yaml

The pass is `tilekit.weld.weld_module`; the group payload it writes is docs/weld.md.
`--report` prints a table per group and the model's totals on stderr only.
"""

from __future__ import annotations

import click

from tilekit.cli.common import (format_option, hw_option, input_argument, module_profile,
                                output_option, print_table, read_stage_input, tk_command,
                                top_k_option)

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
def main(input, output, fmt, hw, top_k, max_group, no_fuse, report, quiet, debug):
    """Group the ops of the tile IR module IR (a file, or '-'/nothing for stdin) into
    kernels whose intermediates stay on chip."""
    from tilekit.ir import write_module
    from tilekit.ir.codec import rebase_files
    from tilekit.weld import weld_module

    module = read_stage_input(input)
    profile, hardware = module_profile(hw, module, input, output)
    welded = weld_module(module, profile, top_k, max_group, no_fuse, hardware=hardware)
    write_module(rebase_files(welded, module, input, output), output, fmt)
    if report and not quiet:
        print_report(welded)
    return 0


def print_report(module) -> None:
    """The group table and the totals on stderr (tilekit.weld.report)."""
    from tilekit.weld.report import COLUMNS, report_rows, summary

    print_table(summary(module), COLUMNS, report_rows(module))


if __name__ == "__main__":  # pragma: no cover
    main()
