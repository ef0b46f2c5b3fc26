"""Tensor cores: contractions on `mma.sync`, checked without a GPU.

The generated kernels run in the CPU emulation, whose `ldmatrix`/`mma.sync`/`cp.async` follow
the PTX ISA's documented fragment layouts (host_emul.h), against a float64 reference; a kernel
whose fragment addressing is wrong must fail there; every shape compiles with nvcc for sm_80
and sm_90 without spills; and tk-roll chooses tensor cores exactly when it may (fp16/bf16
always, fp32 only with `--precision tf32`).
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.codegen.emulate import emulate
from tilekit.codegen.mma import UNROLLED_SLICES
from tilekit.hw import load_profile
from tilekit.ir import Module, Op, Tensor
from tilekit.ir.payloads import CodegenSection
from tilekit.roll.schedule import roll_module
from tilekit.tile.text import format_kernel

H100 = load_profile("h100")
RNG = np.random.default_rng(7)
#: Relative L2 error allowed per input type: fp16 inputs are exact in the reference (it gets
#: the same fp16 values) and products accumulate in fp32; bf16 and tf32 round the fp32 inputs
#: (8 and 11 significant bits).
TOLERANCE = {"float16": 1e-5, "bfloat16": 1e-2, "float32": 2e-3}


def gemm(m: int, n: int, k: int, dtype: str, b_kn: bool = True, tile=None) -> Module:
    expr = "c[i,j] += a[i,k] * b[k,j]" if b_kn else "c[i,j] += a[i,k] * b[j,k]"
    tile = tile or {"block": {"i": 64, "j": 64}, "thread": {"i": 4, "j": 8}, "step": {"k": 32}}
    mod = Module(model="gemm", tensors={"a": Tensor((m, k), dtype, "input"),
                                        "b": Tensor((k, n) if b_kn else (n, k), dtype, "input"),
                                        "c": Tensor((m, n), "float32", "output")},
                 ops=(Op("mm", expr, tile=tile),), inputs=("a", "b"), outputs=("c",),
                 stages=({"name": "import"},))
    return mod.with_stage("roll", precision="tf32") if dtype == "float32" else mod


def values(module: Module) -> dict[str, np.ndarray]:
    out = {}
    for name in module.inputs:
        t = module.tensors[name]
        v = RNG.standard_normal(t.shape)
        out[name] = v.astype(t.dtype if t.dtype != "bfloat16" else "float32")
    return out


def rel_err(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def run(module: Module, expected) -> float:
    result = generate(module, H100)
    (k,) = result.kernels
    assert k.shape == "mma", k.schedule
    inputs = values(module)
    got = emulate(result.module, inputs, {})[module.outputs[0]]
    return rel_err(got, expected(inputs))


@pytest.mark.parametrize("m, n, k, dtype, b_kn", [
    (64, 64, 64, "float16", True),        # one block, cp.async both operands
    (100, 72, 200, "float16", True),      # boundary tiles on every axis, partial last step
    (100, 72, 200, "float16", False),     # B stored [n][k]: ldmatrix without .trans
    (70, 90, 37, "float16", True),        # rows not whole 16-byte chunks: no cp.async
    (100, 72, 200, "bfloat16", True),
    (100, 72, 200, "float32", True),      # tf32, chosen explicitly
])
def test_gemm_on_tensor_cores_equals_the_reference(m, n, k, dtype, b_kn):
    module = gemm(m, n, k, dtype, b_kn)

    def expected(v):
        a = v["a"].astype(np.float64)
        b = v["b"].astype(np.float64)
        return a @ (b if b_kn else b.T)
    assert run(module, expected) < TOLERANCE[dtype]


def conv(c: int, f: int, size: int, kernel: int, tile: dict) -> Module:
    """A padded fp16 convolution of `c` to `f` channels on a `size` x `size` image with a
    `kernel` x `kernel` window, the `tile` given."""
    p = kernel // 2
    return Module(model="conv", tensors={
        "x": Tensor((1, c, size, size), "float16", "input"),
        "w": Tensor((f, c, kernel, kernel), "float16", "input"),
        "y": Tensor((1, f, size, size), "float32", "output")},
        ops=(Op("conv", f"y[n,f,h,w] += x[n,c,h+kh-{p},w+kw-{p}] * w[f,c,kh,kw]", pad="0",
                tile=tile),),
        inputs=("x", "w"), outputs=("y",), stages=({"name": "import"},))


def conv_reference(v: dict[str, np.ndarray]) -> np.ndarray:
    """`conv`'s output in float64."""
    f, _, kernel, _ = v["w"].shape
    size = v["x"].shape[-1]
    p = kernel // 2
    xp = np.pad(v["x"].astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    out = np.zeros((1, f, size, size))
    for kh in range(kernel):
        for kw in range(kernel):
            out += np.einsum("nchw,fc->nfhw", xp[:, :, kh:kh + size, kw:kw + size],
                             v["w"][:, :, kh, kw].astype(np.float64))
    return out


def test_convolution_is_an_implicit_gemm():
    """Input gathered through the index maps (halo, zero padding), [k][m] layout."""
    module = conv(32, 64, 14, 3, {"block": {"n": 1, "f": 64, "h": 4, "w": 16},
                                  "thread": {"n": 1, "f": 8, "h": 1, "w": 4},
                                  "step": {"c": 16, "kh": 3, "kw": 3}})
    assert run(module, conv_reference) < TOLERANCE["float16"]


def _conv5x5() -> Module:
    """Inception v1's 5 x 5 branch in fp16: 16 channels x 25 window points in one step of K,
    25 k-slices."""
    return conv(16, 64, 28, 5, {"block": {"n": 1, "f": 64, "h": 2, "w": 32},
                                "thread": {"n": 1, "f": 32, "h": 1, "w": 1},
                                "step": {"c": 16, "kh": 5, "kw": 5}})


def test_a_long_step_unrolls_its_slices_a_few_at_a_time():
    """A step of 25 k-slices is unrolled 8 at a time (`UNROLLED_SLICES`): wholly unrolled,
    nvcc loaded every slice's fragments up front (255 registers, 48 bytes spilled for sm_90).
    The kernel still equals the reference; a step of 2 slices stays wholly unrolled."""
    module = _conv5x5()
    (k,) = generate(module, H100).kernels
    assert f"#pragma unroll {UNROLLED_SLICES}\n" in k.source
    assert f"in unroll[{UNROLLED_SLICES}](0, 400, 16):" in format_kernel(k.program)
    (short,) = generate(gemm(64, 64, 64, "float16"), H100).kernels
    assert "#pragma unroll " not in short.source.replace("#pragma unroll\n", "")
    assert run(module, conv_reference) < TOLERANCE["float16"]


def test_batched_matmul_runs_a_batch_per_block():
    module = Module(model="bmm", tensors={
        "a": Tensor((3, 40, 64), "float16", "input"), "b": Tensor((3, 64, 48), "float16", "input"),
        "c": Tensor((3, 40, 48), "float32", "output")},
        ops=(Op("bmm", "c[z,i,j] += a[z,i,k] * b[z,k,j]",
                tile={"block": {"z": 1, "i": 32, "j": 32}, "thread": {"z": 1, "i": 2, "j": 4},
                      "step": {"k": 32}}),),
        inputs=("a", "b"), outputs=("c",), stages=({"name": "import"},))
    assert run(module, lambda v: v["a"].astype(np.float64) @ v["b"].astype(np.float64)) < 1e-5


def test_a_wrong_fragment_layout_fails_the_emulation():
    """The emulation is strict enough to catch fragment addressing: lanes 8-15 addressing the
    rows of lanes 0-7 (A's rows 8-15 never loaded) must give wrong results."""
    module = gemm(64, 64, 64, "float16")
    result = generate(module, H100)
    section = CodegenSection.read(result.module.codegen)
    (k,) = section.kernels
    broken = k.source.replace("wm0 + i * 16 + lane % 16", "wm0 + i * 16 + lane % 8")
    assert broken != k.source
    bad = replace(result.module, codegen=replace(section, kernels=(replace(k, source=broken),))
                  .record())
    inputs = values(module)
    want = inputs["a"].astype(np.float64) @ inputs["b"].astype(np.float64)
    assert rel_err(emulate(bad, inputs, {})["c"], want) > 0.1
    assert rel_err(emulate(result.module, inputs, {})["c"], want) < 1e-5


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_core_kernels_compile_without_spills(arch):
    from tilekit.codegen import compile_module
    for dtype in ("float16", "bfloat16", "float32"):
        result = generate(gemm(1024, 1024, 1024, dtype,
                               tile={"block": {"i": 128, "j": 128}, "thread": {"i": 8, "j": 16},
                                     "step": {"k": 32}}), H100)
        report = compile_module(result, arch, H100)
        assert not report.problems, report.problems
        res = report.module.codegen["kernels"][0]["resources"]
        assert res["spill_stores"] == 0 and res["registers"] <= 255
    report = compile_module(generate(_conv5x5(), H100), arch, H100)
    assert not report.problems, report.problems
    res = report.module.codegen["kernels"][0]["resources"]
    assert res["spill_stores"] == 0 and res["registers"] < 128, res


def test_roll_uses_tensor_cores_when_it_may():
    fp16 = roll_module(gemm(1024, 1024, 1024, "float16", tile=None), H100)
    assert fp16.ops[0].tile["kernel"]["shape"] in ("mma", "wgmma")   # wgmma on sm_90
    fp32 = Module(**{**gemm(1024, 1024, 1024, "float32").__dict__,
                     "stages": ({"name": "import"},)})
    assert roll_module(fp32, H100).ops[0].tile["kernel"]["shape"] != "mma"   # never silently
    tf32 = roll_module(fp32, H100, precision="tf32")
    assert tf32.ops[0].tile["kernel"]["shape"] == "mma"
    assert tf32.stages[-1]["options"]["precision"] == "tf32"
    assert generate(tf32, H100).kernels[0].shape == "mma"      # codegen reads the precision
    # The cost model prices tensor cores: the fp16 GEMM is estimated several times faster.
    assert fp16.ops[0].tile["estimate"]["time_us"] * 3 < roll_module(
        fp32, H100).ops[0].tile["estimate"]["time_us"]
