"""The CPU pipeline end to end: `tk-import | tk-roll --hw milan | tk-weld | tk-codegen |
tk-run --check` on a small MobileNet-style block, checked against onnxruntime: the module is
rolled and welded for a CPU profile and generated for the CPU by default, from its tiles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import yaml

from tilekit.codegen.cxx import find_cxx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import onnx_models  # noqa: E402

pytestmark = [pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler"),
              pytest.mark.xdist_group("cpu_pipeline")]


def test_import_roll_weld_codegen_run_on_a_cpu_profile(tmp_path):
    onnx.save(onnx_models.mobilenet_block(), str(tmp_path / "m.onnx"))
    bin_dir = Path(sys.executable).parent
    pipe = (f"{bin_dir}/tk-import m.onnx | {bin_dir}/tk-roll --hw milan | {bin_dir}/tk-weld | "
            f"{bin_dir}/tk-codegen -o m.cpu.yaml && {bin_dir}/tk-run m.cpu.yaml --check "
            "--seed 0 --threads 2")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", pipe], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "check: cpu (compiled mode" in proc.stdout and "check: pass" in proc.stdout
    doc = yaml.safe_load((tmp_path / "m.cpu.yaml").read_text())
    assert doc["hardware"]["name"] == "milan"
    assert doc["codegen"]["target"] == "cpu"
    kernels = doc["codegen"]["kernels"]
    assert all(k["schedule"].get("tiles") == "rolled" for k in kernels
               if k["shape"].startswith("cpu_"))
    assert any(k["shape"] == "cpu_gemm" for k in kernels)
    # tk-weld put each contraction's chain (bias, clip) into its kernel
    assert len(kernels) < len(doc["ops"])
    assert not any("tile_ignored" in k["schedule"] for k in kernels)
