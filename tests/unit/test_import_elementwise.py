"""Elementwise converters: each op imported alone and run against onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL

UNARY = ["Abs", "Neg", "Exp", "Sigmoid", "Tanh", "Erf", "Sign", "Floor", "Ceil", "Round",
         "Sin", "Cos", "Tan", "Relu", "Softsign", "Softplus", "Sinh", "Cosh", "Asinh",
         "Reciprocal", "Identity", "HardSwish", "Mish"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    opset = 18 if op == "Mish" else 17
    check_against_onnxruntime(single_node_model(op, [("x", F, [2, 3, 4])],
                                                [("y", F, [2, 3, 4])], opset=opset))


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Acosh", "Atanh"])
def test_unary_on_its_domain(op):
    x = np.random.default_rng(0).uniform(1.1, 3.0, (3, 4)).astype(np.float32)
    if op == "Atanh":
        x = x / 4
    check_against_onnxruntime(single_node_model(op, [("x", F, [3, 4])], [("y", F, [3, 4])]),
                              {"x": x})


@pytest.mark.parametrize("op,attrs", [
    ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}), ("Selu", {}),
    ("Celu", {"alpha": 1.5}), ("ThresholdedRelu", {"alpha": 0.3}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Shrink", {"lambd": 0.4, "bias": 0.1}),
    ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
])
def test_unary_with_attributes(op, attrs):
    opset = 20 if op == "Gelu" else 17
    check_against_onnxruntime(single_node_model(op, [("x", F, [4, 5])], [("y", F, [4, 5])],
                                                opset=opset, **attrs))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("a,b", [([2, 3, 4], [2, 3, 4]), ([2, 3, 4], [4]), ([2, 1, 4], [3, 1]),
                                 ([1], [2, 3])])
def test_binary_broadcast(op, a, b):
    out = list(np.broadcast_shapes(tuple(a), tuple(b)))
    check_against_onnxruntime(single_node_model(op, [("a", F, a), ("b", F, b)],
                                                [("y", F, out)]))


def test_variadic_three_inputs():
    for op in ("Sum", "Mean", "Max", "Min"):
        check_against_onnxruntime(single_node_model(
            op, [("a", F, [2, 3]), ("b", F, [3]), ("c", F, [2, 1])], [("y", F, [2, 3])]))


def test_pow_and_scalar_constant_inlined():
    init = numpy_helper.from_array(np.asarray(2.0, np.float32), "two")
    model = single_node_model("Pow", [("x", F, [3, 4]), "two"], [("y", F, [3, 4])],
                              initializers=[init])
    imported = check_against_onnxruntime(model)
    assert imported.module.ops[0].expr == "y[i, j] = pow(x[i, j], 2.0)"
    assert not imported.weights


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
def test_comparisons(op):
    check_against_onnxruntime(single_node_model(op, [("a", F, [3, 4]), ("b", F, [4])],
                                                [("y", B, [3, 4])]))


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check_against_onnxruntime(single_node_model(op, [("a", B, [3, 4]), ("b", B, [3, 4])],
                                                [("y", B, [3, 4])]))


def test_not_where_and_cast():
    check_against_onnxruntime(single_node_model("Not", [("a", B, [5])], [("y", B, [5])]))
    check_against_onnxruntime(single_node_model(
        "Where", [("c", B, [3, 1]), ("a", F, [3, 4]), ("b", F, [4])], [("y", F, [3, 4])]))
    x = np.array([-2.7, -0.5, 0.0, 0.4, 3.9], np.float32)
    check_against_onnxruntime(single_node_model("Cast", [("x", F, [5])], [("y", I64, [5])],
                                                to=I64), {"x": x})


@pytest.mark.parametrize("opset,fmod", [(13, 0), (13, 1)])
def test_mod(opset, fmod):
    a = np.array([-7, -3, 5, 8, 9], np.float32)
    b = np.array([3, 2, -3, 5, 4], np.float32)
    if fmod == 0:
        a, b = a.astype(np.int64), b.astype(np.int64)
    t = I64 if fmod == 0 else F
    check_against_onnxruntime(single_node_model("Mod", [("a", t, [5]), ("b", t, [5])],
                                                [("y", t, [5])], opset=opset, fmod=fmod),
                              {"a": a, "b": b})


@pytest.mark.parametrize("opset", [6, 12])
def test_clip_bounds_as_attributes_or_inputs(opset):
    if opset < 11:
        model = single_node_model("Clip", [("x", F, [4, 5])], [("y", F, [4, 5])],
                                  opset=opset, min=-0.5, max=0.5)
    else:
        inits = [numpy_helper.from_array(np.asarray(-0.5, np.float32), "lo")]
        model = single_node_model("Clip", [("x", F, [4, 5]), "lo", ("hi", F, [])],
                                  [("y", F, [4, 5])], opset=opset, initializers=inits)
    check_against_onnxruntime(model, None if opset < 11 else {
        "x": np.linspace(-2, 2, 20, dtype=np.float32).reshape(4, 5),
        "hi": np.asarray(0.75, np.float32)})


@pytest.mark.parametrize("slope_shape", [[1], [4], [3, 1, 1]])
def test_prelu(slope_shape):
    inits = [numpy_helper.from_array(
        np.linspace(0.1, 0.3, int(np.prod(slope_shape))).astype(np.float32)
        .reshape(slope_shape), "slope")]
    check_against_onnxruntime(single_node_model("PRelu", [("x", F, [2, 3, 4, 4]), "slope"],
                                                [("y", F, [2, 3, 4, 4])], initializers=inits))


def test_isnan_isinf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check_against_onnxruntime(single_node_model("IsNaN", [("x", F, [5])], [("y", B, [5])]),
                              {"x": x})
    check_against_onnxruntime(single_node_model("IsInf", [("x", F, [5])], [("y", B, [5])],
                                                detect_negative=0), {"x": x})


def test_dropout_is_identity_and_mask_is_true():
    model = single_node_model("Dropout", [("x", F, [3, 4])], [("y", F, [3, 4]),
                                                               ("mask", B, [3, 4])], opset=13)
    imported = check_against_onnxruntime(model)
    assert [op.expr for op in imported.module.ops] == ["mask[i, j] = 1", "y[i, j] = x[i, j]"] \
        or len(imported.module.ops) == 2


def test_legacy_broadcast_with_axis():
    model = single_node_model("Add", [("a", F, [2, 3, 4, 5]), ("b", F, [3])],
                              [("y", F, [2, 3, 4, 5])], opset=6, broadcast=1, axis=1)
    imported = __import__("tilekit.onnx", fromlist=["import_model"]).import_model(model)
    assert imported.module.ops[0].expr == "y[i, j, k, l] = a[i, j, k, l] + b[j]"


@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize(per_axis):
    scale = np.array([0.05, 0.1, 0.2], np.float32) if per_axis else np.float32(0.07)
    zero = np.array([3, 128, 250], np.uint8) if per_axis else np.uint8(120)
    inits = [numpy_helper.from_array(np.asarray(scale), "s"),
             numpy_helper.from_array(np.asarray(zero), "z")]
    check_against_onnxruntime(single_node_model(
        "QuantizeLinear", [("x", F, [2, 3, 4]), "s", "z"], [("y", TensorProto.UINT8, [2, 3, 4])],
        initializers=inits, axis=1, opset=13), atol=1)
    check_against_onnxruntime(single_node_model(
        "DequantizeLinear", [("q", TensorProto.UINT8, [2, 3, 4]), "s", "z"],
        [("y", F, [2, 3, 4])], initializers=inits, axis=1, opset=13))
