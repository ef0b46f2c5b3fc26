"""Convolution, pooling and normalisation converters against onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit.onnx import import_model  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _w(name, shape, scale=0.5):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _conv_out(size, k, s, d, pb, pe):
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


CONV_CASES = [
    # (spatial input, channels in, out, kernel, attrs)
    ([9], 3, 4, [3], {}),
    ([9], 4, 6, [3], {"strides": [2], "pads": [1, 2], "dilations": [2], "group": 2}),
    ([7, 6], 3, 5, [3, 2], {}),
    ([8, 8], 4, 4, [3, 3], {"group": 4, "pads": [1, 1, 1, 1]}),            # depthwise
    ([8, 8], 4, 8, [3, 3], {"group": 4, "strides": [2, 2], "pads": [1, 0, 1, 0]}),
    ([9, 9], 6, 4, [3, 3], {"group": 2, "dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    ([7, 7], 2, 3, [3, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ([7, 7], 2, 3, [4, 4], {"auto_pad": "SAME_LOWER"}),
    ([7, 7], 2, 3, [3, 3], {"auto_pad": "VALID", "strides": [2, 2]}),
    ([5, 6, 4], 2, 3, [3, 3, 2], {"strides": [1, 2, 1], "pads": [1, 1, 0, 1, 1, 1]}),
]


@pytest.mark.parametrize("spatial,cin,cout,kernel,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv(spatial, cin, cout, kernel, attrs, bias):
    group = attrs.get("group", 1)
    inits = [_w("w", [cout, cin // group] + kernel)] + ([_w("b", [cout])] if bias else [])
    x = ("x", F, [2, cin] + spatial)
    model = single_node_model("Conv", [x, "w"] + (["b"] if bias else []), [("y", F, None)],
                              initializers=inits, **attrs)
    model = onnx.shape_inference.infer_shapes(model)
    check_against_onnxruntime(model)


@pytest.mark.parametrize("attrs,spatial,kernel,group", [
    ({}, [5, 5], [3, 3], 1),
    ({"strides": [2, 2]}, [4, 5], [3, 3], 1),
    ({"strides": [2, 3], "pads": [1, 0, 1, 1], "output_padding": [1, 0]}, [4, 4], [3, 4], 1),
    ({"strides": [2, 2], "group": 2}, [3, 3], [2, 2], 2),
    ({"dilations": [2, 2], "pads": [1, 1, 1, 1]}, [4, 4], [3, 3], 1),
    ({"strides": [2, 2], "dilations": [2, 2]}, [3, 3], [3, 3], 1),   # opaque fallback
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, [3, 3], [3, 3], 1),
    ({"strides": [2, 2], "output_shape": [8, 8]}, [3, 3], [3, 3], 1),
    ({"strides": [3]}, [5], [4], 1),
])
def test_conv_transpose(attrs, spatial, kernel, group):
    cin, fg = 4, 3
    inits = [_w("w", [cin, fg] + kernel), _w("b", [fg * group])]
    model = single_node_model("ConvTranspose", [("x", F, [1, cin] + spatial), "w", "b"],
                              [("y", F, None)], initializers=inits, **attrs)
    model = onnx.shape_inference.infer_shapes(model)
    imported = check_against_onnxruntime(model)
    kinds = {op.kind for op in imported.module.ops}
    assert kinds == ({"opaque"} if "dilations" in attrs and "strides" in attrs else {"expr"})


POOL_CASES = [
    ([9], {"kernel_shape": [3]}),
    ([9, 8], {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ([9, 8], {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ([8, 8], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
              "ceil_mode": 1}),
    ([7, 7], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ([7, 7], {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ([5, 6, 4], {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 1, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize("spatial,attrs", POOL_CASES)
@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool", "AveragePool-include-pad"])
def test_pool(spatial, attrs, kind):
    op = kind.split("-")[0]
    extra = {"count_include_pad": 1} if kind.endswith("pad") else {}
    model = single_node_model(op, [("x", F, [2, 3] + spatial)], [("y", F, None)], opset=17,
                              **attrs, **extra)
    model = onnx.shape_inference.infer_shapes(model)
    check_against_onnxruntime(model)


@pytest.mark.parametrize("op,extra", [("MaxPool", {}), ("AveragePool", {}),
                                      ("AveragePool", {"count_include_pad": 1})])
def test_pool_dilations(op, extra):
    model = single_node_model(op, [("x", F, [1, 2, 9, 9])], [("y", F, None)], opset=19,
                              kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 1, 2, 1],
                              strides=[2, 1], **extra)
    model = onnx.shape_inference.infer_shapes(model)
    check_against_onnxruntime(model)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op):
    check_against_onnxruntime(single_node_model(op, [("x", F, [2, 3, 5, 4])],
                                                [("y", F, [2, 3, 1, 1])]))


def test_lp_pool():
    model = single_node_model("LpPool", [("x", F, [1, 2, 6, 6])], [("y", F, None)], p=2,
                              kernel_shape=[2, 2], strides=[2, 2])
    check_against_onnxruntime(onnx.shape_inference.infer_shapes(model))


def _bn_params(c, prefix="bn"):
    return [numpy_helper.from_array(v.astype(np.float32), f"{prefix}.{n}") for n, v in (
        ("scale", 1 + 0.2 * RNG.standard_normal(c)), ("bias", 0.2 * RNG.standard_normal(c)),
        ("mean", 0.2 * RNG.standard_normal(c)), ("var", RNG.uniform(0.5, 1.5, c)))]


@pytest.mark.parametrize("shape", [[2, 3], [2, 3, 5], [2, 3, 4, 4]])
def test_batch_normalization_alone(shape):
    names = ["bn.scale", "bn.bias", "bn.mean", "bn.var"]
    model = single_node_model("BatchNormalization", [("x", F, shape)] + names,
                              [("y", F, shape)], initializers=_bn_params(shape[1]),
                              epsilon=1e-3)
    imported = check_against_onnxruntime(model)
    assert len(imported.module.ops) == 1


def _conv_bn_model(conv_has_bias: bool, extra_consumer: bool) -> onnx.ModelProto:
    inits = [_w("conv.w", [4, 3, 3, 3])] + ([_w("conv.b", [4])] if conv_has_bias else [])
    inits += _bn_params(4)
    nodes = [helper.make_node("Conv", ["x", "conv.w"] + (["conv.b"] if conv_has_bias else []),
                              ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization",
                              ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", F, [1, 4, 6, 6])]
    if extra_consumer:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", F, [1, 4, 6, 6]))
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info(
        "x", F, [1, 3, 6, 6])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("conv_has_bias", [True, False])
def test_batchnorm_folded_into_conv(conv_has_bias):
    imported = check_against_onnxruntime(_conv_bn_model(conv_has_bias, False))
    ops = imported.module.ops
    # Conv and its bias add; nothing left of the BatchNorm.
    assert [op.origin for op in ops] == ["Conv_0", "Conv_0"]
    # The folded weight keeps the conv weight's name; the bias comes from the conv or the BN.
    assert "conv_w" in imported.weights
    assert ("conv_b" if conv_has_bias else "bn_bias") in imported.weights


def test_batchnorm_not_folded_when_conv_output_is_shared():
    imported = check_against_onnxruntime(_conv_bn_model(True, True))
    assert any(op.origin == "BatchNormalization_1" for op in imported.module.ops)


def test_instance_and_layer_and_group_normalization():
    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, 3).astype(np.float32), "s"),
             numpy_helper.from_array(np.linspace(-0.2, 0.2, 3).astype(np.float32), "b")]
    check_against_onnxruntime(single_node_model(
        "InstanceNormalization", [("x", F, [2, 3, 4, 5]), "s", "b"], [("y", F, [2, 3, 4, 5])],
        initializers=inits, epsilon=1e-4))
    ln = [numpy_helper.from_array(np.linspace(0.5, 1.5, 20).astype(np.float32)
                                  .reshape(4, 5), "g"),
          numpy_helper.from_array(np.linspace(-0.2, 0.2, 5).astype(np.float32), "beta")]
    check_against_onnxruntime(single_node_model(
        "LayerNormalization", [("x", F, [2, 3, 4, 5]), "g", "beta"],
        [("y", F, [2, 3, 4, 5]), ("mean", F, [2, 3, 1, 1]), ("rstd", F, [2, 3, 1, 1])],
        initializers=ln, axis=2))
    gn = [numpy_helper.from_array(np.linspace(0.5, 1.5, 6).astype(np.float32), "gs"),
          numpy_helper.from_array(np.linspace(-0.2, 0.2, 6).astype(np.float32), "gb")]
    check_against_onnxruntime(single_node_model(
        "GroupNormalization", [("x", F, [2, 6, 3, 3]), "gs", "gb"], [("y", F, [2, 6, 3, 3])],
        initializers=gn, num_groups=3, opset=21))


def test_lrn():
    check_against_onnxruntime(single_node_model("LRN", [("x", F, [1, 7, 4, 4])],
                                                [("y", F, [1, 7, 4, 4])], size=3, alpha=1e-3,
                                                beta=0.75, bias=2.0))
    check_against_onnxruntime(single_node_model("LRN", [("x", F, [1, 6, 3, 3])],
                                                [("y", F, [1, 6, 3, 3])], size=5))


def test_conv_expression_text_and_padding():
    inits = [_w("w", [8, 3, 7, 7]), _w("b", [8])]
    model = single_node_model("Conv", [("x", F, [1, 3, 16, 16]), "w", "b"],
                              [("y", F, [1, 8, 8, 8])], initializers=inits, strides=[2, 2],
                              pads=[3, 3, 3, 3])
    ops = import_model(model).module.ops
    assert ops[0].expr == "y_conv[n, f, h, w] += x[n, c, h*2 + kh - 3, w*2 + kw - 3] * w[f, c, kh, kw]"
    assert ops[0].pad == "0"
    assert ops[1].expr == "y[n, f, h, w] = y_conv[n, f, h, w] + b[f]"


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_ceil_mode_window_in_the_right_padding_is_refused(op):
    """onnx's shape inference counts a last window that starts in the right padding, the
    operator's definition and onnxruntime drop it: refused with both counts, not computed over
    padding alone (-inf for MaxPool, 0 / 0 for AveragePool)."""
    from tilekit.errors import UnsupportedError

    model = single_node_model(op, [("x", F, [1, 2, 5, 4])], [("y", F, None)], opset=17,
                              kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1],
                              ceil_mode=1)
    model = onnx.shape_inference.infer_shapes(model)
    with pytest.raises(UnsupportedError, match="gives 3 outputs.* 2; set ceil_mode=0"):
        import_model(model)
