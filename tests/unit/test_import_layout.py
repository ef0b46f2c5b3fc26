"""Layout converters (index maps) against onnxruntime, and the reshape index algebra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit.onnx import import_model  # noqa: E402
from tilekit.onnx.converters.layout import reshape_indices  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


@pytest.mark.parametrize("src,dst", [
    ([2, 3, 4], [6, 4]), ([2, 3, 4], [2, 12]), ([2, 3, 4], [24]), ([24], [2, 3, 4]),
    ([2, 3, 4], [4, 3, 2]), ([6, 4], [4, 6]), ([1, 2048, 1, 1], [1, 2048]),
    ([2, 6], [3, 4]), ([4, 1, 6], [2, 2, 3, 2]),
])
def test_reshape(src, dst):
    check_against_onnxruntime(single_node_model(
        "Reshape", [("x", F, src), "shape"], [("y", F, dst)], initializers=[_i64("shape", dst)]))


def test_reshape_indices_read_like_hand_written_maps():
    assert reshape_indices([2, 3, 4], [2, 12], ["i", "j"]) == ["i", "j // 4", "j % 4"]
    assert reshape_indices([1, 2048, 1, 1], [1, 2048], ["i", "j"]) == ["0", "j", "0", "0"]
    assert reshape_indices([6, 4], [4, 6], ["i", "j"]) == ["(i*6 + j) // 4", "(i*6 + j) % 4"]


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_flatten(axis):
    shape = [2, 3, 4]
    a = axis % 3
    out = [int(np.prod(shape[:a])), int(np.prod(shape[a:]))]
    check_against_onnxruntime(single_node_model("Flatten", [("x", F, shape)], [("y", F, out)],
                                                axis=axis))


def test_squeeze_unsqueeze_transpose():
    check_against_onnxruntime(single_node_model(
        "Squeeze", [("x", F, [2, 1, 3, 1]), "axes"], [("y", F, [2, 3])],
        initializers=[_i64("axes", [1, 3])]))
    check_against_onnxruntime(single_node_model(
        "Unsqueeze", [("x", F, [2, 3]), "axes"], [("y", F, [1, 2, 3, 1])],
        initializers=[_i64("axes", [0, -1])]))
    check_against_onnxruntime(single_node_model("Transpose", [("x", F, [2, 3, 4])],
                                                [("y", F, [4, 2, 3])], perm=[2, 0, 1]))
    check_against_onnxruntime(single_node_model("Transpose", [("x", F, [2, 3, 4])],
                                                [("y", F, [4, 3, 2])]))


def test_concat_and_split():
    check_against_onnxruntime(single_node_model(
        "Concat", [("a", F, [2, 3]), ("b", F, [2, 1]), ("c", F, [2, 4])], [("y", F, [2, 8])],
        axis=1))
    check_against_onnxruntime(single_node_model(
        "Concat", [("a", F, [1, 3]), ("b", F, [2, 3])], [("y", F, [3, 3])], axis=-2))
    check_against_onnxruntime(single_node_model(
        "Split", [("x", F, [2, 7]), "sizes"], [("a", F, [2, 2]), ("b", F, [2, 5])],
        axis=1, initializers=[_i64("sizes", [2, 5])]))
    check_against_onnxruntime(single_node_model(
        "Split", [("x", F, [6, 2])], [("a", F, [3, 2]), ("b", F, [3, 2])], opset=11, axis=0))
    check_against_onnxruntime(single_node_model(
        "Split", [("x", F, [7, 2])], [("a", F, [3, 2]), ("b", F, [3, 2]), ("c", F, [1, 2])],
        opset=18, axis=0, num_outputs=3))


def test_concat_is_one_select():
    model = single_node_model("Concat", [("a", F, [2, 3]), ("b", F, [2, 1])],
                              [("y", F, [2, 4])], axis=1)
    op = import_model(model).module.ops[0]
    assert op.expr == "y[i, j] = select(j < 3, a[i, j], b[i, j - 3])"
    assert op.pad == "0"


@pytest.mark.parametrize("starts,ends,axes,steps,out", [
    ([1], [3], [0], [1], [2, 5]),
    ([0, 1], [4, 5], [0, 1], [2, 2], [2, 2]),
    ([-1], [-6], [1], [-1], [4, 5]),
    ([3], [0], [0], [-2], [2, 5]),
    ([1], [1000], [-1], [1], [4, 4]),
])
def test_slice(starts, ends, axes, steps, out):
    inits = [_i64("starts", starts), _i64("ends", ends), _i64("axes", axes),
             _i64("steps", steps)]
    check_against_onnxruntime(single_node_model(
        "Slice", [("x", F, [4, 5]), "starts", "ends", "axes", "steps"], [("y", F, out)],
        initializers=inits))


@pytest.mark.parametrize("mode,value", [("constant", 0.0), ("constant", 1.5),
                                        ("edge", None), ("reflect", None), ("wrap", None)])
def test_pad(mode, value):
    pads = [0, 1, 2, 0, 2, 1]
    inits = [_i64("pads", pads)]
    inputs = [("x", F, [2, 4, 5]), "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), "value"))
        inputs.append("value")
    opset = 19 if mode == "wrap" else 13
    check_against_onnxruntime(single_node_model("Pad", inputs, [("y", F, [2, 7, 8])],
                                                initializers=inits, mode=mode, opset=opset))


def test_pad_crop_and_legacy_attributes():
    check_against_onnxruntime(single_node_model(
        "Pad", [("x", F, [3, 6]), "pads"], [("y", F, [4, 4])],
        initializers=[_i64("pads", [1, -1, 0, -1])]))
    check_against_onnxruntime(single_node_model(
        "Pad", [("x", F, [3, 4])], [("y", F, [5, 5])], opset=2, pads=[1, 0, 1, 1], value=2.0))


def test_expand_tile_depth_space():
    check_against_onnxruntime(single_node_model(
        "Expand", [("x", F, [3, 1]), "shape"], [("y", F, [2, 3, 4])],
        initializers=[_i64("shape", [2, 1, 4])]))
    check_against_onnxruntime(single_node_model(
        "Tile", [("x", F, [2, 3]), "reps"], [("y", F, [4, 9])],
        initializers=[_i64("reps", [2, 3])]))
    for mode in ("DCR", "CRD"):
        check_against_onnxruntime(single_node_model(
            "DepthToSpace", [("x", F, [1, 8, 2, 3])], [("y", F, [1, 2, 4, 6])], blocksize=2,
            mode=mode))
    check_against_onnxruntime(single_node_model(
        "SpaceToDepth", [("x", F, [1, 2, 4, 6])], [("y", F, [1, 8, 2, 3])], blocksize=2))


@pytest.mark.parametrize("indices,axis,out", [
    (2, 1, [3, 5]), ([0, 2, 4], 2, [3, 4, 3]), ([3, 1], 1, [3, 2, 5]),
    ([[0, 1], [1, 0]], 0, [2, 2, 4, 5]),
])
def test_gather_constant_indices(indices, axis, out):
    imported = check_against_onnxruntime(single_node_model(
        "Gather", [("x", F, [3, 4, 5]), "idx"], [("y", F, out)],
        initializers=[_i64("idx", indices)], axis=axis))
    arithmetic = np.ndim(indices) <= 1
    assert (imported.module.ops[0].kind == "expr") == arithmetic


def test_gather_runtime_indices_is_opaque():
    model = single_node_model("Gather", [("x", F, [10, 4]), ("idx", I64, [2, 3])],
                              [("y", F, [2, 3, 4])])
    idx = np.array([[0, 9, 3], [-1, 2, 2]], np.int64)
    imported = check_against_onnxruntime(model, {"x": np.arange(40, dtype=np.float32)
                                                 .reshape(10, 4), "idx": idx})
    op = imported.module.ops[0]
    assert op.kind == "opaque" and op.opaque["type"] == "Gather"


def test_trilu_onehot_eyelike():
    for upper in (0, 1):
        check_against_onnxruntime(single_node_model(
            "Trilu", [("x", F, [2, 4, 5]), "k"], [("y", F, [2, 4, 5])], upper=upper,
            initializers=[_i64("k", 1)]))
    check_against_onnxruntime(single_node_model(
        "OneHot", [("idx", I64, [3]), "depth", "values"], [("y", F, [3, 5])],
        initializers=[_i64("depth", 5),
                      numpy_helper.from_array(np.array([0.5, 2.0], np.float32), "values")]),
        {"idx": np.array([0, 4, -1], np.int64)})
    check_against_onnxruntime(single_node_model("EyeLike", [("x", F, [3, 4])],
                                                [("y", F, [3, 4])], k=1))


@pytest.mark.parametrize("mode,coord,nearest,scales", [
    ("nearest", "asymmetric", "floor", [1, 1, 2, 3]),
    ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 2, 2]),
    ("linear", "half_pixel", "round_prefer_floor", [1, 1, 2, 2]),
    ("nearest", "align_corners", "round_prefer_ceil", [1, 1, 1.5, 2]),
    ("cubic", "pytorch_half_pixel", "floor", [1, 1, 0.5, 2]),
])
def test_resize(mode, coord, nearest, scales):
    inits = [numpy_helper.from_array(np.asarray(scales, np.float32), "scales")]
    out = [int(np.floor(n * s)) for n, s in zip([1, 2, 4, 4], scales)]
    imported = check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 2, 4, 4]), "", "scales"], [("y", F, out)], initializers=inits,
        mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest))
    # Nearest by integer factors is an index map; everything else one contraction with an
    # interpolation matrix per resized axis: no opaque op either way.
    affine = mode == "nearest" and all(float(s).is_integer() for s in scales) and \
        coord in ("asymmetric", "half_pixel")
    assert all(op.kind == "expr" for op in imported.module.ops)
    assert len(imported.module.ops) == (1 if affine else sum(s != 1 for s in scales))


@pytest.mark.parametrize("mode,coord,extra", [
    ("linear", "align_corners", {}),
    ("cubic", "half_pixel", {"exclude_outside": 1, "cubic_coeff_a": -0.5}),
    ("linear", "pytorch_half_pixel", {}),
    ("nearest", "asymmetric", {"nearest_mode": "ceil"}),
])
def test_resize_to_sizes_by_interpolation_matrices(mode, coord, extra):
    """Output sizes instead of scales (what the exporters write for F.interpolate(size=)),
    down- and up-sampling on two axes: the chain of contractions against onnxruntime."""
    inits = [numpy_helper.from_array(np.asarray([2, 3, 3, 7], np.int64), "sizes")]
    imported = check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [2, 3, 5, 4]), "", "", "sizes"], [("y", F, [2, 3, 3, 7])],
        initializers=inits, mode=mode, coordinate_transformation_mode=coord, **extra))
    assert [op.kind for op in imported.module.ops] == ["expr", "expr"]


@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                     "ceil"])
@pytest.mark.parametrize("scales,sizes", [([1, 1, 2, 2], None), ([1, 1, 1.5, 0.5], None),
                                          (None, [1, 2, 7, 3])])
def test_resize_tf_half_pixel_for_nn(nearest, scales, sizes):
    """Opset 11's `tf_half_pixel_for_nn` (TensorFlow's half-pixel nearest neighbour; the ONNX
    reference no longer knows it): its selection matrices against onnxruntime."""
    if sizes is None:
        inits = [numpy_helper.from_array(np.asarray(scales, np.float32), "scales")]
        out = [int(np.floor(n * s)) for n, s in zip([1, 2, 4, 5], scales)]
        inputs = [("x", F, [1, 2, 4, 5]), "roi", "scales"]
    else:
        inits = [numpy_helper.from_array(np.asarray([], np.float32), "scales"),
                 _i64("sizes", sizes)]
        out, inputs = sizes, [("x", F, [1, 2, 4, 5]), "roi", "scales", "sizes"]
    inits.append(numpy_helper.from_array(np.asarray([], np.float32), "roi"))
    model = single_node_model("Resize", inputs, [("y", F, out)], initializers=inits,
                              opset=11, mode="nearest",
                              coordinate_transformation_mode="tf_half_pixel_for_nn",
                              nearest_mode=nearest)
    imported = check_against_onnxruntime(model)
    assert all(op.kind == "expr" for op in imported.module.ops)


def test_resize_tf_crop_and_resize_is_refused_by_name():
    from tilekit.errors import UnsupportedError

    inits = [numpy_helper.from_array(np.asarray([0, 0, 0, 0, 1, 1, 1, 1], np.float32), "roi"),
             numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "scales")]
    model = single_node_model("Resize", [("x", F, [1, 2, 4, 4]), "roi", "scales"],
                              [("y", F, [1, 2, 8, 8])], initializers=inits, mode="linear",
                              coordinate_transformation_mode="tf_crop_and_resize")
    with pytest.raises(UnsupportedError, match="'tf_crop_and_resize' is not supported"):
        import_model(model)


def test_resize_to_the_same_size_is_a_copy():
    inits = [numpy_helper.from_array(np.asarray([1, 2, 4, 4], np.int64), "sizes")]
    imported = check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 2, 4, 4]), "", "", "sizes"], [("y", F, [1, 2, 4, 4])],
        initializers=inits, mode="linear"))
    assert len(imported.module.ops) == 1 and "+=" not in imported.module.ops[0].expr


def test_resize_over_the_matrix_limit_stays_opaque(monkeypatch):
    from tilekit.onnx.converters import opaque

    monkeypatch.setattr(opaque, "_MAX_MATRIX", 8)
    inits = [numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "scales")]
    imported = check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 2, 4, 4]), "", "scales"], [("y", F, [1, 2, 8, 8])],
        initializers=inits, mode="linear"))
    assert [op.kind for op in imported.module.ops] == ["opaque"]


def _exported_flatten(batch) -> "onnx.ModelProto":
    """PyTorch's export of x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat ->
    Reshape, with a possibly symbolic batch dimension."""
    from onnx import helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
            np.asarray(0, np.int64))),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(
            np.asarray([0], np.int64))),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Constant", [], ["minus1"], value=numpy_helper.from_array(
            np.asarray([-1], np.int64))),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "flatten",
                              [helper.make_tensor_value_info("x", F, [batch, 3, 4])],
                              [helper.make_tensor_value_info("y", F, [batch, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_shape_arithmetic_is_folded():
    imported = check_against_onnxruntime(_exported_flatten(2))
    assert [op.origin for op in imported.module.ops] == ["Reshape_7", "Relu_8"]
    assert not imported.weights


def test_symbolic_batch_with_shape_override():
    from tilekit.errors import TilekitError

    model = _exported_flatten("N")
    symbolic = import_model(model).module       # the batch kept as a symbol
    assert symbolic.tensors["y"].shape == ("N", 12) and set(symbolic.dims) == {"N"}
    m = import_model(model, shapes={"x": [5, 3, 4]}).module
    assert m.tensors["y"].shape == (5, 12)
    with pytest.raises(TilekitError, match="--shape gives 2 dimensions for 'x'"):
        import_model(model, shapes={"x": [5, 3]})


@pytest.mark.parametrize("op,opset", [("Resize", 10), ("Upsample", 9)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_legacy_resize_and_upsample(op, opset, mode):
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "scales")]
    imported = check_against_onnxruntime(single_node_model(
        op, [("x", F, [1, 2, 3, 3]), "scales"], [("y", F, [1, 2, 6, 9])], initializers=inits,
        opset=opset, mode=mode))
    assert [op.kind for op in imported.module.ops] == ["expr"] * (1 if mode == "nearest" else 2)


def test_concat_of_many_inputs():
    inputs = [(f"x{k}", F, [2, 1 + k % 3]) for k in range(48)]
    width = sum(1 + k % 3 for k in range(48))
    check_against_onnxruntime(single_node_model("Concat", inputs, [("y", F, [2, width])],
                                                axis=1))
