"""The cost model and the code generator agree on every kernel they both describe.

tk-roll records, per op, the kernel its tile becomes (`tile.kernel`, from the shared decision
in tilekit.schedule.shape) and prices that kernel; tk-codegen generates from the same decision.
Over the whole 119-op workload suite (H100 and A100) and, in tests/e2e, every model's kernels,
the shape, the threads per block, the shared memory and what is staged must be the same on
both sides. The register estimate is compared with ptxas' count where nvcc is installed
(`test_register_estimate_against_ptxas`, which prints the spread).
"""

from __future__ import annotations

import functools
import shutil

import pytest
from scope import on

from tilekit.codegen import generate
from tilekit.hw import load_profile
from tilekit.roll.schedule import roll_module
from tilekit.roll.workloads import load_workloads


#: One worker runs this file: the rolled and generated suite is then made once per profile.
pytestmark = pytest.mark.xdist_group("shape-agreement")


@functools.lru_cache(maxsize=None)
def rolled_suite(hw: str):
    profile = load_profile(hw)
    out = []
    for w in load_workloads():
        module = roll_module(w.module(), profile)
        out.append((w.name, module, generate(module, profile)))
    return profile, out


def agreement_problems(module, result) -> list[str]:
    """Where the roll's `tile.kernel` and the generated kernel differ (one line each)."""
    problems = []
    by_op = {op.name: op for op in module.ops}
    for g in result.kernels:
        if len(g.ops) != 1 or g.shape.startswith("opaque"):
            continue
        op = by_op[g.ops[0]]
        want = op.tile["kernel"]
        got = {"shape": g.shape, "threads": g.block[0], "smem_bytes": g.smem_planned}
        if g.shape == "staged":
            got["staged"] = [{"tensor": b["tensor"], "box": b["box"]}
                             for b in g.schedule["smem_buffers"]]
            got["step"] = list(g.schedule["step"].values())
            if "split_k" in g.schedule:
                got["split_k"] = g.schedule["split_k"]
        if g.shape in ("mma", "wgmma", "simt"):
            got[g.shape] = g.schedule[g.shape]
        if g.shape == "default" and g.schedule.get("lanes", 1) > 1:
            got["lanes"] = g.schedule["lanes"]
        if want != got:
            problems.append(f"{op.name}: roll says {want}, codegen made {got}")
        if want["shape"] == "staged" and op.tile["smem_bytes"] != g.smem_planned:
            problems.append(f"{op.name}: tile.smem_bytes {op.tile['smem_bytes']} but the "
                            f"kernel plans {g.smem_planned}")
    return problems


@pytest.mark.parametrize("hw", ["h100", "a100"])
def test_roll_and_codegen_agree_on_the_suite(hw):
    _, suite = rolled_suite(hw)
    problems = [p for _, module, result in suite for p in agreement_problems(module, result)]
    assert not problems, "\n".join(problems[:20])
    shapes = {g.shape for _, _, r in suite for g in r.kernels}
    # the suite exercises every decision (its fp16 GEMMs run on tensor cores: wgmma on H100)
    assert {"staged", "tiled", "default"} <= shapes
    assert ("wgmma" if hw == "h100" else "mma") in shapes


def test_float16_is_staged_in_two_bytes():
    """A 1024x1024x512 fp16 reduction with reuse rolled for H100 (a product of three reads,
    so CUDA cores) plans the shared memory its tile says: fp16 staged as half, not float."""
    from tilekit.ir import Module, Op, Tensor
    from tilekit.schedule.shape import SPLIT_FLAG_BYTES
    profile = load_profile("h100")
    m = Module(model="mm16", tensors={"a": Tensor((1024, 512), "float16", "input"),
                                      "b": Tensor((512, 1024), "float16", "input"),
                                      "c": Tensor((1024, 1024), "float16", "output")},
               ops=(Op("mm", "c[i,j] += a[i,k] * b[k,j] * a[i,k]"),), inputs=("a", "b"),
               outputs=("c",), stages=({"name": "import"},))
    rolled = roll_module(m, profile)
    result = generate(rolled, profile)
    (g,) = result.kernels
    tile = rolled.ops[0].tile
    assert g.shape == tile["kernel"]["shape"] == "staged"
    assert g.smem_planned == tile["smem_bytes"] == tile["kernel"]["smem_bytes"]
    boxes = {b["tensor"]: b["box"] for b in g.schedule["smem_buffers"]}
    flag = SPLIT_FLAG_BYTES if "split_k" in g.schedule else 0    # a split-K block's flag
    assert g.smem_planned == sum(-(-2 * bx[0] * bx[1] // 16) * 16 for bx in boxes.values()) \
        + flag
    assert "__half s_a_0[" in g.body or "__half* s_a_0" in g.body


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_register_estimate_against_ptxas(capsys):
    """The roll's register estimate against ptxas on the suite's staged, tiled, mma and simt
    kernels: the spread is printed; a miss of more than 2x plus 32 registers is a bug in the
    model.
    The 119 kernels compile as one translation unit (their entries are unique): one nvcc
    call instead of 119, the same ptxas figures per entry. The default suite compiles every
    fourth kernel (all with TILEKIT_ALL_ARCHS=1)."""
    from tilekit.codegen.module import unit_source
    from tilekit.codegen.nvcc import compile_unit
    profile, suite = rolled_suite("h100")
    kernels = [(module, g) for _, module, result in suite for g in result.kernels
               if g.shape in ("staged", "tiled", "mma", "simt")
               ][::1 if on("TILEKIT_ALL_ARCHS") else 4]
    resources = compile_unit(unit_source([g for _, g in kernels]), "sm_90").resources
    ratios, misses = [], []
    for module, g in kernels:
        want = module.op(g.ops[0]).tile["regs"]
        got = resources[g.entry].registers
        ratios.append(got / want)
        if got > 2 * want + 32 or want > 2 * got + 32:
            misses.append(f"{module.model}: roll {want}, ptxas {got}")
    ratios.sort()
    print(f"\nptxas / roll registers over {len(ratios)} kernels: min {ratios[0]:.2f}, "
          f"median {ratios[len(ratios) // 2]:.2f}, max {ratios[-1]:.2f}")
    assert not misses, "\n".join(misses)
