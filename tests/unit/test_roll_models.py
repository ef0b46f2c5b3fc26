"""The nine real models bundled with onnx, imported, rolled and run op by op: each op's tiled
result equals its whole-op result on the same inputs.

Comparing every op (not only the model outputs) matters here: the bundled weights are
constant fills, so the models' outputs are nearly constant and would hide a wrong tile.
SqueezeNet, ShuffleNet and Inception v2 (between them every op kind the nine use: strided and
grouped convolutions, pooling with padding, concatenation, channel shuffles, LRN-free
BatchNorm folding) run op by op here, each distinct op (statement, shapes, tile) once, and
ResNet-50 and DenseNet-121 too with TILEKIT_OP_BY_OP=all; tests/e2e runs all nine rolled and
tiled against onnxruntime with random weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from scope import on

onnx = pytest.importorskip("onnx")

from tilekit.hw import load_profile  # noqa: E402
from tilekit.roll.schedule import roll_module  # noqa: E402
from tilekit.runtime.tiled import run_step_tiled  # noqa: E402
from tilekit.runtime.cpu import prepare, run_op_whole  # noqa: E402
from tilekit.runtime.io import random_input  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))


def signature(step, module) -> str:
    """What decides an op's tiled execution: its statement up to tensor names, the shapes it
    reads and writes, its tile. Two ops with one signature take the same tiled path (ResNet-50
    repeats its bottleneck convolutions), so only the first is run tile by tile."""
    names = list(dict.fromkeys([*step.writes, *step.reads]))
    text = step.op.expr or ""
    for k, n in enumerate(sorted(names, key=len, reverse=True)):
        text = re.sub(rf"(?<![\w.]){re.escape(n)}(?![\w])", f"@{names.index(n)}", text)
    shapes = [module.tensors[n].shape for n in names if n in module.tensors]
    return json.dumps([text, shapes, step.op.tile], sort_keys=True, default=str)


def check_model(name: str, hw: str = "h100") -> None:
    onnx_import = pytest.importorskip("tilekit.onnx")
    imported = onnx_import.import_model(onnx.load(str(LIGHT / f"light_{name}.onnx")),
                                        name=name)
    module = imported.module
    if "import" not in module.stage_names():
        module = module.with_stage("import")
    module = roll_module(module, load_profile(hw))
    env = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    env.update({n: random_input(module.tensors[n], 0, i) for i, n in enumerate(module.inputs)})
    seen: set[str] = set()
    for step in prepare(module).steps:
        whole = run_op_whole(step, env)
        key = signature(step, module)
        if key in seen:
            for out, array, dtype in zip(step.writes, whole, step.dtypes):
                env[out] = np.asarray(array).astype(dtype, copy=False)
            continue
        seen.add(key)
        tiled = run_step_tiled(step, env)
        for out, want, got in zip(step.writes, whole, tiled):
            want = np.asarray(want, dtype=np.float64)
            scale = float(np.abs(want).max()) if want.size else 0.0
            np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-4,
                                       atol=1e-5 * max(scale, 1.0),
                                       err_msg=f"{name}: {step.where} -> {out}")
        for out, array, dtype in zip(step.writes, whole, step.dtypes):
            env[out] = np.asarray(array).astype(dtype, copy=False)


def test_squeezenet_tiled_equals_whole_op_by_op():
    check_model("squeezenet")


#: ResNet-50 and DenseNet-121 op by op with TILEKIT_OP_BY_OP=all: their op kinds are those of
#: the three below, and tests/e2e runs both tiled against onnxruntime with random weights
#: (which a wrong tile does not survive); op by op they were 30 s of `make test`.
OP_BY_OP = (["resnet50", "densenet121", "inception_v2"] if on("TILEKIT_OP_BY_OP", "all")
            else []) + ["shufflenet"]


@pytest.mark.slow
@pytest.mark.parametrize("name", OP_BY_OP)
def test_bundled_model_tiled_equals_whole_op_by_op(name):
    check_model(name)
