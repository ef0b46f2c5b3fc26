"""Everything that needs a GPU, in one run: `make gpu-check` (or `python3 tests/gpu/gpu_check.py`).

Written for the machines this project is lent now and then (a system `python3` with CuPy,
PyTorch, onnx and onnxruntime, no network, no venv): it runs from the checkout with
`PYTHONPATH=.`, installs nothing, and writes every result and log into one folder
(`--out`, default `$OUT` when set, else `out/gpu-check`):

    summary.json          one record per step (what ran, exit code, seconds, parsed figures)
    kernels.json          each timed model variant's kernel calls in order, with their times
    logs.tar.gz           the full output of each step (<step>.log), and the bench results
    *.json                the benchmark results (also written to tests/bench/results/)

Models, IR and kernels are built in `--work` (default a temporary folder), not in the output
folder, which stays small enough to copy back from a lent machine.

Steps, in order (`--steps` picks some):

    env         the device, driver, toolkit and library versions
    probe       tk-hw probe: the device measured (bandwidths, FLOP rates, launch overhead)
                and written as a profile (<hw>-probed.yaml), then tk-hw validate
    pytest      pytest tests/gpu (every codegen fixture on the device against the CPU executor,
                compute-sanitizer on the fixtures)
    models      every model (the 9 real architectures with seeded random weights, the 5 built
                ones, the 6 control-flow ones) through `tk-import | tk-roll --hw H |
                tk-codegen`, with the default schedules (no roll), welded (`| tk-weld |`), as
                a tk-ram program (`tk-roll --top-k 4 | tk-weld | tk-ram |`) and, for the
                control-flow models, ground (`| tk-grind |`: device loops and branches);
                `--variants` picks some, `--dtypes float32,float16,bfloat16` imports each model in
                each (`tk-import --dtype`); then `tk-run --device cuda --check` (in
                parallel), then one at a time `tk-run --bench --graph --report` of
                `--timed-dtypes` (`--runs 0`: none timed): the median of the run replayed
                as a CUDA graph (`median_ms`, `timing: graph`; where the run cannot be
                captured, of the run launched from Python: `timing: launched` and the
                reason), the kernels launched from Python one by one (`launched_ms`: the
                report's sum of each kernel's events) and the slowest kernels;
                every kernel call's time goes to kernels.json (tests/gpu/kernel_fit.py sets
                them against the roll's estimates);
                `--build-only` builds and compiles only (on a CPU machine with nvcc), and
                `--reuse-built` keeps the IR already in `--work`/models (built beforehand
                that way: the pipeline is deterministic; docs/gpu.md, "A short lease")
    profile     Nsight Compute (ncu) sections of the kernels of built models (`--profiled`:
                the longest-running models rolled and welded, a tk-ram program, a device
                loop): throughput, occupancy, memory, warp stalls (CSV in the logs;
                ncu-summary.json: the longest launches with their metrics and ncu's findings,
                `ncu_summary`)
    sanitizer   compute-sanitizer memcheck, racecheck and synccheck on three models' welded
                kernels and tk-ram programs and on two control-flow models' device loops
                (in parallel)
    bench       tests/bench/test_gpu_bench.py (tilekit against cuBLAS/cuDNN/PyTorch, ratios)
    stages      tests/bench/test_gpu_weld.py, test_gpu_ram.py, test_gpu_grind.py,
                test_gpu_dynamic.py (`--stages` picks some): welded against unwelded kernels,
                a program against per-kernel launches and a CUDA graph, device loops against
                host-driven ones and PyTorch eager, a symbolic module's shared builds against
                one per size
    fidelity    tests/bench/test_gpu_fidelity.py (tk-roll's top-10 tiles of 30 suite ops, and of
                the tensor-core shapes, timed: how well the cost model ranks them; docs/roll.md,
                "Fidelity")

Each step has a time limit; a failing step is recorded and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bin"
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from models import control_models  # noqa: E402
STEPS = ("env", "probe", "pytest", "models", "profile", "sanitizer", "bench", "stages",
         "fidelity")
#: How each model is compiled in the models step ({n}: the model, {out}: the IR written).
VARIANTS = {
    "rolled": "tk-roll --hw {hw} {n}.tk.yaml | tk-codegen --compile -o {out}",
    "default": "tk-codegen --compile {n}.tk.yaml -o {out}",
    "welded": "tk-roll --hw {hw} {n}.tk.yaml | tk-weld | tk-codegen --compile -o {out}",
    "program": "tk-roll --hw {hw} --top-k 4 {n}.tk.yaml | tk-weld | tk-ram "
               "| tk-codegen --compile -o {out}",
    "ground": "tk-roll --hw {hw} {n}.tk.yaml | tk-grind | tk-codegen --compile -o {out}",
}
#: Variants that only the control-flow models get (on the others they would copy "rolled").
CONTROL_VARIANTS = {"ground"}
REAL_MODELS = ["resnet50", "inception_v1", "inception_v2", "densenet121", "shufflenet",
               "squeezenet", "vgg19", "bvlc_alexnet", "zfnet512"]
BUILT_MODELS = ["bert_encoder_layer", "gpt_block", "mobilenet_block", "mlp_mixer_block",
                "lstm_model"]
CONTROL_MODELS = list(control_models.MODELS)
#: (model, variant) that compute-sanitizer runs.
SANITIZED = [(m, v) for m in ("mobilenet_block", "bert_encoder_layer", "squeezenet")
             for v in ("welded", "program")] + [("lstm_loop", "ground"),
                                                 ("nested_loops", "ground")]
#: `tk-import --dtype` spellings of the models step's dtypes, and their file-name infix.
DTYPES = {"float32": "", "float16": ".f16", "bfloat16": ".bf16"}


def _env() -> dict[str, str]:
    env = dict(os.environ, NO_COLOR="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


class Runner:
    """Runs shell commands with limits, appends their output to per-step logs."""

    def __init__(self, out: Path, work: Path):
        self.out = out
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = []
        self.lock = threading.Lock()   # records come from the steps' worker threads

    def sh(self, step: str, command: str, timeout: float, cwd: Path | None = None) -> dict:
        start = time.monotonic()
        try:
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd or ROOT,
                                  env=_env(), capture_output=True, text=True, timeout=timeout)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = 124
            text = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes)
                    else (exc.stdout or "")) + f"\n[timed out after {timeout:.0f} s]\n"
        seconds = round(time.monotonic() - start, 2)
        with open(self.logs / f"{step}.log", "a", encoding="utf-8") as log:
            log.write(f"$ {command}\n[exit {rc}, {seconds} s]\n{text}\n")
        return {"command": command, "rc": rc, "seconds": seconds, "output": text}

    def pack_logs(self) -> None:
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            tar.add(self.logs, arcname="logs")

    def record(self, step: str, **fields) -> None:
        with self.lock:
            self.records.append({"step": step, **fields})
            (self.out / "summary.json").write_text(json.dumps(self.records, indent=1) + "\n")
        print(f"[{step}] " + ", ".join(f"{k}={v}" for k, v in fields.items()
                                       if not isinstance(v, (list, dict))), flush=True)


def step_env(run: Runner, args) -> None:
    checks = {
        "nvidia_smi": "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm "
                      "--format=csv,noheader",
        "nvcc": "nvcc --version | tail -2",
        "python": "python3 -c 'import sys,numpy,onnx,onnxruntime,cupy,torch;"
                  "print(sys.version.split()[0], numpy.__version__, onnx.__version__, "
                  "onnxruntime.__version__, cupy.__version__, torch.__version__)'",
        "device": "python3 -c 'from tilekit.runtime import cuda; print(cuda.device_description())'",
        "sanitizer": "compute-sanitizer --version | tail -1",
    }
    found = {k: run.sh("env", c, 120)["output"].strip() for k, c in checks.items()}
    run.record("env", **found)


def step_probe(run: Runner, args) -> None:
    """`tk-hw probe`: the device's measured figures written as a profile, then validated."""
    out = run.out / f"{args.hw}-probed.yaml"
    r = run.sh("probe", f"tk-hw probe --base {args.hw} -o {out} && tk-hw validate {out}",
               args.limit_probe)
    table = [ln for ln in r["output"].splitlines() if ln.strip()][:40]
    run.record("probe", rc=r["rc"], seconds=r["seconds"], table=table)


