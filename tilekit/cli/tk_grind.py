"""tk-grind: place each control op (loop, branch, scan) on the device or the host (Cocktailer).

    tk-import m.onnx | tk-roll --hw h100 | tk-grind | tk-codegen --compile --strict
    tk-grind m.rolled.yaml --hw h100 --report -o m.ground.yaml

The pass is `tilekit.grind.grind_module`; docs/grind.md describes the decision. `--report`
prints one row per control op (placement, figures, why) on stderr only.
"""

from __future__ import annotations

import click

from tilekit.cli.common import (format_option, hw_option, input_argument, output_option,
                                print_table, read_stage_input, tk_command)
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
def main(input, output, fmt, hw, place, report, quiet, debug):
    """Place every control op of the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.grind.plan import REPORT_COLUMNS, grind_module, report_rows
    from tilekit.hw import load_profile, load_recorded_profile
    from tilekit.ir import write_module
    from tilekit.ir.codec import rebase_files

    module = read_stage_input(input)
    if hw:
        profile = load_profile(hw)
    elif module.hardware:
        profile = load_recorded_profile(module.hardware, input)
    else:
        raise TilekitError("no hardware profile", "--hw",
                           "pass --hw NAME|PATH, or run tk-roll --hw first (it records one)")
    ground = grind_module(module, profile, place)
    write_module(rebase_files(ground, module, input, output), output, fmt)
    if report and not quiet:
        rows = report_rows(ground)
        title = (f"tk-grind: {ground.model} on {profile.name}: {len(rows)} control op(s), "
                 f"{sum(r[2] == 'device' for r in rows)} on the device")
        print_table(title, REPORT_COLUMNS, rows)
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
