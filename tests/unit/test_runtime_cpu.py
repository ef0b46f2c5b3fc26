"""The CPU reference executor on hand-written modules, against hand-written NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.model import Module, Op, Tensor
from tilekit.runtime import cpu
from tilekit.runtime.cpu import OP_RUNNERS, prepare, register_mode, run_module, run_op_whole


def module(tensors: dict, ops: list[Op], inputs, outputs, **extra) -> Module:
    return Module(model="m", tensors={k: Tensor(*v) for k, v in tensors.items()},
                  ops=tuple(ops), inputs=tuple(inputs), outputs=tuple(outputs), **extra)


def rng(seed=0):
    return np.random.default_rng(seed)


def test_matmul():
    m = module({"a": ((4, 8), "float32", "input"), "b": ((8, 5), "float32", "weight"),
                "y": ((4, 5), "float32", "output")},
               [Op("mm", "y[i,j] += a[i,k] * b[k,j]")], ["a"], ["y"])
    a = rng().standard_normal((4, 8), dtype=np.float32)
    b = rng(1).standard_normal((8, 5), dtype=np.float32)
    out = run_module(m, {"a": a}, {"b": b})
    assert list(out) == ["y"]
    assert out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], a @ b, rtol=1e-5, atol=1e-6)


def conv_reference(x, w, stride, pad):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, f, oh, ow), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            y += np.einsum("nchw,fc->nfhw", patch, w[:, :, i, j])
    return y


def test_conv_with_padding_and_stride():
    m = module({"x": ((1, 3, 9, 9), "float32", "input"), "w": ((4, 3, 3, 3), "float32", "weight"),
                "y": ((1, 4, 5, 5), "float32", "output")},
               [Op("conv", "y[n,f,h,w] += x[n,c,h*2+kh-1,w*2+kw-1] * w[f,c,kh,kw]", pad="0")],
               ["x"], ["y"])
    x = rng().standard_normal((1, 3, 9, 9), dtype=np.float32)
    w = rng(1).standard_normal((4, 3, 3, 3), dtype=np.float32)
    out = run_module(m, {"x": x}, {"w": w})
    np.testing.assert_allclose(out["y"], conv_reference(x, w, 2, 1), rtol=1e-5, atol=1e-5)


def softmax_module() -> Module:
    return module({"x": ((3, 7), "float32", "input"), "m": ((3,), "float32", "intermediate"),
                   "e": ((3, 7), "float32", "intermediate"), "s": ((3,), "float32", "intermediate"),
                   "y": ((3, 7), "float32", "output")},
                  [Op("max", "m[i] max= x[i,j]"), Op("exp", "e[i,j] = exp(x[i,j] - m[i])"),
                   Op("sum", "s[i] += e[i,j]"), Op("div", "y[i,j] = e[i,j] / s[i]")],
                  ["x"], ["y"])


def test_softmax_as_four_ops():
    x = rng().standard_normal((3, 7), dtype=np.float32) * 10
    out = run_module(softmax_module(), {"x": x}, {})
    z = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["y"], z / z.sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-7)


def test_intermediates_are_freed_after_their_last_reader():
    live: list[set[str]] = []

    def spy(step, env):
        live.append(set(env))
        return run_op_whole(step, env)

    register_mode("spy", spy)
    try:
        x = rng().standard_normal((3, 7), dtype=np.float32)
        run_module(softmax_module(), {"x": x}, {}, mode="spy")
    finally:
        OP_RUNNERS.pop("spy")
    # Before each op: what is alive. `m` dies after exp (its last reader), `s` after div.
    assert live == [{"x"}, {"x", "m"}, {"x", "e"}, {"x", "e", "s"}]
    steps = prepare(softmax_module()).steps
    assert [s.frees for s in steps] == [(), ("m",), (), ("e", "s")]


def test_dead_tensor_is_freed_right_after_its_writer():
    m = module({"x": ((2,), "float32", "input"), "t": ((2,), "float32", "intermediate"),
                "y": ((2,), "float32", "output")},
               [Op("dead", "t[i] = x[i] * 2"), Op("y", "y[i] = x[i] + 1")], ["x"], ["y"])
    assert [s.frees for s in prepare(m).steps] == [("t",), ()]


def test_outputs_in_module_order_and_cast_to_declared_dtype():
    m = module({"x": ((4,), "float32", "input"), "a": ((4,), "float64", "output"),
                "b": ((4,), "bool", "output")},
               [Op("a", "a[i] = x[i] * 2"), Op("b", "b[i] = x[i] > 0")], ["x"], ["b", "a"])
    x = np.array([-1, 0, 1, 2], dtype=np.float32)
    out = run_module(m, {"x": x}, {})
    assert list(out) == ["b", "a"]
    assert out["a"].dtype == np.float64 and out["b"].dtype == np.bool_
    np.testing.assert_array_equal(out["b"], x > 0)


def test_inputs_are_not_modified():
    x = rng().standard_normal((3, 7), dtype=np.float32)
    before = x.copy()
    run_module(softmax_module(), {"x": x}, {})
    np.testing.assert_array_equal(x, before)


def test_prepare_is_cached_per_module_object():
    m = softmax_module()
    assert prepare(m) is prepare(m)
    other = softmax_module()
    assert prepare(other) is not prepare(m)


def test_cache_does_not_keep_modules_alive():
    import gc

    m = softmax_module()
    prepare(m)
    key = id(m)
    assert key in cpu._PROGRAMS
    del m
    gc.collect()
    assert key not in cpu._PROGRAMS


def test_refuses_malformed_control_section():
    m = softmax_module()
    from dataclasses import replace
    from tilekit.errors import IRError
    with pytest.raises(IRError) as err:
        prepare(replace(m, ops=m.ops + (Op("loops", kind="control"),), control={"loops": []}))
    assert "control.loops" in err.value.message()


def test_refuses_unknown_op_kind():
    m = module({"x": ((2,), "float32", "input"), "y": ((2,), "float32", "output")},
               [Op("k", "y[i] = x[i]", kind="fancy")], ["x"], ["y"])
    with pytest.raises(UnsupportedError) as err:
        prepare(m)
    assert "ops[0] (k).kind" in err.value.message() and "fancy" in err.value.message()


def test_ignores_schedule_sections():
    m = softmax_module()
    from dataclasses import replace
    m2 = replace(m, program={"units": 4}, codegen={"kernels": ["k.cu"]},
                 ops=tuple(replace(op, tile={"block": [1, 7]}) for op in m.ops))
    x = rng().standard_normal((3, 7), dtype=np.float32)
    np.testing.assert_array_equal(run_module(m2, {"x": x}, {})["y"],
                                  run_module(m, {"x": x}, {})["y"])


def test_unknown_mode_lists_known():
    with pytest.raises(TilekitError) as err:
        run_module(softmax_module(), {"x": np.zeros((3, 7), np.float32)}, {}, mode="nope")
    assert "whole" in err.value.message()


def test_bad_expression_is_located():
    m = module({"x": ((2,), "float32", "input"), "y": ((3,), "float32", "output")},
               [Op("bad", "y[i] = x[i]")], ["x"], ["y"])
    with pytest.raises(TilekitError) as err:
        prepare(m)
    assert err.value.message().startswith("ops[0] (bad).expr")


def gather_module(kind="Gather") -> Module:
    return module({"table": ((8, 3), "float32", "weight"), "ids": ((4,), "int64", "input"),
                   "g": ((4, 3), "float32", "intermediate"), "y": ((4,), "float32", "output")},
                  [Op("gather", kind="opaque",
                      opaque={"type": kind, "inputs": ["table", "ids"], "outputs": ["g"],
                              "attrs": {"axis": 0}}),
                   Op("sum", "y[i] += g[i,j]")], ["ids"], ["y"])


def test_opaque_op_through_the_registry():
    table = rng().standard_normal((8, 3), dtype=np.float32)
    ids = np.array([7, 0, 3, 3])
    out = run_module(gather_module(), {"ids": ids}, {"table": table})
    np.testing.assert_allclose(out["y"], table[ids].sum(axis=1), rtol=1e-6)
    assert [s.frees for s in prepare(gather_module()).steps] == [(), ("g",)]


def test_unknown_opaque_type_is_located_and_lists_known():
    with pytest.raises(UnsupportedError) as err:
        prepare(gather_module("Frobnicate"))
    text = err.value.message()
    assert text.startswith("ops[0] (gather)") and "Frobnicate" in text and "Gather" in text


def test_opaque_unused_optional_output_is_dropped():
    m = module({"x": ((5,), "float32", "input"), "v": ((2,), "float32", "output")},
               [Op("top", kind="opaque",
                   opaque={"type": "TopK", "inputs": ["x"], "outputs": ["v", ""],
                           "attrs": {"axis": -1, "k": 2}})], ["x"], ["v"])
    x = np.array([3, 1, 4, 1, 5], dtype=np.float32)
    np.testing.assert_array_equal(run_module(m, {"x": x}, {})["v"], [5, 4])
