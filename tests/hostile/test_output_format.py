"""Class 7: the format of a written IR follows the name it is written to.

`-o x.json` wrote YAML into a file named .json. Without `--format`, every stage command now
writes JSON to a `.json` name and YAML to `.yaml`/`.yml` (and to any other name, and to
stdout); `--format` given explicitly wins over the suffix.
"""

from __future__ import annotations

import json

import pytest
import yaml

from hostile_support import run, tiny_onnx, write_mlp

STAGES = {
    "tk-import": lambda tmp: [tiny_onnx(tmp / "m.onnx")],
    "tk-roll": lambda tmp: [write_mlp(tmp), "--hw", "h100"],
    "tk-weld": lambda tmp: [write_mlp(tmp), "--hw", "h100"],
    "tk-grind": lambda tmp: [write_mlp(tmp), "--hw", "h100"],
    "tk-ram": lambda tmp: [_welded(tmp), "--hw", "h100"],
    "tk-codegen": lambda tmp: [write_mlp(tmp)],
}


def _welded(tmp):
    rolled = tmp / "rolled.yaml"
    assert run("tk-roll", write_mlp(tmp), "--hw", "h100", "-o", rolled).exit_code == 0
    welded = tmp / "welded.yaml"
    assert run("tk-weld", rolled, "-o", welded).exit_code == 0
    return welded


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("tool", sorted(STAGES))
@pytest.mark.parametrize("name, want", [("out.json", "json"), ("out.JSON", "json"),
                                        ("out.yaml", "yaml"), ("out.yml", "yaml"),
                                        ("out.tk", "yaml")])
def test_format_follows_the_output_suffix(tmp_path, tool, name, want):
    args = STAGES[tool](tmp_path)
    out = tmp_path / name
    result = run(tool, *args, "-o", out)
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    assert _is_json(text) == (want == "json"), text[:80]
    assert yaml.safe_load(text)["tilekit"] == 1


@pytest.mark.parametrize("tool", ["tk-import", "tk-roll", "tk-codegen"])
def test_explicit_format_wins(tmp_path, tool):
    args = STAGES[tool](tmp_path)
    result = run(tool, *args, "-o", tmp_path / "out.json", "--format", "yaml")
    assert result.exit_code == 0, result.stderr
    assert not _is_json((tmp_path / "out.json").read_text())
    result = run(tool, *args, "-o", tmp_path / "out.yaml", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert _is_json((tmp_path / "out.yaml").read_text())


def test_stdout_stays_yaml_by_default(tmp_path):
    result = run("tk-roll", write_mlp(tmp_path), "--hw", "h100")
    assert result.exit_code == 0 and result.stdout.startswith("tilekit: 1\n")
