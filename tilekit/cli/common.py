"""Command-line behaviour shared by every tk-* command.

A command file only parses flags, calls one library function and maps errors to exit codes;
everything common lives here:

- input positional or `-`/stdin; `-o FILE` written atomically, never over an input
  (`tilekit.outputs`); the files a command reads are recorded while it runs
  (`tilekit.fileio.command_inputs`);
- `--format yaml|json` (default: from the `-o` suffix), `--version`, `--quiet`, `--debug`;
- errors as one line on stderr: `tk-roll: error: <where>: <what>; <hint>`, exit 2 for bad input
  (`TilekitError` and click usage errors), exit 1 for an internal error; a traceback only with
  `--debug`;
- SIGINT, SIGTERM and SIGHUP: temporary files removed, one line `tool: error: interrupted`
  (`terminated`), exit 130 (143, 129), no traceback;
- reports (`--report-format text|json`: a table, or one JSON document on one line), the
  phases of a command (`Phases`: wall times for `--time-passes`, and a transient progress
  display on stderr only when it is a terminal, NO_COLOR unset and not `--quiet`), and the
  one warning line when a stage dropped derived sections (`warn_dropped`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
import threading
import traceback
from typing import Callable, Iterator

import click

from tilekit import IR_VERSION, __version__, limits
from tilekit.errors import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_SIGINT, EXIT_SIGTERM,
                            TilekitError, safe_line)
from tilekit.fileio import command_inputs, read_input_text, same_file  # noqa: F401
from tilekit.outputs import ClosedStdout, remove_temporaries, write_output  # noqa: F401


def version_text(tool: str) -> str:
    return f"{tool} (tilekit) {__version__}, tile IR format {IR_VERSION}"


def print_error(tool: str, message: str) -> None:
    """The house error line: `tool: error: message` on stderr (one safe line)."""
    click.echo(f"{tool}: error: {safe_line(message)}", err=True)


def warn(tool: str, message: str) -> None:
    """A warning: stderr only, never stdout (one safe line)."""
    click.echo(f"{tool}: warning: {safe_line(message)}", err=True)


class TkCommand(click.Command):
    """A click command whose usage errors become the house one-line format with exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        tool = self.name
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # pragma: no cover - click >= 8.2
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(EXIT_BAD_INPUT)
        except click.UsageError as exc:
            hint = f"run '{tool} --help' for usage"
            print_error(tool, f"{exc.format_message().rstrip('.')}; {hint}")
            sys.exit(EXIT_BAD_INPUT)
        except click.exceptions.Abort:
            print_error(tool, "interrupted")
            sys.exit(EXIT_SIGINT)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        if isinstance(rv, int):
            sys.exit(rv)
        sys.exit(0)


class TkGroup(TkCommand, click.Group):
    """A click group with the behaviour of `TkCommand`: a usage error anywhere (unknown
    subcommand, unknown flag, missing argument) is one line `tool: error: ...` and exit 2."""


