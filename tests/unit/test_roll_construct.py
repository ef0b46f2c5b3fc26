"""Tile construction over the whole workload suite: limits, contract, and why tiles differ
between machines."""

from __future__ import annotations

import functools
import math

import pytest

from tilekit.expr import analyze, parse
from tilekit.hw import load_profile
from tilekit.ir import Kernel, Module, Op, Tensor, dumps, verify
from tilekit.roll.schedule import module_estimate, roll_module
from tilekit.runtime.tiled import check_tile_cover
from tilekit.roll.workloads import load_workloads

PROFILES = ("h100", "v100", "ipu")
TOP_K = 4
#: One worker runs this file: the rolled suite (one per profile, most of the file's time) is
#: then rolled once per profile, not once per worker.
pytestmark = pytest.mark.xdist_group("roll-suite")


@functools.lru_cache(maxsize=None)
def rolled_suite(hw: str) -> tuple:
    """(workload, rolled module) for every workload of the suite, top-K candidates kept."""
    profile = load_profile(hw)
    return tuple((w, roll_module(w.module(), profile, TOP_K)) for w in load_workloads())


def analysis_of(module: Module):
    op = module.ops[0]
    return analyze(parse(op.expr), {k: t.shape for k, t in module.tensors.items()},
                   axes=op.axes or None, pad=op.pad)


def test_the_suite_has_119_distinct_workloads():
    names = [w.name for w in load_workloads()]
    assert len(names) == 119 == len(set(names))