def step_pytest(run: Runner, args) -> None:
    r = run.sh("pytest", "python3 -m pytest tests/gpu -o addopts='' -q -p no:cacheprovider "
               "-rfE --tb=short", args.limit_pytest)
    summary = [ln for ln in r["output"].splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    run.record("pytest", rc=r["rc"], seconds=r["seconds"], summary=(summary or ["?"])[-1])


def _write_model(name: str, folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    import onnx

    from models import onnx_models
    from models.onnx_check import with_random_weights

    path = folder / f"{name}.onnx"
    if not path.exists():
        if name in REAL_MODELS:
            light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
            model = with_random_weights(light / f"light_{name}.onnx", seed=0)
        elif name in CONTROL_MODELS:
            model = control_models.MODELS[name]()
        else:
            model = getattr(onnx_models, name)()
        onnx.save(model, str(path))
    return path


def _parse_check(text: str) -> dict:
    """A `tk-run --check` run's outcome and its worst relative L2 error."""
    fields: dict = {"check": "pass" if "check: pass" in text else
                    ("FAIL" if "check: FAIL" in text else "none")}
    errs = [float(m.group(1)) for m in re.finditer(r"rel_l2 ([0-9.e+-]+)", text)]
    if errs:
        fields["worst_rel_l2"] = max(errs)
    return fields


def _ir(name: str, dtype: str, variant: str) -> str:
    """The file a model variant's compiled IR is written to in the models folder."""
    return f"{name}{DTYPES[dtype]}.{variant}.cuda.yaml"


def step_models(run: Runner, args) -> None:
    work = run.work / "models"
    work.mkdir(exist_ok=True)
    names = args.models or REAL_MODELS + BUILT_MODELS + CONTROL_MODELS
    for name in names:
        _write_model(name, work)

    timed = set() if args.runs == 0 else set(args.timed_dtypes or args.dtypes)

    def check(name: str, dtype: str, variant: str) -> dict:
        ir = _ir(name, dtype, variant)
        res = run.sh(f"models-{name}", f"tk-run {ir} --device cuda --seed 0 --check", 600, work)
        res["tail"] = [] if res["rc"] == 0 else res["output"].strip().splitlines()[-3:]
        if res["rc"] == 1:
            # Where the difference starts: every tensor against the CPU reference executor.
            diag = run.sh(f"models-{name}", f"tk-run {ir} --device cuda --seed 0 "
                          "--check-tensors --quiet", 600, work)
            res["tail"] += [ln for ln in diag["output"].splitlines()
                            if ln.startswith(("check-", "  "))]
        return res

    def build_and_check(item: tuple[str, str]) -> list[tuple[str, str, str, dict]]:
        """One model in one dtype: the import, then each variant built and checked (so that
        one model's builds, CPU work, overlap the others' checks)."""
        name, dtype = item
        stem = f"{name}{DTYPES[dtype]}"
        flag = "" if dtype == "float32" else f" --dtype {dtype}"
        # the import also writes the weights, which a reused IR reads
        r = run.sh(f"models-{name}", f"tk-import {name}.onnx{flag} -o {stem}.tk.yaml", 300,
                   work)
        if r["rc"] != 0:
            run.record("models", model=name, dtype=dtype, variant="import", stage="build",
                       rc=r["rc"], error=r["output"].strip().splitlines()[-1:])
            return []
        done = []
        for variant in args.variants:
            if variant in CONTROL_VARIANTS and name not in CONTROL_MODELS:
                continue
            out = _ir(name, dtype, variant)
            if not (args.reuse_built and (work / out).exists()):
                r = run.sh(f"models-{name}", VARIANTS[variant].format(n=stem, out=out,
                                                                      hw=args.hw), 600, work)
                if r["rc"] != 0:
                    run.record("models", model=name, dtype=dtype, variant=variant,
                               stage="build", rc=r["rc"],
                               error=r["output"].strip().splitlines()[-1:])
                    continue
            if args.build_only:
                run.record("models", model=name, dtype=dtype, variant=variant, built=out)
                continue
            res = check(name, dtype, variant)
            if dtype not in timed:
                run.record("models", model=name, dtype=dtype, variant=variant, rc=res["rc"],
                           seconds=res["seconds"], **_parse_check(res["output"]),
                           tail=res["tail"][:25])
            else:  # recorded with its timing
                done.append((name, dtype, variant, res))
        return done

    # Import, roll and codegen (CPU work, nvcc) and the checks (the CPU reference is most of
    # their time) in parallel; then the timings one at a time, nothing beside them.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        checked = [done for items in pool.map(build_and_check, [
            (name, dtype) for dtype in args.dtypes for name in names]) for done in items]
    calls: dict[str, list] = {}    # each timed variant's kernel calls (tests/gpu/kernel_fit.py)
    for name, dtype, variant, res in checked:
        command = (f"tk-run {_ir(name, dtype, variant)} --device cuda --seed 0 --bench "
                   f"{args.runs} --warmup 3 --report --report-format json")
        timing = run.sh(f"models-{name}", command + " --graph", 300, work)
        figures: dict = {"timing": "graph"}
        if timing["rc"] == 2 and "--graph" in timing["output"]:    # not one CUDA graph
            figures = {"timing": "launched",
                       "graph_error": timing["output"].strip().splitlines()[-1:]}
            timing = run.sh(f"models-{name}", command, 300, work)
        try:
            # the report's JSON line (a warning on stderr may follow it)
            doc = json.loads(next(ln for ln in reversed(timing["output"].splitlines())
                                  if ln.startswith("{")))
            report = doc.get("report", {})
            figures.update(median_ms=doc["bench"]["p50_ms"],
                           launched_ms=report.get("ms_in_kernels"),
                           slowest=report.get("slowest", []))
            if report.get("calls"):
                calls[_ir(name, dtype, variant).removesuffix(".cuda.yaml")] = report["calls"]
                (run.out / "kernels.json").write_text(json.dumps(calls) + "\n")
        except (ValueError, KeyError, IndexError, StopIteration):
            figures = {"timing_error": timing["output"].strip().splitlines()[-1:]}
        run.record("models", model=name, dtype=dtype, variant=variant,
                   rc=res["rc"] or timing["rc"],
                   seconds=res["seconds"], **_parse_check(res["output"]), **figures,
                   tail=res["tail"][:25])


NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis",
                "ComputeWorkloadAnalysis", "WarpStateStats", "SchedulerStats")
#: model.variant whose kernels Nsight Compute reads in the profile step (`--profiled`): the
#: first launches of one run each (every kernel once, in launch order). The models whose
#: kernels take the most time, as rolled and welded, a tk-ram program and a device loop.
PROFILED = ("resnet50.rolled", "resnet50.welded", "densenet121.welded", "vgg19.welded",
            "inception_v2.welded", "bert_encoder_layer.welded", "bert_encoder_layer.program",
            "gpt_block.welded", "lstm_loop.ground")


#: Nsight Compute metrics kept per kernel in the profile summary: (section, metric) -> key.
NCU_METRICS = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration_ns",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_throughput_pct",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_throughput_pct",
    ("GPU Speed Of Light Throughput", "L2 Cache Throughput"): "l2_throughput_pct",
    ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"): "l1_throughput_pct",
    ("Occupancy", "Achieved Occupancy"): "achieved_occupancy_pct",
    ("Occupancy", "Theoretical Occupancy"): "theoretical_occupancy_pct",
    ("Launch Statistics", "Registers Per Thread"): "registers",
    ("Launch Statistics", "Waves Per SM"): "waves",
    ("Launch Statistics", "Grid Size"): "grid",
    ("Launch Statistics", "Block Size"): "block",
    ("Launch Statistics", "Dynamic Shared Memory Per Block"): "dynamic_smem_bytes",
    ("Launch Statistics", "Static Shared Memory Per Block"): "static_smem_bytes",
    ("Memory Workload Analysis", "L2 Hit Rate"): "l2_hit_pct",
    ("Memory Workload Analysis", "L1/TEX Hit Rate"): "l1_hit_pct",
    ("Memory Workload Analysis", "Local Memory Spilling Requests"): "local_spill_requests",
    ("Compute Workload Analysis", "Issue Slots Busy"): "issue_slots_busy_pct",
    ("Scheduler Statistics", "Eligible Warps Per Scheduler"): "eligible_warps",
    ("Scheduler Statistics", "No Eligible", ): "no_eligible_pct",
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): "cycles_per_issue",
}


