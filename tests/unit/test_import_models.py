"""Whole models: the small transformer/CNN/RNN builders against onnxruntime, and the nine real
models bundled with onnx (imported, folded, verified; some run against onnxruntime with random
weights)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import onnx_models  # noqa: E402
from models.onnx_check import check_against_onnxruntime, with_random_weights  # noqa: E402

from tilekit.ir.verify import verify  # noqa: E402
from tilekit.onnx import attach_files, import_model, load_model  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512"]


@pytest.mark.parametrize("name", ["bert_encoder_layer", "gpt_block", "mobilenet_block",
                                  "mlp_mixer_block", "lstm_model"])
def test_builder_models_match_onnxruntime(name):
    imported = check_against_onnxruntime(onnx_models.ALL[name]())
    assert all(op.kind == "expr" for op in imported.module.ops)


def test_bert_layer_is_decomposed_and_named_readably():
    imported = import_model(onnx_models.bert_encoder_layer(), name="bert")
    m = imported.module
    assert m.inputs == ("input_ids_embeddings_0",)
    assert m.source["inputs"] == {"input_ids_embeddings_0": "input_ids/embeddings:0"}
    exprs = [op.expr for op in m.ops]
    assert any(" max= " in e for e in exprs)            # softmax max
    assert any("erf(" in e for e in exprs)              # Gelu via Erf
    assert any(e.startswith("layernormalization") and "sqrt(" in e for e in exprs)
    assert "attention_qkv_weight" in imported.weights
    names = [op.name for op in m.ops]
    assert len(names) == len(set(names))


def test_mobilenet_block_folds_batchnorm_and_clips():
    imported = import_model(onnx_models.mobilenet_block())
    origins = [op.origin for op in imported.module.ops]
    assert not any(o.startswith("batchnormalization") for o in origins)
    assert any("min(max(" in op.expr for op in imported.module.ops)


@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_lstm_model_directions(direction):
    check_against_onnxruntime(onnx_models.lstm_model(direction=direction))


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_bundled_model_imports(name):
    model = load_model(str(LIGHT / f"light_{name}.onnx"))
    imported = import_model(model, name=name)
    m = imported.module
    verify(replace(m, weights={"file": "w.npz", "sha256": "0" * 64}))
    assert all(op.kind == "expr" for op in m.ops)
    assert not any(op.origin and op.origin.startswith("ConstantOfShape") for op in m.ops)
    assert len(m.inputs) == 1 and m.inputs[0] in ("data_0", "gpu_0_data_0")
    # BatchNorms that follow a Conv were folded into it.
    assert sum("bn" in (op.origin or "").lower() for op in m.ops) <= \
        sum(1 for n in model.graph.node if n.op_type == "BatchNormalization")
    for name_, t in m.tensors.items():
        if t.role == "weight":
            assert imported.weights[name_].shape == t.shape


def test_resnet50_import_folds_batch_norms_and_writes_weights(tmp_path):
    """ResNet-50 imported with its weights written (the time it takes is a benchmark:
    tests/bench/test_import_bench.py)."""
    model = load_model(str(LIGHT / "light_resnet50.onnx"))
    imported = import_model(model, name="resnet50")
    attach_files(imported, ir_folder=str(tmp_path), weights_path=str(tmp_path / "w.npz"),
                 onnx_path=str(LIGHT / "light_resnet50.onnx"), onnx_sha256="0" * 64,
                 options={})
    assert (tmp_path / "w.npz").stat().st_size > 90e6  # 98 MB of weights, not inline
    # 53 Conv + 53 BN folded: one conv and one bias add per Conv, nothing left of BN.
    convs = [op for op in imported.module.ops if op.expr and "_conv[" in op.expr.split("=")[0]]
    assert len(convs) == 53


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_bundled_model_with_random_weights_matches_onnxruntime(name):
    model = with_random_weights(LIGHT / f"light_{name}.onnx")
    rng = np.random.default_rng(1)
    x = rng.random((1, 3, 224, 224), dtype=np.float32)
    feeds = {vi.name: x for vi in model.graph.input if vi.name.endswith("data_0")}
    check_against_onnxruntime(model, feeds, rtol=1e-3, atol=1e-5)
