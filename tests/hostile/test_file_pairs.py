"""Class 5: a command's outputs become visible together or not at all.

`tilekit.outputs.OutputSet` stages every output, renames the files in order (the weights
sidecar before the IR that names it) with signals held, streams last, and undoes the renames
when anything fails. SIGINT and SIGTERM exit 130 and 143 without a traceback and without
leaving temporary files. After any failure the IR on disk names the weights on disk.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from hostile_support import (BIN, assert_refused, default_sigint, run, sha256, temporaries,
                             tiny_onnx, write_mlp)
from tilekit import outputs


def _pair_consistent(ir, weights) -> bool:
    """The IR names the weights file by its checksum."""
    text = ir.read_text()
    recorded = (json.loads(text) if text.lstrip().startswith("{") else __import__(
        "yaml").safe_load(text))["weights"]["sha256"]
    return recorded == sha256(weights)


@pytest.fixture
def old_pair(tmp_path):
    """An imported pair m.yaml + m.weights.npz of a 4-element model."""
    model = tiny_onnx(tmp_path / "old.onnx", size=4)
    assert run("tk-import", model, "-o", tmp_path / "m.yaml").exit_code == 0
    pair = (tmp_path / "m.yaml", tmp_path / "m.weights.npz")
    assert _pair_consistent(*pair)
    return pair


def _failing_replace(monkeypatch, fail_on: str, error=OSError(28, "No space left on device")):
    """Make the rename onto a target whose name ends with `fail_on` fail, once."""
    real = os.replace
    state = {"armed": True}

    def replace(src, dst, *args, **kwargs):
        if state["armed"] and str(dst).endswith(fail_on) and ".bak" not in str(src):
            state["armed"] = False
            raise error
        return real(src, dst, *args, **kwargs)
    monkeypatch.setattr(outputs.os, "replace", replace)


@pytest.mark.parametrize("fail_on", ["m.yaml", "m.weights.npz"])
def test_import_over_a_pair_fails_in_commit(tmp_path, old_pair, monkeypatch, fail_on):
    before = [p.read_bytes() for p in old_pair]
    model = tiny_onnx(tmp_path / "new.onnx", size=9)
    _failing_replace(monkeypatch, fail_on)
    # --weights: the pair is replaced as asked (a default name holding other weights would
    # be left alone: test_sidecars.py)
    assert_refused(run("tk-import", model, "-o", old_pair[0], "--weights", old_pair[1]),
                   "tk-import", "No space left on device")
    assert [p.read_bytes() for p in old_pair] == before
    assert _pair_consistent(*old_pair) and temporaries(tmp_path) == []


@pytest.mark.parametrize("fail_on", ["m.yaml", "m.weights.npz"])
def test_fresh_import_fails_in_commit_leaves_nothing(tmp_path, monkeypatch, fail_on):
    model = tiny_onnx(tmp_path / "new.onnx", size=9)
    _failing_replace(monkeypatch, fail_on)
    assert_refused(run("tk-import", model, "-o", tmp_path / "m.yaml"), "tk-import")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.onnx"]


def test_import_failing_to_convert_keeps_the_old_pair(tmp_path, old_pair):
    from onnx import TensorProto, helper
    import onnx
    graph = helper.make_graph([helper.make_node("NonMaxSuppression", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [4])])
    onnx.save(helper.make_model(graph), str(tmp_path / "bad.onnx"))
    before = [p.read_bytes() for p in old_pair]
    assert run("tk-import", tmp_path / "bad.onnx", "-o", old_pair[0]).exit_code == 2
    assert [p.read_bytes() for p in old_pair] == before and temporaries(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_stream_failure_after_the_renames_undoes_them(tmp_path, old_pair):
    """The IR goes to a full device (/dev/full's numbers): the weights already renamed into
    place are put back."""
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    before = old_pair[1].read_bytes()
    model = tiny_onnx(tmp_path / "new.onnx", size=9)
    assert_refused(run("tk-import", model, "--weights", old_pair[1], "-o", full), "tk-import",
                   "No space left on device")
    assert old_pair[1].read_bytes() == before and _pair_consistent(*old_pair)
    assert temporaries(tmp_path) == []


def test_stream_failure_of_a_fresh_import_removes_the_weights(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    model = tiny_onnx(tmp_path / "new.onnx", size=9)
    assert run("tk-import", model, "--weights", tmp_path / "w.npz", "-o", full).exit_code == 2
    assert not (tmp_path / "w.npz").exists() and temporaries(tmp_path) == []


# -- tk-codegen --emit-dir ----------------------------------------------------------------

def test_emit_dir_with_an_unwritable_entry_writes_nothing(tmp_path):
    ir = write_mlp(tmp_path)
    folder = tmp_path / "cu"
    (folder / "tk_k_relu1.cu").mkdir(parents=True)
    out = tmp_path / "c.yaml"
    assert_refused(run("tk-codegen", ir, "--emit-dir", folder, "-o", out), "tk-codegen",
                   "is a directory")
    assert not out.exists() and sorted(p.name for p in folder.iterdir()) == ["tk_k_relu1.cu"]


@pytest.mark.parametrize("fail_on", ["runtime.cuh", "tk_k_fc1.cu", "tk_k_fc2.cu", "c.yaml"])
def test_emit_dir_failing_in_commit_restores_every_file(tmp_path, monkeypatch, fail_on):
    ir = write_mlp(tmp_path)
    folder = tmp_path / "cu"
    out = tmp_path / "c.yaml"
    assert run("tk-codegen", ir, "--emit-dir", folder, "-o", out).exit_code == 0
    for path in [out, *folder.iterdir()]:
        path.write_text("old " + path.name)
    before = {p.name: p.read_text() for p in [out, *folder.iterdir()]}
    _failing_replace(monkeypatch, fail_on)
    assert_refused(run("tk-codegen", ir, "--emit-dir", folder, "-o", out), "tk-codegen")
    assert {p.name: p.read_text() for p in [out, *folder.iterdir()]} == before
    assert temporaries(tmp_path) == []


def test_emit_dir_made_for_a_failed_run_is_removed(tmp_path, monkeypatch):
    ir = write_mlp(tmp_path)
    _failing_replace(monkeypatch, "c.yaml")
    assert run("tk-codegen", ir, "--emit-dir", tmp_path / "new", "-o",
               tmp_path / "c.yaml").exit_code == 2
    assert not (tmp_path / "new").exists() and temporaries(tmp_path) == []


def test_run_output_fails_in_commit(tmp_path, monkeypatch):
    ir = write_mlp(tmp_path)
    out = tmp_path / "out.npz"
    out.write_bytes(b"old")
    _failing_replace(monkeypatch, "out.npz", PermissionError(13, "Permission denied"))
    assert_refused(run("tk-run", ir, "--seed", "0", "-o", out), "tk-run", "Permission denied")
    assert out.read_bytes() == b"old" and temporaries(tmp_path) == []


def test_interrupt_in_the_middle_of_staging(tmp_path, monkeypatch, old_pair):
    """A KeyboardInterrupt while the IR is being staged (after the weights were): exit 130,
    one line, the old pair intact, no temporaries."""
    before = [p.read_bytes() for p in old_pair]
    real_put = outputs.OutputSet.put

    def put(self, path, data, where):
        if str(path).endswith("m.yaml"):
            raise KeyboardInterrupt
        return real_put(self, path, data, where)
    monkeypatch.setattr(outputs.OutputSet, "put", put)
    result = run("tk-import", tiny_onnx(tmp_path / "new.onnx", size=9), "-o", old_pair[0])
    assert result.exit_code == 130 and result.stderr == "tk-import: error: interrupted\n"
    assert [p.read_bytes() for p in old_pair] == before and temporaries(tmp_path) == []


# -- real signals --------------------------------------------------------------------------

def _big_model(path, n=2**23):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("Add", ["x", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [n])], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                      [n])],
        [numpy_helper.from_array(np.array([n], dtype=np.int64), "s")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _started(proc, marker: str, timeout: float = 60) -> None:
    """Wait until the child has imported tilekit and installed its handlers (it prints
    nothing before, so poll for a file it opens: the marker's temporary file or output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.name.startswith(marker) for p in proc.folder.iterdir()):
            return
        time.sleep(0.01)


#: Each signal once and each moment once (before the write, during it, near its end): the
#: handlers are one code path, so the full 3 x 3 product added only time.
SIGNAL_CASES = [(signal.SIGTERM, 143, 0.05), (signal.SIGINT, 130, 0.2),
                (signal.SIGHUP, 129, 0.0)]


@pytest.mark.parametrize("signum, code, delay", SIGNAL_CASES)
def test_signals_during_import_keep_the_pair(tmp_path, old_pair, signum, code, delay):
    model = _big_model(tmp_path / "big.onnx")
    proc = subprocess.Popen([sys.executable, str(BIN / "tk-import"), str(model), "-o",
                             str(old_pair[0]), "--weights", str(old_pair[1])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            preexec_fn=default_sigint)
    proc.folder = tmp_path
    _started(proc, ".m.weights.npz.")
    time.sleep(delay)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    # 0: done before the signal; -signum: done, then killed during interpreter shutdown (a
    # shell reports both 128 + signum, like `code`)
    assert proc.returncode in (code, 0, -signum), (proc.returncode, err)
    assert b"Traceback" not in err
    if proc.returncode == code:
        assert err.decode().strip().endswith(("interrupted", "terminated", "(SIGHUP)"))
    assert temporaries(tmp_path) == []
    assert _pair_consistent(*old_pair)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_a_run_leaves_no_temporary(tmp_path, signum, code):
    doc = {"tilekit": 1, "model": "m", "stages": [{"name": "import"}], "inputs": ["a", "b"],
           "outputs": ["c"], "tensors": {
               "a": {"shape": [1024, 1024], "dtype": "float32", "role": "input"},
               "b": {"shape": [1024, 1024], "dtype": "float32", "role": "input"},
               "c": {"shape": [1024, 1024], "dtype": "float32", "role": "output"}},
           "ops": [{"name": "mm", "expr": "c[i,j] += a[i,k] * b[k,j]"}]}
    ir = tmp_path / "m.json"
    ir.write_text(json.dumps(doc))
    proc = subprocess.Popen([sys.executable, str(BIN / "tk-run"), str(ir), "--seed", "0",
                             "--mode", "tiled", "-o", str(tmp_path / "out.npz")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            preexec_fn=default_sigint)
    time.sleep(3)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (code, 0, -signum), err
    assert b"Traceback" not in err and temporaries(tmp_path) == []



@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   PermissionError(13, "Permission denied"),
                                   OSError(18, "Invalid cross-device link"),
                                   OSError(30, "Read-only file system")],
                         ids=["ENOSPC", "EACCES", "EXDEV", "EROFS"])
@pytest.mark.parametrize("tool, args, target", [
    ("tk-roll", ["{ir}", "--hw", "h100", "-o", "{out}"], "out.yaml"),
    ("tk-codegen", ["{ir}", "-o", "{out}"], "out.yaml"),
    ("tk-run", ["{ir}", "--seed", "0", "-o", "{out}"], "out.yaml"),
    ("tk-import", ["{model}", "-o", "{out}", "--weights", "{weights}"], "out.yaml"),
    ("tk-import", ["{model}", "-o", "{out}", "--weights", "{weights}"], "out.weights.npz"),
])
def test_every_writer_survives_a_failed_rename(tmp_path, monkeypatch, error, tool, args,
                                               target):
    names = {"ir": write_mlp(tmp_path), "model": tiny_onnx(tmp_path / "m.onnx"),
             "out": tmp_path / "out.yaml", "weights": tmp_path / "out.weights.npz"}
    for name in ("out.yaml", "out.weights.npz"):
        (tmp_path / name).write_bytes(b"old " + name.encode())
    _failing_replace(monkeypatch, target, error)
    result = run(tool, *[a.format(**names) for a in args])
    assert_refused(result, tool, error.strerror)
    for name in ("out.yaml", "out.weights.npz"):
        assert (tmp_path / name).read_bytes() == b"old " + name.encode()
    assert temporaries(tmp_path) == []


def test_stages_writing_into_other_folders_keep_the_files_reachable(tmp_path):
    """A stage reads a document in one folder and writes into another: the relative paths
    of the weights sidecar and the source model are rewritten for the output's folder (they
    were copied as they were, and the output did not run)."""
    from hostile_support import run, write_mlp

    # The commands run in this process, each from its folder (what a shell in that folder
    # runs; the paths are what is tested, not the process).
    ir = write_mlp(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    steps = [("tk-roll", [ir.name, "--hw", "h100", "-o", "a/rolled.json"]),
             ("tk-weld", ["a/rolled.json", "-o", "a/b/welded.json"]),
             ("tk-ram", ["a/b/welded.json", "-o", "planned.json"])]
    for tool, args in steps:
        result = run(tool, *args, folder=tmp_path)
        assert result.exit_code == 0, result.stderr
    import yaml

    assert yaml.safe_load((tmp_path / "a/b/welded.json").read_text())["weights"]["file"] == \
        "../../mlp.weights.npz"
    for doc, extra in (("a/rolled.json", ["--mode", "tiled"]), ("a/b/welded.json", []),
                       ("planned.json", ["--mode", "program"])):
        result = run("tk-run", doc, "--seed", "0", *extra, folder=tmp_path)
        assert result.exit_code == 0, (doc, result.stderr)
    result = run("tk-run", "b/welded.json", "--seed", "0", folder=tmp_path / "a")
    assert result.exit_code == 0, result.stderr


class _Hangup(Exception):
    pass


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP")
def test_a_signal_as_an_archive_member_opens_is_delivered_after_it(monkeypatch):
    """A signal that lands just as an `.npz` member is opened for writing (the handle made,
    its block not yet entered) raises the command's exception after the member, where it had
    left the member open and the archive's close raised ValueError instead (tk-import
    reported an internal error, exit 1, for a SIGHUP): the interruption is what comes out,
    and nothing is half written into the archive's bookkeeping."""
    import io
    import zipfile

    from tilekit.outputs import write_npz

    real_open = zipfile.ZipFile.open
    calls = []

    def open_then_signal(self, *args, **kwargs):
        handle = real_open(self, *args, **kwargs)
        if not calls:
            calls.append(1)
            os.kill(os.getpid(), signal.SIGHUP)     # delivered at once unless held
        return handle

    def hangup(signum, frame):
        raise _Hangup()

    previous = signal.signal(signal.SIGHUP, hangup)
    monkeypatch.setattr(zipfile.ZipFile, "open", open_then_signal)
    try:
        with pytest.raises(_Hangup):
            write_npz(io.BytesIO(), {"a": np.arange(4.0), "b": np.ones(3)})
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert calls == [1]
