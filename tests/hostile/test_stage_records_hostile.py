"""tk-ram and tk-grind in the hostile-input families: an unbounded document, a closed stdout,
an output over its input, and tampered `program` sections and `control` records (wrong types,
huge counts, names that are not kernels, text where items go, a plan that can deadlock); each
one line, exit 2, nothing written, for every command that reads them."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import onnx
import pytest

from hostile_support import assert_refused, env_limit, run, spawn, write_mlp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import control_models  # noqa: E402

#: One worker runs this file (an xdist group): the planned, ground, welded and rolled
#: fixtures are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("stage-records-hostile")

STAGES = [("tk-ram", ["--hw", "h100"]), ("tk-grind", ["--hw", "h100"])]


@pytest.mark.parametrize("tool, extra", STAGES)
def test_dev_zero_as_the_document(monkeypatch, tool, extra):
    with env_limit(monkeypatch, "TILEKIT_MAX_INPUT_BYTES", "1M"):
        assert_refused(run(tool, "/dev/zero", *extra), tool)


@pytest.mark.parametrize("tool, extra", STAGES)
def test_closed_stdout(tmp_path, tool, extra):
    ir = write_mlp(tmp_path)
    proc = spawn(tool, ir, *extra, folder=tmp_path, stdout=None, stderr=-1,
                 preexec_fn=lambda: os.close(1))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "stdout" in err, err


@pytest.mark.parametrize("tool, extra", STAGES)
def test_output_over_the_input_is_refused(tmp_path, tool, extra):
    ir = write_mlp(tmp_path)
    before = ir.read_bytes()
    assert_refused(run(tool, ir, *extra, "-o", ir), tool, "-o")
    assert ir.read_bytes() == before


@pytest.fixture(scope="session")
def planned(tmp_path_factory) -> dict:
    """An MLP with a tk-ram program (one persistent segment), as JSON data."""
    folder = tmp_path_factory.mktemp("planned")
    out = folder / "planned.json"
    proc = spawn("tk-ram", write_mlp(folder), "--hw", "h100", "--format", "json", "-o", out,
                 folder=folder)
    assert proc.returncode == 0, proc.stderr
    return {"folder": folder, "doc": json.loads(out.read_text())}


def _list0(p, text):
    seg = next(s for s in p["segments"] if s["kind"] == "persistent")
    seg["lists"][0] = text


@pytest.mark.parametrize("case, change, words", [
    ("huge tasks", lambda p: p["operators"][0].update(tasks=10 ** 15), ["rTask count limit"]),
    ("float tasks", lambda p: p["operators"][0].update(tasks=1.5), ["operators[0].tasks"]),
    ("huge threads", lambda p: p["segments"][0].update(threads=10 ** 9), ["at most 1024"]),
    ("no vEUs", lambda p: p["segments"][0].update(veus=0), ["veus"]),
    ("not a kernel", lambda p: p["operators"][0].update(kernel="k\n#include <x>"),
     ["operators[0].kernel"]),
    ("text as items", lambda p: _list0(p, "\n#include <stdlib.h>\n"), ["item 0"]),
    ("huge block range", lambda p: _list0(p, "0:0+99999999999"), ["lists[0]"]),
    ("unknown policy", lambda p: p.update(policy="fastest"), ["policy"]),
    ("no segments", lambda p: p.update(segments=[]), ["is in no segment"]),
    ("operators not a list", lambda p: p.update(operators="x" * 10), ["operators"]),
    ("negative task time", lambda p: p["operators"][0].update(task_us=-1.0),
     ["operators[0].task_us", "finite number >= 0"]),
    ("text as a time", lambda p: p["operators"][0].update(kernel_us="fast"),
     ["operators[0].kernel_us"]),
])
def test_tampered_programs(planned, case, change, words):
    doc = copy.deepcopy(planned["doc"])
    assert any(s["kind"] == "persistent" for s in doc["program"]["segments"]), "nothing packed"
    change(doc["program"])
    path = planned["folder"] / f"tampered-{case.replace(' ', '-')}.json"
    path.write_text(json.dumps(doc))
    for tool, extra in (("tk-codegen", []), ("tk-run", ["--mode", "program", "--seed", "0"])):
        assert_refused(run(tool, path, *extra, folder=planned["folder"]), tool, *words)


def test_a_plan_that_can_deadlock_is_refused(planned):
    """A vEU that waits on an operator whose tasks it runs itself, later: never launched."""
    doc = copy.deepcopy(planned["doc"])
    seg = next(s for s in doc["program"]["segments"] if s["kind"] == "persistent")
    first = seg["lists"][0].split()
    op = next(w.split(":")[0] for w in first if ":" in w)
    seg["lists"][0] = " ".join([f"w{op}", *first])
    path = planned["folder"] / "deadlock.json"
    path.write_text(json.dumps(doc))
    for tool in ("tk-codegen", "tk-run"):
        assert_refused(run(tool, path, folder=planned["folder"]), tool, "deadlock")


def _lstm_through(folder: Path, stage: str) -> dict:
    """The LSTM-as-a-Loop model imported, rolled and through `stage`, as JSON data."""
    onnx.save(control_models.lstm_loop(), str(folder / "lstm.onnx"))
    for tool, args in (("tk-import", ["lstm.onnx", "-o", "lstm.yaml"]),
                       ("tk-roll", ["lstm.yaml", "--hw", "h100", "-o", "rolled.yaml"]),
                       (stage, ["rolled.yaml", "--format", "json", "-o", "out.json"])):
        proc = spawn(tool, *args, folder=folder)
        assert proc.returncode == 0, proc.stderr
    return {"folder": folder, "doc": json.loads((folder / "out.json").read_text())}


@pytest.fixture(scope="session")
def ground(tmp_path_factory) -> dict:
    """The LSTM-as-a-Loop model imported, rolled and ground, as JSON data."""
    return _lstm_through(tmp_path_factory.mktemp("ground"), "tk-grind")


@pytest.mark.parametrize("case, change, words", [
    ("run elsewhere", lambda r: r["grind"].update(run="gpu0"), ["grind"]),
    ("grind not a mapping", lambda r: r.update(grind=[1, 2]), ["grind"]),
    ("estimate not a mapping", lambda r: r["grind"].update(estimate="fast"),
     ["grind.estimate"]),
    ("negative grid", lambda r: r["grind"]["estimate"].update(grid=-1),
     ["grind.estimate.grid", "positive whole number"]),
    ("grid as text", lambda r: r["grind"]["estimate"].update(grid="zz"),
     ["grind.estimate.grid"]),
    ("trip count not a tensor", lambda r: r.update(trip_count="nope\n#x"), ["control"]),
    ("carried not a list", lambda r: r.update(carried="h"), ["carried"]),
    ("body not a mapping", lambda r: r.update(body=7), ["body"]),
])
def test_tampered_control_records(ground, case, change, words):
    doc = copy.deepcopy(ground["doc"])
    change(next(iter(doc["control"].values())))
    path = ground["folder"] / f"tampered-{case.replace(' ', '-')}.json"
    path.write_text(json.dumps(doc))
    for tool, extra in (("tk-codegen", []), ("tk-run", ["--seed", "0"]),
                        ("tk-ram", ["--hw", "h100"])):
        assert_refused(run(tool, path, *extra, folder=ground["folder"]), tool, *words)


@pytest.fixture(scope="session")
def welded_loop(tmp_path_factory) -> dict:
    """The LSTM-as-a-Loop model welded: its loop body holds welded groups."""
    return _lstm_through(tmp_path_factory.mktemp("welded-loop"), "tk-weld")


def _tampered_body(welded_loop: dict, section: str, field: str, value) -> Path:
    """The welded loop with `field` of the first tile in its body's `section` (ops or
    kernels) set to `value`, written to a file."""
    doc = copy.deepcopy(welded_loop["doc"])
    entries = next(iter(doc["control"].values()))["body"][section]
    first = next(e for e in entries if e.get("tile") and e.get("kind", "expr") == "expr")
    first["tile"][field] = value
    path = welded_loop["folder"] / f"tampered-{section}-{field}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("field, value, words", [
    ("members", "x" * 10, ["control.lstm.body.kernels", "members"]),
    ("block", {"i": 10 ** 30}, ["control.lstm.body.kernels", "block"]),
    ("stored", ["no_such_tensor"], ["control.lstm.body.kernels", "stored"]),
])
def test_tampered_groups_inside_a_region(welded_loop, field, value, words):
    """A region's welded groups are checked like the module's: codegen and the CPU executor
    refuse a tampered payload, located in the region's record."""
    path = _tampered_body(welded_loop, "kernels", field, value)
    for tool, extra in (("tk-codegen", []), ("tk-run", ["--seed", "0"])):
        assert_refused(run(tool, path, *extra, folder=welded_loop["folder"]), tool, *words)


