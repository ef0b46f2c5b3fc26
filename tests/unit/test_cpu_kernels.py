"""The CPU target's own kernels (tilekit.codegen.cpu): packed-panel GEMMs and loop nests in
vector lanes, their tiles (tilekit.schedule.cpu), and their results against the reference on
ragged shapes, convolutions with padding and strides, batched and scaled products, and
reductions over contiguous and strided axes."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from tilekit.codegen import generate
from tilekit.codegen.cxx import find_cxx
from tilekit.hw import load_profile
from tilekit.onnx import import_model
from tilekit.runtime.compiled import CpuProgram
from tilekit.runtime.cpu import run_module
from tilekit.schedule.cpu import (HOST_DEFAULTS, CpuMachine, CpuTiles, cpu_tiles, gemm_blocks,
                                  rows_per_block)
from tilekit.tile import cpp, cuda
from tilekit.tile import expr as tx
from tilekit.tile.nodes import Evaluate, Kernel

needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
#: One worker runs this file (an xdist group): the generated kinds (kinds) are made once,
#: not once per worker.
pytestmark = pytest.mark.xdist_group("cpu-kernels")




# -- tiles ---------------------------------------------------------------------------------

def test_tiles_follow_registers_and_caches():
    avx2 = cpu_tiles()
    assert (avx2.mr, avx2.nr, avx2.kc) == (6, 16, 256)      # 12 + 2 + 1 of 16 registers
    assert avx2.mc % avx2.mr == 0 and avx2.nc % avx2.nr == 0
    assert avx2.mc * avx2.kc * 4 <= HOST_DEFAULTS.l2_bytes // 4
    assert avx2.kc * avx2.nc * 4 <= HOST_DEFAULTS.l2_bytes // 2
    avx512 = CpuMachine("avx512", 8, 16, 32, 48 * 1024, 2 * 1024 * 1024)
    t = _tiles(avx512)
    assert (t.mr, t.nr) == (8, 32)      # 14 rows' vectors fit, 8 row pointers of 16 integer
    assert t.kc * t.nr * 4 <= avx512.l1_bytes // 2
    aarch64 = CpuMachine("sve-512", 8, 16, 32, 64 * 1024, 1024 * 1024, integer_registers=31)
    assert _tiles(aarch64).mr == 14     # 28 + 2 + 1 of 32 vector registers, 31 integer ones
    neon = CpuMachine("neon", 4, 4, 32, 64 * 1024, 1024 * 1024, integer_registers=31)
    n = _tiles(neon)
    assert (n.mr, n.nr) == (6, 16)                           # 24 + 4 + 1 of 32 registers


def _tiles(machine: CpuMachine) -> CpuTiles:
    import tilekit.schedule.cpu as cpu

    original = cpu.machine_of
    try:
        cpu.machine_of = lambda profile: machine
        return cpu_tiles(object())
    finally:
        cpu.machine_of = original


def test_a_varying_k_keeps_the_output_tile_bound():
    """One step over K needs no output tile, so its bound goes; a K whose extent varies keeps
    the tile in the code (one structure for every size), and so keeps the bound too."""
    from tilekit.schedule.cpu import C_TILE_BYTES

    t = cpu_tiles()
    fixed = gemm_blocks(t, 2048, 512, 64, 1)
    varying = gemm_blocks(t, 2048, 512, 64, 1, k_varies=True)
    assert fixed.k_steps == varying.k_steps == 1
    assert fixed.mc * fixed.nc * 4 > C_TILE_BYTES
    assert varying.mc * varying.nc * 4 <= C_TILE_BYTES


def test_a_k_of_a_few_steps_takes_one():
    """K up to `ONE_STEP_MOST` steps of the L1-sized `kc` goes in one step (no output tile
    between steps; the epilogue on each strip while in L1); a longer K in even steps of at
    most `kc`; a K whose extent varies in steps of at most `kc` however short."""
    from tilekit.schedule.cpu import ONE_STEP_MOST

    t = cpu_tiles()
    most = ONE_STEP_MOST * t.kc
    assert ONE_STEP_MOST > 1
    for k in (t.kc + 1, most):
        g = gemm_blocks(t, 256, 784, k, 1)
        assert g.k_steps == 1 and g.kc == k, (k, g)
    longer = gemm_blocks(t, 256, 784, most + 1, 1)
    assert longer.k_steps == ONE_STEP_MOST + 1 and longer.kc <= t.kc
    varying = gemm_blocks(t, 256, 784, t.kc + 1, 1, k_varies=True)
    assert varying.k_steps == 2 and varying.kc <= t.kc


def test_gemm_blocks_split_n_evenly_over_the_cores():
    t = cpu_tiles()                                          # 2 cores
    cores = t.machine.cores
    g = gemm_blocks(t, 128, 2304, 768, 1)
    assert g.m_blocks == 1 and g.mc == 128                  # M whole: B packed once
    assert (g.m_blocks * g.n_blocks) % cores == 0           # every core as busy
    assert g.kc * g.k_steps >= 768 and g.kc % 16 == 0 or g.k_steps == 1
    even = gemm_blocks(t, 1300, 16, 64, 1)                  # N is one micro-tile: M splits
    assert even.m_blocks == 2 and even.mc == 654            # one per core, whole micro-tiles
    assert even.mc * even.m_blocks >= 1300
    small = gemm_blocks(t, 8, 8, 8, 1)
    assert small.mc * small.m_blocks >= 8 and small.nc == 16 and small.k_steps == 1
    wide = gemm_blocks(t, 64, 3136, 576, 1)                 # micro-panels, B panel in L2
    assert wide.nc % 16 == 0 and wide.nc * wide.kc * 4 <= t.machine.l2_bytes // 2
    assert (wide.m_blocks * wide.n_blocks) % cores == 0
    deep = gemm_blocks(t, 512, 49, 4608, 1)                 # 7 x 7 pixels, 9 MiB of A:
    assert deep.n_blocks == 1 and deep.m_blocks == cores    # M splits, A is read once


def test_gemm_blocks_balance_the_cores_when_n_has_an_odd_number_of_panels():
    """196 pixels (14 x 14) are 7 micro-panels of 32 on AVX-512: split over two cores they
    are 4 and 3 (one core idle an eighth of the time); split M instead, each core takes half
    the filters and all 7. So when B's panel, bounded for this GEMM's own K step, fits half
    of L2 whole: a 1x1 convolution of ResNet-50's 14 x 14 layers (1024 filters, K = 256)
    and a 3 x 3 one (256 filters, K = 2304)."""
    t = cpu_tiles(load_profile("icelake").with_cpu(cores=2))
    for m, k in ((1024, 256), (256, 2304)):
        g = gemm_blocks(t, m, 196, k, 1)
        assert g.n_blocks == 1 and g.m_blocks == 2 and g.nc == 224, (m, k, g)
        assert g.kc * g.nc * 4 <= t.machine.l2_bytes // 2


def test_a_gemm_takes_fewer_rows_per_micro_tile_where_that_pads_less():
    """gemm_mr: down to two thirds of the register tile's rows, when the padded rows shrink
    by at least 1 - MR_PADDING; the register tile's rows otherwise."""
    from tilekit.schedule.cpu import gemm_mr, register_rows

    assert register_rows(HOST_DEFAULTS, 16) == 6
    assert gemm_mr(6, 32) == 4          # 36 rows in tiles of 6, 32 in tiles of 4
    assert gemm_mr(6, 49) == 5          # 54 / 50 / 52
    assert gemm_mr(6, 128) == 6         # 132 / 130 / 128: within 5%
    assert gemm_mr(6, 36) == 6 and gemm_mr(6, 1000) == 6
    assert gemm_mr(16, 33) == 11        # 48 rows in tiles of 16, 33 in tiles of 11
    assert gemm_mr(1, 7) == 1


