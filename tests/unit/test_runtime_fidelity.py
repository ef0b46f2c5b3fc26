"""The fidelity harness without a GPU: statistics on known inputs, candidate records, builds,
the compile fallback, and the whole measurement with an injected timer (tilekit.runtime.fidelity).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.codegen.nvcc import CompileError, CompileResult, Resources
from tilekit.errors import IRError, TilekitError
from tilekit.hw import load_profile
from tilekit.ir.model import Kernel, Module, Op, Tensor
from tilekit.runtime import fidelity as F
from tilekit.roll.construct import roll_problem
from tilekit.roll.problem import problem_from_analysis
from tilekit.ir.graph import op_analysis
from tilekit.roll.schedule import dtypes_of, roll_module, tile_record
from tilekit.schedule.shape import Target, analysis_facts

#: One worker runs this file (an xdist group): the suite sample (sample) is built once, not
#: once per worker.
pytestmark = pytest.mark.xdist_group("runtime-fidelity")


@pytest.fixture(scope="session")
def h100():
    return load_profile("h100")


@pytest.fixture(scope="session")
def sample(h100):
    return F.build_suite_sample(h100)


# -- statistics on known inputs ----------------------------------------------------------

def test_average_ranks_share_ties():
    assert F.average_ranks([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]
    assert F.average_ranks([5, 6, 7, 8, 7]) == [1.0, 2.0, 3.5, 5.0, 3.5]
    assert F.average_ranks([2, 2, 2]) == [2.0, 2.0, 2.0]


def test_spearman_known_values():
    assert F.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert F.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # scipy.stats.spearmanr([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) = 0.8207826816681233
    assert F.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)
    # Only the order counts: a monotone transform changes nothing.
    assert F.spearman([1, 2, 3, 4, 5], [1, 8, 27, 64, 125]) == pytest.approx(1.0)


def test_spearman_undefined():
    assert F.spearman([1, 2], [1, 2]) is None          # too few pairs
    assert F.spearman([4, 4, 4], [1, 2, 3]) is None    # the model ties every candidate
    assert F.spearman([1, 2, 3], [7, 7, 7]) is None


def test_geomean():
    assert F.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert F.geomean([2.0, None, 8.0]) == pytest.approx(4.0)
    assert F.geomean([]) is None


def test_op_stats_on_known_inputs():
    s = F.op_stats([1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 3.0, None])
    assert s["measured"] == 3
    assert s["best_index"] == 1 and s["best_us"] == 1.0
    assert s["top1_us"] == 2.0 and s["top1_over_best"] == pytest.approx(2.0)
    assert s["pick_rank"] == 2
    assert s["spearman"] == pytest.approx(0.5)      # ranks (1,2,3) against (2,1,3)
    assert s["estimated_over_measured"] == pytest.approx(0.5)


def test_op_stats_pick_best_and_ties():
    s = F.op_stats([1.0, 1.0, 2.0], [3.0, 3.0, 5.0])
    assert s["top1_over_best"] == 1.0 and s["pick_rank"] == 1
    assert s["spearman"] == pytest.approx(1.0)


def test_op_stats_without_the_pick():
    s = F.op_stats([1.0, 2.0, 3.0], [None, 4.0, 5.0])
    assert s["top1_over_best"] is None and s["pick_rank"] is None
    assert s["best_index"] == 1 and s["estimated_over_measured"] is None
    empty = F.op_stats([1.0], [None])
    assert empty["measured"] == 0 and empty["spearman"] is None


def test_relative_error():
    assert F.relative_error([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert F.relative_error([1.0, 2.5], [1.0, 2.0]) == pytest.approx(0.25)
    assert F.relative_error([math.nan, 2.0], [math.nan, 2.0]) == 0.0
    assert F.relative_error([1.0, 2.0], [math.nan, 2.0]) == math.inf
    assert F.relative_error([math.nan, 2.0], [1.0, 2.0]) == math.inf
    assert F.relative_error([-math.inf], [math.inf]) == math.inf


# -- candidate records and builds --------------------------------------------------------

def test_candidate_tiles_are_what_tk_roll_would_write(h100):
    """Each candidate, re-costed into a full record, is exactly the tile tk-roll writes when
    that candidate is its pick (estimate included): codegen gets a valid record."""
    for w in F.suite_sample():
        rolled = roll_module(w.module(), h100, 10)
        op = rolled.ops[0]
        tiles = F.candidate_tiles(rolled, op, h100, "ops[0]")
        analysis = op_analysis(rolled, 0)
        problem = problem_from_analysis(analysis, dtypes_of(rolled))
        facts = analysis_facts(analysis, dtypes_of(rolled))
        want = [tile_record(problem, [c], facts, Target.of(h100)).tile
                for c in roll_problem(problem, h100, 10)]
        assert tiles[:len(want)] == want, w.name
        # a split pick's other splits follow: its tile, fewest slices first, as the roll
        # priced them
        extra = tiles[len(want):]
        if "split_k" not in op.tile:
            assert not extra, w.name
        sizes = [{k: t[k] for k in ("block", "thread", "step")} for t in [tiles[0], *extra]]
        assert all(size == sizes[0] for size in sizes), w.name
        slices = [t["split_k"] for t in extra]
        assert slices == sorted(set(slices)) and op.tile.get("split_k") not in slices
        assert all(n >= 2 for n in slices), w.name
        if "rolled_estimate" in op.tile:      # tk-roll kept the default over its pick
            assert op.tile["kernel"]["shape"] == "default"
            assert tiles[0]["estimate"] == op.tile["rolled_estimate"]
            assert {k: v for k, v in op.tile.items()
                    if k not in ("kernel", "estimate", "rolled_estimate", "candidates")} == \
                {k: v for k, v in tiles[0].items() if k not in ("kernel", "estimate",
                                                                 "candidates")}
        else:
            assert tiles[0] == {**op.tile, "candidates": []}


def test_candidate_tiles_need_a_rolled_tile(h100):
    w = F.suite_sample()[0]
    with pytest.raises(IRError, match="no tile from tk-roll"):
        F.build_op(w.module(), w.name, h100)
    rolled = roll_module(w.module(), h100, 3)
    tile = dict(rolled.ops[0].tile)
    tile["candidates"] = [{**tile["candidates"][0], "block": {}}]
    broken = replace(rolled, ops=(replace(rolled.ops[0], tile=tile),))
    with pytest.raises(IRError, match="candidates"):
        F.build_op(broken, w.name, h100)


def test_the_sample_builds(sample):
    """Every candidate of the benchmark's sample generates, each kernel with its own entry,
    and the pick's kernel is the one tk-codegen makes of the rolled op."""
    assert len(sample) == len(F.suite_sample()) >= 25
    entries = [k.entry for op in sample for k in op.kernels()]
    assert len(entries) == len(set(entries))
    for op in sample:
        assert len(op.candidates) >= 2, op.name
        assert [c.index for c in op.candidates] == list(range(len(op.candidates)))
        assert not [c.error for c in op.candidates if c.error], op.name
        for c in op.candidates:
            assert c.same_as is None or op.candidates[c.same_as].kernel is not None
        pick = op.candidates[0].kernel
        plain = generate(op.module, load_profile("h100")).kernels[0]
        assert pick.body.replace(pick.entry, "E") == plain.body.replace(plain.entry, "E")


