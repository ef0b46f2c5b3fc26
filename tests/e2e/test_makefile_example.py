"""examples/Makefile: tilekit's commands as make rules, built in parallel for several models;
a second `make` does nothing, a build from scratch gives the same bytes, every stage's product
is checked, and the products live in a folder per hardware profile and depend on it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402
from scope import FULL  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("makefile"),
              pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")]
#: Two models, for `make -j2` to build two chains in parallel (each build is 17 commands).
MODELS = ("mobilenet_block", "lstm_model")
STAGES = ("rolled", "welded", "ground", "program", "cuda")


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{ROOT / 'bin'}{os.pathsep}{os.environ['PATH']}",
               NO_COLOR="1")
    return subprocess.run(["make", "-C", str(folder), *args], env=env, capture_output=True,
                          text=True, timeout=600)


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def commands_run(result: subprocess.CompletedProcess) -> list[str]:
    return [line.split()[0] for line in result.stdout.splitlines()
            if line.startswith("tk-")]


@pytest.mark.skipif(not FULL, reason="a minute of builds: TILEKIT_FULL=1 (the profile test "
                    "below runs the Makefile's rules on a tiny model)")
def test_parallel_build_then_nothing_to_do_then_the_same_bytes(tmp_path):
    shutil.copy(ROOT / "examples" / "Makefile", tmp_path / "Makefile")
    for name in MODELS:
        onnx.save(getattr(onnx_models, name)(), str(tmp_path / f"{name}.onnx"))
    first = make(tmp_path, "-j2", "all", "check")
    assert first.returncode == 0, first.stdout + first.stderr
    build = tmp_path / "build"
    for name in MODELS:
        assert (build / "h100" / f"{name}.cuda.yaml").exists()
        # make check ran every stage's product, each against onnxruntime
        checks = [build / f"{name}.tk.check"] + [build / "h100" / f"{name}.{s}.check"
                                                 for s in STAGES]
        for check in checks:
            assert check.read_text().splitlines()[-1].startswith("check: pass"), check
        assert "(program mode)" in (build / "h100" / f"{name}.cuda.check").read_text()
        assert "(tiled mode)" in (build / "h100" / f"{name}.welded.check").read_text()
    built = digests(build)
    again = make(tmp_path, "all", "check")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout, again.stdout
    assert not commands_run(again)
    assert make(tmp_path, "clean").returncode == 0
    assert not build.exists()
    assert make(tmp_path, "-j2", "all", "check").returncode == 0
    assert digests(build) == built


def tiny_model() -> onnx.ModelProto:
    """One matmul and a ReLU: the profile tests are about make, not about the model."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4))
                                .astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_products_depend_on_the_profile_by_name_or_path(tmp_path):
    shutil.copy(ROOT / "examples" / "Makefile", tmp_path / "Makefile")
    onnx.save(tiny_model(), str(tmp_path / "tiny.onnx"))
    build = tmp_path / "build"
    # Up to the welded IR only: two stages that read the profile show what every stage does.
    target = "build/{}/tiny.welded.yaml".format
    assert make(tmp_path, "HW=h100", target("h100")).returncode == 0
    h100 = digests(build / "h100")

    # Another profile after an h100 build: its own folder, the import reused, h100 untouched.
    a100 = make(tmp_path, "HW=a100", target("a100"))
    assert a100.returncode == 0, a100.stderr
    assert commands_run(a100) == ["tk-roll", "tk-weld"]
    assert "hardware:\n  name: a100\n" in (build / "a100" / "tiny.rolled.yaml").read_text()
    assert digests(build / "h100") == h100

    # A path: the stem names the folder; touching the file rebuilds nothing, changing a figure
    # rebuilds every stage from the roll on.
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    mine = profiles / "mine.yaml"
    mine.write_text((ROOT / "hwprofiles" / "a100.yaml").read_text())
    by_path = make(tmp_path, "HW=profiles/mine.yaml", target("mine"))
    assert by_path.returncode == 0, by_path.stderr
    assert commands_run(by_path) == ["tk-roll", "tk-weld"]
    assert "hardware:\n  name: ../../profiles/mine.yaml\n" in \
        (build / "mine" / "tiny.rolled.yaml").read_text()
    os.utime(mine)
    assert commands_run(make(tmp_path, "HW=profiles/mine.yaml", target("mine"))) == []
    text = mine.read_text()
    figure = re.search(r"sm_count: +\{value: 108,", text)
    assert figure, "the a100 profile's SM count moved"
    mine.write_text(text.replace(figure.group(0), "sm_count: {value: 54,"))
    rebuilt = make(tmp_path, "HW=profiles/mine.yaml", target("mine"))
    assert commands_run(rebuilt) == ["tk-roll", "tk-weld"]
    assert "sm_count: 54" in (build / "mine" / "profile.json").read_text().replace('"', "")

    # A bad profile stops before anything is built, with tk-hw's one-line error.
    before = digests(build)
    bad = make(tmp_path, "HW=nosuch")
    assert bad.returncode == 2 and "HW=nosuch: tk-hw: error: nosuch: unknown hardware " \
        "profile" in bad.stderr, bad.stderr
    assert not commands_run(bad) and digests(build) == before
    assert not (build / "nosuch").exists()


def test_the_products_are_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["examples/build/h100/m.cuda.yaml", "examples/build/m.tk.yaml",
             "examples/build/m.tk.weights.npz", "examples/build/mine/profile.json",
             "examples/m.onnx"]
    result = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *paths],
                            capture_output=True, text=True)
    assert sorted(result.stdout.split()) == sorted(paths)
    assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index",
                           "examples/Makefile"]).returncode == 1