def test_rows_per_block():
    t = cpu_tiles()
    assert rows_per_block(1, 100, t) == 1
    per = rows_per_block(1000, 4, t)
    assert -(-1000 // per) >= t.machine.cores * t.blocks_per_core
    assert rows_per_block(10, 10 ** 6, t) == 1


def test_a_gpu_profile_gives_the_host_defaults():
    assert cpu_tiles(load_profile("h100")).machine == HOST_DEFAULTS


# -- the micro-kernel intrinsic ------------------------------------------------------------

def test_gemm_micro_prints_for_cpus_only():
    call = tx.call("gemm_micro", tx.const(6), tx.const(16), tx.const(16), tx.const(0),
                   tx.const(0), tx.const(8), tx.const(0), tx.const(16), tx.const(0))
    k = Kernel("k", (), (), Evaluate(call), 1, 1)
    assert "tk_gemm_micro<6, 16>(0, 0, 8, 0, 16, 0)" in cpp.kernel_text(k)
    with pytest.raises(Exception, match="gemm_micro"):
        cuda.kernel_text(k)
    rows = tx.call("gemm_micro_rows", tx.const(6), tx.const(8), tx.const(16),
                   *[tx.const(0)] * 8)
    k = Kernel("k", (), (), Evaluate(rows), 1, 1)      # 8 columns of a panel of 16
    assert "tk_gemm_micro_rows<6, 8, 16>(0, 0, 0, 0, 0, 0, 0, 0)" in cpp.kernel_text(k)
    with pytest.raises(Exception, match="gemm_micro_rows"):
        cuda.kernel_text(k)
    pack = tx.call("pack_row", tx.const(16), *[tx.const(0)] * 3, tx.const(0.0), tx.const(0))
    k = Kernel("k", (), (), Evaluate(pack), 1, 1)
    assert "tk_pack_row<16>(0, 0, 0, 0.0f, 0)" in cpp.kernel_text(k)
    with pytest.raises(Exception, match="pack_row"):
        cuda.kernel_text(k)
    gather = tx.call("gather_row", tx.const(32), *[tx.const(0)] * 4, tx.const(0.0))
    k = Kernel("k", (), (), Evaluate(gather), 1, 1)
    assert "tk_gather_row<32>(0, 0, 0, 0, 0.0f)" in cpp.kernel_text(k)
    with pytest.raises(Exception, match="gather_row"):
        cuda.kernel_text(k)


# -- one model of every kind ---------------------------------------------------------------

def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(1)

    def w(name, *shape):
        return nh.from_array(rng.standard_normal(shape).astype(np.float32), name)

    vi = h.make_tensor_value_info
    nodes = [
        # a ragged GEMM whose M is two axes (2 x 7), K not a multiple of 16; bias then ReLU
        h.make_node("MatMul", ["a", "wb"], ["mm"]),
        h.make_node("Add", ["mm", "bias19"], ["mmb"]),
        h.make_node("Relu", ["mmb"], ["mm_out"]),
        # K over several steps of the cache tile
        h.make_node("MatMul", ["long", "wlong"], ["long_out"]),
        # batched: both reads use the batch axes (attention scores)
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        h.make_node("MatMul", ["q", "kt"], ["scores"]),
        # Gemm with transB and alpha: a scaled product with B stored [n][k]
        h.make_node("Gemm", ["g", "wg", "bias19"], ["gemm_out"], transB=1, alpha=0.5),
        # Gemm with transA: A stored [k][m], packed (its K axis is not contiguous)
        h.make_node("Gemm", ["gt", "wb"], ["gemmt_out"], transA=1),
        # a padded, strided convolution (im2col through tables) and a 1x1 one (row-major)
        h.make_node("Conv", ["x", "wc", "bc"], ["conv_out"], pads=[1, 1, 1, 1],
                    strides=[2, 2]),
        h.make_node("Conv", ["x", "w1"], ["conv1_out"]),
        # grouped (2 groups of 2 channels), strided, padded on one side (a loop nest: the
        # contraction has no GEMM view)
        h.make_node("Conv", ["x4", "wg2"], ["convg_out"], group=2, pads=[0, 1, 2, 0],
                    strides=[2, 1]),
        # depthwise (no GEMM view: an accumulator row over the output's width)
        h.make_node("Conv", ["x", "wd"], ["dw_out"], group=3, pads=[1, 1, 1, 1]),
        # a row longer than an accumulator row (chunks of 256 points), and a window of 4
        # channels x 3 x 3 points (the channels in a loop, the 3 x 3 unrolled)
        h.make_node("Conv", ["wide", "wdw"], ["dw_wide"], group=2, pads=[0, 2, 0, 2],
                    kernel_shape=[1, 5]),
        h.make_node("Conv", ["x8", "wg4"], ["convg4_out"], group=2, pads=[1, 1, 1, 1]),
        # reductions: over channels (strided) and over the last axis (contiguous)
        h.make_node("ReduceSum", ["x", "axes1"], ["rsum"], keepdims=1),
        h.make_node("Softmax", ["long"], ["soft"], axis=-1),
        h.make_node("ReduceMax", ["x", "axes3"], ["rmax"], keepdims=0),
    ]
    inputs = [vi("a", T.FLOAT, [2, 7, 33]), vi("long", T.FLOAT, [5, 600]),
              vi("q", T.FLOAT, [2, 3, 5, 8]), vi("k", T.FLOAT, [2, 3, 9, 8]),
              vi("g", T.FLOAT, [7, 33]), vi("x", T.FLOAT, [2, 3, 11, 13]),
              vi("gt", T.FLOAT, [33, 7]), vi("x4", T.FLOAT, [1, 4, 9, 10]),
              vi("wide", T.FLOAT, [1, 2, 2, 300]), vi("x8", T.FLOAT, [1, 8, 5, 6])]
    outputs = [vi(n, T.FLOAT, None) for n in ("mm_out", "long_out", "scores", "gemm_out",
                                              "gemmt_out", "convg_out",
                                              "conv_out", "conv1_out", "dw_out", "dw_wide",
                                              "convg4_out", "rsum",
                                              "soft", "rmax")]
    inits = [w("wb", 33, 19), w("bias19", 19), w("wlong", 600, 40), w("wg", 19, 33),
             w("wc", 5, 3, 3, 3), w("wg2", 14, 2, 3, 3), w("bc", 5), w("w1", 4, 3, 1, 1), w("wd", 3, 1, 3, 3),
             w("wdw", 2, 1, 1, 5), w("wg4", 6, 4, 3, 3),
             nh.from_array(np.array([1], np.int64), "axes1"),
             nh.from_array(np.array([3], np.int64), "axes3")]
    graph = h.make_graph(nodes, "kinds", inputs, outputs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


@pytest.fixture(scope="session")
def kinds():
    imported = import_model(_model())
    module = imported.module
    generated = generate(module, target="cpu").module
    return module, generated, imported.weights


def _shapes(generated) -> dict[str, tuple[str, dict]]:
    return {op: (k["shape"], k["schedule"]) for k in generated.codegen["kernels"]
            for op in k["ops"]}


def _op_of(module, output: str) -> str:
    from tilekit.ir.graph import op_tensors

    return next(op.name for op in module.ops if output in op_tensors(op)[1])


def test_each_op_gets_its_cpu_shape(kinds):
    module, generated, _ = kinds
    shapes = _shapes(generated)
    for out in ("mm", "long_out", "scores", "gemm_out_mm", "conv_out_conv", "conv1_out"):
        assert shapes[_op_of(module, out)][0] == "cpu_gemm", out
    conv = shapes[_op_of(module, "conv_out_conv")][1]["gemm"]
    assert conv["m"] == ["f"] and conv["n"] == ["n", "h", "w"]   # B: the pixels, im2col
    # A read in place where its K axes are contiguous (a matmul's rows, batched rows); a
    # convolution's filters (a weight) from panels packed once; Gemm's transposed A stays
    # packed per run
    for out in ("mm", "long_out", "scores", "gemm_out_mm"):
        assert shapes[_op_of(module, out)][1]["gemm"]["a"] == "rows", out
    for out in ("conv_out_conv", "conv1_out"):
        assert shapes[_op_of(module, out)][1]["gemm"]["a"] == "weight panels", out
    assert shapes[_op_of(module, "gemmt_out")][1]["gemm"]["a"] == "packed"
    scores = shapes[_op_of(module, "scores")][1]["gemm"]
    assert len(scores["batch"]) == 2
    loops = {out: shapes[_op_of(module, out)]
             for out in ("dw_out", "rsum", "rmax", "soft_max", "mm_out")}
    assert all(s == "cpu_loops" for s, _ in loops.values())
    assert loops["dw_out"][1]["reduction"] == "accumulator row"
    assert loops["rsum"][1]["reduction"] == "accumulator row"
    assert loops["rmax"][1]["reduction"] == "accumulator row"     # 13 points: too short
    assert loops["soft_max"][1]["reduction"] == "lane partials"   # 600 contiguous points
    assert loops["mm_out"][1]["reduction"] == "pointwise"


def test_an_accumulator_row_unrolls_a_small_window(kinds):
    """A window of up to UNROLLED_WINDOW points is straight code (no loop over its axes);
    a larger one keeps its leading axes in loops; a row wider than an accumulator row is
    run in chunks."""
    import re

    module, generated, _ = kinds
    loops = {}
    for k in generated.codegen["kernels"]:
        for op in k["ops"]:
            loops[op] = set(re.findall(r"for \(int (\w+) =", k["source"]))
    assert not loops[_op_of(module, "dw_out")] & {"a_kh", "a_kw", "j0"}
    assert "a_c" in loops[_op_of(module, "convg4_out")]      # 4 x 3 x 3: channels looped
    assert not loops[_op_of(module, "convg4_out")] & {"a_kh", "a_kw"}
    assert "j0" in loops[_op_of(module, "dw_wide")]           # 300 points: chunks of 256


@needs_cxx
def test_a_padded_window_reads_staged_rows():
    """An accumulator row whose window crosses the padding stages the rows it reads (the
    padding included) once per output row, so each window point is a vector loop with
    constant bounds and no guard: a 3 x 3 depthwise convolution, the same dilated by 2 (the
    window's offsets step by 2), a 3 x 3 max pool of stride 1 (padding -inf) and a grouped
    convolution whose channels are a loop (staged per channel). A strided window stages its
    rows in phases (stride 2: even and odd values; a 2 x 2 pool of stride 3 uses 2 of 3),
    each point a contiguous read of one phase; one strided and dilated (no window axis of
    coefficient 1 sets a phase) reads the tensor. All equal the reference, on one thread and
    on two."""
    import re

    rng = np.random.default_rng(8)
    nodes = [h.make_node("Conv", ["x", "wd"], ["dw"], group=6, pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "wd"], ["dil"], group=6, pads=[2, 2, 2, 2],
                         dilations=[2, 2]),
             h.make_node("MaxPool", ["x"], ["pool"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "wg"], ["grp"], group=2, pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "wd"], ["strided"], group=6, pads=[1, 1, 1, 1],
                         strides=[2, 2]),
             h.make_node("MaxPool", ["x"], ["pool3"], kernel_shape=[2, 2], pads=[1, 1, 1, 1],
                         strides=[3, 3]),
             h.make_node("Conv", ["x", "wd"], ["dilstr"], group=6, pads=[2, 2, 2, 2],
                         strides=[2, 2], dilations=[2, 2])]
    imported, generated, source = _windows(nodes, [1, 6, 9, 20], {
        "wd": rng.standard_normal((6, 1, 3, 3)), "wg": rng.standard_normal((4, 3, 3, 3))})
    module = imported.module
    for out in ("dw", "dil", "pool", "grp", "strided", "pool3"):
        src = source[out]
        assert "srow0[" in src, out
        points = re.findall(r"accrow\[jj\] = .*|accrow\[jj\] [+]= .*", src)
        assert points and not any("tk_in" in line or "t_x[" in line for line in points), out
        assert ("in 2 phases" in src) == (out in ("strided", "pool3")), out
    assert "srow0[" not in source["dilstr"]
    inputs = {"x": rng.standard_normal((1, 6, 9, 20)).astype(np.float32)}
    _equals_reference(module, generated, inputs, imported.weights)


