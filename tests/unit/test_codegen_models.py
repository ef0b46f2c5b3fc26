"""Real models through tk-import | tk-roll | codegen, every kernel checked on the CPU.

Emulating a whole ImageNet model block by block would take hours, so each kernel runs a
sample of its blocks (first, middle, last) on the reference executor's intermediates, and the
elements those blocks wrote are compared with the reference. Models: SqueezeNet by default;
more with TILEKIT_CODEGEN_MODELS=resnet50,densenet121 (names under onnx's
backend/test/data/light/, about a minute each for ResNet-50).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np
import pytest
from scope import FULL

from tilekit.codegen import generate
from tilekit.codegen.emulate import emulate_blocks, find_cxx
from tilekit.ir.codec import read_module
from tilekit.runtime.cpu import prepare, run_op_whole
from tilekit.runtime.io import load_weights

ROOT = Path(__file__).resolve().parents[2]
MODELS = [m for m in os.environ.get("TILEKIT_CODEGEN_MODELS", "squeezenet").split(",") if m]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")]


def light_model(name: str) -> Path:
    import onnx
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this onnx package")
    return path


def tool(name: str, *args) -> None:
    """`name args` run in process (tests/clirun.py)."""
    from clirun import completed
    command = importlib.import_module(f"tilekit.cli.{name.replace('-', '_')}").main
    proc = completed(command, args)
    assert proc.returncode == 0, proc.stderr.decode()


def reference_env(module, folder: Path) -> dict:
    """Every tensor of the module (intermediates included) from the CPU executor."""
    rng = np.random.default_rng(0)
    env = dict(load_weights(module, folder))
    for name in module.inputs:
        t = module.tensors[name]
        env[name] = rng.standard_normal(t.shape).astype(t.dtype)
    for step in prepare(module).steps:
        for name, arr, dtype, shape in zip(step.writes, run_op_whole(step, env), step.dtypes,
                                           step.shapes):
            env[name] = np.broadcast_to(np.asarray(arr).astype(dtype), shape)
    return env


@pytest.mark.parametrize("rolled", [True, False] if FULL else [True],
                         ids=["rolled", "default"] if FULL else ["rolled"])
@pytest.mark.parametrize("model", MODELS)
def test_sampled_blocks_of_every_kernel(model, rolled, tmp_path):
    ir = tmp_path / f"{model}.yaml"
    tool("tk-import", light_model(model), "-o", ir)
    if rolled:
        tool("tk-roll", ir, "--hw", "h100", "-o", tmp_path / "rolled.yaml")
        ir = tmp_path / "rolled.yaml"
    module = read_module(str(ir))
    env = reference_env(module, tmp_path)
    result = generate(module)
    failures = []
    for index, record in enumerate(result.module.codegen["kernels"]):
        grid = record["grid"][0]
        got = emulate_blocks(result.module, index, env, sorted({0, grid // 2, grid - 1}))
        for name, arr in got.items():
            written = ~np.isnan(arr)
            if not written.any():
                failures.append(f"{record['entry']}: sampled blocks wrote nothing of {name}")
                continue
            want = env[name]
            err = np.abs(arr[written] - want[written]).max() / (np.abs(want).max() + 1e-30)
            if err > 1e-4:
                failures.append(f"{record['entry']} ({record['shape']}): {name} off by {err:.2e}")
    assert not failures, "\n".join(failures)
