"""The weld model at real sizes (docs/weld.md, "The model"): the fused groups that measured
slower than their ops apart on an H200 (the BERT-base layer's FFN down-projection and
attention with its output projection, the 56x56 MobileNet block's depthwise + pointwise)
are priced slower than apart, so tk-weld does not make them; the test-size models still
weld. Built from tile IR written here, or from tests/models at the sizes of
tests/bench/test_gpu_weld.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tilekit.expr.analysis import analyze
from tilekit.expr.parser import parse
from tilekit.hw import load_profile
from tilekit.ir import Module, Op, Tensor
from tilekit.ir.payloads import Tile
from tilekit.roll.schedule import roll_module
from tilekit.weld import weld_module
from tilekit.weld.model import ROUND_TRIP_S, group_estimate, read_bytes, unwelded
from tilekit.weld.search import thread_tile
from tilekit.weld.structure import footprint, propagate, shared_buffers, structure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import onnx_models  # noqa: E402


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100")


def ffn_down(rows: int, inner: int, hidden: int) -> Module:
    """BERT's FFN down-projection as tk-import writes it: the tail of GELU (two products),
    the matmul by the [inner, hidden] weight, the bias and the residual."""
    f = "float32"
    return Module(
        model="ffn_down", inputs=("a", "b", "w", "bias", "res"), outputs=("y",),
        stages=({"name": "import"},),
        tensors={"a": Tensor((rows, inner), f, "input"), "b": Tensor((rows, inner), f, "input"),
                 "w": Tensor((inner, hidden), f, "input"), "bias": Tensor((hidden,), f, "input"),
                 "res": Tensor((rows, hidden), f, "input"), "h": Tensor((rows, inner), f),
                 "g": Tensor((rows, inner), f), "mm": Tensor((rows, hidden), f),
                 "z": Tensor((rows, hidden), f), "y": Tensor((rows, hidden), f, "output")},
        ops=(Op("half", "h[i,k] = a[i,k] * 0.5"), Op("gelu", "g[i,k] = h[i,k] * b[i,k]"),
             Op("mm", "mm[i,j] += g[i,k] * w[k,j]"), Op("bias", "z[i,j] = mm[i,j] + bias[j]"),
             Op("res", "y[i,j] = z[i,j] + res[i,j]")))


def priced(module: Module, members, block, profile):
    """The group of `members` at the fused shape's tile `block` (over the last op's axes)."""
    s = structure(module, members)
    prop = propagate(module, members, block)
    threads = Tile(tuple(block), thread_tile(tuple(block)), (), "weld").threads
    return group_estimate(module, s, prop, profile, threads,
                          footprint(shared_buffers(module, s, prop)))


def test_ffn_down_at_bert_base_sizes_is_not_a_fused_group(h100):
    """The group the old model welded (a block per row, the 3072-long reduction split over
    lanes that each read a row of the weight: 32 lines per warp load) is priced far above
    its ops apart, and tk-weld keeps the matmul as its rolled kernel with an epilogue."""
    rolled = roll_module(ffn_down(128, 3072, 768), h100)
    everything = list(range(5))
    fused = priced(rolled, everything, (1, 768), h100)
    apart = unwelded(rolled, everything).time_us
    assert fused.time_us > 4 * apart          # measured: 5.9x slower for the whole layer
    assert fused.bound == "smem"              # the L1 wavefronts of the weight's reads
    welded = weld_module(rolled, h100)
    for k in welded.kernels:
        if "mm" in k.ops:
            assert k.tile is None or k.tile["stages"] == 1, k


def test_ffn_down_at_test_size_still_welds(h100):
    """The same ops at the test model's size (hidden 16, FFN 32) are one fused kernel."""
    welded = weld_module(roll_module(ffn_down(16, 32, 16), h100), h100)
    assert len(welded.kernels) < 5
    assert any(k.tile and k.tile["stages"] > 1 and "mm" in k.ops for k in welded.kernels)


def test_a_weight_read_by_lanes_along_k_costs_a_line_per_lane():
    """read_bytes: lanes splitting K of w[k, j] touch 32 rows (32 lines, 4 useful bytes
    each); lanes along the contiguous axis are coalesced; a read the warp does not move
    costs one transaction per warp."""
    shapes = {"g": (4, 64), "w": (64, 64), "mm": (4, 64)}
    a = analyze(parse("mm[i,j] += g[i,k] * w[k,j]"), shapes)
    maps = {acc.tensor: acc.maps for acc in a.accesses}
    args = (4, 32, 128, a.spatial, (1, 64))
    l1_w, l2_w = read_bytes(maps["w"], shapes["w"], *args, 32, ("k", 64), True)
    l1_g, l2_g = read_bytes(maps["g"], shapes["g"], *args, 32, ("k", 64), True)
    assert l1_w == 128 and l2_w == 32          # a line and a sector per 4-byte element
    assert l1_g == 4 and l2_g == 4             # 32 lanes, one 128-byte line
    # rows of 8 floats: four rows share a line
    narrow = read_bytes(maps["w"], (64, 8), 4, 32, 128, a.spatial, (1, 8), 32, ("k", 64), True)
    assert narrow[0] == 32
    # one point per thread: consecutive threads take consecutive j, coalesced; g[i, k] is the
    # same address for the warp (one transaction per 32 reads); each thread walks k in its loop
    l1_w, l2_w = read_bytes(maps["w"], shapes["w"], *args, 1, ("k", 64), True)
    l1_g, l2_g = read_bytes(maps["g"], shapes["g"], *args, 1, ("k", 64), True)
    assert l1_w == 4 and l2_w == 4
    assert l1_g == 4 and l2_g == 32 / (32 * 8)      # a line a load, a sector for 8 steps


