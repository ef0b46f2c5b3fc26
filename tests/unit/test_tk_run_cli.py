"""tk-run end to end: results, files, exit codes and one-line errors.

Most cases run the command in process (tests/clirun.py: the same entry point, exit code,
stdout and stderr, without a Python start-up each); those about the process itself (a real
stdin, binary stdout, bin/tk-run, a pipe between two commands) start bin/tk-run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clirun import completed
from tilekit.cli import tk_run as tk_run_command
from tilekit.runtime.io import npz_bytes

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "run"
TK_RUN = ROOT / "bin" / "tk-run"
ZEROS = "0" * 64
ONES = "1" * 64

W1 = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
B1 = np.linspace(-0.5, 0.5, 8, dtype=np.float32)
W2 = np.linspace(1, -1, 24, dtype=np.float32).reshape(8, 3)


def tk_run(*args, cwd=None, stdin: bytes | None = None, env=None) -> subprocess.CompletedProcess:
    """`tk-run args` in process."""
    return completed(tk_run_command.main, args, cwd, stdin, env)


def tk_run_process(*args, cwd=None, stdin: bytes | None = None,
                   env=None) -> subprocess.CompletedProcess:
    """`bin/tk-run args` as a process."""
    return subprocess.run([sys.executable, str(TK_RUN), *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=120)


def text(proc, stream="stderr") -> str:
    return getattr(proc, stream).decode()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install(name: str, folder: Path, weights: dict | None = None, onnx_digest: str | None = None
            ) -> Path:
    """Copy tests/data/run/<name> into `folder` with its weights sidecar and checksums."""
    ir = (DATA / name).read_text()
    if weights is not None:
        sidecar = folder / f"{Path(name).stem}.weights.npz"
        sidecar.write_bytes(npz_bytes(weights))
        ir = ir.replace(ZEROS, sha256(sidecar))
    if onnx_digest is not None:
        ir = ir.replace(ONES, onnx_digest)
    path = folder / name
    path.write_text(ir)
    return path


@pytest.fixture
def mlp(tmp_path) -> Path:
    return install("mlp.yaml", tmp_path, {"w1": W1, "b1": B1, "w2": W2})


def mlp_reference(x):
    return np.maximum(x @ W1 + B1, 0) @ W2


def assert_one_line_error(proc, *words):
    err = text(proc)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tk-run: error: "), err
    for word in words:
        assert word in err, err


# -- happy paths -------------------------------------------------------------------------

def test_run_with_literal_input_and_output_file(mlp, tmp_path):
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    out = tmp_path / "out.npz"
    proc = tk_run_process(mlp, "--input", "x=" + ",".join(str(v) for v in x.ravel()), "-o", out)
    assert proc.returncode == 0, text(proc)
    assert re.match(r"y: float32\[2,3\]  min \S+  max \S+  mean \S+\n$", text(proc, "stdout"))
    with np.load(out) as got:
        assert got.files == ["y"]
        np.testing.assert_allclose(got["y"], mlp_reference(x), rtol=1e-5, atol=1e-6)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_npy_input_and_stdin_ir(mlp, tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 4), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    # Through stdin, the weights path is relative to the current directory.
    proc = tk_run_process("--input", "x=@x.npy", "-o", "out.npz", cwd=tmp_path,
                          stdin=mlp.read_bytes())
    assert proc.returncode == 0, text(proc)
    with np.load(tmp_path / "out.npz") as got:
        np.testing.assert_allclose(got["y"], mlp_reference(x), rtol=1e-5, atol=1e-6)


def test_seed_is_deterministic_and_outputs_are_byte_identical(mlp, tmp_path):
    for name in ("a.npz", "b.npz"):
        assert tk_run(mlp, "--seed", 7, "-o", tmp_path / name).returncode == 0
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    assert tk_run(mlp, "--seed", 8, "-o", tmp_path / "c.npz").returncode == 0
    assert (tmp_path / "a.npz").read_bytes() != (tmp_path / "c.npz").read_bytes()


def test_output_to_stdout_moves_results_to_stderr(mlp):
    proc = tk_run_process(mlp, "--seed", 1, "-o", "-")
    assert proc.returncode == 0
    assert proc.stdout.startswith(b"PK") and "y: float32[2,3]" in text(proc)


def test_inputs_npz_and_quiet(tmp_path):
    ir = install("softmax.yaml", tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 5), dtype=np.float32)
    mask = np.eye(3, 5, dtype=bool)
    np.savez(tmp_path / "in.npz", x=x, mask=mask)
    proc = tk_run(ir, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "o.npz", "--quiet")
    assert proc.returncode == 0 and proc.stdout == b"" and proc.stderr == b""
    with np.load(tmp_path / "o.npz") as got:
        z = np.exp(x - x.max(1, keepdims=True))
        np.testing.assert_allclose(got["y"], z / z.sum(1, keepdims=True), rtol=1e-6)
        np.testing.assert_array_equal(got["count"], [1, 1, 1])


def test_bench_output(mlp):
    proc = tk_run(mlp, "--seed", 0, "--bench", 5, "--warmup", 2)
    assert proc.returncode == 0, text(proc)
    line = text(proc, "stdout").splitlines()[-1]
    assert re.match(r"bench: 5 runs after 2 warm-up on cpu \(.+, \d+ threads?\)(, compiled)?: "
                    r"median [\d.]+ ms, p90 [\d.]+ ms, min [\d.]+ ms, max [\d.]+ ms, "
                    r"stddev [\d.]+ ms$", line), line


def test_report(mlp):
    proc = tk_run(mlp, "--seed", 0, "--report")
    assert proc.returncode == 0, text(proc)
    out = text(proc, "stdout")
    assert "report: mlp: 3 ops" in out and "peak memory" in out
    assert all(op in out for op in ("fc1", "relu", "fc2"))


def test_report_json_lists_every_call_in_order(mlp):
    proc = tk_run(mlp, "--seed", 0, "--mode", "whole", "--report", "--report-format", "json")
    assert proc.returncode == 0, text(proc)
    report = json.loads(text(proc, "stdout").splitlines()[-1])["report"]
    assert [name for name, _ in report["calls"]] == ["fc1", "relu", "fc2"]
    assert all(ms >= 0 for _, ms in report["calls"])
    assert sum(ms for _, ms in report["calls"]) == pytest.approx(report["ms_in_ops"], abs=1e-5)


def test_check_without_source_uses_cpu_reference(mlp):
    proc = tk_run(mlp, "--seed", 0, "--check")
    assert proc.returncode == 0, text(proc)
    out = text(proc, "stdout")
    assert "against the CPU reference executor" in out and "check: pass" in out
    assert re.search(r"^  y: max_abs 0  rel_l2 0  pass \(rtol 1e-05, atol 1e-06\)$", out, re.M)
    # the run and the reference are the same executor: said, not left to the reader
    assert "check: cpu (whole ops) against the CPU reference executor" in out
    assert "check: note: the run and the reference are the same executor (whole ops)" in out


def test_check_after_a_stage_runs_the_mode_the_stage_made(tmp_path):
    """Without --mode, --check runs the IR's stages' mode (tiled after tk-roll) and says so;
    an explicit --mode whole is what it says, with the note naming the stages' mode."""
    ir = install("softmax.yaml", tmp_path)
    ir.write_text(ir.read_text().replace("inputs: [x, mask]",
                                         "stages: [{name: import}]\ninputs: [x, mask]"))
    rolled = tmp_path / "rolled.yaml"
    from tilekit.cli import tk_roll
    proc = completed(tk_roll.main, ["--hw", "h100", ir, "-o", rolled])
    assert proc.returncode == 0, text(proc)
    out = text(tk_run(rolled, "--check"), "stdout")
    assert ("check: cpu (tiled mode, the IR's stages: tk-roll's tiles, block by block) "
            "against the CPU reference executor") in out
    assert "check: note" not in out and "check: pass (2 outputs)" in out
    out = text(tk_run(rolled, "--check", "--mode", "whole"), "stdout")
    assert "check: cpu (whole ops) against" in out
    assert "check: note: the run and the reference are the same executor (whole ops): this " \
           "shows the module runs, not that a schedule is right; the stages' mode is --mode " \
           "tiled" in out
    # without --check nothing is checked (in the stages' mode: the default, compiled code,
    # would build C++ for a line that is not about it)
    assert "check" not in text(tk_run(rolled, "--mode", "tiled"), "stdout")


