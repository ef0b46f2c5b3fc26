"""tk-ram on a GPU: the persistent program against one launch per kernel and against a CUDA
graph replaying the same per-kernel launches (CuPy stream capture), on the LSTM and the
ResNeXt-style block (tests/models). Needs an NVIDIA GPU and CuPy (marked gpu; skipped
elsewhere); about a minute.

    .venv/bin/pytest tests/bench/test_gpu_ram.py -p no:cacheprovider -o addopts="" -s

For each model: the module rolled for the device's profile (h100 on an H100, a100 on an A100)
with `--top-k 4`, compiled twice: `roll | codegen` (one kernel per operator) and `roll | ram |
codegen` (persistent segments). Outputs of the program are checked against the per-kernel
run first. Timed with CUDA events over `RUNS` runs after warm-up, kernels only (inputs already
on the device): per-kernel launches from Python, the same launches replayed as one CUDA
graph, and the program (its counters zeroed by a memset before each launch, as in every run).
Results: tests/bench/results/ram-gpu-<device>.json.
"""

from __future__ import annotations

import datetime
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models, ram_models  # noqa: E402

pytestmark = pytest.mark.gpu
RUNS = 200
WARMUP = 20
MODELS = {"lstm_model": lambda: onnx_models.lstm_model(seq=16, batch=1, inputs=64, hidden=64),
          "resnext_block": lambda: ram_models.resnext_block(channels=64, paths=32, width=4,
                                                            size=28)}


def _cupy():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except Exception:  # noqa: BLE001 - no driver
        pytest.skip("no CUDA device")
    return cupy


def _median_ms(cupy, run, stream) -> float:
    for _ in range(WARMUP):
        run()
    stream.synchronize()
    times = []
    for _ in range(RUNS):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        run()
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def test_gpu_ram(tmp_path):
    cupy = _cupy()
    from tilekit import pipeline
    from tilekit.runtime import cuda

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    hw = "h100" if "H100" in name else "a100"
    rows = {}
    for model, build in MODELS.items():
        path = tmp_path / f"{model}.onnx"
        onnx.save(build(), str(path))
        per_op = pipeline.compile(path, ("roll", "codegen"), hw=hw, top_k=4,
                                  ir_path=tmp_path / f"{model}.k.yaml")
        program = pipeline.compile(path, ("roll", "ram", "codegen"), hw=hw, top_k=4,
                                   ir_path=tmp_path / f"{model}.p.yaml")
        rng = np.random.default_rng(0)
        inputs = {n: rng.standard_normal(per_op.module.tensors[n].shape).astype(np.float32)
                  for n in per_op.module.inputs}
        kernels, persistent = cuda.prepare(per_op.module), cuda.prepare(program.module)
        want = kernels.run(inputs, per_op.weights)
        got = persistent.run(inputs, program.weights)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            t_kernels = _median_ms(cupy, kernels.launch_all, stream)
            stream.begin_capture()
            kernels.launch_all()
            graph = stream.end_capture()
            t_graph = _median_ms(cupy, lambda: graph.launch(stream), stream)
            t_program = _median_ms(cupy, persistent.launch_all, stream)
        est = program.module.program["estimate"]
        rows[model] = {"kernels": len(kernels.launches), "program_launches":
                       len(persistent.launches), "per_kernel_launches_ms": round(t_kernels, 4),
                       "cuda_graph_ms": round(t_graph, 4), "program_ms": round(t_program, 4),
                       "estimate_wavefront_us": est["makespan_us"],
                       "estimate_per_op_us": est["per_op_kernels_us"]}
        print(f"{model}: {len(kernels.launches)} kernels {t_kernels:.4f} ms, CUDA graph "
              f"{t_graph:.4f} ms, program ({len(persistent.launches)} launches) "
              f"{t_program:.4f} ms")
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    out = ROOT / "tests" / "bench" / "results" / f"ram-gpu-{slug}.json"
    out.write_text(json.dumps({"command": "pytest tests/bench/test_gpu_ram.py -s",
                               "date": datetime.date.today().isoformat(), "device": name,
                               "profile": hw, "runs": RUNS, "warmup": WARMUP,
                               "method": "CUDA events around each run, median; kernels only",
                               **rows}, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s", "-p", "no:cacheprovider", "-o", "addopts="]))