def test_the_serial_passes_are_priced_whole_on_a_small_grid(h100):
    """Softmax rows of 40 on a 16-row tensor: a block per row runs its three stages in
    sequence (a pass each, and one for each reduction loop), whatever the grid."""
    from tilekit.ir import read_module
    data = Path(__file__).resolve().parents[1] / "data" / "weld" / "softmax.yaml"
    rolled = roll_module(read_module(str(data)), h100)
    est = priced(rolled, [0, 1, 2], (1, 40), h100)
    # 16 blocks of 64 threads (40 points in whole warps): max and sum take a lane group of
    # 32 per row, 2 steps each (1 pass + 1 loop trip); the divide is one pass.
    trips = 2 + 2 + 1
    assert est.waves == 1
    assert math.isclose(est.latency_us, trips * ROUND_TRIP_S * 1e6, rel_tol=1e-6)


@pytest.mark.parametrize("name,args,most", [
    ("bert_encoder_layer", {}, 12),
    ("mobilenet_block", {}, 3),
])
def test_the_test_size_models_still_weld(h100, name, args, most):
    """The toy models that measured 3.4x faster welded keep their multi-stage groups."""
    from tilekit.onnx import import_model
    imported = import_model(getattr(onnx_models, name)(**args), name=name)
    welded = weld_module(roll_module(imported.module.with_stage("import"), h100), h100)
    assert len(welded.kernels) <= most
    assert any(k.tile and k.tile["stages"] > 1 for k in welded.kernels)


@pytest.fixture(scope="module")
def bert_base(h100):
    """tests/bench/test_gpu_weld.py's `bert_base_layer`, rolled for the H100 profile."""
    from tilekit.onnx import import_model
    proto = onnx_models.bert_encoder_layer(batch=1, seq=128, hidden=768, heads=12, ffn=3072)
    module = import_model(proto, name="bert_base_layer").module.with_stage("import")
    return roll_module(module, h100)


#: The groups that made the welded BERT-base layer 5.9x slower on the H200, at their tiles
#: then: the FFN down-projection, and attention with the head merge and the output
#: projection, a block per query row.
LOSING = [(("mul26", "mul27", "matmul28", "add29", "add30"), (1, 1, 768)),
          (("matmul10", "div11", "add12", "softmax13_max", "softmax13_sum", "softmax13",
            "matmul14", "transpose15", "reshape16", "matmul17", "add18", "add19"), (1, 1, 768))]


def test_the_measured_losing_groups_of_bert_base_are_priced_as_losing(h100, bert_base):
    """Each is priced above its ops apart, and tk-weld makes neither; what it welds instead
    is estimated faster than the layer unwelded (not yet timed on a GPU)."""
    index = bert_base.op_index()
    for ops, block in LOSING:
        members = [index[o] for o in ops]
        assert priced(bert_base, members, block, h100).time_us > \
            unwelded(bert_base, members).time_us, ops
    welded = weld_module(bert_base, h100)
    for ops, _ in LOSING:
        assert not any(set(ops) <= set(k.ops) for k in welded.kernels), ops
    before = sum(op.tile["estimate"]["time_us"] for op in bert_base.ops)
    after = sum(k.estimate["time_us"] for k in welded.kernels)
    assert after < before


def test_the_block_per_pixel_mobilenet_group_is_priced_as_losing(h100):
    """The 56x56 MobileNet block's depthwise + pointwise group as the H200 ran it (a block
    per pixel, consecutive threads on channels 12.5 KB apart: 1.5x slower welded) is priced
    above its ops apart; the group tk-weld makes of them (the whole chain, or its first
    convolution with its epilogue where tk-roll splits the second's reduction) takes a row of
    pixels per block and is priced below its ops apart."""
    from tilekit.onnx import import_model
    proto = onnx_models.mobilenet_block(channels=32, expand=6, size=56)
    module = import_model(proto, name="mobilenet_block_56").module.with_stage("import")
    rolled = roll_module(module, h100)
    index = rolled.op_index()
    ops = ("conv4_conv", "conv4", "clip6", "conv7_conv", "conv7", "add9")
    members = [index[o] for o in ops]
    apart = unwelded(rolled, members).time_us
    assert priced(rolled, members, (1, 32, 1, 1), h100).time_us > 2 * apart
    (group,) = [k for k in weld_module(rolled, h100).kernels if "conv4_conv" in k.ops]
    assert set(group.ops) <= set(ops) and len(group.ops) > 1
    assert list(group.tile["block"].values())[-1] > 1        # a row of pixels, not one
    assert group.estimate["time_us"] < unwelded(rolled, [index[o] for o in group.ops]).time_us