def tk_command(tool: str, **settings) -> Callable:
    """Decorator: a tk-* command with --version, --quiet, --debug and house error handling.

    The wrapped function receives `quiet` and `debug` keyword arguments and may return an
    int exit code (default 0). A `TilekitError` becomes `tool: error: ...` and exit 2; any
    other exception is an internal error (exit 1), with a traceback only under `--debug`.
    """

    def decorate(fn: Callable) -> click.Command:
        @functools.wraps(fn)
        def body(*args, **kwargs):
            debug = kwargs.get("debug", False)
            try:
                with command_inputs(), _signal_handlers(), _stdout_guard():
                    return fn(*args, **kwargs)
            except TilekitError as exc:
                if debug:
                    traceback.print_exc()
                print_error(tool, exc.message())
                return EXIT_BAD_INPUT
            except BrokenPipeError:
                # Downstream closed the pipe (e.g. `| head`): not our failure.
                try:
                    sys.stdout = open(os.devnull, "w")
                except OSError:
                    pass
                return 0
            except KeyboardInterrupt:
                remove_temporaries()
                print_error(tool, "interrupted")
                return EXIT_SIGINT
            except Terminated as exc:
                remove_temporaries()
                print_error(tool, "terminated" if exc.signum == signal.SIGTERM else
                            f"terminated ({signal.Signals(exc.signum).name})")
                return EXIT_SIGTERM if exc.signum == signal.SIGTERM else 128 + exc.signum
            except MemoryError:
                # An allocation no budget foresaw failed: the input asked for more memory
                # than the process may use (bad input, exit 2), never a traceback.
                remove_temporaries()
                print_error(tool, f"memory ran out; lower {limits.TOTAL_BYTES.env} (or "
                                  f"{limits.TENSOR_ELEMENTS.env}) below the memory this "
                                  "process may use, so that an input this large is refused "
                                  "before it allocates, or give the process more memory")
                return EXIT_BAD_INPUT
            except Exception as exc:  # noqa: BLE001 - the one place internal errors are mapped
                if debug:
                    traceback.print_exc()
                print_error(tool, f"internal error: {type(exc).__name__}: {exc}; "
                                   "rerun with --debug for the traceback and report it")
                return EXIT_INTERNAL

        cmd = click.command(name=tool, cls=TkCommand,
                            context_settings={"help_option_names": ["-h", "--help"]},
                            **settings)(body)
        cmd = click.option("--debug", is_flag=True, help="Show tracebacks on errors.")(cmd)
        cmd = click.option("--quiet", "-q", is_flag=True, help="No progress or report output.")(cmd)
        cmd = click.version_option(message=version_text(tool), version=__version__)(cmd)
        return cmd

    return decorate


@contextlib.contextmanager
def _stdout_guard() -> Iterator[None]:
    """A process started with stdout closed has `sys.stdout` None: while the command runs it
    is a `ClosedStdout`, so printing to it is one located error (exit 2)."""
    if sys.stdout is not None:
        yield
        return
    sys.stdout = ClosedStdout()
    try:
        yield
    finally:
        sys.stdout = None


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the command is (like KeyboardInterrupt for SIGINT) so
    that every `finally` and `except BaseException` on the way out removes its temporaries."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def _signal_handlers() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt and SIGTERM raises `Terminated` while a command runs
    (a signal the parent process ignores stays ignored); the previous handlers come back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _raise_terminated}
    if hasattr(signal, "SIGHUP"):
        wanted[signal.SIGHUP] = _raise_terminated
    saved = {}
    for signum, handler in wanted.items():
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN:
            saved[signum] = current
            signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


# -- shared options ----------------------------------------------------------------------

def input_argument(fn: Callable) -> Callable:
    return click.argument("input", default="-", metavar="[IR]", required=False)(fn)


def output_option(fn: Callable) -> Callable:
    return click.option("-o", "--output", "output", default="-", metavar="FILE",
                        help="Write the result here (default: stdout).")(fn)


def format_option(fn: Callable) -> Callable:
    """`--format yaml|json`; without it the format follows the `-o` suffix (`.json` JSON,
    `.yaml`/`.yml` YAML), and is YAML for any other name and for stdout."""
    @functools.wraps(fn)
    def with_format(*args, **kwargs):
        if kwargs.get("fmt") is None:
            kwargs["fmt"] = output_format(kwargs.get("output"))
        return fn(*args, **kwargs)

    return click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
                        help="Output format (default: from the -o suffix, .json or "
                             ".yaml/.yml; yaml otherwise).")(with_format)


