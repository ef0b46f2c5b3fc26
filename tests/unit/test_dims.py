"""Symbolic dimensions (tilekit.ir.dims, tilekit.onnx.symbolic): dimension expressions, the
`dims` section, interpolation, the verifier's rules for a symbolic module, binding."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilekit.errors import IRError, TilekitError
from tilekit.ir.codec import dumps, loads
from tilekit.ir.dims import (Dim, bind, instantiate, parse_dim_expr, read_dims,
                             require_static)
from tilekit.ir.model import Module, Op, Tensor, default_kernels
from tilekit.ir.verify import verify
from tilekit.onnx.symbolic import _interpolate, parse_dim_flag, text_of


@pytest.mark.parametrize("text,canonical,value", [
    ("seq", "seq", 7), ("2*seq + 1", "2*seq + 1", 15), ("1 + seq*2", "2*seq + 1", 15),
    ("batch*seq", "batch*seq", 21), ("3 - seq", "-seq + 3", -4), ("seq*batch*2", "2*batch*seq", 42),
    ("seq - seq", "0", 0),
])
def test_dimension_expressions(text, canonical, value):
    e = parse_dim_expr(text)
    assert str(e) == canonical
    assert e.evaluate({"seq": 7, "batch": 3}) == value
    assert parse_dim_expr(str(e)) == e


@pytest.mark.parametrize("text", ["", "seq*seq", "seq +", "2**seq", "seq/2", "(seq)", "x" * 300])
def test_bad_dimension_expressions(text):
    with pytest.raises(ValueError):
        parse_dim_expr(text)


def test_interpolation_is_exact_or_refuses():
    grid = [{"b": b, "s": s} for b in (13, 17) for s in (19, 23)]
    sizes = [3 * p["b"] * p["s"] + 2 * p["s"] + 5 for p in grid]
    e = _interpolate(["b", "s"], grid, sizes)
    assert str(e) == "3*b*s + 2*s + 5" and text_of(e) == "(3*$b*$s + 2*$s + 5)"
    assert text_of(parse_dim_expr("s")) == "$s"
    # seq // 2 is no integer polynomial through these sizes
    assert _interpolate(["s"], [{"s": 13}, {"s": 17}], [6, 8]) is None


def _symbolic(shape_x=("seq", 4), dims=None, expr="y[i, j] = x[i, j] * 2"):
    tensors = {"x": Tensor(tuple(shape_x), "float32", "input"),
               "y": Tensor(tuple(shape_x), "float32", "output")}
    ops = (Op(name="double", expr=expr),)
    return Module(model="m", tensors=tensors, ops=ops, inputs=("x",), outputs=("y",),
                  kernels=default_kernels(ops), dims=dims or {"seq": Dim(1, 64, (8,))})


def test_a_symbolic_module_round_trips_as_format_2():
    m = _symbolic()
    text = dumps(m)
    assert text.startswith("tilekit: 2\n") and "seq: {min: 1, max: 64, likely: [8]}" in text
    again = loads(text)
    verify(again)
    assert again == m
    assert dumps(instantiate(m, {"seq": 5})).startswith("tilekit: 1\n")


@pytest.mark.parametrize("module,message", [
    (_symbolic(shape_x=("sq", 4)), "names 'sq', which is not declared in 'dims'"),
    (_symbolic(shape_x=("seq - 3", 4)), "is -2 somewhere in the dims' ranges"),
    (_symbolic(shape_x=("seq*seq", 4)), "neither a positive integer nor a dimension expression"),
    (_symbolic(shape_x=("2*seq", 4)), "symbol seq is not a whole dimension of any input"),
    (_symbolic(expr="y[i, j] = x[i + $seq, j]"), "reads index"),
    (_symbolic(expr="y[i, j] = x[i % $len, j]"), r"names \$len, which is not declared"),
])
def test_verifier_rules_for_symbolic_modules(module, message):
    with pytest.raises((IRError, TilekitError), match=message.replace("*", r"\*")):
        verify(module)


@pytest.mark.parametrize("doc,message", [
    ("tilekit: 1\nmodel: m\ndims: {seq: {min: 1, max: 8}}\ninputs: []\noutputs: []\n"
     "tensors: {}\nops: []\n", "needs tile IR format 2"),
    ("tilekit: 2\nmodel: m\ndims: {seq: {min: 9, max: 8}}\ninputs: []\noutputs: []\n"
     "tensors: {}\nops: []\n", "min 9 is above max 8"),
    ("tilekit: 2\nmodel: m\ndims: {2x: {min: 1, max: 8}}\ninputs: []\noutputs: []\n"
     "tensors: {}\nops: []\n", "is not an identifier"),
    ("tilekit: 2\nmodel: m\ndims: {seq: {min: 1, max: 8, likely: [9]}}\ninputs: []\n"
     "outputs: []\ntensors: {}\nops: []\n", "dims.seq.likely"),
    ("tilekit: 2\nmodel: m\ndims: [seq]\ninputs: []\noutputs: []\ntensors: {}\nops: []\n",
     "must be a mapping of symbols"),
])
def test_bad_dims_sections(doc, message):
    with pytest.raises(IRError, match=message):
        loads(doc)


def test_binding_from_shapes_and_flags():
    m = _symbolic()
    assert bind(m, {"x": (5, 4)}) == {"seq": 5}
    assert bind(m, {}, {"seq": 9}) == {"seq": 9}
    for shapes, given, message in (
            ({"x": (65, 4)}, None, r"seq = 65 \(from input 'x'\) is outside its range 1..64"),
            ({"x": (5, 4)}, {"seq": 6}, "input 'x' dimension 0 is 5 but seq is 6"),
            ({"x": (5, 4, 1)}, None, "input 'x' has rank 3"),
            ({"x": (5, 3)}, None, r"input 'x' has shape \[5, 3\], expected \[5, 4\]"),
            ({}, None, "symbol seq is not bound by any input"),
            ({}, {"seq": 2, "batch": 1}, "--dim names 'batch'")):
        with pytest.raises(TilekitError, match=message):
            bind(m, shapes, given)


def test_stages_refuse_and_instances_are_static():
    m = _symbolic()
    with pytest.raises(TilekitError, match=r"tk-roll needs static sizes; .* seq \(1..64\)"):
        require_static(m, "tk-roll")
    one = instantiate(m, {"seq": 3})
    assert one.tensors["x"].shape == (3, 4) and not one.dims
    require_static(one, "tk-roll")
    e = replace(m, ops=(Op(name="double", expr="y[i, j] = x[i % $seq, j]"),))
    assert instantiate(e, {"seq": 3}).ops[0].expr == "y[i, j] = x[i % 3, j]"


@pytest.mark.parametrize("flag,expected", [
    ("seq=128", ("seq", dict(value=128))),
    ("seq=1..2048", ("seq", dict(min=1, max=2048, likely=()))),
    ("seq=1..2048:128,1,128", ("seq", dict(min=1, max=2048, likely=(1, 128)))),
])
def test_dim_flags(flag, expected):
    name, parsed = parse_dim_flag(flag)
    assert name == expected[0]
    for key, value in expected[1].items():
        assert getattr(parsed, key) == value


def test_read_dims_limits():
    with pytest.raises(IRError, match="at most 4 are supported"):
        read_dims({f"s{i}": {"min": 1, "max": 2} for i in range(5)})
