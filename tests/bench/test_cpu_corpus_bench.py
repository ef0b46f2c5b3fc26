"""Compiled CPU code against onnxruntime on the model corpus: real architectures exported by
both torch exporters (tests/data/corpus/, tiny random configurations), side by side.

Run with `make bench` (not part of `make test`), or alone:

    .venv/bin/pytest -q -p no:cacheprovider -o addopts="" tests/bench/test_cpu_corpus_bench.py -s

Each file with static shapes (the dynamic exports have static twins) is imported, rolled and
welded for the host's CPU profile (tests/bench/cpu_engines.py `host_profile_name`) with its
cores set to the threads run, and generated for the CPU, as `tk-import M.onnx | tk-roll
--hw PROFILE | tk-weld | tk-codegen | tk-run` runs it. One process holds the compiled
program and an onnxruntime session of the same threads (its pool not spinning between
runs, which would take the cores the next runner needs); the outputs must agree; the two
alternate run by run, `RUNS` runs each after a warm-up. Reported per file: medians (and
minimums) and the ratio of medians (tilekit / onnxruntime, < 1: faster); the geomean over
the files is printed at the end. Results go to tests/bench/results/cpu-corpus.json
(cpu-corpus-<N>threads.json with TILEKIT_BENCH_THREADS). TILEKIT_BENCH_MODELS
(comma-separated file stems) narrows the list.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models.onnx_check import random_inputs  # noqa: E402

from cpu_engines import cpu_profile, onnxruntime_session  # noqa: E402
from test_cpu_bench import (THREADS, alternate_and_record, profile_name,  # noqa: E402
                            results_path)

RUNS = 50
RESULTS = results_path("cpu-corpus")
CORPUS = ROOT / "tests" / "data" / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())["models"]
STATIC = sorted(k for k, m in MANIFEST.items() if not m["dynamic"])
CHOSEN = [m for m in os.environ.get("TILEKIT_BENCH_MODELS", ",".join(STATIC)).split(",")
          if m in STATIC]
RUNNERS = ("tilekit", "onnxruntime")


def runners(name: str):
    from tilekit import pipeline
    from tilekit.onnx import import_model
    from tilekit.runtime.compiled import CpuProgram

    model = onnx.load(str(CORPUS / MANIFEST[name]["file"]))
    imported = import_model(model, name=name.replace(".", "_"))
    profile = cpu_profile(THREADS, profile_name())
    module = pipeline.run(imported.module.with_stage("import"), ["roll", "weld", "codegen"],
                          pipeline.Context(profile=profile))
    program = CpuProgram(module, THREADS, profile=profile)
    feeds = random_inputs(model, 0)
    renamed = (module.source or {}).get("inputs", {})
    inputs = {ir: feeds[renamed.get(ir, ir)] for ir in module.inputs}
    weights = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    session = onnxruntime_session(model.SerializeToString(), THREADS, spinning=False)
    got = program.run(inputs, weights)
    for ir, value in zip(module.outputs, session.run(None, feeds)):
        want = np.asarray(value, dtype=np.float64)
        have = np.asarray(got[ir], dtype=np.float64)
        scale = max(float(np.linalg.norm(want)), 1e-30)
        assert float(np.linalg.norm(have - want)) / scale <= 1e-3, (name, ir)
    return {"tilekit": lambda: program.run(inputs, weights),
            "onnxruntime": lambda: session.run(None, feeds)}, {
        "kernels": len(module.codegen["kernels"])}


@pytest.mark.parametrize("name", CHOSEN)
def test_compiled_against_onnxruntime(name):
    calls, facts = runners(name)
    alternate_and_record(name, {n: calls[n] for n in RUNNERS}, RUNS, "onnxruntime", RESULTS,
                         "tests/bench/test_cpu_corpus_bench.py", facts,
                         note=" (same threads, its pool not spinning)")


def test_geomean_of_the_corpus():
    """The geomean of the ratios recorded for the files chosen (the tests above, this run)."""
    if not RESULTS.exists():
        pytest.skip("no corpus results recorded")
    rows = json.loads(RESULTS.read_text()).get("models", {})
    ratios = {m: rows[m]["tilekit_vs_onnxruntime"] for m in CHOSEN if m in rows}
    if not ratios:
        pytest.skip("no corpus results recorded")
    geomean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    worst = max(ratios, key=ratios.get)
    print(f"\ncorpus ({THREADS} threads, {len(ratios)} files): geomean {geomean:.3f}x "
          f"onnxruntime, slowest {worst} {ratios[worst]:.2f}x, fastest "
          f"{min(ratios, key=ratios.get)} {min(ratios.values()):.2f}x")
