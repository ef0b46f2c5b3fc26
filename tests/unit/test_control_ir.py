"""Control flow in the tile IR: records read and written, regions as modules, the module
analysis seeing captures, and each verifier rule located by IR path."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from tilekit.errors import IRError, TilekitError
from tilekit.ir import dumps, loads, verify
from tilekit.ir.control import ControlOp, all_tensors, free_names, read_control, walk
from tilekit.ir.graph import graph
from tilekit.ir.model import Module, Op, Tensor

pytestmark = pytest.mark.xdist_group("control")


def loop_module(**change) -> Module:
    """y = x doubled 3 times, plus a captured bias each time; rows stacks every step."""
    body = {
        "inputs": ["i", "ci", "v"], "outputs": ["co", "v2", "row"],
        "tensors": {"i": {"shape": [], "dtype": "int64", "role": "input"},
                    "ci": {"shape": [], "dtype": "bool", "role": "input"},
                    "v": {"shape": [4], "dtype": "float32", "role": "input"},
                    "co": {"shape": [], "dtype": "bool", "role": "output"},
                    "v2": {"shape": [4], "dtype": "float32", "role": "output"},
                    "row": {"shape": [4], "dtype": "float32", "role": "output"}},
        "ops": [{"name": "go_on", "expr": "co[] = ci[]"},
                {"name": "double", "expr": "v2[i] = v[i] * 2.0 + bias[i]"},
                {"name": "keep", "expr": "row[i] = v2[i]"}]}
    record = {"kind": "loop", "trip_count": "n", "carried": ["x"], "outputs": ["y"],
              "scans": ["rows"], "max_trips": 3, "body": body}
    record.update(change)
    tensors = {"x": Tensor((4,), "float32", "input"), "n": Tensor((), "int64", "input"),
               "bias": Tensor((4,), "float32", "input"), "y": Tensor((4,), "float32", "output"),
               "rows": Tensor((3, 4), "float32", "output")}
    return Module("loop", tensors, (Op("repeat", kind="control"),), ("x", "n", "bias"),
                  ("y", "rows"), control={"repeat": record})


def test_valid_loop_round_trips_in_both_formats():
    m = loop_module()
    verify(m)
    for fmt in ("yaml", "json"):
        again = loads(dumps(m, fmt))
        assert again == m and dumps(again, fmt) == dumps(m, fmt)


def test_graph_sees_explicit_inputs_and_captures():
    node = graph(loop_module()).nodes[0]
    assert node.reads == ("n", "x", "bias") and node.writes == ("y", "rows")


def test_typed_record_round_trips():
    rec = read_control(loop_module().control)["repeat"]
    assert isinstance(rec, ControlOp) and rec.body.inputs == ("i", "ci", "v")
    assert ControlOp.read("repeat", rec.record(), "control.repeat") == rec
    assert free_names(rec.body) == ("bias",)
    m = loop_module()
    assert [p for p, _, _ in walk(m)] == ["control.repeat"]
    assert "v2" in all_tensors(m)


def broken(path, value):
    m = loop_module()
    record = copy.deepcopy(m.control["repeat"])
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return replace(m, control={"repeat": record})


@pytest.mark.parametrize("path, value, where, what", [
    (("body", "tensors", "x"), {"shape": [4], "dtype": "float32"}, "control.repeat.body."
     "tensors.x", "shadows"),
    (("body", "ops", 1, "expr"), "v2[i] = v[i] * nowhere[i]", "control.repeat",
     "'nowhere'"),
    (("body", "tensors", "v2"), {"shape": [4], "dtype": "float64", "role": "output"},
     "control.repeat.body.outputs[1]", "keeps its shape"),
    (("max_trips",), 4, "control.repeat.scans[0]", "stack"),
    (("kind",), "while", "control.repeat.kind", "unknown control kind"),
    (("cond",), "x", "control.repeat.cond", "a condition is a bool"),
    (("body", "ops", 1, "expr"), "v2[i] = v[i] +", "control.repeat.body.ops[1].expr", ""),
])
def test_rule_located_by_ir_path(path, value, where, what):
    with pytest.raises(TilekitError) as err:
        verify(broken(path, value), "m.yaml")
    message = err.value.message()
    assert f"m.yaml: {where}" in message and what in message


def test_record_without_op_and_op_without_record():
    m = loop_module()
    with pytest.raises(IRError, match="no record"):
        verify(replace(m, control={}))
    extra = {**m.control, "other": m.control["repeat"]}
    with pytest.raises(IRError, match="'other' is not a control op"):
        verify(replace(m, control=extra))


def branch_module(else_shape=(4,)) -> Module:
    def region(name, shape):
        return {"inputs": [], "outputs": [name],
                "tensors": {name: {"shape": list(shape), "dtype": "float32",
                                   "role": "output"}},
                "ops": [{"name": f"make_{name}", "expr": f"{name}[i] = x[i] + 1.0"
                         if shape == (4,) else f"{name}[i] = 0.0"}]}
    record = {"kind": "if", "cond": "p", "outputs": ["y"], "then": region("a", (4,)),
              "else": region("b", else_shape)}
    tensors = {"x": Tensor((4,), "float32", "input"), "p": Tensor((1,), "bool", "input"),
               "y": Tensor((4,), "float32", "output")}
    return Module("branch", tensors, (Op("choose", kind="control"),), ("x", "p"), ("y",),
                  control={"choose": record})


def test_branches_must_agree():
    verify(branch_module())
    with pytest.raises(IRError) as err:
        verify(branch_module(else_shape=(3,)))
    assert "control.choose.else.outputs[0]" in err.value.message()


def test_op_names_unique_across_scopes():
    m = loop_module()
    record = copy.deepcopy(m.control["repeat"])
    record["body"]["ops"][2]["name"] = "repeat"
    with pytest.raises(IRError, match="also used in another scope"):
        verify(replace(m, control={"repeat": record}))


# -- bad input through the commands: one line, exit 2 -----------------------------------------

@pytest.mark.parametrize("tool, extra", [("tk-grind", ["--hw", "h100"]),
                                         ("tk-run", ["--seed", "0"]),
                                         ("tk-roll", ["--hw", "h100"]), ("tk-codegen", [])])
def test_commands_refuse_a_broken_region_in_one_line(tmp_path, tool, extra):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
    from hostile_support import assert_refused, run

    m = broken(("body", "tensors", "x"), {"shape": [4], "dtype": "float32"})
    path = tmp_path / "m.yaml"
    path.write_text(dumps(m.with_stage("import")))
    assert_refused(run(tool, path, *extra), tool, "control.repeat.body.tensors.x", "shadows")


def test_grind_refuses_a_module_without_import_stage(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
    from hostile_support import assert_refused, run

    path = tmp_path / "m.yaml"
    path.write_text(dumps(loop_module()))
    assert_refused(run("tk-grind", path, "--hw", "h100"), "tk-grind", "import")
