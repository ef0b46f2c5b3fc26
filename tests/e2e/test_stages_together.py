"""The three optimising stages in one pipe, in the pipeline's order (tilekit/pipeline.py): roll
| weld | grind | ram | codegen. Each stage's own suite checks it alone (test_weld_models.py, test_ram_pipelines.py,
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
from scope import subset  # noqa: E402
from test_pipelines import assert_checked, run_ok, run_pipe  # noqa: E402

pytestmark = pytest.mark.slow


def by_model(names):
    """An xdist group per model (its ONNX file and welded IR are made once, on one worker);
    the module's tests spread over the workers instead of holding one for a minute."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(f"stages-{n}")) for n in names]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

DENSE = {"bert_encoder_layer": onnx_models.bert_encoder_layer,
         "mobilenet_block": onnx_models.mobilenet_block,
         "mlp_mixer_block": onnx_models.mlp_mixer_block,
         "lstm_model": onnx_models.lstm_model,
         "resnext_block": ram_models.resnext_block}


#: The default suite's share of the dense matrices below (TILEKIT_FULL=1: every model): a
#: transformer layer and a multi-branch CNN block. Of the control-flow models it runs a Loop
#: (an LSTM) and residual blocks gated by If (SkipNet) through every stage, and a Loop its own
#: data stops (greedy decoding) to compiled code; to compiled code also the transformer layer
#: (the MobileNet block's welded convolutions are compiled C++ in test_cpu_pipeline.py, rolled
#: and welded for a CPU; here with TILEKIT_FULL=1).
DENSE_DEFAULT = ("bert_encoder_layer", "resnext_block")


@pytest.fixture(scope="session")
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


def rammed(folder: Path, name: str) -> Path:
    """`tk-ram` of the welded model, once per model: the program run and the compile below
    both read it."""
    path = folder / f"{name}.ram.yaml"
    if not path.exists():
        run_ok(f"tk-ram {welded(folder, name).name} -o {path.name}", folder)
    return path


@pytest.mark.parametrize("name", by_model(subset(sorted(DENSE), DENSE_DEFAULT)))
def test_weld_then_ram_runs_as_a_program(name, folder):
    ir = rammed(folder, name)
    pipe = f"tk-run {ir.name} --mode program --seed 0 --check"
    assert_checked(run_pipe(pipe, folder), pipe)


@needs_nvcc
@pytest.mark.parametrize("name", by_model(subset(sorted(DENSE), DENSE_DEFAULT)))
def test_weld_then_ram_compiles(name, folder):
    ir = rammed(folder, name)
    out = f"{name}.program.cuda.yaml"
    pipe = f"tk-codegen --compile --strict {ir.name} -o {out}"
    run_ok(pipe, folder)
    import yaml

    doc = yaml.safe_load((folder / out).read_text())
    assert any(len(k["ops"]) > 1 for k in doc["kernels"]), "tk-weld fused nothing"
    assert doc["program"] and doc["codegen"]["kernels"]
    if name in ("resnext_block", "mlp_mixer_block"):   # multi-stage groups packed as rTasks
        stages = {k["name"]: (k.get("tile") or {}).get("stages", 1) for k in doc["kernels"]}
        packed = [g for k in doc["codegen"]["kernels"] if k["shape"] == "program"
                  for g in k["schedule"]["operators"]]
        assert any(stages[g] > 1 for g in packed), packed


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="no C++ compiler for the emulation")
@pytest.mark.parametrize("name", by_model(subset(["resnext_block", "mlp_mixer_block"],
                                                 ["resnext_block"])))
def test_weld_then_ram_program_passes_emulation(folder, name):
    import numpy as np

    from tilekit import pipeline
    from tilekit.codegen.emulate import emulate
    from tilekit.ir import read_module
    from tilekit.runtime import run_module
    from tilekit.runtime.io import load_weights

    # fused multi-stage groups (conv chains; layer norms with lane reductions) composed as
    # rTask bodies of a program kernel, beside single-stage groups
    ir = rammed(folder, name)
    module = pipeline.run(read_module(str(ir)), ["codegen"], pipeline.Context.for_hw("h100"))
    assert any(k.get("coresident") for k in module.codegen["kernels"])
    weights = load_weights(module, folder)
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    want = run_module(module, inputs, weights)
    got = emulate(module, inputs, weights)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


