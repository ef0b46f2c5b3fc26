"""tk-grind and the code of control ops: placements with their estimates, tk-roll inside
regions, the persistent kernels (structure, nvcc for sm_80 and sm_90, CPU emulation against
the reference, a missing grid barrier caught), and co-residency refused at compile time and
at launch."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from scope import on
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.control_models import MODELS, feeds  # noqa: E402
from tilekit import pipeline  # noqa: E402
from tilekit.codegen.nvcc import find_nvcc  # noqa: E402
from tilekit.errors import TilekitError  # noqa: E402
from tilekit.grind.plan import report_rows  # noqa: E402
from tilekit.ir import verify  # noqa: E402
from tilekit.ir.control import walk  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402
from tilekit.runtime import run_module  # noqa: E402

pytestmark = pytest.mark.xdist_group("control")
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")


def ground(model: onnx.ModelProto, place: str = "auto", passes=("roll", "grind", "codegen")):
    imported = import_model(model)
    module = pipeline.run(imported.module.with_stage("import"), list(passes),
                          pipeline.Context.for_hw("h100", place=place))
    return imported, module


@pytest.fixture(scope="session")
def models():
    """Every test model imported, rolled, ground and generated (once)."""
    return {name: ground(build()) for name, build in MODELS.items()}


def test_every_control_op_is_placed_with_its_estimate(models):
    for name, (imported, module) in models.items():
        verify(replace(module, weights={"file": "w.npz", "sha256": "0" * 64}))
        for path, rec, _ in walk(module):
            g = rec.grind
            assert g["run"] in ("device", "host") and g["why"], (name, path)
            est = g["estimate"]
            assert est["host_us"] > 0 and est["host_launches"] >= 1
            if g["run"] == "device":
                assert est["device_us"] < est["host_us"] and est["device_launches"] == 1
                assert est["device_syncs"] == 0 and "SMs" in est["residency"]


def test_placements_follow_the_rules(models):
    runs = {name: {p: r.grind["run"] for p, r, _ in walk(m)} for name, (_, m) in models.items()}
    assert runs["lstm_loop"] == {"control.lstm": "device"}
    assert set(runs["blockdrop"].values()) == {"device"}
    # a body holding a control op stays on the host; the inner loop is placed on its own
    assert runs["nested_loops"]["control.outer"] == "host"
    assert runs["nested_loops"]["control.outer.body.control.inner"] == "device"
    # the bodies' threads are those of the kernels codegen makes (a default kernel's 256
    # where the roll kept the default over its tile): the placement is the one codegen
    # builds (the rule itself, tilekit.schedule.block: tests/unit/test_shared_block.py)
    _, decoder = models["greedy_decoder"]
    decode = next(r for _, r, _ in walk(decoder))
    assert decode.grind["run"] == decoder.codegen["control"]["decode"]["run"] == "device"


def test_roll_tiles_the_ops_inside_regions(models):
    _, module = models["gru_scan"]
    rec = next(r for _, r, _ in walk(module))
    assert all(op.tile and op.tile["estimate"]["time_us"] > 0 for op in rec.body.ops)
    assert all(k.estimate for k in rec.body.kernels)


def test_place_host_and_report():
    _, module = ground(MODELS["lstm_loop"](), place="host", passes=("roll", "grind"))
    rows = report_rows(module)
    assert rows[0][:3] == ("control.lstm", "loop", "host")
    assert "--place host" in rows[0][-1]


def test_grind_without_tiles_stays_on_the_host():
    _, module = ground(MODELS["skipnet"](), passes=("grind",))
    assert all("run tk-roll first" in r.grind["why"] for _, r, _ in walk(module))


def test_device_loop_kernel_structure(models):
    _, module = models["lstm_loop"]
    (record,) = [k for k in module.codegen["kernels"] if k.get("coresident")]
    src = record["source"]
    assert "#define TK_USE_GRID_SYNC 1" in src.split('#include "runtime.cuh"')[0]
    assert record["shape"] == "device_loop" and module.codegen["control"]["lstm"]["run"] == \
        "device"
    loop = src[src.index("while (tk_go && tk_it < tk_trips)"):]
    bodies = record["schedule"]["bodies"]
    assert loop.count("tk_grid_sync();") == len(bodies) + 2   # each body, inputs, carries
    assert all(f"{b}_body" in loop for b in bodies)
    assert "for (int tk_vb = tk_block; tk_vb <" in loop


# -- the CPU emulation of the persistent kernels ---------------------------------------------

def _emulated_matches(imported, module, inputs):
    from tilekit.codegen.emulate import emulate

    got = emulate(module, inputs, imported.weights)
    want = run_module(imported.module, inputs, imported.weights)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", ["lstm_loop", "gru_scan", "blockdrop"])
def test_device_loop_and_branch_emulated(models, name):
    imported, module = models[name]
    assert any(k.get("coresident") for k in module.codegen["kernels"])
    _emulated_matches(imported, module, feeds(name, MODELS[name]()))


def flip_loop(n: int = 2048, trips: int = 3) -> onnx.ModelProto:
    """v <- reversed(v * 0.5) + 1, `trips` times: each block reads what others wrote."""
    consts = {"k": [0.5], "one": [1.0], "st": [-1], "en": [-n - 1], "ax": [0], "sp": [-1]}
    body = helper.make_graph(
        [helper.make_node("Mul", ["v", "k"], ["a"]),
         helper.make_node("Slice", ["a", "st", "en", "ax", "sp"], ["b"]),
         helper.make_node("Add", ["b", "one"], ["v2"]),
         helper.make_node("Identity", ["c"], ["c2"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v2", TensorProto.FLOAT, [n])],
        [numpy_helper.from_array(np.asarray(v, np.float32 if k in ("k", "one") else np.int64),
                                 k) for k, v in consts.items()])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="flip")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [numpy_helper.from_array(np.asarray(trips, np.int64), "n")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_removing_a_grid_barrier_makes_the_emulation_fail():
    imported, module = ground(flip_loop(), place="device")
    kernels = module.codegen["kernels"]
    (index,) = [i for i, k in enumerate(kernels) if k.get("coresident")]
    assert kernels[index]["grid"][0] > 1
    inputs = {"x": np.arange(2048, dtype=np.float32)}
    _emulated_matches(imported, module, inputs)
    source = kernels[index]["source"]
    first = source.index("tk_grid_sync();", source.index("while (tk_go"))
    second = source.index("tk_grid_sync();", first + 1)      # after the first body kernel
    broken = dict(kernels[index], source=source[:second] + source[second + len(
        "tk_grid_sync();"):])
    bad = replace(module, codegen={**module.codegen,
                                   "kernels": kernels[:index] + [broken] + kernels[index + 1:]})
    with pytest.raises((RuntimeError, AssertionError)):
        _emulated_matches(imported, bad, inputs)


def test_host_driven_control_is_not_emulated(models):
    from tilekit.codegen.emulate import emulate

    imported, module = models["nested_loops"]
    with pytest.raises(TilekitError, match="runs on the host"):
        emulate(module, feeds("nested_loops", MODELS["nested_loops"]()), imported.weights)


# -- nvcc and co-residency -------------------------------------------------------------------

@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"] if on("TILEKIT_ALL_ARCHS") else ["sm_90"])
def test_every_model_compiles_strict(models, arch):
    from tilekit.codegen.module import compile_module, generate
    from tilekit.hw import load_profile

    profile = load_profile("h100")
    for name, (_, module) in models.items():
        result = generate(replace(module, codegen=None), profile, arch)
        report = compile_module(result, arch, profile)
        assert not report.problems, (name, report.problems)
        for k in report.module.codegen["kernels"]:
            if k.get("coresident"):
                assert k["resources"]["registers"] > 0


@needs_nvcc
def test_a_device_loop_grid_over_residency_is_capped_not_a_problem(models):
    """A device loop's blocks stride over its bodies, so a grid larger than ptxas' resources
    allow at once shrinks to fit; it is not reported as a program that could hang."""
    from tilekit.codegen.module import CodegenResult, compile_module, generate
    from tilekit.hw import load_profile

    profile = load_profile("h100")
    _, module = models["lstm_loop"]
    result = generate(replace(module, codegen=None), profile, "sm_90")
    big = 10 ** 6
    kernels = tuple(replace(g, grid=(big, 1, 1)) if g.coresident else g
                    for g in result.kernels)
    section = dict(result.module.codegen)
    section["kernels"] = [dict(k, grid=[big, 1, 1]) if k.get("coresident") else k
                          for k in section["kernels"]]
    result = CodegenResult(replace(result.module, codegen=section), kernels, result.notes)
    report = compile_module(result, "sm_90", profile)
    assert not report.problems, report.problems
    loop = next(k for k in report.module.codegen["kernels"] if k.get("coresident"))
    assert loop["grid"][0] < big and "grid_capped" in loop["schedule"]


def test_a_grid_that_cannot_be_coresident_is_refused_at_codegen():
    from tilekit.codegen.control import cap_grid
    from tilekit.hw import load_profile
    from tilekit.ir.payloads import KernelRecord

    h100 = load_profile("h100")
    record = KernelRecord("k_loop", "k_loop", "tk_loop_x", ("x",), "device_loop",
                          {"grid": 500, "smem_bytes": 0}, (500, 1, 1), (1024, 1, 1), 0, (),
                          (), "", coresident=True)
    capped, problem = cap_grid(record, h100, registers=32)
    assert problem is None and capped.grid[0] == 2 * h100.sm_count   # 2 blocks/SM by threads
    assert "limited by threads" in capped.schedule["grid_capped"]
    _, problem = cap_grid(record, h100, registers=128)    # 128 x 1024 > 65536 per block
    assert problem and "cannot run co-resident" in problem and "registers" in problem


def test_a_grid_that_cannot_be_coresident_is_refused_at_launch():
    from tilekit.runtime.occupancy import check_coresident

    class Fake:
        def blocks_per_sm(self, function, threads, dynamic_smem):
            return 1

        def sm_count(self):
            return 4

    with pytest.raises(TilekitError) as err:
        check_coresident("tk_loop_lstm", 8, 256, 0, None, Fake(), "codegen.kernels[0]")
    assert "only 4 at once" in err.value.message() and "not launched" in err.value.message()


def test_ground_documents_match_the_schema(models):
    import json

    import jsonschema

    from tilekit.ir.codec import to_document
    schema = json.loads((Path(__file__).resolve().parents[2] / "specs" /
                         "tile-ir.schema.json").read_text())
    for name, (_, module) in models.items():
        doc = json.loads(json.dumps(to_document(
            replace(module, weights={"file": "w.npz", "sha256": "0" * 64}))))
        jsonschema.validate(doc, schema)


def test_ground_documents_round_trip(models):
    from tilekit.ir import dumps, loads

    for name, (_, module) in models.items():
        for fmt in ("yaml", "json"):
            again = loads(dumps(module, fmt))
            assert again == module and dumps(again, fmt) == dumps(module, fmt), (name, fmt)


@pytest.mark.slow
def test_compile_equals_the_piped_commands(tmp_path, monkeypatch):
    import os
    import subprocess

    import tilekit
    from tilekit.ir import dumps

    root = Path(__file__).resolve().parents[2]
    onnx.save(MODELS["blockdrop"](), str(tmp_path / "m.onnx"))
    env = dict(os.environ, PATH=f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}",
               NO_COLOR="1")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", "tk-import m.onnx -o m.tk.yaml && "
                           "tk-roll --hw h100 m.tk.yaml | tk-grind | tk-codegen -o m.c.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.chdir(tmp_path)
    compiled = tilekit.compile("m.onnx", ["roll", "grind", "codegen"], hw="h100",
                               ir_path="m.tk.yaml")
    assert dumps(compiled.module) == (tmp_path / "m.c.yaml").read_text()


def test_re_rolling_or_welding_drops_the_placements(models):
    """A placement is priced on the tiles: a new roll (or new kernel groups) makes it stale,
    so the stage drops every `grind` record, nested ones too, and says so."""
    _, module = models["nested_loops"]
    assert any(rec.grind for _, rec, _ in walk(module))
    for stage in ("roll", "weld"):
        again = pipeline.run(module, [stage], pipeline.Context.for_hw("h100"))
        assert all(rec.grind is None for _, rec, _ in walk(again)), stage
        assert "control[*].grind" in again.stages[-1]["options"]["dropped"], stage
        assert again.codegen is None
