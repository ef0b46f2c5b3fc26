"""Class 7: bad input is exit 2 with one located line, never an internal error (exit 1) and
never silently accepted.

Non-finite profile figures, integer literals out of range for their type, non-finite
tolerances, duplicate or undefined things in ONNX graphs, overlong or NUL-holding paths,
opaque attributes out of range, Gather indices out of range (and `--seed` keeping index
inputs in range), `.npz` members that are not `.npy` arrays, a closed stdout.
"""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest

from hostile_support import assert_refused, mlp_doc, run, spawn, tiny_onnx, write_doc, write_mlp
from tilekit.hw import builtin_dir

# -- profiles -----------------------------------------------------------------------------

FIGURES = [
    "  sm_count:              {value: 132, source: whitepaper}",
    "    capacity:         {value: 228, unit: KiB, source: cuda-guide}",
    "    bandwidth:   {value: 3.35, unit: TB/s, source: datasheet}",
    "    fp32:  {value: 66.9, unit: TFLOP/s, source: whitepaper}",
]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN", "1e999", "-1e999"])
@pytest.mark.parametrize("line", FIGURES, ids=["count", "bytes", "bandwidth", "rate"])
def test_non_finite_profile_figures(tmp_path, line, value):
    text = (builtin_dir() / "h100.yaml").read_text()
    assert line in text
    number = line.split("value: ")[1].split(",")[0]
    path = tmp_path / "p.yaml"
    path.write_text(text.replace(line, line.replace(f"value: {number},", f"value: {value},")))
    assert_refused(run("tk-hw", "validate", path), "tk-hw", "p.yaml:")


def test_non_finite_achievable_fraction(tmp_path):
    text = (builtin_dir() / "h100.yaml").read_text()
    import re
    path = tmp_path / "p.yaml"
    path.write_text(re.sub(r"(dram:\s*\{value: )[0-9.]+", r"\1.nan", text, count=1))
    assert_refused(run("tk-hw", "validate", path), "tk-hw")


# -- integer literals and tolerances -------------------------------------------------------

def _int_doc(dtype: str, expr: str) -> dict:
    return {"tilekit": 1, "model": "m", "stages": [{"name": "import"}], "inputs": ["x"],
            "outputs": ["y"], "tensors": {"x": {"shape": [4], "dtype": dtype, "role": "input"},
                                          "y": {"shape": [4], "dtype": dtype, "role": "output"}},
            "ops": [{"name": "a", "expr": expr}]}


@pytest.mark.parametrize("dtype, expr", [
    ("int8", "y[i] = x[i] + 300"),
    ("int8", "y[i] = x[i] * -129"),
    ("uint8", "y[i] = x[i] + 256"),
    ("uint8", "y[i] = max(x[i], -1)"),
    ("int16", "y[i] = select(x[i] > 0, x[i], 40000)"),
    ("int32", "y[i] = x[i] - 2147483649"),
    ("int8", "y[i] = 1000"),
    ("int8", "y[i] += x[i] // 500"),
    ("int64", "y[i] = x[i] + 9223372036854775808"),
    ("int64", "y[i] = x[i] + " + "9" * 30),
])
@pytest.mark.parametrize("tool, extra", [("tk-run", ["--seed", "0"]), ("tk-codegen", []),
                                         ("tk-roll", ["--hw", "h100"])])
def test_integer_literals_out_of_range(tmp_path, dtype, expr, tool, extra):
    doc = _int_doc(dtype, expr)
    assert_refused(run(tool, write_doc(tmp_path / "m.json", doc), *extra), tool,
                   "ops[0].expr", "out of")


@pytest.mark.parametrize("dtype, expr", [("int8", "y[i] = x[i] + 127"),
                                         ("int8", "y[i] = int8(float32(x[i]) * 300.0)"),
                                         ("uint8", "y[i] = x[i] % 255"),
                                         ("int64", "y[i] = x[i] + 9223372036854775807")])
def test_integer_literals_in_range_run(tmp_path, dtype, expr):
    result = run("tk-run", write_doc(tmp_path / "m.json", _int_doc(dtype, expr)), "--seed", "0")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("flag", ["x=300", "x=-129", "x=1,2,3,1000", "x=" + "9" * 50,
                                  "x=1e3", "x=0x10"])