def test_op_module_isolates_one_op(h100):
    tensors = {"x": Tensor((4, 8), "float32", "input"), "m": Tensor((4,)),
               "y": Tensor((4, 8), "float32", "output")}
    ops = (Op("max", "m[i] max= x[i,j]"), Op("sub", "y[i,j] = x[i,j] - m[i]"))
    module = Module("two", tensors, ops, ("x",), ("y",),
                    (Kernel("k", ("max", "sub")),)).with_stage("import")
    rolled = roll_module(module, h100, 4)
    alone = F.op_module(rolled, rolled.ops[1])
    assert alone.inputs == ("x", "m") and alone.outputs == ("y",)
    assert alone.tensors["m"].role == "input" and alone.tensors["y"].role == "output"
    built = F.build_op(rolled, "sub", h100)
    assert built.module.ops[0].tile["candidates"] == []
    assert {c.kernel.group for c in built.candidates if c.kernel} <= \
        {f"sub__c{i}" for i in range(4)}


def test_a_candidate_that_fails_codegen_is_recorded(h100, monkeypatch):
    w = F.suite_sample()[1]
    rolled = roll_module(w.module(), h100, 4)
    real = F.generate

    def flaky(module, profile=None, arch=None):
        if module.kernels[0].name.endswith("__c2"):
            raise RuntimeError("boom")
        return real(module, profile, arch)

    monkeypatch.setattr(F, "generate", flaky)
    built = F.build_op(rolled, w.name, h100)
    assert built.candidates[2].kernel is None
    assert built.candidates[2].error == "codegen: RuntimeError: boom"
    rows = F.measure([built], estimate_timer())
    assert rows[0]["candidates"][2]["error"] == "codegen: RuntimeError: boom"
    assert rows[0]["measured"] == len(built.candidates) - 1


