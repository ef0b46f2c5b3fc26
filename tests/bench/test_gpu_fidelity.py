"""GPU benchmark: how well tk-roll's cost model ranks its own top-10 tiles on the device.

    PYTHONPATH=. python3 -m pytest tests/bench/test_gpu_fidelity.py -o addopts="" -q -s

A deterministic sample of the 119-op suite (every 4th op of specs/workloads.yaml, 30 ops) is
rolled for the device's profile with `--top-k 10`; every candidate becomes its own kernel
(tilekit.runtime.fidelity), all of them compiled by nvcc in one translation unit (split over
`TILEKIT_FIDELITY_JOBS` units compiled in parallel, default up to 4), checked once against the
CPU reference executor and timed with CUDA events (median of RUNS launches after WARMUP, L2
flushed before each). Per op: the pick's time over the best measured, the pick's rank,
Spearman's rank correlation of estimated and measured times, estimated over measured for the
pick; then the sample's summary. Results go to tests/bench/results/fidelity-<device>.json
with the command and the date, and a table is printed. How to read them: docs/roll.md,
"Fidelity".

The GPU test is marked `gpu` (skipped without CuPy or a device) and needs nvcc.
`test_candidates_build` runs everywhere: it builds every candidate of the sample and, where
nvcc is installed, compiles them for sm_90, so the benchmark cannot rot unnoticed.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import pytest

from test_gpu_bench import profile_for  # the profile matching the device's arch
from tilekit.hw import load_profile
from tilekit.runtime import fidelity

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = int(os.environ.get("TILEKIT_FIDELITY_RUNS", "20"))
WARMUP = 3
TOP_K = 10
JOBS = int(os.environ.get("TILEKIT_FIDELITY_JOBS", str(min(4, os.cpu_count() or 1))))
COMMAND = "PYTHONPATH=. python3 -m pytest tests/bench/test_gpu_fidelity.py -o addopts='' -q -s"


def test_candidates_build():
    """Every candidate of both samples generates and compiles for an sm_90 device (no GPU
    involved): the wgmma ones in units built for sm_90a, as the device run builds them."""
    from tilekit.codegen.nvcc import find_nvcc
    h100 = load_profile("h100")
    ops = fidelity.build_suite_sample(h100, TOP_K) + fidelity.build_tensor_core_sample(h100,
                                                                                      TOP_K)
    failed = [(op.name, c.index, c.error) for op in ops for c in op.candidates if c.error]
    assert not failed
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed: built, not compiled")
    compiled = fidelity.compile_candidates(ops, "sm_90")
    assert not compiled.errors
    assert set(compiled.resources) == {k.entry for op in ops for k in op.kernels()}


def _slug(device: str) -> str:
    """`NVIDIA H100 80GB HBM3 (sm_90, ...)` -> `nvidia_h100_80gb_hbm3`, as test_gpu_bench."""
    return re.sub(r"[^A-Za-z0-9]+", "_", device.split(" (")[0]).strip("_").lower()


@pytest.mark.gpu
def test_gpu_fidelity():
    _measure_sample(lambda profile: fidelity.build_suite_sample(profile, TOP_K), "",
                    f"every {fidelity.SAMPLE_EVERY}th workload of specs/workloads.yaml")


@pytest.mark.gpu
def test_gpu_fidelity_tensor_cores():
    """The same on the tensor-core shapes (the half-precision workloads and the 4096^3 fp16
    GEMM): which block GEMM, warp layout and pipeline depth the device prefers."""
    _measure_sample(lambda profile: fidelity.build_tensor_core_sample(profile, TOP_K), "tc-",
                    "the half-precision workloads of specs/workloads.yaml and a 4096^3 fp16 "
                    "GEMM")


def _measure_sample(build, prefix: str, sample: str) -> None:
    from tilekit.codegen.nvcc import find_nvcc
    from tilekit.runtime import cuda
    if find_nvcc() is None:
        pytest.skip("needs nvcc (the candidates compile as one unit)")
    arch = cuda.device_arch()
    profile = profile_for(arch)
    ops = build(profile)
    compiled = fidelity.compile_candidates(ops, arch, jobs=JOBS)
    timer = fidelity.CudaTimer(compiled, runs=RUNS, warmup=WARMUP)
    rows = fidelity.measure(ops, timer)
    summary = fidelity.summarize(rows)
    device = cuda.device_description()
    report = {
        "command": COMMAND,
        "date": datetime.date.today().isoformat(),
        "device": device, "profile": profile.name, "arch": arch, "top_k": TOP_K,
        "sample": f"{sample} ({len(ops)} ops)",
        "runs": RUNS, "warmup": WARMUP, "l2_flushed": timer.flush is not None,
        "loader": "nvrtc" if timer.nvrtc else "nvcc cubin",
        "timing": "CUDA events around one launch, L2 flushed before each; median of runs",
        "launch_overhead_us": (profile.launch_overhead or 0) * 1e6,
        "compile": {"units": len(compiled.units), "seconds": compiled.seconds,
                    "kernels": len(compiled.resources) + len(compiled.errors),
                    "errors": len(compiled.errors)},
        "summary": summary,
        "ops": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"fidelity-{prefix}{_slug(device)}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n{device}: tk-roll top-{TOP_K} candidates measured (median of {RUNS}; us)")
    print(fidelity.format_table(rows, summary))
    print(f"written: {path}")
    wrong = [(r["op"], c["index"], c["error"]) for r in rows for c in r["candidates"]
             if c["max_rel_err"] is not None and c["error"]]
    assert not wrong, f"kernels that compute a wrong result: {wrong}"
    assert summary["ops_ranked"] >= len(ops) // 2, "fewer than half of the ops were measured"
