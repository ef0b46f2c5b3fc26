"""nvcc compiles every generated kernel; ptxas' report is parsed into `resources`.

`IR_FILES` lists the modules compiled for sm_90 (and sm_80 with TILEKIT_ALL_ARCHS=1): the
codegen fixtures, plus any files named in $TILEKIT_CODEGEN_IR (os.pathsep-separated), so that
imported and rolled models can be added without editing this file. One nvcc call per module
and arch (all its kernels in one translation unit), cached by content in $TILEKIT_CACHE.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tilekit.codegen import compile_module, generate
from tilekit.codegen.nvcc import CompileError, compile_unit, find_nvcc, parse_ptxas
from tilekit.ir.codec import read_module
from tilekit.errors import TilekitError

from codegen_support import DATA, without_tiles
from scope import on

IR_FILES = sorted(str(p) for p in DATA.glob("*.yaml")) + [
    p for p in os.environ.get("TILEKIT_CODEGEN_IR", "").split(os.pathsep) if p]
#: The fixtures are generated once, for the default arch (generate() is not given one), so
#: sm_80 only asks ptxas about the same source again: twelve nvcc calls, where the default
#: suite's other sm_80 compiles already build generated kernels for it (the BERT layer rolled
#: for the A100, tests/e2e/test_pipelines.py; the SIMT and tensor-core GEMMs,
#: test_codegen_simt.py and test_codegen_mma.py; tk-ram's programs for the A100,
#: test_ram_codegen.py).
ARCHS = ("sm_80", "sm_90") if on("TILEKIT_ALL_ARCHS") else ("sm_90",)

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")


PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'tk_a' for 'sm_90'
ptxas info    : Function properties for tk_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 6144 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'tk_b' for 'sm_90'
ptxas info    : Function properties for tk_b
    24 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas():
    res = parse_ptxas(PTXAS_LOG)
    assert res["tk_a"].registers == 40 and res["tk_a"].smem_static == 6144
    assert res["tk_a"].spills == 0
    assert res["tk_b"].registers == 255 and res["tk_b"].smem_static == 0
    assert (res["tk_b"].stack, res["tk_b"].spill_stores, res["tk_b"].spill_loads) == (24, 24, 16)


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", IR_FILES, ids=lambda p: Path(p).stem)
def test_every_kernel_compiles(path, arch):
    module = read_module(path)
    variants = [module] if arch == "sm_80" else [module, without_tiles(module)]
    for variant in variants:
        result = generate(variant)
        report = compile_module(result, arch)
        records = report.module.codegen["kernels"]
        assert len(records) == len(result.kernels)
        for record in records:
            res = record["resources"]
            assert res["registers"] > 0, record["entry"]
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, record["entry"]
        assert not report.problems, report.problems
        assert report.module.codegen["compiled"]["arch"] == arch


@needs_nvcc
def test_static_shared_memory_matches_the_plan():
    """ptxas' static shared memory is what the staged kernel planned (both buffers)."""
    module = read_module(str(DATA / "matmul_aligned.yaml"))
    result = generate(module)
    report = compile_module(result, "sm_90")
    record = report.module.codegen["kernels"][0]
    assert record["resources"]["smem_static"] == result.kernels[0].smem_planned == 6144


@needs_nvcc
def test_compile_error_names_the_command(tmp_path):
    with pytest.raises(CompileError) as info:
        compile_unit('#include "runtime.cuh"\nextern "C" __global__ void k() { undefined(); }\n',
                     "sm_90")
    message = info.value.message()
    assert "reproduce with: cd " in message and "nvcc -cubin -arch=sm_90" in message
    folder = message.split("reproduce with: cd ")[1].split(" && ")[0]
    assert (Path(folder) / "unit.cu").exists()


@needs_nvcc
def test_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path))
    source = '#include "runtime.cuh"\nextern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    first = compile_unit(source, "sm_80")
    second = compile_unit(source, "sm_80")
    assert not first.cached and second.cached
    assert first.resources == second.resources and first.cubin.exists()


def test_bad_arch_is_bad_input():
    if find_nvcc() is None:
        pytest.skip("nvcc not on PATH")
    with pytest.raises(TilekitError, match="not an NVIDIA arch"):
        compile_unit("", "compute_90")
