"""tk-run: run a tile-IR module on inputs; optionally check it against a reference and time it.

tk-run is the sink of a pipe, so its results (per-output summaries, check lines, timings,
the report) go to stdout, unless `-o -` sends the outputs archive there, in which case they go
to stderr; `--report-format json` gathers them into one JSON document there. Errors, notes and
warnings always go to stderr. With no input given, the inputs are random from seed 0 (said on
stderr); `--check` without `--mode` runs the mode the IR's stages made
(`tilekit.runtime.check.staged_mode`). Exit codes: 0 success, 1 check mismatch or internal
error, 2 bad input. See docs/run.md.
"""

from __future__ import annotations

import click
import numpy as np

from tilekit.cli.common import (FINITE, REPORT_FORMATS, Phases, input_argument, json_line,
                                read_stage_input, stderr_is_terminal, stdout_is_terminal,
                                time_passes_option, tk_command, warn)
from tilekit import limits
from tilekit.errors import EXIT_OK, TilekitError, UnsupportedError

TOOL = "tk-run"
#: `--check` found a mismatch (bad input is 2, as for every tool).
EXIT_CHECK_FAILED = 1


#: The seed of the random inputs when no input is given at all (docs/run.md, "Inputs").
DEFAULT_SEED = 0

#: Timed or warm-up runs one command may ask for (a larger count is a typo, not a benchmark).
MAX_RUNS = 100_000


@tk_command(TOOL)
@input_argument
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where to run: the CPU (compiled code, or the reference executor: --mode), "
                   "or the CUDA runtime.")
@click.option("--mode", default=None, metavar="MODE",
              help="CPU execution mode: 'compiled' (C++ kernels: the IR's from tk-codegen "
                   "--target cpu, else generated and built here, cached; the default wherever "
                   "a C++ compiler is found), 'whole' (the NumPy reference executor, whole "
                   "ops), or a mode added by a stage "
                   "('tiled': op tiles; 'program': tk-ram's rTasks in their planned order). "
                   "With --check and no --mode, the mode of the IR's stages (compiled after "
                   "tk-codegen --target cpu, program after tk-ram, tiled after "
                   "tk-roll/tk-weld). --device cuda runs the generated kernels and takes no "
                   "other mode.")
@click.option("--threads", type=click.IntRange(min=1, max=4096), default=None, metavar="N",
              help="Threads of the compiled CPU code (default: every core).")
@click.option("--input", "input_flags", multiple=True, metavar="NAME=@FILE.npy|NAME=V,V,..",
              help="One input: an .npy file, or comma-separated values (one value fills the "
                   "tensor). Repeatable; overrides --inputs.")
@click.option("--inputs", "inputs_npz", metavar="FILE.npz",
              help="Inputs from an .npz archive keyed by input name.")
@click.option("--seed", type=click.IntRange(min=0), default=None, metavar="N",
              help="Random values for inputs not given (normal floats, ints in [0,8), bools); "
                   f"with no input given at all, seed {DEFAULT_SEED} is the default.")
@click.option("--dim", "dim_flags", multiple=True, metavar="NAME=V[,V,..]",
              help="A symbolic dimension's size (repeatable), for a module imported with "
                   "symbolic dimensions: several sizes run (and --check) each in turn; sizes "
                   "not given come from the input arrays, else the likely or smallest value.")
@click.option("--allow-nan", is_flag=True, help="Accept NaN and infinities in inputs.")
@click.option("-o", "--output", "output", default=None, metavar="FILE.npz",
              help="Write the outputs to an .npz archive ('-' for stdout).")
@click.option("--check", is_flag=True,
              help="Compare with onnxruntime on the source model, or with the CPU reference "
                   "executor when the IR has none; exit 1 on mismatch.")
@click.option("--rtol", type=FINITE, default=None, metavar="R",
              help="Pass when the relative L2 error <= R (default by dtype: 1e-5 for float32).")