# -- compiling (nvcc replaced: the fallback logic) ---------------------------------------

def test_compile_falls_back_to_smaller_units(sample, monkeypatch, tmp_path):
    """A unit with a bad kernel is split per op, then per kernel: only the bad one fails."""
    import tilekit.codegen.nvcc as nvcc

    ops = sample[:3]
    bad = ops[1].kernels()[2].entry
    calls = []

    def fake_compile(source, arch, **_):
        calls.append(source.count("__global__"))
        if f"{bad}(" in source:
            raise CompileError("error: broken", "--compile")
        names = [k.entry for op in ops for k in op.kernels() if f"{k.entry}(" in source]
        return CompileResult(arch, {n: Resources(40, 0, 0, 0, 0) for n in names},
                             tmp_path / f"{len(calls)}.cubin", "nvcc", False)

    monkeypatch.setattr(nvcc, "compile_unit", fake_compile)
    monkeypatch.setattr(nvcc, "find_nvcc", lambda: "nvcc")
    compiled = F.compile_candidates(ops, "sm_90")
    everything = [k.entry for op in ops for k in op.kernels()]
    assert calls[0] == len(everything)                  # one unit first
    assert list(compiled.errors) == [bad]
    assert "broken" in compiled.errors[bad]
    assert set(compiled.resources) == set(everything) - {bad}
    assert compiled.unit_of(everything[0]) is not None and compiled.unit_of(bad) is None
    # Parallel chunks hold whole ops.
    calls.clear()
    split = F.compile_candidates(ops, "sm_90", jobs=2)
    assert set(split.resources) == set(compiled.resources)


def test_compile_without_nvcc(sample, monkeypatch):
    import tilekit.codegen.nvcc as nvcc
    monkeypatch.setattr(nvcc, "find_nvcc", lambda: None)
    with pytest.raises(TilekitError, match="nvcc was not found"):
        F.compile_candidates(sample[:1], "sm_90")


# -- measuring with an injected timer ----------------------------------------------------

def estimate_timer(time_us=lambda op, c: c.tile["estimate"]["time_us"]):
    """A fake device: candidate `c` of op `op` takes `time_us(op, c)` (default: its
    estimate, a perfect model)."""
    def timer(op):
        return {c.index: F.Timed(time_us(op.name, c) * 1e-6)
                for c in op.candidates if c.kernel is not None and c.same_as is None}
    return timer


def test_a_perfect_model(sample):
    rows = F.measure(sample, estimate_timer())
    for r in rows:
        assert r["top1_over_best"] == pytest.approx(1.0), r["op"]
        assert r["pick_rank"] == 1
        assert r["estimated_over_measured"] == pytest.approx(1.0)
        # (a candidate codegen made into the same code as another shares its time, not its
        # estimate: then the order can differ)
        shared = [c for c in r["candidates"] if c["same_kernel_as"] is not None
                  and c["estimated_us"] != r["candidates"][c["same_kernel_as"]]["estimated_us"]]
        assert r["spearman"] is None or r["spearman"] == pytest.approx(1.0) or shared
        # Same-code candidates are measured once and share the time.
        for c in r["candidates"]:
            if c["same_kernel_as"] is not None:
                assert c["measured_us"] == r["candidates"][c["same_kernel_as"]]["measured_us"]
    s = F.summarize(rows)
    assert s["ops"] == s["ops_ranked"] == len(sample)
    assert s["geomean_top1_over_best"] == pytest.approx(1.0)
    assert s["top1_within_10pct"] == 1.0 and s["top1_is_best"] == 1.0
    assert s["median_spearman"] == pytest.approx(1.0)
    assert s["geomean_estimated_over_measured"] == pytest.approx(1.0)
    assert s["candidates_failed"] == 0
    assert sum(s["shapes"].values()) == s["candidates"]
    json.dumps({"summary": s, "ops": rows})              # the report is plain JSON


