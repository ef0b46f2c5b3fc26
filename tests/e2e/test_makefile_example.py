"""examples/Makefile: tilekit's commands as make rules, built in parallel for several models;
a second `make` does nothing, and a build from scratch gives the same bytes."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("makefile")]
#: Two models: enough for `make -j2` to build in parallel (each build is 16 commands).
MODELS = ("mobilenet_block", "lstm_model")


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{ROOT / 'bin'}{os.pathsep}{os.environ['PATH']}",
               NO_COLOR="1")
    return subprocess.run(["make", "-C", str(folder), *args], env=env, capture_output=True,
                          text=True, timeout=600)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.suffix in (".yaml", ".npz", ".check")}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_parallel_build_then_nothing_to_do_then_the_same_bytes(tmp_path):
    shutil.copy(ROOT / "examples" / "Makefile", tmp_path / "Makefile")
    for name in MODELS:
        onnx.save(getattr(onnx_models, name)(), str(tmp_path / f"{name}.onnx"))
    first = make(tmp_path, "-j2", "all", "check")
    assert first.returncode == 0, first.stdout + first.stderr
    for name in MODELS:
        assert (tmp_path / f"{name}.cuda.yaml").exists()
        assert "check: pass" in (tmp_path / f"{name}.check").read_text()
    built = digests(tmp_path)
    again = make(tmp_path, "all", "check")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout, again.stdout
    assert make(tmp_path, "clean").returncode == 0
    assert make(tmp_path, "-j2", "all", "check").returncode == 0
    assert digests(tmp_path) == built
