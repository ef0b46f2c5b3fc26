"""tk-weld: group the ops of a tile-IR module into fused kernels (Welder) for a profile.

    tk-import m.onnx | tk-roll --hw h100 | tk-weld | tk-codegen ...
    tk-weld m.rolled.yaml --top-k 5 --max-group 8 --no-fuse conv1 --report -o m.welded.yaml

The pass is `tilekit.weld.weld_module`; the group payload it writes is docs/weld.md.
`--report` prints a table per group and the model's totals on stderr only.
"""

from __future__ import annotations

import os

import click

from tilekit.cli.common import (format_option, hw_option, input_argument, output_option,
                                stderr_is_terminal, tk_command)
from tilekit.errors import TilekitError

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
@click.option("--top-k", "top_k", type=click.IntRange(min=1, max=64), default=1,
              show_default=True, metavar="K",
              help="Keep the K best tiles per group (the best is used; the next K-1 are "
                   "listed under tile.candidates).")
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
    from tilekit.hw import load_profile, load_recorded_profile, recorded_profile
    from tilekit.ir import read_module, write_module
    from tilekit.weld import weld_module

    module = read_module(input)
    if hw:
        profile = load_profile(hw)
        hardware = recorded_profile(hw, profile, output)
    elif module.hardware:
        profile = load_recorded_profile(module.hardware, input)
        hardware = recorded_profile(os.path.abspath(profile.origin), profile, output)
    else:
        raise TilekitError("no hardware profile", "--hw",
                           "pass --hw NAME|PATH (e.g. --hw h100), or roll the module first; "
                           "'tk-hw list' shows the names")
    welded = weld_module(module, profile, top_k, max_group, no_fuse, hardware=hardware)
    write_module(welded, output, fmt)
    if report and not quiet:
        print_report(welded)
    return 0


def print_report(module) -> None:
    """The group table and the totals on stderr: rich on a terminal, plain text otherwise."""
    from tilekit.weld.report import COLUMNS, report_rows, summary

    rows = report_rows(module)
    title = summary(module)
    if stderr_is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(*COLUMNS, title=title, title_justify="left")
        for row in rows:
            table.add_row(*row)
        Console(stderr=True).print(table)
        return
    click.echo(title, err=True)
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    for row in [COLUMNS, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
