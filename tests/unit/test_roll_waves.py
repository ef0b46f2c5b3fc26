"""Occupancy, latency hiding and split-K of CUDA-core convolutions (docs/roll.md, "Occupancy
and latency hiding"; docs/codegen.md's staged kernel): the roll gives a ResNet-50-like 3x3
convolution at batch 1 enough warps per SM, and a split-K staged kernel computes what the
reference executor computes."""

from __future__ import annotations

import shutil
from pathlib import Path
from dataclasses import replace

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.codegen.emulate import emulate, find_cxx
from tilekit.hw import load_profile
from tilekit.ir import Module, Op, Tensor
from tilekit.roll import cost
from tilekit.runtime.cpu import run_module

H100 = load_profile("h100")
needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler for the emulation")


def assert_emulates_reference(result, module: Module, seed: int) -> None:
    """The generated kernels, emulated on the CPU, compute `module`'s z as the reference
    executor does (random inputs of `seed`)."""
    rng = np.random.default_rng(seed)
    v = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
         for n in module.inputs}
    got = emulate(result.module, v, {})["z"]
    want = run_module(module, v, {})["z"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def conv3x3(c: int, f: int, hw: int, chain: bool = True, tile: dict | None = None) -> Module:
    """A batch-1 3x3 convolution (stride 1, pad 1), then bias and ReLU when `chain`."""
    tensors = {"x": Tensor((1, c, hw, hw), "float32", "input"),
               "w": Tensor((f, c, 3, 3), "float32", "input"),
               "y": Tensor((1, f, hw, hw), "float32", "output" if not chain else "intermediate")}
    ops = [Op("conv", "y[n, f, h, w] += x[n, c, h + kh - 1, w + kw - 1] * w[f, c, kh, kw]",
              pad="0", tile=tile)]
    inputs = ("x", "w")
    out = "y"
    if chain:
        tensors["bias"] = Tensor((f,), "float32", "input")
        tensors["z"] = Tensor((1, f, hw, hw), "float32", "output")
        ops.append(Op("relu", "z[n, f, h, w] = max(y[n, f, h, w] + bias[f], 0.0)"))
        inputs, out = ("x", "w", "bias"), "z"
    return Module(model="conv3x3", inputs=inputs, outputs=(out,), tensors=tensors,
                  ops=tuple(ops), stages=({"name": "import"},))


def rolled_tile(module: Module) -> dict:
    from tilekit.roll.schedule import roll_module
    return roll_module(module, H100).ops[0].tile


@pytest.mark.parametrize("c, hw", [(64, 56), (128, 28), (256, 14), (512, 7)])
def test_small_convolutions_get_a_full_wave(c, hw, monkeypatch):
    """ResNet-50's 3x3 convolutions at batch 1 (res2 to res5): priced as if 4 warps per SM
    issued at the peak and with no split of the reduction (the model the H200 profile
    measured; convolutions were not SIMT GEMMs then), the pick is a staged grid of fewer
    blocks than SMs (56x56 and 28x28: the 112 blocks measured) or the default kernel; with
    the latency-hiding term and the staged split-K, a staged kernel of at least a full wave
    of blocks (slices counted), more than 8 warps per SM, estimated faster than the old pick
    is now estimated."""
    from tilekit.roll import construct
    from tilekit.schedule import shape

    module = conv3x3(c, c, hw, chain=False)
    new = rolled_tile(module)
    assert new["kernel"]["shape"] == "staged" and "rolled_estimate" not in new
    blocks = new["blocks"] * new.get("split_k", 1)
    assert blocks >= H100.sm_count
    warps = -(-new["kernel"]["threads"] // 32)
    assert blocks * warps >= H100.sm_count * 2 * cost.SATURATING_WARPS
    with monkeypatch.context() as patch:
        patch.setattr(cost, "HIDING_WARPS", cost.SATURATING_WARPS)
        patch.setattr(construct, "best_staged_split", lambda *a: None)
        for where in (cost, shape):
            patch.setattr(where, "simt_plan", lambda *a, **k: "not then")
        patch.setattr(construct, "simt_tiles", lambda *a: [])
        old = rolled_tile(module)
    assert "split_k" not in old
    if hw >= 28:
        assert old["kernel"]["shape"] == "staged" and old["blocks"] == 112
    else:
        assert old["kernel"]["shape"] == "default"
    assert new["estimate"]["time_us"] < old["estimate"]["time_us"]


def test_a_large_convolution_whose_pick_leaves_the_sms_short_of_warps_is_split():
    """VGG-19's 3x3 convolution on 28x28x512 (401k outputs): enough output for every SM's
    warps at small tiles, but the fastest unsplit tile is 112 blocks of 7 warps (the H200
    profile: 587 us, 77% of cycles with no warp to issue). The split is priced because the
    pick, not the output, leaves the SMs short: the roll splits it, into at least a full
    wave of blocks, and estimates the split faster than the unsplit pick."""
    from tilekit.roll import construct

    module = conv3x3(512, 512, 28, chain=False)
    new = rolled_tile(module)
    assert new["kernel"]["shape"] == "staged" and new.get("split_k", 1) >= 2
    assert new["blocks"] * new["split_k"] >= H100.sm_count
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(construct, "best_staged_split", lambda *a: None)
        old = rolled_tile(module)
    warps = -(-old["kernel"]["threads"] // 32)
    assert "split_k" not in old and old["blocks"] * warps < H100.sm_count * cost.HIDING_WARPS
    assert new["estimate"]["time_us"] < old["estimate"]["time_us"]


def test_latency_hiding_prices_few_warps_per_sm():
    """The same staged tile costs more per SM when the grid leaves each SM one block of 4
    warps than when the SMs hold the warps that hide latency: the term is the saturation of
    `predict`, `HIDING_WARPS` for CUDA-core reductions, `SATURATING_WARPS` otherwise."""
    from tilekit.roll.cost import Work, machine, predict
    m = machine(H100)
    common = dict(flops=1e9, peak=m.peak, smem_traffic=0.0, block_bytes=0.0, traffic=0.0,
                  unique=0.0, threads=128, registers=64, smem_bytes=0, latency_steps=0)
    few = predict(m, Work(blocks=132, hiding_warps=cost.HIDING_WARPS, **common))
    fed = predict(m, Work(blocks=132 * 3, hiding_warps=cost.HIDING_WARPS, **common))
    old = predict(m, Work(blocks=132, **common))
    assert float(few.t_compute) == pytest.approx(3 * float(old.t_compute))
    assert float(fed.t_compute) == pytest.approx(float(old.t_compute))


def test_split_estimates_priced_together_equal_each_priced_alone():
    """The staged split prices its candidate tiles together, one vectorised call per slice
    problem (tiles with the same steps share one); each estimate is the one the tile gets
    alone, whatever else is in the batch."""
    from tilekit.ir.graph import op_analysis
    from tilekit.roll.problem import problem_from_analysis
    module = conv3x3(64, 64, 56, chain=False)
    problem = problem_from_analysis(op_analysis(module, 0), {n: t.dtype for n, t in
                                                             module.tensors.items()})
    m = cost.machine(H100)
    order = [a for a, _ in problem.spatial]
    tiles = [tuple(tuple(t[key][a] for a in axes) for key, axes in (
        ("block", order), ("thread", order), ("step", [a for a, _ in problem.reduction])))
        for t in ({"block": {"n": 1, "f": 16, "h": 2, "w": 56},
                   "thread": {"n": 1, "f": 4, "h": 1, "w": 7},
                   "step": {"c": 4, "kh": 3, "kw": 3}},
                  {"block": {"n": 1, "f": 32, "h": 2, "w": 56},
                   "thread": {"n": 1, "f": 4, "h": 1, "w": 4},
                   "step": {"c": 4, "kh": 3, "kw": 3}},
                  {"block": {"n": 1, "f": 64, "h": 1, "w": 64},
                   "thread": {"n": 1, "f": 4, "h": 1, "w": 4},
                   "step": {"c": 2, "kh": 3, "kw": 3}})]
    for factor in (2, 8, 32):
        together = cost.split_k_estimates(problem, m, tiles, factor, staged=True)
        alone = [cost.split_k_estimate(problem, m, *t, factor, staged=True) for t in tiles]
        assert together == alone
        assert len({est.time_us for est, _ in together}) == len(tiles)


@needs_cxx
def test_split_k_staged_convolution_emulates_the_reference():
    """A staged 3x3 convolution split in 2 slices of channels (3 and 2 steps: a ragged last
    slice), boundary tiles along h, two points per thread, bias and ReLU in the kernel: the
    emulated CUDA equals the reference executor, and the kernel records its scratch and
    counters."""
    from tilekit.ir.model import Kernel

    tile = {"block": {"n": 1, "f": 8, "h": 4, "w": 7}, "thread": {"n": 1, "f": 2, "h": 1, "w": 1},
            "step": {"c": 2, "kh": 3, "kw": 3}, "split_k": 2}
    module = conv3x3(10, 16, 7, tile=tile)
    # bias and ReLU in the same kernel (as tk-weld groups them): the last block's epilogue
    module = replace(module, kernels=(Kernel("k_conv", ("conv", "relu")),))
    result = generate(module, H100)
    (first,) = result.kernels
    assert first.shape == "staged" and first.writes == ("tk_k_conv__splitk", "z")
    assert first.schedule["split_k"] == {"axis": "c", "slices": 2, "steps": 3}
    tiles = 2 * 2
    assert first.grid[0] == tiles * 2 and first.counters == tiles
    # [slice][tile][point][thread]
    assert first.scratch == {"tk_k_conv__splitk": 2 * tiles * 112 * 2}
    assert_emulates_reference(result, module, seed=0)


def test_the_codegen_report_shows_the_slices():
    """tk-codegen --report names a split kernel's reduction slices (the JSON report's
    kernel entry, and the table's last column)."""
    from tilekit.cli.tk_codegen import report_data, report_table
    from tilekit.codegen.module import run_codegen
    from tilekit.ir.model import Kernel

    tile = {"block": {"n": 1, "f": 8, "h": 4, "w": 7}, "thread": {"n": 1, "f": 2, "h": 1, "w": 1},
            "step": {"c": 2, "kh": 3, "kw": 3}, "split_k": 2}
    module = replace(conv3x3(10, 16, 7, tile=tile),
                     kernels=(Kernel("k_conv", ("conv", "relu")),))
    result = run_codegen(module, H100)
    (entry,) = report_data(result)["kernels"]
    assert entry["split_k"] == "2 slices of 3 steps of c"
    _, _, rows = report_table(result)
    assert rows[0][-1].endswith("split_k 2 slices of 3 steps of c")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_split_k_staged_convolution_compiles_for_sm90():
    from tilekit.codegen import compile_module
    tile = {"block": {"n": 1, "f": 8, "h": 4, "w": 7}, "thread": {"n": 1, "f": 1, "h": 1, "w": 1},
            "step": {"c": 4, "kh": 3, "kw": 3}, "split_k": 4}
    report = compile_module(generate(conv3x3(64, 32, 7, chain=False, tile=tile), H100), None,
                            H100)
    assert not report.problems, report.problems
    (k,) = report.module.codegen["kernels"]
    assert k["workspace"] == {"counters": 4 * 2} and k["resources"]["spill_stores"] == 0



def test_every_thread_reads_the_last_slice_flag_after_the_barrier_that_publishes_it(tmp_path):
    """The H100 bug the CPU emulation cannot see (its threads run in order): with the shared
    memory base `__restrict__`, nvcc loaded the flag (written by thread 0 after the tile's
    atomic) for the other threads before the barrier, so only thread 0 of the last block wrote
    its outputs. In the PTX, no shared load of the flag may come before the barrier that
    follows the atomic."""
    import re
    import subprocess

    from tilekit.codegen.nvcc import find_nvcc
    from tilekit.runtime.cuda import unit_source
    from tilekit.ir.payloads import CodegenSection
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    tile = {"block": {"n": 1, "f": 8, "h": 4, "w": 7}, "thread": {"n": 1, "f": 1, "h": 1, "w": 1},
            "step": {"c": 4, "kh": 3, "kw": 3}, "split_k": 4}
    module = generate(conv3x3(64, 32, 7, chain=False, tile=tile), H100).module
    (tmp_path / "unit.cu").write_text(unit_source(CodegenSection.read(module.codegen).kernels))
    helpers = Path(__file__).resolve().parents[2] / "tilekit" / "codegen"
    subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-O3", "-std=c++17", f"-I{helpers}",
                    "-o", "unit.ptx", "unit.cu"], cwd=tmp_path, check=True, capture_output=True)
    ptx = (tmp_path / "unit.ptx").read_text().splitlines()
    flag = re.search(r"st\.shared\.u32\s+\[(\S+)\]", "\n".join(
        ln for ln in ptx[next(i for i, ln in enumerate(ptx) if "atom.global.add" in ln):]))
    assert flag, "the flag's store after the atomic"
    atomic = next(i for i, ln in enumerate(ptx) if "atom.global.add" in ln)
    barrier = next(i for i, ln in enumerate(ptx) if i > atomic and "bar.sync" in ln)
    reads = [i for i, ln in enumerate(ptx) if "ld.shared" in ln and flag.group(1) in ln]
    assert reads and all(i > barrier for i in reads), (barrier, reads)

@needs_cxx
def test_the_rolled_split_emulates_the_reference():
    """End to end: the roll's own pick for a 7x7 3x3 convolution (128 channels, batch 1) is a
    split-K staged tile; with bias and ReLU in its kernel (as tk-weld groups them), codegen's
    kernel emulates the reference executor."""
    from tilekit.ir.model import Kernel
    from tilekit.roll.schedule import roll_module

    module = conv3x3(128, 128, 7)
    rolled = roll_module(module, H100)
    tile = rolled.ops[0].tile
    assert tile["split_k"] > 1 and tile["kernel"]["split_k"]["slices"] == tile["split_k"]
    rolled = replace(rolled, kernels=(Kernel("k_conv", ("conv", "relu")),))
    result = generate(rolled, H100)
    (kernel,) = result.kernels
    assert kernel.grid[0] == tile["blocks"] * tile["split_k"] and kernel.counters == tile["blocks"]
    assert_emulates_reference(result, module, seed=1)



def test_tk_ram_keeps_a_split_k_operator_a_kernel_of_its_own():
    """A persistent body would run a split tile unsplit (its partial sums and per-tile
    counters are a kernel's own): tk-ram leaves it out of every persistent segment, with the
    reason, and codegen keeps its slices."""
    from tilekit.ram import plan_module
    from tilekit.ram.tasks import operators
    from tilekit.roll.schedule import roll_module

    rolled = roll_module(conv3x3(128, 128, 7), H100)
    slices = rolled.ops[0].tile["split_k"]
    assert slices > 1
    ops = operators(rolled, H100)
    assert ops[0].fixed.startswith(f"a split-K tile ({slices} slices")
    program = plan_module(rolled, H100)
    assert all(0 not in seg.operators for seg in program.segments if seg.kind == "persistent")
    planned = replace(rolled, program=program.record())
    conv = next(k for k in generate(planned, H100).kernels if "conv" in k.ops)
    assert conv.schedule["split_k"]["slices"] == slices

def test_split_k_of_a_non_float32_accumulator_is_refused():
    """The scratch buffers are float32: a float64 convolution with `split_k` is refused at
    its tile's path (exit 2), and the roll never splits one."""
    from tilekit.errors import TilekitError
    from tilekit.roll.schedule import roll_module

    tile = {"block": {"n": 1, "f": 8, "h": 4, "w": 7}, "thread": {"n": 1, "f": 1, "h": 1, "w": 1},
            "step": {"c": 2, "kh": 3, "kw": 3}, "split_k": 2}
    module = conv3x3(8, 8, 7, chain=False, tile=tile)
    module = replace(module, tensors={n: replace(t, dtype="float64")
                                      for n, t in module.tensors.items()})
    with pytest.raises(TilekitError, match="float32 partial sums") as info:
        generate(module, H100)
    assert "tile.split_k" in str(info.value)     # where to fix it
    wide = conv3x3(512, 512, 7, chain=False)
    wide = replace(wide, tensors={n: replace(t, dtype="float64")
                                  for n, t in wide.tensors.items()})
    assert "split_k" not in roll_module(wide, H100).ops[0].tile


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_cuda_runtime_zeroes_the_split_counters(monkeypatch):
    """`tk-run --device cuda` against a stand-in CuPy (no GPU here; the kernels compiled for
    real): a split kernel gets its per-tile counters zeroed before every launch (a finished
    launch leaves them at `slices`) and its scratch buffer allocated."""
    import sys
    import types

    from tilekit.runtime import cuda

    launches = []

    class Array:
        def __init__(self, shape, dtype):
            self.data = np.zeros(tuple(np.atleast_1d(shape)), np.dtype(dtype))
            self.shape = self.data.shape

        def set(self, array):
            self.data = np.array(array, dtype=self.data.dtype).reshape(self.data.shape)

        def get(self):
            return self.data.copy()

        def fill(self, value):
            self.data[...] = value

    def function(entry):
        def call(grid, block, args, shared_mem=0):
            counters = args[-1].data if args[-1].data.dtype == np.uint32 else None
            launches.append((entry, grid, None if counters is None else counters.tolist(),
                             [a.data.size for a in args]))
            if counters is not None:
                counters[...] = 2          # every tile's slices done
        return call

    class Device:
        compute_capability = "90"
        id = 0
        attributes = {"MultiProcessorCount": 132, "MaxSharedMemoryPerBlockOptin": 232448}

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            Device=Device, get_current_stream=lambda: types.SimpleNamespace(
                synchronize=lambda: None),
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1,
                                          driverGetVersion=lambda: 13000,
                                          runtimeGetVersion=lambda: 13000)),
        RawModule=lambda **_: types.SimpleNamespace(get_function=function), uint32=np.uint32,
        empty=lambda shape, dtype: Array(shape, dtype), zeros=lambda n, dtype: Array(n, dtype))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    tile = {"block": {"n": 1, "f": 8, "h": 4, "w": 7}, "thread": {"n": 1, "f": 1, "h": 1, "w": 1},
            "step": {"c": 4, "kh": 3, "kw": 3}, "split_k": 2}
    module = generate(conv3x3(8, 16, 7, chain=False, tile=tile), H100).module
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    program = cuda.CudaProgram(module)
    program.run(inputs, {})
    program.run(inputs, {})
    split = [ln for ln in launches if ln[2] is not None]
    assert len(split) == 2 and all(ln[1] == (8, 1, 1) for ln in split)   # 4 tiles x 2 slices
    assert all(ln[2] == [0] * 4 for ln in split)                        # zeroed each launch
    assert split[0][3][0] == 2 * 4 * 224                                 # the scratch
