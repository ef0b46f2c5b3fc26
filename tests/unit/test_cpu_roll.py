"""tk-roll, tk-weld and tk-codegen with a `kind: cpu` profile: CPU tiles (`target: cpu`) from
the one kernel decision (tilekit.schedule.cpu.cpu_shape), priced by the CPU roofline
(tilekit.roll.cpu_cost), welded as an op with its elementwise chain, generated from the
recorded tiles; GPU readers refuse them."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from tilekit.codegen import generate
from tilekit.codegen.cxx import find_cxx
from tilekit.errors import IRError, TilekitError
from tilekit.hw import load_profile
from tilekit.ir.payloads import CpuOpTile, cpu_rolled, is_cpu_tile, read_tile
from tilekit.onnx import import_model
from tilekit.roll.schedule import module_estimate, roll_module
from tilekit.schedule.cpu import cpu_tiles
from tilekit.weld import weld_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import control_models  # noqa: E402


def _model(m: int, k: int, n: int) -> onnx.ModelProto:
    """y = relu(x @ w + b): a contraction with its elementwise chain."""
    vi = h.make_tensor_value_info
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w"], ["mm"]), h.make_node("Add", ["mm", "b"], ["s"]),
             h.make_node("Relu", ["s"], ["y"])]
    graph = h.make_graph(nodes, "mlp", [vi("x", T.FLOAT, [m, k])], [vi("y", T.FLOAT, None)],
                         [nh.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"),
                          nh.from_array(rng.standard_normal(n).astype(np.float32), "b")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def _imported(m: int, k: int, n: int):
    return import_model(_model(m, k, n)).module.with_stage("import")


def _tile(module, name: str) -> dict:
    return next(op.tile for op in module.ops if op.name == name)


def _mm(module) -> str:
    return next(op.name for op in module.ops if "+=" in (op.expr or ""))


@pytest.mark.parametrize("hw", ["milan", "icelake"])
def test_tiles_are_the_profiles_and_the_decision_is_codegens(hw):
    profile = load_profile(hw)
    module = roll_module(_imported(64, 96, 80), profile, hardware=hw)
    t = cpu_tiles(profile)
    assert cpu_rolled(module) and module.hardware == hw
    for op in module.ops:
        tile = CpuOpTile.read(op.tile, op.name)
        assert tile.machine == hw and tile.micro == (t.mr, t.nr)
        assert tile.cache == {"mc": t.mc, "nc": t.nc, "kc": t.kc}
        assert tile.estimate.time_us > 0
    gemm = _tile(module, _mm(module))["kernel"]
    assert gemm["shape"] == "cpu_gemm" and gemm["k"] == [_k_axis(module)]
    # codegen generates what was recorded (the same decision, the recorded blocks)
    kernels = generate(module, load_profile(hw), target="cpu").kernels
    rec = next(k for k in kernels if _mm(module) in k.ops)
    assert rec.shape == "cpu_gemm" and rec.schedule["tiles"] == "rolled"
    assert rec.schedule["gemm"]["blocks"] == gemm["blocks"]
    assert rec.grid[0] == _tile(module, _mm(module))["blocks"]
    assert not any("tile_ignored" in k.schedule for k in kernels)


def _k_axis(module) -> str:
    from tilekit.ir.graph import op_analysis
    index = next(i for i, op in enumerate(module.ops) if "+=" in (op.expr or ""))
    return op_analysis(module, index).reduction[0][0]


def test_a_matrix_vector_product_runs_as_loops():
    """x[k] w[k, j] with w stored K x N: lanes along j (a vector of w one load, x[k] a
    broadcast), never along k (each lane a row of w apart), and the row of outputs in
    column blocks for the cores (one row is one block of rows)."""
    profile = load_profile("milan").with_cpu(cores=4)
    module = roll_module(_imported(1, 256, 1024), profile, hardware="milan")
    kernel = _tile(module, _mm(module))["kernel"]
    assert kernel["shape"] == "cpu_loops" and "why" in kernel
    assert kernel["reduction"] == "accumulator row" and kernel["vector_axis"] == "j"
    assert kernel["rows"] == 1 and kernel["columns_per_block"] % 8 == 0
    gen = generate(module, profile, target="cpu").kernels
    made = next(k for k in gen if _mm(module) in k.ops)
    assert made.shape == "cpu_loops" and made.grid[0] == -(-1024 // kernel["columns_per_block"])
    assert made.grid[0] > 1 and made.schedule["columns_per_block"] == kernel["columns_per_block"]


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
@pytest.mark.parametrize("n", [1024, 1000, 40])
def test_column_blocks_compute_every_output(n):
    """Column blocks of an accumulator row (a ragged last block where 32-point blocks do not
    divide N), and of a pointwise nest, against NumPy, on one thread and three."""
    from tilekit.runtime.compiled import CpuProgram

    profile = load_profile("icelake").with_cpu(cores=4)
    imported = import_model(_model(1, 512, n))
    module = generate(roll_module(imported.module.with_stage("import"), profile,
                                  hardware="icelake"), profile, target="cpu").module
    x = np.random.default_rng(1).standard_normal((1, 512)).astype(np.float32)
    w, b = imported.weights["w"], imported.weights["b"]
    want = np.maximum(x @ w + b, 0)
    mm = next(k for k in module.codegen["kernels"] if "+=" in module.ops[0].expr
              and module.ops[0].name in k["ops"])
    assert (mm["grid"][0] > 1) == (n >= 1000)       # 40 columns are one block's
    for threads in (1, 3):
        got = CpuProgram(module, threads=threads).run({"x": x}, imported.weights)
        np.testing.assert_allclose(got[module.outputs[0]], want, rtol=1e-5, atol=1e-5)


def test_the_estimate_grows_with_the_problem():
    profile = load_profile("milan")
    times = [module_estimate(roll_module(_imported(n, n, n), profile,
                                         hardware="milan"))["time_us"]
             for n in (64, 256, 1024)]
    assert times[0] < times[1] < times[2]
    big = roll_module(_imported(1024, 1024, 1024), profile, hardware="milan")
    est = _tile(big, _mm(big))["estimate"]
    assert est["bound"] == "compute" and est["flops"] >= 2 * 1024 ** 3


def test_opaque_and_control_ops_are_rolled():
    module = import_model(control_models.lstm_loop()).module.with_stage("import")
    rolled = roll_module(module, load_profile("milan"), hardware="milan")
    assert cpu_rolled(rolled)
    from tilekit.ir.control import walk
    region_ops = [op for _, rec, _ in walk(rolled) for r in rec.regions for op in r.ops]
    assert region_ops and all(is_cpu_tile(op.tile) for op in region_ops
                              if op.kind != "control")
    assert any(op.kind == "opaque" and op.tile["kernel"]["shape"] == "opaque"
               for op in region_ops + list(rolled.ops))
    control = next(op for op in rolled.ops if op.kind == "control")
    kernel = next(k for k in rolled.kernels if control.name in k.ops)
    assert kernel.estimate["time_us"] > 0


def test_gpu_readers_refuse_a_cpu_tile():
    module = roll_module(_imported(64, 64, 64), load_profile("milan"), hardware="milan")
    from tilekit.ir.graph import op_analysis
    a = op_analysis(module, 0)
    with pytest.raises(IRError, match="CPU schedule"):
        read_tile(module.ops[0].tile, a.spatial, a.reduction, "ops[0].tile")
    with pytest.raises(TilekitError, match="--target"):
        generate(module, None, target="cuda")


def test_recorded_blocks_are_honoured_and_checked():
    module = roll_module(_imported(64, 96, 80), load_profile("milan"), hardware="milan")
    name = _mm(module)

    def with_kernel(**changes):
        ops = tuple(replace(op, tile={**op.tile, "kernel": {**op.tile["kernel"], **changes}})
                    if op.name == name else op for op in module.ops)
        return replace(module, ops=ops)

    gen = generate(with_kernel(blocks=[12, 32, 48]), target="cpu").kernels
    assert next(k for k in gen if name in k.ops).schedule["gemm"]["blocks"] == [12, 32, 48]
    with pytest.raises(IRError, match="kernel.shape"):
        generate(with_kernel(shape="cpu_loops"), target="cpu")
    with pytest.raises(IRError, match="blocks"):
        generate(with_kernel(blocks=[0, 32, 48]), target="cpu")


def test_recorded_column_blocks_are_honoured_and_checked():
    profile = load_profile("milan").with_cpu(cores=4)
    module = roll_module(_imported(1, 64, 512), profile, hardware="milan")
    name = _mm(module)

    def with_kernel(**changes):
        ops = tuple(replace(op, tile={**op.tile, "kernel": {**op.tile["kernel"], **changes}})
                    if op.name == name else op for op in module.ops)
        return replace(module, ops=ops)

    made = next(k for k in generate(with_kernel(columns_per_block=200), target="cpu").kernels
                if name in k.ops)
    assert made.grid[0] == 3 and made.schedule["columns_per_block"] == 200
    for bad in (0, 513, "8"):
        with pytest.raises(IRError, match="columns_per_block"):
            generate(with_kernel(columns_per_block=bad), target="cpu")


def test_weld_keeps_a_chain_in_one_kernel():
    profile = load_profile("milan")
    module = weld_module(_imported(64, 96, 80), profile, hardware="milan")
    assert [len(k.ops) for k in module.kernels] == [3]
    group = module.kernels[0]
    assert group.tile is None
    parts = sum(op.tile["estimate"]["time_us"] for op in module.ops)
    assert group.estimate["time_us"] < parts
    assert group.estimate["dram_bytes"] < sum(op.tile["estimate"]["dram_bytes"]
                                              for op in module.ops)
    gen = generate(module, profile, target="cpu").kernels
    assert len(gen) == 1 and gen[0].shape == "cpu_gemm"


def test_the_commands_refuse_mismatches(tmp_path):
    bin_dir = Path(sys.executable).parent
    onnx.save(_model(8, 16, 16), str(tmp_path / "m.onnx"))

    def run(*args):
        return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True,
                              text=True, cwd=tmp_path)

    assert run("tk-import", "m.onnx", "-o", "m.yaml").returncode == 0
    assert run("tk-roll", "--hw", "milan", "m.yaml", "-o", "r.yaml").returncode == 0
    for args, flag in ((("tk-codegen", "--target", "cuda", "r.yaml"), "--target"),
                       (("tk-codegen", "--hw", "icelake", "r.yaml"), "--hw"),
                       (("tk-grind", "--hw", "h100", "r.yaml"), "--hw"),
                       (("tk-roll", "--hw", "milan", "--precision", "tf32", "m.yaml"),
                        "--precision")):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and flag in proc.stderr, proc.stderr
        assert proc.stdout == ""


def _conv(size: int, channels: int = 64) -> onnx.ModelProto:
    """A padded 3 x 3 convolution of `channels` filters on a `size` x `size` image."""
    vi = h.make_tensor_value_info
    rng = np.random.default_rng(4)
    w = nh.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), "w")
    graph = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                         [vi("x", T.FLOAT, [1, channels, size, size])],
                         [vi("y", T.FLOAT, None)], [w])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
@pytest.mark.parametrize("size,swapped", [(2, True), (4, True), (7, False)])
def test_a_small_image_takes_its_pixels_as_m(size, swapped):
    """A 3 x 3 convolution whose pixels fill few of the micro-tiles' 32 columns takes them as
    M (its im2col packed by gathers) when that leaves at most half the padded work (2 x 2
    pixels: an eighth of the work useful as N, half as M); 7 x 7 pixels stay N. Either way
    the values are the reference's, at one thread and three."""
    from tilekit.runtime.compiled import CpuProgram
    from tilekit.runtime.cpu import run_module

    profile = load_profile("icelake").with_cpu(cores=2)
    imported = import_model(_conv(size))
    module = generate(roll_module(imported.module.with_stage("import"), profile,
                                  hardware="icelake"), profile, target="cpu").module
    (gemm,) = [k for k in module.codegen["kernels"] if k["shape"] == "cpu_gemm"]
    assert (gemm["schedule"]["gemm"]["m"] == ["n", "h", "w"]) == swapped
    x = np.random.default_rng(5).standard_normal((1, 64, size, size)).astype(np.float32)
    want = run_module(imported.module, {"x": x}, imported.weights)
    for threads in (1, 3):
        got = CpuProgram(module, threads=threads, profile=profile).run({"x": x},
                                                                       imported.weights)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
