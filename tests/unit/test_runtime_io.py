"""Weights, inputs and outputs of a run: loading, checks and their messages."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest

from tilekit.errors import TilekitError
from tilekit.ir.model import Module, Op, Tensor
from tilekit.runtime.io import (check_inputs, gather_inputs, load_weights, npz_bytes,
                                numpy_dtype, parse_input_flag, random_input)


def small_module(weights=None) -> Module:
    return Module(model="m",
                  tensors={"x": Tensor((2, 3), "float32", "input"),
                           "ids": Tensor((4,), "int64", "input"),
                           "w": Tensor((3,), "float32", "weight"),
                           "y": Tensor((2, 3), "float32", "output")},
                  ops=(Op("mul", "y[i,j] = x[i,j] * w[j]"),), inputs=("x", "ids"),
                  outputs=("y",), weights=weights)


def write_weights(folder, arrays) -> dict:
    path = folder / "m.weights.npz"
    np.savez(path, **arrays)
    return {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def message(exc_info) -> str:
    return exc_info.value.message()


# -- weights -----------------------------------------------------------------------------

def test_weights_load(tmp_path):
    w = np.arange(3, dtype=np.float32)
    ref = write_weights(tmp_path, {"w": w})
    loaded = load_weights(small_module(ref), tmp_path)
    np.testing.assert_array_equal(loaded["w"], w)


def test_weights_missing_file(tmp_path):
    with pytest.raises(TilekitError) as err:
        load_weights(small_module({"file": "nope.npz", "sha256": "00"}), tmp_path)
    assert "nope.npz" in message(err) and "not found" in message(err)


def test_weights_tampered(tmp_path):
    ref = write_weights(tmp_path, {"w": np.arange(3, dtype=np.float32)})
    np.savez(tmp_path / ref["file"], w=np.ones(3, dtype=np.float32))
    with pytest.raises(TilekitError) as err:
        load_weights(small_module(ref), tmp_path)
    assert "checksum mismatch" in message(err) and err.value.where == "weights.sha256"


def test_weights_missing_tensor(tmp_path):
    ref = write_weights(tmp_path, {"other": np.zeros(3, dtype=np.float32)})
    with pytest.raises(TilekitError) as err:
        load_weights(small_module(ref), tmp_path)
    assert "'w'" in message(err) and "missing" in message(err)


def test_weights_wrong_shape(tmp_path):
    ref = write_weights(tmp_path, {"w": np.zeros(4, dtype=np.float32)})
    with pytest.raises(TilekitError) as err:
        load_weights(small_module(ref), tmp_path)
    assert "expected float32[3], got float32[4]" in message(err)


def test_weights_not_an_npz(tmp_path):
    path = tmp_path / "m.weights.npz"
    path.write_bytes(b"not a zip")
    ref = {"file": path.name, "sha256": hashlib.sha256(b"not a zip").hexdigest()}
    with pytest.raises(TilekitError) as err:
        load_weights(small_module(ref), tmp_path)
    assert "is not an .npz archive" in message(err)


def test_weight_tensors_without_sidecar():
    with pytest.raises(TilekitError) as err:
        load_weights(small_module(None), ".")
    assert "no 'weights' file" in message(err)


# -- inputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["x", "=1", "x=", "x= "])
def test_malformed_input_flag(text):
    with pytest.raises(TilekitError) as err:
        parse_input_flag(text)
    assert "malformed" in message(err) and err.value.where == "--input"


def test_literal_inputs_fill_and_reshape():
    m = small_module()
    got = gather_inputs(m, ["x=1,2,3,4,5,6", "ids=7"])
    np.testing.assert_array_equal(got["x"], np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    assert got["x"].dtype == np.float32
    np.testing.assert_array_equal(got["ids"], np.full(4, 7, dtype=np.int64))


@pytest.mark.parametrize("flag, words", [("x=1,2", "2 values given"),
                                         ("ids=1.5", "cannot read '1.5' as integers"),
                                         ("x=a,b", "cannot read")])
def test_bad_literals(flag, words):
    with pytest.raises(TilekitError) as err:
        gather_inputs(small_module(), [flag])
    assert words in message(err)


def test_unknown_input_lists_expected():
    with pytest.raises(TilekitError) as err:
        gather_inputs(small_module(), ["z=1"])
    assert "unknown input 'z'" in message(err) and "x, ids" in message(err)


def test_input_given_twice():
    with pytest.raises(TilekitError) as err:
        gather_inputs(small_module(), ["x=1", "x=2"])
    assert "given twice" in message(err)


def test_npy_and_npz_inputs(tmp_path):
    x = np.ones((2, 3), np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 3), np.float32), ids=np.arange(4))
    got = gather_inputs(small_module(), [f"x=@{tmp_path / 'x.npy'}"], str(tmp_path / "in.npz"))
    np.testing.assert_array_equal(got["x"], x)  # --input overrides --inputs
    np.testing.assert_array_equal(got["ids"], np.arange(4))


def test_unreadable_npy(tmp_path):
    (tmp_path / "x.npy").write_text("garbage")
    with pytest.raises(TilekitError) as err:
        gather_inputs(small_module(), [f"x=@{tmp_path / 'x.npy'}"])
    assert "cannot read" in message(err) and err.value.where == "--input x"


def test_missing_npy(tmp_path):
    with pytest.raises(TilekitError) as err:
        gather_inputs(small_module(), [f"x=@{tmp_path / 'none.npy'}"])
    assert "not found" in message(err)


def test_random_inputs_are_deterministic_and_independent():
    m = small_module()
    a = gather_inputs(m, seed=3)
    b = gather_inputs(m, seed=3)
    c = gather_inputs(m, ["x=0"], seed=3)
    np.testing.assert_array_equal(a["x"], b["x"])
    np.testing.assert_array_equal(a["ids"], c["ids"])  # giving x does not move ids
    assert a["x"].dtype == np.float32 and a["ids"].dtype == np.int64
    assert a["ids"].min() >= 0 and a["ids"].max() < 8
    assert not np.array_equal(a["x"], gather_inputs(m, seed=4)["x"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "bool", "uint8", "int32", "float64"])
def test_random_input_dtypes(dtype):
    array = random_input(Tensor((5,), dtype, "input"), 0, 0)
    assert array.dtype == numpy_dtype(dtype) and array.shape == (5,)


def test_check_inputs_missing_suggests_seed():
    with pytest.raises(TilekitError) as err:
        check_inputs(small_module(), {"x": np.zeros((2, 3), np.float32)})
    assert "ids" in message(err) and "--seed" in message(err)


def test_check_inputs_shape_and_dtype():
    ids = np.zeros(4, np.int64)
    with pytest.raises(TilekitError) as err:
        check_inputs(small_module(), {"x": np.zeros((3, 2), np.float32), "ids": ids})
    assert "expected float32[2,3], got float32[3,2]" in message(err)
    with pytest.raises(TilekitError) as err:
        check_inputs(small_module(), {"x": np.zeros((2, 3), np.float64), "ids": ids})
    assert "got float64[2,3]" in message(err) and "asarray" in message(err)


def test_check_inputs_nan():
    x = np.zeros((2, 3), np.float32)
    x[0, 1] = np.nan
    x[1, 1] = np.inf
    inputs = {"x": x, "ids": np.zeros(4, np.int64)}
    with pytest.raises(TilekitError) as err:
        check_inputs(small_module(), inputs)
    assert "2 NaN or infinite" in message(err) and "--allow-nan" in message(err)
    check_inputs(small_module(), inputs, allow_nan=True)


# -- outputs -----------------------------------------------------------------------------

def test_npz_bytes_is_deterministic_and_readable():
    arrays = {"y": np.arange(6, dtype=np.float32).reshape(2, 3), "z": np.array(True)}
    data = npz_bytes(arrays)
    assert data == npz_bytes({k: v.copy() for k, v in arrays.items()})
    with np.load(io.BytesIO(data)) as back:
        assert back.files == ["y", "z"]
        np.testing.assert_array_equal(back["y"], arrays["y"])


def test_inputs_by_source_model_name():
    from dataclasses import replace

    m = replace(small_module(), source={"inputs": {"x": "in:0"}})
    got = gather_inputs(m, ["in:0=2"], seed=0)
    np.testing.assert_array_equal(got["x"], np.full((2, 3), 2, np.float32))
