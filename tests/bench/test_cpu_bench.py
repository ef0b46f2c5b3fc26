"""tk-run's CPU executor against onnxruntime: latency and peak memory, side by side.

Run with `make bench` (not part of `make test`). For each model, engines alternate in fresh
processes (tilekit, onnxruntime, tilekit, ...) `ROUNDS` times; each process times `RUNS` runs
after a warm-up. Reported: the ratio of medians (tilekit / onnxruntime; < 1 means tilekit is
faster) and the ratio of peak resident memory. Results go to tests/bench/results/cpu.json.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402
from models.onnx_check import with_random_weights  # noqa: E402

from tilekit.runtime.bench import cpu_description  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ROUNDS = 3
RUNS = 5
RESULTS = ROOT / "tests" / "bench" / "results" / "cpu.json"


def build(name: str, folder: Path) -> Path:
    path = folder / f"{name}.onnx"
    if name == "resnet50":
        model = with_random_weights(LIGHT / "light_resnet50.onnx")
    elif name == "bert_layer":
        model = onnx_models.bert_encoder_layer(batch=1, seq=128, hidden=768, heads=12, ffn=3072)
    elif name == "mobilenet_block":
        model = onnx_models.mobilenet_block(channels=32, expand=6, size=56, classes=1000)
    else:
        raise KeyError(name)
    onnx.save(model, str(path))
    return path


def measure(engine: str, model: Path) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "bench" / "cpu_engines.py"),
                          "--engine", engine, "--model", str(model), "--runs", str(RUNS)],
                         capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", ["resnet50", "bert_layer", "mobilenet_block"])
def test_cpu_latency_and_memory_against_onnxruntime(name, tmp_path):
    model = build(name, tmp_path)
    runs = {"tilekit": [], "onnxruntime": []}
    peak = {"tilekit": [], "onnxruntime": []}
    for _ in range(ROUNDS):
        for engine in ("tilekit", "onnxruntime"):
            result = measure(engine, model)
            runs[engine].extend(result["times_ms"])
            peak[engine].append(result["peak_rss_mib"])
    median = {e: statistics.median(t) for e, t in runs.items()}
    mem = {e: max(p) for e, p in peak.items()}
    row = {
        "model": name,
        "tilekit_median_ms": round(median["tilekit"], 2),
        "onnxruntime_median_ms": round(median["onnxruntime"], 2),
        "latency_ratio": round(median["tilekit"] / median["onnxruntime"], 2),
        "tilekit_peak_rss_mib": round(mem["tilekit"], 1),
        "onnxruntime_peak_rss_mib": round(mem["onnxruntime"], 1),
        "memory_ratio": round(mem["tilekit"] / mem["onnxruntime"], 2),
    }
    print(f"\n{name}: tilekit {row['tilekit_median_ms']} ms vs onnxruntime "
          f"{row['onnxruntime_median_ms']} ms (x{row['latency_ratio']}); peak RSS "
          f"{row['tilekit_peak_rss_mib']} vs {row['onnxruntime_peak_rss_mib']} MiB "
          f"(x{row['memory_ratio']})")
    record(row)


def record(row: dict) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.update({
        "command": "make bench (tests/bench/test_cpu_bench.py)",
        "date": datetime.date.today().isoformat(),
        "device": cpu_description(),
        "python": platform.python_version(),
        "method": f"{ROUNDS} alternating fresh processes per engine, {RUNS} timed runs each "
                  "after one warm-up; median of all runs; peak RSS of the process",
    })
    data.setdefault("models", {})[row["model"]] = row
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