def _import(nodes, name: str, inputs, outputs, initializers=()):
    """The imported model of an ONNX graph of `nodes` (opset 18)."""
    graph = h.make_graph(nodes, name, inputs, outputs, list(initializers))
    return import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))


@needs_cxx
@pytest.mark.parametrize("height", [8, 7, 11])
def test_output_rows_side_by_side_share_their_staged_rows(height):
    """Output rows of a padded window run side by side (`window_rows`: the largest divisor
    of the row axis up to 8) on input rows staged once for all of them: a 3 x 3 depthwise
    convolution (8 rows read 10 input rows), the same strided by 2 along the rows only (8
    rows read 17), dilated by 2 (8 rows read 12), padded on one side, and a 3 x 3 max pool;
    a 1 x 3 window shares no rows and runs row by row, and so does the strided one when its
    rows are prime (11). All equal the reference, on one thread and on two."""
    import re

    rng = np.random.default_rng(12)
    nodes = [h.make_node("Conv", ["x", "wd"], ["dw"], group=6, pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "wd"], ["rows2"], group=6, pads=[1, 1, 1, 1],
                         strides=[2, 1]),
             h.make_node("Conv", ["x", "wd"], ["dil"], group=6, pads=[2, 2, 2, 2],
                         dilations=[2, 2]),
             h.make_node("Conv", ["x", "wd"], ["lop"], group=6, pads=[2, 1, 0, 1]),
             h.make_node("MaxPool", ["x"], ["pool"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "wr"], ["row"], group=6, pads=[0, 1, 0, 1])]
    imported, generated, source = _windows(nodes, [1, 6, 2 * height, 21], {
        "wd": rng.standard_normal((6, 1, 3, 3)), "wr": rng.standard_normal((6, 1, 1, 3))})
    # output rows side by side (2 * height rows; the strided one height), and the input
    # rows they stage: 3 x 3 windows side + 2, strided 2 * (side - 1) + 3, dilated
    # side - 1 + 2 * 2 + 1
    side = {8: 8, 7: 7, 11: 2}[height]
    side2 = {8: 8, 7: 7, 11: 1}[height]
    want = {"dw": (side, side + 2), "rows2": (side2, 2 * (side2 - 1) + 3),
            "dil": (side, side + 4), "lop": (side, side + 2), "pool": (side, side + 2),
            "row": (1, 1)}
    for out, (step, staged) in want.items():
        src = source[out]
        assert (f"r += {step})" in src) == (step > 1), out
        assert re.search(rf"float srow0\[{staged}\]\[", src), (out, staged)
    inputs = {"x": rng.standard_normal((1, 6, 2 * height, 21)).astype(np.float32)}
    _equals_reference(imported.module, generated, inputs, imported.weights)


def _windows(nodes, shape: list[int], weights: dict):
    """A model of `nodes` over one input `x` of `shape`, each node's one output a model
    output: (its import, the CPU codegen, each output's kernel source)."""
    vi = h.make_tensor_value_info
    outs = [n.output[0] for n in nodes]
    imported = _import(nodes, "windows", [vi("x", T.FLOAT, shape)],
                       [vi(n, T.FLOAT, None) for n in outs],
                       [nh.from_array(w.astype(np.float32), name)
                        for name, w in weights.items()])
    generated = generate(imported.module, target="cpu").module
    source = {op: k["source"] for k in generated.codegen["kernels"] for op in k["ops"]}
    return imported, generated, {out: source[_op_of(imported.module, out)] for out in outs}


def test_window_rows_divide_the_row_axis_and_the_block():
    from tilekit.schedule.cpu import window_rows

    assert [window_rows(n) for n in (56, 28, 14, 7, 13, 1, 12)] == [8, 7, 7, 7, 1, 1, 6]
    assert window_rows(56, per=20) == 4 and window_rows(56, per=9) == 1


@needs_cxx
def test_lane_partial_rows_run_in_groups_of_four():
    """A loop nest without a vector axis whose rows reduce in lane partials runs its rows 4
    at a time along the innermost row axis (ROW_GROUP): a matrix-vector product with rows of
    weights (64 rows, 8 per block) and a sum over the last axis of [4, 8, 40] (groups within
    each of the 4 outer rows: the vector they share is one expression); 24 rows in blocks of
    3 run one by one. Each equals the reference, on one thread and on two."""
    rng = np.random.default_rng(9)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Gemm", ["v", "w"], ["mv"], transB=1),
             h.make_node("Gemm", ["v", "w24"], ["mv24"], transB=1),
             h.make_node("ReduceSum", ["x", "axes"], ["rs"], keepdims=0)]
    imported = _import(
        nodes, "groups", [vi("v", T.FLOAT, [1, 40]), vi("x", T.FLOAT, [4, 8, 40])],
        [vi(n, T.FLOAT, None) for n in ("mv", "mv24", "rs")],
        [nh.from_array(rng.standard_normal((64, 40)).astype(np.float32), "w"),
         nh.from_array(rng.standard_normal((24, 40)).astype(np.float32), "w24"),
         nh.from_array(np.array([2], np.int64), "axes")])
    module = imported.module
    generated = generate(module, target="cpu").module
    kernels = {op: k for k in generated.codegen["kernels"] for op in k["ops"]}
    for out, grouped in (("mv", True), ("mv24", False), ("rs", True)):
        k = kernels[_op_of(module, out)]
        assert k["schedule"]["reduction"] == "lane partials", out
        assert ("part3[" in k["source"]) == grouped, out
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    _equals_reference(module, generated, inputs, imported.weights)