def ncu_summary(paths: list[Path], top: int = 20) -> dict:
    """Nsight Compute's CSV pages (`--csv --page details`, ncu-<model>.<variant>.csv) as one
    document: per launch the metrics of `NCU_METRICS` and the rules' findings with their
    estimated speed-ups; the `top` longest launches over all files first."""
    import csv
    import io

    launches = []
    for path in paths:
        model, _, variant = path.stem.removeprefix("ncu-").partition(".")
        lines = [ln for ln in path.read_text(errors="replace").splitlines(True)
                 if ln.startswith('"')]
        by_id: dict[str, dict] = {}
        for row in csv.DictReader(io.StringIO("".join(lines))):
            rec = by_id.setdefault(row["ID"], {"model": model, "variant": variant,
                                               "kernel": row["Kernel Name"], "findings": []})
            key = NCU_METRICS.get((row["Section Name"], row["Metric Name"]))
            if key is not None:
                value = row["Metric Value"].replace(",", "")
                try:
                    rec[key] = float(value)
                except ValueError:
                    rec[key] = value
            if row.get("Rule Name") and row.get("Estimated Speedup"):
                finding = {"rule": row["Rule Name"], "type": row.get("Rule Type", ""),
                           "speedup_pct": row["Estimated Speedup"]}
                if finding not in rec["findings"]:
                    rec["findings"].append(finding)
        launches += by_id.values()
    launches.sort(key=lambda r: -float(r.get("duration_ns", 0) or 0))
    return {"metrics": sorted(NCU_METRICS.values()), "launches": len(launches),
            "top": launches[:top], "rest": launches[top:]}


