"""What an import fixes or states about a model exported for another use: branches on shape
tests and on fixed input values (`--value`), declared dynamic dimensions, every unsupported op
type named at once, `--dtype` spellings, and `--random-weights`."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from clirun import run_in
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import (check_against_onnxruntime, onnxruntime_outputs,  # noqa: E402
                               run_imported)

from tilekit.cli import tk_import, tk_run  # noqa: E402
from tilekit.errors import TilekitError, UnsupportedError  # noqa: E402
from tilekit.onnx import import_model, reference_source  # noqa: E402
from tilekit.onnx.random_weights import randomize  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


cli = run_in


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _branch(name, node, out, shape):
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, F, shape)])


def shape_test_model() -> onnx.ModelProto:
    """`if x.shape[0] == 1: y = x * 2 else: y = concat(x, x)`: the branches differ in shape,
    the condition is static once x has one."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Equal", ["n", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=_branch(
                 "then", helper.make_node("Mul", ["x", "two"], ["t"]), "t", [1, 4]),
                 else_branch=_branch("else", helper.make_node("Concat", ["x", "x"], ["e"],
                                                              axis=0), "e", ["M", 4])),
             helper.make_node("Relu", ["y"], ["r"]),
             # a Shape of the If's output: before the If folded, its shape was unknown
             # and this Shape was reported as an unsupported op
             helper.make_node("Shape", ["y"], ["ys"]),
             helper.make_node("Reshape", ["r", "ys"], ["out"])]
    inits = [numpy_helper.from_array(np.int64(0), "zero"),
             numpy_helper.from_array(np.int64(1), "one"),
             numpy_helper.from_array(np.float32(2), "two")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 4])],
                  [helper.make_tensor_value_info("out", F, None)], inits)


def sample_rate_model() -> onnx.ModelProto:
    """An If on an input's value (a sample rate), the branches of different shapes."""
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=_branch(
                 "then", helper.make_node("Mul", ["x", "two"], ["t"]), "t", [2, 4]),
                 else_branch=_branch("else", helper.make_node("Concat", ["x", "x"], ["e"],
                                                              axis=0), "e", [4, 4]))]
    inits = [numpy_helper.from_array(np.int64(16000), "rate"),
             numpy_helper.from_array(np.float32(2), "two")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4]),
                          helper.make_tensor_value_info("sr", I64, [])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


# -- If folded on shape tests and on fixed values ------------------------------------------

def test_if_on_a_shape_test_folds_to_its_branch():
    model = shape_test_model()
    imported = import_model(model, shapes={"x": [1, 4]})
    assert not imported.module.control and all(op.kind == "expr" for op in imported.module.ops)
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    (got,) = run_imported(imported, {"x": x})
    np.testing.assert_allclose(got, np.maximum(x * 2, 0))
    other = import_model(model, shapes={"x": [3, 4]})   # the other branch
    assert other.module.tensors["out"].shape == (6, 4)


def test_if_on_an_input_value_needs_value_flag():
    model = sample_rate_model()
    with pytest.raises(TilekitError, match=r"value of graph input 'sr'.*--value sr="):
        import_model(model)
    for rate, rows in ((16000, 2), (8000, 4)):
        imported = import_model(model, values={"sr": [rate]})
        assert imported.module.inputs == ("x",) and not imported.module.control
        x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
        (got,) = run_imported(imported, {"x": x})
        (want,) = onnxruntime_outputs(model, {"x": x, "sr": np.asarray(rate, np.int64)})
        assert got.shape == (rows, 4)
        np.testing.assert_allclose(got, want)