def _close(module, got, want, threads: int) -> None:
    for out in module.outputs:
        np.testing.assert_allclose(got[out], want[out], rtol=2e-5, atol=2e-5,
                                   err_msg=f"{out}, {threads} thread(s)")


def _equals_reference(module, generated, inputs, weights) -> None:
    """The compiled program of `generated` equals the reference executor on `module`, on one
    thread and on two."""
    want = run_module(module, inputs, weights)
    for threads in (1, 2):
        _close(module, CpuProgram(generated, threads).run(inputs, weights), want, threads)


@needs_cxx
def test_each_kind_equals_the_reference(kinds):
    module, generated, weights = kinds
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    _equals_reference(module, generated, inputs, weights)


@needs_cxx
def test_a_long_sum_is_as_accurate_as_blocked_summation():
    """A dot product of 8192 terms summed in blocks of the cache tile (runtime_cpu.h): its
    error against float64 stays near a blocked sum's, far below one sequential sum's."""
    vi = h.make_tensor_value_info
    k = 8192
    imported = _import([h.make_node("MatMul", ["x", "w"], ["y"])], "long",
                       [vi("x", T.FLOAT, [6, k])], [vi("y", T.FLOAT, None)],
                       [nh.from_array(np.abs(np.random.default_rng(2).standard_normal(
                           (k, 16))).astype(np.float32), "w")])
    module = generate(imported.module, target="cpu").module
    x = np.abs(np.random.default_rng(3).standard_normal((6, k))).astype(np.float32)
    got = CpuProgram(module, 1).run({"x": x}, imported.weights)["y"].astype(np.float64)
    exact = x.astype(np.float64) @ imported.weights["w"].astype(np.float64)
    err = np.abs(got - exact).max() / np.abs(exact).max()
    # positive terms: a sequential float32 sum of 8192 drifts to ~1e-5; blocks of 256 stay
    # within a few 1e-7
    assert err < 2e-6, err


@needs_cxx
def test_tall_blocks_run_their_rows_in_l2_slices():
    """M above the A slice of L2 (`tiles.mc` rows) stays whole in a block, N split over the
    cores: the block runs its rows slice by slice on one packed B panel. A convolution of
    200 filters (A a weight packed once, tail rows) with padding on 30 x 11 pixels (rows of
    11), and a matmul whose M is not a multiple of the micro-tile; both against the
    reference."""
    rng = np.random.default_rng(4)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["conv"], ["y"]),
             h.make_node("MatMul", ["a", "b"], ["z"])]
    imported = _import(
        nodes, "tall", [vi("x", T.FLOAT, [1, 5, 30, 11]), vi("a", T.FLOAT, [203, 37])],
        [vi("y", T.FLOAT, None), vi("z", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((200, 5, 3, 3)).astype(np.float32), "w"),
         nh.from_array(rng.standard_normal((37, 160)).astype(np.float32), "b")])
    module = imported.module
    generated = generate(module, target="cpu").module
    tiles = cpu_tiles()
    gemms = [k for k in generated.codegen["kernels"] if k["shape"] == "cpu_gemm"]
    assert len(gemms) == 2
    # the padded stride-1 window's rows of B are masked vector copies made by the micro-tiles
    # of the first row as they compute (runtime_cpu.h tk_gemm_micro_fill, the lanes' masks
    # from tk_lane_bits), its filters (A) a weight's panels packed once (tk_packed_panels);
    # the matmul's B is a weight, packed once, not per run
    conv, matmul = sorted(gemms, key=lambda k: k["schedule"]["gemm"]["b"] == "weight panels")
    mr = conv["schedule"]["gemm"]["micro"][0]
    assert conv["schedule"]["gemm"]["a"] == "weight panels"
    assert re.search(rf"tk_gemm_micro_fill<{mr}, \d+, 16, \d+, 0>", conv["source"])
    assert "tk_lane_bits<16>" in conv["source"] and "tk_pack_row" not in conv["source"]
    assert f"tk_packed_panels<{mr}>" in conv["source"]
    assert "tk_packed_panels<16>" in matmul["source"] and "tk_pack_row" not in matmul["source"]
    assert "_fill<" not in matmul["source"]
    for k in gemms:
        mc = k["schedule"]["gemm"]["blocks"][0]
        assert mc > tiles.mc and "for (int ic = 0;" in k["source"], k["name"]
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    _equals_reference(module, generated, inputs, imported.weights)


def _rebinding_weights_repacks(module, generated, weights, rng) -> None:
    """Runs with the weights, other weights, then the first ones again, each equal to the
    reference with the weights it was given, on one thread and on two."""
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    other = {n: (w * -0.5 + 0.25).astype(w.dtype) for n, w in weights.items()}
    for threads in (1, 2):
        program = CpuProgram(generated, threads)
        for given in (weights, other, weights):
            _close(module, program.run(inputs, given), run_module(module, inputs, given),
                   threads)


@needs_cxx
def test_weights_as_b_are_packed_once_and_repacked_when_they_change():
    """A weight as the GEMM's B (a MatMul's [K, N] and a Gemm's transposed [N, K], N not a
    whole number of micro-panels) is read from panels packed once per loaded program; an
    activation as B is still packed per run. With several steps over K (a MatMul of 1000
    points) the micro-tiles walk B's micro-panels outside, and the first `nr / 16` of each
    column prefetch their share of the next column's panel, a line a step
    (`tk_gemm_micro_rows_ahead<..., 16>`). Binding other weights re-packs: each run equals
    the reference with the weights it was given, on one thread and on two (N split)."""
    rng = np.random.default_rng(5)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("MatMul", ["x", "w"], ["h"]),
             h.make_node("Gemm", ["h", "v", "c"], ["y"], transB=1),
             h.make_node("MatMul", ["h", "x2"], ["z"]),
             h.make_node("MatMul", ["x3", "u"], ["l"])]
    imported = _import(
        nodes, "weights", [vi("x", T.FLOAT, [40, 24]), vi("x2", T.FLOAT, [70, 36]),
                           vi("x3", T.FLOAT, [20, 1000])],
        [vi("y", T.FLOAT, None), vi("z", T.FLOAT, None), vi("l", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((24, 70)).astype(np.float32), "w"),
         nh.from_array(rng.standard_normal((50, 70)).astype(np.float32), "v"),
         nh.from_array(rng.standard_normal(50).astype(np.float32), "c"),
         nh.from_array(rng.standard_normal((1000, 40)).astype(np.float32), "u")])
    module = imported.module
    generated = generate(module, target="cpu").module
    gemms = {k["schedule"]["gemm"]["b"] for k in generated.codegen["kernels"]
             if k["shape"] == "cpu_gemm"}
    assert gemms == {"weight panels", "packed"}
    long = next(k for k in generated.codegen["kernels"] if _op_of(module, "l") in k["ops"])
    gemm = long["schedule"]["gemm"]
    nr = gemm["micro"][1]
    assert gemm["b"] == "weight panels" and gemm["blocks"][2] < 1000, gemm
    ahead = re.search(rf"if \(t < {max(1, nr // 16)}\) {{\s*tk_gemm_micro_rows_ahead<\d+, {nr}, "
                      rf"{nr}, 16>\([^;]*(tk_packed_panels<{nr}>\([^;]*?) \+ jr, k0\), [^;]*"
                      rf"(tk_packed_panels<{nr}>\([^;]*?) \+ jr \+ 1, k0 \+ t \* 16 \* kc / "
                      rf"{nr}\)\);\s*}}\s*else {{\s*tk_gemm_micro_rows<", long["source"])
    assert ahead and ahead[1] == ahead[2], "the next column's panel, a share per micro-tile"
    _rebinding_weights_repacks(module, generated, imported.weights, rng)


