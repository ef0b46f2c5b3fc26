"""tk-hw: list, show, validate and probe hardware profiles (hwprofiles/*.yaml; docs/hwprofiles.md).

    tk-hw list                      one line per known profile
    tk-hw show h100                 every figure with its unit and source
    tk-hw validate FILE...          "ok: FILE" per good file; one located error per bad one, exit 2
    tk-hw probe -o mine.yaml        measure the GPU in hand (the CPU without one) into a profile
    tk-hw probe --cpu -o cpu.yaml   measure the CPU in hand into a kind: cpu profile

Only parsing and printing live here; loading and checking are `tilekit.hw`, measuring
`tilekit.runtime.probe` (a CPU: `tilekit.runtime.probe_cpu`), and turning measurements into a
profile `tilekit.hw.probe_profile` (a CPU's: `tilekit.hw.probe_cpu_profile`).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from tilekit import __version__
from tilekit import limits
from tilekit.cli.common import (TkGroup, output_option, print_error, stderr_is_terminal,
                                stdout_is_terminal, tk_command, version_text, warn,
                                write_output)
from tilekit.errors import EXIT_BAD_INPUT, ProfileError, TilekitError
from tilekit.fileio import read_bytes
from tilekit.hw import load_profile
from tilekit.hw.describe import SUMMARY_COLUMNS, figure_rows, identity_rows, summary_row
from tilekit.hw.registry import display_path, is_path, read_profile_text, resolve

TOOL = "tk-hw"


def _stdout_is_terminal() -> bool:
    # through tilekit.cli.common: a terminal with NO_COLOR set gets the plain table
    return stdout_is_terminal()


def _print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], title: str = "",
                 err: bool = False) -> None:
    """A rich table on a terminal; aligned plain text (stable for pipes and goldens) otherwise.
    On stderr with `err`."""
    if stderr_is_terminal() if err else _stdout_is_terminal():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(*columns, title=title or None, title_justify="left")
        for row in rows:
            # Text, not str: rich would read `memory[shared]` as markup and drop it.
            table.add_row(*(Text(cell) for cell in row))
        Console(stderr=err).print(table)
        return
    if title:
        click.echo(title, err=err)
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns) - 1)]
    for row in [columns, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths)] + [row[-1]]
        click.echo("  ".join(cells).rstrip(), err=err)


@click.group(name=TOOL, cls=TkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(message=version_text(TOOL), version=__version__)
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """List, show, validate and probe hardware profiles (hwprofiles/*.yaml).

    A profile is named by its file stem, its name or an alias (searched in
    $TILEKIT_HWPROFILES, then the shipped hwprofiles/), or given as a path.
    """
    if debug:
        # Each subcommand has its own --debug; `tk-hw --debug CMD` sets it for them all.
        ctx.default_map = {name: {"debug": True} for name in main.commands}


@tk_command(TOOL)
def list_command(quiet: bool, debug: bool) -> int:
    """One line per profile file: name, arch, kind, SMs, DRAM bandwidth, FP32 peak, file,
    aliases. A file whose name another file answers to first is marked, with a note."""
    from tilekit.hw.registry import display_path, listing

    entries = listing()
    rows = []
    for e in entries:
        name, arch, kind, sms, dram, fp32, aliases = summary_row(e.profile)
        marked = f"{name} (shadowed)" if e.shadowed_by is not None else name
        rows.append((marked, arch, kind, sms, dram, fp32, e.file(), aliases))
    columns = (*SUMMARY_COLUMNS[:-1], "FILE", SUMMARY_COLUMNS[-1])
    _print_table(columns, rows)
    for e in entries:
        if e.shadowed_by is not None:
            winner = next((w.file() for w in entries if w.path == e.shadowed_by),
                          display_path(e.shadowed_by))
            click.echo(f"note: '{e.profile.name}' names {winner} and {e.file()}; --hw "
                       f"{e.profile.name} loads {winner} (pass a path for the other)")
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

    FILE may be `-` (stdin) or a profile name. A profile whose name differs from its file's
    stem gets a warning on stderr (another file may answer to that name first).
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
                profile = load_profile(name)
                path = Path(name) if is_path(name) else resolve(name)
                if profile.name.lower() != path.stem.lower():
                    warn(TOOL, f"{display_path(path)}: name '{profile.name}' differs from the "
                               f"file name '{path.stem}': --hw {profile.name} may load another "
                               f"file ('tk-hw list' shows which); make them the same")
        except TilekitError as exc:
            # Every bad file gets its line, so one run reports them all.
            print_error(TOOL, exc.message())
            status = EXIT_BAD_INPUT
            continue
        if not quiet:
            click.echo(f"ok: {name}")
    return status


def _profile_path(profile: str) -> Path:
    """The file a --base NAME|PATH stands for, validated and fit for a probe."""
    from tilekit.hw.probe_profile import check_base

    check_base(load_profile(profile))
    return Path(profile) if is_path(profile) else resolve(profile)


def _measure(device, quick: bool, quiet: bool) -> dict:
    """`probe.measure`, with a spinner naming the benchmark on a terminal."""
    from tilekit.runtime import probe

    if quiet or not stderr_is_terminal():
        return probe.measure(device, quick=quick)
    from rich.console import Console

    title = f"probing {device.describe()}"
    with Console(stderr=True).status(title) as status:
        return probe.measure(device, quick=quick,
                             progress=lambda label: status.update(f"{title}: {label}"))


def _open_device(cpu: bool, gpu: bool, base: str | None, quiet: bool):
    """The device to probe: the CPU with --cpu; the GPU with --gpu or --base (a GPU profile);
    otherwise the GPU when CuPy sees one, else the CPU (with a warning saying why)."""
    from tilekit.runtime import probe

    if cpu:
        from tilekit.runtime.probe_cpu import open_cpu
        return open_cpu()
    try:
        return probe.open_device()
    except TilekitError as exc:
        if gpu or base:
            raise
        from tilekit.runtime.probe_cpu import open_cpu
        if not quiet:
            warn(TOOL, f"no GPU to probe ({exc.what}): probing the CPU (--cpu says so; --gpu "
                       "makes a missing GPU an error)")
        return open_cpu()


@tk_command(TOOL)
@output_option
@click.option("--base", metavar="NAME|PATH", default=None,
              help="GPU: the profile to start from (default: the shipped profile of the "
                   "device's arch, else h100). Not with --cpu.")
@click.option("--cpu", "cpu", is_flag=True,
              help="Probe the CPU in hand (the default on a machine without a GPU).")
@click.option("--gpu", "gpu", is_flag=True,
              help="Probe the GPU; without one, exit 2 instead of probing the CPU.")
@click.option("--quick", is_flag=True,
              help="Fewer and shorter repetitions: about 4x faster (GPU), 6x (CPU), noisier.")
def probe_command(output: str, base: str | None, cpu: bool, gpu: bool, quick: bool, quiet: bool,
                  debug: bool) -> int:
    """Measure the GPU in hand, or the CPU, and write its hardware profile (YAML).

    GPU: micro-benchmarks (DRAM, L2, shared memory, FP32 FMA, tensor cores, kernel launch) and
    device attributes replace the base profile's figures; needs CuPy and an NVIDIA GPU. CPU
    (--cpu, or no GPU): cores and caches from the system, streaming reads per cache level and
    DRAM, FMA, the clock and OpenMP fork/join measured by kernels built with g++ -march=native
    -fopenmp; every figure of the kind: cpu profile is measured or derived. Sources say
    'measured: tk-hw probe ...' or 'derived: ...'. A table of the measurements goes to stderr
    (docs/hwprofiles.md, "Probing a device" and "Probing a CPU").
    """
    from tilekit.hw.probe_profile import (check_base, default_base, measurement_rows,
                                          probed_profile)

    if cpu and (gpu or base):
        raise TilekitError(f"--cpu with {'--gpu' if gpu else '--base'}", "--cpu",
                           "the CPU probe starts from no base profile: drop --base and --gpu to "
                           "probe the CPU, or --cpu to probe the GPU")
    # A bad --base fails before the measuring, and before looking for a GPU.
    base_path = _profile_path(base) if base else None
    device = _open_device(cpu, gpu, base, quiet)
    if getattr(device, "kind", None) == "cpu":
        from tilekit.hw.probe_cpu_profile import probed_cpu_profile

        measurements = _measure(device, quick, quiet)
        text = probed_cpu_profile(measurements)
        write_output(output, text)
        title = f"{device.describe()}, {measurements['date']}"
    else:
        base_path = base_path or default_base(device.arch)
        base_profile = check_base(load_profile(base_path))
        base_text = base_path.read_text(encoding="utf-8")
        if base_profile.compute_capability != device.compute_capability:
            warn(TOOL, f"the base profile {base_profile.name} is for {base_profile.arch}, the "
                       f"device is {device.arch}: figures the probe does not measure (peaks per "
                       "dtype, mma shapes, registers per thread) still describe the base; "
                       "check them")
        measurements = _measure(device, quick, quiet)
        text = probed_profile(measurements, base_text, display_path(base_path))
        write_output(output, text, input_path=str(base_path))
        title = f"{device.describe()}, {measurements['date']}, base {base_profile.name}"
    for note in measurements["notes"]:
        warn(TOOL, note)
    if not quiet:
        _print_table(("MEASURED", "VALUE", "HOW"), measurement_rows(measurements), title=title,
                     err=True)
    return 0


main.add_command(list_command, name="list")
main.add_command(show_command, name="show")
main.add_command(validate_command, name="validate")
main.add_command(probe_command, name="probe")


if __name__ == "__main__":  # pragma: no cover
    main()
