"""GPU benchmark of control flow (issue 11): each control-flow test model run three ways on
the device, same inputs, checked against the CPU reference:

- tilekit host-driven: `tk-roll | tk-grind --place host | tk-codegen`, the host launching the
  bodies per iteration and reading conditions back (tilekit/runtime/cuda_control.py);
- tilekit ground: `tk-roll | tk-grind | tk-codegen`, device loops and branches as persistent
  cooperative kernels where tk-grind placed them;
- PyTorch eager running the same ONNX graph (tests/bench/torch_control.py: one torch call per
  node, `.item()` for trip counts, conditions and predicates).

Wall-clock medians of `RUNS` runs after `WARMUP` (host synchronisations are part of what is
measured), the launches and host synchronisations counted per run, and the cost model's
estimates beside them. Results: tests/bench/results/grind-gpu.json. About a minute on an H100:

    pytest tests/bench/test_gpu_grind.py -o addopts="" -s -m gpu

Skipped without CuPy, PyTorch with CUDA, or a GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grind_figures import ground, inference_figures  # noqa: E402
from models.control_models import MODELS, feeds  # noqa: E402

RUNS = 50
WARMUP = 5
RESULTS = ROOT / "tests" / "bench" / "results" / "grind-gpu.json"


def _median_ms(fn, sync) -> float:
    for _ in range(WARMUP):
        fn()
    sync()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _tilekit(imported, inputs, place: str, cuda) -> dict:
    from tilekit.codegen.module import generate
    from tilekit.hw import load_profile

    placed = ground(imported.module, place)
    module = generate(placed, load_profile("h100"), cuda.device_arch()).module
    program = cuda.prepare(module)
    program.upload(inputs, imported.weights)
    stream = program.cupy.cuda.get_current_stream()
    before = dict(program.counts)
    ms = _median_ms(program.launch_all, stream.synchronize)
    runs = RUNS + WARMUP
    got = program.download(inputs, imported.weights)
    return {"ms": round(ms, 4), "outputs": got,
            "launches": (program.counts["launches"] - before["launches"]) / runs,
            "syncs": (program.counts["syncs"] - before["syncs"]) / runs,
            "estimate": inference_figures(placed)}


def _rel(got, want) -> float:
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.gpu
def test_host_driven_ground_and_pytorch_eager():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    from tilekit.runtime import cuda

    cuda.require_cupy()
    from torch_control import ControlModel

    from tilekit.onnx import import_model
    from tilekit.runtime import run_module

    rows, failures = {}, []
    for name, build in MODELS.items():
        model = build()
        imported = import_model(model, name=name)
        inputs = feeds(name, model)
        want = run_module(imported.module, inputs, imported.weights)
        row = {}
        for place, key in (("host", "host_driven"), ("auto", "ground")):
            result = _tilekit(imported, inputs, place, cuda)
            outputs = result.pop("outputs")
            result["rel_l2"] = max(_rel(outputs[k], v) for k, v in want.items())
            row[key] = result
            if result["rel_l2"] > 1e-4:
                failures.append(f"{name} {key}: rel_l2 {result['rel_l2']:.2e}")
        eager = ControlModel(model, "cuda")
        args = [torch.from_numpy(np.ascontiguousarray(inputs[n])).cuda()
                for n in eager.input_names]
        with torch.no_grad():
            row["torch_eager"] = {"ms": round(_median_ms(lambda: eager(*args),
                                                         torch.cuda.synchronize), 4)}
        row["ratio_ground_to_eager"] = round(row["ground"]["ms"] / row["torch_eager"]["ms"], 3)
        row["ratio_ground_to_host"] = round(row["ground"]["ms"] / row["host_driven"]["ms"], 3)
        rows[name] = row
        print(f"{name:15} host {row['host_driven']['ms']:.3f} ms, ground "
              f"{row['ground']['ms']:.3f} ms, eager {row['torch_eager']['ms']:.3f} ms")
    RESULTS.write_text(json.dumps({
        "command": "pytest tests/bench/test_gpu_grind.py -o addopts='' -s -m gpu",
        "device": cuda.device_description(), "runs": RUNS, "warmup": WARMUP,
        "models": rows}, indent=2) + "\n")
    assert not failures, failures
