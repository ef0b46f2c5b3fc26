"""Ops of opsets 23 and 24 that the torch.export exporter writes at those opsets
(`Attention` for scaled_dot_product_attention, `RMSNormalization` for RMSNorm, `Swish`), and
the inverse trigonometric functions: each against onnxruntime (or the ONNX reference where
onnxruntime lacks the op), plus the refusals that name what is not supported."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit.errors import UnsupportedError  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402

F = TensorProto.FLOAT
B = TensorProto.BOOL


@pytest.mark.parametrize("op", ["Asin", "Acos", "Atan"])
def test_inverse_trigonometry(op):
    model = single_node_model(op, [("x", F, [3, 4])], [("y", F, [3, 4])])
    feeds = {"x": np.linspace(-0.95, 0.95, 12, dtype=np.float32).reshape(3, 4)}
    check_against_onnxruntime(model, feeds)


def test_swish():
    model = single_node_model("Swish", [("x", F, [2, 5])], [("y", F, [2, 5])], opset=24,
                              alpha=0.75)
    check_against_onnxruntime(model, reference="onnx")


@pytest.mark.parametrize("shape,axis", [([2, 3, 8], -1), ([2, 3, 4, 5], 2)])
def test_rms_normalization(shape, axis):
    scale = np.random.default_rng(0).standard_normal(shape[axis:]).astype(np.float32)
    model = single_node_model("RMSNormalization", [("x", F, shape), "s"], [("y", F, shape)],
                              opset=23, initializers=[numpy_helper.from_array(scale, "s")],
                              axis=axis, epsilon=1e-3)
    check_against_onnxruntime(model)


def _attention(q, k, v, *, mask=None, past=None, outputs=1, opset=23, **attrs):
    """One Attention node; q, k, v, mask and past (key, value) as shapes (mask: (dtype,
    shape)); outputs Y (and present_key, present_value)."""
    inputs = [("q", F, q), ("k", F, k), ("v", F, v)]
    if mask is not None:
        inputs.append(("mask", mask[0], mask[1]))
    elif past is not None:
        inputs.append("")
    if past is not None:
        inputs += [("pk", F, past[0]), ("pv", F, past[1])]
    outs = [("y", F, None), ("present_key", F, None), ("present_value", F, None)][:outputs]
    model = single_node_model("Attention", inputs, outs, opset=opset, **attrs)
    return onnx.shape_inference.infer_shapes(model)


ATTENTION_CASES = [
    # 4-D multi-head, causal
    dict(q=[2, 2, 5, 4], k=[2, 2, 5, 4], v=[2, 2, 5, 4], is_causal=1),
    # 4-D grouped-query (4 query heads over 2), explicit scale, float mask broadcast
    dict(q=[1, 4, 3, 8], k=[1, 2, 6, 8], v=[1, 2, 6, 4], scale=0.3,
         mask=(F, [3, 6])),
    # 3-D with head counts, cross attention, boolean mask per batch and head
    dict(q=[2, 3, 8], k=[2, 5, 8], v=[2, 5, 12], q_num_heads=2, kv_num_heads=2,
         mask=(B, [2, 2, 3, 5])),
    # 3-D multi-query with softcap and causal
    dict(q=[1, 4, 12], k=[1, 4, 3], v=[1, 4, 3], q_num_heads=4, kv_num_heads=1,
         softcap=2.0, is_causal=1),
    # a key/value cache: present outputs, causal frontier offset by the past length
    dict(q=[1, 2, 2, 4], k=[1, 2, 2, 4], v=[1, 2, 2, 4], past=([1, 2, 3, 4], [1, 2, 3, 4]),
         outputs=3, is_causal=1),
]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=range(len(ATTENTION_CASES)))
def test_attention(case):
    model = _attention(**case)
    feeds = None
    if "mask" in case and case["mask"][0] == B:
        rng = np.random.default_rng(1)
        feeds = {n: rng.standard_normal(case[n]).astype(np.float32) for n in "qkv"}
        mask = rng.random(case["mask"][1]) > 0.3
        mask[..., 0] = True  # every query sees a key (a fully masked row is NaN here)
        feeds["mask"] = mask
    check_against_onnxruntime(model, feeds)


@pytest.mark.parametrize("attrs,words", [
    (dict(outputs=1, q=[1, 2, 3, 4], k=[1, 2, 3, 4], v=[1, 2, 3, 4], softcap=0.0,
          qk_output=True), "qk_matmul_output"),
    (dict(q=[1, 3, 3, 4], k=[1, 2, 3, 4], v=[1, 2, 3, 4]), "query heads"),
    (dict(q=[1, 3, 8], k=[1, 3, 8], v=[1, 3, 8], q_num_heads=3, kv_num_heads=2), "q_num_heads"),
    (dict(q=[1, 2, 3, 4], k=[1, 2, 3, 4], v=[1, 2, 3, 4], mask=(F, [3, 2])), "attn_mask"),
])
def test_attention_refusals(attrs, words):
    qk_output = attrs.pop("qk_output", False)
    model = _attention(**attrs)
    if qk_output:
        node = model.graph.node[0]
        node.output.extend(["", "", "qk"])
        model.graph.output.append(helper.make_tensor_value_info("qk", F, [1, 2, 3, 3]))
    with pytest.raises(UnsupportedError) as info:
        import_model(model, name="t")
    assert words in str(info.value)
