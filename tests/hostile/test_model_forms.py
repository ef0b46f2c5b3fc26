"""Valid ONNX written in its less common forms is imported, and broken versions of those
forms are refused in one line (exit 2), the model file untouched: sparse initializers, a
Constant holding a sparse tensor, model-local functions (tilekit.onnx.standard); sparse
tensors whose indices leave their dimensions or whose dense size is over the tensor limit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hostile_support import assert_refused, run, sha256

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime  # noqa: E402

F = TensorProto.FLOAT


def _sparse(dims, indices, values, name="w"):
    return helper.make_sparse_tensor(
        numpy_helper.from_array(np.asarray(values, np.float32), name),
        numpy_helper.from_array(np.asarray(indices, np.int64), f"{name}_idx"), dims)


def _model(nodes, sparse=(), functions=(), domains=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, [2, 3])],
                              sparse_initializer=list(sparse))
    model = helper.make_model(graph, functions=list(functions), opset_imports=[
        helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("indices", [[1, 5], [[0, 1], [1, 2]]], ids=["linear", "coordinates"])
def test_sparse_initializer(indices):
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])],
                   sparse=[_sparse([2, 3], indices, [1.5, -2.0])])
    check_against_onnxruntime(model)


def test_constant_with_a_sparse_value():
    const = helper.make_node("Constant", [], ["w"], sparse_value=_sparse([2, 3], [0, 4], [3, 4]))
    check_against_onnxruntime(_model([const, helper.make_node("Mul", ["x", "w"], ["y"])]))


def test_model_local_function_is_inlined():
    body = [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Neg", ["r"], ["b"])]
    function = helper.make_function("local", "NegRelu", ["a"], ["b"], body,
                                    [helper.make_opsetid("", 17)])
    model = _model([helper.make_node("NegRelu", ["x"], ["y"], domain="local")],
                   functions=[function], domains=["local"])
    imported = check_against_onnxruntime(model)
    assert len(imported.module.ops) == 2


@pytest.mark.parametrize("dims,indices,values,words", [
    ([2, 3], [1, 6], [1, 2], "outside the tensor"),
    ([2, 3], [[0, 1], [2, 0]], [1, 2], "outside the dimensions"),
    ([2, 3], [1, 2, 3], [1, 2], "3 indices"),
    ([1 << 20, 1 << 20], [0], [1], "tensor size limit"),
])
def test_broken_sparse_tensors_are_refused(tmp_path, dims, indices, values, words):
    path = tmp_path / "m.onnx"
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])],
                   sparse=[_sparse(dims, indices, values)])
    onnx.save(model, str(path))
    before = sha256(path)
    result = run("tk-import", path, "-o", tmp_path / "m.yaml")
    assert_refused(result, "tk-import", "sparse tensor 'w'", words)
    assert sha256(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
