"""Class 3: no unbounded read, allocation, loop or recursion from a small input.

Every budget lives in `tilekit.limits` and is checked before the work it guards: bytes per
input, YAML aliases (refused) and nesting depth, expression length and depth, elements per
tensor (and per axis and reduction domain), total bytes of a run or an import, and `.npy`
headers against the IR's declared shapes before any data is read.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import threading
import zipfile

import numpy as np
import pytest

from hostile_support import (assert_refused, env_limit, mlp_doc, run, sha256, spawn, write_doc,
                             write_mlp)
from tilekit import limits

IR_TOOLS = [("tk-roll", ["--hw", "h100"]), ("tk-codegen", []), ("tk-run", ["--seed", "0"])]


# -- bytes per input ---------------------------------------------------------------------

@pytest.mark.parametrize("tool, extra", IR_TOOLS + [("tk-hw", None)])
def test_dev_zero_as_the_document(monkeypatch, tool, extra):
    """Zeros are refused from their first block (test_first_bytes.py); a budget still
    bounds what is read of a profile from stdin."""
    with env_limit(monkeypatch, "TILEKIT_MAX_INPUT_BYTES", "1M"):
        args = ["validate", "-"] if tool == "tk-hw" else ["/dev/zero", *extra]
        if tool == "tk-hw":
            with open("/dev/zero", "rb") as zero:
                proc = spawn(tool, *args, stdin=zero, capture_output=True,
                             env={"TILEKIT_MAX_PROFILE_BYTES": "1M"})
            assert_refused(proc, tool, "profile size limit")
        else:
            assert_refused(run(tool, *args), tool, "/dev/zero", "control character")


def _endless_text():
    """A producer of endless text that could start a YAML document (`tilekit: 1` lines)."""
    return subprocess.Popen(["yes", "tilekit: 1"], stdout=subprocess.PIPE)


@pytest.mark.parametrize("tool, extra", IR_TOOLS)
def test_endless_stdin(tool, extra):
    producer = _endless_text()
    try:
        proc = spawn(tool, "-", *extra, stdin=producer.stdout, capture_output=True,
                     env={"TILEKIT_MAX_INPUT_BYTES": "4M"}, timeout=60)
    finally:
        producer.kill()
        producer.wait()
    assert_refused(proc, tool, "<stdin>", "input size limit")


def test_endless_pipe_at_the_default_budget():
    """`yes | tk-codegen`: read up to the documented 256 MiB, then refused."""
    producer = subprocess.Popen(["yes", "tilekit: 1"], stdout=subprocess.PIPE)
    try:
        proc = spawn("tk-codegen", stdin=producer.stdout, capture_output=True, timeout=120)
        assert_refused(proc, "tk-codegen", "input size limit (268,435,456 bytes)")
    finally:
        producer.kill()
        producer.wait()


def test_endless_model_on_stdin(tmp_path):
    """An endless stream of well-formed protobuf fields (ir_version = 1, again and again)
    passes the look at the first bytes: the model budget cuts it off."""
    fields = tmp_path / "fields"
    fields.write_bytes(b"\x08\x01" * 4096)
    producer = subprocess.Popen(f"while cat {fields}; do :; done", shell=True,
                                stdout=subprocess.PIPE)
    try:
        # a budget of 256K: each 2-byte field is walked as it arrives (2M took 3 s of CPU)
        proc = spawn("tk-import", stdin=producer.stdout, capture_output=True,
                     env={"TILEKIT_MAX_MODEL_BYTES": "256K"})
    finally:
        producer.kill()
        producer.wait()
    assert_refused(proc, "tk-import", "model size limit", "TILEKIT_MAX_MODEL_BYTES")


@pytest.mark.parametrize("tool, extra", IR_TOOLS)
def test_huge_document_file_is_refused_before_reading(tmp_path, tool, extra):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(300 * 2**20)
    assert_refused(run(tool, big, *extra), tool, "input size limit", "314,572,800 bytes")


def test_huge_model_file_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.onnx"
    with open(big, "wb") as fh:
        fh.truncate(3 * 2**30)
    assert_refused(run("tk-import", big), "tk-import", "model size limit")


def test_dev_zero_as_a_model(monkeypatch):
    with env_limit(monkeypatch, "TILEKIT_MAX_MODEL_BYTES", "1M"):
        assert_refused(run("tk-import", "/dev/zero"), "tk-import", "not an ONNX model")


# -- YAML aliases, tags, nesting ----------------------------------------------------------

def billion_laughs(levels: int = 12) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "{" + ", ".join(lines) + "}"


def _mlp_yaml(extra_top: str = "", stage_options: str | None = None) -> str:
    doc = mlp_doc()
    del doc["weights"]
    for name in ("w1", "b1", "w2"):
        doc["tensors"][name]["role"] = "input"
        doc["inputs"].append(name)
    text = json.dumps(doc)[1:-1]
    if stage_options is not None:
        text = text.replace('{"name": "import"}', '{"name": "import", "options": '
                            + stage_options + "}")
    return "# YAML in flow style\n{" + text + (", " + extra_top if extra_top else "") + "}"


ALIAS_CASES = {
    "laughs_in_stage_options": _mlp_yaml(stage_options=billion_laughs()),
    "laughs_in_program": _mlp_yaml("program: " + billion_laughs()),
    "scalar_alias": _mlp_yaml('"codegen": {"a": &x "v", "b": *x}'),
    "alias_of_tensor": _mlp_yaml().replace('"h": {', '"h": &t {').replace(
        '"y": {"shape"', '"y2": *t, "y": {"shape"'),
    "merge_key": _mlp_yaml('"program": {"base": &b {"u": 1}, "more": {<<: *b, "v": 2}}'),
}


@pytest.mark.parametrize("tool, extra", IR_TOOLS)
@pytest.mark.parametrize("case", sorted(ALIAS_CASES))
def test_yaml_aliases_are_refused(tmp_path, tool, extra, case):
    path = tmp_path / "a.yaml"
    path.write_text(ALIAS_CASES[case])
    assert_refused(run(tool, path, *extra), tool, "YAML alias", "is not allowed")


def test_alias_bomb_in_a_profile(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("schema: 1\nsources: " + billion_laughs(15) + "\n")
    assert_refused(run("tk-hw", "validate", path), "tk-hw", "YAML alias")


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system ['id']", "!!binary aGVsbG8=",
                                 "!custom 1", "!!set {a, b}", "!!omap [a: 1]",
                                 "!!timestamp 2020-01-01", "!!python/name:os.system ''"])
def test_yaml_tags_are_refused(tmp_path, tag):
    path = tmp_path / "t.yaml"
    path.write_text(_mlp_yaml('"program": {"x": ' + tag + "}"))
    assert_refused(run("tk-codegen", path), "tk-codegen", "is not allowed")


def test_core_tags_are_plain_data(tmp_path):
    path = tmp_path / "t.yaml"
    # `source` is free-form provenance (`program` is tk-ram's verified plan since issue 12).
    path.write_text(_mlp_yaml('"source": {"x": !!str 010, "y": !!int "7"}'))
    assert run("tk-codegen", path, "-o", tmp_path / "o.yaml").exit_code == 0
    assert "x: '010'" in (tmp_path / "o.yaml").read_text()


NESTING = {
    "yaml_flow_lists": "source: {x: " + "[" * 20000 + "]" * 20000 + "}",
    "yaml_flow_maps": "source: " + "{a: " * 20000 + "1" + "}" * 20000,
    "yaml_block_maps": "source:\n" + "".join(" " * i + "a:\n" for i in range(1, 200))
                       + " " * 200 + "b: 1\n",
    "yaml_compact_lists": "source: {x: [" + "- " * 3000 + "1]}",
    "yaml_just_over": "source: {x: " + "[" * 64 + "]" * 64 + "}",
}


@pytest.mark.parametrize("tool, extra", IR_TOOLS)
@pytest.mark.parametrize("case", sorted(NESTING))
def test_deep_yaml_is_refused(tmp_path, tool, extra, case):
    path = tmp_path / "n.yaml"
    path.write_text(_yaml_doc_with(NESTING[case]))
    result = run(tool, path, *extra)
    if case == "yaml_compact_lists":  # `- - 1` inside a flow list is a syntax error
        assert_refused(result, tool)
    else:
        assert_refused(result, tool, "nesting depth limit (64 levels)", "TILEKIT_MAX_NESTING")


def _yaml_doc_with(extra: str) -> str:
    import yaml
    doc = json.loads(_mlp_yaml().split("\n", 1)[1])
    return yaml.safe_dump(doc, default_flow_style=False, width=1 << 20) + extra + "\n"


def test_nesting_at_the_limit_is_accepted(tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text(_yaml_doc_with("source: {x: " + "[" * 60 + "]" * 60 + "}"))
    result = run("tk-codegen", path, "-o", tmp_path / "o.yaml")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    '{"a": ' * 100_000 + "1" + "}" * 100_000,
    '{"tilekit": 1, "program": ' + "[" * 70 + "]" * 70 + "}",
])
@pytest.mark.parametrize("tool, extra", IR_TOOLS)
def test_deep_json_is_refused(tmp_path, tool, extra, text):
    path = tmp_path / "n.json"
    path.write_text(text if text[0] == "{" and text[1] == '"' and "tilekit" in text[:20]
                    else '{"tilekit": 1, "x": ' + text + "}")
    assert_refused(run(tool, path, *extra), tool, "nesting depth limit")


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_huge_integer_literals(tmp_path, fmt):
    digits = "9" * 5000
    doc = _mlp_yaml('"program": {"n": ' + digits + "}")
    path = tmp_path / f"i.{fmt}"
    path.write_text(doc if fmt == "yaml" else doc.split("\n", 1)[1])
    assert_refused(run("tk-codegen", path), "tk-codegen", "longer than 40 digits")


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1e400"])
def test_json_numbers_overflowing_to_infinity(tmp_path, number):
    doc = json.loads(_mlp_yaml().split("\n", 1)[1])
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc)[:-1] + ', "program": {"v": ' + number + "}}")
    assert_refused(run("tk-codegen", path), "tk-codegen", "overflows to infinity")


# -- expressions -------------------------------------------------------------------------

EXPRESSIONS = {
    "parens_300": "y[i,j] = " + "(" * 300 + "h[i,j]" + ")" * 300,
    "parens_10000": "y[i,j] = " + "(" * 10000 + "h[i,j]" + ")" * 10000,
    "unary_minus_5000": "y[i,j] = " + "- " * 5000 + "h[i,j]",
    "not_5000": "y[i,j] = float32(" + "!" * 5000 + "h[i,j])",
    "calls_200": "y[i,j] = " + "exp(" * 200 + "h[i,j]" + ")" * 200,
    "index_parens_200": "y[i,j] = h[" + "(" * 200 + "i" + ")" * 200 + ",j]",
    "chain_5000": "y[i,j] = " + " + ".join(["h[i,j]"] * 5000),
    "chain_mul_100": "y[i,j] = " + " * ".join(["h[i,j]"] * 100),
    "select_nest_100": "y[i,j] = " + "select(i > 0, " * 100 + "h[i,j]" + ", 0.0)" * 100,
}


@pytest.mark.parametrize("tool, extra", IR_TOOLS)
@pytest.mark.parametrize("case", sorted(EXPRESSIONS))
def test_deep_expressions_are_refused(tmp_path, tool, extra, case):
    doc = mlp_doc()
    doc["ops"][2] = {"name": "out", "expr": EXPRESSIONS[case]}
    doc["tensors"]["y"]["shape"] = [2, 8]
    del doc["tensors"]["w2"]
    result = run(tool, write_mlp(tmp_path, doc), *extra)
    assert_refused(result, tool, "ops[2].expr", "expression depth limit (64 levels)",
                   "TILEKIT_MAX_EXPR_DEPTH")


@pytest.mark.parametrize("text", ["y[i,j] = h[i,j]" + " + 1.0" * 30000,
                                  "y[i,j] = h[i,j] + " + "a" * 200_000 + "[i]"])
def test_long_expressions_are_refused(tmp_path, text):
    doc = mlp_doc()
    doc["ops"][2] = {"name": "out", "expr": text}
    doc["tensors"]["y"]["shape"] = [2, 8]
    assert_refused(run("tk-run", write_mlp(tmp_path, doc), "--seed", "0"), "tk-run",
                   "expression length limit (100,000 characters)")


def test_expression_at_the_depth_limit_runs_everywhere(tmp_path):
    doc = mlp_doc()
    doc["ops"][2] = {"name": "out", "expr": "y[i,j] = " + "(" * 60 + "h[i,j]" + ")" * 60}
    doc["tensors"]["y"]["shape"] = [2, 8]
    ir = write_mlp(tmp_path, doc)
    for tool, extra in IR_TOOLS:
        result = run(tool, ir, *extra, "-o", tmp_path / f"{tool}.out")
        assert result.exit_code == 0, (tool, result.stderr)


def test_raising_the_expression_depth_limit(tmp_path, monkeypatch):
    doc = mlp_doc()
    doc["ops"][2] = {"name": "out", "expr": "y[i,j] = " + "(" * 80 + "h[i,j]" + ")" * 80}
    doc["tensors"]["y"]["shape"] = [2, 8]
    ir = write_mlp(tmp_path, doc)
    assert_refused(run("tk-run", ir, "--seed", "0"), "tk-run", "expression depth limit")
    with env_limit(monkeypatch, "TILEKIT_MAX_EXPR_DEPTH", "100"):
        assert run("tk-run", ir, "--seed", "0").exit_code == 0


# -- shapes, extents and the run's budget --------------------------------------------------

def _shape_doc(shape, dtype="float32") -> dict:
    axes = "ijklmnop"[:len(shape)]
    idx = ",".join(axes)
    return {"tilekit": 1, "model": "m", "stages": [{"name": "import"}], "inputs": ["x"],
            "outputs": ["y"],
            "tensors": {"x": {"shape": shape, "dtype": dtype, "role": "input"},
                        "y": {"shape": shape, "dtype": dtype, "role": "output"}},
            "ops": [{"name": "a", "expr": f"y[{idx}] = x[{idx}] * 2"}]}


SHAPES = {
    "2^40": [2**40],
    "2^31": [2**31],
    "2^20x2^20": [2**20, 2**20],
    "int64_overflow": [2**32, 2**32, 2**32],
    "beyond_int64": [10**30],
    "many_dims": [2] * 40,
}


@pytest.mark.parametrize("tool, extra", IR_TOOLS)
@pytest.mark.parametrize("case", sorted(SHAPES))
def test_huge_shapes_are_refused(tmp_path, tool, extra, case):
    path = write_doc(tmp_path / "s.json", _shape_doc(SHAPES[case]))
    assert_refused(run(tool, path, *extra), tool, "tensor size limit",
                   "TILEKIT_MAX_TENSOR_ELEMENTS")


@pytest.mark.parametrize("shape", [[0], [-1], [4, 0], [True], [1.5], ["4"]])
def test_empty_or_odd_dimensions(tmp_path, shape):
    assert_refused(run("tk-run", write_doc(tmp_path / "s.json", _shape_doc(shape)), "--seed",
                       "0"), "tk-run", "dimension must be a positive integer")


def test_largest_tensor_rolls_and_generates_but_does_not_run(tmp_path):
    path = write_doc(tmp_path / "s.json", _shape_doc([2**31 - 1]))
    for tool, extra in IR_TOOLS[:2]:
        result = run(tool, path, *extra, "-o", tmp_path / f"{tool}.yaml")
        assert result.exit_code == 0, result.stderr
    assert_refused(run("tk-run", path, "--seed", "0"), "tk-run", "total size limit",
                   "TILEKIT_MAX_TOTAL_BYTES")


@pytest.mark.parametrize("axes, words", [
    ({"k": 2**40}, "tensor size limit"),
    ({"k": 2**20, "l": 2**20}, "reduction domain"),
    ({"k": 10**40}, "longer than 40 digits"),
])
def test_huge_axis_extents(tmp_path, axes, words):
    doc = _shape_doc([8])
    body = " + ".join(axes)
    doc["ops"][0] = {"name": "a", "expr": f"y[i] max= x[i + {body}]", "pad": "-inf",
                     "axes": axes}
    for tool, extra in IR_TOOLS:
        assert_refused(run(tool, write_doc(tmp_path / "s.json", doc), *extra), tool, words)


def test_total_bytes_of_a_run(tmp_path):
    doc = _shape_doc([2**30])
    doc["tensors"]["z"] = {"shape": [2**30], "dtype": "float64"}
    doc["ops"] = [{"name": "a", "expr": "z[i] = float64(x[i])"},
                  {"name": "b", "expr": "y[i] = float32(z[i] * 2.0)"}]
    path = write_doc(tmp_path / "s.json", doc)
    assert_refused(run("tk-run", path, "--seed", "0"), "tk-run", "total size limit",
                   "(8,589,934,592 bytes)")


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e9", "12X", "9" * 30])
def test_broken_limit_variables_are_bad_input(tmp_path, monkeypatch, value):
    with env_limit(monkeypatch, "TILEKIT_MAX_TENSOR_ELEMENTS", value):
        assert_refused(run("tk-run", write_mlp(tmp_path), "--seed", "0"), "tk-run",
                       "TILEKIT_MAX_TENSOR_ELEMENTS", "not a positive whole number")


def test_raising_the_tensor_limit_leaves_the_run_budget(tmp_path, monkeypatch):
    path = write_doc(tmp_path / "s.json", _shape_doc([2**33]))
    with env_limit(monkeypatch, "TILEKIT_MAX_TENSOR_ELEMENTS", "16G"):
        assert_refused(run("tk-run", path, "--seed", "0"), "tk-run", "total size limit")


def test_every_limit_is_documented():
    text = (limits.__file__.replace("tilekit/limits.py", "docs/limits.md"))
    doc = open(text, encoding="utf-8").read()
    for limit in limits.ALL:
        assert limit.env in doc and f"{limit.default:,}" in doc, limit.env


# -- tk-import: folding and writing within the budget -------------------------------------

def _onnx(tmp_path, nodes, inits=(), out_shape=None, inputs=()):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", list(inputs),
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


def _shape_const(name, dims):
    from onnx import numpy_helper
    return numpy_helper.from_array(np.asarray(dims, dtype=np.int64), name)


@pytest.mark.parametrize("dims", [[2**40], [2**20, 2**20], [2**31], [2**62, 4]])
def test_constant_of_shape_bombs(tmp_path, dims):
    from onnx import helper
    model = _onnx(tmp_path, [helper.make_node("ConstantOfShape", ["s"], ["y"])],
                  [_shape_const("s", dims)])
    assert model.stat().st_size < 400
    assert_refused(run("tk-import", model, "-o", tmp_path / "m.yaml"), "tk-import",
                   "tensor size limit")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("op, inputs, consts", [
    ("Expand", ["v", "s"], {"v": np.ones(1, np.float32), "s": [2**40]}),
    ("Tile", ["v", "r"], {"v": np.ones(4, np.float32), "r": [2**40]}),
    ("Range", ["a", "b", "c"], {"a": np.float32(0), "b": np.float32(2**41),
                                "c": np.float32(1)}),
])
def test_growing_folds_are_checked_before_they_allocate(tmp_path, op, inputs, consts):
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(np.asarray(v, dtype=np.int64 if isinstance(v, list)
                                                else np.asarray(v).dtype), k)
             for k, v in consts.items()]
    model = _onnx(tmp_path, [helper.make_node(op, inputs, ["y"])], inits)
    assert_refused(run("tk-import", model, "-o", tmp_path / "m.yaml"), "tk-import",
                   "tensor size limit")


def test_many_fills_over_the_total_budget(tmp_path):
    from onnx import helper
    nodes = [helper.make_node("ConstantOfShape", ["s"], [f"c{i}"]) for i in range(6)]
    nodes.append(helper.make_node("Sum", [f"c{i}" for i in range(6)] + ["x"], ["y"]))
    from onnx import TensorProto
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**29])
    model = _onnx(tmp_path, nodes, [_shape_const("s", [2**29])], [2**29], inputs=[x])
    assert_refused(run("tk-import", model, "-o", tmp_path / "m.yaml"), "tk-import",
                   "total size limit")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("flag", ["x=1099511627776", "x=4294967296,4294967296,4294967296",
                                  "x=" + "9" * 40])
def test_shape_flags_within_the_budget(tmp_path, flag):
    from hostile_support import tiny_onnx
    model = tiny_onnx(tmp_path / "m.onnx")
    result = run("tk-import", model, "--shape", flag)
    assert_refused(result, "tk-import", "--shape")


def test_huge_graph_input(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40])
    model = _onnx(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [], [2**40], [x])
    assert_refused(run("tk-import", model), "tk-import", "tensor size limit")


# -- archives: headers first ---------------------------------------------------------------

def npy_header(shape, descr="<f4", pad_to=64) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)}, }}"
    header = header.ljust(pad_to - 11) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()


def zip_of(members: dict[str, bytes], deflate: bool = False) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED if deflate else
                         zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


LYING_HEADERS = {
    "claims_2^40": npy_header([2**40]),
    "claims_2^20x2^20": npy_header([2**20, 2**20]),
    "object_dtype": npy_header([2, 4], "|O"),
    "structured": npy_header([2, 4], "[('a', '<f4')]"),
    "huge_header": b"\x93NUMPY\x01\x00" + struct.pack("<H", 60000) + b" " * 60000,
    "truncated_data": npy_header([2, 4]) + b"\x00" * 8,
    "trailing_data": npy_header([2, 4]) + b"\x00" * 32 + b"appended",
    "not_npy": b"hello world",
}


@pytest.mark.parametrize("case", sorted(LYING_HEADERS))
def test_input_npy_header_is_checked_before_data(tmp_path, case):
    ir = write_mlp(tmp_path)
    path = tmp_path / "x.npy"
    path.write_bytes(LYING_HEADERS[case])
    assert_refused(run("tk-run", ir, "--input", f"x=@{path}"), "tk-run", "--input x")


def test_bytes_after_the_array_data_are_refused(tmp_path):
    """(numpy.load reads the header's count of bytes and ignores what follows: a file
    appended to, or two arrays concatenated, read as the first.)"""
    ir = write_mlp(tmp_path)
    path = tmp_path / "x.npy"
    path.write_bytes(LYING_HEADERS["trailing_data"])
    assert_refused(run("tk-run", ir, "--input", f"x=@{path}"), "tk-run", "--input x",
                   "has bytes after its 32 data bytes")


@pytest.mark.parametrize("case", sorted(LYING_HEADERS))
def test_input_npz_member_header_is_checked_before_data(tmp_path, case):
    ir = write_mlp(tmp_path)
    path = tmp_path / "in.npz"
    path.write_bytes(zip_of({"x.npy": LYING_HEADERS[case]}))
    assert_refused(run("tk-run", ir, "--inputs", path), "tk-run", "--inputs")


@pytest.mark.parametrize("case", sorted(LYING_HEADERS))
def test_weights_member_header_is_checked_before_data(tmp_path, case):
    ir = write_mlp(tmp_path)
    sidecar = tmp_path / "mlp.weights.npz"
    from hostile_support import B1, W2
    from tilekit.runtime.io import npz_bytes
    good = zipfile.ZipFile(io.BytesIO(npz_bytes({"b1": B1, "w2": W2})))
    members = {n: good.read(n) for n in good.namelist()}
    members["w1.npy"] = LYING_HEADERS[case]
    sidecar.write_bytes(zip_of(members))
    ir.write_text(ir.read_text().replace(json.loads(ir.read_text())["weights"]["sha256"],
                                         sha256(sidecar)))
    assert_refused(run("tk-run", ir, "--seed", "0"), "tk-run", "weights")


def test_zip_bomb_member_is_refused_unread(tmp_path):
    """A deflated member with a valid header for x (float32[2,4]) and 256 MiB of zeros
    after it: its declared size gives it away before a byte of data is inflated."""
    ir = write_mlp(tmp_path)
    path = tmp_path / "bomb.npz"
    # compresslevel 1: deflating the 256 MiB takes a quarter of the default level's time
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as member:
            member.write(npy_header([2, 4]))
            block = b"\x00" * (1 << 20)
            for _ in range(256):
                member.write(block)
    assert path.stat().st_size < 3 * 2**20
    assert_refused(run("tk-run", ir, "--inputs", path), "tk-run", "declares")


def test_npz_with_duplicate_and_foreign_members(tmp_path):
    ir = write_mlp(tmp_path)
    x = np.zeros((2, 4), np.float32)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, x)
    path = tmp_path / "dup.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", buf.getvalue())
        with pytest.warns(UserWarning):
            zf.writestr("x.npy", buf.getvalue())
    assert_refused(run("tk-run", ir, "--inputs", path), "tk-run", "appears twice")


def test_fifo_input_file_does_not_block(tmp_path):
    ir = write_mlp(tmp_path)
    os.mkfifo(tmp_path / "x.npy")
    done = threading.Event()

    def unblock():  # if tk-run opened the FIFO, this lets it finish instead of hanging
        if not done.wait(20):
            with open(tmp_path / "x.npy", "wb"):
                pass
    threading.Thread(target=unblock, daemon=True).start()
    result = run("tk-run", ir, "--input", f"x=@{tmp_path / 'x.npy'}")
    done.set()
    assert_refused(result, "tk-run", "not a regular file")


@pytest.mark.parametrize("expr, axes", [
    ("y[i] += x[i + k - 1000000000000]", {"k": 3}),
    ("y[i] max= x[i * 1000000000 + k]", {"k": 2}),
    ("y[i] += x[i + k * 1000000000]", {"k": 4}),
])
def test_huge_padding_is_refused_before_an_executor_pads(tmp_path, expr, axes):
    """Reads far outside a small tensor (declared pad) would make the executor pad it to
    the whole range read: the region read, padding included, is within the tensor budget."""
    doc = _shape_doc([8])
    doc["ops"][0] = {"name": "a", "expr": expr, "pad": "0" if "+=" in expr else "-inf",
                     "axes": axes}
    for tool, extra in IR_TOOLS:
        assert_refused(run(tool, write_doc(tmp_path / "s.json", doc), *extra), tool,
                       "tensor size limit")


@pytest.mark.parametrize("location, size, words", [
    ("big.bin", 10 * 2**30, "external data"),
    ("/dev/zero", None, "absolute path"),
    ("../../../../../../dev/zero", None, "outside"),
    ("zero.bin", None, "symbolic link"),
])
def test_external_data_is_bounded_and_contained(tmp_path, location, size, words):
    """External tensor data: onnx refuses absolute paths, escapes and links; tilekit bounds
    what the rest would read before onnx reads it."""
    from onnx import TensorProto, helper, numpy_helper
    if size:
        with open(tmp_path / location, "wb") as fh:
            fh.truncate(size)
    os.symlink("/dev/zero", tmp_path / "zero.bin")
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    model = _onnx(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [w], [4],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])])
    assert_refused(run("tk-import", model), "tk-import", words)


@pytest.mark.parametrize("op, length", [("Expand", 2**40), ("Expand", 2**20), ("Reshape", 1000),
                                        ("ConstantOfShape", 2**16)])
def test_declared_shape_inputs_are_bounded_before_onnx_inference(tmp_path, op, length):
    """A 200-byte model whose shape input is declared huge made ONNX's shape inference
    allocate tens of gigabytes (a shape of that rank): refused before inference."""
    from onnx import TensorProto, helper
    shape = helper.make_tensor_value_info("s", TensorProto.INT64, [length])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1])
    inputs = ["s"] if op == "ConstantOfShape" else ["x", "s"]
    model = _onnx(tmp_path, [helper.make_node(op, inputs, ["y"])], [], [3, 3, 3],
                  [shape] if op == "ConstantOfShape" else [x, shape])
    assert_refused(run("tk-import", model), "tk-import", "limit" if length > 2**31 else
                   "more than 64")


def test_rank_over_64_is_refused(tmp_path):
    path = write_doc(tmp_path / "s.json", _shape_doc([1] * 65))
    assert_refused(run("tk-run", path, "--seed", "0"), "tk-run", "65 dimensions")


# -- a loop's trip count -----------------------------------------------------------------

def test_a_constant_trip_count_over_the_budget_is_refused_before_the_first_iteration(
        tmp_path, monkeypatch):
    """A Loop with a trip count of 2**62 and no condition runs exactly that many iterations:
    the budget refuses it before the first (it used to stop at the budget, after minutes of
    iterations); a loop with a condition may stop early, so its iterations are counted as
    they run."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    vi = h.make_tensor_value_info
    body = h.make_graph([h.make_node("Identity", ["c_in"], ["c_out"]),
                         h.make_node("Identity", ["v_in"], ["v_out"])], "body",
                        [vi("i", T.INT64, []), vi("c_in", T.BOOL, []),
                         vi("v_in", T.FLOAT, [2, 3])],
                        [vi("c_out", T.BOOL, []), vi("v_out", T.FLOAT, [2, 3])])
    graph = h.make_graph([h.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "g",
                         [vi("x", T.FLOAT, [2, 3])], [vi("y", T.FLOAT, [2, 3])],
                         [nh.from_array(np.array(2 ** 62, np.int64), "n")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]),
              str(tmp_path / "loop.onnx"))
    assert run("tk-import", "loop.onnx", "-o", "loop.yaml", folder=tmp_path).exit_code == 0
    with env_limit(monkeypatch, "TILEKIT_MAX_LOOP_TRIPS", "1000000000000"):
        proc = spawn("tk-run", "loop.yaml", "--mode", "whole", "--seed", "0",
                     folder=tmp_path, timeout=60)
    assert_refused(proc, "tk-run", "4,611,686,018,427,387,904 iterations",
                   "TILEKIT_MAX_LOOP_TRIPS")