@pytest.mark.parametrize("field, value", [("blocks", []), ("threads", "many"),
                                          ("estimate", {"time_us": "slow"})])
def test_tampered_tiles_inside_a_region(welded_loop, field, value):
    """tk-grind prices a loop body from its ops' tiles: a tampered one is located, exit 2."""
    path = _tampered_body(welded_loop, "ops", field, value)
    assert_refused(run("tk-grind", path, "--hw", "h100", folder=welded_loop["folder"]),
                   "tk-grind", "control.lstm.body.ops[", f".tile.{field}")


@pytest.mark.parametrize("shape", [{"a": 1}, ["staged"], 7])
def test_a_kernel_record_of_another_form_inside_a_region(welded_loop, shape):
    """A tile's `kernel.shape` is tk-roll's note of the shape it priced (codegen decides the
    shape itself): tk-grind reads it as a note, as for a module's own ops (a mapping there
    was used as a dictionary key: exit 1)."""
    doc = copy.deepcopy(welded_loop["doc"])
    ops = next(iter(doc["control"].values()))["body"]["ops"]
    first = next(op for op in ops if isinstance((op.get("tile") or {}).get("kernel"), dict))
    first["tile"]["kernel"]["shape"] = shape
    path = welded_loop["folder"] / "tampered-kernel-shape.json"
    path.write_text(json.dumps(doc))
    result = run("tk-grind", path, "--hw", "h100", "-o", "g.json", folder=welded_loop["folder"])
    assert result.exit_code == 0, result.stderr