@click.option("--atol", type=FINITE, default=None, metavar="A",
              help="... or when the worst absolute error <= A (default 1e-6 for float32).")
@click.option("--check-tensors", "check_tensors", is_flag=True,
              help="Also compare every tensor the run computed (intermediates included) with "
                   "the CPU reference executor's, in op order, and list those that differ: "
                   "the first one is where an error starts.")
@click.option("--bench", type=click.IntRange(min=1, max=MAX_RUNS), default=None, metavar="N",
              help=f"Time N runs (at most {MAX_RUNS}) after the warm-up; print "
                   "median (p50), p90, min, max, stddev and the device.")
@click.option("--warmup", type=click.IntRange(min=0, max=MAX_RUNS), default=1,
              show_default=True, metavar="K", help="Untimed runs before --bench.")
@click.option("--graph", is_flag=True,
              help="With --bench on CUDA: time each run replayed as one CUDA graph (captured "
                   "once): the kernels without the host's launches between them, the way a "
                   "deployment (and Rammer's baseline) runs them.")
@click.option("--report", is_flag=True, help="Print a time profile (per op; per kernel call for compiled "
              "code and CUDA kernels) and peak memory.")
@click.option("--report-format", "report_format", type=click.Choice(REPORT_FORMATS),
              default="text", show_default=True,
              help="The results (output summaries, check, bench, report) as lines of text, or "
                   "as one JSON document on one line (json), where the text would go.")
