"""The three optimising stages in one pipe, as DESIGN.md orders them: roll | weld | grind | ram
| codegen. Each stage's own suite checks it alone (test_weld_models.py, test_ram_pipelines.py,
test_grind.py); this one checks that each reads what the stage before it wrote:

- tk-weld's groups packed by tk-ram, run rTask by rTask on the CPU against onnxruntime, and
  the persistent kernels compiled for sm_90 (and emulated on the CPU when a C++ compiler is
  there);
- control-flow models through every stage (weld groups inside regions are not built: a control
  op is a group of its own), checked on the CPU and compiled;
- a half-precision model through weld and ram;
- `tilekit.compile` with every pass gives the bytes of the pipe.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from models import control_models, onnx_models, ram_models  # noqa: E402
from test_pipelines import assert_checked, run_ok, run_pipe  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("stages-together")]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

DENSE = {"bert_encoder_layer": onnx_models.bert_encoder_layer,
         "mobilenet_block": onnx_models.mobilenet_block,
         "lstm_model": onnx_models.lstm_model,
         "resnext_block": ram_models.resnext_block}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("together")


def onnx_file(folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    if not path.exists():
        build = DENSE.get(name) or control_models.MODELS[name]
        onnx.save(build(), str(path))
    return path


def welded(folder: Path, name: str) -> Path:
    """`tk-import | tk-roll --hw h100 --top-k 4 | tk-weld`, once per model."""
    path = folder / f"{name}.welded.yaml"
    if not path.exists():
        pipe = (f"tk-import {onnx_file(folder, name).name} | tk-roll --hw h100 --top-k 4 "
                f"| tk-weld -o {path.name}")
        run_ok(pipe, folder)
    return path


@pytest.mark.parametrize("name", sorted(DENSE))
def test_weld_then_ram_runs_as_a_program(name, folder):
    ir = welded(folder, name)
    pipe = f"tk-ram {ir.name} | tk-run --mode program --seed 0 --check"
    assert_checked(run_pipe(pipe, folder), pipe)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(DENSE))
def test_weld_then_ram_compiles(name, folder):
    ir = welded(folder, name)
    out = f"{name}.program.cuda.yaml"
    pipe = f"tk-ram {ir.name} | tk-codegen --compile --strict -o {out}"
    run_ok(pipe, folder)
    import yaml

    doc = yaml.safe_load((folder / out).read_text())
    assert any(len(k["ops"]) > 1 for k in doc["kernels"]), "tk-weld fused nothing"
    assert doc["program"] and doc["codegen"]["kernels"]


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="no C++ compiler for the emulation")
def test_weld_then_ram_program_passes_emulation(folder):
    import numpy as np

    from tilekit import pipeline
    from tilekit.codegen.emulate import emulate
    from tilekit.ir import read_module
    from tilekit.runtime import run_module
    from tilekit.runtime.io import load_weights

    # the BERT layer keeps single-stage groups (matmul + bias chains) that tk-ram packs; a
    # multi-stage fused group stays a kernel of its own (docs/ram.md, "What is absent")
    ir = welded(folder, "bert_encoder_layer")
    module = pipeline.run(read_module(str(ir)), ["ram", "codegen"],
                          pipeline.Context.for_hw("h100"))
    assert any(k.get("coresident") for k in module.codegen["kernels"])
    weights = load_weights(module, folder)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    want = run_module(module, inputs, weights)
    got = emulate(module, inputs, weights)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("name", sorted(control_models.MODELS))
def test_control_models_through_every_stage(name, folder):
    ir = welded(folder, name)
    pipe = f"tk-grind {ir.name} | tk-ram | tk-run --seed 0 --check"
    assert_checked(run_pipe(pipe, folder), pipe)


@needs_nvcc
@pytest.mark.parametrize("name", ["lstm_loop", "blockdrop"])
def test_control_models_through_every_stage_compile(name, folder):
    ir = welded(folder, name)
    pipe = f"tk-grind {ir.name} | tk-ram | tk-codegen --compile --strict -o {name}.cuda.yaml"
    run_ok(pipe, folder)


def test_half_precision_through_weld_and_ram(folder):
    model = onnx_file(folder, "bert_encoder_layer")
    pipe = (f"tk-import {model.name} --dtype float16 -o bert16.yaml && tk-roll --hw h100 "
            "--top-k 4 bert16.yaml | tk-weld | tk-ram | tk-run --mode program --seed 0 --check")
    assert_checked(run_pipe(pipe, folder), pipe)


def test_compile_with_every_pass_equals_the_pipe(folder):
    import tilekit
    from tilekit.ir import dumps

    model = onnx_file(folder, "mobilenet_block")
    pipe = ("tk-import mobilenet_block.onnx -o mb.yaml && tk-roll --hw h100 mb.yaml | tk-weld "
            "| tk-grind | tk-ram | tk-codegen -o mb.cuda.yaml")
    run_ok(pipe, folder)
    compiled = tilekit.compile(model, passes=["roll", "weld", "grind", "ram", "codegen"],
                               hw="h100", ir_path=folder / "mb.cuda.yaml",
                               weights_path=folder / "mb.weights.npz")
    assert dumps(compiled.module) == (folder / "mb.cuda.yaml").read_text()


@pytest.mark.parametrize("name, dtype", [(n, "float16") for n in sorted(control_models.MODELS)]
                         + [("lstm_loop", "bfloat16")])
def test_control_models_in_half_precision(name, dtype, folder):
    """`--dtype` reaches the loop bodies and branches too (their tensors and ops were left in
    float32 and the import failed its own verification)."""
    pipe = f"tk-import {onnx_file(folder, name).name} --dtype {dtype} | tk-run --seed 0 --check"
    assert_checked(run_pipe(pipe, folder), pipe)
