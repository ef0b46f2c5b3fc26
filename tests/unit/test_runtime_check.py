"""The comparison rule of --check, and the two references (onnxruntime, CPU executor)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from tilekit.errors import TilekitError
from tilekit.ir.model import Module, Op, Tensor
from tilekit.runtime.check import (compare, onnxruntime_reference, reference_outputs,
                                   tolerances)


def test_identical_outputs_pass():
    a = np.linspace(-1, 1, 10, dtype=np.float32)
    r = compare("y", a, a.copy(), "float32")
    assert r.passed and r.max_abs == 0 and r.rel_l2 == 0


def test_rel_l2_decides():
    b = np.ones(100, dtype=np.float32)
    a = b.copy()
    a[0] += 1e-4  # rel_l2 = 1e-4 / 10 = 1e-5: on the edge
    r = compare("y", a, b, "float32", rtol=2e-5, atol=0)
    assert r.passed and math.isclose(r.rel_l2, 1e-5, rel_tol=1e-2)
    r = compare("y", a, b, "float32", rtol=5e-6, atol=0)
    assert not r.passed and "FAIL" in r.line()


def test_atol_floor_for_zero_reference():
    b = np.zeros(4, dtype=np.float32)
    a = np.full(4, 1e-8, dtype=np.float32)
    r = compare("y", a, b, "float32")
    assert r.rel_l2 == math.inf and r.passed  # max_abs 1e-8 <= atol 1e-6


def test_nan_must_match():
    b = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    assert compare("y", b.copy(), b, "float32").passed
    a = np.array([1.0, 2.0, np.inf], dtype=np.float32)
    r = compare("y", a, b, "float32")
    assert not r.passed and "NaN/inf differ at 1" in r.note


def test_integers_must_match_exactly():
    b = np.arange(1000, dtype=np.int64)
    a = b.copy()
    a[3] += 1
    r = compare("idx", a, b, "int64")
    assert not r.passed and "1 element(s) differ" in r.note
    assert compare("idx", b.copy(), b, "int64").passed


def test_shape_mismatch_fails():
    r = compare("y", np.zeros((2, 3)), np.zeros((3, 2)), "float32")
    assert not r.passed and "shape" in r.note


def test_default_tolerances_by_dtype():
    assert tolerances("float32") == (1e-5, 1e-6)
    assert tolerances("float16")[0] > tolerances("float32")[0]
    assert tolerances("float32", rtol=0.1) == (0.1, 1e-6)


# -- references --------------------------------------------------------------------------

def tiny_onnx(path, ir_version: int = 8):
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [3], [0.5, -1.0, 2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["in:0", "w"], ["t"]), helper.make_node("Relu", ["t"], ["out/0"])],
        "tiny", [helper.make_tensor_value_info("in:0", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("out/0", TensorProto.FLOAT, [2, 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    onnx.save(model, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_module(source) -> Module:
    return Module(model="tiny",
                  tensors={"in_0": Tensor((2, 3), "float32", "input"),
                           "w": Tensor((3,), "float32", "weight"),
                           "t": Tensor((2, 3), "float32"),
                           "out_0": Tensor((2, 3), "float32", "output")},
                  ops=(Op("mul", "t[i,j] = in_0[i,j] * w[j]"),
                       Op("relu", "out_0[i,j] = max(t[i,j], 0.0)")),
                  inputs=("in_0",), outputs=("out_0",), source=source)


def test_onnxruntime_reference_maps_names(tmp_path):
    digest = tiny_onnx(tmp_path / "tiny.onnx")
    module = tiny_module({"onnx": "tiny.onnx", "sha256": digest,
                          "inputs": {"in_0": "in:0"}, "outputs": {"out_0": "out/0"}})
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    ref = onnxruntime_reference(module, {"in_0": x}, tmp_path)
    assert "onnxruntime" in ref.description and "tiny.onnx" in ref.description
    np.testing.assert_allclose(ref.outputs["out_0"], np.maximum(x * [0.5, -1, 2], 0))


def test_onnxruntime_reference_checksum(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    module = tiny_module({"onnx": "tiny.onnx", "sha256": "0" * 64})
    with pytest.raises(TilekitError) as err:
        onnxruntime_reference(module, {"in_0": np.zeros((2, 3), np.float32)}, tmp_path)
    assert "checksum mismatch" in err.value.message()


def test_onnxruntime_reference_unmapped_name(tmp_path):
    digest = tiny_onnx(tmp_path / "tiny.onnx")
    module = tiny_module({"onnx": "tiny.onnx", "sha256": digest})
    with pytest.raises(TilekitError) as err:
        onnxruntime_reference(module, {"in_0": np.zeros((2, 3), np.float32)}, tmp_path)
    assert "'in_0'" in err.value.message() and "re-run tk-import" in err.value.message()


def test_a_source_newer_than_onnxruntime_loads_is_checked_at_its_ir_version(tmp_path):
    """An `onnx` newer than the installed onnxruntime writes an IR version that onnxruntime
    refuses: the check loads the model as the newest IR version it knows, and says so."""
    digest = tiny_onnx(tmp_path / "tiny.onnx", ir_version=99)
    module = tiny_module({"onnx": "tiny.onnx", "sha256": digest,
                          "inputs": {"in_0": "in:0"}, "outputs": {"out_0": "out/0"}})
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    ref = onnxruntime_reference(module, {"in_0": x}, tmp_path)
    assert "IR version 99 read as" in ref.description
    np.testing.assert_allclose(ref.outputs["out_0"], np.maximum(x * [0.5, -1, 2], 0))


def test_a_source_too_new_that_cannot_be_rewritten_is_one_clear_error(tmp_path, monkeypatch):
    import onnx

    digest = tiny_onnx(tmp_path / "tiny.onnx", ir_version=99)
    module = tiny_module({"onnx": "tiny.onnx", "sha256": digest,
                          "inputs": {"in_0": "in:0"}, "outputs": {"out_0": "out/0"}})

    def refuse(*args, **kwargs):
        raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB")
    monkeypatch.setattr(onnx, "load", refuse)
    with pytest.raises(TilekitError) as err:
        onnxruntime_reference(module, {"in_0": np.zeros((2, 3), np.float32)}, tmp_path)
    message = err.value.message()
    assert "cannot load 'tiny.onnx'" in message and "IR version: 99" in message
    assert "could not be rewritten" in message and "\n" not in message


def test_onnxruntime_refusal_is_one_line_without_its_source_location(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    module = tiny_module({"onnx": "bad.onnx",
                          "sha256": hashlib.sha256(b"not a model").hexdigest()})
    with pytest.raises(TilekitError) as err:
        onnxruntime_reference(module, {"in_0": np.zeros((2, 3), np.float32)}, tmp_path)
    message = err.value.message()
    assert "cannot load 'bad.onnx'" in message and "\n" not in message
    assert "[ONNXRuntimeError]" not in message and str(tmp_path) not in message


def test_onnxruntime_message_keeps_its_reason():
    """onnxruntime's load failure as an H200's onnxruntime 1.30 printed it: the prefix, the
    model's path and the C++ location go, the reason stays (and with it the IR versions the
    check reads)."""
    from tilekit.runtime.check import _IR_TOO_NEW, _ort_reason

    message = ("[ONNXRuntimeError] : 1 : FAIL : Load model from /tmp/pytest-of-root/kv.onnx "
               "failed:/onnxruntime_src/onnxruntime/core/graph/model.cc:202 onnxruntime::Model"
               "::Model(ModelProto&&, const PathString&, const IOnnxRuntimeOpSchemaRegistryList*"
               ", const onnxruntime::logging::Logger&, const onnxruntime::ModelOptions&) "
               "Unsupported model IR version: 14, max supported IR version: 11")
    assert _ort_reason(message) == "Unsupported model IR version: 14, max supported IR version: 11"
    assert _IR_TOO_NEW.search(message).groups() == ("14", "11")
    assert _ort_reason("Protobuf parsing failed.") == "Protobuf parsing failed."


def test_onnxruntime_missing(tmp_path, monkeypatch):
    import sys

    digest = tiny_onnx(tmp_path / "tiny.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    module = tiny_module({"onnx": "tiny.onnx", "sha256": digest})
    with pytest.raises(TilekitError) as err:
        onnxruntime_reference(module, {"in_0": np.zeros((2, 3), np.float32)}, tmp_path)
    assert "pip install onnxruntime" in err.value.message()


def test_cpu_reference_without_source():
    x = np.ones((2, 3), np.float32)
    ref = reference_outputs(tiny_module(None), {"in_0": x},
                            {"w": np.array([0.5, -1, 2], np.float32)}, ".")
    assert "CPU reference executor" in ref.description
    np.testing.assert_allclose(ref.outputs["out_0"], [[0.5, 0, 2]] * 2)
