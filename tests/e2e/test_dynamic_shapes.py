"""Symbolic dimensions end to end: a model with a dynamic batch and sequence imported once
(no --shape), run and checked against onnxruntime at several sizes from the one module, on
the reference executor and as compiled C++; what cannot take a symbolic module refuses it in
one line. The corpus (tests/corpus, stage `symbolic`) does the same on exported GPT-2, BERT
and ResNet files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from clirun import run_in
from onnx import TensorProto, helper, numpy_helper

from models.onnx_models import kv_cache_step
from tilekit.cli import tk_codegen, tk_import, tk_roll, tk_run, tk_weld
from tilekit.codegen.nvcc import find_nvcc
from tilekit.errors import TilekitError


def _model(path: Path) -> None:
    """x[batch, seq, 8] -> x @ W -> reshape [batch*seq, 8] (computed from Shape) -> softmax
    -> reshape back -> + the position table's first seq rows (a Slice) + each position
    (a Range over the sequence) + 0.5 (a ConstantOfShape of x's shape)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    table = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "table")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", 0), ("one", 1), ("i0", [0]), ("i1", [1]), ("eight", [8]),
               ("minus1", [-1]), ("axes1", [1]))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Mul", ["b", "s"], ["bs"]),
        helper.make_node("Concat", ["bs", "eight"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["xw", "flat_shape"], ["flat"]),
        helper.make_node("Softmax", ["flat"], ["soft"], axis=-1),
        helper.make_node("Concat", ["minus1", "s", "eight"], ["back_shape"], axis=0),
        helper.make_node("Reshape", ["soft", "back_shape"], ["back"]),
        helper.make_node("Squeeze", ["s"], ["s_scalar"]),
        helper.make_node("Range", ["zero", "s_scalar", "one"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["fpos"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["fpos", "axes1"], ["column"]),
        helper.make_node("Slice", ["table", "i0", "s"], ["pos"]),
        helper.make_node("Add", ["back", "pos"], ["shifted"]),
        helper.make_node("Add", ["shifted", "column"], ["moved"]),
        helper.make_node("ConstantOfShape", ["shape"], ["halves"],
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Add", ["moved", "halves"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    graph = helper.make_graph(nodes, "g", [x], [y], [w, table] + consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))


invoke = run_in


@pytest.fixture(scope="session")
def imported(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dyn")
    _model(folder / "m.onnx")
    result = invoke(tk_import.main, ["m.onnx", "-o", "m.yaml"], folder)
    assert result.exit_code == 0, result.output
    return folder


def test_import_keeps_the_dimensions_symbolic(imported):
    doc = yaml.safe_load((imported / "m.yaml").read_text())
    assert doc["tilekit"] == 2
    # the position table has 32 rows: the sequence's default range is narrowed to it
    assert doc["dims"] == {"batch": {"min": 1, "max": 4096}, "seq": {"min": 1, "max": 32}}
    shapes = {n: t["shape"] for n, t in doc["tensors"].items()}
    assert shapes["x"] == ["batch", "seq", 8]
    assert ["batch*seq", 8] in shapes.values()
    exprs = " ".join(op.get("expr", "") for op in doc["ops"])
    assert "$seq" in exprs  # the reshapes' index maps are written in the symbols
    assert "positions[" in exprs  # the Range over the sequence stayed an op, not a weight


def test_import_is_deterministic(imported):
    again = invoke(tk_import.main, ["m.onnx", "-o", "again.yaml"], imported)
    assert again.exit_code == 0, again.output
    first = (imported / "m.yaml").read_text()
    assert (imported / "again.yaml").read_text() == first.replace("m.weights.npz",
                                                                  "again.weights.npz")


@pytest.mark.parametrize("mode", ["whole", "compiled"])
def test_one_module_checks_at_several_sizes(imported, mode):
    args = ["m.yaml", "--dim", "batch=1,3", "--dim", "seq=1,7", "--check", "--mode", mode,
            "-q"]
    if mode == "compiled":
        args = ["m.yaml", "--dim", "batch=2", "--dim", "seq=5", "--check", "--mode", mode,
                "-q"]
    result = invoke(tk_run.main, args, imported)
    assert result.exit_code == 0, result.output
    runs = 4 if mode == "whole" else 1
    assert result.output.count("check: pass") == runs, result.output
    assert result.output.count("dims: batch=") == runs


def test_sizes_come_from_the_input_arrays(imported):
    np.save(imported / "x.npy", np.ones((2, 9, 8), np.float32))
    result = invoke(tk_run.main, ["m.yaml", "--input", "x=@x.npy", "--check", "-q",
                                  "--mode", "whole"], imported)
    assert result.exit_code == 0, result.output
    assert "dims: batch=2, seq=9" in result.output


@pytest.mark.parametrize("args,message", [
    (["--dim", "seq=33"], "seq = 33 (from --dim) is outside its range 1..32"),
    (["--dim", "nope=3"], "--dim names 'nope', which is not a symbol"),
    (["--dim", "seq=x"], "cannot read --dim"),
    (["--dim", "seq=2,3", "-o", "out.npz"], "-o writes the outputs of one run"),
    (["--input", "x=@wide.npy"], "input 'x' has shape [2, 3, 9], expected [2, 3, 8]"),
    (["--input", "x=@long.npy"], "seq = 40 (from input 'x') is outside its range 1..32"),
])
def test_bad_sizes_are_one_line_errors(imported, args, message):
    np.save(imported / "wide.npy", np.ones((2, 3, 9), np.float32))
    np.save(imported / "long.npy", np.ones((1, 40, 8), np.float32))
    result = invoke(tk_run.main, ["m.yaml", "--mode", "whole"] + args, imported)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not (imported / "out.npz").exists()


@pytest.mark.parametrize("command,args", [
    (tk_weld.main, ["--hw", "h100"]), (tk_codegen.main, []),
    (tk_codegen.main, ["--target", "cpu"]),
])
def test_stages_that_need_sizes_refuse_a_symbolic_module(imported, command, args):
    result = invoke(command, args + ["m.yaml", "-o", "staged.yaml"], imported)
    assert result.exit_code == 2, result.output
    assert "needs static sizes; this module has symbolic dimensions batch (1..4096), seq " \
           "(1..32)" in result.output and "--dim batch=1 --dim seq=1" in result.output
    assert not (imported / "staged.yaml").exists()


def test_one_roll_serves_the_range_on_a_cpu(imported):
    """tk-roll on a symbolic module for a CPU profile: the module stays symbolic, each op's
    tile has its micro-kernel and its kernel decided by size (priced at the pricing sizes),
    and one rolled file runs and checks at several sizes, compiled."""
    result = invoke(tk_roll.main, ["m.yaml", "--hw", "milan", "-o", "rolled.yaml"], imported)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((imported / "rolled.yaml").read_text())
    assert doc["dims"] == {"batch": {"min": 1, "max": 4096}, "seq": {"min": 1, "max": 32}}
    tiles = [op["tile"] for op in doc["ops"] if op.get("kind", "expr") == "expr"]
    assert tiles and all(t["kernel"] == {"shape": "by size"} and len(t["priced"]) > 1
                         and len(t["micro"]) == 2 for t in tiles)
    again = invoke(tk_roll.main, ["m.yaml", "--hw", "milan", "-o", "again.yaml"], imported)
    assert (imported / "again.yaml").read_text() == (imported / "rolled.yaml").read_text()
    result = invoke(tk_run.main, ["rolled.yaml", "--dim", "batch=1,2", "--dim", "seq=5,20",
                                  "--mode", "compiled", "--check", "-q"], imported)
    assert result.exit_code == 0, result.output
    assert result.output.count("check: pass") == 4, result.output


def test_one_roll_serves_the_range_on_a_gpu(imported, tmp_path, monkeypatch):
    """tk-roll on a symbolic module for a GPU profile (DietCode on Roller's tiles): the
    module stays symbolic, each expr op keeps one tile for the range (no grid: each size's),
    its kernel decided by size and priced at every pricing size; the roll is deterministic;
    one rolled file checks at several sizes on the CPU, and its CUDA kernels, generated at
    each size and emulated with the sizes' tables, equal the reference executor, the sizes
    sharing two templates (one token of batch 1, and the rest). A stage given sizes decides
    the kernels at them (`settle`): tiles as a static roll writes them."""
    from tilekit.codegen.emulate import emulate
    from tilekit.ir import read_module
    from tilekit.ir.dims import instantiate
    from tilekit.runtime import backend
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants
    from tilekit.runtime.io import gather_inputs, load_weights

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    result = invoke(tk_roll.main, ["m.yaml", "--hw", "h100", "-o", "gpu.yaml"], imported)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((imported / "gpu.yaml").read_text())
    assert doc["dims"] == {"batch": {"min": 1, "max": 4096}, "seq": {"min": 1, "max": 32}}
    tiles = [op["tile"] for op in doc["ops"] if op.get("kind", "expr") == "expr"
             and op.get("tile")]
    assert tiles and all(t["kernel"] == {"shape": "by size"} and len(t["priced"]) > 1
                         and "grid" not in t and t["block"] for t in tiles)
    assert {p["kernel"] for t in tiles for p in t["priced"]} >= {"tiled"}
    again = invoke(tk_roll.main, ["m.yaml", "--hw", "h100", "-o", "again.yaml"], imported)
    assert again.exit_code == 0
    assert (imported / "again.yaml").read_text() == (imported / "gpu.yaml").read_text()
    result = invoke(tk_run.main, ["gpu.yaml", "--dim", "batch=1,3", "--dim", "seq=1,16",
                                  "--check", "-q"], imported)
    assert result.exit_code == 0 and result.output.count("check: pass") == 4, result.output
    module = read_module(str(imported / "gpu.yaml"))
    base = load_weights(module, str(imported))
    family = CompiledFamily(module, base, "cuda")
    for batch, seq in ((1, 1), (1, 5), (3, 16), (7, 31)):
        values = {"batch": batch, "seq": seq}
        instance, weights = fold_constants(instantiate(module, values), base)
        code, unit = family.code(instance, values)
        feeds = gather_inputs(instance, (), None, 0)
        expected = backend(instance, "cpu", "whole").run(feeds, weights)
        out = emulate(code, feeds, weights, unit=unit)
        np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-5)
        assert "tiled" in {k["shape"] for k in code.codegen["kernels"]}
    assert len(family.templates) == 2
    result = invoke(tk_weld.main, ["gpu.yaml", "--dim", "batch=2", "--dim", "seq=5", "-o",
                                   "gpu.welded.yaml"], imported)
    assert result.exit_code == 0, result.output
    static = yaml.safe_load((imported / "gpu.welded.yaml").read_text())
    settled = [op["tile"] for op in static["ops"] if op.get("kind", "expr") == "expr"
               and op.get("tile")]
    assert settled and all(t["kernel"]["shape"] != "by size" and "grid" in t
                           and "priced" not in t for t in settled)


def test_stages_specialise_a_symbolic_module_given_sizes(imported):
    """`--dim NAME=SIZE` on a stage: the module at those sizes, the sizes recorded, the
    stages after it and a compiled run as for a module imported at that size."""
    result = invoke(tk_roll.main, ["--hw", "milan", "m.yaml", "--dim", "batch=2", "--dim",
                                   "seq=5", "-o", "rolled.yaml"], imported)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((imported / "rolled.yaml").read_text())
    assert doc["tilekit"] == 1 and "dims" not in doc
    assert doc["tensors"]["x"]["shape"] == [2, 5, 8]
    assert [s["name"] for s in doc["stages"]] == ["import", "specialise", "roll"]
    assert doc["stages"][1]["options"] == {"dims": {"batch": 2, "seq": 5}}
    result = invoke(tk_codegen.main, ["rolled.yaml", "--target", "cpu", "-o", "code.yaml"],
                    imported)
    assert result.exit_code == 0, result.output
    result = invoke(tk_run.main, ["code.yaml", "--check", "-q"], imported)
    assert result.exit_code == 0 and "check: pass" in result.output, result.output


@pytest.mark.parametrize("file,args,message", [
    ("m.yaml", ["--dim", "batch=2"], "--dim gives no size for seq (1..32)"),
    ("m.yaml", ["--dim", "batch=2", "--dim", "seq=33"], "seq = 33 (from --dim) is outside"),
    ("m.yaml", ["--dim", "batch=2", "--dim", "seq=4", "--dim", "q=1"], "names 'q', which"),
    ("m.yaml", ["--dim", "batch=2", "--dim", "batch=3"], "--dim names 'batch' twice"),
    ("m.yaml", ["--dim", "batch=two"], "cannot read --dim 'batch=two'"),
    ("static.yaml", ["--dim", "batch=2"], "the module has no symbolic dimensions"),
])
def test_stage_sizes_are_checked(imported, file, args, message):
    if not (imported / "static.yaml").exists():
        invoke(tk_import.main, ["m.onnx", "--dim", "batch=2", "--dim", "seq=4", "-o",
                                "static.yaml"], imported)
    result = invoke(tk_weld.main, ["--hw", "milan", file, "-o", "welded.yaml"] + args,
                    imported)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not (imported / "welded.yaml").exists()


def test_one_size_imports_as_before(imported):
    result = invoke(tk_import.main, ["m.onnx", "--dim", "batch=2", "--dim", "seq=4", "-o",
                                     "static.yaml"], imported)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((imported / "static.yaml").read_text())
    assert doc["tilekit"] == 1 and "dims" not in doc
    assert doc["tensors"]["x"]["shape"] == [2, 4, 8]
    result = invoke(tk_roll.main, ["--hw", "milan", "static.yaml", "-o", "rolled.yaml"],
                    imported)
    assert result.exit_code == 0, result.output


def test_a_range_given_is_kept_or_refused(imported):
    result = invoke(tk_import.main, ["m.onnx", "--dim", "seq=2..64", "-o", "r.yaml"], imported)
    assert result.exit_code == 2
    assert "at seq=64, the top of its --dim range" in result.output
    result = invoke(tk_import.main, ["m.onnx", "--dim", "seq=2..16:4,8", "-o", "r.yaml"],
                    imported)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((imported / "r.yaml").read_text())
    assert doc["dims"]["seq"] == {"min": 2, "max": 16, "likely": [4, 8]}
    # with no size given, a run takes each symbol's first likely value, else its smallest
    result = invoke(tk_run.main, ["r.yaml", "--mode", "whole", "--check", "-q"], imported)
    assert result.exit_code == 0, result.output
    assert "dims: batch=1, seq=4" in result.output


def _size_valued(path: Path, name: str) -> None:
    """x[batch, seq, 8] -> y, where y depends on the *value* of seq (Shape, Gather) through
    an op no polynomial follows; at the import's samples (primes from 13) it is constant."""
    n = helper.make_node
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes, inits = {
        "seq == 1": ([n("Equal", ["s", "one"], ["e"]), n("Mul", ["x", "two"], ["x2"]),
                      n("Where", ["e", "x2", "x"], ["y"])],
                     [i64("one", 1), numpy_helper.from_array(np.array(2.0, np.float32), "two")]),
        "min(seq, 8)": ([n("Min", ["s", "eight"], ["m"]), n("Cast", ["m"], ["mf"], to=1),
                         n("Mul", ["x", "mf"], ["y"])], [i64("eight", 8)]),
        "seq % 2 as a pad": ([n("Mod", ["s", "two"], ["r"]), n("Unsqueeze", ["r", "ax"], ["r1"]),
                              n("Concat", ["z3", "z1", "r1", "z1"], ["pads"], axis=0),
                              n("Pad", ["x", "pads"], ["y"])],
                             [i64("two", 2), i64("ax", [0]), i64("z3", [0, 0, 0]),
                              i64("z1", [0])]),
    }[name]
    graph = helper.make_graph(
        [n("Shape", ["x"], ["sh"]), n("Gather", ["sh", "i1"], ["s"], axis=0)] + nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [i64("i1", 1)] + inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.mark.parametrize("name,seen", [("seq == 1", "at batch=1, seq=1"),
                                       ("min(seq, 8)", "at batch=1, seq=1"),
                                       ("seq % 2 as a pad", "seq=4096")])
def test_a_value_computed_from_a_size_is_not_taken_for_a_constant(tmp_path, name, seen):
    """The samples agree on `seq == 1` (false), `min(seq, 8)` (8) and `seq % 2` (1); the
    import checks the module for every size against imports at the ranges' ends and a small
    even size, and refuses rather than be wrong there (it was, silently); a range where the
    value does not change imports, and checks."""
    _size_valued(tmp_path / "m.onnx", name)
    result = invoke(tk_import.main, ["m.onnx", "-o", "m.yaml"], tmp_path)
    assert result.exit_code == 2, result.output
    assert "computes a value from a size" in result.output and seen in result.output
    if name == "min(seq, 8)":
        assert "node 'Mul_4' (ops[0])" in result.output     # the ONNX node, then the IR path
        result = invoke(tk_import.main, ["m.onnx", "--dim", "seq=8..64", "-o", "m.yaml"],
                        tmp_path)
        assert result.exit_code == 0, result.output
        result = invoke(tk_run.main, ["m.yaml", "--mode", "whole", "--check", "--dim",
                                      "batch=2", "--dim", "seq=8,9,64"], tmp_path)
        assert result.exit_code == 0 and result.output.count("check: pass") == 3, \
            result.output


def test_a_branch_on_a_size_is_refused_and_a_scalar_of_the_sizes_stays_a_scalar(tmp_path):
    """An If on `seq == 1` takes the same branch at every sample (it used to import as that
    branch); a mean over the sequence divides by a 0-d value computed from the sizes at each
    run, which stayed 0-d only in compiled code (the reference executor got shape (1,))."""
    n = helper.make_node
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    consts = [numpy_helper.from_array(np.array(1, np.int64), "i1"),
              numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    shape = [n("Shape", ["x"], ["sh"]), n("Gather", ["sh", "i1"], ["s"], axis=0)]
    then = helper.make_graph([n("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([n("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(shape + [n("Equal", ["s", "i1"], ["c"]),
                                       n("If", ["c"], ["y"], then_branch=then,
                                         else_branch=other)], "g", [x], [y], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              str(tmp_path / "if.onnx"))
    result = invoke(tk_import.main, ["if.onnx", "-o", "if.yaml"], tmp_path)
    assert result.exit_code == 2 and "at batch=1, seq=1" in result.output, result.output
    graph = helper.make_graph(shape + [n("ReduceSum", ["x", "ax"], ["r"], keepdims=0),
                                       n("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
                                       n("Div", ["r", "sf"], ["y"])], "g", [x], [y],
                              consts + [numpy_helper.from_array(np.array([1], np.int64), "ax")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              str(tmp_path / "mean.onnx"))
    assert invoke(tk_import.main, ["mean.onnx", "-o", "mean.yaml"], tmp_path).exit_code == 0
    for mode in ("whole", "compiled"):
        result = invoke(tk_run.main, ["mean.yaml", "--mode", mode, "--check", "--dim",
                                      "batch=2", "--dim", "seq=1,5"], tmp_path)
        assert result.exit_code == 0 and result.output.count("check: pass") == 2, \
            result.output


def test_a_range_is_raised_where_the_smallest_sizes_empty_a_tensor(tmp_path):
    """x[:, 1:] - x[:, :-1] is seq - 1 long: the default range starts at 2 (said in a
    warning; the import had been refused, naming the wrong symbol and a size that fails)."""
    n = helper.make_node
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    graph = helper.make_graph(
        [n("Slice", ["x", "one", "big", "ax"], ["a"]),
         n("Slice", ["x", "zero", "minus1", "ax"], ["b"]), n("Sub", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [i64("one", [1]), i64("big", [2 ** 62]), i64("ax", [1]), i64("zero", [0]),
         i64("minus1", [-1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              str(tmp_path / "m.onnx"))
    result = invoke(tk_import.main, ["m.onnx", "-o", "m.yaml"], tmp_path)
    assert result.exit_code == 0, result.output
    assert "seq: range 2..4096 (below 2 a tensor of the model is empty)" in result.output
    assert yaml.safe_load((tmp_path / "m.yaml").read_text())["dims"]["seq"]["min"] == 2
    result = invoke(tk_run.main, ["m.yaml", "--mode", "whole", "--check", "--dim", "batch=1",
                                  "--dim", "seq=2,9"], tmp_path)
    assert result.exit_code == 0 and result.output.count("check: pass") == 2, result.output


def test_compile_takes_sizes_for_the_passes(imported):
    import tilekit

    compiled = tilekit.compile(imported / "m.onnx", ["roll"], hw="milan",
                               dims={"batch": 2, "seq": 4})
    assert compiled.module.tensors["x"].shape == (2, 4, 8) and not compiled.module.dims
    # a CPU or a GPU profile rolls the range; tk-weld needs the sizes
    for hw in ("milan", "h100"):
        assert set(tilekit.compile(imported / "m.onnx", ["roll"], hw=hw).module.dims) == {
            "batch", "seq"}
    with pytest.raises(TilekitError, match="tk-weld needs static sizes"):
        tilekit.compile(imported / "m.onnx", ["roll", "weld"], hw="h100")
    assert set(tilekit.compile(imported / "m.onnx", []).module.dims) == {"batch", "seq"}


def _kv_cache_model(path: Path) -> None:
    onnx.save(kv_cache_step(), str(path))


def test_a_key_value_cache_decodes_and_prefills_from_one_import(tmp_path):
    """A decoder step with a cache of dynamic length: one import, run compiled at decode
    shapes (one new token, a long cache) and prefill-like ones (many tokens, a short
    cache), each checked against onnxruntime; the appended cache's length is `past + seq`."""
    _kv_cache_model(tmp_path / "kv.onnx")
    result = invoke(tk_import.main, ["kv.onnx", "-o", "kv.yaml"], tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((tmp_path / "kv.yaml").read_text())
    assert set(doc["dims"]) == {"seq", "past"}
    assert doc["tensors"]["k"]["shape"] == [1, "past + seq", 8]
    assert doc["tensors"]["seen"]["shape"] == ["seq", "past + seq"]  # the mask stayed an op
    for seq, past in ((1, 9), (6, 1)):
        result = invoke(tk_run.main, ["kv.yaml", "--dim", f"seq={seq}", "--dim",
                                      f"past={past}", "--mode", "compiled", "--check", "-q"],
                        tmp_path)
        assert result.exit_code == 0 and "check: pass (3 outputs)" in result.output, \
            result.output


def _kv_family(tmp_path):
    import tilekit
    from tilekit.runtime.family import CompiledFamily

    _kv_cache_model(tmp_path / "kv.onnx")
    compiled = tilekit.compile(tmp_path / "kv.onnx", [])
    return compiled, CompiledFamily(compiled.module, compiled.weights)


def _kv_size(compiled, seq: int, past: int):
    """The module at (seq, past), folded: (values, instance, weights), random inputs, and
    the reference executor's outputs."""
    from tilekit.ir.dims import instantiate
    from tilekit.runtime import backend
    from tilekit.runtime.fold import fold_constants

    values = {"seq": seq, "past": past}
    instance, weights = fold_constants(instantiate(compiled.module, values), compiled.weights)
    rng = np.random.default_rng(seq * 100 + past)
    feeds = {"x": rng.standard_normal((1, seq, 8)).astype(np.float32),
             "past_k": rng.standard_normal((1, past, 8)).astype(np.float32),
             "past_v": rng.standard_normal((1, past, 8)).astype(np.float32)}
    return (values, instance, weights), feeds, backend(instance, "cpu", "whole").run(feeds,
                                                                                     weights)


def _kv_run(compiled, family, seq: int, past: int):
    """The family's program at (seq, past), its outputs on random inputs, and the reference
    executor's."""
    (values, instance, weights), feeds, expected = _kv_size(compiled, seq, past)
    return family.program(instance, values, threads=2), feeds, weights, expected


def test_decode_steps_share_one_build(tmp_path):
    """Token-by-token decoding: the cache grows every step, and every step runs one build
    with its sizes as parameters (tilekit.runtime.family), each equal to the reference
    executor; the size tables are what makes each step right. The cache lengths cross what
    used to split the code (a reduction short enough to unroll, a tail of 0 lanes, rows per
    block of 1, one block or many, powers of two): the code generators decide none of that
    from an extent that varies. (A template is widened when a size changes a number its
    samples shared: a build more.)"""
    compiled, family = _kv_family(tmp_path)
    runs = {}
    for past in (1, 2, 7, 8, 14, 15, 16, 31, 32, 47, 64, 100):
        program, feeds, weights, expected = _kv_run(compiled, family, 1, past)
        out = program.run(feeds, weights)
        for name in expected:
            np.testing.assert_allclose(out[name], expected[name], rtol=1e-5, atol=1e-6)
        runs[past] = (program, feeds, weights, expected)
    assert len(family.templates) == 1 and family.builds <= 2
    # an earlier step's tables (of the same build) in the last step's program: wrong
    # results (the sizes are read)
    program, feeds, weights, expected = runs[100]
    earlier = next(p for p, *_ in runs.values() if p.lib._name == program.lib._name)
    assert earlier is not program
    program.sizes = earlier.sizes
    wrong = program.run(feeds, weights)
    assert not np.allclose(wrong["y"], expected["y"], rtol=1e-5, atol=1e-6)


def test_a_template_prints_the_same_unit_for_every_size(tmp_path):
    from tilekit.codegen import generate
    from tilekit.codegen.parametric import abstract, template, unit
    from tilekit.ir.dims import instantiate
    from tilekit.ir.payloads import CodegenSection
    from tilekit.runtime.fold import fold_constants

    compiled, _ = _kv_family(tmp_path)
    made = {}
    for past in (36, 41, 50):
        instance, _ = fold_constants(instantiate(compiled.module, {"seq": 1, "past": past}),
                                     compiled.weights)
        result = generate(instance, None, target="cpu")
        made[past] = (result.kernels, CodegenSection.read(result.module.codegen).kernels)
    t = template([abstract(kernels) for kernels, _ in made.values()])
    assert t.holes and all(t.match(abstract(kernels)) for kernels, _ in made.values())
    units = [unit(t, abstract(made[p][0]), made[p][1]) for p in (36, 41, 50)]
    assert units[0].source == units[1].source == units[2].source
    assert "tk_iz[" in units[0].source and "tk_set_sizes" in units[0].source
    assert len({u.ints for u in units}) == 3


def test_a_later_process_finds_the_templates(tmp_path, monkeypatch):
    """The templates are kept in the build cache: a second family of the same module (another
    tk-run) matches them, builds nothing new and loads the same library."""
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    compiled, first = _kv_family(tmp_path)
    a = _kv_run(compiled, first, 1, 40)[0]
    assert first.builds == 1
    from tilekit.runtime.family import CompiledFamily

    second = CompiledFamily(compiled.module, compiled.weights)
    b, feeds, weights, expected = _kv_run(compiled, second, 1, 41)
    assert second.builds == 0 and b.lib._name == a.lib._name
    np.testing.assert_allclose(b.run(feeds, weights)["y"], expected["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("content", ["not json", '{"a": 1}', '[1, ["x", [5], [1]], '
                                     '["d", [0, 0], [1, 2]], ["d", [1], [1, "2"]], '
                                     '["short", [1], [3, 4]], ["slots", [1], [3, 4], [1]], '
                                     '["good", [1], [3, 4], [0]]]'])
def test_a_damaged_template_store_is_left_out(tmp_path, monkeypatch, content):
    """A cache file of another form is not trusted: its records of another form are left
    out (they cost a template's samples later, nothing else)."""
    from tilekit.runtime.family import CompiledFamily

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    compiled, _ = _kv_family(tmp_path)
    family = CompiledFamily(compiled.module, compiled.weights)
    family._store(None).parent.mkdir(parents=True, exist_ok=True)
    family._store(None).write_text(content)
    kept = family._stored_templates(None)
    assert kept == ([["good", [1], [3, 4], [0]]] if "good" in content else [])


def _kv_code(compiled, family, seq: int, past: int):
    """The family's (module, unit) at (seq, past) for its target, random inputs, weights and
    the reference executor's outputs."""
    (values, instance, weights), feeds, expected = _kv_size(compiled, seq, past)
    module, unit = family.code(instance, values)
    return module, unit, feeds, weights, expected


def test_cuda_decode_steps_share_one_build(tmp_path, monkeypatch):
    """Sizes as parameters on CUDA: every decode step's kernels are one template's, so one
    unit (one nvcc build) serves every cache length, its sizes read from constant memory;
    each step's launches are its own (grids from its sizes). Each step, emulated on the CPU
    with the template's unit and the step's tables, equals the reference executor, and
    another step's tables give wrong results (the sizes are read). The lane groups of the
    softmax over the cache are a warp whatever its length (the extent varies: no decision
    reads it)."""
    from dataclasses import replace

    from tilekit.codegen.emulate import emulate
    from tilekit.ir.payloads import CodegenSection
    from tilekit.runtime.family import CompiledFamily

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    compiled, _ = _kv_family(tmp_path)
    family = CompiledFamily(compiled.module, compiled.weights, "cuda")
    made = {}
    for past in (1, 8, 31, 64):
        module, unit, feeds, weights, expected = _kv_code(compiled, family, 1, past)
        out = emulate(module, feeds, weights, unit=unit)
        for name in expected:
            np.testing.assert_allclose(out[name], expected[name], rtol=1e-5, atol=1e-6)
        made[past] = (module, unit, feeds, weights, expected)
    assert len(family.templates) == 1 and family.builds == 1
    units = [u for _, u, *_ in made.values()]
    assert len({u.source for u in units}) == 1 and len({u.ints for u in units}) == 4
    assert "__constant__ long long tk_iz[" in units[0].source
    grids = {past: tuple(tuple(k.grid) for k in CodegenSection.read(m.codegen).kernels)
             for past, (m, *_) in made.items()}
    assert grids[1] != grids[64]                      # each size launches its own grids
    softmax = [k for k in CodegenSection.read(made[64][0].codegen).kernels
               if "Softmax" in k.name]
    assert softmax and "tk_warp_max<32>" in units[0].source
    module, unit, feeds, weights, expected = made[64]
    wrong = emulate(module, feeds, weights, unit=replace(unit, ints=made[8][1].ints))
    assert not np.allclose(wrong["y"], expected["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_a_cuda_template_compiles_for_both_families(tmp_path, monkeypatch, arch):
    """The template's unit (its holes read from `__constant__` tables) passes nvcc and
    ptxas for the sm_80 and sm_90 families, with no local memory."""
    from tilekit.codegen.nvcc import compile_unit
    from tilekit.runtime.family import CompiledFamily

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    compiled, _ = _kv_family(tmp_path)
    family = CompiledFamily(compiled.module, compiled.weights, "cuda")
    _, unit, *_ = _kv_code(compiled, family, 1, 12)
    result = compile_unit(unit.source, arch)
    assert result.resources and all(r.stack == 0 and r.spills == 0
                                    for r in result.resources.values())


@pytest.mark.parametrize("hw,dtype", [("h100", "float32"), ("a100", "float16")])
def test_a_rolled_decoder_step_shares_two_builds_on_cuda(tmp_path, monkeypatch, hw, dtype):
    """The key/value-cache step rolled once for a GPU: its CUDA kernels (generated for the
    profile) at one and six tokens over caches of 5, 40 and 77 are two templates and two
    builds, decode and prefill: tile counts, steps past a short reduction and ragged edges
    do not change the code's structure (Target.ragged, the steps kept unclamped), and the
    samples reach far enough that no later size widens a template."""
    import tilekit
    from tilekit.hw import load_profile
    from tilekit.ir.dims import instantiate
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    _kv_cache_model(tmp_path / "kv.onnx")
    compiled = tilekit.compile(tmp_path / "kv.onnx", ["roll"], hw=hw, dtype=dtype)
    family = CompiledFamily(compiled.module, compiled.weights, "cuda")
    profile = load_profile(hw)
    for seq in (1, 6):
        for past in (5, 40, 77):
            values = {"seq": seq, "past": past}
            instance, _ = fold_constants(instantiate(compiled.module, values),
                                         compiled.weights)
            family.code(instance, values, profile)
    assert len(family.templates) == 2 and family.builds == 2
