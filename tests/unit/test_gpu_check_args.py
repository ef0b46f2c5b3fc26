"""tests/gpu/gpu_check.py's arguments, without a GPU: the model variants it compiles and the
refusal of unknown steps and variants (the script runs unattended on a lent machine, so a typo
must fail before any step starts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import gpu_check  # noqa: E402


def test_every_variant_is_a_pipe_ending_in_a_compiled_ir():
    for name, pipe in gpu_check.VARIANTS.items():
        text = pipe.format(n="m", out="m.out.yaml", hw="a100")
        assert "tk-codegen --compile" in text and text.endswith("-o m.out.yaml"), (name, text)
        assert "{" not in text, (name, text)
    assert "tk-weld" in gpu_check.VARIANTS["welded"]
    assert "tk-ram" in gpu_check.VARIANTS["program"] and "--top-k 4" in gpu_check.VARIANTS["program"]


@pytest.mark.parametrize("flag, value", [("--steps", "models,fly"), ("--variants", "rolled,fast")])
def test_unknown_steps_and_variants_are_refused_before_any_step(tmp_path, flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path), flag, value])
    assert exit_.value.code == 2
    assert "unknown" in capsys.readouterr().err
    assert not (tmp_path / "out" / "summary.json").exists()
