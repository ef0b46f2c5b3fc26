"""Reductions and the composites built from them, against onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit.onnx import import_model  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _out_shape(shape, axes, keepdims):
    axes = [a % len(shape) for a in (axes if axes is not None else range(len(shape)))]
    if keepdims:
        return [1 if d in axes else n for d, n in enumerate(shape)]
    return [n for d, n in enumerate(shape) if d not in axes]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), ([-1], 0), (None, 1)])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce(op, axes, keepdims, opset):
    shape = [2, 3, 4]
    out = _out_shape(shape, axes, keepdims)
    axes_as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    inits, inputs, attrs = [], [("x", F, shape)], {"keepdims": keepdims}
    if axes is not None and axes_as_input:
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
        inputs.append("axes")
    elif axes is not None:
        attrs["axes"] = axes
    x = np.random.default_rng(0).uniform(0.5, 1.5, shape).astype(np.float32)
    check_against_onnxruntime(single_node_model(op, inputs, [("y", F, out)], opset=opset,
                                                initializers=inits, **attrs), {"x": x})


def test_reduce_noop_with_empty_axes():
    model = single_node_model("ReduceSum", [("x", F, [2, 3])], [("y", F, [2, 3])], opset=18,
                              noop_with_empty_axes=1)
    check_against_onnxruntime(model)


def test_reduce_expression_text():
    model = single_node_model("ReduceMean", [("x", F, [2, 3, 4])], [("y", F, [2, 1, 4])],
                              opset=13, axes=[1], keepdims=1)
    assert import_model(model).module.ops[0].expr == "y[i, j, k] += x[i, r, k] / 3"


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, -1), (11, 0), (13, 1), (13, -1)])
def test_softmax_axis_semantics(op, opset, axis):
    check_against_onnxruntime(single_node_model(op, [("x", F, [2, 3, 4])],
                                                [("y", F, [2, 3, 4])], opset=opset, axis=axis))


def test_softmax_decomposition():
    model = single_node_model("Softmax", [("x", F, [2, 5])], [("y", F, [2, 5])], opset=13)
    ops = import_model(model).module.ops
    assert [op.expr for op in ops] == [
        "y_max[i] max= x[i, r]",
        "y_sum[i] += exp(x[i, r] - y_max[i])",
        "y[i, j] = exp(x[i, j] - y_max[i]) / y_sum[i]",
    ]


def test_cumsum_lp_normalization_mvn_argmax():
    axis = [numpy_helper.from_array(np.asarray(1, np.int64), "axis")]
    for exclusive in (0, 1):
        for reverse in (0, 1):
            check_against_onnxruntime(single_node_model(
                "CumSum", [("x", F, [2, 5]), "axis"], [("y", F, [2, 5])], initializers=axis,
                exclusive=exclusive, reverse=reverse))
    for p in (1, 2):
        check_against_onnxruntime(single_node_model(
            "LpNormalization", [("x", F, [3, 4])], [("y", F, [3, 4])], p=p, axis=0))
        # a row of zeros normalises to zeros (onnxruntime), not 0 / 0
        x = np.random.default_rng(p).standard_normal((3, 4)).astype(np.float32)
        x[1] = 0
        check_against_onnxruntime(single_node_model(
            "LpNormalization", [("x", F, [3, 4])], [("y", F, [3, 4])], p=p, axis=1),
            {"x": x})
    check_against_onnxruntime(single_node_model(
        "MeanVarianceNormalization", [("x", F, [2, 3, 4, 4])], [("y", F, [2, 3, 4, 4])]))
    for op in ("ArgMax", "ArgMin"):
        check_against_onnxruntime(single_node_model(op, [("x", F, [3, 4])],
                                                    [("y", I64, [3, 1])], axis=1))