def step_profile(run: Runner, args) -> None:
    """Nsight Compute's sections on the kernels of a few models built by the models step, as
    CSV in the logs (ncu-<model>.<variant>.csv)."""
    if shutil.which("ncu") is None:
        run.record("profile", skipped="ncu is not on PATH")
        return
    work = run.work / "models"
    for name, _, variant in (item.partition(".") for item in args.profiled):
        ir = work / _ir(name, "float32", variant)
        if not ir.exists():
            run.record("profile", model=name, variant=variant, skipped="not built")
            continue
        csv = run.logs / f"ncu-{name}.{variant}.csv"
        sections = " ".join(f"--section {s}" for s in NCU_SECTIONS)
        r = run.sh("profile", f"ncu --clock-control none --target-processes all {sections} "
                   f"--launch-count {args.profile_kernels} --csv --page details "
                   f"python3 {BIN / 'tk-run'} {ir.name} --device cuda --seed 0 -q > {csv}",
                   args.limit_profile, work)
        run.record("profile", model=name, variant=variant, rc=r["rc"], seconds=r["seconds"],
                   csv_bytes=csv.stat().st_size if csv.exists() else 0)
    written = sorted(run.logs.glob("ncu-*.csv"))
    if written:
        (run.out / "ncu-summary.json").write_text(json.dumps(ncu_summary(written), indent=1)
                                                  + "\n")


