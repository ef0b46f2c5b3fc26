"""A symbolic module (dimensions kept as symbols) tampered with is refused in one line (exit
2) like a static one: the structural checks run before the module is instantiated at any
size, `--dim` is read by one strict parser everywhere, and a rolled symbolic module's
`by size` tiles are read through the tile checker when a size settles them."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
import yaml

from hostile_support import assert_refused, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.onnx_models import kv_cache_step  # noqa: E402


@pytest.fixture(scope="module")
def symbolic(tmp_path_factory) -> Path:
    """kv.yaml: one attention step over a key/value cache, `seq` and `past` symbolic; and
    kv.rolled.yaml, the same rolled for the H100 (tiles decided by size)."""
    folder = tmp_path_factory.mktemp("symbolic")
    onnx.save(kv_cache_step(), str(folder / "kv.onnx"))
    result = run("tk-import", "kv.onnx", "-o", "kv.yaml", folder=folder)
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((folder / "kv.yaml").read_text())["dims"]
    result = run("tk-roll", "--hw", "h100", "kv.yaml", "-o", "kv.rolled.yaml", folder=folder)
    assert result.exit_code == 0, result.output
    return folder


def _tampered(folder: Path, source: str, change) -> str:
    doc = yaml.safe_load((folder / source).read_text())
    change(doc)
    name = f"t_{source}"
    (folder / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return name


def test_an_undeclared_input_is_named(symbolic):
    name = _tampered(symbolic, "kv.yaml", lambda d: d["inputs"].append("nosuch"))
    for tool, args in (("tk-run", ["--mode", "whole"]),
                       ("tk-roll", ["--hw", "h100", "--dim", "seq=2", "--dim", "past=3"])):
        result = run(tool, name, *args, folder=symbolic)
        assert_refused(result, tool, "inputs[", "'nosuch' is not a declared tensor")


def test_an_expression_that_is_not_text_is_named(symbolic):
    def number(doc):
        doc["ops"][0]["expr"] = 1.5
    name = _tampered(symbolic, "kv.yaml", number)
    for tool, args in (("tk-run", ["--mode", "whole"]),
                       ("tk-roll", ["--hw", "h100", "--dim", "seq=2", "--dim", "past=3"])):
        assert_refused(run(tool, name, *args, folder=symbolic), tool, "ops[0].expr")


@pytest.mark.parametrize("extra", ["0*nope", "nope - nope"])
def test_a_dimension_term_that_cancels_is_refused(symbolic, extra):
    """(`seq + 0*nope` named an undeclared symbol that the canonical form dropped unread.)"""
    def change(doc):
        tensor = next(t for t in doc["tensors"].values() if "seq" in map(str, t["shape"]))
        axis = next(i for i, d in enumerate(tensor["shape"]) if d == "seq")
        tensor["shape"][axis] = f"seq + {extra}"
    name = _tampered(symbolic, "kv.yaml", change)
    assert_refused(run("tk-run", name, "--mode", "whole", folder=symbolic), "tk-run",
                   "names 'nope', which is not declared in 'dims'")


@pytest.mark.parametrize("field,value", [("kernel", "zz"), ("thread", None),
                                         ("thread", {"nope": 1}), ("block", "big")])
def test_a_by_size_tile_is_read_by_the_tile_checker(symbolic, field, value):
    """tk-roll of a symbolic module leaves tiles whose kernel is decided by size; a stage
    given --dim settles them. A tile field of the wrong form is refused at its IR path (or,
    when the checker takes the form, settled as it would be: a missing thread is 1, the
    kernel record is the stage's to write), never an internal error."""
    doc = yaml.safe_load((symbolic / "kv.rolled.yaml").read_text())
    index = next(i for i, op in enumerate(doc["ops"])
                 if isinstance(op.get("tile"), dict) and op["tile"].get("kernel", {}) != {}
                 and op["tile"].get("block"))

    def change(d):
        d["ops"][index]["tile"][field] = value
    name = _tampered(symbolic, "kv.rolled.yaml", change)
    result = run("tk-weld", name, "--dim", "seq=2", "--dim", "past=3", "-o", "w.yaml",
                 folder=symbolic)
    if (field, value) in (("kernel", "zz"), ("thread", None)):
        assert result.exit_code == 0, result.output
    else:
        assert_refused(result, "tk-weld", f"ops[{index}]", f"tile.{field}")


@pytest.mark.parametrize("flag", ["seq=3_0", "seq=\u0663", "seq=3,1234567890123", "seq=3,,4",
                                  "seq=", "=3", "seq=-1", "seq=0x3"])
def test_dim_sizes_are_ascii_digits_everywhere(symbolic, flag):
    """`int` reads '3_0' as 30 and Arabic-Indic digits as digits; tk-run's --dim took them
    (and dropped a 13-digit size from a list), where the stages refused them."""
    for tool, args in (("tk-run", ["--mode", "whole"]), ("tk-roll", ["--hw", "h100"])):
        result = run(tool, "kv.yaml", *args, "--dim", flag, "--dim", "past=1",
                     folder=symbolic)
        assert_refused(result, tool, "cannot read --dim")


def test_dim_twice_and_dim_on_a_static_module(symbolic, tmp_path):
    result = run("tk-run", "kv.yaml", "--mode", "whole", "--dim", "seq=3", "--dim", "seq=4",
                 "--dim", "past=1", folder=symbolic)
    assert_refused(result, "tk-run", "--dim names 'seq' twice")
    result = run("tk-import", "kv.onnx", "--dim", "seq=2", "--dim", "past=3", "-o",
                 str(tmp_path / "static.yaml"), folder=symbolic)
    assert result.exit_code == 0, result.output
    result = run("tk-run", str(tmp_path / "static.yaml"), "--mode", "whole", "--dim", "seq=2",
                 folder=symbolic)
    assert_refused(result, "tk-run", "--dim", "no symbolic dimensions")


@pytest.mark.parametrize("flags", [[], ["--dim", "x_0=2"]])
def test_an_input_axis_declared_of_size_zero_is_an_open_dimension_with_a_warning(tmp_path,
                                                                               flags):
    """ONNX's dim_value 0 is an empty tensor's size, which tilekit does not run, and what some
    exporters write for a size they do not know: it imports as an open dimension, said so."""
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "zero.onnx"))
    result = run("tk-import", "zero.onnx", *flags, "-o", "zero.yaml", folder=tmp_path)
    assert result.exit_code == 0, result.output
    assert ("input 'x' declares axis 0 of size 0 (an empty tensor, or an exporter's unknown "
            "size): imported as the open dimension x_0") in result.output
    shape = yaml.safe_load((tmp_path / "zero.yaml").read_text())["tensors"]["x"]["shape"]
    assert shape == ([2, 3] if flags else ["x_0", 3])
