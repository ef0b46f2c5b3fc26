"""tk-weld in the hostile-input families: an unbounded document, a closed stdout, hostile
payloads in a welded group (wrong types, huge numbers, names that are not ops), an output
that would replace its input; each one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os

import pytest

from hostile_support import assert_refused, env_limit, run, spawn, write_mlp


def test_dev_zero_as_the_document(monkeypatch):
    with env_limit(monkeypatch, "TILEKIT_MAX_INPUT_BYTES", "1M"):
        assert_refused(run("tk-weld", "/dev/zero", "--hw", "h100"), "tk-weld")


def test_closed_stdout(tmp_path):
    ir = write_mlp(tmp_path)
    proc = spawn("tk-weld", ir, "--hw", "h100", folder=tmp_path, stdout=None, stderr=-1,
                 preexec_fn=lambda: os.close(1))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "stdout" in err, err


def test_output_over_the_input_is_refused(tmp_path):
    ir = write_mlp(tmp_path)
    before = ir.read_bytes()
    assert_refused(run("tk-weld", ir, "--hw", "h100", "-o", ir), "tk-weld", "-o")
    assert ir.read_bytes() == before


@pytest.mark.parametrize("field, value, words", [
    ("members", "x" * 10, ["members", "must be a list"]),
    ("edges", [{"tensor": "h", "from": "fc1", "to": [], "level": "shared"}], ["edges[0].to"]),
    ("edges", [{"tensor": "h", "from": "fc1", "to": ["relu"], "level": 7}], ["edges[0].level"]),
    ("block", {"i": 10 ** 30}, ["block"]),
    ("recompute", "1e999", ["recompute"]),
    ("members", [{"op": "fc1", "role": "stage", "stage": 0, "region": [-1]}],
     ["members[0].region"]),
])
def test_hostile_group_payloads(tmp_path, field, value, words):
    """A welded module whose group payload is tampered with: codegen and the tiled
    executor refuse it at the field."""
    welded = tmp_path / "welded.json"
    proc = spawn("tk-weld", write_mlp(tmp_path), "--hw", "h100", "--format", "json", "-o",
                 welded, folder=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(welded.read_text())
    group = next(k for k in doc["kernels"] if k.get("tile"))
    group["tile"][field] = value
    welded.write_text(json.dumps(doc))
    for tool, extra in (("tk-codegen", []), ("tk-run", ["--mode", "tiled", "--seed", "0"])):
        assert_refused(run(tool, welded, *extra, folder=tmp_path), tool, *words)