@needs_cxx
def test_weights_as_a_are_packed_once_prefetched_and_repacked_when_they_change():
    """A convolution's filters as the GEMM's A (40 filters: rows past the last micro-tile's
    are zeros of the pack) are read from panels packed once per loaded program, and the A
    panel of the next row of micro-tiles is prefetched while a micro-tile runs, `mr` floats
    a step (`tk_gemm_micro_ahead`, the panel one row of micro-tiles on). With several steps
    over K (128 channels x 3 x 3 = 1152 points) the micro-tiles walk B's micro-panels
    outside and each prefetches; with one step (a 1 x 1 convolution over 24 channels) the
    rows are outside and only the first micro-tile of each strip does (the others read the
    panel from L1). Binding other weights re-packs: each run equals the reference with the
    weights it was given, on one thread and on two."""
    rng = np.random.default_rng(8)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["h"], ["y"]),
             h.make_node("Conv", ["x2", "f"], ["z"])]
    imported = _import(
        nodes, "filters", [vi("x", T.FLOAT, [1, 128, 9, 9]), vi("x2", T.FLOAT, [1, 24, 6, 6])],
        [vi("y", T.FLOAT, None), vi("z", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((40, 128, 3, 3)).astype(np.float32), "w"),
         nh.from_array(rng.standard_normal((40, 24, 1, 1)).astype(np.float32), "f")])
    module = imported.module
    generated = generate(module, target="cpu").module
    by_out = {_op_of(module, out): out for out in ("h", "z")}
    kernels = {by_out[op]: k for k in generated.codegen["kernels"] for op in k["ops"]
               if op in by_out}
    for out, k in kernels.items():
        gemm = k["schedule"]["gemm"]
        assert gemm["m"] == ["f"] and gemm["a"] == "weight panels", (out, gemm)
        assert f"tk_packed_panels<{gemm['micro'][0]}>" in k["source"], out
    assert kernels["h"]["schedule"]["gemm"]["blocks"][2] < 1152
    assert kernels["z"]["schedule"]["gemm"]["blocks"][2] == 24
    mr = kernels["h"]["schedule"]["gemm"]["micro"][0]
    call = (rf"tk_gemm_micro_ahead<{mr}, \d+, \d+, {mr}>\((tk_packed_panels<[^;]*?) \+ ir, "
            r"k0\), [^;]*, (tk_packed_panels<[^;]*?) \+ ir \+ 1, k0\)\);")
    ahead = re.search(call, kernels["h"]["source"])
    assert ahead and ahead[1] == ahead[2], "the next micro-tile's panel, one row on"
    assert "if (jr == 0)" not in kernels["h"]["source"]
    # the strip's first micro-tile prefetches the next strip's panel: in the first strip as
    # it packs B's micro-panel (tk_gemm_micro_fill), in the others from the packed panel
    fill = (rf"tk_gemm_micro_fill<{mr}, \d+, \d+, {mr}, 0>\((tk_packed_panels<[^;]*?) \+ ir, "
            r"k0\), [^;]*, (tk_packed_panels<[^;]*?) \+ ir \+ 1, k0\)\);")
    first = re.search(r"if \(jr == 0\) {\s*if \(ir == 0\) {[^;]*;[\s\S]*?" + fill + r"\s*}\s*else {\s*"
                      + call + r"\s*}\s*}\s*else {", kernels["z"]["source"])
    assert first and first[1] == first[2] == first[3] == first[4], \
        "the strip's first micro-tile, the next strip's panel"
    _rebinding_weights_repacks(module, generated, imported.weights, rng)


@needs_cxx
def test_a_ragged_n_of_pixels_takes_the_m_role():
    """A 1x1 convolution of 32 filters on a 7 x 7 image: 49 pixels as N would take 64
    columns of micro-tiles, as M they take 54 rows, so the filters are N (whole micro-panels,
    a weight packed once) and the pixels M (A packed, the output tile stored strided). A
    3 x 3 padded convolution of the same sizes keeps the pixels as N (its im2col would be
    packed into rows by a gather). Both equal the reference, on one thread and on two."""
    rng = np.random.default_rng(6)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["p"]),
             h.make_node("Relu", ["p"], ["y"]),
             h.make_node("Conv", ["x", "w3"], ["z"], pads=[1, 1, 1, 1])]
    imported = _import(
        nodes, "ragged", [vi("x", T.FLOAT, [1, 24, 7, 7])],
        [vi("y", T.FLOAT, None), vi("z", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((32, 24, 1, 1)).astype(np.float32), "w1"),
         nh.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
         nh.from_array(rng.standard_normal((32, 24, 3, 3)).astype(np.float32), "w3")])
    module = imported.module
    generated = generate(module, target="cpu").module
    shapes = _shapes(generated)
    one = shapes[_op_of(module, "p_conv")][1]["gemm"]
    assert one["m"] == ["n", "h", "w"] and one["n"] == ["f"], one
    assert one["a"] == "packed" and one["b"] == "weight panels"
    assert one["micro"] == [5, 16]      # 49 rows: 50 in tiles of 5, 54 in tiles of 6
    three = shapes[_op_of(module, "z")][1]["gemm"]
    assert three["m"] == ["f"] and three["n"] == ["n", "h", "w"], three
    inputs = {"x": rng.standard_normal((1, 24, 7, 7)).astype(np.float32)}
    _equals_reference(module, generated, inputs, imported.weights)


def test_a_swap_must_save_more_than_the_strided_epilogue_costs():
    """With AVX-512's 32-column micro-tiles the pixels of a 7 x 7 (49 in 64 columns, 56 rows
    as M: 12.5% less) and of a 14 x 14 image (196 in 224, 200 rows: 11%) stay N: swapped, the
    1x1 convolutions of ResNet-50 on them ran 1.19x and 1.15x as long on one Xeon core (strided
    output stores). The 16-column tiles of an AVX2 core still swap a 7 x 7 (54 rows against
    64 columns: 16% less), measured faster on Zen 3."""
    rng = np.random.default_rng(8)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x7", "w"], ["y7"]), h.make_node("Conv", ["x14", "w"], ["y14"])]
    graph = h.make_graph(
        nodes, "swap", [vi("x7", T.FLOAT, [1, 24, 7, 7]), vi("x14", T.FLOAT, [1, 24, 14, 14])],
        [vi("y7", T.FLOAT, None), vi("y14", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((64, 24, 1, 1)).astype(np.float32), "w")])
    module = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])).module
    for profile, swapped in (("icelake", set()), ("milan", {"y7"})):
        shapes = _shapes(generate(module, load_profile(profile), target="cpu").module)
        for out in ("y7", "y14"):
            gemm = shapes[_op_of(module, out)][1]["gemm"]
            pixels = "m" if out in swapped else "n"
            assert gemm[pixels] == ["n", "h", "w"], (profile, out, gemm)


@needs_cxx
def test_a_strided_window_packs_by_gathers():
    """The im2col of a stride-2 convolution (3 x 3 with padding, and 1 x 1) is not rows of
    the image: its panel rows are masked gathers from the offset table, made by the first
    row's micro-tiles as they compute (runtime_cpu.h tk_gemm_micro_fill with GATHER), the
    padding's lanes masked off. Odd image sizes put padding on every
    edge; both equal the reference, on one thread and on two."""
    rng = np.random.default_rng(9)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x", "w3"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Conv", ["x", "w1"], ["z"], strides=[2, 2])]
    imported = _import(
        nodes, "strided", [vi("x", T.FLOAT, [1, 6, 15, 17])],
        [vi("y", T.FLOAT, None), vi("z", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((20, 6, 3, 3)).astype(np.float32), "w3"),
         nh.from_array(rng.standard_normal((20, 6, 1, 1)).astype(np.float32), "w1")])
    module = imported.module
    generated = generate(module, target="cpu").module
    by_op = {op: k for k in generated.codegen["kernels"] for op in k["ops"]}
    for out in ("y", "z"):
        k = by_op[_op_of(module, out)]
        assert k["shape"] == "cpu_gemm" and re.search(
            r"tk_gemm_micro(_rows)?_fill<\d+, \d+, 16, \d+, 1>", k["source"]), out
    inputs = {"x": rng.standard_normal((1, 6, 15, 17)).astype(np.float32)}
    _equals_reference(module, generated, inputs, imported.weights)


