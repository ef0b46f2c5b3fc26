"""Every field of an IR document, at every level, replaced by a value of the wrong type (null,
a number, a huge number, NaN, a string, a list, a mapping, a boolean): the command reading it
either accepts it or refuses it in one line (exit 2), never a traceback or exit 1, and a
refusal writes nothing.

By default the imported document through `tk-run` (the reference executor); with
`TILEKIT_FULL=1` also the rolled document (`tk-roll --hw milan`) through `tk-weld` and the
welded one through `tk-ram`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from hostile_support import run, write_mlp
from scope import on

WRONG = [None, 7, 10 ** 30, float("nan"), "zz", [1, "a"], {"a": 1}, True]


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):
            yield from _paths(value, path + (i,))


def _replaced(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _sweep(folder: Path, doc: dict, tool: str, extra: list[str],
           paths: list[tuple] | None = None) -> list[str]:
    """Run `tool` on every replacement (of every field, or of `paths`); the list of what
    broke the rule."""
    bad = []
    for path in paths if paths is not None else [p for p in _paths(doc) if p]:
        for value in WRONG:
            (folder / "fz.json").write_text(json.dumps(_replaced(doc, path, value)))
            out = folder / "fz.out.yaml"
            result = run(tool, "fz.json", *extra, folder=folder)
            lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
            refused_cleanly = result.exit_code == 2 and len(lines) == 1 and \
                lines[0].startswith(f"{tool}: error: ") and not out.exists()
            if "Traceback" in result.stderr or result.exit_code not in (0, 2) or \
                    (result.exit_code == 2 and not refused_cleanly):
                bad.append(f"{path} = {value!r}: exit {result.exit_code}: "
                           f"{result.stderr.strip()[-200:]}")
            out.unlink(missing_ok=True)
    return bad


def test_imported_document_through_tk_run(tmp_path):
    doc = json.loads(write_mlp(tmp_path).read_text())
    assert _sweep(tmp_path, doc, "tk-run", ["--mode", "whole", "--seed", "0"]) == []


@pytest.mark.skipif(not on("TILEKIT_FULL"), reason="minutes: run with TILEKIT_FULL=1")
@pytest.mark.parametrize("stage,tool", [("roll", "tk-weld"), ("weld", "tk-ram")])
def test_staged_documents(tmp_path, stage, tool):
    write_mlp(tmp_path)
    result = run("tk-roll", "mlp.json", "--hw", "milan", "-o", "r.yaml", folder=tmp_path)
    assert result.exit_code == 0, result.stderr
    name = "r.yaml"
    if stage == "weld":
        result = run("tk-weld", "r.yaml", "-o", "w.yaml", folder=tmp_path)
        assert result.exit_code == 0, result.stderr
        name = "w.yaml"
    doc = yaml.safe_load((tmp_path / name).read_text())
    assert _sweep(tmp_path, doc, tool, ["-o", "fz.out.yaml"]) == []


def test_a_loop_body_s_op_records_through_tk_run(tmp_path):
    """The same inside a region: the ops of a Loop's body (an opaque ArgMax and the
    expression ops after it) of the greedy decoder. A region's records are read to find
    what it captures before the verifier reaches them; that read must not trip on them."""
    import sys

    import onnx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.control_models import greedy_decoder

    onnx.save(greedy_decoder(), str(tmp_path / "gd.onnx"))
    assert run("tk-import", "gd.onnx", "-o", "gd.json", folder=tmp_path).exit_code == 0
    doc = json.loads((tmp_path / "gd.json").read_text())
    (loop,) = doc["control"]
    body = ("control", loop, "body", "ops")
    assert doc["control"][loop]["body"]["ops"][0].get("opaque"), "the body starts opaque"
    paths = [p for p in _paths(doc) if p[:4] == body and len(p) > 4 and p[4] in (0, 1)]
    assert len(paths) >= 8
    assert _sweep(tmp_path, doc, "tk-run", ["--mode", "whole", "--seed", "0"],
                  paths) == []
