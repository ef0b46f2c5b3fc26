"""Hopper contractions (`wgmma` kernels: TMA, mbarriers, warp roles, wgmma), checked without a
GPU.

The generated kernels run in the CPU emulation (host_emul.h: TMA box copies into the 128-byte
swizzled layout, mbarrier phases, wgmma reading shared memory through its descriptors and
writing the PTX ISA's accumulator layout) and in the tile interpreter (the same semantics in
NumPy) against a float64 reference, for fp16 and bf16 (tf32 against the product of the
inputs' upper 19 bits), every operand majorness, ragged shapes and a fused epilogue, on
grids of a block per tile and on persistent grids (a 5-SM profile: several tiles per block,
the barrier phases carried across them, split-K pieces of different lengths, the grouped
tile order), with the TMA-store epilogue and the direct one; mutations of a descriptor, of
the swizzle, of the accumulator layout, of a barrier parity, of the step counter across
tiles, of a tf32 atom and of the store's waits must fail; the kernels compile for sm_90a
without local memory and with HGMMA, TMA loads and stores in loops (when nvcc and cuobjdump
are installed); the runtime's tensor-map encoding is checked against a stand-in driver.
"""

from __future__ import annotations

import functools

import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scope import on

from tilekit.codegen import generate
from tilekit.codegen.emulate import emulate, emulate_blocks, find_cxx
from tilekit.codegen.kernel import tvar
from tilekit.expr.ops import numpy_dtype
from tilekit.hw import load_profile
from tilekit.ir import Module, Op, Tensor
from tilekit.ir.payloads import CodegenSection
from tilekit.tile.interp import interpret

H100 = load_profile("h100")
#: The larger sets (every case and every mutation) run with TILEKIT_ALL_ARCHS=1; the default
#: suite runs the ones marked essential (each case is a host compile of its own).
ALL = on("TILEKIT_ALL_ARCHS")
A100 = load_profile("a100")
needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler for the emulation")


