"""Generated CUDA run on the CPU (tilekit.codegen.emulate) against the reference executor.

Every fixture in tests/data/codegen, in three variants: as written (rolled tiles, kernel
groups), without tiles (the default schedules) and with one kernel per op; a variant that is
the same module as an earlier one of its fixture runs once. This is the evidence, without a
GPU, that index maps, padding, boundary tiles, shared-memory staging, barriers, lane
reductions and fused regions compute what tilekit.expr says.
"""

from __future__ import annotations

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.codegen.emulate import emulate, find_cxx
from tilekit.runtime.cpu import run_module

from codegen_support import (VARIANTS, big_tile_matmul, distinct_variants, fixture,
                             random_values)

pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler for the emulation")


def assert_close(name, got, want):
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("name, variant", [pytest.param(n, v, id=f"{n}-{v}")
                                           for n, v in distinct_variants()])
def test_emulated_kernels_match_reference(name, variant):
    module = VARIANTS[variant](fixture(name))
    inputs, weights = random_values(module)
    result = generate(module)
    got = emulate(result.module, inputs, weights)
    want = run_module(module, inputs, weights)
    for out in module.outputs:
        assert got[out].shape == want[out].shape
        assert_close(out, got[out], want[out])


def test_emulation_sees_unwritten_outputs():
    """The emulator fills written tensors with NaN first: a kernel that skipped points fails."""
    from dataclasses import replace
    module = fixture("matmul_aligned")
    inputs, weights = random_values(module)
    result = generate(module)
    record = dict(result.module.codegen["kernels"][0])
    record["grid"] = [1, 1, 1]  # launch one block of the four
    broken = replace(result.module, codegen={**result.module.codegen, "kernels": [record]})
    got = emulate(broken, inputs, weights)
    assert np.isnan(got["c"]).any()