# -- --check against onnxruntime ---------------------------------------------------------

def tiny_onnx(path: Path, weight=(0.5, -1.0, 2.0)) -> str:
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [3], list(weight))
    graph = helper.make_graph(
        [helper.make_node("Mul", ["in:0", "w"], ["t"]), helper.make_node("Relu", ["t"], ["out/0"])],
        "tiny", [helper.make_tensor_value_info("in:0", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("out/0", TensorProto.FLOAT, [2, 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return sha256(path)


def test_check_against_onnxruntime(tmp_path):
    digest = tiny_onnx(tmp_path / "tiny.onnx")
    ir = install("tiny.yaml", tmp_path, {"w": np.array([0.5, -1, 2], np.float32)}, digest)
    proc = tk_run(ir, "--seed", 3, "--check", "--rtol", "1e-6")
    assert proc.returncode == 0, text(proc)
    out = text(proc, "stdout")
    assert "against onnxruntime" in out and "on tiny.onnx" in out
    assert re.search(r"^  out_0: max_abs \S+  rel_l2 \S+  pass \(rtol 1e-06, atol 1e-06\)$",
                     out, re.M)


def test_check_mismatch_exits_1(tmp_path):
    # The IR's weights differ from the model's: a real numerical mismatch.
    digest = tiny_onnx(tmp_path / "tiny.onnx")
    ir = install("tiny.yaml", tmp_path, {"w": np.array([0.5, -1, 2.1], np.float32)}, digest)
    proc = tk_run(ir, "--input", "in_0=1", "--check")
    assert proc.returncode == 1, text(proc)
    out = text(proc, "stdout")
    assert "FAIL" in out and "check: FAIL (1 of 1 outputs differ)" in out


def test_check_source_checksum_mismatch(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    ir = install("tiny.yaml", tmp_path, {"w": np.array([0.5, -1, 2], np.float32)}, "2" * 64)
    assert_one_line_error(tk_run(ir, "--seed", 0, "--check"), "source.sha256",
                          "checksum mismatch")


def test_check_source_missing(tmp_path):
    ir = install("tiny.yaml", tmp_path, {"w": np.array([0.5, -1, 2], np.float32)})
    assert_one_line_error(tk_run(ir, "--seed", 0, "--check"), "tiny.onnx", "not found")


# -- bad input: exit 2, one line, no traceback ------------------------------------------

def test_unknown_input_name(mlp):
    assert_one_line_error(tk_run(mlp, "--input", "z=1"), "unknown input 'z'", "inputs are: x")


def test_no_input_given_means_random_inputs_from_seed_0_said_on_stderr(mlp):
    proc = tk_run(mlp)
    assert proc.returncode == 0, text(proc)
    assert text(proc) == "tk-run: inputs: random, seed 0 (give --seed N or --input/--inputs)\n"
    seeded = tk_run(mlp, "--seed", 0)
    assert text(seeded) == "" and seeded.stdout == proc.stdout
    assert text(tk_run(mlp, "--quiet")) == ""


def test_a_missing_input_when_others_are_given_suggests_seed(tmp_path):
    ir = install("softmax.yaml", tmp_path)
    assert_one_line_error(tk_run(ir, "--input", "x=1"), "no value for input(s)", "--seed")


def test_shape_mismatch(mlp, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 2), np.float32))
    assert_one_line_error(tk_run(mlp, "--input", f"x=@{tmp_path / 'x.npy'}"),
                          "expected float32[2,4], got float32[4,2]")


def test_dtype_mismatch(mlp, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float64))
    assert_one_line_error(tk_run(mlp, "--input", f"x=@{tmp_path / 'x.npy'}"),
                          "dtype mismatch", "got float64[2,4]")


def test_nan_input_and_allow_nan(mlp, tmp_path):
    x = np.zeros((2, 4), np.float32)
    x[1, 1] = np.nan
    np.save(tmp_path / "x.npy", x)
    assert_one_line_error(tk_run(mlp, "--input", f"x=@{tmp_path / 'x.npy'}"), "NaN",
                          "--allow-nan")
    proc = tk_run(mlp, "--input", f"x=@{tmp_path / 'x.npy'}", "--allow-nan")
    assert proc.returncode == 0 and "non-finite" in text(proc, "stdout")


def test_missing_weights_file(tmp_path):
    ir = install("mlp.yaml", tmp_path)  # no sidecar written
    assert_one_line_error(tk_run(ir, "--seed", 0), "weights.file", "not found")


def test_tampered_weights(mlp, tmp_path):
    (tmp_path / "mlp.weights.npz").write_bytes(npz_bytes({"w1": W1, "b1": B1 + 1, "w2": W2}))
    assert_one_line_error(tk_run(mlp, "--seed", 0), "weights.sha256", "checksum mismatch")


def test_weights_missing_tensor(tmp_path):
    ir = install("mlp.yaml", tmp_path, {"w1": W1, "w2": W2})
    assert_one_line_error(tk_run(ir, "--seed", 0), "'b1'", "missing")


def test_weights_wrong_shape(tmp_path):
    ir = install("mlp.yaml", tmp_path, {"w1": W1, "b1": B1[:4], "w2": W2})
    assert_one_line_error(tk_run(ir, "--seed", 0), "'b1'", "expected float32[8], got float32[4]")


@pytest.mark.parametrize("flag", ["x", "=1", "x="])
def test_malformed_input_flag(mlp, flag):
    assert_one_line_error(tk_run(mlp, "--input", flag), "--input", "malformed")


def test_unreadable_npy(mlp, tmp_path):
    (tmp_path / "x.npy").write_bytes(b"\x93NUMPY garbage")
    assert_one_line_error(tk_run(mlp, "--input", f"x=@{tmp_path / 'x.npy'}"), "cannot read")


def test_unreadable_npz(mlp, tmp_path):
    (tmp_path / "in.npz").write_text("not a zip")
    assert_one_line_error(tk_run(mlp, "--inputs", tmp_path / "in.npz"), "is not an .npz archive")


def test_inputs_given_an_npy_file(mlp, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    assert_one_line_error(tk_run(mlp, "--inputs", tmp_path / "x.npy"),
                          "is an .npy file (one array), not an .npz archive", "--input NAME=@")


def test_inputs_given_a_yaml_file(mlp):
    # np.load reads anything unknown as a pickle: the message must not speak of pickled data.
    proc = tk_run(mlp, "--inputs", mlp)
    assert_one_line_error(proc, "is not an .npz archive")
    assert "pickle" not in text(proc)


def test_input_given_a_directory(mlp, tmp_path):
    assert_one_line_error(tk_run(mlp, "--input", "x=@.", cwd=tmp_path),
                          "--input x", "'.' is a directory")
    assert_one_line_error(tk_run(mlp, "--inputs", ".", cwd=tmp_path), "is a directory")


def test_control_section_refused(tmp_path):
    ir = install("control.yaml", tmp_path)
    proc = tk_run(ir, "--seed", 0)
    assert_one_line_error(proc, "control.regions", "must be a mapping")


def test_cuda_device(mlp):
    proc = tk_run(mlp, "--seed", 0, "--device", "cuda")
    if proc.returncode == 2:  # no CuPy or no GPU here: bad input, said in one line
        assert_one_line_error(proc, "--device cuda")
    else:
        assert proc.returncode == 0, text(proc)


def test_cuda_device_refuses_cpu_modes(mlp):
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--device", "cuda", "--mode", "tiled"),
                          "--mode", "'tiled' is for the CPU executor only")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_unknown_mode_refused_on_every_device(mlp, device):
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--device", device, "--mode", "bogus"),
                          "--mode", "unknown execution mode 'bogus'", "known modes: compiled, program, tiled, whole")


def test_bad_flag_values(mlp):
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--bench", 0), "--bench")
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--check", "--rtol", "-1"), "--rtol")
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--mode", "nope"), "known modes: compiled, program, tiled, whole")
    assert_one_line_error(tk_run(mlp, "--seed", -1), "--seed")
    # a CUDA graph replays --bench runs of CUDA kernels: neither alone nor on the CPU
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--graph", "--device", "cuda"), "--graph",
                          "give --bench N with --device cuda")
    assert_one_line_error(tk_run(mlp, "--seed", 0, "--graph", "--bench", 2), "--graph")


def test_output_never_overwrites_the_ir_weights_or_inputs(mlp, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    (tmp_path / "in.npz").write_bytes(npz_bytes({"x": np.ones((2, 4), np.float32)}))
    files = ("mlp.yaml", "mlp.weights.npz", "x.npy", "in.npz")
    before = {name: sha256(tmp_path / name) for name in files}
    for args in (["--seed", 0, "-o", "mlp.yaml"],
                 ["--seed", 0, "-o", "mlp.weights.npz"],
                 ["--input", "x=@x.npy", "-o", "x.npy"],
                 ["--inputs", "in.npz", "-o", "./in.npz"]):
        proc = tk_run("mlp.yaml", *args, cwd=tmp_path)
        assert_one_line_error(proc, "refusing to overwrite the input file")
        assert text(proc, "stdout") == ""  # refused before running
    assert {name: sha256(tmp_path / name) for name in files} == before


def test_missing_ir_file(tmp_path):
    assert_one_line_error(tk_run_process(tmp_path / "none.yaml"), "no such file")


# -- the real pipe: tk-import | tk-run --check ------------------------------------------

def gather_softmax_onnx(path: Path) -> None:
    """ONNX names that need sanitising, a weight, a run-time Gather (opaque) and a Softmax
    (decomposed at import)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3),
                                    "table")
    w = numpy_helper.from_array(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), "W:0")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb/out"], axis=0),
             helper.make_node("MatMul", ["in:0", "W:0"], ["mm"]),
             helper.make_node("Softmax", ["mm"], ["out/0"], axis=-1)]
    graph = helper.make_graph(
        nodes, "gather_softmax",
        [helper.make_tensor_value_info("in:0", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("out/0", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("emb/out", TensorProto.FLOAT, [4, 3])], [table, w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_import_pipe_check(tmp_path):
    gather_softmax_onnx(tmp_path / "gs.onnx")
    tk_import = ROOT / "bin" / "tk-import"
    py = sys.executable
    proc = subprocess.run(["bash", "-o", "pipefail", "-c",
                           f"'{py}' '{tk_import}' gs.onnx | '{py}' '{TK_RUN}' --seed 0 --check"],
                          cwd=tmp_path, capture_output=True, timeout=120)
    out = text(proc, "stdout")
    assert proc.returncode == 0, text(proc) + out
    assert "against onnxruntime" in out and "check: pass (2 outputs)" in out
    assert re.search(r"^  out_0: .* pass ", out, re.M)
    assert re.search(r"^  emb_out: max_abs 0  rel_l2 0  pass ", out, re.M)


def test_tiled_mode_checked_against_whole_ops(tmp_path):
    ir = install("softmax.yaml", tmp_path)
    proc = tk_run(ir, "--seed", 0, "--mode", "tiled", "--check")
    assert proc.returncode == 0, text(proc)
    out = text(proc, "stdout")
    assert "check: cpu (tiled mode) against the CPU reference executor (whole ops" in out
    assert "check: pass (2 outputs)" in out


def test_check_tensors_compares_every_computed_tensor(mlp):
    proc = tk_run(mlp, "--seed", 0, "--check-tensors", "--quiet")
    assert proc.returncode == 0, text(proc)
    out = text(proc, "stdout")
    assert "check-tensors: 3 computed tensors against the CPU reference executor" in out
    assert ": 0 differ" in out


def test_check_tensors_names_the_first_tensor_that_differs():
    """A wrong intermediate is reported at the op that wrote it, before what it spoils."""
    from tilekit.ir.codec import read_module
    from tilekit.runtime.check import compare_tensors
    from tilekit.runtime.cpu import prepare

    module = read_module(str(DATA / "mlp.yaml"))
    inputs = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}
    weights = {"w1": W1, "b1": B1, "w2": W2}
    actual: dict = {}
    prepare(module).run(inputs, weights, trace=actual)
    actual["r"] = actual["r"] + np.float32(1e-3)
    results = compare_tensors(module, actual, inputs, weights)
    assert [(r.op, r.comparison.passed) for r in results] == [
        ("fc1", True), ("relu", False), ("fc2", True)]
    assert results[1].line().startswith("ops[1] (relu) r: max_abs 0.001")
