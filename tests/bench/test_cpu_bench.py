"""tilekit on the CPU against onnxruntime: latency and peak memory, side by side.

Run with `make bench` (not part of `make test`). Engines (tests/bench/cpu_engines.py): the
NumPy reference executor (`tilekit`), the compiled CPU code on the default schedules
(`compiled`: tk-codegen --target cpu) and after tk-roll and tk-weld for a CPU profile
(`compiled-cpu`), and onnxruntime, all with the same threads. For each model, engines alternate in fresh processes
`ROUNDS` times; each process times `RUNS` runs after a warm-up. Reported: each engine's
median, the ratio of medians to onnxruntime's (< 1 means tilekit is faster) and peak resident
memory. Results go to tests/bench/results/cpu.json. TILEKIT_BENCH_ROUNDS sets the rounds;
TILEKIT_BENCH_MODELS and
TILEKIT_BENCH_ENGINES (comma-separated) narrow the models and choose the engines (e.g.
`compiled-cpu,compiled-cpu-per-kernel`).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from models import onnx_models  # noqa: E402
from models.onnx_check import with_random_weights  # noqa: E402

from tilekit.runtime.bench import cpu_description  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
#: Alternating fresh processes per engine: TILEKIT_BENCH_ROUNDS, else 3 (more where the
#: machine is noisy: each round is a sample of its state).
ROUNDS = int(os.environ.get("TILEKIT_BENCH_ROUNDS", "0")) or 3
#: Timed runs per process: the first runs of a process are slower (its pages, its threads'
#: first wake-ups; onnxruntime's first run after the warm-up takes 3-4x its median on the
#: MobileNet block), so 20 rather than 5 keep the medians to the steady state.
RUNS = 20
#: Threads of every engine: TILEKIT_BENCH_THREADS, else every core (results in cpu.json; with
#: the variable set, in cpu-<N>threads.json).
THREADS = int(os.environ.get("TILEKIT_BENCH_THREADS", "0")) or (os.cpu_count() or 1)


def results_path(stem: str) -> Path:
    """tests/bench/results/<stem>.json, or <stem>-<N>threads.json with TILEKIT_BENCH_THREADS."""
    name = f"{stem}-{THREADS}threads" if os.environ.get("TILEKIT_BENCH_THREADS") else stem
    return ROOT / "tests" / "bench" / "results" / f"{name}.json"


RESULTS = results_path("cpu")


def build(name: str, folder: Path) -> Path:
    path = folder / f"{name}.onnx"
    if name == "resnet50":
        model = with_random_weights(LIGHT / "light_resnet50.onnx")
    elif name == "bert_layer":
        model = onnx_models.bert_encoder_layer(batch=1, seq=128, hidden=768, heads=12, ffn=3072)
    elif name == "mobilenet_block":
        model = onnx_models.mobilenet_block(channels=32, expand=6, size=56, classes=1000)
    elif name == "gpt_block":
        model = onnx_models.gpt_block(batch=1, seq=128, hidden=768, heads=12)
    elif name == "mlp_mixer":   # one Mixer-S/16 block: 196 patches x 512 channels
        model = onnx_models.mlp_mixer_block(batch=1, tokens=196, channels=512,
                                            token_hidden=256, channel_hidden=2048)
    elif name == "lstm":
        model = onnx_models.lstm_model(seq=32, batch=1, inputs=256, hidden=512)
    else:
        raise KeyError(name)
    onnx.save(model, str(path))
    return path


def measure(engine: str, model: Path, runs: int = RUNS) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "bench" / "cpu_engines.py"),
                          "--engine", engine, "--model", str(model), "--runs", str(runs),
                          "--threads", str(THREADS), "--profile", profile_name()],
                         capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout)


#: Engines compared (TILEKIT_BENCH_ENGINES, comma-separated, adds or narrows; onnxruntime is
#: always run: the ratios are to it). The per-kernel engines call each compiled kernel
#: through its own entry, to compare against the one-call program entry.
ENGINES = tuple(dict.fromkeys([
    *[e for e in os.environ.get("TILEKIT_BENCH_ENGINES",
                                "tilekit,compiled,compiled-cpu").split(",") if e],
    "onnxruntime"]))
MODELS = ["resnet50", "bert_layer", "gpt_block", "mobilenet_block", "mlp_mixer", "lstm"]
#: Models run: TILEKIT_BENCH_MODELS (comma-separated) narrows the list.
CHOSEN = [m for m in os.environ.get("TILEKIT_BENCH_MODELS", ",".join(MODELS)).split(",")
          if m in MODELS]


@pytest.mark.parametrize("name", CHOSEN)
def test_cpu_latency_and_memory_against_onnxruntime(name, tmp_path):
    record(side_by_side(name, build(name, tmp_path), ENGINES), profile=profile_name())


@functools.lru_cache(maxsize=None)
def profile_name() -> str:
    """The compiled-cpu engines' CPU profile, chosen once per run (cpu_engines)."""
    from cpu_engines import host_profile_name

    return host_profile_name()


