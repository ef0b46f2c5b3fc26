"""Control flow through the importer and the CPU executor: the six test models of issue 11
against onnxruntime, the onnx package's Loop/If/Scan node tests, the loop forms (bounded, a
condition only, neither), refusals and the tiled mode inside regions."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.control_models import DECODER_MAX, MODELS, feeds  # noqa: E402
from models.onnx_check import check_against_onnxruntime, onnxruntime_outputs  # noqa: E402
from tilekit import limits  # noqa: E402
from tilekit.errors import TilekitError, UnsupportedError  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402
from tilekit.runtime import run_module  # noqa: E402

pytestmark = pytest.mark.xdist_group("control")

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_onnxruntime(name):
    model = MODELS[name]()
    imported = check_against_onnxruntime(model, feeds(name, model))
    assert any(op.kind == "control" for op in imported.module.ops)


def test_decoder_stops_on_the_end_token_before_its_bound():
    model = MODELS["greedy_decoder"]()
    imported = import_model(model)
    rec = imported.module.control["decode"]
    assert rec["max_trips"] == DECODER_MAX and rec["count"] == "decode_count"
    out = run_module(imported.module, feeds("greedy_decoder", model), imported.weights)
    assert 1 <= out["tokens"].shape[0] < DECODER_MAX


def test_nested_loop_captures_both_scopes():
    imported = import_model(MODELS["nested_loops"]())
    outer = imported.module.control["outer"]
    inner = outer["body"]["control"]["inner"]
    reads = {a for op in inner["body"]["ops"] for a in (op.get("expr") or "").split()}
    assert any("w_shared" in r for r in reads) and any("x[" in r for r in reads)
    assert "i_outer" in outer["body"]["inputs"]


# -- the onnx package's node tests -------------------------------------------------------------

#: Node tests that pass, and those refused with the reason docs/import.md lists.
PASSING = {"test_if", "test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar",
           "test_range_float_type_positive_delta_expanded",
           "test_range_int32_type_negative_delta_expanded"}
REFUSED = {
    "test_if_seq": "not static",                   # a sequence output
    "test_if_opt": "not static",                   # an optional output
    "test_loop13_seq": "not a tensor",             # a sequence carried value
    "test_loop16_seq_none": "not a tensor",        # an optional carried value
    "test_loop11": "Slice",                        # a Slice whose start is the iteration
    "test_scan_sum": "Scan-8",                     # batch axis and sequence_lens
    "test_range_float16_type_positive_delta_expanded": "read by another node",
    "test_range_bfloat16_type_positive_delta_expanded": "read by another node",
}


@pytest.fixture(scope="session")
def node_cases():
    """The cases of the four generator modules (importing one registers its cases; the
    whole collection, every op, takes seconds)."""
    import onnx.backend.test.case.node as cases
    from onnx.backend.test.case.node import if_, loop, rangeop, scan  # noqa: F401

    return {c.name: c for c in cases._NodeTestCases if c.name in PASSING or c.name in REFUSED}


def test_node_cases_are_all_listed(node_cases):
    assert set(node_cases) == PASSING | set(REFUSED)


@pytest.mark.parametrize("name", sorted(PASSING))
def test_node_case_passes(node_cases, name):
    case = node_cases[name]
    imported = import_model(case.model, max_trips=16)
    inputs, expected = case.data_sets[0]
    module = imported.module
    got = run_module(module, dict(zip(module.inputs, map(np.asarray, inputs))),
                     imported.weights)
    for out, want in zip(module.outputs, expected):
        assert got[out].shape == np.asarray(want).shape
        np.testing.assert_allclose(got[out].astype(np.float64),
                                   np.asarray(want).astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_node_case_refused_with_reason(node_cases, name):
    with pytest.raises(TilekitError) as err:
        import_model(node_cases[name].model, max_trips=16)
    assert REFUSED[name] in err.value.message()


# -- loop forms and refusals -------------------------------------------------------------------

def _doubling_loop(trip: bool, cond: bool, scan: bool = False) -> onnx.ModelProto:
    """y doubles while its sum stays under 100 (with a condition), for `trip` steps."""
    nodes = [helper.make_node("Mul", ["v", "two"], ["v2"]),
             helper.make_node("ReduceSum", ["v2"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "limit"], ["c_out"])]
    outs = [helper.make_tensor_value_info("c_out", BOOL, []),
            helper.make_tensor_value_info("v2", FLOAT, [3])]
    if scan:
        nodes.append(helper.make_node("Identity", ["v2"], ["row"]))
        outs.append(helper.make_tensor_value_info("row", FLOAT, [3]))
    body = helper.make_graph(
        nodes, "body", [helper.make_tensor_value_info("i", INT64, []),
                        helper.make_tensor_value_info("c", BOOL, []),
                        helper.make_tensor_value_info("v", FLOAT, [3])], outs,
        [onnx.numpy_helper.from_array(np.asarray(2.0, np.float32), "two"),
         onnx.numpy_helper.from_array(np.asarray(100.0, np.float32), "limit")])
    inputs = [helper.make_tensor_value_info("x", FLOAT, [3])]
    loop_in = ["", "", "x"]
    if trip:
        inputs.append(helper.make_tensor_value_info("n", INT64, []))
        loop_in[0] = "n"
    if cond:
        inputs.append(helper.make_tensor_value_info("go", BOOL, []))
        loop_in[1] = "go"
    outputs = [helper.make_tensor_value_info("y", FLOAT, [3])]
    loop_out = ["y"]
    if scan:
        outputs.append(helper.make_tensor_value_info("rows", FLOAT, ["k", 3]))
        loop_out.append("rows")
    graph = helper.make_graph([helper.make_node("Loop", loop_in, loop_out, body=body)], "g",
                              inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model, n=5):
    names = [i.name for i in model.graph.input]
    all_feeds = {"x": np.asarray([1.0, 2.0, 3.0], np.float32),
                 "n": np.asarray(n, np.int64), "go": np.asarray(True)}
    return {k: all_feeds[k] for k in names}


@pytest.mark.parametrize("trip, cond", [(True, True), (True, False), (False, True)])
def test_loop_bounds_match_onnxruntime(trip, cond):
    model = _doubling_loop(trip, cond)
    check_against_onnxruntime(model, _feeds(model))


def test_loop_with_run_time_count_and_scan_outputs():
    model = _doubling_loop(True, True, scan=True)
    with pytest.raises(UnsupportedError, match="--max-trips"):
        import_model(model)
    imported = import_model(model, max_trips=10)
    for n in (2, 9):
        feeds_ = _feeds(model, n)
        got = run_module(imported.module, feeds_, imported.weights)
        want = onnxruntime_outputs(model, feeds_)
        np.testing.assert_allclose(got["rows"], want[1])
    with pytest.raises(TilekitError, match="max_trips"):
        run_module(imported.module, {**_feeds(model, 12), "x": np.full(3, 1e-3, np.float32)},
                   imported.weights)


def test_loop_without_bound_runs_until_the_budget(monkeypatch):
    imported = import_model(_doubling_loop(False, False))
    monkeypatch.setenv("TILEKIT_MAX_LOOP_TRIPS", "50")
    limits.reset()
    try:
        with pytest.raises(limits.LimitError, match="loop iterations"):
            run_module(imported.module, {"x": np.ones(3, np.float32)}, imported.weights)
    finally:
        monkeypatch.delenv("TILEKIT_MAX_LOOP_TRIPS")
        limits.reset()


def test_carried_shape_change_refused():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]),
         helper.make_node("Concat", ["v", "v"], ["v2"], axis=0)], "body",
        [helper.make_tensor_value_info("i", INT64, []), helper.make_tensor_value_info(
            "c", BOOL, []), helper.make_tensor_value_info("v", FLOAT, [2])],
        [helper.make_tensor_value_info("c2", BOOL, []),
         helper.make_tensor_value_info("v2", FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "g",
        [helper.make_tensor_value_info("x", FLOAT, [2])],
        [helper.make_tensor_value_info("y", FLOAT, None)],
        [onnx.numpy_helper.from_array(np.asarray(3, np.int64), "n")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(TilekitError) as err:
        import_model(model)
    assert "keep its shape" in err.value.message() or "not static" in err.value.message()


def test_reverse_scan_on_axis_one_matches_onnxruntime():
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "xt"], ["acc2"]),
         helper.make_node("Mul", ["acc2", "xt"], ["yt"])], "body",
        [helper.make_tensor_value_info("acc", FLOAT, [2]),
         helper.make_tensor_value_info("xt", FLOAT, [2])],
        [helper.make_tensor_value_info("acc2", FLOAT, [2]),
         helper.make_tensor_value_info("yt", FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["a0", "x"], ["a", "ys"], body=body, num_scan_inputs=1,
                          scan_input_axes=[1], scan_input_directions=[1],
                          scan_output_axes=[1], scan_output_directions=[1])], "g",
        [helper.make_tensor_value_info("a0", FLOAT, [2]),
         helper.make_tensor_value_info("x", FLOAT, [2, 5])],
        [helper.make_tensor_value_info("a", FLOAT, [2]),
         helper.make_tensor_value_info("ys", FLOAT, [2, 5])])
    check_against_onnxruntime(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_tiled_mode_runs_regions_tile_by_tile():
    from tilekit.runtime.cpu import prepare

    model = MODELS["lstm_loop"]()
    imported = import_model(model)
    inputs = feeds("lstm_loop", model)
    whole = run_module(imported.module, inputs, imported.weights)
    tiled = prepare(imported.module).run(inputs, imported.weights, mode="tiled")
    for name in whole:
        np.testing.assert_allclose(tiled[name], whole[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tk_import_then_tk_run_check(tmp_path, name):
    """`tk-import m.onnx | tk-run --check` (the commands in this process, files between)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
    from hostile_support import run

    onnx.save(MODELS[name](), str(tmp_path / "m.onnx"))
    imported = run("tk-import", "m.onnx", "-o", "m.yaml", folder=tmp_path)
    assert imported.exit_code == 0, imported.stderr
    checked = run("tk-run", "m.yaml", "--seed", "0", "--check", "--quiet", folder=tmp_path)
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert "check: pass" in checked.stdout
