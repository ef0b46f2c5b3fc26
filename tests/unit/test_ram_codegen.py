"""Persistent kernels of tk-ram programs: compiled for sm_80 and sm_90, emulated on the CPU
with every block resident (three schedules), the broken protocols the emulation must catch,
and the co-residency refusals (ptxas resources at codegen, the driver's occupancy at launch,
against fakes)."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from tilekit import pipeline
from tilekit.codegen.emulate import emulate, find_cxx
from tilekit.codegen.module import run_codegen
from tilekit.codegen.program import coresident_problems
from tilekit.errors import TilekitError
from tilekit.hw import load_profile
from tilekit.ir.payloads import CodegenSection
from tilekit.runtime.cpu import run_module
from tilekit.runtime.occupancy import FixedOccupancy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import ram_models  # noqa: E402

pytestmark = pytest.mark.xdist_group("ram")
needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")


@pytest.fixture(scope="session")
def programs(tmp_path_factory):
    out = {}
    for name in ("resnext_block", "nasnet_cell"):
        folder = tmp_path_factory.mktemp(name)
        path = folder / f"{name}.onnx"
        onnx.save(ram_models.ALL[name](), str(path))
        out[name] = pipeline.compile(path, passes=("roll", "ram", "codegen"), hw="h100",
                                     top_k=4, ir_path=folder / f"{name}.tk.yaml")
    return out


def _inputs(module, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
            for n in module.inputs}


def _program_record(module):
    """The persistent program kernel with the most operators (the one whose blocks wait)."""
    kernels = CodegenSection.read(module.codegen).kernels
    return max((i for i, k in enumerate(kernels) if k.coresident),
               key=lambda i: len(kernels[i].schedule.get("operators", ())))


def _with_source(module, index, old, new):
    section = dict(module.codegen)
    kernels = [dict(k) for k in section["kernels"]]
    assert old in kernels[index]["source"]
    kernels[index]["source"] = kernels[index]["source"].replace(old, new)
    section["kernels"] = kernels
    return replace(module, codegen=section)


def test_a_program_is_one_coresident_kernel(programs):
    module = programs["resnext_block"].module
    kernels = CodegenSection.read(module.codegen).kernels
    assert len(kernels) == 1  # the whole block: one persistent kernel instead of 53 launches
    k = kernels[0]
    assert k.coresident and k.counters == len(module.kernels) and k.shape == "program"
    assert k.grid[0] == read_veus(module)
    assert all(kn.launch["entries"] == [k.entry] for kn in module.kernels)


def read_veus(module):
    from tilekit.ir.program import read_program
    return read_program(module).segments[0].veus


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("hw, arch", [("h100", "sm_90"), ("a100", "sm_80")])
def test_programs_compile_strict(hw, arch, tmp_path):
    path = tmp_path / "nasnet_cell.onnx"
    onnx.save(ram_models.nasnet_cell(), str(path))
    compiled = pipeline.compile(path, passes=("roll", "ram"), hw=hw, top_k=4,
                                ir_path=tmp_path / "m.tk.yaml")
    run = run_codegen(compiled.module, load_profile(hw), arch, compile=True)
    assert run.problems == ()
    k = CodegenSection.read(run.module.codegen).kernels[_program_record(run.module)]
    assert k.resources["spill_stores"] == 0 and k.resources["registers"] > 0


@needs_cxx
@pytest.mark.parametrize("name", ["resnext_block", "nasnet_cell"])
def test_programs_pass_emulation(programs, name):
    compiled = programs[name]
    inputs = _inputs(compiled.module)
    got = emulate(compiled.module, inputs, compiled.weights)
    want = run_module(compiled.module, inputs, compiled.weights)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


WAIT = ("          while (tk_ld_acquire(&tk_counters[op]) < ((unsigned)(first))) {\n"
        "            tk_spin();\n"
        "          }\n")


@needs_cxx
def test_a_dropped_counter_wait_fails_the_emulation(programs):
    compiled = programs["nasnet_cell"]
    module = _with_source(compiled.module, _program_record(compiled.module), WAIT, "")
    inputs = _inputs(module)
    want = run_module(module, inputs, compiled.weights)
    try:
        got = emulate(module, inputs, compiled.weights)
    except RuntimeError as exc:  # the schedules disagree: blocks race
        assert "differs between schedules" in str(exc)
        return
    assert not all(np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5, equal_nan=False)
                   for k in want)


@needs_cxx
def test_a_dropped_fence_fails_the_emulation(programs):
    compiled = programs["resnext_block"]
    module = _with_source(compiled.module, _program_record(compiled.module),
                          "      __threadfence();\n", "")
    with pytest.raises(RuntimeError, match=r"exit 6"):
        emulate(module, _inputs(module), compiled.weights)


def test_codegen_refuses_a_program_that_ptxas_resources_make_too_large():
    h100 = load_profile("h100")
    assert coresident_problems("program_0", 128, 64, 4096, 1056, h100) == []
    problems = coresident_problems("program_0", 128, 128, 4096, 1056, h100)
    assert problems and "limited by registers" in problems[0] and "1056" in problems[0]


class FakeBuffer:
    def __init__(self, n):
        self.values = [7] * n  # garbage from an earlier run

    def fill(self, value):
        self.values = [value] * len(self.values)


class FakeCupy:
    @staticmethod
    def zeros(n, dtype):
        return FakeBuffer(n)


def test_runtime_checks_occupancy_before_a_program_launch(programs):
    from tilekit.runtime.cuda import coresident_launch

    module = programs["resnext_block"].module
    index = _program_record(module)
    record = CodegenSection.read(module.codegen).kernels[index]
    calls = []

    def function(grid, block, args, *, shared_mem=0):
        # as a cupy.RawKernel of the module loaded for cooperative launches: no flag per call
        calls.append((grid, block, list(args[-1].values)))

    sms = -(-record.grid[0] // 2)
    with pytest.raises(TilekitError, match="not launched") as err:
        coresident_launch(record, index, function, FakeCupy, FixedOccupancy(1, sms))
    assert err.value.where == f"codegen.kernels[{index}]"
    assert calls == []  # refused, never launched
    launch = coresident_launch(record, index, function, FakeCupy, FixedOccupancy(2, sms))
    launch.counters.values = [5] * record.counters  # left by a previous run
    launch({t: object() for t in record.args})
    assert calls == [(record.grid, record.block, [0] * record.counters)]


def test_a_program_packs_a_simt_gemm_on_blocks_of_its_own_threads(tmp_path):
    """A BERT-base encoder layer (128 tokens, hidden 768) as `tk-roll --top-k 4 | tk-weld |
    tk-ram | tk-codegen` for the H100: an attention product rolled to the SIMT GEMM (128
    threads, barriers) shares a persistent segment with 256-thread bodies. tk-ram used to
    read the SIMT shape as barrier-free and size the block at 256, which codegen refused;
    now the segment's blocks are the GEMM's 128 threads and the program generates."""
    from models import onnx_models

    path = tmp_path / "bert.onnx"
    onnx.save(onnx_models.bert_encoder_layer(batch=1, seq=128, hidden=768, heads=12,
                                             ffn=3072), str(path))
    module = pipeline.compile(path, passes=("roll", "weld", "ram", "codegen"), hw="h100",
                              top_k=4, ir_path=tmp_path / "bert.tk.yaml").module
    simt_ops = {op.name for op in module.ops
                if ((op.tile or {}).get("kernel") or {}).get("shape") == "simt"}
    simt_groups = {k.name for k in module.kernels if simt_ops & set(k.ops)}
    programs = [k for k in CodegenSection.read(module.codegen).kernels if k.coresident
                and simt_groups & set(k.schedule.get("operators", ()))]
    assert simt_groups and programs
    assert all(k.block[0] == 128 for k in programs)
