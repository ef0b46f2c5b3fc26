"""tk-ram on the CPU: a packed program against op-by-op runs of the same kernels, side by side.

Run with `make bench` (not part of `make test`), or alone:

    .venv/bin/pytest -q -p no:cacheprovider -o addopts="" tests/bench/test_cpu_ram_bench.py -s

Each many-branch model (tests/models/ram_models.py; and the LSTM, a chain) is rolled and
welded for the host's CPU profile (tests/bench/cpu_engines.py `host_profile_name`) with its
cores set to the threads run, planned by tk-ram for that profile and
generated for the CPU. One process loads four runners of the same kernels:

- `per-kernel`: each kernel's own entry, one ctypes call and one parallel region each (the
  compiled runtime before the program entry);
- `op-by-op`: one call per run, one OpenMP team, a barrier after every kernel (each kernel
  on all threads, one after the other);
- `one-call`: the default without a plan: one call, barriers only between dependent
  kernels;
- `packed`: tk-ram's plan: operators' blocks on vEUs (threads), counters instead of
  barriers.

The runners alternate run by run (`RUNS` runs each, after a warm-up), so machine noise hits
them alike; reported are the medians (and minimums) and the ratios of medians to `op-by-op`
(< 1: faster). Results go
to tests/bench/results/cpu-ram.json (cpu-ram-<N>threads.json with TILEKIT_BENCH_THREADS).
Models: TILEKIT_BENCH_MODELS (comma-separated) narrows the list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models, ram_models  # noqa: E402

from cpu_engines import cpu_profile  # noqa: E402
from test_cpu_bench import THREADS, alternate_and_record, profile_name, results_path  # noqa: E402

RUNS = 300
RESULTS = results_path("cpu-ram")
MODELS = {
    "inception_block": lambda: ram_models.inception_block(channels=64, size=14, width=16,
                                                          towers=2),
    "inception_small": lambda: ram_models.inception_block(channels=32, size=7, width=8,
                                                          towers=4),
    "resnext_block": lambda: ram_models.resnext_block(channels=64, paths=16, width=4, size=14),
    "nasnet_cell": lambda: ram_models.nasnet_cell(channels=32, size=14),
    # no branches: a chain of small kernels (tests/bench/test_cpu_bench.py's LSTM), where the
    # program entry's gain over a call per kernel is all there is
    "lstm": lambda: onnx_models.lstm_model(seq=32, batch=1, inputs=256, hidden=512),
}
CHOSEN = [m for m in os.environ.get("TILEKIT_BENCH_MODELS", ",".join(MODELS)).split(",")
          if m in MODELS]
RUNNERS = ("per-kernel", "op-by-op", "one-call", "packed")


def runners(name: str, folder: Path):
    from tilekit.codegen import generate
    from tilekit.codegen.cpu_ram import cpu_kernels
    from tilekit.ir.program import parse_program
    from tilekit.onnx import import_model, load_model
    from tilekit.ram import ram_module
    from tilekit.roll.schedule import roll_module
    from tilekit.runtime.compiled import CpuProgram
    from tilekit.weld import weld_module

    path = folder / f"{name}.onnx"
    onnx.save(MODELS[name](), str(path))
    imported = import_model(load_model(str(path)))
    profile = cpu_profile(THREADS, profile_name())
    welded = weld_module(roll_module(imported.module.with_stage("import"), profile), profile)
    planned = ram_module(welded, profile, cpu_kernels=cpu_kernels)
    plain = generate(welded, profile, target="cpu").module
    packed = generate(planned, profile, target="cpu").module
    weights = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(plain.tensors[n].shape).astype(np.float32)
              for n in plain.inputs}
    made = {"per-kernel": CpuProgram(plain, THREADS, per_kernel=True),
            "op-by-op": CpuProgram(plain, THREADS, overlap=False),
            "one-call": CpuProgram(plain, THREADS),
            "packed": CpuProgram(packed, THREADS)}
    assert made["packed"].plan is not None
    want = made["per-kernel"].run(inputs, weights)
    for r in made.values():   # the same kernels (FMAs may be contracted otherwise where a
        got = r.run(inputs, weights)   # body is inlined elsewhere: the LSTM amplifies that)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-2, atol=1e-2)
    program = parse_program(planned.program)
    facts = {"kernels": len(made["one-call"].kernel_records),
             "segments": len(program.segments),
             "persistent_segments": sum(s.kind == "persistent" for s in program.segments),
             "rtasks": program.tasks,
             "estimated_makespan_us": program.estimate["makespan_us"],
             "estimated_per_op_us": program.estimate["per_op_kernels_us"]}
    return {n: (lambda r=r: r.run(inputs, weights)) for n, r in made.items()}, facts


@pytest.mark.parametrize("name", CHOSEN)
def test_packed_against_op_by_op(name, tmp_path):
    calls, facts = runners(name, tmp_path)
    alternate_and_record(name, {n: calls[n] for n in RUNNERS}, RUNS, "op-by-op", RESULTS,
                         "tests/bench/test_cpu_ram_bench.py", facts)
