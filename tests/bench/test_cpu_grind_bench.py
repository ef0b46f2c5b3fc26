"""tk-grind on the CPU: control flow inside the compiled library against the same loops driven
from the host, and against onnxruntime, side by side.

Run with `make bench` (not part of `make test`), or alone:

    .venv/bin/pytest -q -p no:cacheprovider -o addopts="" tests/bench/test_cpu_grind_bench.py -s

Each control-flow model (tests/models/control_models.py, at the sizes below) is rolled and
welded for the host's CPU profile (tests/bench/cpu_engines.py `host_profile_name`) with its
cores set to the threads run, and generated for the CPU twice: placed by `tk-grind` (every loop,
scan and branch inside the library: one persistent kernel whose blocks are the team's
threads) and by `tk-grind --place host` (the compiled runtime drives each iteration from
Python: one program call per iteration, the carried values copied with NumPy, the condition
read back). One process holds both and an onnxruntime session of the same threads; they
alternate run by run (`RUNS` runs each, after a warm-up), so machine noise hits them alike.
Reported: medians (and minimums), the ratios of medians to onnxruntime's (< 1: faster) and
of the library's to the host-driven. Results go to tests/bench/results/cpu-grind.json
(cpu-grind-<N>threads.json with TILEKIT_BENCH_THREADS). TILEKIT_BENCH_MODELS
(comma-separated) narrows the list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import control_models  # noqa: E402

from cpu_engines import cpu_profile, onnxruntime_session  # noqa: E402
from test_cpu_bench import THREADS, alternate_and_record, profile_name, results_path  # noqa: E402

RUNS = 200
RESULTS = results_path("cpu-grind")
MODELS = {
    "lstm_loop": lambda: control_models.lstm_loop(seq=32, inputs=256, hidden=256),
    "gru_scan": lambda: control_models.gru_scan(seq=32, inputs=256, hidden=256),
    "greedy_decoder": lambda: control_models.greedy_decoder(vocab=512, hidden=256),
    "nested_loops": lambda: control_models.nested_loops(rows=16, cols=256, outer=8, inner=8),
    "blockdrop": lambda: control_models.blockdrop(width=256, blocks=4),
    "skipnet": lambda: control_models.skipnet(width=256, blocks=4),
}
CHOSEN = [m for m in os.environ.get("TILEKIT_BENCH_MODELS", ",".join(MODELS)).split(",")
          if m in MODELS]
RUNNERS = ("host-driven", "in-library", "onnxruntime")


def runners(name: str):
    from tilekit import pipeline
    from tilekit.onnx import import_model
    from tilekit.runtime.compiled import CpuProgram

    model = MODELS[name]()
    imported = import_model(model, name=name)
    profile = cpu_profile(THREADS, profile_name())
    start = imported.module.with_stage("import")

    def made(place: str):
        ctx = pipeline.Context(profile=profile, options={"place": place})
        return pipeline.run(start, ["roll", "weld", "grind", "codegen"], ctx)

    ground, hosted = made("auto"), made("host")
    inputs = control_models.feeds(name, model)
    weights = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    session = onnxruntime_session(model.SerializeToString(), THREADS, spinning=False)
    programs = {"host-driven": CpuProgram(hosted, THREADS, profile=profile),
                "in-library": CpuProgram(ground, THREADS, profile=profile)}
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    for program in programs.values():
        got = program.run(inputs, weights)
        for k, value in want.items():
            np.testing.assert_allclose(got[k], value, rtol=1e-4, atol=1e-5, err_msg=k)
    from tilekit.ir.control import walk

    placed = {path: rec.grind["run"] for path, rec, _ in walk(ground)}
    calls = {n: (lambda p=p: p.run(inputs, weights)) for n, p in programs.items()}
    calls["onnxruntime"] = lambda: session.run(None, inputs)
    return calls, {"placements": placed}


@pytest.mark.parametrize("name", CHOSEN)
def test_in_library_against_host_driven_and_onnxruntime(name):
    calls, facts = runners(name)
    alternate_and_record(
        name, {n: calls[n] for n in RUNNERS}, RUNS, "onnxruntime", RESULTS,
        "tests/bench/test_cpu_grind_bench.py", facts,
        extra=lambda median: {"in_library_vs_host_driven": round(
            median["in-library"] / median["host-driven"], 3)},
        note=" (same threads, its pool not spinning)")
