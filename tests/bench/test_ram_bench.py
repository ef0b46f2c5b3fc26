"""tk-ram figures: per model and profile, the plan and its estimated makespans; and tk-ram's own
run time on ResNet-50.

Run with `make bench` (not part of `make test`). For every test model (the multi-branch real
models with seeded random weights, the LSTM, the ResNeXt-style block and the NASNet-style
cell), rolled with `--top-k 4` for each profile and planned by tk-ram: rTasks, vEUs (the
largest segment), segments (persistent ones), and the estimated makespan under the wavefront
policy, under the serial policy, and for one kernel per operator with the profile's launch
overhead (and its source). Profiles: h100 and a100 (launch overhead 4 us, assumed in the
profiles), and h100-probed (tests/bench/results/h100-probed.yaml: the launch overhead measured
by tk-hw probe on an H100, 4.28 us). Estimates, not measurements: the cost model's kernel
times (tilekit/roll/cost.py) split per block. Results go to tests/bench/results/ram.json.
Target: tk-ram on ResNet-50 under 2 s on 2 cores.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models, ram_models  # noqa: E402
from models.onnx_check import with_random_weights  # noqa: E402

RESULTS = ROOT / "tests" / "bench" / "results" / "ram.json"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["inception_v1", "inception_v2", "densenet121", "shufflenet", "squeezenet",
          "lstm_model", "resnext_block", "nasnet_cell", "resnet50"]
PROFILES = {"h100": "h100", "a100": "a100",
            "h100-probed": str(ROOT / "tests" / "bench" / "results" / "h100-probed.yaml")}


def model_proto(name: str) -> onnx.ModelProto:
    if name in ram_models.ALL:
        return ram_models.ALL[name]()
    if hasattr(onnx_models, name):
        return getattr(onnx_models, name)()
    return with_random_weights(LIGHT / f"light_{name}.onnx", seed=0)


def figures(module, profile) -> dict:
    from tilekit.ram import plan_module

    program = plan_module(module, profile)
    est = program.estimate
    return {"rtasks": program.tasks, "operators": len(program.operators),
            "veus_max": est["max_veus"], "segments": est["segments"],
            "persistent_segments": est["persistent_segments"],
            "packed_operators": est["packed_operators"],
            "wavefront_us": est["makespan_us"], "serial_us": est["serial_us"],
            "per_op_kernels_us": est["per_op_kernels_us"],
            "speedup_vs_per_op": est["speedup_vs_per_op"],
            "launch_overhead_us": program.launch_us,
            "launch_overhead_source": program.launch_source}


def test_ram_figures(tmp_path):
    from tilekit import pipeline
    from tilekit.hw import load_profile

    rows: dict = {}
    for name in MODELS:
        path = tmp_path / f"{name}.onnx"
        onnx.save(model_proto(name), str(path))
        rows[name] = {}
        for label, hw in PROFILES.items():
            profile = load_profile(hw)
            compiled = pipeline.compile(path, passes=("roll",), hw=hw, top_k=4,
                                        ir_path=tmp_path / f"{name}.tk.yaml")
            rows[name][label] = figures(compiled.module, profile)
            r = rows[name][label]
            print(f"{name:14s} {label:12s} {r['rtasks']:7d} rTasks {r['veus_max']:5d} vEUs "
                  f"{r['segments']:4d} segments ({r['persistent_segments']} persistent): "
                  f"wavefront {r['wavefront_us']} us, serial {r['serial_us']} us, "
                  f"per-op {r['per_op_kernels_us']} us")
    rows["tk_ram_resnet50"] = command_time(tmp_path)
    record(rows)
    assert rows["tk_ram_resnet50"]["plan_module_s"] < 2


def command_time(tmp_path: Path) -> dict:
    """tk-ram on ResNet-50 rolled for the H100: the library call (best of 3) and the command."""
    from tilekit.hw import load_profile
    from tilekit.ir import read_module
    from tilekit.ram import plan_module

    ir = tmp_path / "resnet50.yaml"
    rolled = tmp_path / "resnet50.rolled.yaml"
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(tmp_path /
                    "resnet50.onnx"), "-o", str(ir)], check=True)
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-roll"), "--hw", "h100", "--top-k",
                    "4", str(ir), "-o", str(rolled)], check=True)
    module = read_module(str(rolled))
    profile = load_profile("h100")
    lib = []
    for _ in range(3):
        start = time.perf_counter()
        plan_module(module, profile)
        lib.append(time.perf_counter() - start)
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-ram"), str(rolled), "-o",
                    str(tmp_path / "resnet50.ram.yaml")], check=True)
    command = time.perf_counter() - start
    print(f"tk-ram ResNet-50: plan_module {min(lib):.2f} s, command {command:.2f} s")
    return {"ops": len(module.ops), "plan_module_s": round(min(lib), 3),
            "tk_ram_command_s": round(command, 3)}


def record(rows: dict) -> None:
    from tilekit.runtime.bench import cpu_description

    data = {
        "command": "make bench (tests/bench/test_ram_bench.py)",
        "date": datetime.date.today().isoformat(),
        "device": cpu_description(),
        "python": platform.python_version(),
        "method": "tk-roll --top-k 4 per profile, then tk-ram (wavefront; the serial policy "
                  "planned too); makespans are the cost model's estimates replayed on the "
                  "plan (tilekit/ram/timeline.py), not measurements; per-op kernels = the sum "
                  "of each kernel's estimate plus one launch overhead each",
        **rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s", "-p", "no:cacheprovider"]))
