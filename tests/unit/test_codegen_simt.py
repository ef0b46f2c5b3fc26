"""fp32 contractions on CUDA cores as the SIMT GEMM (`simt`), checked without a GPU.

The generated kernels run in the CPU emulation (host_emul.h: threads as fibers, real
barriers; every block of these small problems) against a float64 reference: square, ragged
M/N/K, batched and transposed operands, a fused chain, the scalar fallback, convolutions as
implicit GEMMs (padding, strides, dilation, 1-D, a batch in M, ragged tiles and channels,
steps of whole windows, a fused bias and ReLU) and a MatMul of 3-D activations; a missing
barrier fails; the tile interpreter counts fully
coalesced global accesses and conflict-free shared ones for the aligned kernels; a wrong
fragment index fails; nvcc builds them for sm_80 and sm_90 without spills or local memory
(`TILEKIT_ALL_ARCHS=1`: more tiles, and every simt kernel of the rolled suite emulated);
tk-roll prices and picks the shape.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from codegen_support import unpadded
from scope import on

from tilekit.codegen import generate
from tilekit.codegen.emulate import emulate
from tilekit.codegen.report import _memory, program_report
from tilekit.hw import load_profile
from tilekit.ir import Kernel, Module, Op, Tensor
from tilekit.ir.payloads import CodegenSection, Tile
from tilekit.roll.schedule import roll_module
from tilekit.schedule.shape import analysis_facts, decide
from tilekit.schedule.simt import simt_plan
from tilekit.tile.interp import interpret

H100 = load_profile("h100")
RNG = np.random.default_rng(11)
ALL = on("TILEKIT_ALL_ARCHS")
#: fp32 products summed in fp32 against float64: a few ulps times sqrt(K)
TOLERANCE = 1e-5


def tile(bm=64, bn=128, tm=8, tn=8, bk=8, batch=False) -> dict:
    out = {"block": {"i": bm, "j": bn}, "thread": {"i": tm, "j": tn}, "step": {"k": bk}}
    if batch:
        for key in ("block", "thread"):
            out[key] = {"z": 1, **out[key]}
    return out


def gemm(m: int, n: int, k: int, t: dict | None = None, a_mk: bool = True,
         b_kn: bool = True, batch: int = 0, chain: bool = False) -> Module:
    z = "z," if batch else ""
    zs = (batch,) if batch else ()
    a = f"a[{z}i,k]" if a_mk else f"a[{z}k,i]"
    b = f"b[{z}k,j]" if b_kn else f"b[{z}j,k]"
    tensors = {"a": Tensor(zs + ((m, k) if a_mk else (k, m)), "float32", "input"),
               "b": Tensor(zs + ((k, n) if b_kn else (n, k)), "float32", "input"),
               "c": Tensor(zs + (m, n), "float32", "output")}
    ops = [Op("mm", f"c[{z}i,j] += {a} * {b}", tile=t or tile(batch=bool(batch)))]
    inputs, outputs = ("a", "b"), ("c",)
    if chain:   # bias + ReLU in the epilogue
        tensors["c"] = Tensor(zs + (m, n), "float32", "intermediate")
        tensors["bias"] = Tensor((n,), "float32", "input")
        tensors["y"] = Tensor(zs + (m, n), "float32", "output")
        ops.append(Op("act", f"y[{z}i,j] = max(c[{z}i,j] + bias[j], 0.0)"))
        inputs, outputs = ("a", "b", "bias"), ("y",)
    kernels = (Kernel("k0", ("mm", "act")),) if chain else ()
    return Module(model="simt", tensors=tensors, ops=tuple(ops), inputs=inputs,
                  outputs=outputs, kernels=kernels, stages=({"name": "import"},))


def values(module: Module) -> dict[str, np.ndarray]:
    return {n: RNG.standard_normal(module.tensors[n].shape).astype(np.float32)
            for n in module.inputs}


def reference(module: Module, v: dict, a_mk: bool, b_kn: bool) -> np.ndarray:
    a = v["a"].astype(np.float64)
    b = v["b"].astype(np.float64)
    a = a if a_mk else np.swapaxes(a, -1, -2)
    b = b if b_kn else np.swapaxes(b, -1, -2)
    out = a @ b
    if "bias" in v:
        out = np.maximum(out + v["bias"].astype(np.float64), 0.0)
    return out


def rel_err(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def simt_kernel(module: Module):
    result = generate(module, H100)
    (g,) = result.kernels
    assert g.shape == "simt", (g.shape, g.schedule)
    return result, g


CASES = {
    "square": dict(m=128, n=128, k=64, t=tile(128, 128, 8, 8, 8)),
    "ragged": dict(m=100, n=72, k=44, t=tile(64, 64, 4, 4, 16)),         # 16-byte loads kept
    "a_transposed": dict(m=96, n=160, k=40, t=tile(64, 128, 8, 8, 8), a_mk=False),
    "b_transposed": dict(m=96, n=160, k=40, t=tile(64, 128, 8, 8, 8), b_kn=False),
    "both_transposed_ragged": dict(m=70, n=90, k=37, t=tile(64, 64, 8, 4, 16), a_mk=False,
                                   b_kn=False),                      # scalar fallback
    "batched": dict(m=40, n=48, k=24, t=tile(32, 32, 4, 4, 8, batch=True), batch=3),
    "chain": dict(m=64, n=96, k=32, t=tile(64, 64, 8, 8, 32), chain=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simt_gemm_equals_the_reference(case):
    kw = dict(CASES[case])
    a_mk, b_kn = kw.get("a_mk", True), kw.get("b_kn", True)
    module = gemm(**kw)
    result, g = simt_kernel(module)
    v = values(module)
    got = emulate(result.module, v, {})[module.outputs[0]]
    assert rel_err(got, reference(module, v, a_mk, b_kn)) < TOLERANCE


def test_the_scalar_fallback_guards_rows_that_are_not_16_byte_units():
    module = gemm(**CASES["both_transposed_ragged"])
    _, g = simt_kernel(module)
    assert g.schedule["simt"]["vector"] == []
    assert "float4*>(&t_" not in g.source.replace("(&t_c", "")    # no 16-byte global loads
    _, aligned = simt_kernel(gemm(**CASES["ragged"]))
    assert aligned.schedule["simt"]["vector"] == ["a", "b"]


@pytest.mark.parametrize("case", ["square", "a_transposed", "b_transposed", "batched",
                                  "chain"])
def test_the_counters_show_coalesced_and_conflict_free_accesses(case):
    """Aligned kernels (rows whole 16-byte units): every global request reads whole
    sectors, every shared request takes the fewest wavefronts (first and last block)."""
    _, g = simt_kernel(gemm(**CASES[case]))
    report = program_report(g.program)
    assert report["bank_conflict_degree"] == 1.0, report.get("worst")
    if case != "chain":
        assert report["coalescing"] == 1.0, report.get("worst")
        return
    # the chain's own reads (the bias, point by point) are its own: the GEMM's are whole
    counters = interpret(g.program, _memory(g.program), [0, g.program.grid - 1])
    for site in counters.sites.values():
        if site.scope == "global" and site.buffer != "t_bias":
            assert site.sectors == site.ideal, site


def test_unpadded_transposed_buffers_would_conflict():
    """The 4-float row padding of a transposed operand is what keeps its stores apart."""
    _, g = simt_kernel(gemm(**CASES["square"]))
    plain = unpadded(g.program)
    sites = interpret(plain, _memory(plain), [0]).sites.values()
    stores = [s for s in sites if s.buffer == "s_a" and s.kind == "store"]
    assert len(stores) == 8          # four scalar stores per chunk, before and in the loop
    assert all(s.wavefronts == 2 * s.ideal_wavefronts for s in stores)   # 2-way conflicts


def test_a_wrong_fragment_index_fails_the_emulation():
    """B's second sub-tile read 64 columns too early (the first one twice) gives wrong
    numbers: the emulation is strict enough to catch fragment indexing."""
    module = gemm(**CASES["square"])
    result, g = simt_kernel(module)
    section = CodegenSection.read(result.module.codegen)
    (k,) = section.kernels
    good = "128 * kk + t_n * 4 + 64]"
    assert good in k.source
    broken = k.source.replace(good, "128 * kk + t_n * 4]")
    bad = replace(result.module, codegen=replace(section, kernels=(replace(k, source=broken),))
                  .record())
    v = values(module)
    want = reference(module, v, True, True)
    assert rel_err(emulate(bad, v, {})["c"], want) > 0.1
    assert rel_err(emulate(result.module, v, {})["c"], want) < TOLERANCE


def test_one_barrier_per_step_and_the_next_step_loaded_ahead():
    _, g = simt_kernel(gemm(**CASES["square"]))
    loop = g.source[g.source.index("for (int s = 0;"):]
    loop = loop[:loop.index("\n  }\n")]
    assert loop.count("__syncthreads()") == 1
    # the next step's loads come before this step's fragments, its stores after them
    assert loop.index("(s + 1) * 8") < loop.index("f_a[0]") < loop.index("(s + 1) & 1")


def test_plan_refusals_keep_the_staged_shape():
    """A convolution's step of 72 window points, thread tiles other than 4/8, too few thread
    columns and non-float32 operands are refused with a reason; the decision then stages."""
    c = Module(model="conv", tensors={
        "x": Tensor((1, 32, 14, 14), "float32", "input"),
        "w": Tensor((64, 32, 3, 3), "float32", "input"),
        "y": Tensor((1, 64, 14, 14), "float32", "output")},
        ops=(Op("conv", "y[n,f,h,w] += x[n,c,h+kh-1,w+kw-1] * w[f,c,kh,kw]", pad="0",
                tile={"block": {"n": 1, "f": 64, "h": 4, "w": 16},
                      "thread": {"n": 1, "f": 8, "h": 1, "w": 4},
                      "step": {"c": 8, "kh": 3, "kw": 3}}),),
        inputs=("x", "w"), outputs=("y",), stages=({"name": "import"},))
    assert generate(c, H100).kernels[0].shape == "staged"
    module = gemm(128, 128, 64)
    from tilekit.ir.graph import op_analysis
    facts = analysis_facts(op_analysis(module, 0), {n: t.dtype for n, t in
                                                    module.tensors.items()})
    c_ = facts.contraction
    shape_of = lambda i: facts.reads[i].shape                      # noqa: E731
    spatial, reduction = facts.spatial, facts.reduction
    assert "4 or 8" in simt_plan(c_, spatial, reduction, (64, 64), (2, 2), (8,), 49152, shape_of)
    assert "thread columns" in simt_plan(c_, spatial, reduction, (64, 32), (4, 8), (8,), 49152,
                                         shape_of)
    assert "step 64" in simt_plan(c_, spatial, reduction, (64, 64), (4, 4), (64,), 49152,
                                  shape_of)
    assert decide(facts, Tile((64, 64), (2, 2), (8,)), 49152).shape == "staged"
    assert decide(facts, Tile((64, 64), (4, 4), (8,)), 49152).shape == "simt"
    half = replace(c_, dtype="float16")
    assert "float16" in simt_plan(half, spatial, reduction, (64, 64), (4, 4), (8,), 49152,
                                  shape_of)


def test_roll_prices_and_picks_the_simt_gemm():
    fp32 = gemm(1024, 1024, 1024, t=None)
    fp32 = replace(fp32, ops=(replace(fp32.ops[0], tile=None),))
    rolled = roll_module(fp32, H100)
    kernel = rolled.ops[0].tile["kernel"]
    assert kernel["shape"] == "simt", kernel
    g = generate(rolled, H100).kernels[0]
    assert g.shape == "simt" and g.smem_planned == kernel["smem_bytes"]
    # with tf32 asked for, tensor cores come first
    tf32 = roll_module(fp32, H100, precision="tf32")
    assert tf32.ops[0].tile["kernel"]["shape"] == "mma"


NVCC_TILES = [tile(128, 128, 8, 8, 8), tile(64, 128, 8, 8, 32)] + (
    [tile(128, 128, 8, 8, 16), tile(64, 64, 4, 4, 8), tile(128, 64, 8, 4, 16),
     tile(32, 64, 4, 4, 32)] if ALL else [])


def _compiles_in_registers(result, arch: str, what) -> None:
    """The generated simt kernel builds with nvcc for `arch`: no spills, no stack."""
    from tilekit.codegen import compile_module

    assert result.kernels[0].shape == "simt"
    report = compile_module(result, arch, H100)
    assert not report.problems, report.problems
    res = report.module.codegen["kernels"][0]["resources"]
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (what, res)
    assert res["stack"] == 0 and res["registers"] <= 255, (what, res)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_simt_kernels_compile_without_spills_or_local_memory(arch):
    shapes = [(1024, 1024, 1024, True, True), (1000, 1000, 1001, True, True)]  # + scalar A
    if ALL:
        shapes += [(1024, 1024, 1024, False, False), (1000, 1001, 1001, False, False)]
    for t in NVCC_TILES:
        for m, n, k, a_mk, b_kn in shapes:
            result = generate(gemm(m, n, k, t=t, a_mk=a_mk, b_kn=b_kn), H100)
            if t["step"]["k"] == 32 and t["block"]["j"] == 128 and not b_kn and n % 4:
                # 32 scalar loads of B per thread: refused (MAX_SCALAR_LOADS), staged
                assert result.kernels[0].shape == "staged"
                continue
            _compiles_in_registers(result, arch, t)


@pytest.mark.parametrize("nth", [0, 1])
def test_emulation_catches_a_missing_barrier(nth):
    """Without the barrier before the loop (0) or the one per step (1), threads read buffers
    others have not written yet or overwrite ones still read: wrong numbers (the emulation
    runs threads in a pseudo-random order between barriers)."""
    from test_codegen_emulate import without_barrier

    module = gemm(**CASES["square"])
    result, g = simt_kernel(module)
    record = dict(result.module.codegen["kernels"][0])
    record["source"] = without_barrier(g, nth)
    broken = replace(result.module, codegen={**result.module.codegen, "kernels": [record]})
    v = values(module)
    assert rel_err(emulate(broken, v, {})["c"], reference(module, v, True, True)) > 1e-3


def _sass(module: Module) -> str:
    """The sm_90 SASS of the module's kernels (`cuobjdump -sass`, from the test extras)."""
    import subprocess

    from test_codegen_wgmma import _cuobjdump
    from tilekit.codegen.module import unit_source
    from tilekit.codegen.nvcc import compile_unit

    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm)")
    cubin = compile_unit(unit_source(generate(module, H100).kernels), "sm_90").cubin
    return subprocess.run([tool[0], "-sass", str(cubin)], capture_output=True, text=True,
                          env=tool[1], check=True).stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_sass_has_16_byte_loads_and_ffma_in_the_step_loop_and_no_local_memory():
    """The 16-byte accesses survive compilation: LDG.E.128 and LDS.128 (the register-array
    fragments stay in registers) inside the step loop with the FFMAs, no LDL/STL. A 3 x 3
    convolution in steps of whole windows: gathered scalar loads, the same 16-byte fragments
    and FFMAs (9 points of 8x8), no local memory either."""
    import re

    from test_codegen_wgmma import loops_with

    gemm_sass = _sass(gemm(1024, 1024, 1024, t=tile(128, 128, 8, 8, 8)))
    conv_sass = _sass(conv(256, 256, 56, 56, t=conv_tile(128, 1, 64, 8, 8, {
        "c": 1, "kh": 3, "kw": 3})))
    for sass, opcodes, ffma in ((gemm_sass, ("LDG.E.128", "LDS.128", "FFMA", "BAR.SYNC"), 8),
                                (conv_sass, ("LDS.128", "FFMA", "BAR.SYNC"), 9)):
        for opcode in opcodes:
            assert loops_with(sass, opcode) >= 1, f"no {opcode} inside a loop"
        assert sass.count("FFMA") >= ffma * 8 * 8      # the step's points of 8x8 unrolled
        assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the SASS"