@needs_cxx
def test_a_ragged_last_panel_of_at_most_half_its_columns_takes_a_half_tile():
    """N = 70 on AVX-512's 32-column micro-panels is 2 panels and 6 columns: the last panel
    runs a 16-column micro-tile reading B's 32-column panel (`tk_gemm_micro_rows<8, 16,
    32>`, chosen at run time: a block's N may be ragged or not); N = 90 (26 columns over)
    runs the whole 32. B a weight (packed once) and an activation (packed per block); every
    result equals the reference, on one thread and on two."""
    rng = np.random.default_rng(10)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("MatMul", ["x", "w70"], ["y"]),
             h.make_node("MatMul", ["x", "w90"], ["z"]),
             h.make_node("MatMul", ["x", "b"], ["u"])]
    imported = _import(
        nodes, "half", [vi("x", T.FLOAT, [40, 37]), vi("b", T.FLOAT, [37, 70])],
        [vi(n, T.FLOAT, None) for n in ("y", "z", "u")],
        [nh.from_array(rng.standard_normal((37, 70)).astype(np.float32), "w70"),
         nh.from_array(rng.standard_normal((37, 90)).astype(np.float32), "w90")])
    module = imported.module
    generated = generate(module, load_profile("icelake"), target="cpu").module
    by_op = {op: k for k in generated.codegen["kernels"] for op in k["ops"]}
    for out in ("y", "z", "u"):
        assert "16, 32>(" in by_op[_op_of(module, out)]["source"], out
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    _equals_reference(module, generated, inputs, imported.weights)


@needs_cxx
def test_a_ragged_last_panel_splits_into_vectors_and_columns():
    """With A packed (here a convolution's filters, packed once), the ragged last micro-panel
    runs `tk_gemm_micro_ragged`: its whole vectors of columns as the register tile, the rest
    one FMA of the tile's rows per column. 49 pixels of a 7 x 7 image (a panel of 32 and 17
    columns: 16 and 1), 196 of a 14 x 14 (6 panels and 4 columns), 28 of a 4 x 7 (12 over a
    vector: a whole vector instead), a 3 x 3 convolution over 128 channels (K in several
    steps, each step's columns added to the last's) and a 1 x 1 with a bias and ReLU: every
    result equals the reference, on one thread and on two."""
    rng = np.random.default_rng(12)
    vi = h.make_tensor_value_info
    nodes, inputs, weights = [], [], []
    for name, (c, hh, ww, kernel) in {"a": (24, 7, 7, 1), "b": (24, 14, 14, 1),
                                      "c": (24, 4, 7, 1), "d": (128, 7, 7, 3)}.items():
        inputs.append(vi(f"x{name}", T.FLOAT, [1, c, hh, ww]))
        scale = (c * kernel * kernel) ** -0.5      # sums of about unit size
        weights.append(nh.from_array(
            (scale * rng.standard_normal((64, c, kernel, kernel))).astype(np.float32),
            f"w{name}"))
        pads = [kernel // 2] * 4
        nodes.append(h.make_node("Conv", [f"x{name}", f"w{name}"], [f"y{name}"], pads=pads))
    weights.append(nh.from_array(rng.standard_normal(64).astype(np.float32), "bias"))
    nodes += [h.make_node("Conv", ["xa", "wa", "bias"], ["p"]),
              h.make_node("Relu", ["p"], ["ye"])]
    imported = _import(nodes, "ragged_split", inputs,
                       [vi(f"y{n}", T.FLOAT, None) for n in "abcde"], weights)
    module = imported.module
    generated = generate(module, load_profile("icelake"), target="cpu").module
    by_op = {op: k for k in generated.codegen["kernels"] for op in k["ops"]}
    for out in ("ya", "yb", "yc", "yd", "p_conv"):
        k = by_op[_op_of(module, out)]
        assert k["schedule"]["gemm"]["n"] == ["n", "h", "w"], (out, k["schedule"])
        assert "tk_gemm_micro_ragged<8, 32, " in k["source"], out
    feeds = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
             for n in module.inputs}
    _equals_reference(module, generated, feeds, imported.weights)


def test_the_lane_masks_of_a_window_repeat_over_its_channels():
    """The lanes of a filled panel's rows depend on K only through the checked dimensions'
    parts: a 3 x 3 window's 9 points repeat over C x 3 x 3, so the masks of the first 9 rows
    are computed and the rest copied; with no checked dimension (a 1 x 1 convolution) one
    row's; where an outermost K axis is checked, or a checked axis' extent varies, all."""
    from tilekit.codegen.cpu import _dims_period

    extent = {"c": 64, "kh": 3, "kw": 3}
    assert _dims_period(("c", "kh", "kw"), {"kh", "kw"}, extent, frozenset()) == 9
    assert _dims_period(("c", "kh", "kw"), {"kw"}, extent, frozenset()) == 3
    assert _dims_period(("c", "kh", "kw"), set(), extent, frozenset()) == 1
    assert _dims_period(("c", "kh", "kw"), {"c", "kw"}, extent, frozenset()) is None
    assert _dims_period(("c", "kh", "kw"), {"kh"}, extent, frozenset({"kw"})) is None
    rng = np.random.default_rng(13)
    vi = h.make_tensor_value_info
    imported = _import(
        [h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "masks",
        [vi("x", T.FLOAT, [1, 16, 12, 12])], [vi("y", T.FLOAT, None)],
        [nh.from_array((rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32), "w")])
    module = imported.module
    generated = generate(module, load_profile("icelake"), target="cpu").module
    source = generated.codegen["kernels"][0]["source"]
    assert "b_bits[kk] = b_bits[kk - 9];" in source and "kk < tk_min(kc, 9)" in source
    feeds = {"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)}
    if find_cxx() is not None:
        _equals_reference(module, generated, feeds, imported.weights)


@needs_cxx
def test_a_whole_n_keeps_its_role_however_m_pads():
    """N in whole micro-panels keeps the output's contiguous axis: the input projection of a
    32-step recurrence (x [32, 24] by a weight [96, 24] transposed: M = 32 pads to 36 rows of
    6, the other way round 96 x 32 would pad nothing) and a 1x1 convolution of 32 filters on
    a 16 x 16 image (256 pixels) are not swapped, so the weight stays B packed once (or the
    filters A packed once) and the output tile is stored row by row. Both equal the
    reference, on one thread and on two."""
    rng = np.random.default_rng(7)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1),
             h.make_node("Conv", ["img", "f"], ["z"])]
    imported = _import(
        nodes, "whole", [vi("x", T.FLOAT, [32, 24]), vi("img", T.FLOAT, [1, 40, 16, 16])],
        [vi("y", T.FLOAT, None), vi("z", T.FLOAT, None)],
        [nh.from_array(rng.standard_normal((96, 24)).astype(np.float32), "w"),
         nh.from_array(rng.standard_normal(96).astype(np.float32), "c"),
         nh.from_array(rng.standard_normal((32, 40, 1, 1)).astype(np.float32), "f")])
    module = imported.module
    generated = generate(module, target="cpu").module
    shapes = _shapes(generated)
    proj = shapes[_op_of(module, "y_mm")][1]["gemm"]
    assert proj["m"] == ["i"] and proj["n"] == ["j"], proj
    assert proj["a"] == "rows" and proj["b"] == "weight panels"
    conv = shapes[_op_of(module, "z")][1]["gemm"]
    assert conv["m"] == ["f"] and conv["n"] == ["n", "h", "w"], conv
    assert conv["a"] == "weight panels"
    # 32 rows: micro-tiles of 4 rows (32), not 6 (36; gemm_mr)
    assert proj["micro"] == [4, 16] and conv["micro"] == [4, 16]
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    _equals_reference(module, generated, inputs, imported.weights)