def test_input_literals_out_of_range(tmp_path, flag):
    path = write_doc(tmp_path / "m.json", _int_doc("int8", "y[i] = x[i]"))
    assert_refused(run("tk-run", path, "--input", flag), "tk-run", "--input x")


@pytest.mark.parametrize("dtype, flag", [("float32", "x=3.5e38"), ("float32", "x=1,2,3,-1e300"),
                                         ("float16", "x=70000"), ("bfloat16", "x=1e39")])
def test_float_input_literals_beyond_the_dtype(tmp_path, dtype, flag):
    """A finite value the dtype cannot hold is refused, not cast to infinity (numpy's
    overflow warning had gone to stderr before the NaN check's error: three lines)."""
    path = write_doc(tmp_path / "m.json", _int_doc(dtype, "y[i] = x[i]"))
    assert_refused(run("tk-run", path, "--input", flag), "tk-run", "--input x",
                   f"out of range for {dtype}")


@pytest.mark.parametrize("flag, value", [("--rtol", "nan"), ("--rtol", "inf"),
                                         ("--atol", "-1"), ("--atol", "NaN"),
                                         ("--rtol", "abc"), ("--rtol", "-inf"),
                                         ("--atol", "1e999")])
def test_tolerances_must_be_finite(tmp_path, flag, value):
    assert_refused(run("tk-run", write_mlp(tmp_path), "--seed", "0", "--check", flag, value),
                   "tk-run", flag)


# -- ONNX graphs ---------------------------------------------------------------------------

def _save(tmp_path, nodes, inputs, outputs, inits=(), value_info=()):
    import onnx
    from onnx import helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits),
                              value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _vi(name, elem=1, shape=(4,)):
    from onnx import helper
    return helper.make_tensor_value_info(name, elem, list(shape))


def test_two_nodes_write_one_tensor(tmp_path):
    from onnx import helper
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["t"]),
                            helper.make_node("Neg", ["x"], ["t"]),
                            helper.make_node("Abs", ["t"], ["y"])], [_vi("x")], [_vi("y")])
    assert_refused(run("tk-import", path), "tk-import", "defined twice")


def test_node_writes_a_graph_input(tmp_path):
    from onnx import helper
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["x"]),
                            helper.make_node("Abs", ["x"], ["y"])], [_vi("x")], [_vi("y")])
    assert_refused(run("tk-import", path), "tk-import", "defined twice")


def test_duplicate_graph_inputs(tmp_path):
    from onnx import helper
    path = _save(tmp_path, [helper.make_node("Add", ["x", "x"], ["y"])],
                 [_vi("x"), _vi("x")], [_vi("y")])
    assert_refused(run("tk-import", path), "tk-import", "defined twice")


def test_duplicate_initializers(tmp_path):
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    path = _save(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")],
                 [_vi("y")], [w, w])
    assert_refused(run("tk-import", path), "tk-import", "defined twice")


def test_node_writes_an_initializer(tmp_path):
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["w"]),
                            helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")],
                 [_vi("y")], [w])
    assert_refused(run("tk-import", path), "tk-import", "defined twice")


def test_initializer_as_the_default_of_an_input_is_fine(tmp_path):
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    path = _save(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x"), _vi("w")],
                 [_vi("y")], [w])
    assert run("tk-import", path, "-o", tmp_path / "m.yaml").exit_code == 0


@pytest.mark.parametrize("elem", [0, 999, 8, -1])
def test_undefined_or_unsupported_element_types(tmp_path, elem):
    from onnx import helper
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", elem)],
                 [_vi("y", elem)])
    assert_refused(run("tk-import", path), "tk-import", "element type")


@pytest.mark.parametrize("elem", [0, 999])
def test_undefined_initializer_type(tmp_path, elem):
    from onnx import TensorProto, helper
    init = TensorProto(name="w", data_type=elem, dims=[4], raw_data=b"\x00" * 16)
    path = _save(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")],
                 [_vi("y")], [init])
    assert_refused(run("tk-import", path), "tk-import", "element type")


def test_undefined_type_of_an_intermediate(tmp_path):
    from onnx import helper
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["t"]),
                            helper.make_node("Cast", ["t"], ["y"], to=999)], [_vi("x")],
                 [_vi("y")])
    assert_refused(run("tk-import", path), "tk-import", "element type")