def test_a_model_that_is_off(sample):
    """Known distortions: on the first op the device reverses the model's order (the pick is
    the slowest); on every other op the pick runs 30% slower than estimated."""
    reversed_op = sample[0].name

    def time_us(op, c):
        if op == reversed_op:
            return 100.0 / (1 + c.index)
        est = c.tile["estimate"]["time_us"]
        return 1.3 * est if c.index == 0 else est

    rows = F.measure(sample, estimate_timer(time_us))
    first = rows[0]
    faster = [c for c in first["candidates"][1:] if c["same_kernel_as"] != 0]
    assert first["pick_rank"] == 1 + len(faster)
    assert first["top1_over_best"] == pytest.approx(
        100.0 / min(c["measured_us"] for c in faster))
    assert first["spearman"] < 0
    assert first["estimated_over_measured"] == pytest.approx(
        first["candidates"][0]["estimated_us"] / 100.0)
    for r in rows[1:]:
        e0 = r["candidates"][0]["estimated_us"]
        others = [c["estimated_us"] for c in r["candidates"][1:] if c["same_kernel_as"] != 0]
        want = 1.3 * e0 / min([1.3 * e0, *others])
        assert r["top1_over_best"] == pytest.approx(want, rel=1e-4), r["op"]
        assert r["estimated_over_measured"] == pytest.approx(1 / 1.3, rel=1e-4)
    s = F.summarize(rows)
    ratios = [r["top1_over_best"] for r in rows]
    assert s["geomean_top1_over_best"] == pytest.approx(
        math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert s["top1_within_10pct"] == pytest.approx(
        sum(r <= 1.1 for r in ratios) / len(ratios))
    assert s["geomean_estimated_over_measured"] < 1


def test_failures_are_recorded_not_fatal(sample):
    broken, partial = sample[0].name, sample[1].name

    def timer(op):
        if op.name == broken:
            raise RuntimeError("device lost")
        out = estimate_timer()(op)
        if op.name == partial:
            out[0] = F.Timed(error="launch: too many resources")
            out.pop(1, None)
        return out

    rows = F.measure(sample[:3], timer)
    assert all(c["error"] == "timer: RuntimeError: device lost" for c in rows[0]["candidates"])
    assert rows[0]["measured"] == 0 and rows[0]["top1_over_best"] is None
    assert rows[1]["candidates"][0]["error"] == "launch: too many resources"
    assert rows[1]["candidates"][1]["error"] == "not timed"
    assert rows[1]["top1_over_best"] is None and rows[1]["best_index"] is not None
    assert rows[2]["top1_over_best"] == pytest.approx(1.0)
    s = F.summarize(rows)
    assert s["ops"] == 3 and s["ops_ranked"] == 1
    assert s["candidates_failed"] == len(rows[0]["candidates"]) + 2
    text = F.format_table(rows, s)
    assert rows[0]["op"] in text and "1 of 3 ops ranked" in text


def test_a_wrong_result_is_not_ranked(sample):
    def timer(op):
        out = estimate_timer()(op)
        out[0] = F.Timed(1e-6, error="result differs from the CPU reference by 0.5",
                         max_rel_err=0.5)
        return out

    row = F.measure(sample[:1], timer)[0]
    assert row["candidates"][0]["measured_us"] == 1.0
    assert row["top1_over_best"] is None


def test_cuda_timer_needs_a_gpu(monkeypatch):
    from tilekit.runtime.cuda import require_cupy
    try:
        require_cupy()
    except TilekitError:
        pass
    else:
        pytest.skip("a GPU is visible")
    compiled = F.CompiledSet("sm_90", (), {}, {}, 0.0)
    with pytest.raises(TilekitError, match="CuPy|CUDA device"):
        F.CudaTimer(compiled)


def test_units_know_their_entries(tmp_path):
    unit = F.Unit("src", Path(tmp_path / "a.cubin"), ("tk_a", "tk_b"))
    compiled = F.CompiledSet("sm_90", (unit,), {}, {}, 0.0)
    assert compiled.unit_of("tk_b") is unit and compiled.unit_of("tk_c") is None


# -- the CUDA timer against a stand-in for CuPy ------------------------------------------

class FakeCupy:
    """Just enough of CuPy for `CudaTimer`: NumPy buffers, and a clock that each launch
    advances by its kernel's duration. A kernel computes the CPU reference's result, except
    those listed as `wrong` (they write nothing) or `broken` (their launch raises)."""

    uint8 = np.uint8
    L2 = 50 << 20

    def __init__(self, module, durations, wrong=(), broken=()):
        from tilekit.runtime.cpu import run_module
        self.clock, self.memory, self.launches, self.memsets, self.loaded = 0.0, {}, [], [], []
        self.fills = []
        self.durations, self.wrong, self.broken = durations, set(wrong), set(broken)
        self.reference = lambda arrays: run_module(
            module, {n: arrays[n] for n in module.inputs}, {})[module.outputs[0]]
        attributes = {"MaxSharedMemoryPerBlockOptin": 232448, "MaxRegistersPerBlock": 16384,
                      "L2CacheSize": self.L2}
        fake = self

        class Event:
            def record(self, stream=None):
                self.t = fake.clock

            def synchronize(self):
                pass

        self.cuda = SimpleNamespace(
            Device=lambda: SimpleNamespace(compute_capability="90", attributes=attributes),
            runtime=SimpleNamespace(getDeviceCount=lambda: 1, driverGetVersion=lambda: 13000,
                                    memsetAsync=self._memset),
            get_current_stream=lambda: SimpleNamespace(ptr=0, synchronize=lambda: None),
            Event=Event, get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)

    def _array(self, values):
        array = SimpleNamespace(a=values, nbytes=values.nbytes, get=values.copy)
        array.fill = lambda v: (self.fills.append(values.size), values.fill(v))
        array.data = SimpleNamespace(ptr=id(array))
        self.memory[id(array)] = array
        return array

    def asarray(self, values):
        return self._array(np.array(values))

    def empty(self, shape, dtype):
        return self._array(np.zeros(shape, dtype))

    zeros = empty

    def _memset(self, ptr, value, size, stream):
        self.memsets.append(size)
        self.memory[ptr].a.view(np.uint8)[...] = value

    def RawModule(self, path=None, code=None, backend=None, options=()):
        self.loaded.append("nvrtc" if code else path)
        return SimpleNamespace(get_function=self._function)

    def _function(self, entry):
        fake = self

        class Function:
            max_dynamic_shared_size_bytes = 0

            def __call__(self, grid, block, args, shared_mem=0):
                if entry in fake.broken:
                    raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")
                fake.launches.append(entry)
                fake.clock += fake.durations[entry]
                if entry not in fake.wrong:
                    names = fake.args[entry]
                    out = args[names.index(fake.output)]
                    out.a[...] = fake.reference({n: a.a for n, a in zip(names, args)})

        return Function()


def test_cuda_timer_with_a_stand_in_device(h100, monkeypatch, tmp_path):
    import sys

    from tilekit.codegen import nvcc
    w = next(w for w in F.suite_sample() if w.name == "resnet50_l1_1x1_256_64")
    op = F.build_op(roll_module(w.module(), h100, 6), w.name, h100)
    kernels = op.kernels()
    assert len(kernels) >= 6
    entries = [k.entry for k in kernels]
    durations = {e: (i + 1) * 1e-6 for i, e in enumerate(entries)}
    # (candidate 1 has 512 threads: over the stand-in's 16384 registers per block)
    fake = FakeCupy(op.module, durations, wrong=[entries[3]], broken=[entries[2]])
    fake.args = {k.entry: k.args for k in kernels}
    fake.output = op.module.outputs[0]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(nvcc, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(nvcc, "nvcc_version", lambda _: "13.0.88")
    ok = Resources(40, 0, 0, 0, 0)
    unit = F.Unit("source", tmp_path / "unit.cubin", tuple(entries[:5]))
    compiled = F.CompiledSet(
        "sm_90", (unit,), {**{e: ok for e in entries[:5]}, entries[1]: Resources(255, 0, 0, 0, 0)},
        {entries[5]: "nvcc: error"}, 1.0)
    timer = F.CudaTimer(compiled, runs=5, warmup=2)
    assert fake.memsets == [] and timer.flush.nbytes == 2 * FakeCupy.L2
    timed = timer(op)
    by_entry = {k.entry: timed[c.index] for c in op.candidates for k in [c.kernel]
                if c.kernel is not None and c.same_as is None}
    good = by_entry[entries[0]]
    assert good.seconds == pytest.approx(1e-6) and good.error is None
    assert good.max_rel_err < 1e-6 and good.resources["registers"] == 40
    assert by_entry[entries[4]].seconds == pytest.approx(5e-6)
    assert "differs from the CPU reference" in by_entry[entries[3]].error
    assert by_entry[entries[3]].max_rel_err == math.inf
    assert by_entry[entries[2]].error.startswith("launch: RuntimeError")
    assert "registers per block" in by_entry[entries[1]].error
    assert by_entry[entries[5]].error == "nvcc: error"
    # Each timed kernel: one checked launch, the warm-up, the runs; L2 flushed before each run.
    assert fake.launches.count(entries[0]) == 1 + 2 + 5
    # the pick is split-K: its per-tile counters are zeroed before every launch
    assert kernels[0].counters and fake.fills.count(kernels[0].counters) == 1 + 2 + 5
    assert fake.memsets.count(2 * FakeCupy.L2) == 3 * 5
    assert fake.loaded == [str(tmp_path / "unit.cubin")]
    rows = F.measure([op], lambda _: timed)
    assert rows[0]["measured"] == 2 and rows[0]["top1_over_best"] == pytest.approx(1.0)
    # A toolkit newer than the driver: the same unit goes through NVRTC.
    monkeypatch.setattr(nvcc, "nvcc_version", lambda _: "14.0.1")
    assert F.CudaTimer(compiled, flush_l2=False).nvrtc


def test_a_split_pick_is_measured_at_its_other_splits(h100):
    """tk-roll splits only its pick; the benchmark also builds the pick's tile at each other
    number of slices the roll priced, so that the choice of slices is measured (on the H100
    ResNet-50's layers split into 32 slices ran longer than into 16, the model said shorter)."""
    from tilekit.roll.cost import machine, split_k_estimate
    (w,) = [w for w in F.load_workloads() if w.name == "resnet50_l3_down_s2"]
    rolled = roll_module(w.module(), h100, 10)
    tile = rolled.ops[0].tile
    assert tile["split_k"] == 16
    tiles = F.candidate_tiles(rolled, rolled.ops[0], h100, "ops[0]")
    extra = tiles[1 + len(tile["candidates"]):]
    assert [t["split_k"] for t in extra] == [2, 4, 8]
    problem = problem_from_analysis(op_analysis(rolled, 0), dtypes_of(rolled))
    sizes = [tuple(tile[key][a] for a in axes) for key, axes in (
        ("block", [a for a, _ in problem.spatial]), ("thread", [a for a, _ in problem.spatial]),
        ("step", [a for a, _ in problem.reduction]))]
    for t, factor in zip(extra, (2, 4, 8)):
        est, slices = split_k_estimate(problem, machine(h100, problem.dtype), *sizes, factor,
                                       staged=True)
        assert slices == t["split_k"] and t["estimate"] == est.record()
    built = F.build_op(rolled, rolled.ops[0].name, h100)
    kernels = [c.kernel for c in built.candidates[-3:]]
    assert all(k is not None and k.schedule["split_k"]["slices"] == n
               for k, n in zip(kernels, (2, 4, 8)))
