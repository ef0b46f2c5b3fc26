"""tk-import as a command: outputs, sidecar paths, determinism, naming and clean errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from clirun import run_in
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import onnx_models  # noqa: E402

from tilekit.cli.tk_import import main  # noqa: E402
from tilekit.errors import UnsupportedError  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402
from tilekit.onnx.names import NameTable, sanitize  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def run(args, cwd: Path, stdin: bytes | None = None):
    return run_in(main, args, cwd, stdin)


@pytest.fixture
def mlp_file(tmp_path) -> Path:
    path = tmp_path / "mixer.onnx"
    onnx.save(onnx_models.mlp_mixer_block(), str(path))
    return path


def test_writes_ir_and_sidecar_beside_output(tmp_path, mlp_file):
    out = tmp_path / "ir" / "mixer.yaml"
    out.parent.mkdir()
    result = run([str(mlp_file), "-o", str(out)], tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert doc["weights"]["file"] == "mixer.weights.npz"
    assert doc["source"]["onnx"] == "../mixer.onnx"
    assert doc["stages"] == [{"name": "import", "options": {"opset": 17}}]
    weights = np.load(out.parent / "mixer.weights.npz")
    assert sorted(weights.files) == sorted(n for n, t in doc["tensors"].items()
                                           if t.get("role") == "weight")


def test_stdout_puts_sidecar_in_cwd_named_after_model(tmp_path, mlp_file):
    work = tmp_path / "work"
    work.mkdir()
    result = run([str(mlp_file)], work)
    assert result.exit_code == 0
    doc = yaml.safe_load(result.stdout)
    assert doc["weights"]["file"] == "mixer.weights.npz"
    assert (work / "mixer.weights.npz").is_file()
    assert doc["source"]["onnx"] == "../mixer.onnx"


def test_weights_flag_and_json_format(tmp_path, mlp_file):
    result = run([str(mlp_file), "--weights", "data/w.npz", "--format", "json", "-o",
                  "m.json"], tmp_path)
    assert result.exit_code != 0  # folder data/ does not exist
    (tmp_path / "data").mkdir()
    result = run([str(mlp_file), "--weights", "data/w.npz", "--format", "json", "-o",
                  "m.json"], tmp_path)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "m.json").read_text()
    assert text.startswith("{") and '"file": "data/w.npz"' in text


def test_stdin_model(tmp_path, mlp_file):
    result = run(["-", "-o", "m.yaml"], tmp_path, stdin=mlp_file.read_bytes())
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert "onnx" not in doc["source"] and len(doc["source"]["sha256"]) == 64


def test_output_is_byte_deterministic(tmp_path):
    model = LIGHT / "light_squeezenet.onnx"
    first = []
    for _ in range(2):
        result = run([str(model), "-o", "s.yaml"], tmp_path)
        assert result.exit_code == 0
        first.append(((tmp_path / "s.yaml").read_bytes(),
                      (tmp_path / "s.weights.npz").read_bytes()))
    assert first[0] == first[1]


def test_symbolic_input_becomes_a_symbol_or_takes_a_shape(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "dyn.onnx"
    onnx.save(model, str(path))
    result = run([str(path), "-o", "s.yaml", "--dim", "batch=1..64:8"], tmp_path)
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load((tmp_path / "s.yaml").read_text())
    assert doc["tilekit"] == 2
    assert doc["dims"] == {"batch": {"min": 1, "max": 64, "likely": [8]}}
    assert doc["tensors"]["x"]["shape"] == ["batch", 4]
    result = run([str(path), "--shape", "x=3,4", "-o", "d.yaml"], tmp_path)
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load((tmp_path / "d.yaml").read_text())
    assert doc["tilekit"] == 1 and "dims" not in doc  # a static module stays format 1
    assert doc["tensors"]["x"]["shape"] == [3, 4]
    assert doc["stages"][0]["options"]["shapes"] == {"x": [3, 4]}
    result = run([str(path), "--dim", "batch=5", "-o", "e.yaml"], tmp_path)
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load((tmp_path / "e.yaml").read_text())
    assert doc["tensors"]["x"]["shape"] == [5, 4] and doc["stages"][0]["options"]["dims"] == {
        "batch": 5}
    assert run([str(path), "--shape", "x=three"], tmp_path).exit_code == 2
    assert run([str(path), "--shape", "nope=1,4"], tmp_path).exit_code == 2


@pytest.mark.parametrize("flag,message", [
    ("nope=1..8", "--dim names 'nope', which is not an open dimension"),
    ("batch=8..2", "1 <= MIN <= LIKELY <= MAX"),
    ("batch", "cannot read --dim"),
    ("batch=1..8:9", "1 <= MIN <= LIKELY <= MAX"),
    ("batch=1..2", "fewer than three sizes"),
])
def test_bad_dim_flags_are_one_line_errors(tmp_path, flag, message):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = run([str(path), "--dim", flag, "-o", "o.yaml"], tmp_path)
    assert result.exit_code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "o.yaml").exists()


@pytest.mark.parametrize("content,message", [
    (None, "no such file"), (b"", "empty file"), (b"\x08\x07\x12\xff\xff\xff", "truncated"),
    (b"tilekit: 1\nmodel: m\n", "not an ONNX model"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    result = run([str(path)], tmp_path)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_truncated_real_model(tmp_path):
    data = (LIGHT / "light_resnet50.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    result = run([str(path)], tmp_path)
    assert result.exit_code == 2 and "cut.onnx" in result.stderr


def test_unsupported_op_names_node_type_opset_and_known_ops(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("Hardmax", ["r"], ["y"], name="hm")],
                              "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "u.onnx"
    onnx.save(model, str(path))
    result = run([str(path)], tmp_path)
    assert result.exit_code == 2
    err = result.stderr
    assert "u.onnx: node 1 'hm'" in err and "'Hardmax' (opset 13)" in err
    assert "supported op types" in err and "Conv" in err
    with pytest.raises(UnsupportedError):
        import_model(model)


def test_unsupported_attribute_is_refused(tmp_path):
    model = onnx_models.lstm_model()
    model.graph.node[0].attribute.append(helper.make_attribute("mystery", 1))
    with pytest.raises(UnsupportedError, match="mystery"):
        import_model(model)


def test_list_ops(tmp_path):
    result = run(["--list-ops"], tmp_path)
    assert result.exit_code == 0
    assert "LSTM" in result.stdout and "Conv" in result.stdout


def test_shim_runs_without_installation(tmp_path, mlp_file):
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "tk-import"), "--version"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and "tk-import" in proc.stdout


# -- naming ------------------------------------------------------------------------------

def test_sanitize_keeps_names_readable():
    assert sanitize("gpu_0/data_0") == "gpu_0_data_0"
    assert sanitize("conv1/7x7_s2_w_0") == "conv1_7x7_s2_w_0"
    assert sanitize("onnx::Add_5") == "onnx_Add_5"
    assert sanitize("1234") == "t1234"
    assert sanitize("") == "t"


def test_name_table_makes_unique_stable_names():
    table = NameTable()
    assert table.claim("a/b") == "a_b"
    assert table.claim("a_b") == "a_b_1"
    assert table.claim("a/b") == "a_b"
    assert table.fresh("a_b") == "a_b_2"


def test_colliding_onnx_names_stay_distinct():
    x = helper.make_tensor_value_info("a/b", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("a_b", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["a/b"], ["a_b"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = import_model(model).module
    assert m.inputs == ("a_b",) and m.outputs == ("a_b_1",)
    assert m.ops[0].expr == "a_b_1[i] = max(a_b[i], 0)"
    assert m.ops[0].name == "Relu_0" and m.ops[0].origin == "Relu_0"


def test_graph_output_that_is_an_input_or_constant_gets_a_copy():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"]),
                               helper.make_node("Constant", [], ["c"], value=numpy_helper
                                                .from_array(np.ones(2, np.float32)))],
                              "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                       [2]), c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = import_model(model).module
    assert m.outputs == ("y", "c")
    assert [op.expr for op in m.ops] == ["y[i] = x[i]", "c[i] = c_value[i]"]


@pytest.mark.parametrize("args, where", [
    (["--weights", "w1.npz", "-o", "missing/x.yaml"], "folder 'missing' does not exist"),
    (["-o", "./mixer.onnx"], "refusing to overwrite the input file"),
    (["-o", "sub"], "is a directory"),
    (["--weights", "mixer.onnx", "-o", "m.yaml"], "refusing to overwrite the input file"),
    (["--weights", "m.yaml", "-o", "m.yaml"], "would overwrite the IR output"),
])
def test_bad_output_paths_are_refused_before_anything_is_written(tmp_path, mlp_file, args,
                                                                    where):
    (tmp_path / "sub").mkdir()
    model_bytes = mlp_file.read_bytes()
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run([mlp_file.name, *args], tmp_path)
    assert result.exit_code == 2
    assert where in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no sidecar, no temp file
    assert mlp_file.read_bytes() == model_bytes
