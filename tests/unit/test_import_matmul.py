"""MatMul, Gemm and Einsum against onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

from tilekit.onnx import import_model  # noqa: E402

F = TensorProto.FLOAT


@pytest.mark.parametrize("a,b", [([3, 4], [4, 5]), ([2, 3, 4], [4, 5]), ([4], [4, 5]),
                                 ([3, 4], [4]), ([4], [4]), ([2, 1, 3, 4], [5, 4, 2]),
                                 ([1, 3, 4], [2, 4, 5])])
def test_matmul(a, b):
    out = list(np.matmul(np.zeros(a), np.zeros(b)).shape)
    check_against_onnxruntime(single_node_model("MatMul", [("a", F, a), ("b", F, b)],
                                                [("y", F, out)]))


def test_matmul_expression_text():
    model = single_node_model("MatMul", [("a", F, [2, 3, 4]), ("b", F, [4, 5])],
                              [("y", F, [2, 3, 5])])
    assert import_model(model).module.ops[0].expr == "y[b, i, j] += a[b, i, k] * b[k, j]"


@pytest.mark.parametrize("attrs,c_shape", [
    ({}, [5]), ({"transA": 1}, [3, 5]), ({"transB": 1, "alpha": 0.5, "beta": 2.0}, [1, 5]),
    ({"transA": 1, "transB": 1}, None), ({"alpha": 3.0}, None), ({"beta": 0.0}, [3, 1]),
])
def test_gemm(attrs, c_shape):
    a = [4, 3] if attrs.get("transA") else [3, 4]
    b = [5, 4] if attrs.get("transB") else [4, 5]
    inputs = [("a", F, a), ("b", F, b)] + ([("c", F, c_shape)] if c_shape else [])
    check_against_onnxruntime(single_node_model("Gemm", inputs, [("y", F, [3, 5])], **attrs))


def test_gemm_with_constant_weights():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "bias")]
    check_against_onnxruntime(single_node_model("Gemm", [("x", F, [2, 4]), "w", "bias"],
                                                [("y", F, [2, 6])], initializers=inits,
                                                transB=1))


@pytest.mark.parametrize("equation,shapes,out", [
    ("ij,jk->ik", [[3, 4], [4, 5]], [3, 5]),
    ("bij,bjk->bik", [[2, 3, 4], [2, 4, 5]], [2, 3, 5]),
    ("ij->ji", [[3, 4]], [4, 3]),
    ("ii->i", [[4, 4]], [4]),
    ("ij,j", [[3, 4], [4]], [3]),
    ("...ij,...jk->...ik", [[2, 3, 4], [2, 4, 2]], [2, 3, 2]),
    ("bhid,bhjd->bhij", [[1, 2, 3, 4], [1, 2, 5, 4]], [1, 2, 3, 5]),
])
def test_einsum(equation, shapes, out):
    inputs = [(f"x{k}", F, s) for k, s in enumerate(shapes)]
    check_against_onnxruntime(single_node_model("Einsum", inputs, [("y", F, out)],
                                                equation=equation))