def step_sanitizer(run: Runner, args) -> None:
    """compute-sanitizer's memcheck, racecheck and synccheck on `SANITIZED` (built by the
    models step when it ran, else here), `--jobs` runs at a time."""
    if shutil.which("compute-sanitizer") is None:
        run.record("sanitizer", skipped="compute-sanitizer is not on PATH")
        return
    work = run.work / "models"
    work.mkdir(exist_ok=True)
    runs = []
    for name, variant in SANITIZED:
        _write_model(name, work)
        if not (work / f"{name}.tk.yaml").exists():
            run.sh("sanitizer", f"tk-import {name}.onnx -o {name}.tk.yaml", 300, work)
        ir = work / _ir(name, "float32", variant)
        if not ir.exists():
            r = run.sh("sanitizer", VARIANTS[variant].format(n=name, out=ir.name, hw=args.hw),
                       600, work)
            if r["rc"]:
                run.record("sanitizer", model=name, variant=variant, rc=r["rc"],
                           stage="build")
                continue
        runs += [(name, variant, tool) for tool in ("memcheck", "racecheck", "synccheck")]

    def sanitize(item: tuple[str, str, str]) -> tuple[str, str, str, dict]:
        name, variant, tool = item
        return name, variant, tool, run.sh(
            "sanitizer", f"compute-sanitizer --tool={tool} --error-exitcode=9 python3 "
            f"{BIN / 'tk-run'} {_ir(name, 'float32', variant)} --device cuda --seed 0",
            args.limit_sanitizer, work)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, variant, tool, r in pool.map(sanitize, runs):
            errors = re.findall(r"ERROR SUMMARY: (\d+) error", r["output"])
            hazards = re.findall(r"RACECHECK SUMMARY: (\d+) hazard", r["output"])
            run.record("sanitizer", model=name, variant=variant, tool=tool, rc=r["rc"],
                       seconds=r["seconds"], errors=errors[-1:] or hazards[-1:] or ["?"])


def _run_bench(run: Runner, step: str, command: str, limit: float,
               pattern: str) -> tuple[dict, list[Path]]:
    """Run a benchmark command; copy the result files (tests/bench/results/`pattern`) that it
    wrote into the output folder."""
    results = ROOT / "tests" / "bench" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.glob(pattern)}
    r = run.sh(step, command, limit)
    written = [p for p in results.glob(pattern) if before.get(p) != p.stat().st_mtime_ns]
    for path in written:
        shutil.copy(path, run.out / path.name)
    return r, written


def step_bench(run: Runner, args) -> None:
    r, written = _run_bench(run, "bench", f"TILEKIT_BENCH_RUNS={args.runs} python3 -m pytest "
                            "tests/bench/test_gpu_bench.py -o addopts='' -q -s "
                            "-p no:cacheprovider --tb=short", args.limit_bench, "*.json")
    run.record("bench", rc=r["rc"], seconds=r["seconds"], written=[p.name for p in written])


STAGES = ("weld", "ram", "grind", "dynamic")


def step_stages(run: Runner, args) -> None:
    for name in args.stages:
        r, written = _run_bench(run, f"stages-{name}", "python3 -m pytest "
                                f"tests/bench/test_gpu_{name}.py -o addopts='' -q -s -rs "
                                "-p no:cacheprovider --tb=short", args.limit_bench,
                                f"{name}-gpu*.json")
        outcome = [ln for ln in r["output"].splitlines()
                   if re.search(r"\d+ (passed|failed|skipped)", ln)]
        run.record("stages", stage=name, rc=r["rc"], seconds=r["seconds"],
                   summary=(outcome or ["?"])[-1], written=[p.name for p in written])


def step_fidelity(run: Runner, args) -> None:
    r, written = _run_bench(run, "fidelity", f"TILEKIT_FIDELITY_RUNS={args.runs} python3 -m "
                            "pytest tests/bench/test_gpu_fidelity.py -k gpu_fidelity "
                            "-o addopts='' -q -s -rs -p no:cacheprovider --tb=short",
                            args.limit_fidelity, "fidelity-*.json")
    figures: dict = {}
    for path in written:  # the suite sample, and the tensor-core sample (fidelity-tc-*)
        summary = json.loads(path.read_text()).get("summary", {})
        figures[path.stem] = {k: summary.get(k) for k in (
            "ops_ranked", "geomean_top1_over_best", "top1_within_10pct", "median_spearman",
            "geomean_estimated_over_measured", "candidates_failed")}
    outcome = [ln for ln in r["output"].splitlines()
               if re.search(r"\d+ (passed|failed|skipped)", ln)]
    run.record("fidelity", rc=r["rc"], seconds=r["seconds"], summary=(outcome or ["?"])[-1],
               written=[p.name for p in written], figures=figures)


