"""LSTM / GRU / RNN unrolled into tensor expressions, against onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_check import check_against_onnxruntime, single_node_model  # noqa: E402

F = TensorProto.FLOAT
T, B, I, H = 4, 2, 3, 5


def _rnn_model(op: str, gates: int, direction: str = "forward", layout: int = 0,
               bias: bool = True, initial: bool = True, peepholes: bool = False,
               opset: int = 14, **attrs):
    rng = np.random.default_rng(11)
    d = 2 if direction == "bidirectional" else 1

    def w(name, shape, scale=0.4):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale)
                                       .astype(np.float32), name)

    inits = [w("W", [d, gates * H, I]), w("R", [d, gates * H, H])]
    inputs = [("X", F, [B, T, I] if layout else [T, B, I]), "W", "R"]
    if bias:
        inits.append(w("B", [d, 2 * gates * H], 0.2))
    inputs.append("B" if bias else "")
    inputs.append("")  # sequence_lens
    state_shape = [B, d, H] if layout else [d, B, H]
    if initial:
        inits.append(w("h0", state_shape, 0.5))
        inputs.append("h0")
        if op == "LSTM":
            inits.append(w("c0", state_shape, 0.5))
            inputs.append("c0")
    if peepholes:
        if not initial:
            inputs += ["", ""]
        inits.append(w("P", [d, 3 * H], 0.3))
        inputs.append("P")
    y_shape = [B, T, d, H] if layout else [T, d, B, H]
    outputs = [("Y", F, y_shape), ("Y_h", F, state_shape)]
    if op == "LSTM":
        outputs.append(("Y_c", F, state_shape))
    return single_node_model(op, inputs, outputs, initializers=inits, opset=opset,
                             hidden_size=H, direction=direction, layout=layout, **attrs)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("initial", [True, False])
def test_lstm(direction, initial):
    check_against_onnxruntime(_rnn_model("LSTM", 4, direction, initial=initial))


@pytest.mark.parametrize("kw", [{"layout": 1}, {"peepholes": True}, {"clip": 0.5},
                                {"input_forget": 1}, {"bias": False, "initial": False},
                                {"peepholes": True, "initial": False, "layout": 1}])
def test_lstm_options(kw):
    # onnxruntime has no batch-first (layout=1) LSTM: the ONNX reference evaluator checks it.
    check_against_onnxruntime(_rnn_model("LSTM", 4, **kw),
                              reference="onnx" if kw.get("layout") else "onnxruntime")


def test_lstm_activations():
    check_against_onnxruntime(_rnn_model("LSTM", 4, activations=["HardSigmoid", "Relu",
                                                                  "Softsign"],
                                         activation_alpha=[0.3], activation_beta=[0.4]))


def test_lstm_is_fully_decomposed():
    imported = check_against_onnxruntime(_rnn_model("LSTM", 4))
    assert all(op.kind == "expr" for op in imported.module.ops)
    # One input projection, then per step: recurrent matmul, cell, hidden.
    names = [op.name for op in imported.module.ops]
    assert names[0].endswith("_xw") and sum(n.endswith(f"_h{s}") for s in range(T)
                                           for n in names) == T


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("initial", [True, False])
def test_gru(lbr, direction, initial):
    check_against_onnxruntime(_rnn_model("GRU", 3, direction, initial=initial,
                                         linear_before_reset=lbr))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn(direction):
    check_against_onnxruntime(_rnn_model("RNN", 1, direction))
    check_against_onnxruntime(_rnn_model("RNN", 1, direction, bias=False, initial=False,
                                         activations=["Relu"] * (2 if direction ==
                                                                 "bidirectional" else 1)))


def test_long_sequence_stays_shallow():
    """Y selects among T step states as a balanced tree: T=64 must parse and run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models import onnx_models

    imported = check_against_onnxruntime(onnx_models.lstm_model(seq=64), rtol=1e-3)
    y = next(op.expr for op in imported.module.ops if op.name.endswith("_y"))
    assert y.count("select(") == 63
