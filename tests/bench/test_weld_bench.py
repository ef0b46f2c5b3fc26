"""tk-weld's figures (issue 10), for the README: the 14 models rolled for H100 and for A100,
unwelded (one kernel per op, tk-roll's estimates) against welded (tk-weld's groups): kernels,
estimated DRAM traffic and estimated time; and tk-weld's own run time on ResNet-50 (the
library call and the whole command, target < 3 s on 2 cores).

Run with `make bench` (not part of `make test`). Results: tests/bench/results/weld.json.
Aims: DRAM traffic at least 30% lower on ResNet-50, 50% on the BERT layer and the MobileNet
block (reported, not asserted: they are properties of the model's estimates).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402
from models.onnx_check import with_random_weights  # noqa: E402

RESULTS = ROOT / "tests" / "bench" / "results" / "weld.json"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
REAL = ["resnet50", "inception_v1", "inception_v2", "densenet121", "shufflenet", "squeezenet",
        "vgg19", "bvlc_alexnet", "zfnet512"]
BUILT = ["bert_encoder_layer", "gpt_block", "mobilenet_block", "mlp_mixer_block", "lstm_model"]


def imported(name: str, folder: Path):
    from tilekit.ir import read_module

    path = folder / f"{name}.onnx"
    model = (with_random_weights(LIGHT / f"light_{name}.onnx", seed=0) if name in REAL
             else getattr(onnx_models, name)())
    onnx.save(model, str(path))
    out = folder / f"{name}.yaml"
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(path), "-o",
                    str(out)], check=True)
    return read_module(str(out)), out


def figures(module, profile) -> dict:
    from tilekit.roll.schedule import roll_module
    from tilekit.weld import weld_module
    from tilekit.weld.report import totals

    rolled = roll_module(module, profile)
    start = time.perf_counter()
    welded = weld_module(rolled, profile)
    seconds = time.perf_counter() - start
    t = totals(welded)
    return {"kernels": [t.kernels_before, t.kernels_after],
            "dram_bytes": [round(t.dram_before), round(t.dram_after)],
            "dram_saved_percent": round(100 * (1 - t.dram_ratio), 1),
            "compulsory_bytes": [t.compulsory_before, t.compulsory_after],
            "compulsory_saved_percent": round(100 * (1 - t.compulsory_after
                                                     / max(1, t.compulsory_before)), 1),
            "time_us": [round(t.time_before, 1), round(t.time_after, 1)],
            "weld_seconds": round(seconds, 3)}


def test_weld_figures(tmp_path):
    from tilekit.hw import load_profile

    profiles = {hw: load_profile(hw) for hw in ("h100", "a100")}
    models = {}
    for name in REAL + BUILT:
        module, _ = imported(name, tmp_path)
        models[name] = {hw: figures(module, p) for hw, p in profiles.items()}
    _, r50 = imported("resnet50", tmp_path)
    rolled = tmp_path / "r50.rolled.yaml"
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-roll"), "--hw", "h100", str(r50),
                    "-o", str(rolled)], check=True)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "bin" / "tk-weld"), str(rolled), "-o",
                        str(tmp_path / "r50.welded.yaml")], check=True)
        runs.append(time.perf_counter() - start)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
        "command": "pytest tests/bench/test_weld_bench.py",
        "tk_weld_resnet50_command_seconds": round(sorted(runs)[1], 3),
        "tk_weld_resnet50_library_seconds": models["resnet50"]["h100"]["weld_seconds"],
        "models": models,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    assert result["tk_weld_resnet50_command_seconds"] < 3.0
    for name, per_hw in models.items():
        for hw, f in per_hw.items():
            assert f["kernels"][1] <= f["kernels"][0], (name, hw)
            assert f["time_us"][1] <= f["time_us"][0], (name, hw)