def side_by_side(name: str, model: Path, engines, runs: int = RUNS) -> dict:
    """`engines` on `model`, alternating fresh processes `ROUNDS` times of `runs` timed runs
    each, each round in an order rotated by one: each engine's median latency, its ratio to
    onnxruntime's and its peak memory (and the compiled engines' kernels' own median time),
    as one results row."""
    times = {e: [] for e in engines}
    kernels = {e: [] for e in engines}
    peak = {e: [] for e in engines}
    engines = list(engines)
    for r in range(ROUNDS):
        # each round starts one engine later: a process's place in the round changed its
        # times by up to a third (the BERT layer on one thread, 16 ms first, 21 ms third)
        for engine in engines[r % len(engines):] + engines[:r % len(engines)]:
            result = measure(engine, model, runs)
            times[engine].extend(result["times_ms"])
            kernels[engine].extend(result.get("kernel_times_ms", ()))
            peak[engine].append(result["peak_rss_mib"])
    median = {e: statistics.median(t) for e, t in times.items()}
    mem = {e: max(p) for e, p in peak.items()}
    row = {"model": name}
    for e in engines:
        key = e.replace("-", "_")
        row[f"{key}_median_ms"] = round(median[e], 3)
        row[f"{key}_peak_rss_mib"] = round(mem[e], 1)
        if e != "onnxruntime":
            row[f"{key}_latency_ratio"] = round(median[e] / median["onnxruntime"], 2)
        if kernels[e]:
            row[f"{key}_kernels_median_ms"] = round(statistics.median(kernels[e]), 3)
    print(f"\n{name}: " + "; ".join(f"{e} {median[e]:.3f} ms" for e in engines))
    return row


def alternating(calls: dict, runs: int, baseline: str) -> tuple[dict, dict, str]:
    """Each of `calls` (name -> a run) once to warm up, then `runs` times, alternating run by
    run in one process so that machine noise hits them alike: ({name: median ms}, the results
    row's fields: each one's median and least ms and its ratio of medians to `baseline`'s,
    a line for the log)."""
    for call in calls.values():
        call()
    times: dict = {n: [] for n in calls}
    for _ in range(runs):
        for n, call in calls.items():
            start = time.perf_counter()
            call()
            times[n].append(time.perf_counter() - start)
    median = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    best = {n: min(t) * 1e3 for n, t in times.items()}
    fields: dict = {}
    for n in calls:
        key = n.replace("-", "_")
        fields[f"{key}_median_ms"] = round(median[n], 4)
        fields[f"{key}_min_ms"] = round(best[n], 4)
        fields[f"{key}_vs_{baseline.replace('-', '_')}"] = round(median[n] / median[baseline], 3)
    line = "; ".join(f"{n} {median[n]:.3f} ms ({median[n] / median[baseline]:.2f}x "
                     f"{baseline}, min {best[n]:.3f})" for n in calls)
    return median, fields, line


def alternate_and_record(name: str, calls: dict, runs: int, baseline: str, results: Path,
                         script: str, facts: dict, extra=None, note: str = "") -> dict:
    """`alternating` of `calls`, printed and recorded as model `name`'s row of `results`
    with `facts`, and `extra(medians)`'s fields (ratios between runners) after them."""
    median, fields, line = alternating(calls, runs, baseline)
    more = extra(median) if extra else {}
    row = {"model": name, **facts, **fields, **more}
    print(f"\n{name} ({THREADS} threads): {line}"
          + "".join(f"; {k.replace('_', ' ')} {v:.2f}" for k, v in more.items()))
    record(row, results, f"make bench ({script})", profile=profile_name(),
           method=f"one process, the runners alternating run by run, {runs} runs each after "
                  f"one warm-up; medians and minimums; ratios of medians to {baseline}'s"
                  + note)
    return row


def record(row: dict, results: Path = RESULTS,
           command: str = "make bench (tests/bench/test_cpu_bench.py)", runs: int = RUNS,
           method: str | None = None, threads: int | None = None,
           profile: str | None = None) -> None:
    """Merge `row` into the results file `results`, with the run's command, date, device,
    threads (default: this file's) and method (by default this file's: alternating fresh
    processes)."""
    data = json.loads(results.read_text()) if results.exists() else {}
    data.update({
        "command": command,
        "date": datetime.date.today().isoformat(),
        "device": cpu_description(),
        "threads": THREADS if threads is None else threads,
        "python": platform.python_version(),
        "method": method or f"{ROUNDS} alternating fresh processes per engine (each "
                            f"round's order rotated by one), {runs} timed runs each after one "
                            "warm-up; median of all runs; peak RSS of the process",
    })
    if profile:
        data["profile"] = profile
    data.setdefault("models", {})[row["model"]] = row
    results.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