@pytest.mark.parametrize("dims", [[0], [-3], [4, 0]])
def test_zero_or_negative_dims_from_inference(tmp_path, dims):
    from onnx import helper, numpy_helper
    shape = numpy_helper.from_array(np.asarray(dims, np.int64), "s")
    path = _save(tmp_path, [helper.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x")],
                 [_vi("y", 1, ())], [shape])
    assert_refused(run("tk-import", path), "tk-import")


# -- paths ---------------------------------------------------------------------------------

LONG = "p" * 5000
LONG_PART = "q" * 300


@pytest.mark.parametrize("tool, args, flag", [
    ("tk-run", ["{long}"], None),
    ("tk-run", ["{ir}", "--seed", "0", "-o", "{long}"], "-o"),
    ("tk-run", ["{ir}", "--seed", "0", "-o", "{part}"], "-o"),
    ("tk-run", ["{ir}", "--input", "x=@{long}"], "--input"),
    ("tk-run", ["{ir}", "--inputs", "{part}"], "--inputs"),
    ("tk-roll", ["{ir}", "--hw", "{long}.yaml"], None),
    ("tk-roll", ["{ir}", "--hw", "h100", "-o", "{part}"], "-o"),
    ("tk-codegen", ["{ir}", "--emit-dir", "{long}"], "--emit-dir"),
    ("tk-codegen", ["{part}"], None),
    ("tk-import", ["{long}"], None),
    ("tk-import", ["{model}", "--weights", "{part}"], "--weights"),
    ("tk-import", ["{model}", "-o", "{long}"], "-o"),
    ("tk-hw", ["show", "{long}/x.yaml"], None),
])
def test_overlong_paths(tmp_path, tool, args, flag):
    names = {"long": str(tmp_path / LONG), "part": str(tmp_path / LONG_PART),
             "ir": str(write_mlp(tmp_path)), "model": str(tiny_onnx(tmp_path / "m.onnx"))}
    line = assert_refused(run(tool, *[a.format(**names) for a in args]), tool, "too long")
    if flag:
        assert flag in line


@pytest.mark.parametrize("tool, args", [
    ("tk-run", ["a\x00b"]), ("tk-run", ["{ir}", "--seed", "0", "-o", "o\x00.npz"]),
    ("tk-roll", ["{ir}", "--hw", "a\x00.yaml"]), ("tk-import", ["m\x00.onnx"]),
    ("tk-codegen", ["{ir}", "--emit-dir", "d\x00"]),
])
def test_nul_in_paths(tmp_path, tool, args):
    ir = str(write_mlp(tmp_path))
    assert_refused(run(tool, *[a.format(ir=ir) for a in args]), tool, "NUL")


# -- opaque ops ----------------------------------------------------------------------------

def _opaque_doc(kind: str, attrs: dict, ins=None, shapes=None) -> dict:
    shapes = shapes or {"x": [1, 4, 5, 5], "w": [4, 2, 3, 3], "y": [1, 2, 11, 11]}
    return {"tilekit": 1, "model": "m", "stages": [{"name": "import"}],
            "inputs": ["x", "w"], "outputs": ["y"],
            "tensors": {"x": {"shape": shapes["x"], "dtype": "float32", "role": "input"},
                        "w": {"shape": shapes["w"], "dtype": "float32", "role": "input"},
                        "y": {"shape": shapes["y"], "dtype": "float32", "role": "output"}},
            "ops": [{"name": "op", "kind": "opaque",
                     "opaque": {"type": kind, "inputs": ins or ["x", "w"], "outputs": ["y"],
                                "attrs": attrs}}]}


CT = {"strides": [2, 2], "dilations": [2, 2], "group": 1, "pads_begin": [0, 0],
      "output_shape": [1, 2, 11, 11]}


@pytest.mark.parametrize("attrs, word", [
    ({**CT, "strides": [0, 2]}, "strides"),
    ({**CT, "strides": [2]}, "strides"),
    ({**CT, "dilations": [2, -1]}, "dilations"),
    ({**CT, "group": 0}, "group"),
    ({**CT, "group": 3}, "group"),
    ({**CT, "pads_begin": [-1, 0]}, "pads_begin"),
    ({**CT, "output_shape": [1, 2, 0, 11]}, "output_shape"),
    ({k: v for k, v in CT.items() if k != "strides"}, "strides"),
    ({**CT, "strides": "2"}, "strides"),
])
def test_conv_transpose_attrs(tmp_path, attrs, word):
    path = write_doc(tmp_path / "m.json", _opaque_doc("ConvTranspose", attrs))
    for tool, extra in (("tk-run", ["--seed", "0"]), ("tk-codegen", [])):
        assert_refused(run(tool, path, *extra), tool, f"attrs.{word}")


def _gather_doc(rows: int = 10, attrs: dict | None = None, kind: str = "Gather") -> dict:
    return {"tilekit": 1, "model": "m", "stages": [{"name": "import"}],
            "weights": {"file": "w.npz", "sha256": "0" * 64},
            "inputs": ["ids"], "outputs": ["y"],
            "tensors": {"ids": {"shape": [3], "dtype": "int64", "role": "input"},
                        "table": {"shape": [rows, 4], "dtype": "float32", "role": "weight"},
                        "y": {"shape": [3, 4], "dtype": "float32", "role": "output"}},
            "ops": [{"name": "g", "kind": "opaque",
                     "opaque": {"type": kind, "inputs": ["table", "ids"], "outputs": ["y"],
                                "attrs": attrs if attrs is not None else {"axis": 0}}}]}


def _with_table(tmp_path, doc):
    from hostile_support import sha256
    from tilekit.runtime.io import npz_bytes
    rows = doc["tensors"]["table"]["shape"][0]
    side = tmp_path / "w.npz"
    side.write_bytes(npz_bytes({"table": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)}))
    doc["weights"]["sha256"] = sha256(side)
    return write_doc(tmp_path / "m.json", doc)