def test_value_flag_through_the_commands(tmp_path):
    onnx.save(sample_rate_model(), str(tmp_path / "sr.onnx"))
    result = cli(tk_import.main, ["sr.onnx", "--value", "sr=16000", "-o", "sr.yaml"], tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((tmp_path / "sr.yaml").read_text())
    assert doc["inputs"] == ["x"]
    assert doc["stages"][0]["options"]["values"] == {"sr": [16000]}
    result = cli(tk_run.main, ["sr.yaml", "--seed", "0", "--check"], tmp_path)
    assert result.exit_code == 0 and "check: pass" in result.output, result.output


@pytest.mark.parametrize("flag,message", [
    ("sr=fast", "cannot read"), ("sr", "cannot read"), ("=1", "cannot read"),
    ("rate=1", "not a graph input"), ("sr=16000.5", "whole numbers"),
    ("sr=1,2", "2 values do not fill 'sr'"), ("sr=1e30", "out of the range of int64")])
def test_bad_value_flags_exit_2_naming_the_flag(tmp_path, flag, message):
    onnx.save(sample_rate_model(), str(tmp_path / "sr.onnx"))
    result = cli(tk_import.main, ["sr.onnx", "--value", flag, "-o", "sr.yaml"], tmp_path)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "--value" in line and message in line, line
    assert not (tmp_path / "sr.yaml").exists()


def test_value_and_shape_on_one_input_is_refused():
    with pytest.raises(TilekitError, match="both --value and --shape"):
        import_model(sample_rate_model(), values={"sr": [1]}, shapes={"sr": [1]})


def test_one_value_fills_a_static_shape():
    model = _model([helper.make_node("Cast", ["m"], ["y"], to=F)],
                   [helper.make_tensor_value_info("m", I64, [1, 4])],
                   [helper.make_tensor_value_info("y", F, [1, 4])])
    (got,) = run_imported(import_model(model, values={"m": [1]}), {})
    np.testing.assert_array_equal(got, np.ones((1, 4), np.float32))


def test_value_fills_an_open_dimension():
    model = _model([helper.make_node("ReduceSum", ["v"], ["y"], keepdims=0)],
                   [helper.make_tensor_value_info("v", F, ["K"])],
                   [helper.make_tensor_value_info("y", F, [])])
    imported = import_model(model, values={"v": [1.5, 2.0, 0.25]})
    assert imported.module.inputs == ()
    (got,) = run_imported(imported, {})
    assert float(got) == 3.75
    _, feeds = reference_source(model, {"values": {"v": [1.5, 2.0, 0.25]}})
    assert feeds["v"].dtype == np.float32 and feeds["v"].shape == (3,)


# -- declared dynamic dimensions -------------------------------------------------------------

@pytest.mark.parametrize("declared", [[-1, 2], ["batch", 2], [0, 2]])
def test_declared_dynamic_output_dims_are_no_contradiction(declared):
    model = _model([helper.make_node("Identity", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["N", 2])],
                   [helper.make_tensor_value_info("y", F, declared)])
    imported = import_model(model, shapes={"x": [1, 2]})
    assert imported.module.tensors["y"].shape == (1, 2)


def test_declared_static_contradiction_is_still_refused():
    model = _model([helper.make_node("Identity", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, ["N", 2])],
                   [helper.make_tensor_value_info("y", F, [3, 2])])
    with pytest.raises(UnsupportedError, match="contradicts"):
        import_model(model, shapes={"x": [1, 2]})


# -- every unsupported op type in one line ---------------------------------------------------

def test_every_unsupported_op_type_is_named_with_counts():
    nodes = [helper.make_node("Hardmax", ["x"], ["a"]), helper.make_node("Det", ["a"], ["b"]),
             helper.make_node("Hardmax", ["b"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 3])])
    with pytest.raises(UnsupportedError) as info:
        import_model(model)
    text = str(info.value)
    assert "3 nodes of 2 op types are not supported (opset 17): Det x1, Hardmax x2" in text
    assert "'Det'" in text and "\n" not in text


def test_every_sequence_op_and_foreign_op_is_named_too():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"]),
             helper.make_node("SequenceAt", ["s", "zero"], ["a"]),
             helper.make_node("SequenceAt", ["s", "zero"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [1, 3])],
                   [numpy_helper.from_array(np.int64(0), "zero")])
    with pytest.raises(UnsupportedError, match="SequenceAt x2, SplitToSequence x1"):
        import_model(model)
    nodes = [helper.make_node("FusedMatMul", ["x", "x"], ["a"], domain="com.microsoft"),
             helper.make_node("Gelu", ["a"], ["b"], domain="com.microsoft"),
             helper.make_node("FusedMatMul", ["b", "b"], ["y"], domain="com.microsoft")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 3])],
                   [helper.make_tensor_value_info("y", F, [3, 3])])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedError, match=r"3 such nodes: com.microsoft::FusedMatMul x2, "
                                               r"com.microsoft::Gelu x1"):
        import_model(model)