def gemm(m: int, n: int, k: int, dtype: str, a: str = "mk", b: str = "kn",
         block=(128, 128), consumers: int = 1, bias_relu: bool = False,
         batch: int = 0) -> Module:
    """`c = a @ b` (`a` stored [m][k] or [k][m], `b` [k][n] or [n][k], optionally batched),
    with a wgmma-shaped tile: `consumers` warpgroups over a `block` of the output, steps of
    64; optionally `y = max(c + bias, 0)` in the same kernel group."""
    z = "z," if batch else ""
    lead = (batch,) if batch else ()
    ra = f"a[{z}i,k]" if a == "mk" else f"a[{z}k,i]"
    rb = f"b[{z}k,j]" if b == "kn" else f"b[{z}j,k]"
    tensors = {"a": Tensor(lead + ((m, k) if a == "mk" else (k, m)), dtype, "input"),
               "b": Tensor(lead + ((k, n) if b == "kn" else (n, k)), dtype, "input"),
               "c": Tensor(lead + (m, n), "float32", "output" if not bias_relu else
                           "intermediate")}
    bm, bn = block
    tile = {"block": {**({"z": 1} if batch else {}), "i": bm, "j": bn},
            "thread": {**({"z": 1} if batch else {}), "i": 1,
                       "j": bm * bn // (128 * consumers)},
            "step": {"k": 64}}
    ops = [Op("mm", f"c[{z}i,j] += {ra} * {rb}", tile=tile)]
    outputs = ("c",)
    kernels = ()
    if bias_relu:
        from tilekit.ir.model import Kernel
        tensors["bias"] = Tensor((n,), "float32", "input")
        tensors["y"] = Tensor(lead + (m, n), "float32", "output")
        ops.append(Op("bias_relu", f"y[{z}i,j] = max(c[{z}i,j] + bias[j], 0.0)"))
        outputs = ("y",)
        kernels = (Kernel("k0", ("mm", "bias_relu")),)
    return Module(model="gemm", tensors=tensors, ops=tuple(ops),
                  inputs=tuple(t for t in ("a", "b", "bias") if t in tensors), outputs=outputs,
                  kernels=kernels, stages=({"name": "import"},))


def values(module: Module, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in module.inputs:
        t = module.tensors[name]
        v = rng.standard_normal(t.shape)
        out[name] = v.astype(numpy_dtype(t.dtype)) if t.dtype != "bfloat16" else \
            v.astype(numpy_dtype("bfloat16")).astype(np.float32)
    return out


def reference(module: Module, v: dict[str, np.ndarray]) -> np.ndarray:
    """float64 of the inputs as stored (fp16 values, bf16-rounded values)."""
    expr = module.ops[0].expr
    a = v["a"].astype(np.float64)
    b = v["b"].astype(np.float64)
    if "a[k,i]" in expr or "a[z,k,i]" in expr:
        a = np.swapaxes(a, -1, -2)
    if "b[j,k]" in expr or "b[z,j,k]" in expr:
        b = np.swapaxes(b, -1, -2)
    c = a @ b
    if "bias" in v:
        c = np.maximum(c + v["bias"].astype(np.float64), 0.0)
    return c


def rel_err(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def interpreted(result, module: Module, v: dict[str, np.ndarray]) -> np.ndarray:
    """The output computed by the tile interpreter on the lowered programs."""
    memory = {}
    for name, t in module.tensors.items():
        memory[tvar(name)] = (np.asarray(v[name], numpy_dtype(t.dtype)).reshape(-1).copy()
                              if name in v else np.full(t.size, np.nan, numpy_dtype(t.dtype)))
    for k in result.kernels:
        interpret(k.program, memory)
    out = module.outputs[0]
    return memory[tvar(out)].reshape(module.tensors[out].shape).astype(np.float64)


CASES = {
    # ragged on every axis, B N-major (transposed descriptor), one consumer of 2 x 64 rows
    "f16_mk_kn_ragged": (200, 136, 328, "float16", "mk", "kn", (128, 128), 1),
    # A M-major, B K-major, two consumers with setmaxnreg
    "bf16_km_nk_ragged": (200, 136, 328, "bfloat16", "km", "nk", (128, 128), 2),
    # one instruction's N of 256, two consumers
    "f16_mk_nk_n256": (130, 300, 200, "float16", "mk", "nk", (128, 256), 2),
    # the smallest block: N 64, one consumer of one instruction, a single partial step
    "bf16_mk_kn_small": (72, 200, 40, "bfloat16", "mk", "kn", (64, 64), 1),
    # two 64-row instructions per consumer, both operands transposed
    "f16_km_kn_mt2": (256, 128, 64, "float16", "km", "kn", (256, 128), 2),
}


#: Run by default (the others with TILEKIT_ALL_ARCHS=1): fp16 and bf16, ragged, every
#: majorness of A and B, one and two consumers, N 128 and 256.
ESSENTIAL = ("f16_mk_kn_ragged", "bf16_km_nk_ragged", "f16_mk_nk_n256")


@needs_cxx
@pytest.mark.parametrize("case", sorted(CASES) if ALL else ESSENTIAL)
def test_wgmma_kernels_compute_the_reference(case):
    m, n, k, dtype, a, b, block, consumers = CASES[case]
    module = gemm(m, n, k, dtype, a, b, block, consumers)
    result = generate(module, H100)
    (kern,) = result.kernels
    assert kern.shape == "wgmma", kern.schedule
    assert kern.schedule["wgmma"]["warpgroups"]["consumers"] == consumers
    assert result.module.codegen["arch"] == "sm_90a"
    v = values(module)
    want = reference(module, v)
    assert rel_err(emulate(result.module, v, {})["c"], want) < 1e-5
    assert rel_err(interpreted(result, module, v), want) < 1e-5


@needs_cxx
def test_fused_bias_relu_epilogue_and_batches():
    """The chain runs on the accumulators (bias + ReLU) and 3-D tensor maps carry a batch."""
    module = gemm(100, 72, 136, "bfloat16", "mk", "nk", (64, 128), 1, bias_relu=True, batch=3)
    result = generate(module, H100)
    (kern,) = result.kernels
    assert kern.shape == "wgmma" and kern.ops == ("mm", "bias_relu")
    assert [len(m["dims"]) for m in kern.tensor_maps] == [3, 3, 3]   # a, b, y (TMA store)
    v = values(module)
    want = reference(module, v)
    assert rel_err(emulate(result.module, v, {})["y"], want) < 1e-5
    assert rel_err(interpreted(result, module, v), want) < 1e-5


@needs_cxx
def test_sampled_blocks_of_a_large_gemm():
    """A module too large to emulate whole: its first, a middle and its last block."""
    module = gemm(1000, 1000, 512, "float16", "mk", "kn", (128, 256), 2)
    result = generate(module, H100)
    (kern,) = result.kernels
    grid = kern.grid[0]
    v = values(module)
    got = emulate_blocks(result.module, 0, v, [0, grid // 2, grid - 1])["c"]
    want = reference(module, v)
    written = ~np.isnan(got)
    assert written.sum() > 3 * 128 * 100      # three blocks, the last one ragged
    np.testing.assert_allclose(got[written], want[written], rtol=1e-4, atol=1e-3)


# -- the evidence is strict: mutations fail ----------------------------------------------------

def _with_source(result, fn) -> Module:
    section = CodegenSection.read(result.module.codegen)
    (k,) = section.kernels
    new = fn(k)
    assert new != k
    return replace(result.module, codegen=replace(section, kernels=(new,)).record())


def _mutated_source(old: str, new: str):
    def edit(k):
        assert old in k.source, old
        return replace(k, source=k.source.replace(old, new))
    return edit


@needs_cxx
@pytest.mark.parametrize("what", ["stride_offset", "swizzle", "accumulator_rows", "transpose"]
                         + (["leading_offset", "accumulator_columns", "accumulator_rows_direct",
                             "accumulator_columns_direct"] if ALL else []))
def test_a_wrong_layout_gives_wrong_numbers(what):
    """A descriptor's offsets, the tensor map's swizzle, the accumulator layout in the
    epilogue (through the TMA store, or stored directly: `_direct`) or the majorness flag,
    each made wrong, must make the emulated result wrong."""
    module, result, v, want, good = _layout_case(what.endswith("_direct"))
    edits = {
        "stride_offset": _mutated_source(", 8192, 1024);", ", 8192, 512);"),
        "leading_offset": _mutated_source(", 8192, 1024);", ", 4096, 1024);"),
        "swizzle": lambda k: replace(k, tensor_maps=tuple({**m, "swizzle": 0}
                                                          for m in k.tensor_maps)),
        "accumulator_rows": _mutated_source("(v / 2 % 2) * 8", "(v % 2) * 8"),
        "accumulator_columns": _mutated_source("(v / 4) * 8 + ((v % 2) ^ flip)",
                                               "(v / 4) * 8 + flip"),
        "accumulator_rows_direct": _mutated_source("(v / 2 % 2) * 8", "(v % 2) * 8"),
        "accumulator_columns_direct": _mutated_source("(v / 4) * 8 + v % 2", "(v / 4) * 8"),
        "transpose": _mutated_source("tk_wgmma<128, 0, 1, 1>", "tk_wgmma<128, 0, 0, 1>"),
    }
    bad = _with_source(result, edits[what])
    assert not rel_err(emulate(bad, v, {})["c"], want) < 0.05      # wrong (or unwritten: NaN)
    assert good < 1e-5


@functools.lru_cache(maxsize=None)
def _layout_case(direct: bool = False):
    """The module the layout mutations edit, its kernels, values, the reference and the
    error of the unedited kernels' emulation: the same for every mutation, emulated once.
    `direct`: `c` and a bias + ReLU of it both stored, so the epilogue stores directly."""
    module = gemm(128, 128, 128, "float16", "km", "kn", (128, 128), 1, bias_relu=direct)
    if direct:
        module = replace(module, tensors={**module.tensors, "c": replace(module.tensors["c"],
                                                                          role="output")},
                         outputs=("c", "y"))
    result = generate(module, H100)
    assert result.kernels[0].schedule["wgmma"]["epilogue"].startswith(
        "direct" if direct else "tma_store")
    v = values(module)
    want = reference(module, {"a": v["a"], "b": v["b"]})
    return module, result, v, want, rel_err(emulate(result.module, v, {})["c"], want)


@needs_cxx
def test_a_wrong_barrier_parity_deadlocks():
    """A consumer waiting for the other parity of its stage's `full` barrier waits for a
    phase nobody completes: the emulation reports the deadlock."""
    module = gemm(128, 128, 256, "float16", "mk", "kn", (128, 128), 1)
    result = generate(module, H100)
    bad = _with_source(result, _mutated_source("tk_mbar_wait(&s_bar[cst], cph);",
                                               "tk_mbar_wait(&s_bar[cst], cph ^ 1);"))
    with pytest.raises(RuntimeError, match="deadlock|exit 7"):
        emulate(bad, values(module), {})


def test_the_interpreter_sees_a_wrong_descriptor():
    """The interpreter decodes descriptors itself: a stride offset of 512 bytes gives wrong
    numbers there too."""
    from tilekit.tile import expr as tx
    from tilekit.tile.expr import Call
    from tilekit.tile.rewrite import map_exprs
    from tilekit.tile.nodes import transform

    module = gemm(128, 64, 64, "float16", "mk", "kn", (128, 64), 1)
    result = generate(module, H100)
    (kern,) = result.kernels

    def wrong(e):
        if isinstance(e, Call) and e.fn == "wgmma_desc":
            return tx.call("wgmma_desc", e.args[0], e.args[1], 512)
        return e
    broken = replace(kern.program, body=transform(kern.program.body,
                                                  lambda s: map_exprs(s, wrong)))
    v = values(module)
    want = reference(module, v)
    good = replace(result, kernels=(kern,))
    assert rel_err(interpreted(good, module, v), want) < 1e-5
    bad = replace(result, kernels=(replace(kern, program=broken),))
    assert not rel_err(interpreted(bad, module, v), want) < 0.05


def test_the_interpreter_runs_the_roles_and_sees_a_deadlock():
    """The producer and the consumers run as coroutines in the interpreter; a consumer that
    waits for the other parity of `full` is a deadlock it reports."""
    from tilekit.errors import TilekitError
    from tilekit.tile.expr import Call
    from tilekit.tile.rewrite import map_exprs
    from tilekit.tile.nodes import transform
    from tilekit.tile import expr as tx

    module = gemm(64, 64, 192, "float16", "mk", "kn", (64, 64), 1)
    result = generate(module, H100)
    (kern,) = result.kernels

    def flip(e):
        if isinstance(e, Call) and e.fn == "mbar_wait" and "cph" in repr(e.args[1]):
            return tx.call("mbar_wait", e.args[0], tx.binary("^", e.args[1], 1))
        return e
    broken = replace(kern.program, body=transform(kern.program.body,
                                                  lambda s: map_exprs(s, flip)))
    assert broken != kern.program
    with pytest.raises(TilekitError, match="deadlock"):
        interpreted(replace(result, kernels=(replace(kern, program=broken),)), module,
                    values(module))


# -- the choice -------------------------------------------------------------------------------

def test_wgmma_is_chosen_for_hopper_only_and_for_plain_operands():
    tiled = gemm(256, 256, 256, "float16", "mk", "kn", (128, 128), 1)
    assert generate(tiled, H100).kernels[0].shape == "wgmma"
    # the same tile for sm_80 (the A100, or --arch sm_80): mma.sync
    assert generate(tiled, A100).kernels[0].shape == "mma"
    assert generate(tiled, H100, arch="sm_80").kernels[0].shape == "mma"
    # rows that are not whole 16-byte units (K = 100 halves: 200 bytes): no TMA, mma.sync
    assert generate(gemm(256, 256, 100, "float16", block=(128, 128)), H100
                    ).kernels[0].shape == "mma"
    # a convolution (a gathered window) keeps the implicit GEMM on mma.sync
    conv = Module(model="conv", tensors={
        "x": Tensor((1, 64, 16, 16), "float16", "input"),
        "w": Tensor((128, 64, 3, 3), "float16", "input"),
        "y": Tensor((1, 128, 16, 16), "float32", "output")},
        ops=(Op("conv", "y[n,f,h,w] += x[n,c,h+kh-1,w+kw-1] * w[f,c,kh,kw]", pad="0",
                tile={"block": {"n": 1, "f": 64, "h": 4, "w": 16},
                      "thread": {"n": 1, "f": 8, "h": 1, "w": 4},
                      "step": {"c": 16, "kh": 3, "kw": 3}}),),
        inputs=("x", "w"), outputs=("y",), stages=({"name": "import"},))
    assert generate(conv, H100).kernels[0].shape == "mma"


def test_the_launch_plan_records_the_tensor_maps():
    module = gemm(200, 136, 328, "float16", "mk", "kn", (128, 128), 1)
    (kern,) = generate(module, H100).kernels
    a, b, c = kern.tensor_maps
    # a [200][328] K-major: boxes of 64 k by 128 rows; b [328][136] N-major: 64 n by 64 k
    assert a == {"name": "tm_a", "tensor": "a", "dtype": "float16", "dims": [328, 200],
                 "strides": [656], "box": [64, 128], "swizzle": 128}
    assert b == {"name": "tm_b", "tensor": "b", "dtype": "float16", "dims": [136, 328],
                 "strides": [272], "box": [64, 64], "swizzle": 128}
    # c [200][136] fp32, stored with TMA: strips of 32 columns by a warpgroup's 128 rows
    assert c == {"name": "tm_c", "tensor": "c", "dtype": "float32", "dims": [136, 200],
                 "strides": [544], "box": [32, 128], "swizzle": 128}
    assert "const __grid_constant__ tk_tensor_map tm_a" in kern.source


def test_tensor_map_encoding_arguments():
    """What the runtime asks the driver for (cuTensorMapEncodeTiled), checked against a
    stand-in driver that records its arguments."""
    import ctypes
    from tilekit.errors import TilekitError
    from tilekit.runtime.cuda import (TENSOR_MAP_BYTES, encode_tensor_map, kernel_tensor_map,
                                      tensor_map_args)

    record = {"name": "tm_a", "tensor": "a", "dtype": "bfloat16", "dims": [328, 200, 3],
              "strides": [656, 131200], "box": [64, 128, 1], "swizzle": 128}
    args = tensor_map_args(record)
    assert (args.data_type, args.rank, args.dims, args.strides, args.box) == \
        (9, 3, (328, 200, 3), (656, 131200), (64, 128, 1))
    assert (args.element_strides, args.interleave, args.swizzle, args.oob_fill) == \
        ((1, 1, 1), 0, 3, 0)
    seen = {}

    class Driver:
        class cuTensorMapEncodeTiled:  # noqa: N801 - the driver's name
            restype = None

            def __new__(cls, out, dtype, rank, address, dims, strides, box, estr, *rest):
                seen.update(dtype=dtype.value, rank=rank.value, address=address.value,
                            dims=list(dims), strides=list(strides), box=list(box),
                            estr=list(estr), rest=[r.value for r in rest])
                ctypes.memset(out, 7, TENSOR_MAP_BYTES)
                return 0
    raw = encode_tensor_map(args, 0x7F0000001000, Driver)
    assert raw == bytes([7]) * TENSOR_MAP_BYTES
    assert seen == {"dtype": 9, "rank": 3, "address": 0x7F0000001000, "dims": [328, 200, 3],
                    "strides": [656, 131200], "box": [64, 128, 1], "estr": [1, 1, 1],
                    "rest": [0, 3, 3, 0]}
    assert kernel_tensor_map(record, 0x1000, Driver).dtype.itemsize == TENSOR_MAP_BYTES
    with pytest.raises(TilekitError, match="TMA's rules"):
        tensor_map_args({**record, "strides": [650, 131200]})     # not 16-byte multiples


# -- nvcc and the SASS ------------------------------------------------------------------------

def _cuobjdump() -> tuple[str, dict] | None:
    """cuobjdump (and nvdisasm beside it, which -sass needs): on PATH, or from the PyPI
    packages nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm."""
    found = shutil.which("cuobjdump")
    if found and shutil.which("nvdisasm"):
        return found, dict(os.environ)
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for sub in ("cu13", "cu12", "cuda_cuobjdump"):
            bin_dir = Path(root) / sub / "bin"
            if (bin_dir / "cuobjdump").exists() and (bin_dir / "nvdisasm").exists():
                env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
                return str(bin_dir / "cuobjdump"), env
    return None


_SASS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def loops_with(sass: str, opcode: str) -> int:
    """Loops (backward branches) whose body holds `opcode`."""
    ops = [(int(a, 16), op, rest) for a, op, rest in _SASS.findall(sass)]
    count = 0
    for at, op, rest in ops:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < at:
            lo = int(target.group(1), 16)
            count += any(o.startswith(opcode) and lo <= a <= at for a, o, _ in ops)
    return count


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_wgmma_kernels_compile_for_sm90a_with_hgmma_in_the_loop_and_no_local_memory():
    from tilekit.codegen import compile_module
    from tilekit.codegen.module import unit_source
    from tilekit.codegen.nvcc import compile_unit

    for dtype, block, consumers, a, b in (("float16", (128, 256), 2, "mk", "kn"),
                                          ("bfloat16", (128, 128), 1, "km", "kn"),
                                          ("float32", (128, 256), 2, "mk", "nk")):
        module = gemm(4096, 4096, 4096, dtype, a, b, block, consumers)
        result = generate(tf32(module) if dtype == "float32" else module, H100)
        # more tiles than SMs: the persistent form (a block per SM looping over tiles)
        assert result.kernels[0].schedule["wgmma"]["schedule"]["persistent"]
        assert result.kernels[0].grid[0] == H100.sm_count
        report = compile_module(result, None, H100)
        assert "-gencode=arch=compute_90a,code=sm_90a" in report.command
        assert not report.problems, report.problems
        res = report.module.codegen["kernels"][0]["resources"]
        assert res["spill_stores"] == res["spill_loads"] == res["stack"] == 0, res
        tool = _cuobjdump()
        if tool is None:
            pytest.skip("cuobjdump/nvdisasm not installed (pip install nvidia-cuda-cuobjdump "
                        "nvidia-cuda-nvdisasm)")
        cubin = compile_unit(unit_source(result.kernels), "sm_90a").cubin
        sass = subprocess.run([tool[0], "-sass", str(cubin)], capture_output=True,
                              text=True, env=tool[1], check=True).stdout
        assert "HGMMA.64x" in sass
        assert ("TF32" in sass) == (dtype == "float32")
        assert loops_with(sass, "HGMMA") >= 1, "no HGMMA inside a loop"
        assert loops_with(sass, "UTMALDG") >= 1, "no TMA load inside a loop"
        assert loops_with(sass, "UTMASTG") >= 1, "no TMA store inside the tile loop"
        assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the SASS"
        assert "USETMAXREG" in sass if consumers == 2 else True


# -- split-K ----------------------------------------------------------------------------------

@needs_cxx
def test_split_k_adds_the_slices_in_order_and_runs_the_chain():
    """A long reduction cut into slices: the partial-sum kernel (a block per tile and slice,
    a ragged last slice) and the reduction kernel (slices added in order, then bias + ReLU)
    emulate the reference."""
    module = gemm(100, 136, 1000, "float16", "mk", "kn", (64, 64), 1, bias_relu=True)
    module = replace(module, ops=(replace(module.ops[0], tile={**module.ops[0].tile,
                                                               "split_k": 3}),
                                  module.ops[1]))
    result = generate(module, H100)
    first, second = result.kernels
    assert (first.shape, second.shape) == ("wgmma", "splitk_reduce")
    assert first.schedule["wgmma"]["split_k"]["slices"] == 3
    assert first.schedule["wgmma"]["split_k"]["steps"] == 6       # 16 steps: 6, 6, 4
    assert first.grid[0] == 2 * 3 * 3 and first.writes == ("k0__partials",)
    assert first.scratch == second.scratch == {"k0__partials": 3 * 100 * 136}
    assert second.args == ("k0__partials", "bias", "y")
    assert result.module.kernels[0].launch["entries"] == [first.entry, second.entry]
    v = values(module)
    want = reference(module, v)
    assert rel_err(emulate(result.module, v, {})["y"], want) < 1e-5


def test_the_roll_splits_long_reductions_with_small_outputs():
    from tilekit.roll.schedule import roll_module

    long = roll_module(replace(gemm(256, 256, 16384, "float16"), ops=(
        replace(gemm(256, 256, 16384, "float16").ops[0], tile=None),)), H100, top_k=2)
    tile = long.ops[0].tile
    assert tile["split_k"] >= 2 and tile["kernel"]["wgmma"]["split_k"]["slices"] == \
        tile["split_k"]
    # priced below the best unsplit tile (the runner-up)
    assert tile["estimate"]["time_us"] < tile["candidates"][0]["estimate"]["time_us"]
    big = roll_module(replace(gemm(4096, 4096, 4096, "float16"), ops=(
        replace(gemm(4096, 4096, 4096, "float16").ops[0], tile=None),)), H100)
    assert "split_k" not in big.ops[0].tile                  # enough output tiles already
    # ... more than the SMs hold at once: persistent, the same record in the roll and codegen
    rolled = big.ops[0].tile["kernel"]["wgmma"]
    assert rolled["schedule"]["persistent"] and rolled["epilogue"] == "tma_store"
    assert generate(big, H100).kernels[0].schedule["wgmma"] == rolled
    kernels = generate(long, H100).kernels
    assert [k.shape for k in kernels] == ["wgmma", "splitk_reduce"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_split_k_kernels_compile_without_spills():
    from tilekit.codegen import compile_module
    module = gemm(256, 256, 4096, "bfloat16", "mk", "nk", (64, 128), 1)
    module = replace(module, ops=(replace(module.ops[0], tile={**module.ops[0].tile,
                                                               "split_k": 8}),))
    report = compile_module(generate(module, H100), None, H100)
    assert not report.problems, report.problems
    assert [k["shape"] for k in report.module.codegen["kernels"]] == ["wgmma", "splitk_reduce"]


# -- the persistent tile scheduler --------------------------------------------------------------

#: A Hopper with 5 SMs of one block each: small grids become persistent (a block per SM,
#: each looping over several tiles) at sizes the emulation runs in a second or two.
SMALL = replace(H100, sm_count=5, max_blocks_per_sm=1)


def grouped_tiles(gm: int, gn: int, group: int = 8) -> list[tuple[int, int]]:
    """The (m, n) tile of each piece of work, in order: groups of `group` M tiles (fewer in
    the last), down M first, then across N (written out here as a list, not as the kernel's
    arithmetic)."""
    order = []
    for first in range(0, gm, group):
        rows = range(first, min(first + group, gm))
        order += [(m, n) for n in range(gn) for m in rows]
    return order


@needs_cxx
def test_persistent_blocks_loop_over_tiles_with_barrier_phases_carried_over():
    """12 tiles on 5 blocks: blocks 0 and 1 run 3 tiles (the last one ragged on both axes),
    the others 2; 6 steps per tile on 4 stages, so the stage and parity counters wrap inside
    a tile and carry over from one tile to the next."""
    module = gemm(200, 136, 328, "float16", "mk", "kn", (64, 64), 1)
    result = generate(module, SMALL)
    (kern,) = result.kernels
    sched = kern.schedule["wgmma"]
    assert sched["schedule"] == {"blocks": 5, "tiles": 12, "persistent": True,
                                 "order": "groups of 8 tiles along M"}
    assert kern.grid[0] == 5 and sched["stages"] == 4
    v = values(module)
    want = reference(module, v)
    assert rel_err(emulate(result.module, v, {})["c"], want) < 1e-5
    assert rel_err(interpreted(result, module, v), want) < 1e-5
    # block 1 alone writes its three tiles, 1, 6 and 11 of the grouped order
    got = emulate_blocks(result.module, 0, v, [1])["c"]
    mine = np.zeros(got.shape, bool)
    for m, n in [grouped_tiles(4, 3)[t] for t in (1, 6, 11)]:
        mine[64 * m:64 * m + 64, 64 * n:64 * n + 64] = True
    assert (~np.isnan(got) == mine).all()
    np.testing.assert_allclose(got[mine], want[mine], rtol=1e-4, atol=1e-3)


def test_the_tile_order_groups_eight_tiles_along_m():
    """30 tiles (10 along M, 3 along N) on 5 blocks: each block's tiles are those of the
    grouped order (the interpreter runs one block at a time)."""
    module = gemm(600, 136, 64, "float16", "mk", "kn", (64, 64), 1)
    result = generate(module, SMALL)
    (kern,) = result.kernels
    assert (kern.grid[0], kern.schedule["wgmma"]["schedule"]["tiles"]) == (5, 30)
    order = grouped_tiles(10, 3)
    assert order[:9] == [(m, 0) for m in range(8)] + [(0, 1)] and order[24] == (8, 0)
    v = values(module)
    for block in (0, 3):
        memory = {tvar(name): (np.asarray(v[name], numpy_dtype(t.dtype)).reshape(-1).copy()
                               if name in v else np.full(t.size, np.nan, np.float32))
                  for name, t in module.tensors.items()}
        interpret(kern.program, memory, blocks=[block])
        got = memory[tvar("c")].reshape(600, 136)
        mine = np.zeros(got.shape, bool)
        for m, n in order[block::5]:
            mine[64 * m:64 * m + 64, 64 * n:64 * n + 64] = True
        assert (~np.isnan(got) == mine).all(), block


@needs_cxx
@pytest.mark.parametrize("what", ["restarted_per_tile"]
                         + (["consumer_restarted", "parity_restarted"] if ALL else []))
def test_a_wrong_stage_or_parity_across_tiles_fails(what):
    """The step counter that gives each step its stage and parity runs across the block's
    tiles; restarting it at every tile (in both roles: the stages are then refilled out of
    phase with the barriers; in the consumers only, or the parity only: they wait for
    phases that never complete) gives wrong numbers or a deadlock."""
    module = gemm(200, 136, 328, "float16", "mk", "kn", (64, 64), 1)
    result = generate(module, SMALL)
    cons = [("const int cst = cg % 4;", "const int cst = cs % 4;"),
            ("const int cph = (cg / 4) & 1;", "const int cph = (cs / 4) & 1;")]
    prod = [("const int pst = pg % 4;", "const int pst = ps % 4;"),
            ("const int pph = (pg / 4) & 1;", "const int pph = (ps / 4) & 1;")]
    edits = {"restarted_per_tile": cons + prod, "consumer_restarted": cons,
             "parity_restarted": cons[1:] + prod[1:]}[what]

    def edit(k):
        source = k.source
        for old, new in edits:
            assert old in source, old
            source = source.replace(old, new)
        return replace(k, source=source)
    bad = _with_source(result, edit)
    v = values(module)
    try:
        got = emulate(bad, v, {})["c"]
    except RuntimeError as e:
        assert "deadlock" in str(e) or "exit 7" in str(e), e
        return
    assert not rel_err(got, reference(module, v)) < 0.05


@needs_cxx
def test_a_stage_released_before_its_wgmma_has_run_gives_wrong_numbers():
    """The consumers keep one wgmma batch in flight and release a step's stage after the
    next step's wait; without that wait the stage is released while its batch may still
    read it (the emulator runs a batch as late as the hardware may: at the wait that
    retires it) and before the warpgroup's other threads are done with it: the producer
    refills it first (wrong numbers) or the barrier's phases run ahead of the slower threads
    (a deadlock)."""
    module = gemm(200, 136, 328, "float16", "mk", "kn", (64, 64), 1)
    result = generate(module, SMALL)
    bad = _with_source(result, _mutated_source("tk_wgmma_wait<1>(acc);", ""))
    v = values(module)
    try:
        got = emulate(bad, v, {})["c"]
    except RuntimeError as e:
        assert "deadlock" in str(e), e
        return
    assert not rel_err(got, reference(module, v)) < 0.05


@needs_cxx
def test_persistent_split_k_varies_the_steps_per_piece():
    """Split-K on a persistent grid: 6 tiles x 3 slices = 18 pieces on 5 blocks (4 or 3
    each), slices of 6, 6 and 4 steps, so the barrier phases carry over pieces of different
    lengths; the reduction kernel adds the slices and runs bias + ReLU."""
    module = gemm(100, 136, 1000, "float16", "mk", "kn", (64, 64), 1, bias_relu=True)
    module = replace(module, ops=(replace(module.ops[0], tile={**module.ops[0].tile,
                                                               "split_k": 3}),
                                  module.ops[1]))
    result = generate(module, SMALL)
    first, second = result.kernels
    assert first.schedule["wgmma"]["schedule"]["tiles"] == 18 and first.grid[0] == 5
    v = values(module)
    assert rel_err(emulate(result.module, v, {})["y"], reference(module, v)) < 1e-5


def test_the_grid_is_one_wave_of_resident_blocks():
    """On the H100: 512 tiles of 128 x 256 (two consumers, one block per SM) on 132 blocks;
    128 tiles stay a block each; 64 x 64 tiles (three blocks per SM by shared memory and
    registers) persistent only beyond 396; tk-codegen --report shows the decision."""
    from tilekit.cli.tk_codegen import report_data
    from tilekit.codegen.module import run_codegen

    def schedule(m, n, block, consumers):
        (k,) = generate(gemm(m, n, 256, "float16", "mk", "kn", block, consumers),
                        H100).kernels
        return k.grid[0], k.schedule["wgmma"]["schedule"]["persistent"]
    assert schedule(4096, 4096, (128, 256), 2) == (132, True)
    assert schedule(2048, 1024, (128, 128), 2) == (128, False)
    assert schedule(1216, 1280, (64, 64), 1) == (380, False)       # 19 x 20 tiles
    assert schedule(1280, 1280, (64, 64), 1) == (396, True)        # 20 x 20
    result = run_codegen(gemm(2048, 2048, 256, "float16", "mk", "kn", (128, 128), 2), H100,
                         None, target="cuda")
    assert report_data(result)["kernels"][0]["tiles"] == "256 on 132 blocks, persistent"


# -- TF32 ---------------------------------------------------------------------------------------

def tf32(module: Module) -> Module:
    """The module as `tk-roll --precision tf32` records it."""
    return replace(module, stages=module.stages + ({"name": "roll",
                                                     "options": {"precision": "tf32"}},))


def tf32_reference(module: Module, v: dict[str, np.ndarray]) -> np.ndarray:
    """The product of the inputs as the tensor cores read them: the upper 19 bits of each
    fp32 word (TMA copies fp32 words; wgmma ignores their low 13 mantissa bits)."""
    cut = {k: (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
               ).view(np.float32) if k in ("a", "b") else x for k, x in v.items()}
    return reference(module, cut)


def test_tf32_wgmma_only_with_the_precision_flag_and_k_major_operands():
    plain = gemm(256, 256, 256, "float32", "mk", "nk", (128, 128), 1)
    assert generate(plain, H100).kernels[0].shape not in ("wgmma", "mma")    # CUDA cores
    (k,) = generate(tf32(plain), H100).kernels
    assert k.shape == "wgmma"
    assert k.schedule["wgmma"]["instruction"] == "wgmma.mma_async.m64n128k8.f32.tf32"
    # 32 fp32 elements per 128-byte swizzle row: boxes of 32, two per operand and step
    assert [m["box"] for m in k.tensor_maps][:2] == [[32, 128], [32, 128]]
    assert k.source.count("tk_tma_load_2d(") == 4 and "tk_wgmma<128, 2, 0, 0>" in k.source
    # an N-major B (a plain x @ w) keeps mma.sync's tf32: wgmma's tf32 reads K-major only
    assert generate(tf32(gemm(256, 256, 256, "float32", "mk", "kn", (128, 128), 1)), H100
                    ).kernels[0].shape == "mma"


TF32_CASES = {
    # persistent (12 tiles on 5 blocks of SMALL), ragged on every axis, one consumer
    "persistent_64x64": (200, 136, 328, (64, 64), 1, SMALL),
    # two consumers, N 256 (2 stages of 96 KiB)
    "two_consumers_n256": (130, 300, 200, (128, 256), 2, H100),
}


@needs_cxx
@pytest.mark.parametrize("case", sorted(TF32_CASES) if ALL else ["persistent_64x64"])
def test_tf32_wgmma_computes_the_tf32_product(case):
    m, n, k, block, consumers, profile = TF32_CASES[case]
    module = tf32(gemm(m, n, k, "float32", "mk", "nk", block, consumers))
    result = generate(module, profile)
    (kern,) = result.kernels
    assert kern.shape == "wgmma"
    v = values(module)
    want = tf32_reference(module, v)
    got = emulate(result.module, v, {})["c"]
    assert rel_err(got, want) < 1e-5
    assert 1e-5 < rel_err(got, reference(module, v)) < 5e-3       # tf32, not fp32
    assert rel_err(interpreted(result, module, v), want) < 1e-5


@needs_cxx
@pytest.mark.parametrize("what", ["second_atom_coordinate"]
                         + (["second_atom_descriptor"] if ALL else []))
def test_a_wrong_tf32_atom_gives_wrong_numbers(what):
    """A step's 64 fp32 k are two swizzle atoms of 32: loading the second from the first's
    k, or reading the second atom's slices from the first, must give wrong numbers."""
    module = tf32(gemm(128, 64, 128, "float32", "mk", "nk", (64, 64), 1))
    result = generate(module, H100)
    edit = {"second_atom_coordinate": _mutated_source("pk0 + 32, po_m", "pk0, po_m"),
            "second_atom_descriptor": _mutated_source("2048 * (kk / 4)", "0 * (kk / 4)")}[what]
    v = values(module)
    assert rel_err(emulate(result.module, v, {})["c"], tf32_reference(module, v)) < 1e-5
    bad = _with_source(result, edit)
    assert not rel_err(emulate(bad, v, {})["c"], tf32_reference(module, v)) < 0.05


# -- the TMA-store epilogue ---------------------------------------------------------------------

@needs_cxx
def test_the_tma_store_epilogue_writes_through_swizzled_strips():
    """An fp16 output (strips of 64 columns) and a fused bias + ReLU stored through shared
    memory with TMA, ragged on both axes; with two warpgroups of consumers, each storing its
    rows."""
    module = gemm(200, 136, 200, "float16", "mk", "kn", (128, 128), 2)
    module = replace(module, tensors={**module.tensors,
                                      "c": replace(module.tensors["c"], dtype="float16")})
    result = generate(module, H100)
    (kern,) = result.kernels
    assert kern.schedule["wgmma"]["epilogue"] == "tma_store"
    assert kern.tensor_maps[2]["box"] == [64, 64] and "tk_named_barrier(cw + 1, 128)" in \
        kern.source
    v = values(module)
    assert rel_err(emulate(result.module, v, {})["c"], reference(module, v)) < 1e-3
    assert rel_err(interpreted(result, module, v), reference(module, v)) < 1e-3
    fused = gemm(100, 72, 136, "bfloat16", "mk", "nk", (64, 128), 1, bias_relu=True)
    (kern,) = generate(fused, H100).kernels
    assert kern.schedule["wgmma"]["epilogue"] == "tma_store"
    assert [m["tensor"] for m in kern.tensor_maps] == ["a", "b", "y"]


def test_the_epilogue_stores_directly_where_tma_cannot():
    """Split-K's partial sums, a stage that stores two tensors, an output whose last axis is
    not N: stores from the registers (recorded with the reason)."""
    both = gemm(100, 72, 136, "float16", "mk", "kn", (64, 64), 1, bias_relu=True)
    both = replace(both, tensors={**both.tensors, "c": replace(both.tensors["c"],
                                                                role="output")},
                   outputs=("c", "y"))
    (kern,) = generate(both, H100).kernels
    assert kern.schedule["wgmma"]["epilogue"] == \
        "direct (the group stores 2 tensors of this stage)"
    assert len(kern.tensor_maps) == 2 and "tk_tma_store" not in kern.source
    split = gemm(100, 136, 1000, "float16", "mk", "kn", (64, 64), 1)
    split = replace(split, ops=(replace(split.ops[0], tile={**split.ops[0].tile,
                                                            "split_k": 3}),))
    assert generate(split, H100).kernels[0].schedule["wgmma"]["epilogue"] == "direct"
    transposed = Module(model="t", tensors={
        "a": Tensor((128, 64), "float16", "input"), "b": Tensor((64, 128), "float16", "input"),
        "c": Tensor((128, 128), "float32", "output")},
        ops=(Op("mm", "c[j,i] += a[i,k] * b[k,j]", tile={
            "block": {"j": 64, "i": 64}, "thread": {"j": 1, "i": 32}, "step": {"k": 64}}),),
        inputs=("a", "b"), outputs=("c",), stages=({"name": "import"},))
    (kern,) = generate(transposed, H100).kernels
    assert kern.shape == "wgmma" and kern.schedule["wgmma"]["epilogue"] == "direct"


@needs_cxx
@pytest.mark.parametrize("what", ["no_wait_before_reuse"]
                         + (["second_buffer_overrun", "unswizzled", "no_wait_before_exit"]
                            if ALL else []))
def test_a_wrong_tma_store_fails(what):
    """Writing a strip before the store that last read its buffer is done (one buffer: the
    previous strip's; two: the one before), writing it without the swizzle the tensor map
    reads it with, or exiting before the stores are done fails (wrong numbers, or the
    emulator's check)."""
    if what == "second_buffer_overrun":     # N 128: 4 fp32 strips per tile on 2 buffers
        module = gemm(200, 136, 328, "float16", "mk", "kn", (128, 128), 1)
        result = generate(module, SMALL)
        assert result.kernels[0].schedule["wgmma"]["store_buffers"] == 2
    else:
        module = gemm(200, 136, 328, "float16", "mk", "kn", (64, 64), 1)
        result = generate(module, SMALL)
    edit = {"no_wait_before_reuse": _mutated_source("tk_bulk_wait_read<0>();", ""),
            "second_buffer_overrun": _mutated_source("tk_bulk_wait_read<1>();",
                                                     "tk_bulk_wait_read<2>();"),
            "unswizzled": _mutated_source(" ^ ((row % 8) * 16)", ""),
            "no_wait_before_exit": _mutated_source("tk_bulk_wait<0>();", "")}[what]
    bad = _with_source(result, edit)
    v = values(module)
    assert rel_err(emulate(result.module, v, {})["c"], reference(module, v)) < 1e-5
    try:
        got = emulate(bad, v, {})["c"]
    except RuntimeError as e:
        assert "did not wait" in str(e), e
        return
    assert not rel_err(got, reference(module, v)) < 0.05


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_tma_store_epilogue_is_conflict_free_and_coalesced(dtype):
    """The interpreter's counters on sampled blocks: strips written to shared memory without
    bank conflicts (fp32: lanes 2 and 3 of a row write the other value of their pair) and
    whole rows stored by TMA."""
    from tilekit.codegen.report import program_report

    module = gemm(256, 512, 128, "float16", "mk", "kn", (128, 256), 2)
    module = replace(module, tensors={**module.tensors,
                                      "c": replace(module.tensors["c"], dtype=dtype)})
    (kern,) = generate(module, H100).kernels
    assert kern.schedule["wgmma"]["epilogue"] == "tma_store"
    report = program_report(kern.program, H100)
    assert report["bank_conflict_degree"] == 1.0 and report["coalescing"] == 1.0, report
