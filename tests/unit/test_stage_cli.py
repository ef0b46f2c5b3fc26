"""What every stage command shares on the command line: an ONNX model given where the IR is
expected, tk-codegen with a profile that has no CUDA arch, report formats, --time-passes and
the warning when a stage drops sections. In process (click's runner) unless a pipe is the
point."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
MLP = REPO / "tests" / "golden" / "roll_mlp_h100" / "mlp.yaml"
sys.path.insert(0, str(REPO / "tests"))
from models import onnx_models  # noqa: E402

STAGES = ("tk_roll", "tk_weld", "tk_grind", "tk_ram", "tk_codegen", "tk_run")


def invoke(command: str, *args, stdin: bytes | None = None):
    main = importlib.import_module(f"tilekit.cli.{command}").main
    return CliRunner().invoke(main, [str(a) for a in args], input=stdin)


@pytest.fixture
def model(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    onnx.save(onnx_models.mobilenet_block(), "m.onnx")
    return Path("m.onnx")


@pytest.mark.parametrize("command", STAGES)
def test_an_onnx_model_given_to_a_stage_says_to_import_it(command, model):
    result = invoke(command, model)
    assert result.exit_code == 2
    assert result.output == ("tk-" + command[3:] + ": error: m.onnx is an ONNX model, not tile "
                             "IR: run tk-import m.onnx first\n")


def test_an_onnx_model_on_stdin_or_without_its_suffix(model):
    data = model.read_bytes()
    result = invoke("tk_roll", "--hw", "h100", stdin=data)
    assert result.exit_code == 2
    assert "<stdin> is an ONNX model, not tile IR: run tk-import MODEL.onnx first" in result.output
    Path("model.bin").write_bytes(data)
    result = invoke("tk_run", "model.bin")
    assert result.exit_code == 2 and "model.bin is an ONNX model" in result.output


def test_codegen_with_a_profile_without_cuda_arch_says_what_to_do(tmp_path):
    result = invoke("tk_codegen", "--hw", "ipu", MLP)
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "tk-codegen: error: --hw: hardware profile 'ipu' (graphcore ipu2, distributed) has no "
        "CUDA arch")
    assert "pass --hw with an NVIDIA profile (a100, h100, rtx4090, v100)" in lines[0]
    assert "sm_XX" not in lines[0] and "e.g. sm_80" not in lines[0]
    rolled = tmp_path / "rolled.yaml"
    assert invoke("tk_roll", "--hw", "ipu", MLP, "-o", rolled).exit_code == 0
    result = invoke("tk_codegen", rolled)
    assert result.exit_code == 2 and "error: hardware: hardware profile 'ipu'" in result.output
