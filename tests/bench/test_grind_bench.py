"""tk-grind's figures for the control-flow test models (no GPU needed):

- per model, kernel launches and host synchronisations per inference, host-driven against
  ground (tk-grind's placement), and the estimated H100 time of each (the cost model's:
  tilekit/grind/cost.py);
- `tk-run --device cpu` against onnxruntime on the same model and inputs: median of `RUNS`
  runs each, in this process, and their ratio (tilekit / onnxruntime: below 1 is faster).

    pytest tests/bench/test_grind_bench.py -o addopts="" -s

Results go to tests/bench/results/grind.json (docs/grind.md and the README quote them).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grind_figures import ground, inference_figures  # noqa: E402
from models.control_models import MODELS, feeds  # noqa: E402

from tilekit.onnx import import_model  # noqa: E402
from tilekit.runtime import run_module  # noqa: E402
from tilekit.runtime.bench import cpu_description  # noqa: E402

RUNS = 30
RESULTS = ROOT / "tests" / "bench" / "results" / "grind.json"


def _median_ms(fn) -> float:
    fn()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def test_grind_figures_and_cpu_against_onnxruntime():
    import onnxruntime as ort

    rows = {}
    for name, build in MODELS.items():
        model = build()
        imported = import_model(model, name=name)
        placed = ground(imported.module)
        host = ground(imported.module, "host")
        inputs = feeds(name, model)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        tk_ms = _median_ms(lambda: run_module(imported.module, inputs, imported.weights))
        ort_ms = _median_ms(lambda: session.run(None, inputs))
        figures = {"host_driven": inference_figures(host), "ground": inference_figures(placed)}
        rows[name] = {**figures, "placements": _placements(placed),
                      "cpu": {"tilekit_ms": round(tk_ms, 3), "onnxruntime_ms": round(ort_ms, 3),
                              "ratio": round(tk_ms / ort_ms, 2)}}
        assert figures["ground"]["est_us"] <= figures["host_driven"]["est_us"]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": "pytest tests/bench/test_grind_bench.py -o addopts='' -s",
        "estimates_for": "h100 (hwprofiles/h100.yaml; tilekit/grind/cost.py assumptions)",
        "cpu": cpu_description(), "runs": RUNS, "models": rows}, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:15} host-driven {row['host_driven']} ground {row['ground']} "
              f"cpu {row['cpu']}")


def _placements(module) -> dict:
    from tilekit.ir.control import walk

    return {path: rec.grind["run"] for path, rec, _ in walk(module)}
