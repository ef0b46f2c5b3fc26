"""Class 5d: a weights sidecar another IR names is never replaced by other weights.

`tk-import m.onnx > a.yaml` then `tk-import m.onnx --dtype float16 > b.yaml` wrote both
sidecars to `m.weights.npz`: the second replaced the first, and `a.yaml` failed with a
checksum mismatch. A default sidecar name that already holds other weights is now left alone
and the new weights go to `<stem>.<first 12 hex of their sha256>.weights.npz`, with a warning;
the same weights still share one file. `--weights FILE` is the user's choice and is replaced.
"""

from __future__ import annotations

import hashlib

import yaml

from hostile_support import run, sha256, tiny_onnx


def _runs(folder, ir) -> bool:
    result = run("tk-run", ir, "--seed", "0", folder=folder)
    return result.exit_code == 0


def _sidecar(ir) -> str:
    return yaml.safe_load(ir.read_text())["weights"]["file"]


def test_two_dtypes_through_stdout_keep_their_sidecars(tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx", size=16)
    first = run("tk-import", "m.onnx", folder=tmp_path)
    assert first.exit_code == 0 and first.stderr == ""
    (tmp_path / "a.yaml").write_text(first.stdout)
    second = run("tk-import", "m.onnx", "--dtype", "float16", folder=tmp_path)
    assert second.exit_code == 0, second.stderr
    (tmp_path / "b.yaml").write_text(second.stdout)
    a, b = _sidecar(tmp_path / "a.yaml"), _sidecar(tmp_path / "b.yaml")
    assert a == "m.weights.npz" and b != a
    digest = sha256(tmp_path / b)
    assert b == f"m.{digest[:12]}.weights.npz"
    assert "m.weights.npz holds other weights" in second.stderr
    assert len(second.stderr.splitlines()) == 1
    assert _runs(tmp_path, tmp_path / "a.yaml") and _runs(tmp_path, tmp_path / "b.yaml")
    assert model.exists()


def test_yaml_and_json_outputs_of_one_stem(tmp_path):
    """-o m.yaml and -o m.json both default to m.weights.npz."""
    tiny_onnx(tmp_path / "m.onnx", size=16)
    assert run("tk-import", "m.onnx", "-o", "m.yaml", folder=tmp_path).exit_code == 0
    result = run("tk-import", "m.onnx", "--dtype", "bfloat16", "-o", "m.json",
                 folder=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert _sidecar(tmp_path / "m.yaml") != _sidecar(tmp_path / "m.json")
    assert _runs(tmp_path, tmp_path / "m.yaml") and _runs(tmp_path, tmp_path / "m.json")


def test_the_same_weights_share_the_default_name(tmp_path):
    tiny_onnx(tmp_path / "m.onnx", size=16)
    assert run("tk-import", "m.onnx", "-o", "a.yaml", "--weights", "m.weights.npz",
               folder=tmp_path).exit_code == 0
    again = run("tk-import", "m.onnx", folder=tmp_path)
    assert again.exit_code == 0 and again.stderr == ""
    assert yaml.safe_load(again.stdout)["weights"]["file"] == "m.weights.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "m.onnx", "m.weights.npz"]


def test_reimport_keeps_the_stages_rolled_from_the_old_one(tmp_path):
    """A changed model imported over m.yaml: the IR rolled from the old import names the old
    sidecar and still runs; the new IR runs with its own."""
    tiny_onnx(tmp_path / "m.onnx", size=16)
    assert run("tk-import", "m.onnx", "-o", "m.yaml", folder=tmp_path).exit_code == 0
    assert run("tk-roll", "m.yaml", "--hw", "h100", "-o", "rolled.yaml",
               folder=tmp_path).exit_code == 0
    tiny_onnx(tmp_path / "m.onnx", size=16, w="w2")  # another model, same file name
    result = run("tk-import", "m.onnx", "-o", "m.yaml", "-q", folder=tmp_path)
    assert result.exit_code == 0 and result.stderr == ""  # -q: no warning
    assert _sidecar(tmp_path / "rolled.yaml") == "m.weights.npz"
    assert _sidecar(tmp_path / "m.yaml") != "m.weights.npz"
    assert _runs(tmp_path, tmp_path / "rolled.yaml") and _runs(tmp_path, tmp_path / "m.yaml")


def test_a_named_sidecar_is_replaced_as_asked(tmp_path):
    tiny_onnx(tmp_path / "m.onnx", size=16)
    assert run("tk-import", "m.onnx", "-o", "a.yaml", folder=tmp_path).exit_code == 0
    before = hashlib.sha256((tmp_path / "a.weights.npz").read_bytes()).hexdigest()
    result = run("tk-import", "m.onnx", "--dtype", "float16", "-o", "b.yaml", "--weights",
                 "a.weights.npz", folder=tmp_path)
    assert result.exit_code == 0 and result.stderr == ""
    assert sha256(tmp_path / "a.weights.npz") != before
    assert _sidecar(tmp_path / "b.yaml") == "a.weights.npz"