@pytest.mark.parametrize("attrs, word", [({"axis": 2}, "axis"), ({"axis": -3}, "axis"),
                                         ({"axis": "0"}, "axis"), ({"axis": 0.5}, "axis")])
def test_gather_axis_out_of_range(tmp_path, attrs, word):
    path = _with_table(tmp_path, _gather_doc(attrs=attrs))
    assert_refused(run("tk-run", path, "--seed", "0"), "tk-run", f"attrs.{word}")


@pytest.mark.parametrize("ids", ["10,0,1", "0,-11,1", "99999,0,0", "-9223372036854775808,0,0"])
def test_gather_indices_out_of_range_at_run(tmp_path, ids):
    path = _with_table(tmp_path, _gather_doc())
    assert_refused(run("tk-run", path, "--input", f"ids={ids}"), "tk-run", "ops[0] (g)",
                   "out of range")


@pytest.mark.parametrize("ids", ["9,0,1", "-10,0,-1"])
def test_gather_indices_in_range_run(tmp_path, ids):
    path = _with_table(tmp_path, _gather_doc())
    assert run("tk-run", path, "--input", f"ids={ids}").exit_code == 0


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_seed_fills_index_inputs_within_range(tmp_path, rows, seed):
    path = _with_table(tmp_path, _gather_doc(rows=rows))
    result = run("tk-run", path, "--seed", seed)
    assert result.exit_code == 0, result.stderr


def test_seed_for_gather_elements(tmp_path):
    doc = _gather_doc(rows=2, kind="GatherElements")
    doc["tensors"]["ids"]["shape"] = [3, 4]
    path = _with_table(tmp_path, doc)
    for seed in range(5):
        assert run("tk-run", path, "--seed", seed).exit_code == 0


@pytest.mark.parametrize("kind, attrs, word", [
    ("TopK", {"axis": 0, "k": 0}, "k"), ("TopK", {"axis": 0, "k": 99}, "k"),
    ("TopK", {"axis": 7, "k": 1}, "axis"), ("ArgMax", {"axis": 0, "keepdims": 2}, "keepdims"),
    ("ArgMin", {"axis": 5}, "axis"), ("Resize", {"sizes": [0, 4]}, "sizes"),
    ("Resize", {"sizes": [2]}, "sizes"), ("ScatterElements", {"axis": 0, "reduction": "xor"},
                                          "reduction"),
])
def test_other_opaque_attrs(tmp_path, kind, attrs, word):
    doc = _gather_doc(kind=kind, attrs=attrs)
    path = _with_table(tmp_path, doc)
    assert_refused(run("tk-codegen", path), "tk-codegen", f"attrs.{word}")


