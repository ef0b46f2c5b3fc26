"""GPU benchmark of tk-weld (issue 10): welded against unwelded kernels of the BERT layer and
the MobileNet block (the test sizes, and BERT-base / a 56x56 block) on the GPU in hand, measured (CUDA events, kernels only, median of 50
runs after 5 warm-ups, `tilekit.runtime.cuda.time_kernels`) next to the model's estimates.

    make bench            # or: pytest tests/bench/test_gpu_weld.py -o addopts="" -s

Needs CuPy and a GPU (skipped elsewhere); aims at under 2 minutes: 8 modules (4 models,
welded and not), one nvcc compile each, about 15 s of CPU work before them. Results:
tests/bench/results/weld-gpu-<device>.json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402

#: name -> (builder in tests/models/onnx_models.py, its arguments): the test models and the
#: sizes of the README's CPU benchmark (BERT-base layer, a 56x56 MobileNet block).
MODELS = {"bert_encoder_layer": ("bert_encoder_layer", {}),
          "mobilenet_block": ("mobilenet_block", {}),
          "bert_base_layer": ("bert_encoder_layer", {"batch": 1, "seq": 128, "hidden": 768,
                                                     "heads": 12, "ffn": 3072}),
          "mobilenet_block_56": ("mobilenet_block", {"channels": 32, "expand": 6,
                                                     "size": 56})}
RUNS, WARMUP = 50, 5


def modules(name: str, folder: Path, hw: str):
    """(unwelded, welded) modules with their codegen sections, and the weights."""
    from tilekit.codegen import generate
    from tilekit.hw import load_profile
    from tilekit.onnx import attach_files, import_model
    from tilekit.roll.schedule import roll_module
    from tilekit.weld import weld_module

    profile = load_profile(hw)
    builder, args = MODELS[name]
    proto = getattr(onnx_models, builder)(**args)
    onnx.save(proto, str(folder / f"{name}.onnx"))
    imported = import_model(proto, name=name)
    imported = attach_files(imported, ir_folder=str(folder), weights_path=str(
        folder / f"{name}.weights.npz"), onnx_path=str(folder / f"{name}.onnx"),
        onnx_sha256="0" * 64, options={}, write=False)
    rolled = roll_module(imported.module, profile)
    welded = weld_module(rolled, profile)
    return (generate(rolled, profile).module, generate(welded, profile).module,
            dict(imported.weights))


def estimate_us(module) -> float:
    return sum(float((k.estimate or {}).get("time_us", 0)) for k in module.kernels)


@pytest.mark.gpu
def test_weld_on_gpu(tmp_path):
    from tilekit.runtime.cuda import device_description, time_kernels

    device = device_description()
    hw = "h100" if "H100" in device else "a100" if "A100" in device else "h100"
    rows = {}
    for name in MODELS:
        before, after, weights = modules(name, tmp_path, hw)
        rng = np.random.default_rng(0)
        inputs = {n: rng.standard_normal(before.tensors[n].shape).astype(
            before.tensors[n].dtype) for n in before.inputs}
        row = {}
        for label, module in (("unwelded", before), ("welded", after)):
            timing = time_kernels(module, inputs, weights, RUNS, WARMUP)
            row[label] = {"kernels": len(module.codegen["kernels"]),
                          "measured_us": round(timing.median * 1e6, 2),
                          "estimated_us": round(estimate_us(module), 2)}
        row["measured_speedup"] = round(row["unwelded"]["measured_us"]
                                        / row["welded"]["measured_us"], 2)
        row["estimated_speedup"] = round(row["unwelded"]["estimated_us"]
                                         / row["welded"]["estimated_us"], 2)
        rows[name] = row
    out = {"device": device, "profile": hw, "runs": RUNS, "warmup": WARMUP,
           "method": "CUDA events, kernels only (tilekit.runtime.cuda.time_kernels)",
           "models": rows}
    slug = re.sub(r"[^a-z0-9]+", "_", device.split(" (")[0].lower()).strip("_")
    path = ROOT / "tests" / "bench" / "results" / f"weld-gpu-{slug}.json"
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps(out, indent=2, sort_keys=True))
    for name, row in rows.items():
        assert row["welded"]["kernels"] < row["unwelded"]["kernels"], name


def test_gpu_weld_modules_build(tmp_path):
    """Everything but the device runs everywhere, so the benchmark cannot rot unnoticed."""
    for name in MODELS:
        before, after, _ = modules(name, tmp_path, "h100")
        assert len(after.codegen["kernels"]) < len(before.codegen["kernels"])
