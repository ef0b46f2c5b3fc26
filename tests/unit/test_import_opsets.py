"""The ONNX operator changes of opsets 13 to 21 that change what a converter reads, one test
each, against onnxruntime (docs/import.md, "Opset changes" lists them with their status).

Each model is what an exporter of that opset writes: attributes that became inputs, new
attributes written explicitly with their default values, new modes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit.errors import TilekitError, UnsupportedError  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _f32(name, values):
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def _positive(shape):
    return {"x": RNG.uniform(0.5, 1.5, shape).astype(np.float32)}


# -- reductions: axes became an input (ReduceSum 13, the others 18), noop_with_empty_axes

@pytest.mark.parametrize("op", REDUCE)
def test_reduce_18_axes_input_with_noop_written_out(op):
    """RMSNorm as the dynamo exporter writes it: ReduceMean(x, axes=[-1]) with
    noop_with_empty_axes=0 given explicitly (it was refused as an unknown attribute)."""
    opset = 13 if op == "ReduceSum" else 18
    model = single_node_model(op, [("x", F, [2, 3, 4]), "axes"], [("y", F, [2, 3, 1])],
                              opset=opset, initializers=[_i64("axes", [-1])], keepdims=1,
                              noop_with_empty_axes=0)
    check_against_onnxruntime(model, _positive([2, 3, 4]))


@pytest.mark.parametrize("noop,out", [(0, [1, 1]), (1, [2, 3])])
def test_reduce_18_empty_axes_input(noop, out):
    """An empty axes tensor reduces everything, or nothing under noop_with_empty_axes=1."""
    model = single_node_model("ReduceMean", [("x", F, [2, 3]), "axes"], [("y", F, out)],
                              opset=18, initializers=[_i64("axes", [])], keepdims=1,
                              noop_with_empty_axes=noop)
    check_against_onnxruntime(model)


def test_reduce_noop_before_opset_18_is_refused():
    """noop_with_empty_axes does not exist for ReduceMean before 18: refused, not ignored."""
    model = single_node_model("ReduceMean", [("x", F, [2, 3])], [("y", F, [2, 1])], opset=17,
                              axes=[1], noop_with_empty_axes=0)
    with pytest.raises(UnsupportedError, match="noop_with_empty_axes"):
        import_model(model)


def test_reduce_18_axes_computed_at_run_time_is_refused_clearly():
    model = single_node_model("ReduceSum", [("x", F, [2, 3]), ("axes", I64, [1])],
                              [("y", F, None)], opset=18)
    with pytest.raises(TilekitError, match="dynamic.*value of graph input 'axes'"):
        import_model(model)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_20_boolean_input(op):
    """Opset 20 lets ReduceMax/Min read bool (any / all)."""
    model = single_node_model(op, [("x", TensorProto.BOOL, [3, 4]), "axes"],
                              [("y", TensorProto.BOOL, [3])], opset=20,
                              initializers=[_i64("axes", [1])], keepdims=0)
    check_against_onnxruntime(model, {"x": RNG.random((3, 4)) > 0.3})


# -- Split: sizes as an input (13), num_outputs (18) ---------------------------------------

def test_split_13_sizes_input_and_equal_parts():
    check_against_onnxruntime(single_node_model(
        "Split", [("x", F, [2, 6]), "sizes"], [("a", F, [2, 1]), ("b", F, [2, 5])],
        axis=-1, opset=13, initializers=[_i64("sizes", [1, 5])]))
    check_against_onnxruntime(single_node_model(
        "Split", [("x", F, [2, 6])], [("a", F, [2, 2]), ("b", F, [2, 2]), ("c", F, [2, 2])],
        axis=1, opset=13))


def test_split_18_num_outputs_uneven():
    """num_outputs=3 over 8: ceil(8/3)=3, 3, and the rest (2)."""
    check_against_onnxruntime(single_node_model(
        "Split", [("x", F, [8, 2])], [("a", F, [3, 2]), ("b", F, [3, 2]), ("c", F, [2, 2])],
        axis=0, opset=18, num_outputs=3))


# -- Squeeze / Unsqueeze: axes as an input (13), new types (21) ---------------------------

def test_squeeze_13_without_axes_and_unsqueeze_21():
    check_against_onnxruntime(single_node_model(
        "Squeeze", [("x", F, [1, 3, 1, 2])], [("y", F, [3, 2])], opset=13))
    check_against_onnxruntime(single_node_model(
        "Unsqueeze", [("x", F, [3, 2]), "axes"], [("y", F, [3, 1, 2])], opset=21,
        initializers=[_i64("axes", [-2])]))


# -- Pad: axes input (18), wrap mode (19) --------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_18_axes_input(mode):
    """Pads for a subset of the axes (a negative one among them); the others unpadded."""
    inits = [_i64("pads", [1, 2, 0, 1]), _f32("v", 0.5), _i64("axes", [-1, 1])]
    check_against_onnxruntime(single_node_model(
        "Pad", [("x", F, [2, 3, 4]), "pads", "v", "axes"], [("y", F, [2, 6, 5])],
        opset=18, initializers=inits, mode=mode))


def test_pad_19_wrap_and_21():
    inits = [_i64("pads", [0, 2, 0, 3])]
    check_against_onnxruntime(single_node_model(
        "Pad", [("x", F, [2, 3]), "pads"], [("y", F, [2, 8])], opset=19,
        initializers=inits, mode="wrap"))
    check_against_onnxruntime(single_node_model(
        "Pad", [("x", F, [2, 3]), "pads"], [("y", F, [2, 8])], opset=21,
        initializers=inits))


# -- Resize: optional roi (13), axes and keep_aspect_ratio_policy (18), half_pixel_symmetric
# (19) -------------------------------------------------------------------------------------

def test_resize_13_without_roi():
    check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 2, 3, 4]), "", "scales"], [("y", F, [1, 2, 6, 8])], opset=13,
        initializers=[_f32("scales", [1, 1, 2, 2])], mode="linear"))


def test_resize_18_axes_and_antialias_zero():
    check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 2, 3, 4]), "", "scales"], [("y", F, [1, 2, 6, 6])], opset=18,
        initializers=[_f32("scales", [2.0, 1.5])], axes=[2, 3], mode="linear", antialias=0))
    check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 2, 3, 4]), "", "", "sizes"], [("y", F, [1, 2, 5, 4])],
        opset=18, initializers=[_i64("sizes", [5])], axes=[-2], mode="nearest"))


@pytest.mark.parametrize("policy,out", [("not_larger", [1, 1, 4, 6]),
                                        ("not_smaller", [1, 1, 6, 9])])
def test_resize_18_keep_aspect_ratio_policy(policy, out):
    check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 1, 4, 6]), "", "", "sizes"], [("y", F, out)], opset=18,
        initializers=[_i64("sizes", [6, 6])], axes=[2, 3], mode="linear",
        keep_aspect_ratio_policy=policy))


def test_resize_18_antialias_is_refused():
    model = single_node_model(
        "Resize", [("x", F, [1, 1, 4, 4]), "", "scales"], [("y", F, [1, 1, 2, 2])], opset=18,
        initializers=[_f32("scales", [1, 1, 0.5, 0.5])], mode="linear", antialias=1)
    with pytest.raises(UnsupportedError, match="antialias"):
        import_model(model)


def test_resize_19_half_pixel_symmetric():
    check_against_onnxruntime(single_node_model(
        "Resize", [("x", F, [1, 1, 3, 5]), "", "scales"], [("y", F, [1, 1, 6, 7])], opset=19,
        initializers=[_f32("scales", [1, 1, 2.0, 1.5])], mode="linear",
        coordinate_transformation_mode="half_pixel_symmetric"))


# -- pooling: dilations for AveragePool (19), ceil_mode and dilations for LpPool (18) ------

def test_average_pool_19_dilations_and_lp_pool_18():
    model = single_node_model("AveragePool", [("x", F, [1, 2, 7, 7])], [("y", F, None)],
                              opset=19, kernel_shape=[2, 2], dilations=[2, 2], strides=[1, 1])
    check_against_onnxruntime(onnx.shape_inference.infer_shapes(model))
    model = single_node_model("LpPool", [("x", F, [1, 2, 7, 7])], [("y", F, None)], opset=18,
                              kernel_shape=[2, 2], dilations=[2, 1], strides=[2, 2], p=2,
                              ceil_mode=0)
    check_against_onnxruntime(onnx.shape_inference.infer_shapes(model))


# -- casts: saturate (19) -------------------------------------------------------------------

def test_cast_and_castlike_19_saturate_written_out():
    check_against_onnxruntime(single_node_model(
        "Cast", [("x", F, [2, 3])], [("y", TensorProto.INT32, [2, 3])], opset=19,
        to=TensorProto.INT32, saturate=1))
    check_against_onnxruntime(single_node_model(
        "CastLike", [("x", F, [2, 3]), ("t", TensorProto.DOUBLE, [1])],
        [("y", TensorProto.DOUBLE, [2, 3])], opset=19, saturate=1))


# -- quantisation: saturate (19), output_dtype and block_size (21) ---------------------------

def test_quantize_21_output_dtype_and_zero_block_size():
    inits = [_f32("s", 0.05), numpy_helper.from_array(np.int8(3), "z")]
    check_against_onnxruntime(single_node_model(
        "QuantizeLinear", [("x", F, [2, 3]), "s", "z"], [("y", TensorProto.INT8, [2, 3])],
        opset=21, initializers=inits, output_dtype=TensorProto.INT8, block_size=0,
        saturate=1), atol=1)
    check_against_onnxruntime(single_node_model(
        "DequantizeLinear", [("q", TensorProto.INT8, [2, 3]), "s", "z"], [("y", F, [2, 3])],
        opset=21, initializers=inits, block_size=0))


def test_quantize_21_blocked_is_refused():
    inits = [_f32("s", np.full((2, 2), 0.05)), numpy_helper.from_array(
        np.zeros((2, 2), np.int8), "z")]
    model = single_node_model("DequantizeLinear", [("q", TensorProto.INT8, [2, 4]), "s", "z"],
                              [("y", F, [2, 4])], opset=21, initializers=inits, axis=1,
                              block_size=2)
    with pytest.raises(UnsupportedError, match="block"):
        import_model(model)


# -- normalisation: GroupNormalization's scale per group (18) or per channel (21) ----------

@pytest.mark.parametrize("opset,params", [(18, 3), (21, 6)])
def test_group_normalization_18_and_21(opset, params):
    """Opset 18 gives scale and bias per group, 21 per channel (and stash_type)."""
    inits = [_f32("gs", np.linspace(0.5, 1.5, params)), _f32("gb", np.linspace(-0.2, 0.2,
                                                                               params))]
    extra = {"stash_type": 1} if opset >= 21 else {}
    model = single_node_model("GroupNormalization", [("x", F, [2, 6, 3, 3]), "gs", "gb"],
                              [("y", F, [2, 6, 3, 3])], initializers=inits, num_groups=3,
                              opset=opset, **extra)
    if opset == 21:
        check_against_onnxruntime(model)
        return
    # The opset-18 form is deprecated: onnx's checker and onnxruntime refuse it, the ONNX
    # reference implementation still runs it.
    from models.onnx_check import reference_outputs, run_imported

    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    (got,) = run_imported(import_model(model), {"x": x})
    (want,) = reference_outputs(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_batch_normalization_15_training_mode_zero():
    inits = [_f32(n, v) for n, v in (("s", [1.0, 0.5]), ("b", [0.1, -0.1]), ("m", [0.0, 0.2]),
                                     ("v", [1.0, 0.7]))]
    check_against_onnxruntime(single_node_model(
        "BatchNormalization", [("x", F, [2, 2, 3]), "s", "b", "m", "v"], [("y", F, [2, 2, 3])],
        opset=15, initializers=inits, training_mode=0))


# -- Reshape allowzero (14), Shape start/end (15) -----------------------------------------

def test_reshape_14_allowzero_and_shape_15_slice():
    check_against_onnxruntime(single_node_model(
        "Reshape", [("x", F, [2, 3, 4]), "shape"], [("y", F, [6, 4])], opset=14,
        initializers=[_i64("shape", [6, 4])], allowzero=1))
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),
             helper.make_node("Reshape", ["y0", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3, 4, 5]),
                                           helper.make_tensor_value_info("y0", F, [12])],
                              [helper.make_tensor_value_info("y", F, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    check_against_onnxruntime(model)


# -- ops new in 13..21 that exporters write ------------------------------------------------

def test_range_folds_and_converts():
    """Range (11): constant inputs fold; a start computed at run time with a static length
    is the statement `start + i*delta`."""
    check_against_onnxruntime(single_node_model(
        "Range", ["a", "b", "c"], [("y", F, [4])], opset=17,
        initializers=[_f32("a", 1.0), _f32("b", 3.0), _f32("c", 0.5)]))
    nodes = [helper.make_node("ReduceMax", ["x"], ["start"], keepdims=0),
             helper.make_node("Add", ["start", "len"], ["stop"]),
             helper.make_node("Range", ["start", "stop", "one"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", I64, [3])],
                              [helper.make_tensor_value_info("y", I64, [5])],
                              [_i64("len", 5), _i64("one", 1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    imported = check_against_onnxruntime(model)
    assert imported.module.ops[-1].expr.endswith("= start[] + i * 1")


def test_range_of_a_runtime_length_names_the_input():
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("n", I64, [])],
                              [helper.make_tensor_value_info("y", I64, ["N"])],
                              [_i64("zero", 0), _i64("one", 1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(TilekitError, match="dynamic.*--value n="):
        import_model(model)
    imported = import_model(model, values={"n": [4]})
    assert imported.module.inputs == () and imported.module.tensors["y"].shape == (4,)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_20_and_mish_18(approximate):
    check_against_onnxruntime(single_node_model("Gelu", [("x", F, [2, 5])], [("y", F, [2, 5])],
                                                opset=20, approximate=approximate))
    check_against_onnxruntime(single_node_model("Mish", [("x", F, [2, 5])], [("y", F, [2, 5])],
                                                opset=18))


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_reductions_16_and_18(reduction):
    opset = 18 if reduction in ("max", "min") else 16
    inits = [_i64("i", [[1, 0, 1]]), _f32("u", [[2.0, -1.0, 3.0]])]
    check_against_onnxruntime(single_node_model(
        "ScatterElements", [("x", F, [2, 3]), "i", "u"], [("y", F, [2, 3])], opset=opset,
        initializers=inits, axis=0, reduction=reduction))
    inits = [_i64("i", [[1], [1]]), _f32("u", [[1.0, 2.0, 3.0], [0.5, -2.0, 4.0]])]
    check_against_onnxruntime(single_node_model(
        "ScatterND", [("x", F, [2, 3]), "i", "u"], [("y", F, [2, 3])], opset=opset,
        initializers=inits, reduction=reduction))


@pytest.mark.parametrize("shape,axes,out", [([3, 6], None, [3, 6]), ([2, 7], None, [2, 7]),
                                            ([8], [-1], [4, 8]), ([1], [0], [1, 5])])
def test_center_crop_pad_18(shape, axes, out):
    """CenterCropPad (new in 18): crop or zero-pad each axis around its centre."""
    extra = {"axes": axes} if axes is not None else {}
    check_against_onnxruntime(single_node_model(
        "CenterCropPad", [("x", F, [4, 5]), "shape"], [("y", F, out)], opset=18,
        initializers=[_i64("shape", shape)], **extra))
