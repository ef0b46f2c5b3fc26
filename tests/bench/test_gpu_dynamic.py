"""Dynamic shapes on the GPU: one symbolic import run at several sequence lengths, its CUDA
kernels from templates whose sizes are read at run time (tilekit.runtime.family: one nvcc
build per structure), against a module imported and built for each length.

    make bench            # or: pytest tests/bench/test_gpu_dynamic.py -o addopts="" -s

Needs CuPy and a GPU (skipped elsewhere). For the GPT-2 and BERT exports of the corpus
(batch 1) at `SIZES`, with the default kernels and rolled (one roll of the symbolic module
for the range against a roll per size): the compile cost of both paths from an empty build
cache (wall time, nvcc builds), the kernels' time of each length's two programs (CUDA
events, kernels only: `ROUNDS` alternating rounds of `RUNS` runs, median of the rounds'
medians) and their ratio; the outputs must agree. Results: tests/bench/results/dynamic-gpu-<device>.json.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from test_dynamic_bench import (CORPUS, _Clock, _compile_cost, _feeds,  # noqa: E402
                                agreeing, symbolic_programs)

MODELS = ("gpt2.ts17.dynamic", "bert.ts17.dynamic")
SIZES = (1, 17, 40, 63)
ROUNDS, RUNS = 5, 20


def _time(program, feeds, weights) -> float:
    program.upload(feeds, weights)
    return program.time(RUNS, warmup=2).median


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["default", "rolled"])
@pytest.mark.parametrize("model", MODELS)
def test_one_symbolic_import_on_the_gpu(model, schedule, tmp_path, monkeypatch):
    """`default`: the kernels without a tile on both paths; `rolled`: one roll of the
    symbolic module for the range (tilekit.roll.dynamic) against a roll per size."""
    import tilekit
    from tilekit.codegen import generate
    from tilekit.runtime.cuda import CudaProgram, device_description
    from tilekit.runtime.fold import fold_constants

    device = device_description()
    hw = ("h100" if "H100" in device or "H200" in device else "a100") \
        if schedule == "rolled" else None
    path = CORPUS / f"{model}.onnx"
    symbolic_clock, specialised_clock = _Clock(), _Clock()
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "symbolic"))
    module, (batch, seq), family, programs = symbolic_programs(
        path, "cuda", SIZES, symbolic_clock,
        lambda family, instance, values: family.program(instance, values), hw)
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "specialised"))
    for size in SIZES:
        with specialised_clock:
            one = tilekit.compile(path, ["roll"] if hw else [], hw=hw,
                                  dims={batch: 1, seq: size})
            instance, weights = fold_constants(one.module, one.weights)
            programs[size].append((CudaProgram(generate(instance).module), weights))
    rows = {}
    for size in SIZES:
        feeds = _feeds(module, {batch: 1, seq: size})
        sym, sym_w, spec, spec_w = agreeing(programs[size], feeds)
        times = {"symbolic": [], "specialised": []}
        for _ in range(ROUNDS):
            times["symbolic"].append(_time(sym, feeds, sym_w))
            times["specialised"].append(_time(spec, feeds, spec_w))
        us = {k: round(statistics.median(v) * 1e6, 2) for k, v in times.items()}
        rows[str(size)] = {"symbolic_us": us["symbolic"], "specialised_us": us["specialised"],
                           "ratio": round(us["symbolic"] / us["specialised"], 3)}
    row = {"model": f"{model} ({schedule})", "sizes": {"batch": 1, "sequence": list(SIZES)},
           "compile": _compile_cost(symbolic_clock, family.builds, specialised_clock,
                                    len(SIZES)),
           "run": rows}
    print(f"\n{model} ({schedule}) on {device}: compile for {len(SIZES)} sizes: symbolic "
          f"{row['compile']['symbolic']['wall_s']} s ({family.builds} builds), specialised "
          f"{row['compile']['specialised']['wall_s']} s; kernels symbolic/specialised "
          + ", ".join(f"seq {s}: {r['ratio']}" for s, r in rows.items()))
    slug = re.sub(r"[^a-z0-9]+", "_", device.split("(")[0].strip().lower()).strip("_")
    results = ROOT / "tests" / "bench" / "results" / f"dynamic-gpu-{slug}.json"
    data = json.loads(results.read_text()) if results.exists() else {}
    data.update({"command": "make bench (tests/bench/test_gpu_dynamic.py)", "device": device,
                 "method": f"compile: import + generate + nvcc from an empty cache (symbolic: "
                           f"one build per structure); kernels: CUDA events, {ROUNDS} "
                           f"alternating rounds of {RUNS} runs, median of the rounds' medians"})
    data.setdefault("models", {})[row["model"]] = row
    results.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
