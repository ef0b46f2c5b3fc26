"""The GPU benchmark's PyTorch baseline (tests/bench/torch_onnx.py) against onnxruntime on the
CPU, and the batch rewrite of the bundled models (`onnx_models.with_batch`).

PyTorch is a bench-only dependency, not in the project's venv: the interpreter's tests skip
without it (the batch rewrite's run everywhere). To run them all, in a throwaway venv:

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch onnx onnxruntime numpy pytest hypothesis jsonschema \\
        pyyaml click rich
    PYTHONPATH=. /tmp/torchvenv/bin/python -m pytest -q -o addopts="" tests/unit/test_torch_onnx.py

Outputs are compared by relative L2 error (<= 1e-4). The bundled models end in a Softmax that
random weights saturate (ShuffleNet's is one-hot), so the logits that feed it are compared too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "bench")]
from models import onnx_models  # noqa: E402
from models.onnx_check import (onnxruntime_outputs, onnxruntime_runs,  # noqa: E402
                               random_inputs, reference_outputs, single_node_model,
                               with_random_weights)

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
REAL_MODELS = ["resnet50", "inception_v1", "inception_v2", "densenet121", "shufflenet",
               "squeezenet", "vgg19", "bvlc_alexnet", "zfnet512"]
BUILT_MODELS = ["bert_encoder_layer", "gpt_block", "mobilenet_block", "mlp_mixer_block",
                "lstm_model"]
#: The models the GPU benchmark also runs at batch 64.
BATCH64_MODELS = ["resnet50", "bert_encoder_layer", "mobilenet_block", "lstm_model"]
TOLERANCE = 1e-4
F = TensorProto.FLOAT


def build(name: str, batch: int | None = None) -> onnx.ModelProto:
    """Model `name` as the end-to-end tests build it, or at batch `batch`."""
    if name in REAL_MODELS:
        model = with_random_weights(LIGHT / f"light_{name}.onnx", seed=0)
        return model if batch is None else onnx_models.with_batch(model, batch)
    return onnx_models.ALL[name](**({} if batch is None else {"batch": batch}))


def with_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the input of each Softmax node as an extra graph output."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    known = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Softmax" and node.input[0] not in outputs:
            model.graph.output.append(known[node.input[0]])
    return model


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def assert_close(got: list, want: list, label: str) -> float:
    assert len(got) == len(want), label
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want)):
        g = g.detach().cpu().numpy() if hasattr(g, "detach") else np.asarray(g)
        assert g.shape == w.shape, f"{label} output {k}: shape {g.shape} != {w.shape}"
        err = rel_l2(g, w) if w.dtype.kind == "f" else float(np.any(g != w))
        assert err <= TOLERANCE, f"{label} output {k}: rel L2 {err:.2e}"
        worst = max(worst, err)
    return worst


# -- the batch rewrite (onnxruntime only) --------------------------------------------------

@pytest.mark.parametrize("name", ["resnet50", "inception_v1", "inception_v2", "densenet121",
                                  "shufflenet", "squeezenet"])
def test_with_batch_equals_stacked_batch_one_runs(name):
    """Each sample of a batch-3 run equals its own batch-1 run (the three heavy VGG-style
    models have the same single [1, N] flatten as ResNet-50 and are left out for time)."""
    one = with_logits(build(name))
    three = onnx_models.with_batch(one, 3)
    (input_name, x), = random_inputs(three, seed=1).items()
    assert x.shape[0] == 3
    batched = onnxruntime_outputs(three, {input_name: x})
    singles = onnxruntime_runs(one, [{input_name: x[i:i + 1]} for i in range(3)])
    for i, single in enumerate(singles):
        for b, s in zip(batched, single):
            assert b.shape[0] == 3 and b.shape[1:] == s.shape[1:]
            assert rel_l2(b[i:i + 1], s) <= 1e-5, (name, i)


def test_with_batch_keeps_weight_reshapes():
    """Inception v1 reshapes its classifier weight to [1000, 1024]: that target stays."""
    model = onnx_models.with_batch(build("inception_v1"), 64)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    targets = [inits[n.input[1]].tolist() for n in model.graph.node if n.op_type == "Reshape"]
    assert sorted(targets) == [[64, 1024], [1000, 1024]]
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 64


# -- the interpreter (needs PyTorch) -------------------------------------------------------

@pytest.fixture(scope="session")
def torch_onnx():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    import torch_onnx
    return torch_onnx


def run_torch(torch_onnx, model: onnx.ModelProto, feeds: dict) -> list:
    import torch
    net = torch_onnx.TorchModel(model, "cpu")
    with torch.inference_mode():
        return list(net(*[torch.from_numpy(feeds[n]) for n in net.input_names]))


MODEL_CASES = ([pytest.param(name, None, id=name) for name in REAL_MODELS + BUILT_MODELS]
               + [pytest.param(name, 64, id=f"{name}@64") for name in BATCH64_MODELS])


@pytest.mark.parametrize("name, batch", MODEL_CASES)
def test_model_matches_onnxruntime(torch_onnx, name, batch):
    model = with_logits(build(name, batch))
    feeds = random_inputs(model, seed=1)
    worst = assert_close(run_torch(torch_onnx, model, feeds), onnxruntime_outputs(model, feeds),
                         name)
    print(f"{name}{'' if batch is None else f'@{batch}'}: worst rel L2 {worst:.2e}")


def test_bundled_model_with_constant_fills(torch_onnx):
    """The model as onnx ships it: its weights are ConstantOfShape nodes, folded at
    construction, so only the compute runs in forward."""
    model = onnx.load(str(LIGHT / "light_squeezenet.onnx"))
    feeds = random_inputs(model, seed=1)
    net = torch_onnx.TorchModel(model, "cpu")
    assert not any(n.op_type == "ConstantOfShape" for n in net.nodes)
    assert_close(run_torch(torch_onnx, model, feeds), onnxruntime_outputs(model, feeds),
                 "squeezenet (constant fills)")


def _init(name: str, value, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _shape_then_reshape() -> onnx.ModelProto:
    """Reshape(y, Shape(x)): a Shape of a graph input, folded from the declared shape."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["y", "s"], ["z"])]
    graph = helper.make_graph(nodes, "shape_reshape",
                              [helper.make_tensor_value_info("x", F, [2, 3, 4]),
                               helper.make_tensor_value_info("y", F, [6, 4])],
                              [helper.make_tensor_value_info("z", F, [2, 3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _unbound(name):
    return (name, F, None)


#: Semantics the 14 models do not reach, one node each (onnxruntime as the reference, or the
#: ONNX reference evaluator where onnxruntime refuses: batch-first LSTM).
OP_CASES = {
    "slice_negative_steps": lambda: single_node_model(
        "Slice", [("x", F, [5, 7]), "st", "en", "ax", "sp"], [_unbound("y")],
        initializers=[_init("st", [4, -1]), _init("en", [-10, 0]), _init("ax", [0, 1]),
                      _init("sp", [-1, -2])]),
    "slice_opset9_attrs": lambda: single_node_model(
        "Slice", [("x", F, [5, 7])], [_unbound("y")], opset=9, starts=[1, 2], ends=[100, -1],
        axes=[1, 0]),
    "gather_negative_indices": lambda: single_node_model(
        "Gather", [("x", F, [3, 4, 5]), "i"], [_unbound("y")], axis=1,
        initializers=[_init("i", [[0, -1], [2, 1]])]),
    "split_opset11_attr": lambda: single_node_model(
        "Split", [("x", F, [2, 6])], [_unbound("a"), _unbound("b")], opset=11, axis=1,
        split=[2, 4]),
    "split_opset13_equal": lambda: single_node_model(
        "Split", [("x", F, [2, 6])], [_unbound("a"), _unbound("b"), _unbound("c")], axis=1),
    "clip_opset6_attrs": lambda: single_node_model(
        "Clip", [("x", F, [3, 4])], [_unbound("y")], opset=6, min=-0.5, max=0.5),
    "clip_min_only": lambda: single_node_model(
        "Clip", [("x", F, [3, 4]), "lo"], [_unbound("y")],
        initializers=[_init("lo", 0.1, np.float32)]),
    "avgpool_include_pad_asymmetric": lambda: single_node_model(
        "AveragePool", [("x", F, [1, 2, 7, 7])], [_unbound("y")], kernel_shape=[3, 3],
        strides=[2, 2], pads=[0, 0, 1, 1], count_include_pad=1),
    "avgpool_exclude_pad_asymmetric": lambda: single_node_model(
        "AveragePool", [("x", F, [1, 2, 7, 7])], [_unbound("y")], kernel_shape=[3, 3],
        pads=[1, 0, 0, 1]),
    "avgpool_ceil_mode": lambda: single_node_model(
        "AveragePool", [("x", F, [1, 2, 8, 8])], [_unbound("y")], kernel_shape=[3, 3],
        strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "maxpool_ceil_mode": lambda: single_node_model(
        "MaxPool", [("x", F, [1, 2, 8, 8])], [_unbound("y")], kernel_shape=[3, 3],
        strides=[2, 2], ceil_mode=1),
    "maxpool_same_upper": lambda: single_node_model(
        "MaxPool", [("x", F, [1, 2, 7, 7])], [_unbound("y")], kernel_shape=[2, 2],
        strides=[2, 2], auto_pad="SAME_UPPER"),
    "conv_same_lower": lambda: single_node_model(
        "Conv", [("x", F, [1, 2, 9, 9]), ("w", F, [3, 2, 4, 4])], [_unbound("y")],
        auto_pad="SAME_LOWER", strides=[2, 2]),
    "conv_dilated_asymmetric_pads": lambda: single_node_model(
        "Conv", [("x", F, [1, 2, 9, 9]), ("w", F, [3, 2, 3, 3])], [_unbound("y")],
        pads=[0, 1, 2, 1], dilations=[2, 1]),
    "conv1d_grouped_bias": lambda: single_node_model(
        "Conv", [("x", F, [2, 4, 10]), ("w", F, [6, 2, 3]), ("b", F, [6])], [_unbound("y")],
        group=2, pads=[2, 1]),
    "softmax_opset11_coerced": lambda: single_node_model(
        "Softmax", [("x", F, [2, 3, 4])], [_unbound("y")], opset=11, axis=1),
    "softmax_opset13_axis": lambda: single_node_model(
        "Softmax", [("x", F, [2, 3, 4])], [_unbound("y")], axis=1),
    "gemm_alpha_beta_trans_a": lambda: single_node_model(
        "Gemm", [("a", F, [4, 3]), ("b", F, [4, 5]), ("c", F, [5])], [_unbound("y")],
        alpha=0.5, beta=2.0, transA=1),
    "flatten_axis2": lambda: single_node_model(
        "Flatten", [("x", F, [2, 3, 4, 5])], [_unbound("y")], axis=2),
    "reshape_zero_and_minus_one": lambda: single_node_model(
        "Reshape", [("x", F, [2, 3, 4]), "s"], [_unbound("y")],
        initializers=[_init("s", [0, -1])]),
    "unsqueeze_negative_axes": lambda: single_node_model(
        "Unsqueeze", [("x", F, [2, 3]), "ax"], [_unbound("y")],
        initializers=[_init("ax", [-1, 0])]),
    "transpose_default_perm": lambda: single_node_model(
        "Transpose", [("x", F, [2, 3, 4])], [_unbound("y")]),
    "layernorm_axis1": lambda: single_node_model(
        "LayerNormalization", [("x", F, [2, 3, 4]), ("g", F, [3, 4]), ("b", F, [3, 4])],
        [_unbound("y")], axis=1, epsilon=1e-3),
    "expand": lambda: single_node_model(
        "Expand", [("x", F, [3, 1]), "s"], [_unbound("y")],
        initializers=[_init("s", [2, 1, 4])]),
    "shape_then_reshape": _shape_then_reshape,
    "lstm_reverse": lambda: onnx_models.lstm_model(direction="reverse"),
    "lstm_bidirectional": lambda: onnx_models.lstm_model(direction="bidirectional"),
}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_semantics_match_onnxruntime(torch_onnx, case):
    model = OP_CASES[case]()
    feeds = random_inputs(model, seed=2)
    assert_close(run_torch(torch_onnx, model, feeds), onnxruntime_outputs(model, feeds), case)


def test_lstm_batch_first_matches_reference(torch_onnx):
    """layout=1 (batch-first): onnxruntime refuses it, the ONNX reference evaluator runs it."""
    rng = np.random.default_rng(0)
    hidden, batch, seq, size = 3, 2, 4, 5
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.5, n)
             for n, s in (("W", [1, 4 * hidden, size]), ("R", [1, 4 * hidden, hidden]),
                          ("B", [1, 8 * hidden]), ("h0", [batch, 1, hidden]),
                          ("c0", [batch, 1, hidden]))]
    model = single_node_model("LSTM", [("x", F, [batch, seq, size]), "W", "R", "B", "", "h0",
                                       "c0"], [_unbound("y"), _unbound("yh"), _unbound("yc")],
                              initializers=inits, hidden_size=hidden, layout=1)
    feeds = random_inputs(model, seed=3)
    assert_close(run_torch(torch_onnx, model, feeds), reference_outputs(model, feeds),
                 "lstm layout=1")


def test_lrn_even_size_follows_the_onnx_window(torch_onnx):
    """An even LRN size: the window is [c - floor((size-1)/2), c + ceil((size-1)/2)], written
    out here from the operator's definition (onnxruntime refuses even sizes, and the ONNX
    reference evaluator's LRN sums over the wrong axis)."""
    size, alpha, beta, bias = 4, 0.01, 0.6, 1.5
    model = single_node_model("LRN", [("x", F, [2, 6, 3, 3])], [_unbound("y")], size=size,
                              alpha=alpha, beta=beta, bias=bias)
    x = random_inputs(model, seed=2)["x"]
    square_sum = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + size // 2 + 1)
        square_sum[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    want = x / (bias + alpha / size * square_sum) ** beta
    assert_close(run_torch(torch_onnx, model, {"x": x}), [want], "lrn size 4")


def test_unknown_op_type_lists_the_known_ones(torch_onnx):
    model = single_node_model("Celu", [("x", F, [2, 3])], [_unbound("y")])
    with pytest.raises(torch_onnx.UnsupportedOnnx, match=r"\['Celu'\].*known: .*Conv"):
        torch_onnx.TorchModel(model, "cpu")


@pytest.mark.parametrize("name", ["squeezenet", "bert_encoder_layer", "gpt_block",
                                  "mobilenet_block"])
def test_traces_as_one_graph(torch_onnx, name):
    """TorchDynamo traces forward with no graph break (fullgraph=True fails on one); the eager
    backend keeps this fast, Inductor is exercised below."""
    import torch
    model = build(name)
    feeds = random_inputs(model, seed=1)
    net = torch_onnx.TorchModel(model, "cpu")
    args = [torch.from_numpy(feeds[n]) for n in net.input_names]
    torch._dynamo.reset()
    traced = torch.compile(net, fullgraph=True, backend="eager")
    with torch.inference_mode():
        assert_close(list(traced(*args)), [t.numpy() for t in net(*args)], name)


def test_inductor_compile_matches_eager(torch_onnx):
    """torch.compile with its default backend (Inductor, here generating C++ for the CPU)."""
    import torch
    model = build("mobilenet_block")
    feeds = random_inputs(model, seed=1)
    net = torch_onnx.TorchModel(model, "cpu")
    args = [torch.from_numpy(feeds[n]) for n in net.input_names]
    torch._dynamo.reset()
    compiled = torch.compile(net)
    with torch.inference_mode():
        assert_close(list(compiled(*args)), onnxruntime_outputs(model, feeds), "inductor")
