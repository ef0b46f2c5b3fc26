"""Opaque ops: the registry (tilekit.opaque) and the converters that emit opaque ops."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit import opaque  # noqa: E402
from tilekit.errors import UnsupportedError  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def test_unknown_type_lists_known_ones():
    with pytest.raises(UnsupportedError) as info:
        opaque.get("NoSuchOp")
    assert "Gather" in info.value.message() and "TopK" in info.value.message()


SAMPLES = {
    "Gather": ([np.arange(12.0).reshape(3, 4), np.array([[2, 0]])], {"axis": 0}),
    "GatherElements": ([np.arange(6.0).reshape(2, 3), np.array([[2, 0, 1]])], {"axis": 1}),
    "GatherND": ([np.arange(8.0).reshape(2, 2, 2), np.array([[0, 1], [1, 0]])],
                 {"batch_dims": 0}),
    "ScatterND": ([np.zeros((4, 2)), np.array([[1], [3]]), np.ones((2, 2))],
                  {"reduction": "add"}),
    "ScatterElements": ([np.zeros((2, 3)), np.array([[1, 0]]), np.ones((1, 2))],
                        {"axis": 1, "reduction": "none"}),
    "TopK": ([np.array([[3.0, 1.0, 3.0, 2.0]])], {"axis": 1, "k": 2, "largest": 1}),
    "ArgMax": ([np.array([[1.0, 5.0, 5.0]])], {"axis": 1, "keepdims": 0,
                                               "select_last_index": 1}),
    "ArgMin": ([np.array([[1.0, 0.0, 0.0]])], {"axis": 1, "keepdims": 1}),
    "Resize": ([np.arange(4.0, dtype=np.float32).reshape(1, 1, 2, 2)],
               {"mode": "linear", "sizes": [1, 1, 4, 4]}),
    "ConvTranspose": ([np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 2, 2), np.float32),
                       None], {"strides": [2, 2], "dilations": [2, 2], "group": 1,
                               "pads_begin": [0, 0], "output_shape": [1, 1, 5, 5]}),
}


@pytest.mark.parametrize("name", sorted(opaque.known()))
def test_shapes_function_agrees_with_run(name):
    inputs, attrs = SAMPLES[name]
    outs = opaque.run(name, inputs, attrs)
    specs = [None if a is None else (tuple(a.shape), str(a.dtype)) for a in inputs]
    predicted = opaque.get(name).shapes(specs, attrs)
    assert [tuple(s) for s, _ in predicted] == [o.shape for o in outs]


def test_topk_values():
    values, indices = opaque.run("TopK", [np.array([[3.0, 1.0, 3.0, 2.0]])],
                                 {"axis": 1, "k": 3, "largest": 1})
    assert values.tolist() == [[3.0, 3.0, 2.0]] and indices.tolist() == [[0, 2, 3]]


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def test_converters_against_onnxruntime():
    rng = np.random.default_rng(3)
    check_against_onnxruntime(single_node_model(
        "TopK", [("x", F, [3, 6]), "k"], [("v", F, [3, 2]), ("i", I64, [3, 2])],
        initializers=[_i64("k", [2])], axis=1))
    check_against_onnxruntime(single_node_model(
        "GatherElements", [("x", F, [3, 4]), ("idx", I64, [3, 2])], [("y", F, [3, 2])],
        axis=1), {"x": rng.standard_normal((3, 4)).astype(np.float32),
                  "idx": np.array([[0, 3], [1, -1], [2, 2]], np.int64)})
    check_against_onnxruntime(single_node_model(
        "GatherND", [("x", F, [2, 3, 4]), ("idx", I64, [2, 2])], [("y", F, [2, 4])]),
        {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
         "idx": np.array([[0, 2], [1, 1]], np.int64)})
    check_against_onnxruntime(single_node_model(
        "ScatterND", [("x", F, [5, 3]), ("idx", I64, [2, 1]), ("u", F, [2, 3])],
        [("y", F, [5, 3])]), {"x": rng.standard_normal((5, 3)).astype(np.float32),
                              "idx": np.array([[4], [1]], np.int64),
                              "u": rng.standard_normal((2, 3)).astype(np.float32)})
    check_against_onnxruntime(single_node_model(
        "ScatterElements", [("x", F, [3, 3]), ("idx", I64, [2, 3]), ("u", F, [2, 3])],
        [("y", F, [3, 3])], axis=0, reduction="add", opset=18),
        {"x": rng.standard_normal((3, 3)).astype(np.float32),
         "idx": np.array([[1, 0, 2], [0, 2, 1]], np.int64),
         "u": rng.standard_normal((2, 3)).astype(np.float32)})


def _f32(name, values):
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


@pytest.mark.parametrize("shape, scales, attrs", [
    ([1, 2, 5, 7], [1, 1, 1.5, 1], {"mode": "linear"}),                         # 7 points by 1.5
    ([1, 2, 5, 4], [1, 1, 1.5, 2], {"mode": "linear",
                                    "coordinate_transformation_mode": "asymmetric"}),
    ([1, 2, 6, 4], [1, 1, 0.5, 2], {"mode": "linear",
                                    "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ([1, 2, 5, 4], [1, 1, 1.5, 2], {"mode": "nearest"}),
    ([1, 1, 5, 5], [1, 1, 2.1, 2.1], {"mode": "nearest", "nearest_mode": "floor",
                                      "coordinate_transformation_mode": "asymmetric"}),
    ([1, 1, 4, 3], [1, 1, 2, 3], {"mode": "nearest", "nearest_mode": "floor",
                                  "coordinate_transformation_mode": "asymmetric"}),
])
def test_resize_maps_coordinates_by_the_given_scales(shape, scales, attrs):
    """ONNX maps output coordinates through the given scales (not out / in, which differs
    when scale x size is not whole); the nearest fast path only for exact integer factors."""
    out = [int(np.floor(n * f)) for n, f in zip(shape, scales)]
    check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, shape), "", "sc"], [("y", F, out)],
        initializers=[_f32("sc", scales)], **attrs))


def test_upsample_by_fractional_scales():
    check_against_onnxruntime(single_node_model(
        "Upsample", [("x", F, [1, 1, 5, 4]), "sc"], [("y", F, [1, 1, 7, 8])], opset=9,
        initializers=[_f32("sc", [1, 1, 1.5, 2])], mode="nearest"))


@pytest.mark.parametrize("indices,affine", [
    (np.array([[0, 1, 2], [1, 2, 3]]), True),           # a grid: i + j
    (np.array([[-1, -2], [-3, -4]]), True),             # negative: wraps to 4 - 2i - j
    (np.array([[0, 2], [1, 0]]), False),                # not affine: stays opaque
])
def test_gather_constant_index_grid(indices, affine):
    model = single_node_model("Gather", [("x", F, [2, 5, 3]), "i"], [("y", F, [2, 2, 2, 3])]
                              if indices.shape == (2, 2) else [("y", F, [2, 2, 3, 3])],
                              axis=1, initializers=[numpy_helper.from_array(
                                  indices.astype(np.int64), "i")])
    imported = check_against_onnxruntime(model)
    assert (imported.module.ops[0].kind == "expr") == affine


@pytest.mark.parametrize("batch_dims,indices,out,affine", [
    # the attention-mask read of dynamo exports: (batch 0, key j) for every j
    (0, np.stack([np.zeros((1, 4), np.int64), np.arange(4).reshape(1, 4)], -1), [1, 4],
     True),
    (0, np.array([[[1], [0]]]), [1, 2, 4], True),       # whole rows, reversed
    (1, np.array([[[3], [1]], [[0], [2]]]), [2, 2], False),
    (1, np.array([[[0], [2]], [[1], [3]]]), [2, 2], True),
])
def test_gather_nd_constant_affine_indices_are_an_index_map(batch_dims, indices, out, affine):
    model = single_node_model("GatherND", [("x", F, [2, 4]), "i"], [("y", F, out)],
                              batch_dims=batch_dims, initializers=[numpy_helper.from_array(
                                  indices.astype(np.int64), "i")])
    imported = check_against_onnxruntime(model)
    assert (imported.module.ops[0].kind == "expr") == affine, imported.module.ops[0]
