"""Class 5b: an output that fails while it is being written leaves no temporary file.

A full disk, an I/O error or an exception of the writer in the middle of an output: the
command exits 2 (1 for its own exception) naming the output, and the `.NAME.*.tmp` it was
writing is gone. The disk is made to fail for real where that needs no privilege (a file-size
limit, `RLIMIT_FSIZE`: writes past it fail with EFBIG, exactly where ENOSPC would), and by
fault injection in the process for the failures a limit cannot make (a close that fails).
"""

from __future__ import annotations

import errno
import io
import os
import resource

import pytest

from hostile_support import assert_refused, run, spawn, temporaries, tiny_onnx, write_mlp
from tilekit import outputs


def _file_size_limit(limit: int):
    def apply() -> None:  # in the child: Python ignores SIGXFSZ, so a write returns EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _relu_onnx(path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("target", ["weights", "ir"])
def test_import_hitting_the_file_size_limit_leaves_nothing(tmp_path, target):
    """tk-import writing 1 MiB of weights with the disk 'full' at 256 KiB, or an IR (of a
    model without weights) with the disk 'full' at 200 bytes."""
    if target == "weights":
        model = tiny_onnx(tmp_path / "m.onnx", size=2**18)
    else:
        model = _relu_onnx(tmp_path / "m.onnx")
    args = ["m.onnx", "-o", "r.yaml"]
    limit = 256 * 1024 if target == "weights" else 200
    proc = spawn("tk-import", *args, folder=tmp_path, preexec_fn=_file_size_limit(limit))
    line = assert_refused(proc, "tk-import", "cannot write", "File too large")
    assert ("r.weights.npz" if target == "weights" else "r.yaml") in line
    assert temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [model.name]


@pytest.mark.parametrize("tool, args, output", [
    ("tk-roll", ["{ir}", "--hw", "h100", "-o", "out.yaml"], "out.yaml"),
    ("tk-run", ["{ir}", "--seed", "0", "-o", "out.npz"], "out.npz"),
    ("tk-codegen", ["{ir}", "-o", "out.yaml"], "out.yaml"),
])
def test_stage_outputs_hitting_the_file_size_limit(tmp_path, tool, args, output):
    ir = write_mlp(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = spawn(tool, *[a.format(ir=ir.name) for a in args], folder=tmp_path,
                 preexec_fn=_file_size_limit(64))
    assert_refused(proc, tool, "cannot write", output)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


class _FailingFile(io.BufferedRandom):
    """A staged file whose writes fail after `budget` bytes and whose close fails as well
    (a buffered file flushes again on close: what a full disk or a lost NFS server does)."""

    budget = 1000

    def write(self, data) -> int:
        type(self).budget -= len(data)
        if type(self).budget < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)

    def close(self) -> None:
        super().close()
        if type(self).budget < 0:
            raise OSError(errno.EIO, "Input/output error")


def _inject(monkeypatch, error_on_close_only: bool = False):
    real = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real(fd, mode, *args, **kwargs)
        if "w" not in mode:
            return handle
        return _FailingFile(handle.detach())
    _FailingFile.budget = -1 if error_on_close_only else 1000
    monkeypatch.setattr(outputs.os, "fdopen", fdopen)


@pytest.mark.parametrize("close_only", [False, True], ids=["write_fails", "close_fails"])
def test_failing_write_or_close_in_process(tmp_path, monkeypatch, close_only):
    model = tiny_onnx(tmp_path / "m.onnx", size=4096)
    _inject(monkeypatch, close_only)
    result = run("tk-import", model, "-o", tmp_path / "r.yaml")
    assert_refused(result, "tk-import", "cannot write")
    assert temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_writer_exception_mid_write_removes_the_temporary(tmp_path, monkeypatch):
    """A bug in a writer (an exception that is not an OSError) half-way through the weights:
    an internal error (exit 1), and still no temporary file."""
    import tilekit.onnx as onnx_package

    real = onnx_package._write_npz

    def broken(fh, weights):
        fh.write(b"PK" + b"\0" * 4096)
        raise RuntimeError("writer bug")
    monkeypatch.setattr(onnx_package, "_write_npz", broken)
    model = tiny_onnx(tmp_path / "m.onnx")
    result = run("tk-import", model, "-o", tmp_path / "r.yaml")
    assert result.exit_code == 1 and "writer bug" in result.stderr
    assert "Traceback" not in result.stderr
    assert temporaries(tmp_path) == []
    assert real is not broken
