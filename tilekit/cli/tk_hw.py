"""tk-hw: list, show and validate hardware profiles (hwprofiles/*.yaml; docs/hwprofiles.md).

    tk-hw list                      one line per known profile
    tk-hw show h100                 every figure with its unit and source
    tk-hw validate FILE...          "ok: FILE" per good file; one located error per bad one, exit 2

Only parsing and printing live here; loading and checking are `tilekit.hw`.
"""

from __future__ import annotations

import json

import click

from tilekit import __version__
from tilekit.cli.common import (TkGroup, print_error, stdout_is_terminal, tk_command,
                                version_text)
from tilekit import limits
from tilekit.errors import EXIT_BAD_INPUT, ProfileError, TilekitError
from tilekit.fileio import read_bytes
from tilekit.hw import list_profiles, load_profile
from tilekit.hw.describe import SUMMARY_COLUMNS, figure_rows, identity_rows, summary_row
from tilekit.hw.registry import read_profile_text

TOOL = "tk-hw"


def _stdout_is_terminal() -> bool:
    # through tilekit.cli.common: a terminal with NO_COLOR set gets the plain table
    return stdout_is_terminal()


def _print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], title: str = "") -> None:
    """A rich table on a terminal; aligned plain text (stable for pipes and goldens) otherwise."""
    if _stdout_is_terminal():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(*columns, title=title or None, title_justify="left")
        for row in rows:
            # Text, not str: rich would read `memory[shared]` as markup and drop it.
            table.add_row(*(Text(cell) for cell in row))
        Console().print(table)
        return
    if title:
        click.echo(title)
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns) - 1)]
    for row in [columns, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths)] + [row[-1]]
        click.echo("  ".join(cells).rstrip())


@click.group(name=TOOL, cls=TkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(message=version_text(TOOL), version=__version__)
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """List, show and validate hardware profiles (hwprofiles/*.yaml).

    A profile is named by its file stem, its name or an alias (searched in
    $TILEKIT_HWPROFILES, then the shipped hwprofiles/), or given as a path.
    """
    if debug:
        # Each subcommand has its own --debug; `tk-hw --debug CMD` sets it for them all.
        ctx.default_map = {name: {"debug": True} for name in main.commands}


@tk_command(TOOL)
def list_command(quiet: bool, debug: bool) -> int:
    """One line per known profile: name, arch, kind, SMs, DRAM bandwidth, FP32 peak."""
    rows = [summary_row(p) for p in list_profiles()]
    _print_table(SUMMARY_COLUMNS, rows)
    return 0


@tk_command(TOOL)
@click.argument("profile", metavar="NAME|PATH")
@click.option("--json", "as_json", is_flag=True,
              help="Print the validated profile as JSON in base units (B, B/s, Hz, FLOP/s).")
def show_command(profile: str, as_json: bool, quiet: bool, debug: bool) -> int:
    """Every figure of one profile with its unit and source."""
    p = load_profile(profile)
    if as_json:
        click.echo(json.dumps(p.to_dict(), indent=2))
        return 0
    for key, value in identity_rows(p):
        click.echo(f"{key + ':':13} {value}")
    click.echo()
    _print_table(("FIELD", "VALUE", "SOURCE"), figure_rows(p))
    if p.references:
        click.echo()
        click.echo("sources:")
        for key, text in p.references.items():
            click.echo(f"  {key}: {text}")
    return 0


@tk_command(TOOL)
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
def validate_command(files: tuple[str, ...], quiet: bool, debug: bool) -> int:
    """Check profiles: "ok: FILE" on stdout per good file, one error line per bad one (exit 2).

    FILE may be `-` (stdin) or a profile name.
    """
    status = 0
    for name in files:
        try:
            if name == "-":
                data, origin = read_bytes("-", limits.PROFILE_BYTES, "profile")
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ProfileError(f"not UTF-8 text (byte {exc.start})", origin) from None
                read_profile_text(text, origin)
            else:
                load_profile(name)
        except TilekitError as exc:
            # Every bad file gets its line, so one run reports them all.
            print_error(TOOL, exc.message())
            status = EXIT_BAD_INPUT
            continue
        if not quiet:
            click.echo(f"ok: {name}")
    return status


main.add_command(list_command, name="list")
main.add_command(show_command, name="show")
main.add_command(validate_command, name="validate")


if __name__ == "__main__":  # pragma: no cover
    main()
