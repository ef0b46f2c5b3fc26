"""tk-grind on a CPU profile: loops, scans and branches placed inside the compiled library
(one persistent kernel whose blocks are the threads of one OpenMP team, its grid barriers the
team's), run by the compiled CPU runtime in one call and checked against the reference at
one thread and at more threads than cores, nested loops included; placements priced by the
CPU figures; a profile of the other kind refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.control_models import MODELS, feeds  # noqa: E402
from tilekit import pipeline  # noqa: E402
from tilekit.codegen.cxx import find_cxx  # noqa: E402
from tilekit.errors import TilekitError  # noqa: E402
from tilekit.ir.control import walk  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402
from tilekit.runtime import run_module  # noqa: E402

from test_grind import flip_loop  # noqa: E402

pytestmark = [pytest.mark.xdist_group("control_cpu"),
              pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")]

HW = "icelake"


def ground(model: onnx.ModelProto, place: str = "auto"):
    imported = import_model(model)
    module = pipeline.run(imported.module.with_stage("import"), ["roll", "grind", "codegen"],
                          pipeline.Context.for_hw(HW, place=place))
    return imported, module


@pytest.fixture(scope="module")
def models():
    """Every control-flow test model rolled for a CPU profile, ground and generated."""
    return {name: ground(build()) for name, build in MODELS.items()}


def _run(imported, module, inputs, threads: int, runs: int = 1):
    from tilekit.runtime.compiled import CpuProgram

    program = CpuProgram(module, threads=threads)
    for _ in range(runs):
        out = program.run(inputs, imported.weights)
    return program, out


def _matches(got, want) -> None:
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_cpu_profile_places_every_control_op_inside_the_library(models):
    for name, (_, module) in models.items():
        for path, rec, _ in walk(module):
            g = rec.grind
            assert g["run"] == "device", (name, path, g["why"])
            assert "inside the compiled library" in g["why"]
            est = g["estimate"]
            assert est["device_us"] < est["host_us"] and "residency" not in est
    # a nested loop placed inside compiled code is one of its parent's bodies
    _, nested = models["nested_loops"]
    assert nested.codegen["control"]["outer"]["run"] == "device"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ground_models_run_in_one_call_and_equal_the_reference(models, name):
    """No host step is left: the program's steps are kernels only, none reads a condition
    back; at one thread and at three (more than this machine's cores: waiters sleep)."""
    from tilekit.runtime.cuda_control import ControlStep

    imported, module = models[name]
    inputs = feeds(name, MODELS[name]())
    want = run_module(imported.module, inputs, imported.weights)
    for threads in (1, 3):
        program, got = _run(imported, module, inputs, threads, runs=2)
        assert not any(isinstance(s, ControlStep) for s in program.steps)
        assert program.counts["syncs"] == 0
        _matches(got, want)


def test_a_loop_placed_on_the_host_still_runs_per_iteration(models):
    imported, module = ground(MODELS["lstm_loop"](), place="host")
    inputs = feeds("lstm_loop", MODELS["lstm_loop"]())
    program, got = _run(imported, module, inputs, threads=2)
    _matches(got, run_module(imported.module, inputs, imported.weights))
    assert program.counts["syncs"] > 0      # the trip count and condition read back
    _, ground_ = models["lstm_loop"]
    inside, _ = _run(imported, ground_, inputs, threads=2)
    assert inside.counts["launches"] < program.counts["launches"]


def test_a_ground_loop_shares_its_blocks_over_the_team():
    """Each iteration's kernels read what other threads wrote the iteration before: the
    team's barriers between them are what makes it right (runs repeated to catch a race)."""
    n = 1 << 17
    imported, module = ground(flip_loop(n, trips=5), place="device")
    (loop,) = [k for k in module.codegen["kernels"] if k.get("coresident")]
    bodies = [k for k in module.codegen["kernels"] if k["entry"] in loop["schedule"]["bodies"]]
    assert not bodies      # composed into the loop's kernel, not kernels of the unit
    source = loop["source"]
    assert "for (int tk_vb = tk_lo_" in source            # each thread a run of blocks
    assert "tk_team_enter(tk_bar, omp_get_num_threads());" in source
    inputs = {"x": np.arange(n, dtype=np.float32)}
    want = run_module(imported.module, inputs, imported.weights)
    for threads in (1, 2, 3):
        _, got = _run(imported, module, inputs, threads, runs=5)
        _matches(got, want)


def test_a_loop_of_one_thread_work_runs_on_one_thread_without_barriers(models):
    """An LSTM cell of 16 units: every body kernel is one thread's work, so the whole loop is
    a kernel of the team's first thread, with no barrier at all."""
    _, module = models["lstm_loop"]
    (loop,) = [k for k in module.codegen["kernels"] if k["shape"] == "device_loop"]
    assert loop["schedule"].get("one_thread") and not loop.get("coresident")
    assert "tk_grid_sync" not in loop["source"] and "tk_team_enter" not in loop["source"]


def test_first_thread_kernels_chain_without_barriers():
    """A team loop (its matrix-vector products in column blocks) runs its one-block kernels
    on the first thread one after another: fewer barriers than body kernels."""
    imported, module = ground(MODELS["lstm_loop"](seq=4, inputs=256, hidden=256))
    (loop,) = [k for k in module.codegen["kernels"] if k.get("coresident")]
    source = loop["source"]
    body = source[source.index("while (tk_go && tk_it < tk_trips)"):]
    assert "if (tk_block == 0)" in body and "for (int tk_vb = tk_lo_" in body
    assert body.count("tk_grid_sync();") < len(loop["schedule"]["bodies"])
    inputs = feeds("lstm_loop", MODELS["lstm_loop"](seq=4, inputs=256, hidden=256))
    want = run_module(imported.module, inputs, imported.weights)
    for threads in (2, 3):
        _matches(_run(imported, module, inputs, threads, runs=3)[1], want)


def test_grind_refuses_a_profile_of_the_other_kind():
    imported = import_model(MODELS["lstm_loop"]())
    start = imported.module.with_stage("import")
    for rolled_for, placed_for in ((HW, "h100"), ("h100", HW)):
        rolled = pipeline.run(start, ["roll"], pipeline.Context.for_hw(rolled_for))
        with pytest.raises(TilekitError, match="re-run tk-roll") as err:
            pipeline.run(rolled, ["grind"], pipeline.Context.for_hw(placed_for))
        assert err.value.where == "--hw"


def test_an_unbounded_loop_stays_on_the_host():
    """A Loop with neither trip count nor condition runs until the iteration budget stops it,
    which only the host checks: never placed inside compiled code (nor on a GPU)."""
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]), helper.make_node("Neg", ["v"], ["v2"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v2", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["", "", "x"], ["y"], body=body, name="forever")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for hw in (HW, "h100"):
        imported = import_model(model)
        placed = pipeline.run(imported.module.with_stage("import"), ["roll", "grind"],
                              pipeline.Context.for_hw(hw, place="device"))
        (rec,) = [r for _, r, _ in walk(placed)]
        assert rec.grind["run"] == "host" and "no trip count" in rec.grind["why"]


def test_the_documented_cpu_pipe(tmp_path):
    """README and docs/grind.md: `tk-import lstm.onnx | tk-roll --hw icelake | tk-weld |
    tk-grind --report | tk-codegen | tk-run --check`, as written."""
    import subprocess

    onnx.save(MODELS["lstm_loop"](), str(tmp_path / "lstm.onnx"))
    bin_dir = Path(sys.executable).parent
    pipe = " | ".join(f"{bin_dir}/{stage}" for stage in (
        "tk-import lstm.onnx", "tk-roll --hw icelake", "tk-weld", "tk-grind --report",
        "tk-codegen", "tk-run --check"))
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", pipe], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "check: pass" in proc.stdout
    assert "device loop (inside the compiled library)" in proc.stderr


@pytest.mark.parametrize("hw", [HW, "h100"])
def test_a_parent_placed_on_the_device_over_a_host_loop_runs_on_the_host(hw):
    """An IR whose outer loop says `run: device` while the loop nested in it runs on the
    host (tk-grind never writes that; an edited IR can) is not composed into one kernel,
    which would run the inner body once a step: the outer loop stays on the host, with a
    note, and the results are right."""
    from dataclasses import replace

    from tilekit.codegen import generate
    from tilekit.ir.control import control_section, read_control

    imported = import_model(MODELS["nested_loops"]())
    placed = pipeline.run(imported.module.with_stage("import"), ["roll", "grind"],
                          pipeline.Context.for_hw(hw))
    outer = read_control(placed.control)["outer"]
    body = outer.regions[0]
    inner = read_control(body.control)["inner"]
    inner = replace(inner, grind={**inner.grind, "run": "host"})
    body = replace(body, control=control_section({"inner": inner}))
    outer = replace(outer.with_regions((body,)), grind={**outer.grind, "run": "device"})
    edited = replace(placed, control=control_section({"outer": outer}))
    target = "cpu" if hw == HW else "cuda"
    result = generate(edited, pipeline.Context.for_hw(hw).profile, target=target)
    assert result.module.codegen["control"]["outer"]["run"] == "host"
    assert any("holds control op 'inner'" in n for n in result.notes)
    if target == "cpu":
        inputs = feeds("nested_loops", MODELS["nested_loops"]())
        _, got = _run(imported, result.module, inputs, threads=2)
        _matches(got, run_module(imported.module, inputs, imported.weights))


def _counting_loop() -> onnx.ModelProto:
    """v <- v + 1 for `m` steps (a run-time trip count), each step's v stacked."""
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c2"]),
         helper.make_node("Add", ["v", "one"], ["v2"]),
         helper.make_node("Identity", ["v2"], ["row"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v2", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [4])],
        [onnx.numpy_helper.from_array(np.ones(4, np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["m", "", "x"], ["y", "rows"], body=body, name="count")],
        "g", [helper.make_tensor_value_info("m", TensorProto.INT64, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("place", ["device", "host"])
def test_a_loop_past_its_max_trips_fails_as_the_reference_does(place):
    """A run-time trip count past the imported `max_trips`: the reference refuses the run
    (exit 2); so does the compiled program, the loop inside the library (its kernel stops at
    the maximum and records one more, which the runtime reports) or driven by the host."""
    from tilekit.runtime.compiled import CpuProgram

    imported = import_model(_counting_loop(), max_trips=3)
    module = pipeline.run(imported.module.with_stage("import"), ["roll", "grind", "codegen"],
                          pipeline.Context.for_hw(HW, place=place))
    assert module.codegen["control"]["count"]["run"] == place
    x = np.arange(4, dtype=np.float32)
    program = CpuProgram(module, threads=2)
    for m, fails in ((3, False), (2, False), (5, True), (3, False)):
        inputs = {"m": np.asarray(m, np.int64), "x": x}
        if fails:
            with pytest.raises(TilekitError, match=r"more than its declared max_trips \(3\)"):
                run_module(imported.module, inputs, imported.weights)
            with pytest.raises(TilekitError, match=r"more than its declared max_trips \(3\)") \
                    as err:
                program.run(inputs, imported.weights)
            assert err.value.where in ("ops[0] (count)", "kernels[0] (k_count)")
        else:
            _matches(program.run(inputs, imported.weights),
                     run_module(imported.module, inputs, imported.weights))