def test_a_shape_that_cannot_fold_says_a_dimension_is_dynamic():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=F)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(UnsupportedError, match="depends on the input values"):
        import_model(model)


# -- --dtype spellings ----------------------------------------------------------------------

@pytest.mark.parametrize("given,stored", [("fp16", "float16"), ("BF16", "bfloat16"),
                                          ("fp32", None), ("half", "float16")])
def test_dtype_aliases(tmp_path, given, stored):
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 3])])
    onnx.save(model, str(tmp_path / "m.onnx"))
    result = cli(tk_import.main, ["m.onnx", "--dtype", given, "-o", "m.yaml"], tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert doc["stages"][0]["options"].get("dtype") == stored
    assert doc["tensors"]["y"]["dtype"] == (stored or "float32")


def test_unknown_dtype_lists_the_choices(tmp_path):
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])],
                     [helper.make_tensor_value_info("x", F, [2])],
                     [helper.make_tensor_value_info("y", F, [2])]), str(tmp_path / "m.onnx"))
    result = cli(tk_import.main, ["m.onnx", "--dtype", "fp8"], tmp_path)
    assert result.exit_code == 2
    assert "--dtype" in result.stderr and "fp16" in result.stderr and "bfloat16" in result.stderr


# -- random weights ------------------------------------------------------------------------

def test_random_weights_are_seeded_scaled_and_leave_integers_alone():
    model = onnx.load(str(LIGHT / "light_squeezenet.onnx"))
    first, again, other = randomize(model, 3), randomize(model, 3), randomize(model, 4)
    assert first.SerializeToString() == again.SerializeToString()
    assert first.SerializeToString() != other.SerializeToString()
    fills = [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    assert fills and not any(n.op_type == "ConstantOfShape" for n in first.graph.node)
    inits = {t.name: numpy_helper.to_array(t) for t in first.graph.initializer}
    conv_w = inits[next(n.input[1] for n in first.graph.node if n.op_type == "Conv")]
    fan_in = int(np.prod(conv_w.shape[1:]))
    assert 0.5 < float(conv_w.std()) * np.sqrt(fan_in) < 1.5
    for t in model.graph.initializer:    # shapes and other integer tensors stay as they were
        if t.data_type == TensorProto.INT64:
            np.testing.assert_array_equal(inits[t.name], numpy_helper.to_array(t))


def test_random_weights_keep_parameters_and_make_variances_positive():
    w = numpy_helper.from_array(np.full((3, 2, 1, 1), 0.02, np.float32), "w")
    params = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in ("s", "b", "m", "v")]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Resize", ["n", "", "scales"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 2, 2])],
                   [helper.make_tensor_value_info("y", F, [1, 3, 4, 4])],
                   [w, scales] + params)
    inits = {t.name: numpy_helper.to_array(t) for t in randomize(model, 0).graph.initializer}
    np.testing.assert_array_equal(inits["scales"], [1, 1, 2, 2])
    assert inits["v"].min() >= 0.5 and inits["s"].min() >= 0.5
    assert np.unique(inits["w"]).size == 6 and np.unique(inits["m"]).size == 3
    check_against_onnxruntime(randomize(model, 0))


def test_random_weights_flag_makes_check_meaningful(tmp_path):
    model = LIGHT / "light_squeezenet.onnx"
    result = cli(tk_import.main, [str(model), "--random-weights", "7", "-o", "s.yaml"], tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((tmp_path / "s.yaml").read_text())
    assert doc["stages"][0]["options"]["random_weights"] == 7
    weights = np.load(tmp_path / "s.weights.npz")
    assert all(np.unique(weights[k]).size > 1 for k in weights.files if weights[k].size > 1)
    result = cli(tk_run.main, ["s.yaml", "--seed", "0", "--check", "-o", "out.npz"],
                 tmp_path)
    assert result.exit_code == 0 and "check: pass" in result.output, result.output
    out = np.load(tmp_path / "out.npz")
    probs = out[out.files[0]]           # softmax over 1000 classes: not a uniform output
    assert float(np.std(probs)) > 0.01 * float(np.mean(probs))


# -- folding what dynamic exports compute from shapes -------------------------------------

def test_gather_elements_over_a_long_axis_folds():
    """BERT's position ids as the dynamo exporter writes them: GatherElements of a constant
    [1, 64] (onnx's reference implementation fails beyond 32 choices)."""
    table = numpy_helper.from_array(np.arange(64, dtype=np.int64).reshape(1, 64) * 3, "table")
    idx = numpy_helper.from_array(np.arange(16, dtype=np.int64).reshape(1, 16)[:, ::-1]
                                  .copy() - 20, "idx")
    nodes = [helper.make_node("GatherElements", ["table", "idx"], ["g"], axis=1),
             helper.make_node("Cast", ["g"], ["gf"], to=F),
             helper.make_node("Add", ["x", "gf"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 16])],
                   [helper.make_tensor_value_info("y", F, [1, 16])], [table, idx])
    imported = check_against_onnxruntime(model)
    assert len(imported.module.ops) == 1   # the gather folded into a weight


