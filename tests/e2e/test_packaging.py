"""tilekit as users install it: a wheel, not the checkout.

The wheel is built from this checkout and installed into a folder of its own; the commands
then run from a folder outside the checkout, with Python's site machinery off so that the
checkout's editable install cannot answer for the wheel (`python -S`, the test venv's
site-packages given explicitly for numpy, onnx and the rest).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Path:
    """A wheel of this checkout installed into its own folder (its `site`)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    # Build from a clean copy: the build writes build/ and *.egg-info into its source.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "out", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis", "*.weights.npz"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(work / "dist"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (work / "dist").glob("tilekit-*.whl")
    site = work / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return site


def run(site: Path, args: list[str], cwd: Path, stdin: bytes | None = None
        ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TILEKIT"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"],
                                         sysconfig.get_paths()["platlib"]])
    env["NO_COLOR"] = "1"
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, timeout=300)


def test_the_wheel_is_what_runs(installed, tmp_path):
    proc = run(installed, ["-c", "import tilekit; print(tilekit.__file__)"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().startswith(str(installed))


def test_every_builtin_profile_is_listed(installed, tmp_path):
    proc = run(installed, ["-m", "tilekit.cli.tk_hw", "list"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    names = {line.split()[0] for line in proc.stdout.decode().splitlines()[1:] if line.strip()}
    shipped = {p.stem for p in (ROOT / "hwprofiles").glob("*.yaml")}
    assert shipped <= names, proc.stdout.decode()
    assert (installed / "tilekit" / "data" / "specs" / "workloads.yaml").exists()


def test_the_pipeline_runs_from_any_folder(installed, tmp_path):
    onnx.save(onnx_models.mobilenet_block(), str(tmp_path / "m.onnx"))
    steps = [["-m", "tilekit.cli.tk_import", "m.onnx", "-o", "m.tk.yaml"],
             ["-m", "tilekit.cli.tk_roll", "--hw", "h100", "m.tk.yaml", "-o", "m.h100.yaml"],
             ["-m", "tilekit.cli.tk_codegen", "m.h100.yaml", "-o", "m.cuda.yaml"],
             ["-m", "tilekit.cli.tk_run", "m.cuda.yaml", "--seed", "0", "--check"]]
    for args in steps:
        proc = run(installed, args, tmp_path)
        assert proc.returncode == 0, (args, proc.stderr.decode())
    assert "check: pass" in proc.stdout.decode()


def test_console_scripts_and_python_m_tilekit(installed, tmp_path):
    for name in ("tk-import", "tk-roll", "tk-codegen", "tk-run", "tk-hw"):
        assert (installed / "bin" / name).exists(), name
    proc = run(installed, ["-m", "tilekit"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    listed = proc.stdout.decode()
    assert all(name in listed for name in ("tk-import", "tk-roll", "tk-codegen", "tk-run"))