def _broadcast_chain() -> onnx.ModelProto:
    """Variadic Max and Sum over broadcast inputs, a Where on a scalar, Clip and Pow: tk-weld
    makes one stage of Sum..Pow whose main op is the Where (Sum is inlined into it)."""
    import numpy as np
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    vi = h.make_tensor_value_info
    g = h.make_graph(
        [h.make_node("Max", ["a", "b", "c"], ["m"]), h.make_node("Sum", ["a", "b", "c"], ["s"]),
         h.make_node("Where", ["cond", "m", "s"], ["w"]), h.make_node("Clip", ["w", "lo"], ["cl"]),
         h.make_node("Pow", ["cl", "e"], ["out"])], "g",
        [vi("a", T.FLOAT, [3, 1, 5]), vi("b", T.FLOAT, [4, 1]), vi("c", T.FLOAT, []),
         vi("cond", T.BOOL, [])], [vi("out", T.FLOAT, None)],
        [nh.from_array(np.array(0.1, np.float32), "lo"),
         nh.from_array(np.array([2, 3, 0.5, 1, -1], np.float32), "e")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_ram_plans_a_one_stage_group_by_its_main_op(folder):
    """The group's blocks are its main op's (not its first op's, an inlined producer): the
    program codegen composes, and the CPU program mode, agree with it."""
    onnx.save(_broadcast_chain(), str(folder / "bcast.onnx"))
    pipe = ("tk-import bcast.onnx | tk-roll --hw h100 | tk-weld | tk-ram | tee bcast.ram.yaml "
            "| tk-run --mode program --seed 0 --check && tk-codegen bcast.ram.yaml > /dev/null")
    assert_checked(run_pipe(pipe, folder), pipe)


def _counting_loop() -> onnx.ModelProto:
    """A Loop of three scalars with a trip count and a condition computed from its state."""
    import numpy as np
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    def vi(name, shape, dt=T.FLOAT):
        return h.make_tensor_value_info(name, dt, shape)

    body = h.make_graph(
        [h.make_node("Add", ["x_in", "one"], ["x_out"]),
         h.make_node("ReduceSum", ["x_out"], ["s"], keepdims=0),
         h.make_node("Less", ["s", "lim"], ["c_out"]), h.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
         h.make_node("Mul", ["x_out", "fi"], ["y"])], "body",
        [vi("i", [], T.INT64), vi("c_in", [], T.BOOL), vi("x_in", [3])],
        [vi("c_out", [], T.BOOL), vi("x_out", [3]), vi("y", [3])])
    g = h.make_graph([h.make_node("Loop", ["M", "c0", "x0"], ["xT", "ys"], body=body)], "g",
                     [vi("x0", [3])], [vi("xT", [3]), vi("ys", None)],
                     [nh.from_array(np.array(10, np.int64), "M"),
                      nh.from_array(np.array(True), "c0"),
                      nh.from_array(np.ones(3, np.float32), "one"),
                      nh.from_array(np.array(20.0, np.float32), "lim")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@needs_nvcc
@pytest.mark.parametrize("hw", subset(["h100", "a100"], ["h100"]))
def test_a_tiny_device_loop_compiles_without_spills(hw, folder):
    """A device loop on one block of 3 threads: with `__launch_bounds__(3)` alone ptxas
    spilled 8-20 bytes with registers to spare; the min-blocks term gives it the room."""
    onnx.save(_counting_loop(), str(folder / "counting.onnx"))
    pipe = (f"tk-import counting.onnx | tk-roll --hw {hw} | tk-grind | tee counting.{hw}.yaml "
            f"| tk-codegen --compile --strict -o counting.{hw}.cuda.yaml && "
            f"tk-run counting.{hw}.yaml --seed 0 --check")
    assert_checked(run_pipe(pipe, folder), pipe)
    import yaml

    doc = yaml.safe_load((folder / f"counting.{hw}.cuda.yaml").read_text())
    assert [k["shape"] for k in doc["codegen"]["kernels"]] == ["device_loop"]


def ground_and_rammed(folder: Path, name: str) -> Path:
    """`tk-grind | tk-ram` of the welded model, once per model: the program run, the compile
    and the compiled CPU code below read it."""
    path = folder / f"{name}.grind.ram.yaml"
    if not path.exists():
        run_ok(f"tk-grind {welded(folder, name).name} | tk-ram -o {path.name}", folder)
    return path


@pytest.mark.parametrize("name", by_model(subset(sorted(control_models.MODELS),
                                                 ("lstm_loop", "skipnet"))))
def test_control_models_through_every_stage(name, folder):
    ir = ground_and_rammed(folder, name)
    pipe = f"tk-run {ir.name} --mode program --seed 0 --check"
    assert_checked(run_pipe(pipe, folder), pipe)


@needs_nvcc
@pytest.mark.parametrize("name", by_model(["lstm_loop"]))  # each: tests/unit/test_grind.py
def test_control_models_through_every_stage_compile(name, folder):
    ir = ground_and_rammed(folder, name)
    run_ok(f"tk-codegen --compile --strict {ir.name} -o {name}.cuda.yaml", folder)


needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="no C++ compiler for the CPU target")


@needs_cxx
@pytest.mark.parametrize("name", by_model(
    subset(sorted(DENSE), ("bert_encoder_layer",))
    + subset(sorted(control_models.MODELS), ("greedy_decoder",))))
def test_every_stage_then_compiled_cpu_code(name, folder):
    """Rolled, welded, ground and rammed, then C++ for the CPU: the compiled kernels equal
    onnxruntime (tk-run runs the compiled code by default and checks it)."""
    ir = ground_and_rammed(folder, name)
    pipe = f"tk-codegen --target cpu {ir.name} | tk-run --seed 0 --threads 2 --check"
    assert_checked(run_pipe(pipe, folder), pipe)


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


@pytest.mark.parametrize("name, dtype", [(n, "float16") for n in subset(
    sorted(control_models.MODELS), ("greedy_decoder", "skipnet"))] + [("lstm_loop", "bfloat16")])
def test_control_models_in_half_precision(name, dtype, folder):
    """`--dtype` reaches the loop bodies and branches too (their tensors and ops were left in
    float32 and the import failed its own verification)."""
    pipe = f"tk-import {onnx_file(folder, name).name} --dtype {dtype} | tk-run --seed 0 --check"
    assert_checked(run_pipe(pipe, folder), pipe)