def _names(text: str) -> list[str]:
    """A comma-separated argument's names (empty ones dropped)."""
    return [name for name in text.split(",") if name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "out" / "gpu-check"))
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated, of {','.join(STEPS)}")
    parser.add_argument("--work", default=None, help="where models and IR are built "
                        "(default: a temporary folder)")
    parser.add_argument("--hw", default="h100")
    parser.add_argument("--models", type=_names, default=None)
    parser.add_argument("--variants", type=_names,
                        default=list(VARIANTS), help=f"of {','.join(VARIANTS)}")
    parser.add_argument("--dtypes", type=_names,
                        default=["float32"], help=f"of {','.join(DTYPES)}")
    parser.add_argument("--stages", type=_names,
                        default=list(STAGES), help=f"the stages step's benchmarks, of "
                        f"{','.join(STAGES)} (dynamic builds from an empty cache: minutes)")
    parser.add_argument("--runs", type=int, default=20,
                        help="timed runs per model variant (0: check only, no timing)")
    parser.add_argument("--timed-dtypes", type=_names,
                        default=None, help="the dtypes whose variants are timed (default: "
                        "all of --dtypes; the others are checked only)")
    parser.add_argument("--build-only", action="store_true",
                        help="the models step builds the IR and compiles the kernels (into "
                             "TILEKIT_CACHE), checks and times nothing: on a CPU machine, "
                             "before a short GPU lease")
    parser.add_argument("--reuse-built", action="store_true",
                        help="keep a variant's IR already in --work/models (built on another "
                             "machine: the pipeline is deterministic) instead of building it")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 2))
    parser.add_argument("--limit-pytest", type=float, default=300)
    parser.add_argument("--limit-bench", type=float, default=300)
    parser.add_argument("--limit-sanitizer", type=float, default=300)
    parser.add_argument("--limit-probe", type=float, default=180)
    parser.add_argument("--limit-fidelity", type=float, default=300)
    parser.add_argument("--limit-profile", type=float, default=120)
    parser.add_argument("--profile-kernels", type=int, default=60,
                        help="kernel launches Nsight Compute reads per profiled model")
    parser.add_argument("--profiled", type=_names, default=list(PROFILED),
                        help="model.variant, comma-separated: the profile step's models")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Runner(out, Path(args.work or tempfile.mkdtemp(prefix="tk-gpu-check.")))
    steps = _names(args.steps)
    for what, given, known in (("steps", steps, STEPS), ("variants", args.variants, VARIANTS),
                               ("stages", args.stages, STAGES), ("dtypes", args.dtypes, DTYPES),
                               ("models", args.models or [],
                                REAL_MODELS + BUILT_MODELS + CONTROL_MODELS),
                               ("timed dtypes (not in --dtypes)", args.timed_dtypes or [],
                                args.dtypes),
                               ("profiled (model.variant)", args.profiled,
                                [f"{m}.{v}" for m in REAL_MODELS + BUILT_MODELS + CONTROL_MODELS
                                 for v in VARIANTS])):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    for step in steps:
        start = time.monotonic()
        try:
            globals()[f"step_{step}"](run, args)
        except Exception as exc:  # noqa: BLE001 - record it, carry on with the next step
            run.record(step, crashed=f"{type(exc).__name__}: {exc}")
        print(f"[{step}] done in {time.monotonic() - start:.0f} s", flush=True)
        run.pack_logs()
    failed = [r for r in run.records if r.get("rc") not in (0, None) or r.get("crashed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
