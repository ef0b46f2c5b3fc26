"""The one rule for running several kernel bodies on one persistent block
(tilekit.schedule.block), as tk-grind's cost model and codegen both apply it."""

from __future__ import annotations

import pytest

from tilekit.grind.cost import BodyKernel
from tilekit.schedule.block import BodyBlock, runs_on, shared_block


def body(threads, barriers=False, independent=True, name="k"):
    return BodyBlock(name, threads, barriers, independent and not barriers)


def test_bodies_with_barriers_set_the_block():
    assert shared_block([body(128, barriers=True), body(64), body(256)]) == 128


def test_without_barriers_the_largest_body_sets_it():
    assert shared_block([body(64), body(256), body(32)]) == 256


def test_barrier_bodies_of_two_sizes_cannot_share_a_block():
    why = shared_block([body(128, barriers=True), body(256, barriers=True)])
    assert "different block sizes (128, 256 threads)" in why


@pytest.mark.parametrize("bodies, words", [
    # more threads than the block: only independent threads, a multiple of the block
    ([body(128, barriers=True), body(256, independent=False, name="lanes")],
     "lanes uses 256 threads that exchange values"),
    ([body(128, barriers=True), body(320, name="odd")], "odd uses 320 threads"),
    # fewer threads than the block, with warp collectives: whole warps only
    ([body(128, barriers=True), body(48, independent=False, name="part")],
     "part uses warp collectives on 48 threads"),
])
def test_what_cannot_run_on_the_block_is_named(bodies, words):
    why = shared_block(bodies)
    assert isinstance(why, str) and words in why


def test_what_can_run_on_the_block():
    assert shared_block([body(128, barriers=True), body(256)]) == 128        # strided
    assert shared_block([body(128, barriers=True), body(48)]) == 128         # guarded
    assert shared_block([body(128, barriers=True), body(64, independent=False)]) == 128


def test_runs_on_a_barrier_body_needs_its_own_size():
    assert runs_on(body(128, barriers=True, name="s"), 256) == \
        "body kernel s synchronises 128 threads, the block has 256"
    assert runs_on(body(128, barriers=True), 128) is None


def test_the_cost_model_sees_collectives_as_exchanging_values():
    lanes = BodyKernel("lanes", 8, 48, 32, 0, 1.0, barriers=False, collectives=True)
    staged = BodyKernel("staged", 8, 128, 64, 4096, 1.0, barriers=True)
    assert not lanes.block().independent and staged.block().barriers
    assert "warp collectives on 48 threads" in shared_block([staged.block(), lanes.block()])


def _shapes_generated() -> dict[str, set[bool]]:
    """Every single-op kernel shape the CUDA codegen makes for a few rolled ops (a float32
    and a float16 matmul on the H100 and the A100, a convolution, an elementwise op, and the
    same unrolled), and whether its tile program meets at block barriers."""
    from tilekit.codegen import generate
    from tilekit.hw import load_profile
    from tilekit.ir import Module, Op, Tensor
    from tilekit.roll.schedule import roll_module
    from tilekit.tile.nodes import uses_barriers

    def matmul(dtype, m, n, k):
        return Module(model="mm", inputs=("a", "b"), outputs=("c",), tensors={
            "a": Tensor((m, k), dtype, "input"), "b": Tensor((k, n), dtype, "input"),
            "c": Tensor((m, n), dtype, "output")},
            ops=(Op("mm", "c[i, j] += a[i, k] * b[k, j]"),), stages=({"name": "import"},))

    conv = Module(model="conv", inputs=("x", "w"), outputs=("y",), tensors={
        "x": Tensor((1, 64, 28, 28), "float32", "input"),
        "w": Tensor((64, 64, 3, 3), "float32", "input"),
        "y": Tensor((1, 64, 28, 28), "float32", "output")},
        ops=(Op("conv", "y[n, f, h, w] += x[n, c, h + kh - 1, w + kw - 1] * w[f, c, kh, kw]",
                pad="0"),), stages=({"name": "import"},))
    relu = Module(model="relu", inputs=("x",), outputs=("y",), tensors={
        "x": Tensor((64, 4096), "float32", "input"), "y": Tensor((64, 4096), "float32", "output")},
        ops=(Op("relu", "y[i, j] = max(x[i, j], 0.0)"),), stages=({"name": "import"},))
    seen: dict[str, set[bool]] = {}
    for hw in ("h100", "a100"):
        profile = load_profile(hw)
        for module in (matmul("float32", 1024, 1024, 1024), matmul("float16", 1024, 1024, 1024),
                       matmul("float32", 16, 4096, 4096), conv, relu):
            for m in (roll_module(module, profile), module):
                for k in generate(m, profile).kernels:
                    seen.setdefault(k.shape, set()).add(uses_barriers(k.program))
    return seen


def test_the_barrier_shapes_are_the_shapes_whose_kernels_meet_at_barriers():
    """tk-ram and tk-grind read a body's barriers from its shape (BARRIER_SHAPES), codegen
    from the program it prints: they agree on every shape (a SIMT GEMM read as barrier-free
    once let tk-ram put its 128 threads in a 256-thread program block, which codegen then
    refused)."""
    from tilekit.schedule.block import BARRIER_SHAPES

    seen = _shapes_generated()
    assert {"simt", "staged", "mma", "wgmma", "tiled", "default"} <= set(seen), seen
    for shape, barriers in seen.items():
        assert barriers == {shape in BARRIER_SHAPES}, (shape, barriers)