def _attention() -> onnx.ModelProto:
    """softmax(q k^T / 8) v: tk-weld puts both products and the softmax in one group."""
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["q", "kt"], ["s"]),
             h.make_node("Div", ["s", "eight"], ["sd"]),
             h.make_node("Softmax", ["sd"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["o"])]
    graph = h.make_graph(nodes, "attention",
                         [vi(n, T.FLOAT, [2, 64, 32]) for n in ("q", "k", "v")],
                         [vi("o", T.FLOAT, None)],
                         [nh.from_array(np.array(8.0, np.float32), "eight")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


@needs_cxx
def test_a_welded_group_runs_stage_by_stage():
    """A group welded for a GPU (several stages, intermediates in shared memory) becomes one
    CPU kernel per stage, named after the group, with the split noted; the result matches."""
    from tilekit.weld import weld_module

    imported = import_model(_attention())
    module = weld_module(imported.module.with_stage("import"), load_profile("h100"))
    # the group with a contraction (transpose, q k^T and the scaling, in two stages)
    group = next(k for k in module.kernels
                 if len(k.ops) > 1 and any(op.startswith("MatMul") for op in k.ops))
    assert group.tile["stages"] >= 2
    generated = generate(module, target="cpu").module
    parts = [k for k in generated.codegen["kernels"] if k["group"] == group.name]
    assert len(parts) >= 2
    assert [k["name"] for k in parts] == [f"{group.name}__s{n}" for n in range(len(parts))]
    assert sorted(op for k in parts for op in k["ops"]) == sorted(group.ops)
    assert any(k["shape"] == "cpu_gemm" for k in parts)
    rng = np.random.default_rng(3)
    inputs = {n: rng.standard_normal((2, 64, 32)).astype(np.float32) for n in "qkv"}
    want = run_module(imported.module, inputs, imported.weights)["o"]
    got = CpuProgram(generated, 2).run(inputs, imported.weights)["o"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _chains() -> onnx.ModelProto:
    """Contractions with an elementwise chain after them (bias, residual, ReLU), which tk-weld
    for a CPU profile makes one kernel each: batch-2 1x1 convolutions whose pixels per image
    are whole micro-panels (4 x 8) and are not (6 x 7), the latter with batch 1, a matmul
    whose K takes several steps, and a 1x1 convolution on a 7 x 7 image (its pixels take the
    M role)."""
    rng = np.random.default_rng(5)

    def w(name, *shape):
        return nh.from_array(rng.standard_normal(shape).astype(np.float32), name)

    vi = h.make_tensor_value_info
    nodes = []
    for name in ("whole", "ragged", "single"):
        nodes += [h.make_node("Conv", [f"x_{name}", "w1", "b1"], [f"c_{name}"]),
                  h.make_node("Add", [f"c_{name}", f"r_{name}"], [f"s_{name}"]),
                  h.make_node("Relu", [f"s_{name}"], [f"y_{name}"])]
    nodes += [h.make_node("MatMul", ["a", "wk"], ["m"]),
              h.make_node("Add", ["m", "bk"], ["mb"]),
              h.make_node("Add", ["mb", "ra"], ["y_long"]),
              h.make_node("Conv", ["x7", "w7", "b7"], ["c7"]),
              h.make_node("Relu", ["c7"], ["y_seven"])]
    inputs = [vi("x_whole", T.FLOAT, [2, 5, 4, 8]), vi("r_whole", T.FLOAT, [2, 6, 4, 8]),
              vi("x_ragged", T.FLOAT, [2, 5, 6, 7]), vi("r_ragged", T.FLOAT, [2, 6, 6, 7]),
              vi("x_single", T.FLOAT, [1, 5, 6, 7]), vi("r_single", T.FLOAT, [1, 6, 6, 7]),
              vi("a", T.FLOAT, [9, 1000]), vi("ra", T.FLOAT, [9, 40]),
              vi("x7", T.FLOAT, [1, 24, 7, 7])]
    outputs = [vi(n, T.FLOAT, None)
               for n in ("y_whole", "y_ragged", "y_single", "y_long", "y_seven")]
    inits = [w("w1", 6, 5, 1, 1), w("b1", 6), w("wk", 1000, 40), w("bk", 40),
             w("w7", 64, 24, 1, 1), w("b7", 64)]
    graph = h.make_graph(nodes, "chains", inputs, outputs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


@needs_cxx
def test_each_micro_tile_runs_the_chain_after_its_last_step():
    """The epilogue runs on micro-tiles while they are in L1: with one step over K, on each
    strip of them just computed (a row of micro-tiles, or a column when the pixels are M),
    through a buffer of one strip; with several steps, on the block's output tile after the
    last step. A micro-tile's columns are one vector loop from its first column where the
    chain's addresses are linear in the N axes (and the columns never cross an image), each
    column decomposed where they could; where all of N is one run of addresses (one image, a
    matrix's columns), each row of the strip or tile is one vector loop over the block's
    columns instead of a micro-tile at a time; with one step, while a strip computes, the
    lines of the next strip's rows that the epilogue streams are prefetched (the residual
    and the output, a line per 64 bytes of each row and micro-tile: not the bias, the same
    along a row). The results match the reference."""
    import re

    from tilekit.roll.schedule import roll_module
    from tilekit.weld import weld_module

    imported = import_model(_chains())
    profile = load_profile("milan").with_cpu(cores=2)
    module = weld_module(roll_module(imported.module.with_stage("import"), profile), profile)
    generated = generate(module, profile, target="cpu").module
    kernels = {out: next(k for k in generated.codegen["kernels"]
                         if _op_of(imported.module, out) in k["ops"])
               for out in ("c_whole", "c_ragged", "c_single", "m", "c7")}
    assert all(k["shape"] == "cpu_gemm" and len(k["ops"]) > 1 for k in kernels.values())
    for out in ("c_whole", "c_ragged", "c_single"):
        assert "a row of micro-tiles' outputs" in kernels[out]["source"], out
    # the epilogue's column loop: a micro-tile's (at most nr), or a block row's (at most nc)
    per_tile = "const int tj = tk_min(16, nc - jr * 16);"
    for out in ("c_whole", "c_ragged"):
        assert per_tile in kernels[out]["source"], out
    for out in ("c_single", "m"):
        nc = kernels[out]["schedule"]["gemm"]["blocks"][1]
        assert per_tile not in kernels[out]["source"], out
        assert f"const int tj = tk_min({nc}, nc);" in kernels[out]["source"], out
    assert kernels["c7"]["schedule"]["gemm"]["m"] == ["n", "h", "w"]   # pixels as M
    assert "a column of micro-tiles' outputs" in kernels["c7"]["source"]
    long = kernels["m"]
    assert "the block's output tile" in long["source"]
    assert long["schedule"]["gemm"]["blocks"][2] < 1000               # several steps
    # whole micro-panels per image: the columns count on from the first one's coordinates
    assert "= j0 + j;" not in kernels["c_whole"]["source"]
    assert "= j0 + j;" in kernels["c_ragged"]["source"]                # each column's own
    fetched = {out: re.findall(r"__builtin_prefetch\(&t_(\w+)\[", k["source"])
               for out, k in kernels.items()}
    mr, nr = kernels["c_single"]["schedule"]["gemm"]["micro"]
    assert sorted(set(fetched["c_single"])) == ["r_single", "y_single"], fetched
    assert len(fetched["c_single"]) == 2 * mr * -(-nr // 16)
    streams = {"r_whole", "y_whole", "r_ragged", "y_ragged", "ra", "y_long", "y_seven"}
    assert not streams & {t for out in ("c_whole", "c_ragged", "m", "c7")
                          for t in fetched[out]}, fetched   # no strip epilogue of whole rows
    rng = np.random.default_rng(6)
    inputs = {n: rng.standard_normal(imported.module.tensors[n].shape).astype(np.float32)
              for n in imported.module.inputs}
    _equals_reference(imported.module, generated, inputs, imported.weights)


@needs_cxx
@pytest.mark.parametrize("threads", [1, 2])
def test_a_reshape_of_an_intermediate_shares_its_memory(threads):
    """A Reshape is the same bytes in the same order: codegen marks its kernel a `view` of
    its input, and the compiled runtime gives an intermediate's reshape the input's buffer
    and skips the kernel; the kernel reading it waits on the one that wrote the input (the
    barriers see one buffer). A reshape of a module input and one that is a module output
    keep their copies, and a transpose is no view. Every output equals the reference."""
    from tilekit.codegen.cpu_program import barriers

    rng = np.random.default_rng(21)
    vi = h.make_tensor_value_info
    shape = lambda name, dims: nh.from_array(np.array(dims, np.int64), name)  # noqa: E731
    nodes = [h.make_node("Relu", ["x"], ["a"]),
             h.make_node("Reshape", ["a", "s1"], ["b"]),
             h.make_node("MatMul", ["b", "w"], ["c"]),
             h.make_node("Reshape", ["x", "s2"], ["d"]),
             h.make_node("Relu", ["d"], ["e"]),
             h.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
             h.make_node("Relu", ["t"], ["f"]),
             h.make_node("Reshape", ["c", "s3"], ["g"])]
    imported = _import(
        nodes, "views", [vi("x", T.FLOAT, [8, 48])],
        [vi(n, T.FLOAT, None) for n in ("c", "e", "f", "g")],
        [shape("s1", [16, 24]), shape("s2", [24, 16]), shape("s3", [320]),
         nh.from_array(rng.standard_normal((24, 20)).astype(np.float32), "w")])
    module = imported.module
    generated = generate(module, target="cpu").module
    kernels = generated.codegen["kernels"]
    marked = {k["writes"][0]: k["schedule"].get("view") for k in kernels
              if k["schedule"].get("view")}
    assert marked == {"b": "a", "d": "x", "g": "c"}, marked    # the transpose is no view
    program = CpuProgram(generated, threads)
    assert program.views == {"b": "a"}, program.views
    out, src = "b", "a"
    assert np.shares_memory(program.buffers[out], program.buffers[src])
    inputs = {"x": rng.standard_normal((8, 48)).astype(np.float32)}
    got, timings = program.profile(inputs, imported.weights)
    skipped = next(k["name"] for k in kernels if k["writes"][0] == out)
    assert skipped not in {name for name, _ in timings} and len(timings) == len(kernels) - 1
    _close(module, got, run_module(module, inputs, imported.weights), "views")
    _close(module, program.run(inputs, imported.weights),
           run_module(module, inputs, imported.weights), "views, again")
    # the GEMM reads the view: under the input's name, it waits on the kernel writing it
    order = [k for k in range(len(kernels)) if k not in program.skipped]
    writer = next(i for i in order if src in program.ordering[i].writes)
    reader = next(i for i in order if src in program.ordering[i].args and i != writer)
    wait = barriers(program.ordering, order)
    assert any(wait[order.index(writer):order.index(reader)])


@pytest.mark.parametrize("text, shape, extent, form", [
    ("x[(i*24 + j) // 48, (i*24 + j) % 48]", (8, 48), {"i": 16, "j": 24},
     ({"i": 24, "j": 1}, 0)),                                  # ONNX Reshape: flat digits
    ("x[0, j, k // 64, k % 64]", (1, 128, 12, 64), {"j": 128, "k": 768},
     ({"j": 768, "k": 1}, 0)),                                 # a trailing run of digits
    ("x[j, (k // 64) % 12, k % 64]", (2, 12, 64), {"j": 2, "k": 768},
     ({"j": 768, "k": 1}, 0)),                                 # its first digit wraps: in range
    ("x[j, (k // 64) % 12, k % 64]", (2, 12, 64), {"j": 2, "k": 1536}, None),   # out of it
    ("x[k % 64, k // 64]", (64, 12), {"k": 768}, None),        # digits in the other order
    ("x[k // 32, k % 64]", (24, 64), {"k": 1536}, None),       # not the run's radix
    ("x[j // 2, k % 64]", (24, 64), {"j": 48, "k": 64}, None),  # two lines, not one
    ("x[j, k + 1]", (4, 65), {"j": 4, "k": 64}, ({"j": 65, "k": 1}, 1)),   # affine
])
def test_a_reads_row_major_offset_as_an_affine_form(text, shape, extent, form):
    """`_flat_form`: a read's row-major offset as an affine form of the axes, through the
    digits the importer writes for a Reshape (what makes a copy a view); None where the
    digits are not one line in the run's own mixed radix."""
    from tilekit.codegen.cpu import _flat_form
    from tilekit.codegen.plan import Read
    from tilekit.expr import parse
    from tilekit.expr.analysis import index_map

    access = parse(f"y[i] = {text}").body
    read = Read("x", shape, "float32", tuple(index_map(i) for i in access.indices), None,
                access)
    assert _flat_form(read, extent) == form


@needs_cxx
def test_a_transposed_read_runs_rows_side_by_side():
    """A pointwise kernel reading a tensor transposed (contiguous along the innermost row
    axis, apart along the vector axis) runs 16 rows at a time, each point of the vector axis
    one vector loop across them (`ACROSS_ROWS`); a transpose whose rows are no multiple of 16,
    and one whose vector axis stays contiguous, run row by row. All equal the reference, on
    one thread and on two."""
    rng = np.random.default_rng(8)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             h.make_node("Relu", ["t"], ["y"]),
             h.make_node("Transpose", ["z"], ["u"], perm=[1, 0]),
             h.make_node("Transpose", ["x"], ["w"], perm=[1, 0, 2])]
    imported = _import(nodes, "across", [vi("x", T.FLOAT, [2, 45, 64]),
                                         vi("z", T.FLOAT, [30, 20])],
                       [vi(n, T.FLOAT, None) for n in ("y", "u", "w")])
    module = imported.module
    generated = generate(module, target="cpu").module
    source = {k["writes"][0]: k["source"] for k in generated.codegen["kernels"]}
    across = re.compile(r"for \(int a_k = 0; a_k < 45; \+\+a_k\) {\s*#pragma omp simd\s*"
                        r"for \(int (\w+) = 0; \1 < 16; \+\+\1\)")
    assert across.search(source["t"]), source["t"]
    assert "< 16;" not in source["u"] and "< 16;" not in source["w"]
    inputs = {"x": rng.standard_normal((2, 45, 64)).astype(np.float32),
              "z": rng.standard_normal((30, 20)).astype(np.float32)}
    _equals_reference(module, generated, inputs, imported.weights)


@needs_cxx
def test_filled_panels_of_blocks_that_split_m_equal_the_reference():
    """ResNet-50's last 1 x 1 layers (2048 channels to 512 filters and back, 7 x 7 pixels,
    bias and ReLU) rolled for `icelake` on 2 cores: each GEMM's M in two blocks of several
    steps over K, B's panels packed by the first row of micro-tiles (`tk_gemm_micro_fill`,
    its rows' lane masks from `tk_lane_bits`). In that kernel GCC 12 spilled an AVX-512 lane
    mask as 16 bits and reloaded it as 64, so one block read zeros for half its columns; the
    masks are now made in integer registers. Equal to the reference on one thread and two."""
    from tilekit.roll.schedule import roll_module

    rng = np.random.default_rng(12)
    vi = h.make_tensor_value_info
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"]), h.make_node("Relu", ["c2"], ["y"])]
    imported = _import(
        nodes, "deep", [vi("x", T.FLOAT, [1, 2048, 7, 7])], [vi("y", T.FLOAT, None)],
        [nh.from_array((rng.standard_normal((512, 2048, 1, 1)) / 45).astype(np.float32), "w1"),
         nh.from_array(rng.standard_normal(512).astype(np.float32), "b1"),
         nh.from_array((rng.standard_normal((2048, 512, 1, 1)) / 23).astype(np.float32), "w2"),
         nh.from_array(rng.standard_normal(2048).astype(np.float32), "b2")])
    profile = load_profile("icelake").with_cpu(cores=2)
    module = roll_module(imported.module.with_stage("import"), profile)
    generated = generate(module, profile, target="cpu").module
    gemms = [k for k in generated.codegen["kernels"] if k["shape"] == "cpu_gemm"]
    assert len(gemms) == 2
    for k in gemms:
        assert "tk_gemm_micro_fill<" in k["source"], k["name"]
    assert any(k["schedule"]["gemm"]["blocks"][0] < 512 for k in gemms), "M split in blocks"
    assert any(k["schedule"]["gemm"]["blocks"][2] < 512 for k in gemms), "steps over K"
    inputs = {"x": rng.standard_normal((1, 2048, 7, 7)).astype(np.float32)}
    want = run_module(module, inputs, imported.weights)
    for threads in (1, 2):
        got = CpuProgram(generated, threads, profile=profile).run(inputs, imported.weights)
        _close(module, got, want, threads)
