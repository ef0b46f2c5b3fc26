"""tk-roll: give every op of a tile-IR module its tiles (Roller) for a hardware profile.

    tk-import m.onnx | tk-roll --hw h100 | tk-codegen ...
    tk-roll m.yaml --hw v100 --top-k 10 -o m.rolled.yaml --report

The pass is `tilekit.roll.roll_module`; the tile contract it writes is docs/roll.md. `--report`
prints one row per op (tiles per level, grid, estimate, bound) on stderr only.
"""

from __future__ import annotations

import click

from tilekit.cli.common import (format_option, hw_option, input_argument, output_option,
                                module_profile, print_table, tk_command, top_k_option)

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
def main(input, output, fmt, hw, top_k, precision, report, quiet, debug):
    """Tile every op of the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.ir import read_module, write_module
    from tilekit.ir.codec import rebase_files
    from tilekit.roll.schedule import roll_module

    module = read_module(input)
    profile, hardware = module_profile(hw, module, input, output)
    rolled = roll_module(module, profile, top_k, hardware=hardware, precision=precision)
    # read_module noted the IR and the files it names: -o never overwrites any of them
    write_module(rebase_files(rolled, module, input, output), output, fmt)
    if report and not quiet:
        print_report(rolled)
    return 0


def _sizes(sizes: dict) -> str:
    return " ".join(f"{a}{s}" for a, s in sizes.items()) or "-"


def report_rows(module) -> list[tuple[str, ...]]:
    """One row per op: name, thread tile, block tile, reduction step, grid, time, bound."""
    rows = []
    for op in module.ops:
        t = op.tile or {}
        est = t.get("estimate", {})
        rows.append((op.name, _sizes(t.get("thread", {})), _sizes(t.get("block", {})),
                     _sizes(t.get("step", {})), str(t.get("blocks", "")),
                     f"{est.get('time_us', 0):g}", str(est.get("bound", ""))))
    return rows


REPORT_COLUMNS = ("op", "thread", "block", "step", "blocks", "time_us", "bound")


def print_report(module) -> None:
    """The report table on stderr: rich on a terminal, aligned plain text otherwise."""
    from tilekit.roll.schedule import module_estimate

    total = module_estimate(module)
    title = (f"tk-roll: {module.model} on {module.hardware}: {len(module.ops)} ops, "
             f"{total['kernels']} kernels, estimated {total['time_us']:g} us")
    print_table(title, REPORT_COLUMNS, report_rows(module))


if __name__ == "__main__":  # pragma: no cover
    main()