@pytest.mark.parametrize("hw", PROFILES)
def test_no_tile_of_the_suite_breaks_a_capacity_limit(hw):
    """Every tile written, chosen or candidate, fits the profile; block % thread == 0; the
    grid and counts agree; the tile covers the output exactly once."""
    p = load_profile(hw)
    for w, m in rolled_suite(hw):
        verify(m)
        tile = m.ops[0].tile
        an = analysis_of(m)
        assert tile["smem_bytes"] <= p.smem_per_block, w.name
        assert tile["threads"] <= p.max_threads_per_block, w.name
        assert tile["regs"] <= p.max_regs_per_thread, w.name
        assert tile["regs"] * tile["threads"] <= p.regs_per_block, w.name
        assert list(tile["block"]) == [a for a, _ in an.spatial], w.name
        assert list(tile["step"]) == [a for a, _ in an.reduction], w.name
        assert tile["blocks"] == math.prod(tile["grid"].values())
        assert tile["threads"] == math.prod(tile["block"][a] // tile["thread"][a]
                                            for a in tile["block"])
        assert len(tile["candidates"]) <= TOP_K - 1
        for t in [tile, *tile["candidates"]]:
            full = {**t, "grid": {a: -(-e // t["block"][a]) for a, e in an.spatial}}
            check_tile_cover(an, full)   # also checks block % thread == 0
        for c in tile["candidates"]:
            assert c["estimate"]["time_us"] >= tile["estimate"]["time_us"], w.name


@pytest.mark.parametrize("hw", PROFILES)
def test_candidates_fit_as_well(hw):
    """Re-cost every candidate: the model's own validity agrees with the limits."""
    from tilekit.roll.construct import cost_candidates
    from tilekit.roll.cost import machine
    from tilekit.roll.problem import problem_from_analysis
    from tilekit.roll.rtile import RTile

    p = load_profile(hw)
    for w, m in rolled_suite(hw):
        an = analysis_of(m)
        problem = problem_from_analysis(an, {n: t.dtype for n, t in m.tensors.items()})
        tiles = [RTile(tuple(t["block"].values()), tuple(t["thread"].values()),
                       tuple(t["step"].values()))
                 for t in [m.ops[0].tile, *m.ops[0].tile["candidates"]]]
        costs = cost_candidates(problem, machine(p, problem.dtype), tiles)
        assert costs.valid.all(), w.name
        assert (costs.smem_tile <= p.smem_per_block).all()
        assert (costs.threads <= p.max_threads_per_block).all()
        assert (costs.regs <= p.max_regs_per_thread).all()


def tile_of(hw, name):
    return next(m for w, m in rolled_suite(hw) if w.name == name).ops[0].tile


def test_h100_register_tiles_are_bigger_than_v100s():
    # H100's FP32 peak per byte of shared-memory bandwidth is about twice V100's
    # (66.9 TFLOP/s x 0.81 over 33.5 TB/s x 0.85 = 1.9 FLOP/B, against 15.7 x 0.75 over
    # 15.7 x 0.85 = 0.88 FLOP/B). A matmul thread tile of a x b does 2ab FLOP per (a+b)*4 B
    # read from shared memory, so scale-up's register level stops at 8x8 (2.0 FLOP/B) on
    # H100 where 4x4 (1.0) is enough on V100.
    from tilekit.roll.construct import register_trajectory
    from tilekit.roll.cost import machine
    from tilekit.roll.problem import problem_from_analysis
    from tilekit.roll.rtile import block_sizes

    module = next(w for w in load_workloads() if w.name == "gemm_1024").module()
    problem = problem_from_analysis(analysis_of(module),
                                    {n: t.dtype for n, t in module.tensors.items()})
    for hw, last in (("h100", (8, 8)), ("v100", (4, 4))):
        m = machine(load_profile(hw), problem.dtype)
        bsizes = [block_sizes(problem, m.transaction_bytes, a) for a in range(len(problem.axes))]
        assert register_trajectory(problem, m, bsizes)[-1] == last, hw
    # The pick on both is the SIMT GEMM (tilekit.schedule.simt), whose block GEMMs are
    # offered on every CUDA machine: its double buffering hides the staging round trip the
    # staged kernel paid per step, and the model prices 8x8 per thread best on both (V100
    # with 128x128 blocks of 256 threads, H100 64x128 of 128).
    h100, v100 = tile_of("h100", "gemm_1024"), tile_of("v100", "gemm_1024")
    assert h100["kernel"]["shape"] == v100["kernel"]["shape"] == "simt"
    assert h100["thread"] == v100["thread"] == {"i": 8, "j": 8}
    assert h100["block"] == {"i": 64, "j": 128} and v100["block"] == {"i": 128, "j": 128}


def test_ipu_tiles_are_small_and_many():
    # The IPU (kind: distributed) reads every block's inputs over the exchange: 3.9 TFLOP/s
    # x 0.6 of SIMT compute against 8 TB/s x 0.8 of exchange makes a block compute-bound at
    # 0.37 FLOP/B (H100 needs ~20 FLOP/B from DRAM), and its registers (32 per worker) allow
    # only a 1-element thread tile. So a GEMM block is 2x2 outputs for 4 of the tile's 6
    # workers (block sizes are powers of two or divisors), and the grid holds far more blocks
    # than the 1472 tiles.
    ipu = tile_of("ipu", "gemm_1024")
    assert ipu["thread"] == {"i": 1, "j": 1} and ipu["block"] == {"i": 2, "j": 2}
    assert ipu["threads"] == 4 <= load_profile("ipu").max_threads_per_block
    assert ipu["blocks"] > 100 * 1472
    assert ipu["estimate"]["bound"] == "compute"
    h100 = tile_of("h100", "gemm_1024")
    assert h100["blocks"] < ipu["blocks"] and h100["threads"] > ipu["threads"]


def test_small_problems_scale_out_to_fill_the_sms():
    # resnet50_l4_3x3_512 (512 x 7 x 7 outputs): big register tiles would leave most of
    # H100's 132 SMs idle; construction gives the small thread tile a block level and scale-out
    # shrinks blocks until the grid has at least one block per SM (split-K slices counted:
    # the pick is 8 output tiles of 32 slices).
    tile = tile_of("h100", "resnet50_l4_3x3_512")
    assert tile["blocks"] * tile.get("split_k", 1) >= 128
    # the tile's own estimate (the op may keep the default schedule: rolled_estimate)
    assert tile.get("rolled_estimate", tile["estimate"])["wave_efficiency"] > 0.9


def test_reduction_steps_follow_the_coalescing_rule():
    # A K-contiguous matmul operand staged 32 floats per row = 128 B per row.
    assert tile_of("h100", "gemm_1024")["step"] == {"k": 32}
    # The 3x3 window of a convolution is taken whole (kw is smaller than a transaction).
    step = tile_of("h100", "resnet50_l1_3x3_64")["step"]
    assert step["kw"] == 3


def test_rolled_output_is_deterministic():
    h100 = load_profile("h100")
    w = next(w for w in load_workloads() if w.name == "inception_6b_1x7")
    a = dumps(roll_module(w.module(), h100, 3))
    b = dumps(roll_module(w.module(), h100, 3))
    assert a == b


def mlp_module(kernels=()) -> Module:
    t = lambda shape, role="intermediate": Tensor(shape, "float32", role)  # noqa: E731
    return Module(
        model="mlp",
        tensors={"x": t((64, 128), "input"), "w": t((128, 256), "input"),
                 "h": t((64, 256)), "y": t((64, 256), "output")},
        ops=(Op("fc", "h[i,j] += x[i,k] * w[k,j]"),
             Op("relu", "y[i,j] = max(h[i,j], 0.0)")),
        inputs=("x", "w"), outputs=("y",), kernels=kernels,
        stages=({"name": "import"},))


def test_module_contract():
    h100 = load_profile("h100")
    out = roll_module(mlp_module(), h100, 2)
    verify(out)
    assert out.hardware == "h100"
    assert out.stages[-1] == {"name": "roll", "options": {"top_k": 2}}
    assert [k.ops for k in out.kernels] == [("fc",), ("relu",)]    # default schedule made
    for op, kernel in zip(out.ops, out.kernels):
        # (`split_k` only where the pick is split: the small fc here)
        assert set(op.tile) - {"split_k"} == {"block", "thread", "step", "grid", "blocks",
                                              "threads", "smem_bytes", "regs", "kernel",
                                              "estimate", "candidates"}
        assert op.tile.get("split_k", 2) > 1
        assert kernel.estimate == op.tile["estimate"] and kernel.tile is None
    assert out.ops[1].tile["step"] == {} and out.ops[1].tile["smem_bytes"] == 0
    total = module_estimate(out)
    assert total["kernels"] == 2
    assert total["time_us"] == pytest.approx(sum(k.estimate["time_us"] for k in out.kernels),
                                             rel=1e-3)


def test_a_group_estimate_saves_the_intermediate_and_leaves_its_tile_to_weld():
    h100 = load_profile("h100")
    fused = roll_module(mlp_module((Kernel("k0", ("fc", "relu")),)), h100)
    (kernel,) = fused.kernels
    assert kernel.tile is None      # kernels[].tile means one thing: tk-weld's group tile
    apart = roll_module(mlp_module(), h100)
    assert kernel.estimate["dram_bytes"] < sum(k.estimate["dram_bytes"] for k in apart.kernels)
    assert kernel.estimate["flops"] == pytest.approx(
        sum(k.estimate["flops"] for k in apart.kernels), rel=1e-3)


def test_opaque_ops_get_the_fixed_schedule():
    h100 = load_profile("h100")
    m = Module(model="g", tensors={"t": Tensor((1000, 64), "float32", "input"),
                                   "i": Tensor((8,), "int64", "input"),
                                   "y": Tensor((8, 64), "float32", "output")},
               ops=(Op("gather", kind="opaque", opaque={"type": "Gather", "inputs": ["t", "i"],
                                                        "outputs": ["y"],
                                                        "attrs": {"axis": 0}}),),
               inputs=("t", "i"), outputs=("y",), stages=({"name": "import"},))
    tile = roll_module(m, h100).ops[0].tile
    assert tile["block"] == {"x": 256} and tile["threads"] == 256
    assert tile["grid"] == {"x": 2} and tile["blocks"] == 2
    assert tile["estimate"]["bound"] == "launch" and tile["estimate"]["flops"] == 0  # 2 KiB


def test_refusals():
    import dataclasses

    from tilekit.errors import TilekitError

    h100 = load_profile("h100")
    bare = mlp_module()
    with pytest.raises(TilekitError, match="no 'import' stage"):
        roll_module(dataclasses.replace(bare, stages=()), h100)
    with pytest.raises(TilekitError, match="unknown to tk-roll"):
        roll_module(dataclasses.replace(bare, ops=(Op("x", "y[i,j] = h[i,j]", kind="magic"),)),
                    h100)
    with pytest.raises(TilekitError, match="top_k"):
        roll_module(bare, h100, 0)


def test_rerolling_drops_stale_codegen_and_launch():
    h100 = load_profile("h100")
    once = roll_module(mlp_module(), h100)
    import dataclasses
    generated = dataclasses.replace(
        once, codegen={"arch": "sm_90"},
        kernels=tuple(dataclasses.replace(k, launch={"grid": [7], "block": [32]})
                      for k in once.kernels))
    again = roll_module(generated, load_profile("v100"))
    verify(again)
    assert again.codegen is None and all(k.launch is None for k in again.kernels)
    assert again.stages[-1]["options"]["dropped"] == ["codegen", "kernels[*].launch"]
    assert "dropped" not in roll_module(mlp_module(), h100).stages[-1]["options"]


def test_a_profile_too_small_for_any_tile_is_a_located_error():
    import dataclasses

    from tilekit.errors import TilekitError

    tiny = dataclasses.replace(load_profile("v100"), max_regs_per_thread=8)
    with pytest.raises(TilekitError, match="no tile fits.*registers.max_per_thread 8") as info:
        roll_module(mlp_module(), tiny)
    assert info.value.where == "--hw"


def test_profile_given_by_path_is_recorded_so_later_stages_find_it(tmp_path, monkeypatch):
    import subprocess
    import sys

    from tilekit.hw import builtin_dir, load_recorded_profile

    monkeypatch.chdir(tmp_path)
    text = (builtin_dir() / "v100.yaml").read_text().replace("name: v100", "name: myv100")
    text = text.replace("aliases: [v100-sxm2, v100-sxm2-32gb, V100]", "aliases: []")
    (tmp_path / "my.yaml").write_text(text)
    (tmp_path / "out").mkdir()
    (tmp_path / "m.yaml").write_text(dumps(mlp_module()))
    tk = [sys.executable, "-m", "tilekit.cli.tk_roll"]
    run = lambda *a: subprocess.run([*tk, *a], capture_output=True, text=True)  # noqa: E731
    r = run("m.yaml", "--hw", "./my.yaml", "-o", "out/r.yaml")
    assert r.returncode == 0, r.stderr
    from tilekit.ir import read_module
    rolled = read_module("out/r.yaml")
    assert rolled.hardware == "../my.yaml"
    assert load_recorded_profile(rolled.hardware, "out/r.yaml").name == "myv100"
    r = run("out/r.yaml", "-o", "again.yaml")          # re-roll: resolved, then re-recorded
    assert r.returncode == 0, r.stderr
    assert read_module("again.yaml").hardware == "my.yaml"
    r = run("m.yaml", "--hw", str(builtin_dir() / "h100.yaml"))
    assert "hardware:\n  name: h100\n" in r.stdout     # a shipped profile keeps its name


def test_output_never_overwrites_the_weights_sidecar(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.weights.npz").write_bytes(b"weights")
    m = dataclasses_replace(mlp_module(), weights={"file": "a.weights.npz", "sha256": "0" * 64})
    (tmp_path / "m.yaml").write_text(dumps(m))
    r = subprocess.run([sys.executable, "-m", "tilekit.cli.tk_roll", "m.yaml", "--hw", "v100",
                        "-o", "a.weights.npz"], capture_output=True, text=True)
    assert r.returncode == 2 and "refusing to overwrite" in r.stderr
    assert (tmp_path / "a.weights.npz").read_bytes() == b"weights"


def dataclasses_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)