# -- archives and stdout -----------------------------------------------------------------

@pytest.mark.parametrize("member", ["x.txt", "x", "x.npy/", "../x.npy", "x.NPY"])
def test_npz_member_that_is_not_npy(tmp_path, member):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros((2, 4), np.float32))
    path = tmp_path / "in.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, buf.getvalue())
    result = run("tk-run", write_mlp(tmp_path), "--inputs", path)
    assert_refused(result, "tk-run", "--inputs")


@pytest.mark.parametrize("tool, args", [
    ("tk-roll", ["{ir}", "--hw", "h100"]), ("tk-codegen", ["{ir}"]),
    ("tk-run", ["{ir}", "--seed", "0", "-o", "-"]), ("tk-import", ["{model}"]),
    ("tk-hw", ["list"]), ("tk-run", ["{ir}", "--seed", "0"]),
])
def test_closed_stdout(tmp_path, tool, args):
    names = {"ir": write_mlp(tmp_path), "model": tiny_onnx(tmp_path / "m.onnx")}
    proc = spawn(tool, *[a.format(**names) for a in args], folder=tmp_path,
                 stdout=None, stderr=-1, preexec_fn=lambda: os.close(1))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith(f"{tool}: error: ") and "stdout" in err
    assert not (tmp_path / "m.weights.npz").exists()


@pytest.mark.parametrize("text", [b"\xff\xfe" + "tilekit: 1".encode("utf-16-le"),
                                  b"\xef\xbb\xbf{\"tilekit\": 1}", b"tilekit: 1\n\xc3\x28",
                                  b"\x00" * 100, b"tilekit: 1\nmodel: \x1b[2J\n"])
def test_encodings_and_control_bytes(tmp_path, text):
    path = tmp_path / "m.yaml"
    path.write_bytes(text)
    assert_refused(run("tk-codegen", path), "tk-codegen")


# -- malformed nodes that ONNX's own checks may miss ---------------------------------------

def _node_model(tmp_path, node, in_shape, out_shape, inits=()):
    return _save(tmp_path, [node], [_vi("x", 1, in_shape)], [_vi("y", 1, out_shape)], inits)


@pytest.mark.parametrize("make, in_shape, out_shape", [
    (lambda h: h.make_node("ReduceMean", ["x"], ["y"], axes=[2], keepdims=2**40),
     [1, 2, 3, 4], [1, 2, 4]),
    (lambda h: h.make_node("Transpose", ["x"], ["y"], perm=[0, 5]), [2, 3], [3, 2]),
    (lambda h: h.make_node("Transpose", ["x"], ["y"], perm=[0, 0]), [2, 3], [3, 2]),
    (lambda h: h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[-1, 2]),
     [1, 1, 4, 4], [1, 1, 2, 2]),
    (lambda h: h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[0, 2]), [1, 1, 4, 4],
     [1, 1, 4, 3]),
    (lambda h: h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[2**40] * 4),
     [1, 1, 4, 4], [1, 1, 4, 4]),
    (lambda h: h.make_node("Softmax", ["x"], ["y"], axis=1), [2, 20], [2, 1]),
    (lambda h: h.make_node("Flatten", ["x"], ["y"], axis=9), [2, 3], [6]),
])
def test_malformed_nodes_are_bad_input(tmp_path, make, in_shape, out_shape):
    from onnx import helper
    path = _node_model(tmp_path, make(helper), in_shape, out_shape)
    result = run("tk-import", path, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ": warning: " not in ln]
    assert len(lines) == 1 and lines[0].startswith("tk-import: error: "), result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "m.yaml").exists()


def test_lenient_shapes_is_an_explicit_choice(tmp_path):
    """A declared output shape that contradicts the op: refused as malformed; with
    --lenient-shapes the declared shapes are trusted, and the node that cannot produce them
    is the one located error."""
    from onnx import helper
    path = _node_model(tmp_path, helper.make_node("Relu", ["x"], ["y"]), [2, 3], [2, 5])
    assert_refused(run("tk-import", path), "tk-import", "a declared shape contradicts",
                   "--lenient-shapes")
    assert_refused(run("tk-import", path, "--lenient-shapes", "-o", tmp_path / "m.yaml"),
                   "tk-import", "node 0 'Relu_0'", "cannot broadcast")


