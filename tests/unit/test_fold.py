"""tilekit.runtime.fold: what a module computes from its weights alone becomes weights."""

from __future__ import annotations

import numpy as np

from tilekit.ir.model import Module, Op, Tensor, default_kernels
from tilekit.runtime.cpu import prepare
from tilekit.runtime.fold import fold_constants, foldable_ops


def _module(outputs=("y",)) -> Module:
    """pos[i] = i; mask[i, j] = (j <= i) from pos; y = x * mask + w; z = pos doubled."""
    tensors = {
        "x": Tensor((4, 4), "float32", "input"),
        "w": Tensor((4, 4), "float32", "weight"),
        "pos": Tensor((4,), "float32"),
        "mask": Tensor((4, 4), "float32"),
        "z": Tensor((4,), "float32", "output" if "z" in outputs else "intermediate"),
        "y": Tensor((4, 4), "float32", "output"),
    }
    ops = (Op("positions", "pos[i] = i"),
           Op("causal", "mask[i, j] = select(pos[j] <= pos[i], 1.0, 0.0)"),
           Op("double", "z[i] = pos[i] * 2"),
           Op("apply", "y[i, j] = x[i, j] * mask[i, j] + w[i, j]"))
    return Module("m", tensors, ops, ("x",), tuple(outputs), default_kernels(ops))


def test_weight_only_ops_become_weights_and_the_outputs_stay_equal():
    module = _module()
    weights = {"w": np.arange(16, dtype=np.float32).reshape(4, 4)}
    assert [module.ops[i].name for i in foldable_ops(module)] == ["positions", "causal",
                                                                  "double"]
    folded, w = fold_constants(module, weights)
    assert [op.name for op in folded.ops] == ["apply"]
    assert [k.ops for k in folded.kernels] == [("apply",)]
    assert folded.tensors["mask"].role == "weight" and "pos" not in folded.tensors
    assert "z" not in folded.tensors  # read by no op left, and not an output
    np.testing.assert_array_equal(w["mask"], np.tril(np.ones((4, 4), np.float32)))
    x = {"x": np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)}
    np.testing.assert_array_equal(prepare(module).run(x, weights)["y"],
                                  prepare(folded).run(x, w)["y"])
    assert set(weights) == {"w"}  # the caller's weights are not changed


def test_ops_that_write_outputs_or_have_code_stay():
    module = _module(outputs=("y", "z"))
    folded, _ = fold_constants(module, {"w": np.zeros((4, 4), np.float32)})
    assert [op.name for op in folded.ops] == ["double", "apply"]
    coded = Module(**{**module.__dict__, "codegen": {"target": "cpu"}})
    assert fold_constants(coded, {"w": np.zeros((4, 4), np.float32)})[0] is coded


def test_a_gather_of_folded_positions_becomes_an_index_map():
    """rows = x[pos] (an opaque Gather of an input, at positions an op computes) reads x
    through an index map once the positions are folded: as an import for one size writes
    it."""
    tensors = {"x": Tensor((5, 2), "float32", "input"), "w": Tensor((3, 2), "float32",
                                                                    "weight"),
               "pos": Tensor((3,), "int64"), "rows": Tensor((3, 2), "float32"),
               "y": Tensor((3, 2), "float32", "output")}
    ops = (Op("positions", "pos[i] = int64(i + 1)"),
           Op("take", kind="opaque", opaque={"type": "Gather", "inputs": ["x", "pos"],
                                              "outputs": ["rows"], "attrs": {"axis": 0}}),
           Op("add", "y[i, j] = rows[i, j] + w[i, j]"))
    module = Module("m", tensors, ops, ("x",), ("y",))
    weights = {"w": np.arange(6, dtype=np.float32).reshape(3, 2)}
    folded, w = fold_constants(module, weights)
    assert [(op.name, op.kind, op.expr) for op in folded.ops] == [
        ("take", "expr", "rows[i, j] = x[i + 1, j]"),
        ("add", "expr", "y[i, j] = rows[i, j] + w[i, j]")]
    assert "pos" not in folded.tensors and set(w) == {"w"}
    x = {"x": np.arange(10, dtype=np.float32).reshape(5, 2)}
    np.testing.assert_array_equal(prepare(folded).run(x, w)["y"],
                                  prepare(module).run(x, weights)["y"])