@time_passes_option
def main(input, device, mode, threads, input_flags, inputs_npz, seed, dim_flags, allow_nan,
         output, check, rtol, atol, check_tensors, bench, warmup, graph, report,
         report_format, time_passes, quiet, debug):
    """Run the tile IR module IR (a file, or '-'/nothing for stdin)."""
    from tilekit.runtime import backend, default_mode
    from tilekit.runtime.bench import peak_rss_bytes
    from tilekit.runtime.check import staged_mode
    from tilekit.fileio import note_input
    from tilekit.outputs import OutputSet
    from tilekit.ir.dims import instantiate, is_symbolic, require_symbolic
    from tilekit.ir.verify import verify
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants
    from tilekit.runtime.io import (base_dir, check_inputs, check_run_budget, gather_inputs,
                                    input_files, load_weights, npz_bytes, resolve_sidecar)

    if (rtol is not None or atol is not None) and not (check or check_tensors):
        warn(TOOL, "--rtol/--atol have no effect without --check or --check-tensors")
    if graph and (bench is None or device != "cuda"):
        raise TilekitError("times the --bench runs of CUDA kernels (replayed as one CUDA "
                           "graph)", "--graph", "give --bench N with --device cuda, or drop "
                           "--graph")
    phases = Phases(TOOL, quiet, time_passes)
    with phases.step("read"):
        module = read_stage_input(input)  # notes the IR and the files it names as inputs
        if not is_symbolic(module):
            check_run_budget(module, input)
    given_mode = mode
    given_seed, given_report = seed, report
    folder = base_dir(input)
    for path in input_files(input_flags, inputs_npz):
        note_input(path)
    #: the source model checked by the first run (a symbolic module runs once per size)
    source_checked: list[bool] = []

    def run_one(module, values, weights=None, family=None) -> int:
        """One run of a static module (a symbolic one's instance at `values`, with its
        `weights`: the module's, read once for every size, and its folded values; `family`:
        the symbolic module's compiled code, shared by its sizes)."""
        mode, seed, report = given_mode, given_seed, given_report
        chosen = None  # the mode --check picked from the stages, when --mode was not given
        if mode is None:
            mode = default_mode(module, device)
            if device == "cpu" and (check or check_tensors):
                chosen = staged_mode(module)
                mode = chosen.mode
        out = OutputSet()
        if output is not None:  # -o never overwrites what this run reads: checked before work
            out.check(output, f"-o {output}" if output != "-" else "-o")
        with phases.step("prepare"):
            if threads is not None and mode != "compiled":
                warn(TOOL, "--threads sets the compiled CPU code's threads; ignored in this mode")
            runner = _backend(module, device, mode, threads, input, defaulted=chosen is None
                              and given_mode is None, family=family, values=values)
            if weights is None:
                weights = load_weights(module, folder)
            if not source_checked:
                source_checked.append(True)
                if check and (module.source or {}).get("onnx"):  # a bad one fails before the run
                    resolve_sidecar(module.source, "onnx", folder, "source", limits.MODEL_BYTES)
            seed_given = seed is not None
            if seed is None and not input_flags and inputs_npz is None and module.inputs:
                seed = DEFAULT_SEED  # nothing given: random inputs, said once, deterministic
                if not quiet:
                    click.echo(f"{TOOL}: inputs: random, seed {seed} (give --seed N or "
                               "--input/--inputs)", err=True)
            inputs = gather_inputs(module, input_flags, inputs_npz, seed)
            check_inputs(module, inputs, allow_nan=allow_nan, seed_given=seed_given)

        results = _Results(to_stderr=output == "-", json=report_format == "json")
        results.put("model", module.model)
        if values is not None:
            results.put("dims", dict(sorted(values.items())))
            results.line("dims: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items())))
        results.put("device", runner.description)
        if device == "cpu":
            results.put("mode", mode)
        # seed: the random inputs' seed (None: every input given); default_seed: none was given
        results.put("inputs", {"seed": seed, "default_seed": seed is not None and not seed_given})
        profile: list[tuple[str, float]] = []
        if report and device == "cpu" and mode == "program":
            warn(TOOL, f"--report profiles ops in the whole and tiled modes and kernels in the "
                       f"compiled mode; not in {mode} mode")
            report = False
        with phases.step("run", f"running {module.model} ({device}"
                                f"{', ' + mode + ' mode' if mode != 'whole' else ''})"):
            if report and runner.profile is not None:
                for _ in range(warmup):  # compiled code: first touches of memory are not its time
                    runner.run(inputs, weights)
                outputs, profile = runner.profile(inputs, weights)
            elif report and device == "cuda":
                warn(TOOL, "--report times each kernel once per run, in order; a module with "
                           "device control flow launches some per iteration: not profiled")
                outputs, report = runner.run(inputs, weights), False
            elif report and device == "cpu":
                from tilekit.runtime.cpu import prepare
                outputs = prepare(module).run(inputs, weights, mode=mode,
                                              on_step=lambda s, t: profile.append((s.op.name, t)))
            else:
                outputs = runner.run(inputs, weights)
        peak = peak_rss_bytes()  # before --check loads a reference runtime into this process

        if output is not None:
            with out, phases.step("write"):
                out.put(output, npz_bytes(outputs), f"-o {output}" if output != "-" else "-o")
                out.commit()
        if not quiet:
            results.put("outputs", {name: _summary(array) for name, array in outputs.items()})
            for name, array in outputs.items():
                results.line(f"{name}: {_describe(array)}{_stats(array)}")

        status = EXIT_OK
        if check:
            with phases.step("check", "checking against the reference"):
                if not _check(results, module, device, mode, chosen, outputs, inputs, weights,
                              folder, rtol, atol):
                    status = EXIT_CHECK_FAILED
        if check_tensors:
            with phases.step("check-tensors", "checking every tensor"):
                if _check_tensors(results, module, runner, inputs, weights, rtol, atol):
                    status = EXIT_CHECK_FAILED
        if bench is not None:
            with phases.step("bench", f"timing {bench} runs after {warmup} warm-up",
                             total=bench + warmup) as advance:
                timing = _bench(runner, inputs, weights, bench, warmup, advance, graph)
            results.put("bench", timing.record(runner.description, _threads(device)))
            results.line(timing.line(runner.description))
        if report and not quiet:
            _print_report(results, module, profile, peak,
                          "kernel" if mode == "compiled" or device == "cuda" else "op")
        if time_passes and results.json:
            results.put("time_s", phases.seconds())
        results.finish()
        if not results.json:
            phases.print()
        return status

    if dim_flags:
        require_symbolic(module)
    if not is_symbolic(module):
        return run_one(module, None)
    bindings = _bindings(module, dim_flags, input_flags, inputs_npz)
    if len(bindings) > 1 and output is not None:
        raise TilekitError(f"-o writes the outputs of one run; --dim gives {len(bindings)} "
                           "sizes", "-o", "give one size per symbol with -o")
    status = EXIT_OK
    base = load_weights(module, folder)  # every size's weights, read once
    family = CompiledFamily(module, base, device)   # compiled code shared by the sizes
    for values in bindings:
        instance = instantiate(module, values)
        verify(instance, origin=input)
        check_run_budget(instance, input)
        # what the sizes alone decide (positions, masks) computed once, as an import folds it
        instance, weights = fold_constants(instance, base)
        status = max(status, run_one(instance, values, weights, family))
    return status


def _bindings(module, dim_flags, input_flags, inputs_npz) -> list[dict[str, int]]:
    """The symbols' values for each run of a symbolic module: `--dim` sizes (several: one
    run each, every combination), then the given input arrays' shapes, then each symbol's
    first likely value, else its smallest."""
    from itertools import product

    from tilekit.ir.dims import bind, parse_size_lists
    from tilekit.runtime.io import given_shapes

    sizes = parse_size_lists(dim_flags)
    if len([v for vs in sizes.values() for v in vs]) > 64:
        raise TilekitError("--dim asks for more than 64 sizes", "--dim", "give fewer sizes")
    shapes = given_shapes(module, input_flags, inputs_npz)
    out = []
    for combo in product(*sizes.values()):
        given = dict(zip(sizes, combo))
        bound = bind(module, shapes, given, "--dim" if given else "inputs") if shapes else {}
        for sym, dim in module.dims.items():
            if sym not in given and sym not in bound:
                given[sym] = dim.likely[0] if dim.likely else dim.min
        out.append(bind(module, shapes, {**given, **bound}, "--dim"))
    return out


def _bench(runner, inputs, weights, runs: int, warmup: int, advance, graph: bool = False):
    """The runner's own timing (CUDA events; `graph`: runs replayed as a CUDA graph) when it
    has one, else the wall clock around whole runs with `advance` (the progress bar) after
    each."""
    from tilekit.runtime.bench import time_runs

    if runner.bench is not None:
        return runner.bench(inputs, weights, runs, warmup, graph=graph)
    return time_runs(lambda: runner.run(inputs, weights), runs, warmup, on_run=advance)


def _backend(module, device: str, mode: str, threads, input: str, defaulted: bool,
             family=None, values=None):
    """The runner; compiled CPU code is generated here when the IR has none (with the CPU
    profile it was rolled for; a symbolic module's instance through its `family`, at
    `values`), and CUDA kernels when it has none (with the GPU profile it was rolled for).
    When the mode was not asked for and no compiled code can be made, the reference
    executor runs instead, said on stderr."""
    from tilekit.cli.common import module_profile
    from tilekit.ir.payloads import cpu_rolled
    from tilekit.runtime import backend
    from tilekit.runtime.compiled import is_cpu_code

    profile = None
    if device == "cpu" and mode == "compiled" and not is_cpu_code(module):
        if cpu_rolled(module):   # the profile it records, found as tk-codegen finds it
            profile, _ = module_profile(None, module, input, "-")
    elif device == "cuda" and not module.codegen and module.hardware \
            and not cpu_rolled(module):
        profile, _ = module_profile(None, module, input, "-")    # the GPU profile rolled for
        profile = None if profile.is_cpu else profile
    try:
        return backend(module, device, mode, threads, profile, family=family, values=values)
    except UnsupportedError as exc:   # an op without a CPU kernel, no compiler: not bad input
        if not defaulted or mode != "compiled":
            raise
        warn(TOOL, f"no compiled CPU code ({exc.what}); running the reference executor "
                   "(--mode whole)")
        return backend(module, device, "whole", threads)


def _threads(device: str) -> int | None:
    from tilekit.runtime.bench import cpu_threads
    return cpu_threads() if device == "cpu" else None


def _check(results, module, device, mode, chosen, outputs, inputs, weights, folder, rtol,
           atol) -> bool:
    """--check: the lines (or the JSON entry); True when every output passes."""
    from tilekit.runtime.check import compare_outputs, reference_outputs, staged_mode

    reference = reference_outputs(module, inputs, weights, folder)
    label = _run_label(device, mode, chosen)
    results.line(f"check: {label} against {reference.description}: pass when rel_l2 <= rtol "
                 "or max_abs <= atol")
    note = None
    if device == "cpu" and mode == "whole" and not (module.source or {}).get("onnx"):
        staged = staged_mode(module).mode
        note = ("the run and the reference are the same executor (whole ops): this shows the "
                "module runs, not that a schedule is right"
                + (f"; the stages' mode is --mode {staged}" if staged != "whole" else ""))
        results.line(f"check: note: {note}")
    compared = compare_outputs(module, outputs, reference.outputs, rtol, atol,
                               reference.tolerances)
    for result in compared:
        results.line(f"  {result.line()}")
    failed = [r.name for r in compared if not r.passed]
    if failed:
        results.line(f"check: FAIL ({len(failed)} of {len(compared)} outputs differ)")
    else:
        results.line(f"check: pass ({len(compared)} output{'s' if len(compared) != 1 else ''})")
    results.put("check", {"run": label, "reference": reference.description,
                          "passed": not failed, **({"note": note} if note else {}),
                          "outputs": [_comparison(r) for r in compared]})
    return not failed


def _comparison(c) -> dict:
    out = {"name": c.name, "max_abs": c.max_abs, "rel_l2": c.rel_l2, "rtol": c.rtol,
           "atol": c.atol, "passed": c.passed}
    if c.note:
        out["note"] = c.note
    return out


class _Results:
    """tk-run's results: lines of text to stdout (stderr when stdout carries the outputs
    archive), or, with `json`, the same results gathered into one JSON document printed
    there at the end (`finish`)."""

    def __init__(self, to_stderr: bool, json: bool = False):
        self.to_stderr = to_stderr
        self.json = json
        self.doc: dict = {"tool": TOOL}

    def line(self, text: str) -> None:
        if not self.json:
            click.echo(text, err=self.to_stderr)

    def put(self, key: str, value) -> None:
        self.doc[key] = value

    def finish(self) -> None:
        if self.json:
            click.echo(json_line(self.doc), err=self.to_stderr)


def _run_label(device: str, mode: str, chosen) -> str:
    """What ran, for the check line: `cpu (tiled mode: tk-roll's tiles, ...)`."""
    if device != "cpu":
        return device
    if chosen is not None:
        return (f"cpu ({mode} mode, the IR's stages: {chosen.why})" if mode != "whole"
                else "cpu (whole ops)")
    return "cpu (whole ops)" if mode == "whole" else f"cpu ({mode} mode)"


#: At most this many differing tensors are listed by --check-tensors (the first ones matter).
_LISTED_TENSORS = 20


def _check_tensors(results: "_Results", module, runner, inputs, weights, rtol, atol) -> bool:
    """The per-tensor comparison (lines, or the JSON entry); True when some tensor differs."""
    from tilekit.runtime.check import compare_tensors

    compared = compare_tensors(module, runner.trace(inputs, weights), inputs, weights, rtol,
                               atol)
    failed = [r for r in compared if not r.comparison.passed]
    results.line(f"check-tensors: {len(compared)} computed tensors against the CPU reference "
                 f"executor (whole ops), in op order: {len(failed)} differ")
    for result in failed[:_LISTED_TENSORS]:
        results.line(f"  {result.line()}")
    if len(failed) > _LISTED_TENSORS:
        results.line(f"  ... and {len(failed) - _LISTED_TENSORS} more")
    worst = sorted(compared, key=lambda r: -r.comparison.rel_l2)[:3]
    if worst and not failed:
        results.line("  largest: " + "; ".join(
            f"{r.comparison.name} rel_l2 {r.comparison.rel_l2:.3g}" for r in worst))
    results.put("check_tensors", {
        "computed": len(compared), "passed": not failed,
        "differ": [{"index": r.index, "op": r.op, **_comparison(r.comparison)}
                   for r in failed]})
    return bool(failed)


def _describe(array: np.ndarray) -> str:
    from tilekit.runtime.io import describe
    return describe(array)


def _finite(array: np.ndarray):
    """(float64 values, finite mask) of `array`, or None when it is not numeric."""
    try:
        values = array.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        return None
    return values, np.isfinite(values)


def _stats(array: np.ndarray) -> str:
    got = _finite(array)
    if got is None or got[0].size == 0:
        return ""
    values, finite = got
    note = "" if finite.all() else f"  ({int(values.size - finite.sum())} non-finite)"
    if not finite.any():
        return note
    values = values[finite] if not finite.all() else values
    return (f"  min {values.min():.6g}  max {values.max():.6g}  mean {values.mean():.6g}"
            f"{note}")


def _summary(array: np.ndarray) -> dict:
    """An output as data: dtype, shape and (numeric, over the finite values) min/max/mean."""
    out = {"dtype": str(array.dtype), "shape": list(array.shape)}
    got = _finite(array)
    if got is None or got[0].size == 0:
        return out
    values, finite = got
    out["non_finite"] = int(values.size - finite.sum())
    if finite.any():
        kept = values[finite]
        out.update(min=float(kept.min()), max=float(kept.max()), mean=float(kept.mean()))
    return out


def _print_report(results: _Results, module, profile: list[tuple[str, float]],
                  peak: int, unit: str = "op") -> None:
    """The slowest ops (or, for compiled code, kernel calls) of one profiled run."""
    total = sum(t for _, t in profile) or 1e-12
    slowest = sorted(profile, key=lambda p: -p[1])[:10]
    results.put("report", {"ops": len(module.ops), f"ms_in_{unit}s": round(total * 1e3, 6),
                           "peak_memory_bytes": peak,
                           "slowest": [{unit: name, "ms": round(t * 1e3, 6),
                                        "share": round(t / total, 6)} for name, t in slowest],
                           # every op or kernel call in run order, for per-kernel fits
                           "calls": [[name, round(t * 1e3, 6)] for name, t in profile]})
    if results.json:
        return
    rows = [(name, f"{t * 1e3:.3f}", f"{100 * t / total:.1f}%") for name, t in slowest]
    calls = f", {len(profile)} kernel calls" if unit == "kernel" else ""
    heading = (f"report: {module.model}: {len(module.ops)} ops{calls}, "
               f"{total * 1e3:.3f} ms in {unit}s, peak memory {peak / 2**20:.1f} MiB")
    if stderr_is_terminal() if results.to_stderr else stdout_is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=heading, title_justify="left")
        for column in (unit, "ms", "share"):
            table.add_column(column, justify="left" if column == unit else "right")
        for row in rows:
            table.add_row(*row)
        Console(stderr=results.to_stderr).print(table)
        return
    results.line(heading)
    if not rows:
        return
    width = max(len(r[0]) for r in rows)
    results.line(f"  {unit:<{width}}  {'ms':>10}  {'share':>6}")
    for name, ms, share in rows:
        results.line(f"  {name:<{width}}  {ms:>10}  {share:>6}")


if __name__ == "__main__":  # pragma: no cover
    main()
