"""Half precision through the pipeline: `tk-import --dtype`, the one precision rule (half is
storage; float32 computes, accumulates and rounds once on store) in the CPU reference, the
tiled executor and the generated CUDA, bfloat16 weights in the sidecar, and the check's
tolerances."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilekit import pipeline
from tilekit.expr import analyze, evaluate, parse
from tilekit.expr.ops import round_to
from tilekit.ir import Module, Op, Tensor
from tilekit.ir.codec import read_module
from tilekit.runtime.check import SOURCE_TOLERANCES, import_dtype
from tilekit.runtime.io import load_weights
from tilekit.runtime.tiled import run_op_tiled

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402


def cast_model() -> onnx.ModelProto:
    """y = Cast(int32 input, FLOAT) * w + b: a cast, a weight, a bias."""
    w = numpy_helper.from_array(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), "w")
    b = numpy_helper.from_array(np.full((4,), 0.1, dtype=np.float32), "b")
    nodes = [helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["f", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "cast", [helper.make_tensor_value_info(
        "i", TensorProto.INT32, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 4])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_import_stores_float32_tensors_weights_and_casts_in_half(tmp_path, dtype):
    path = tmp_path / "cast.onnx"
    onnx.save(cast_model(), path)
    compiled = pipeline.compile(path, passes=(), dtype=dtype, ir_path=tmp_path / "m.yaml")
    module = compiled.module
    assert module.tensors["i"].dtype == "int32"
    assert {module.tensors[n].dtype for n in ("w", "b", "y")} == {dtype}
    assert all(w.dtype.name == dtype for w in compiled.weights.values())
    exprs = " ".join(op.expr for op in module.ops)
    assert f"{dtype}(" in exprs and "float32(" not in exprs
    assert import_dtype(module) == dtype
    assert module.stages[0]["options"]["accumulate"] == "float32"


def test_float32_import_is_unchanged(tmp_path):
    path = tmp_path / "cast.onnx"
    onnx.save(cast_model(), path)
    plain = pipeline.compile(path, passes=(), ir_path=tmp_path / "m.yaml")
    same = pipeline.compile(path, passes=(), dtype="float32", ir_path=tmp_path / "m.yaml")
    assert plain.module == same.module and import_dtype(plain.module) is None


def test_half_computes_in_float32_and_rounds_once():
    """x * 1000 * 0.001 is x again when the body computes in float32 and rounds once; in
    float16 arithmetic the intermediate x * 1000 would lose bits for most x."""
    x = np.arange(-60, 60, 0.0137, dtype=np.float32).astype(np.float16)
    analysis = analyze(parse("y[i] = x[i] * 1000.0 * 0.001"), {"x": x.shape, "y": x.shape},
                       dtypes={"x": "float16", "y": "float16"})
    y = evaluate(analysis, {"x": x}, out_dtype=np.float16)
    assert y.dtype == np.float16 and np.array_equal(y, x)
    in_half = (x * np.float16(1000.0)) * np.float16(0.001)
    assert not np.array_equal(in_half, x)  # the rule matters for these values


def test_an_explicit_cast_rounds_there():
    analysis = analyze(parse("y[i] = float16(x[i] * 3.0) - x[i] * 3.0"),
                       {"x": (3,), "y": (3,)}, dtypes={"x": "float32", "y": "float32"})
    x = np.array([0.1, 1.0 / 3.0, 7.77], dtype=np.float32)
    y = evaluate(analysis, {"x": x})
    assert np.array_equal(y, round_to(x * 3.0, "float16") - x * np.float32(3.0))


def test_tiled_reduction_steps_accumulate_in_float32():
    """A float16 reduction run step by step equals the whole one (both accumulate in
    float32, round once); rounding every step's partial to float16 would not."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 2048)) / 3).astype(np.float16)
    analysis = analyze(parse("y[i] += x[i, k]"), {"x": (64, 2048), "y": (64,)},
                       dtypes={"x": "float16", "y": "float16"})
    tile = {"block": {"i": 16}, "thread": {"i": 1}, "step": {"k": 64}, "grid": {"i": 4},
            "blocks": 4, "threads": 16}
    tiled = run_op_tiled(analysis, {"x": x}, tile, out_dtype=np.float16)
    whole = evaluate(analysis, {"x": x}, out_dtype=np.float16)
    assert np.array_equal(tiled, whole)
    partials = x.astype(np.float32).reshape(64, 32, 64).sum(axis=2)
    rounded = np.zeros(64, dtype=np.float16)
    for step in range(32):
        rounded = (rounded.astype(np.float32) + partials[:, step]).astype(np.float16)
    assert not np.array_equal(rounded, whole)