@pytest.mark.skipif(not ALL, reason="the rolled suite's simt kernels: TILEKIT_ALL_ARCHS=1")
@pytest.mark.parametrize("hw", ["h100", "a100"])
def test_every_simt_kernel_of_the_rolled_suite_emulates_the_reference(hw):
    """The 119-op suite rolled for the profile: every op that becomes a simt kernel (BERT's
    projections, batched attention products, GEMMs of odd sizes, GEMVs) runs its first,
    middle and last blocks in the emulation against the reference executor."""
    from tilekit.codegen.emulate import emulate_blocks
    from tilekit.roll.workloads import load_workloads
    from tilekit.runtime.cpu import run_module

    profile = load_profile(hw)
    checked, failures = 0, []
    for w in load_workloads():
        module = roll_module(w.module(), profile)
        if module.ops[0].tile["kernel"]["shape"] != "simt":
            continue
        result = generate(module, profile)
        grid = result.module.codegen["kernels"][0]["grid"][0]
        v = values(module)
        want = run_module(module, v, {})
        for name, got in emulate_blocks(result.module, 0, v, sorted({0, grid // 2, grid - 1})
                                        ).items():
            written = ~np.isnan(got)
            err = np.abs(got[written] - want[name][written]).max() / np.abs(want[name]).max()
            if not written.any() or err > 1e-4:
                failures.append(f"{w.name}: {name} off by {err:.1e}")
        checked += 1
    assert checked >= 10 and not failures, failures


def _vector_reads(row_of_lane) -> tuple[int, int]:
    """(wavefronts, fewest) of one warp's 16-byte loads of s[row_of_lane(l)][0:4] from a
    shared [32][4] float buffer (rows of 16 bytes: eight rows span the 32 banks)."""
    from tilekit.tile import expr as tx
    from tilekit.tile.expr import Load
    from tilekit.tile.nodes import Buffer, Kernel, Store, Threads

    s = Buffer("s_t", "shared", "float32", (32, 4))
    y = Buffer("t_y", "global", "float32", (32 * 4,), access="write")
    tid = tx.Var("tid", "int32")
    value = Load("s_t", (row_of_lane(tid), tx.const(0)), "float4", 4)
    body = Threads(tid, 32, Store("t_y", (tid * 4,), value, 4))
    k = Kernel("reads", (y,), (s,), body, 32, 1)
    (site,) = [x for x in interpret(k, {"t_y": np.zeros(128, np.float32)}).sites.values()
               if x.scope == "shared"]
    return site.wavefronts, site.ideal_wavefronts


def test_a_16_byte_broadcast_is_not_a_conflict_but_a_shared_bank_is():
    """The interpreter's fewest wavefronts for a 16-byte access: one per quarter warp (a
    wavefront returns a register per lane), so lanes sharing an address (the A fragment's
    broadcast) count as conflict-free; rows 8 apart in one quarter warp conflict."""
    from tilekit.tile import expr as tx

    assert _vector_reads(lambda t: tx.const(0)) == (4, 4)              # all lanes: one row
    # 8 rows in each quarter warp: 32 banks
    assert _vector_reads(lambda t: tx.mod(t, 8)) == (4, 4)
    # rows 0-3 and 8-11 in a quarter warp: rows 8 apart share banks (2-way); 0, 1, 8, 9,
    # 16, 17, 24, 25: 4-way
    assert _vector_reads(lambda t: tx.div(tx.mod(t, 8), 4) * 8 + tx.mod(t, 4)) == (8, 4)
    assert _vector_reads(lambda t: tx.div(tx.mod(t, 8), 2) * 8 + tx.mod(t, 2)) == (16, 4)


def test_a_transposed_scaled_output_stores_point_by_point():
    """`c[j,i] += a[i,k] * b[k,j] * 0.5`: M is the output's contiguous axis, so the epilogue
    stores point by point (no 16-byte stores), with the constant factor applied."""
    m, n, k = 70, 96, 40
    module = Module(model="t", tensors={
        "a": Tensor((m, k), "float32", "input"), "b": Tensor((k, n), "float32", "input"),
        "c": Tensor((n, m), "float32", "output")},
        ops=(Op("mm", "c[j,i] += a[i,k] * b[k,j] * 0.5",
                tile={"block": {"j": 64, "i": 64}, "thread": {"j": 4, "i": 8},
                      "step": {"k": 8}}),),
        inputs=("a", "b"), outputs=("c",), stages=({"name": "import"},))
    result, g = simt_kernel(module)
    assert "float4*>(&t_c" not in g.source
    v = values(module)
    want = (v["a"].astype(np.float64) @ v["b"].astype(np.float64)).T * 0.5
    assert rel_err(emulate(result.module, v, {})["c"], want) < TOLERANCE


def conv(c: int, f: int, h: int, w: int, t: dict, stride: int = 1, pad: int = 1, k: int = 3,
         chain: bool = False) -> Module:
    """`y = conv(x, w)` (NCHW, a k x k window), its output `r = max(y + bias, 0)` when
    `chain` (one kernel: the SIMT GEMM's epilogue)."""
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1

    def at(axis: str, window: str) -> str:
        out = f"{axis} * {stride}" if stride > 1 else axis
        if k > 1:
            out += f" + {window}"
        return out + (f" - {pad}" if pad else "")
    window = "kh,kw" if k > 1 else ""
    x = f"x[n,c,{at('h', 'kh')},{at('w', 'kw')}]"
    wt = f"w[f,c,{window}]" if k > 1 else "w[f,c]"
    tensors = {"x": Tensor((1, c, h, w), "float32", "input"),
               "w": Tensor((f, c, k, k) if k > 1 else (f, c), "float32", "input"),
               "y": Tensor((1, f, ho, wo), "float32", "output")}
    ops = [Op("conv", f"y[n,f,h,w] += {x} * {wt}", pad="0", tile=t)]
    inputs, outputs, kernels = ("x", "w"), ("y",), ()
    if chain:
        tensors["y"] = Tensor((1, f, ho, wo), "float32", "intermediate")
        tensors["bias"] = Tensor((f,), "float32", "input")
        tensors["r"] = Tensor((1, f, ho, wo), "float32", "output")
        ops.append(Op("act", "r[n,f,h,w] = max(y[n,f,h,w] + bias[f], 0.0)"))
        inputs, outputs, kernels = ("x", "w", "bias"), ("r",), (Kernel("k0", ("conv", "act")),)
    return Module(model="conv", tensors=tensors, ops=tuple(ops), inputs=inputs,
                  outputs=outputs, kernels=kernels, stages=({"name": "import"},))


def conv_reference(module: Module, v: dict) -> np.ndarray:
    """The convolution in float64 from the module's own shapes (and its chain)."""
    (_, c, h, w), (_, f, ho, wo) = module.tensors["x"].shape, module.tensors["y"].shape
    wt = v["w"].astype(np.float64).reshape(f, c, *(module.tensors["w"].shape[2:] or (1, 1)))
    k = wt.shape[2]
    expr = module.ops[0].expr
    stride = 2 if "* 2" in expr else 1
    pad = 1 if "- 1" in expr else 0
    xp = np.pad(v["x"].astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((1, f, ho, wo))
    for kh in range(k):
        for kw in range(k):
            win = xp[:, :, kh:kh + stride * (ho - 1) + 1:stride,
                     kw:kw + stride * (wo - 1) + 1:stride]
            out += np.einsum("nchw,fc->nfhw", win, wt[:, :, kh, kw])
    if "bias" in v:
        out = np.maximum(out + v["bias"].astype(np.float64)[None, :, None, None], 0.0)
    return out


def conv_tile(f: int, h: int, w: int, tf: int, tw: int, step: dict) -> dict:
    return {"block": {"n": 1, "f": f, "h": h, "w": w},
            "thread": {"n": 1, "f": tf, "h": 1, "w": tw}, "step": step}


CONV_CASES = {
    # channels stepped 8 at a time, one window point per step; 14 x 14 in 4 x 16 tiles
    "3x3_channel_steps": dict(c=32, f=64, h=14, w=14,
                              t=conv_tile(64, 4, 16, 8, 8, {"c": 8, "kh": 1, "kw": 1})),
    # steps of two channels' whole windows (18 points), lanes 9 along K
    "3x3_whole_windows": dict(c=20, f=64, h=10, w=12,
                              t=conv_tile(64, 2, 16, 4, 4, {"c": 2, "kh": 3, "kw": 3})),
    # stride 2; 20 channels in steps of 8 (the last step ragged)
    "stride_2_ragged_channels": dict(c=20, f=32, h=15, w=15, stride=2,
                                     t=conv_tile(32, 4, 8, 4, 4, {"c": 8, "kh": 1, "kw": 1})),
    # a 1 x 1 layer: the pixels and the weights are plain reads, 16-byte loads of both
    "1x1_vector": dict(c=48, f=64, h=8, w=16, pad=0, k=1,
                       t=conv_tile(64, 2, 16, 8, 4, {"c": 16})),
    # bias and ReLU in the epilogue, pixels ragged (7 x 7 in 4 x 8 tiles)
    "3x3_chain": dict(c=16, f=32, h=7, w=7, chain=True,
                      t=conv_tile(32, 4, 8, 4, 4, {"c": 1, "kh": 3, "kw": 3})),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_a_convolution_runs_as_an_implicit_gemm_on_cuda_cores(case):
    module = conv(**CONV_CASES[case])
    result, g = simt_kernel(module)
    v = values(module)
    got = emulate(result.module, v, {})[module.outputs[0]]
    assert rel_err(got, conv_reference(module, v)) < TOLERANCE
    assert g.schedule["simt"]["vector"] == (["a", "b"] if case == "1x1_vector" else [])


WINDOWS = {
    # dilation 2 (padding 2): the window's index maps with coefficients
    "dilated": ("y[n,f,h,w] += x[n,c,h+2*kh-2,w+2*kw-2] * w[f,c,kh,kw]",
                {"x": (1, 16, 12, 12), "w": (32, 16, 3, 3), "y": (1, 32, 12, 12)},
                {"block": {"n": 1, "f": 32, "h": 4, "w": 16},
                 "thread": {"n": 1, "f": 4, "h": 1, "w": 4}, "step": {"c": 8, "kh": 1, "kw": 1}}),
    # a 1-D convolution of 2 sequences, steps of two channels' whole windows of 5
    "conv1d": ("y[n,f,l] += x[n,c,l+k-2] * w[f,c,k]",
               {"x": (2, 24, 50), "w": (64, 24, 5), "y": (2, 64, 50)},
               {"block": {"n": 1, "f": 64, "l": 32}, "thread": {"n": 1, "f": 8, "l": 4},
                "step": {"c": 2, "k": 5}}),
    # 3 images in blocks of 2 (the batch is part of M, ragged)
    "batch_in_m": ("y[n,f,h,w] += x[n,c,h+kh-1,w+kw-1] * w[f,c,kh,kw]",
                   {"x": (3, 8, 6, 6), "w": (32, 8, 3, 3), "y": (3, 32, 6, 6)},
                   {"block": {"n": 2, "f": 32, "h": 4, "w": 8},
                    "thread": {"n": 1, "f": 4, "h": 1, "w": 8},
                    "step": {"c": 1, "kh": 3, "kw": 3}}),
}


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_other_windows_equal_the_reference_executor(case):
    from tilekit.runtime.cpu import run_module

    expr, shapes, t = WINDOWS[case]
    module = Module(model=case, tensors={
        n: Tensor(shape, "float32", "output" if n == "y" else "input")
        for n, shape in shapes.items()}, ops=(Op("conv", expr, pad="0", tile=t),),
        inputs=("x", "w"), outputs=("y",), stages=({"name": "import"},))
    result, _ = simt_kernel(module)
    v = values(module)
    want = run_module(module, v, {})["y"].astype(np.float64)
    assert rel_err(emulate(result.module, v, {})["y"], want) < TOLERANCE


def _random_convolution(rng) -> Module:
    """A convolution of random sizes, channels, window (1-D or 2-D, 1-5 wide), stride,
    dilation and padding, with a random tile of the SIMT GEMM's form (it may not fit: the
    plan then refuses it)."""
    two_d = bool(rng.integers(2))
    k, s, d = int(rng.choice([1, 3, 5])), int(rng.integers(1, 3)), int(rng.integers(1, 3))
    p = int(rng.integers(0, d * (k // 2) + 1))
    size = [int(rng.integers(max(5, d * (k - 1) + 1 - 2 * p), 19)) for _ in range(2 if two_d else 1)]
    out = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n in size]
    c, f = int(rng.integers(3, 41)), int(rng.choice([32, 48, 64, 96]))
    names = ["h", "w"] if two_d else ["l"]
    wins = ["kh", "kw"] if two_d else ["kx"]

    def at(a: str, kw: str) -> str:
        return " + ".join(x for x in (f"{a} * {s}" if s > 1 else a, f"{d} * {kw}" if d > 1 else kw)) \
            + (f" - {p}" if p else "")
    x_idx = ",".join(at(a, kw) if k > 1 else (f"{a} * {s}" if s > 1 else a) + (f" - {p}" if p else "")
                     for a, kw in zip(names, wins))
    w_idx = ",".join(["f", "c"] + (wins if k > 1 else []))
    expr = f"y[n,f,{','.join(names)}] += x[n,c,{x_idx}] * w[{w_idx}]"
    tn = int(rng.choice([4, 8]))
    bn = min(8 * tn * int(rng.choice([1, 2])), 128)
    tm = int(rng.choice([4, 8]))
    bm = int(rng.choice([32, 64]))
    inner = (8 if out[-1] <= 8 else 16) if two_d else bm
    block = {"n": 1, "f": bn, names[-1]: inner}
    if two_d:
        block["h"] = max(1, bm // inner)
    thread = {"n": 1, "f": tn, names[-1]: min(tm, inner)}
    if two_d:
        thread["h"] = 1
    if k > 1 and k ** len(names) * 2 <= 36 and rng.integers(2):
        step = {"c": int(rng.choice([1, 2])), **{kw: k for kw in wins}}
    else:
        step = {"c": int(rng.choice([4, 8])), **({kw: 1 for kw in wins} if k > 1 else {})}
    shapes = {"x": (2, c, *size), "w": (f, c, *([k] * len(names) if k > 1 else [])),
              "y": (2, f, *out)}
    return Module(model="random_conv", tensors={
        n: Tensor(shape, "float32", "output" if n == "y" else "input")
        for n, shape in shapes.items()},
        ops=(Op("conv", expr, pad="0", tile={"block": block, "thread": thread, "step": step}),),
        inputs=("x", "w"), outputs=("y",), stages=({"name": "import"},))


def test_random_convolutions_equal_the_reference_executor():
    """Seeded random convolutions (_random_convolution) until eight run as the SIMT GEMM:
    each emulated (every block) against the reference executor."""
    from tilekit.runtime.cpu import run_module

    rng = np.random.default_rng(2026)
    checked, tries = [], 0
    while len(checked) < 8:
        tries += 1
        assert tries <= 80, f"only {len(checked)} of 80 random tiles ran as the SIMT GEMM"
        module = _random_convolution(rng)
        result = generate(module, H100)
        if result.kernels[0].shape != "simt":
            continue
        v = values(module)
        want = run_module(module, v, {})["y"].astype(np.float64)
        err = rel_err(emulate(result.module, v, {})["y"], want)
        assert err < TOLERANCE, (module.ops[0].expr, module.ops[0].tile, err)
        checked.append(module.ops[0].expr)
    assert len(set(checked)) > 4 and any("l]" in e for e in checked)    # 1-D and 2-D forms


def test_a_convolution_with_a_symbolic_batch_is_one_simt_template(tmp_path, monkeypatch):
    """`tk-import --dim batch=1..64 | tk-roll --hw h100`: the convolution's tile runs as the
    SIMT GEMM at every priced size, and one build (sizes as parameters) serves batches 1 and
    3, emulated against the reference executor."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from clirun import completed
    from tilekit.cli import tk_import, tk_roll
    from tilekit.ir import read_module
    from tilekit.ir.dims import instantiate
    from tilekit.runtime import backend
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants
    from tilekit.runtime.io import gather_inputs, load_weights

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    w = numpy_helper.from_array(RNG.standard_normal((64, 16, 3, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64, 12, 12])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "conv.onnx"))
    for command, args in ((tk_import, ["conv.onnx", "--dim", "batch=1..64", "-o", "m.yaml"]),
                          (tk_roll, ["m.yaml", "--hw", "h100", "-o", "gpu.yaml"])):
        proc = completed(command.main, args, tmp_path)
        assert proc.returncode == 0, proc.stderr
    module = read_module(str(tmp_path / "gpu.yaml"))
    (tile,) = [op.tile for op in module.ops if op.tile]
    assert {p["kernel"] for p in tile["priced"]} == {"simt"}
    base = load_weights(module, str(tmp_path))
    family = CompiledFamily(module, base, "cuda")
    for batch in (1, 3):
        instance, weights = fold_constants(instantiate(module, {"batch": batch}), base)
        code, unit = family.code(instance, {"batch": batch})
        assert [k["shape"] for k in code.codegen["kernels"]] == ["simt"]
        feeds = gather_inputs(instance, (), None, 0)
        want = backend(instance, "cpu", "whole").run(feeds, weights)["y"]
        got = emulate(code, feeds, weights, unit=unit)["y"]
        assert rel_err(got, want.astype(np.float64)) < TOLERANCE
    assert len(family.templates) == 1


def test_a_convolutions_fragments_are_conflict_free_and_its_row_reads_whole_sectors():
    """The window's rows go to shared memory along M and come back as 16-byte fragments
    without bank conflicts; a 1 x 1 layer's pixel rows are read in whole sectors."""
    _, g = simt_kernel(conv(**CONV_CASES["3x3_channel_steps"]))
    sites = interpret(g.program, _memory(g.program), [0]).sites.values()
    fragments = [s for s in sites if s.scope == "shared" and s.kind == "load"]
    assert fragments and all(s.wavefronts == s.ideal_wavefronts for s in fragments)
    _, g = simt_kernel(conv(**CONV_CASES["1x1_vector"]))
    sites = interpret(g.program, _memory(g.program), [0]).sites.values()
    rows = [s for s in sites if s.scope == "global" and s.buffer == "t_x"]
    assert rows and all(s.sectors == s.ideal for s in rows)


def test_a_matmul_of_3d_activations_takes_its_rows_as_m():
    """`y[b,s,o] += x[b,s,h] * w[h,o]` (an exporter's MatMul of activations): M is (b, s),
    flat in the block; 16-byte loads of both operands and 16-byte stores."""
    tensors = {"x": Tensor((2, 24, 40), "float32", "input"),
               "w": Tensor((40, 96), "float32", "input"),
               "y": Tensor((2, 24, 96), "float32", "output")}
    module = Module(model="mm3", tensors=tensors, ops=(Op(
        "mm", "y[b,s,o] += x[b,s,h] * w[h,o]",
        tile={"block": {"b": 2, "s": 16, "o": 64}, "thread": {"b": 1, "s": 4, "o": 8},
              "step": {"h": 8}}),), inputs=("x", "w"), outputs=("y",),
        stages=({"name": "import"},))
    result, g = simt_kernel(module)
    assert g.schedule["simt"]["vector"] == ["a", "b"]
    assert "float4*>(&t_y" in g.source
    v = values(module)
    want = v["x"].astype(np.float64) @ v["w"].astype(np.float64)
    assert rel_err(emulate(result.module, v, {})["y"], want) < TOLERANCE


def test_a_register_tile_off_the_groups_innermost_axes_is_refused():
    module = conv(**CONV_CASES["3x3_channel_steps"])
    t = conv_tile(64, 4, 16, 8, 8, {"c": 8, "kh": 1, "kw": 1})
    t["thread"] = {"n": 1, "f": 8, "h": 2, "w": 4}            # h > 1 while w is not whole
    module = replace(module, ops=(replace(module.ops[0], tile=t),))
    assert generate(module, H100).kernels[0].shape == "staged"


def test_roll_runs_resnet_1x1_layers_as_simt_implicit_gemms():
    """A 1 x 1 layer of ResNet-50's first stage (16-byte loads of the activations): the model
    prices the SIMT GEMM fastest, and what codegen makes of the pick is what was priced."""
    module = conv(64, 256, 56, 56, t=None, pad=0, k=1)
    rolled = roll_module(module, H100)
    kernel = rolled.ops[0].tile["kernel"]
    assert kernel["shape"] == "simt" and kernel["simt"]["vector"], kernel
    g = generate(rolled, H100).kernels[0]
    assert g.shape == "simt" and g.smem_planned == kernel["smem_bytes"]


def _estimate_us(module: Module, tile: dict) -> float:
    from tilekit.ir.graph import op_analysis
    from tilekit.roll.cost import cost_tiles, machine
    from tilekit.roll.problem import problem_from_analysis
    problem = problem_from_analysis(op_analysis(module, 0), {n: t.dtype for n, t in
                                                             module.tensors.items()})

    def column(key: str, axes) -> np.ndarray:
        return np.array([[tile[key][a]] for a, _ in axes], dtype=np.int64)
    costs = cost_tiles(problem, machine(H100), column("block", problem.spatial),
                       column("thread", problem.spatial), column("step", problem.reduction))
    return costs.estimate(0).time_us


def test_a_gathered_simt_gemm_is_priced_at_the_warps_that_hide_its_loads():
    """VGG-19's 56 x 56 3 x 3 layers of 256 channels ran on an H100 (2026-11-27) as the SIMT
    GEMM the roll picked then (blocks 64 x 128 x 9, operands gathered element by element,
    112 blocks of 4 warps: one block per SM) in 258 us by CUDA events, where the model gave
    104 us at the warps that saturate an SM. Priced at the warps that hide a CUDA-core
    reduction's loads it is within 25% of that, and the roll no longer picks it."""
    module = conv(256, 256, 56, 56, t=None)
    tile = {"block": {"n": 1, "f": 128, "h": 1, "w": 64},
            "thread": {"n": 1, "f": 8, "h": 1, "w": 8}, "step": {"c": 1, "kh": 3, "kw": 3}}
    picked = replace(module, ops=(replace(module.ops[0], tile=tile),))
    g = generate(picked, H100).kernels[0]
    assert g.shape == "simt" and g.schedule["simt"]["vector"] == []
    assert 258 / 1.25 <= _estimate_us(module, tile) <= 258 * 1.25
    assert roll_module(module, H100).ops[0].tile["kernel"]["shape"] != "simt"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_simt_convolutions_compile_without_spills_or_local_memory(arch):
    cases = [dict(c=256, f=256, h=56, w=56,
                  t=conv_tile(128, 1, 64, 8, 8, {"c": 1, "kh": 3, "kw": 3})),
             dict(c=256, f=256, h=28, w=28, chain=True,
                  t=conv_tile(128, 4, 32, 8, 8, {"c": 8, "kh": 1, "kw": 1}))]
    for kw in cases + ([dict(CONV_CASES[k]) for k in sorted(CONV_CASES)] if ALL else []):
        _compiles_in_registers(generate(conv(**kw), H100), arch, kw)