@pytest.fixture(scope="session")
def rolled_plan(tmp_path_factory) -> dict:
    """The MLP rolled with runners-up and planned by tk-ram, as JSON data."""
    folder = tmp_path_factory.mktemp("rolled-plan")
    mlp = write_mlp(folder)
    for tool, args in (("tk-roll", [mlp, "--hw", "h100", "--top-k", "2", "-o", "r.json"]),
                       ("tk-ram", ["r.json", "--format", "json", "-o", "p.json"])):
        proc = spawn(tool, *args, folder=folder)
        assert proc.returncode == 0, proc.stderr
    return {"folder": folder, "doc": json.loads((folder / "p.json").read_text())}


@pytest.mark.parametrize("field, value", [("flops", "abc"), ("dram_bytes", -5),
                                          ("waves", "abc"), ("bound", "vibes")])
def test_tampered_estimates(rolled_plan, field, value):
    """An estimate's numbers are read by tk-weld and tk-ram: each refused at its path."""
    doc = copy.deepcopy(rolled_plan["doc"])
    doc.pop("program")
    doc["ops"][0]["tile"]["estimate"][field] = value
    path = rolled_plan["folder"] / f"tampered-estimate-{field}.json"
    path.write_text(json.dumps(doc))
    for tool in ("tk-ram", "tk-weld"):
        assert_refused(run(tool, path, "--hw", "h100", folder=rolled_plan["folder"]), tool,
                       f"tile.estimate.{field}")


def test_a_variant_the_operator_lacks(rolled_plan):
    doc = copy.deepcopy(rolled_plan["doc"])
    doc["program"]["operators"][0]["variant"] = 7
    path = rolled_plan["folder"] / "tampered-variant.json"
    path.write_text(json.dumps(doc))
    for tool, extra in (("tk-codegen", []), ("tk-run", ["--mode", "program", "--seed", "0"])):
        assert_refused(run(tool, path, *extra, folder=rolled_plan["folder"]), tool,
                       "variant 7")


@pytest.mark.parametrize("section, field, value", [
    ("ops", "block", {"i": 1.5}), ("ops", "thread", {"j": []}),
    ("kernels", "edges", [{"tensor": "t", "from": "a", "to": ["b"], "level": "vibes"}])])
@pytest.mark.parametrize("tool", ["tk-grind", "tk-ram", "tk-weld"])
def test_payloads_a_stage_passes_on_are_checked_on_reading(welded_loop, section, field, value,
                                                            tool):
    """A stage that does not use a payload still refuses a tampered one (it copied it on,
    exit 0, and the command after it refused it)."""
    path = _tampered_body(welded_loop, section, field, value)
    assert_refused(run(tool, path, "--hw", "h100", folder=welded_loop["folder"]), tool,
                   f"control.lstm.body.{section}[", f".tile.{field}")


def test_a_program_for_an_unknown_profile(rolled_plan):
    doc = copy.deepcopy(rolled_plan["doc"])
    doc["program"]["hardware"] = "nope"
    path = rolled_plan["folder"] / "tampered-hardware.json"
    path.write_text(json.dumps(doc))
    assert_refused(run("tk-run", path, "--mode", "program", "--seed", "0",
                       folder=rolled_plan["folder"]), "tk-run", "program.hardware", "'nope'")