def test_source_model_that_onnxruntime_cannot_run(tmp_path):
    """The IR is valid, its source model is not runnable: --check reports it, exit 2."""
    from onnx import helper
    from hostile_support import sha256
    bad = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", 1, [2, 4])],
                [_vi("y", 7, [2, 4])])  # declares an int64 output for a float Relu
    doc = mlp_doc()
    doc["source"] = {"onnx": bad.name, "sha256": sha256(bad),
                     "inputs": {}, "outputs": {}}
    ir = write_mlp(tmp_path, doc)
    result = run("tk-run", ir, "--seed", "0", "--check")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("tk-run: error: source.onnx: onnxruntime cannot")


@pytest.mark.parametrize("name, field", [("w", "graph.initializer[0].name"),
                                         ("g", "graph.name")])
def test_names_that_are_not_utf8(tmp_path, name, field):
    """protobuf hands invalid UTF-8 text back as bytes: refused at the field, exit 2."""
    model = tiny_onnx(tmp_path / "m.onnx", w="wwwwww")
    data = bytearray(model.read_bytes())
    at = data.rindex(b"wwwwww") if name == "w" else data.rindex(b"\x12\x01g") + 2
    data[at] = 0xFF
    model.write_bytes(bytes(data))
    assert_refused(run("tk-import", model, folder=tmp_path), "tk-import", field, "UTF-8")


@pytest.mark.parametrize("out", [".", "/", ".."])
def test_import_to_a_directory(tmp_path, out):
    model = tiny_onnx(tmp_path / "m.onnx")
    assert_refused(run("tk-import", model, "-o", out, folder=tmp_path), "tk-import",
                   f"-o {out}", "directory")


@pytest.mark.parametrize("tool, flags", [("tk-ram", ["--hw", "h100", "--svg", ""]),
                                         ("tk-codegen", ["--emit-dir", ""]),
                                         ("tk-run", ["--bench", str(10 ** 9)]),
                                         ("tk-run", ["--bench", "3", "--warmup", str(10 ** 9)])])
def test_empty_paths_and_endless_counts(tmp_path, tool, flags):
    """An empty --svg or --emit-dir was silently ignored; a billion timed runs never ended."""
    ir = write_mlp(tmp_path)
    assert_refused(run(tool, ir, *flags, folder=tmp_path), tool, flags[-2])


@pytest.mark.parametrize("kind, indices, updates", [
    ("ScatterElements", [3, 5], [4, 5]),     # updates must have the indices' shape
    ("ScatterND", [2, 1], [3, 5]),           # updates must be indices[:-1] + data[1:]: [2, 5]
])
def test_scatter_updates_of_another_shape(tmp_path, kind, indices, updates):
    """onnxruntime refuses these models; so does tk-import, naming the op."""
    from onnx import helper, numpy_helper
    ids = numpy_helper.from_array(np.zeros(indices, np.int64), "ids")
    path = _save(tmp_path, [helper.make_node(kind, ["x", "ids", "u"], ["y"])],
                 [_vi("x", shape=(4, 5)), _vi("u", shape=updates)], [_vi("y", shape=(4, 5))],
                 inits=[ids])
    err = assert_refused(run("tk-import", path), "tk-import")
    assert "updates" in err


def test_a_cache_that_cannot_be_written(tmp_path, monkeypatch):
    """Compiled CPU code is built into TILEKIT_CACHE: a path under a file is the user's to
    fix, said in one line naming the variable."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TILEKIT_CACHE", str(blocker / "cache"))
    assert_refused(run("tk-run", write_mlp(tmp_path), "--seed", "0", "--mode", "compiled"),
                   "tk-run", "TILEKIT_CACHE")


def test_a_cxx_that_names_no_program(tmp_path, monkeypatch):
    """CXX naming nothing is no compiler: tk-run's default runs the reference executor, and
    --mode compiled says what is missing (it was a FileNotFoundError, exit 1)."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    ir = write_mlp(tmp_path)
    assert run("tk-run", ir, "--seed", "0").exit_code == 0
    assert_refused(run("tk-run", ir, "--seed", "0", "--mode", "compiled"), "tk-run",
                   "C++ compiler")
