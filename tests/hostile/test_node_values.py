"""Attribute and constant values outside what ONNX allows are refused in one line (exit 2)
naming the node, never taken as something else: an opset below 1, a Transpose `perm` that
is no permutation, a Gather's constant index outside its axis (which used to be wrapped
around: index 99 of 2 read row 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hostile_support import assert_refused, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime  # noqa: E402

F = TensorProto.FLOAT


def _save(folder: Path, nodes, out_shape, inits=(), opset: int = 17) -> str:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, out_shape)], list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
              str(folder / "m.onnx"))
    return "m.onnx"


@pytest.mark.parametrize("opset", [0, -3])
def test_an_opset_below_one_is_refused(tmp_path, opset):
    name = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [2, 3], opset=opset)
    assert_refused(run("tk-import", name, folder=tmp_path), "tk-import", "opset_import",
                   f"opset {opset}")


@pytest.mark.parametrize("perm,words", [([0, 0], "names axis 0 twice"),
                                        ([1], "perm has 1 axes"),
                                        ([0, 2], "not an axis of a rank-2 tensor")])
def test_a_perm_that_is_no_permutation_is_refused_at_its_node(tmp_path, perm, words):
    """(ONNX's shape inference refuses a perm of the wrong length first; with
    --lenient-shapes the converter does.)"""
    name = _save(tmp_path, [helper.make_node("Transpose", ["x"], ["y"], perm=perm)], [3, 2])
    assert_refused(run("tk-import", name, "--lenient-shapes", folder=tmp_path), "tk-import",
                   "'Transpose_0'", words)


@pytest.mark.parametrize("index,axis", [(99, 0), (-7, 1), (2, 0)])
def test_a_constant_gather_index_out_of_range_is_not_wrapped(tmp_path, index, axis):
    shape = [1, 3] if axis == 0 else [2, 1]
    name = _save(tmp_path, [helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], shape,
                 [numpy_helper.from_array(np.array([index], np.int64), "i")])
    assert run("tk-import", name, "-o", "m.yaml", folder=tmp_path).exit_code == 0
    result = run("tk-run", "m.yaml", "--mode", "whole", "--seed", "0", folder=tmp_path)
    assert_refused(result, "tk-run", f"Gather index {index} is out of range")


@pytest.mark.parametrize("index,axis", [(-2, 0), (-3, 1), (1, 0)])
def test_constant_gather_indices_in_range_equal_onnxruntime(tmp_path, index, axis):
    shape = [1, 3] if axis == 0 else [2, 1]
    name = _save(tmp_path, [helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], shape,
                 [numpy_helper.from_array(np.array([index], np.int64), "i")])
    check_against_onnxruntime(onnx.load(str(tmp_path / name)))


@pytest.mark.parametrize("op,inputs,outputs,words", [
    ("Relu", ["x", "x"], ["y"], "Relu (opset 17) has 2 inputs; its schema allows 1"),
    ("Add", ["x"], ["y"], "Add (opset 17) has 1 inputs; its schema allows 2"),
    ("Relu", ["x"], ["y", "z"], "has 2 outputs; its schema allows 1"),
])
def test_a_node_with_more_or_fewer_inputs_than_its_schema_is_refused(tmp_path, op, inputs,
                                                                     outputs, words):
    """(A Relu given two inputs was imported as a Relu of the first: lenient shape inference
    only warns about the count.)"""
    name = _save(tmp_path, [helper.make_node(op, inputs, outputs)], [2, 3])
    assert_refused(run("tk-import", name, folder=tmp_path), "tk-import", f"'{op}_0'", words)


def _typed(folder: Path, node, inputs: dict, inits=()) -> str:
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, t, [2, 3]) for n, t in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)], list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(folder / "m.onnx"))
    return "m.onnx"


@pytest.mark.parametrize("op,inputs,inits,words", [
    ("Cos", {"x": TensorProto.INT64}, (), "Cos (opset 17) input 0 'x' is int64; its schema "
                                          "allows double, float, float16"),
    ("Add", {"x": F, "z": TensorProto.INT64}, (), "Add (opset 17) inputs 0 and 1 share type "
                                                  "T but are float and int64"),
    ("Reshape", {"x": F}, [numpy_helper.from_array(np.array([3, 2], np.float32), "z")],
     "Reshape (opset 17) input 1 'z' is float; its schema allows int64"),
])
def test_an_input_type_outside_its_schema_is_refused(tmp_path, op, inputs, inits, words):
    """(ONNX's strict inference refuses these, and lenient inference, which the importer
    falls back to, imported them: a Cos of int64 ran as a Cos of float.)"""
    name = _typed(tmp_path, helper.make_node(op, ["x", "z"][:len(inputs) + len(inits)], ["y"]),
                  inputs, inits)
    assert_refused(run("tk-import", name, folder=tmp_path), "tk-import", f"'{op}_0'", words)


def test_a_node_of_the_ai_onnx_domain_is_checked_against_its_schema(tmp_path):
    """('ai.onnx' is the standard domain's other name: its nodes' schemas are the same, and
    looking them up under that name found none, so their types went unchecked.)"""
    graph = helper.make_graph(
        [helper.make_node("Cos", ["x"], ["y"], domain="ai.onnx")], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    assert_refused(run("tk-import", "m.onnx", folder=tmp_path), "tk-import", "'Cos_0'",
                   "Cos (opset 17) input 0 'x' is int64")