def test_a_relative_cache_folder_builds(tmp_path, monkeypatch):
    """TILEKIT_CACHE given relative to the working folder: the compilers run in build folders,
    where a relative path would name a folder inside each (the precompiled header, the
    runtime object); the cache is taken from where the command runs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILEKIT_CACHE", "relative-cache")
    module = fixture("matmul_aligned")
    inputs, weights = random_values(module)
    got = emulate(generate(module).module, inputs, weights)
    assert_close("c", got["c"], run_module(module, inputs, weights)["c"])
    assert (tmp_path / "relative-cache" / "emul").is_dir()


def test_a_kernel_the_host_compiler_refuses_is_kept_with_the_command_that_reproduces_it():
    """The build's error names the kept folder and the command; run there, the command fails
    the same way (the precompiled host_emul.h it names included)."""
    import shlex
    import subprocess
    from dataclasses import replace
    from pathlib import Path

    from tilekit.errors import TilekitError

    result = generate(fixture("matmul_aligned"))
    record = dict(result.module.codegen["kernels"][0])
    record["source"] += "\nstatic_assert(TK_EMUL_DYNAMIC_SMEM < 0, \"refused on purpose\");\n"
    broken = replace(result.module, codegen={**result.module.codegen, "kernels": [record]})
    with pytest.raises(TilekitError) as info:
        emulate(broken, *random_values(fixture("matmul_aligned")))
    error = info.value
    assert "host compile of the emulation failed" in error.what
    assert "refused on purpose" in error.what
    kept = Path(error.where)
    assert kept.name.startswith("failed-") and (kept / "main.cpp").is_file()
    command = error.hint.split(" && ", 1)[1]
    proc = subprocess.run(shlex.split(command), cwd=kept, capture_output=True, text=True)
    assert proc.returncode != 0 and "refused on purpose" in proc.stderr


def without_barrier(kernel, nth: int) -> str:
    """The kernel's source with the `nth` barrier of its tile program (in program order)
    removed and the program printed again."""
    from dataclasses import replace
    from tilekit.tile import cuda
    from tilekit.tile.nodes import Barrier, Seq, transform, walk

    barriers = [s for s in walk(kernel.program.body) if isinstance(s, Barrier)]
    target = barriers[nth]

    def drop(s):
        if isinstance(s, Seq):
            return replace(s, body=tuple(x for x in s.body if x is not target))
        return s
    broken = replace(kernel.program, body=transform(kernel.program.body, drop))
    assert broken != kernel.program
    return kernel.source[:len(kernel.source) - len(kernel.body)] + cuda.kernel_text(broken)


@pytest.mark.parametrize("name,nth", [
    ("matmul_aligned", 1),      # after staging
    ("matmul_aligned", 0),      # before restaging
    ("softmax", 1),             # between fused stages (it ends stage 0's last pass)
    ("conv_chain", 0),
])
def test_emulation_catches_a_missing_barrier(name, nth):
    """Mutation check of the evidence itself: drop one barrier of the tile program and the
    emulated result must be wrong (threads run in a pseudo-random order between barriers)."""
    from dataclasses import replace
    module = fixture(name)
    inputs, weights = random_values(module)
    result = generate(module)
    record = dict(result.module.codegen["kernels"][0])
    record["source"] = without_barrier(result.kernels[0], nth)
    broken = replace(result.module, codegen={**result.module.codegen, "kernels": [record]})
    got = emulate(broken, inputs, weights)
    want = run_module(module, inputs, weights)
    out = module.outputs[0]
    assert not np.allclose(got[out], want[out], rtol=2e-5, atol=2e-5)


def test_fused_group_stores_an_intermediate_that_leaves_it():
    """The row sums of a fused softmax are also a module output: stage 1 stores them."""
    from dataclasses import replace
    module = fixture("softmax")
    module = replace(module, outputs=("y", "s"),
                     tensors={**module.tensors, "s": replace(module.tensors["s"], role="output")})
    inputs, weights = random_values(module)
    result = generate(module)
    assert result.kernels[0].shape == "fused" and result.kernels[0].writes == ("s", "y")
    got = emulate(result.module, inputs, weights)
    want = run_module(module, inputs, weights)
    for out in ("y", "s"):
        assert_close(out, got[out], want[out])


@pytest.mark.parametrize("name", ["conv_bias_relu", "softmax", "misc", "gather", "conv_chain"])
def test_64_bit_indices(name, monkeypatch):
    """Tensors of 2^31 elements or more index in `long long`: force that mode on small
    fixtures (every shape) and check the results and that nvcc accepts the code."""
    from tilekit.codegen import compile_module, kernel
    from tilekit.codegen.nvcc import find_nvcc
    monkeypatch.setattr(kernel, "INT32_LIMIT", 1)
    module = fixture(name)
    inputs, weights = random_values(module)
    result = generate(module)
    assert all("long long a_" in k.source or "long long p" in k.source
               for k in result.kernels if not k.shape.startswith("opaque"))
    got = emulate(result.module, inputs, weights)
    want = run_module(module, inputs, weights)
    for out in module.outputs:
        assert_close(out, got[out], want[out])
    if find_nvcc():
        assert not compile_module(result, "sm_90").problems


def test_dynamic_shared_memory_kernel():
    """Buffers over 48 KB (allowed by the H100 profile) are carved from dynamic shared memory."""
    from tilekit.hw import load_profile
    module = big_tile_matmul(160, 192, 256)
    result = generate(module, load_profile("h100"))
    (k,) = result.kernels
    assert k.smem_bytes == 65536 and "TK_DYNAMIC_SMEM(tk_smem);" in k.source
    rng = np.random.default_rng(3)
    a = rng.standard_normal((160, 192)).astype(np.float32)
    b = rng.standard_normal((192, 256)).astype(np.float32)
    got = emulate(result.module, {"a": a, "b": b}, {})
    np.testing.assert_allclose(got["c"], a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("j", [3, 48, 96])
def test_fused_block_of_partial_warps_matches_reference(j):
    """A kernel tile whose thread count is not a multiple of 32: whole warps, right values."""
    from dataclasses import replace
    module = fixture("softmax")
    kernel = replace(module.kernels[0], tile={"block": {"i": 1, "j": j},
                                              "thread": {"i": 1, "j": 1}})
    module = replace(module, kernels=(kernel,))
    inputs, weights = random_values(module)
    got = emulate(generate(module).module, inputs, weights)
    assert_close("y", got["y"], run_module(module, inputs, weights)["y"])
