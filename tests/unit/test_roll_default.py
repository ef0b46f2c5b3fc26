"""tk-roll never makes an op slower than its default schedule by its own estimate: when the
model prices the default kernel below every tile, the op keeps the default (its kernel record
says so, codegen and tk-ram run it) and the IR records both estimates."""

from __future__ import annotations

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.hw import load_profile
from tilekit.ir.graph import op_analysis
from tilekit.roll.cost import cost_tiles, default_estimate, machine
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.schedule import dtypes_of, roll_module
from tilekit.roll.workloads import load_workloads

H100 = load_profile("h100")
#: A column reduction (the default's grid-stride threads beat its staged tiles), a small
#: convolution (its staging round trips kept the default until split-K cut them: docs/roll.md,
#: "Occupancy and latency hiding") and a large GEMM (tiles win).
NAMES = ("reduce_sum_cols", "resnet50_l4_3x3_512", "gemm_1024")


@pytest.fixture(scope="session")
def rolled():
    by_name = {w.name: w for w in load_workloads()}
    return {n: roll_module(by_name[n].module(), H100) for n in NAMES}


def test_the_roll_is_never_slower_than_the_default(rolled):
    kept = []
    for name, module in rolled.items():
        op = module.ops[0]
        problem = problem_from_analysis(op_analysis(module, 0), dtypes_of(module))
        default = default_estimate(problem, machine(H100, problem.dtype))
        est = op.tile["estimate"]
        assert est["time_us"] <= default.record()["time_us"], name    # as recorded
        if "rolled_estimate" in op.tile:          # both estimates recorded
            kept.append(name)
            assert op.tile["kernel"]["shape"] == "default"
            assert est == default.record()
            assert est["time_us"] < op.tile["rolled_estimate"]["time_us"]
            # codegen runs what the roll chose, not the tile
            assert generate(module, H100).kernels[0].shape == "default"
        else:
            assert op.tile["kernel"]["shape"] != "default"
            assert generate(module, H100).kernels[0].shape == op.tile["kernel"]["shape"]
    assert kept == ["reduce_sum_cols"]
    assert rolled["resnet50_l4_3x3_512"].ops[0].tile["split_k"] > 1


def test_lane_kernels_are_priced_with_their_re_reads():
    """A warp per output point reads the point's whole row of each operand: for a product
    with reuse in both operands (BERT-large's attention scores, 16 x 384 x 384 points over 64)
    that is 64 x 2 floats a point, 30x the compulsory bytes. Priced at the compulsory bytes,
    the lane kernel was the pick on the H100 (14.7 us estimated, 430 us measured, against
    20.6 us for the best SIMT GEMM: tests/bench/results/fidelity-nvidia_h100_80gb_hbm3.json)."""
    (scores,) = [w for w in load_workloads() if w.name == "bert_large_scores"]
    module = roll_module(scores.module(), H100)
    assert module.ops[0].tile["kernel"]["shape"] == "simt"
    problem = problem_from_analysis(op_analysis(module, 0), dtypes_of(module))
    m = machine(H100, problem.dtype)
    lanes = cost_tiles(problem, m, np.array([[1], [1], [8]]), np.array([[1], [1], [1]]),
                       np.array([[32]]))
    assert bool(lanes.lanes_default[0])
    points = 16 * 384 * 384
    assert lanes.dram_bytes[0] >= points * 64 * 2 * 4
    assert lanes.time_s[0] * 1e6 == pytest.approx(default_estimate(problem, m).time_us)