def output_format(output: str | None) -> str | None:
    """The format an output name asks for: "json" for `.json`, "yaml" for `.yaml`/`.yml`,
    None (the command's default, YAML) otherwise."""
    suffix = os.path.splitext(output or "")[1].lower()
    return {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(suffix)


def hw_option(required: bool = True) -> Callable:
    def add(fn: Callable) -> Callable:
        return click.option("--hw", "hw", required=required, metavar="NAME|PATH",
                            help="Hardware profile: a name from hwprofiles/ or a YAML path.")(fn)
    return add


def dims_option(fn: Callable) -> Callable:
    """`--dim NAME=SIZE` (repeatable): a stage command specialises a module with symbolic
    dimensions to those sizes before its work (`read_stage_input`)."""
    return click.option("--dim", "dim_flags", multiple=True, metavar="NAME=SIZE",
                        help="For a module with symbolic dimensions: the size of symbol NAME "
                             "(repeatable, one per symbol); the stage works on the module "
                             "specialised to these sizes.")(fn)


def read_stage_input(path: str, dim_flags: tuple[str, ...] = ()):
    """The IR document a stage command reads (`tilekit.ir.read_module`), with the form of
    every stage payload it carries checked (`tilekit.ir.payload_check`): a command
    refuses a tampered payload even when it only passes it on. `dim_flags` (`--dim
    NAME=SIZE`) specialise a symbolic module (`tilekit.ir.dims.specialise`)."""
    from tilekit.ir import read_module
    from tilekit.ir.dims import parse_sizes, require_symbolic, specialise
    from tilekit.ir.payload_check import check_payloads
    from tilekit.ir.verify import verify

    sizes = parse_sizes(dim_flags)
    module = read_module(path)
    check_payloads(module)
    if sizes:
        require_symbolic(module)
        module = specialise(module, sizes)
        verify(module, origin=path)
        module = _settled(module, path)
    return module


def _settled(module, path: str):
    """A specialised module rolled for a GPU as a symbolic one: its tiles' kernels, decided
    by size, decided at its sizes (`tilekit.roll.schedule.settle`), so that the stages after
    tk-roll read what a static roll writes."""
    from tilekit.roll.dynamic import by_size
    from tilekit.roll.schedule import settle
    from tilekit.schedule.mma import recorded_precision

    if not module.hardware or not any(by_size(op.tile) for op in module.ops):
        return module
    from tilekit.hw import load_recorded_profile

    profile = load_recorded_profile(module.hardware, path, module.hardware_sha256)
    return settle(module, profile, recorded_precision(module))


def module_profile(hw: str | None, module, input: str, output: str):
    """(profile, the name or path the output records) from `--hw`, else the module's recorded
    `hardware` (a recorded path is relative to the input's folder: re-recorded for the
    output's; a recorded content hash must match the profile found), else a bad-input
    error."""
    from tilekit.hw import load_profile, load_recorded_profile, recorded_profile

    if hw:
        profile = load_profile(hw)
        return profile, recorded_profile(hw, profile, output)
    if module.hardware:
        profile = load_recorded_profile(module.hardware, input, module.hardware_sha256)
        return profile, recorded_profile(os.path.abspath(profile.origin), profile, output)
    raise TilekitError("no hardware profile", "--hw",
                       "pass --hw NAME|PATH (e.g. --hw h100); 'tk-hw list' shows the names")


def top_k_option(per: str) -> Callable:
    """`--top-k K` (1-64, default 1): keep the K best tiles per `per` (op, group)."""
    return click.option("--top-k", "top_k", type=click.IntRange(min=1, max=64), default=1,
                        show_default=True, metavar="K",
                        help=f"Keep the K best tiles per {per} (the best is used; the next "
                             "K-1 are listed under tile.candidates).")


class FiniteFloat(click.ParamType):
    """A finite number >= 0 (a tolerance): `nan`, `inf` and negatives are usage errors."""

    name = "number"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{str(value)[:40]!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{str(value)[:40]!r} is not a finite number >= 0", param, ctx)
        return number


FINITE = FiniteFloat()


def stderr_is_terminal() -> bool:
    """Whether rich output (colour, tables) may go to stderr: a terminal, and NO_COLOR unset."""
    return sys.stderr.isatty() and not os.environ.get("NO_COLOR")


def stdout_is_terminal() -> bool:
    """Whether rich output may go to stdout: a terminal, and NO_COLOR unset."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def print_table(title: str, columns, rows) -> None:
    """A report table on stderr: rich on a terminal, aligned plain text otherwise."""
    if stderr_is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(*columns, title=title, title_justify="left")
        for row in rows:
            table.add_row(*row)
        Console(stderr=True).print(table)
        return
    click.echo(title, err=True)
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    for row in [columns, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), err=True)


# -- reports, phases and progress --------------------------------------------------------

REPORT_FORMATS = ("text", "json")


def report_format_option(fn: Callable) -> Callable:
    """`--report-format text|json`: the report as text (the default) or as one JSON document
    on one line (json implies the report)."""
    return click.option("--report-format", "report_format", type=click.Choice(REPORT_FORMATS),
                        default=None,
                        help="The report as a table (text, the default) or as one JSON "
                             "document on one line (json; implies --report). Where the "
                             "report goes: stderr for stage commands.")(fn)


def time_passes_option(fn: Callable) -> Callable:
    """`--time-passes`: the wall time of each phase of the command on stderr."""
    return click.option("--time-passes", "time_passes", is_flag=True,
                        help="Print the wall time of each phase (read, the pass, write, ...) "
                             "on stderr.")(fn)


def json_line(data) -> str:
    """One JSON document on one line: keys in the order built, no NaN (a float that is not
    finite is written as a string)."""
    import json

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(data), allow_nan=False)


def progress_shown(quiet: bool) -> bool:
    """A progress display may be drawn: stderr is a terminal, NO_COLOR unset, not --quiet.
    Never in pipes, files or tests, so no output ever carries it."""
    return not quiet and stderr_is_terminal()


class Phases:
    """The phases of one command run: each `with phases.step("roll", "rolling 179 ops"):`
    is timed (for `--time-passes`) and, on a terminal, shows a transient spinner with the
    label and the elapsed time on stderr (with `total`, a bar that `advance()` moves).

    `line()` is the `--time-passes` line, `seconds()` the figures of a JSON report."""

    def __init__(self, tool: str, quiet: bool = False, time_passes: bool = False):
        import time
        self.tool = tool
        self.show = progress_shown(quiet)
        self.time_passes = time_passes
        self.times: dict[str, float] = {}
        self._clock = time.perf_counter
        self._start = self._clock()

    @contextlib.contextmanager
    def step(self, name: str, label: str | None = None, total: int | None = None):
        """Time phase `name`; yield a function that advances a bar of `total` steps."""
        start = self._clock()
        try:
            if self.show and label:
                with _progress(f"{self.tool}: {label}", total) as advance:
                    yield advance
            else:
                yield lambda: None
        finally:
            self.times[name] = self.times.get(name, 0.0) + self._clock() - start

    def seconds(self) -> dict[str, float]:
        """Each phase's wall time and the total since the command started, in seconds."""
        total = self._clock() - self._start
        return {**{k: round(v, 6) for k, v in self.times.items()}, "total": round(total, 6)}

    def line(self) -> str:
        times = self.seconds()
        total = times.pop("total")
        parts = ", ".join(f"{name} {t:.3f} s" for name, t in times.items())
        return f"{self.tool}: time: {parts}; total {total:.3f} s"

    def print(self) -> None:
        """The `--time-passes` line on stderr, when asked for."""
        if self.time_passes:
            click.echo(self.line(), err=True)


@contextlib.contextmanager
def _progress(label: str, total: int | None):
    """A transient rich progress display on stderr: spinner, label, elapsed time (and a bar
    when `total` is known). Gone from the terminal when the step ends."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn)

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)


def emit_report(tool: str, fmt: str | None, text: Callable[[], None],
                data: Callable[[], dict], phases: Phases | None = None) -> None:
    """A stage command's report on stderr: `text()` prints the table; with `fmt` "json",
    `data()` is written as one JSON line instead, with `time_s` (the phases' wall times)
    when `--time-passes` asked for them (the only fields that vary between runs)."""
    if fmt == "json":
        doc = {"tool": tool, **data()}
        if phases is not None and phases.time_passes:
            doc["time_s"] = phases.seconds()
        click.echo(json_line(doc), err=True)
        return
    text()


#: The command that makes each derived section again (the names of tilekit.ir.stages.SECTIONS).
REMADE_BY = {"kernels[*].tile": "tk-weld", "control[*].grind": "tk-grind", "program": "tk-ram",
             "codegen": "tk-codegen", "kernels[*].launch": "tk-codegen"}


def warn_dropped(tool: str, before, after) -> None:
    """One warning line when the stages this command ran dropped derived sections (a stage
    run out of order: tk-roll after tk-ram drops the program), naming them and the commands
    that make them again (`tilekit.ir.stages` records them as the stage option `dropped`)."""
    dropped: list[str] = []
    for stage in after.stages[len(before.stages):]:
        for name in (stage.get("options") or {}).get("dropped", ()):
            if name not in dropped:
                dropped.append(name)
    if not dropped:
        return
    again = list(dict.fromkeys(REMADE_BY.get(name, name) for name in dropped))
    warn(tool, f"dropped {', '.join(dropped)}: made from what this stage changes; run "
               f"{', '.join(again)} again after it")