def test_a_folded_value_declared_with_open_dims_keeps_its_shape():
    """A dynamic export declares shape arithmetic with symbolic dims (value_info
    [s0, 2]); once folded the value's own shape counts (GatherND's output depends on it)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Range", ["zero_s", "n_s", "one_s"], ["r"]),
             helper.make_node("Max", ["r", "r"], ["rm"]),   # no data propagation through Max
             helper.make_node("Unsqueeze", ["rm", "axis"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["y"])]
    nodes.insert(2, helper.make_node("Squeeze", ["n"], ["n_s"]))
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.int64(0), "zero_s"),
             numpy_helper.from_array(np.int64(1), "one_s"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 5])],
                   [helper.make_tensor_value_info("y", F, ["N", 5])], inits)
    model.graph.value_info.append(helper.make_tensor_value_info("idx", I64, ["N", 1]))
    imported = import_model(model, shapes={"x": [3, 5]})
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    (got,) = run_imported(imported, {"x": x})
    np.testing.assert_array_equal(got, x)
    # without the shape, N stays a symbol: one module for every N, equal at another size
    from tilekit.ir.dims import instantiate
    symbolic = import_model(model)
    assert symbolic.module.tensors["x"].shape == ("N", 5)
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    (got,) = run_imported(replace(symbolic, module=instantiate(symbolic.module, {"N": 4})),
                          {"x": x})
    np.testing.assert_array_equal(got, x)


def test_random_weights_reach_loop_bodies():
    """The LSTM's weights are initializers of its Loop body: randomised too, and the
    import still matches onnxruntime on the randomised model."""
    from models import control_models

    def body_weights(model):
        (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
        body = next(a.g for a in loop.attribute if a.name == "body")
        return {t.name: numpy_helper.to_array(t) for t in body.initializer
                if t.data_type == TensorProto.FLOAT}

    model = control_models.lstm_loop()
    random = randomize(model, 5)
    before, after = body_weights(model), body_weights(random)
    assert before and all(not np.array_equal(before[n], after[n]) for n in before)
    check_against_onnxruntime(random, control_models.feeds("lstm_loop", random))


# -- shape arithmetic that folds one block per round --------------------------------------

def test_shape_chains_deeper_than_the_round_limit_fold():
    """Each block pads by an amount computed from the previous block's shape through ops
    ONNX's shape inference does not propagate (as torchvision's Swin pads its windows): the
    next Shape folds only once this Pad's pads fold, one block per round. More blocks than
    the limit of rounds without progress must still fold (Swin-T, TorchScript export)."""
    from onnx import numpy_helper

    nodes, inits, t = [], [numpy_helper.from_array(np.array([0, 1], np.int64), "one")], "x"
    for b in range(7):
        nodes += [helper.make_node("Shape", [t], [f"s{b}"]),
                  helper.make_node("Transpose", [f"s{b}"], [f"st{b}"], perm=[0]),
                  helper.make_node("Sub", [f"st{b}", f"st{b}"], [f"z{b}"]),
                  helper.make_node("Concat", [f"z{b}", "one"], [f"p{b}"], axis=0),
                  helper.make_node("Pad", [t, f"p{b}"], [f"t{b}"])]
        t = f"t{b}"
    nodes.append(helper.make_node("Relu", [t], ["y"]))
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 10])])
    model.graph.initializer.extend(inits)
    from models.onnx_check import check_against_onnxruntime
    check_against_onnxruntime(model)
