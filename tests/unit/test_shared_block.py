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