def test_bfloat16_weights_travel_as_uint16_and_read_back(tmp_path):
    model = tmp_path / "mobilenet_block.onnx"
    onnx.save(onnx_models.mobilenet_block(), model)
    tool("tk-import", model, "--dtype", "bfloat16", "-o", tmp_path / "m.yaml")
    with np.load(tmp_path / "m.weights.npz") as archive:
        assert {archive[k].dtype for k in archive.files} == {np.dtype(np.uint16)}
    module = read_module(str(tmp_path / "m.yaml"))
    weights = load_weights(module, tmp_path)
    assert {w.dtype.name for w in weights.values()} == {"bfloat16"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_model_checks_against_its_float32_source(tmp_path, dtype):
    model = tmp_path / "bert.onnx"
    onnx.save(onnx_models.bert_encoder_layer(), model)
    tool("tk-import", model, "--dtype", dtype, "-o", tmp_path / "m.yaml")
    proc = tool("tk-run", tmp_path / "m.yaml", "--check", "--seed", "0")
    assert "check: pass" in proc.stdout
    assert f"(float32; the IR is in {dtype})" in proc.stdout
    assert f"rtol {SOURCE_TOLERANCES[dtype][0]:g}" in proc.stdout


def test_unknown_dtype_is_a_usage_error(tmp_path):
    model = tmp_path / "cast.onnx"
    onnx.save(cast_model(), model)
    proc = subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(model),
                           "--dtype", "float8", "-o", str(tmp_path / "m.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--dtype" in proc.stderr and "float16" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "m.yaml").exists()


@pytest.mark.slow
def test_generated_half_kernels_follow_the_reference_rule(tmp_path):
    """The MobileNet block in float16, rolled and generated: the emulated kernels against the
    CPU reference executor at the float16 tolerance (same rule, summation order apart)."""
    from tilekit.codegen import generate
    from tilekit.codegen.emulate import emulate, find_cxx
    from tilekit.hw import load_profile
    from tilekit.roll.schedule import roll_module
    from tilekit.runtime.check import compare
    from tilekit.runtime.cpu import run_module
    from tilekit.runtime.io import random_input

    if find_cxx() is None:
        pytest.skip("no C++ compiler")
    model = tmp_path / "mobilenet_block.onnx"
    onnx.save(onnx_models.mobilenet_block(), model)
    compiled = pipeline.compile(model, passes=(), dtype="float16", ir_path=tmp_path / "m.yaml")
    profile = load_profile("h100")
    module = generate(roll_module(compiled.module, profile), profile).module
    inputs = {n: random_input(module.tensors[n], 0, i) for i, n in enumerate(module.inputs)}
    got = emulate(module, inputs, compiled.weights)
    want = run_module(module, inputs, compiled.weights)
    for name in module.outputs:
        result = compare(name, got[name], want[name], "float16")
        assert result.passed, result.line()


def tool(name: str, *args) -> subprocess.CompletedProcess:
    """`name args` run in process (tests/clirun.py), its output as text."""
    from clirun import completed
    command = importlib.import_module(f"tilekit.cli.{name.replace('-', '_')}").main
    proc = completed(command, args)
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                       proc.stderr.decode())
    assert proc.returncode == 0, proc.stderr
    return proc
