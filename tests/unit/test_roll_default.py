"""tk-roll never makes an op slower than its default schedule by its own estimate: when the
model prices the default kernel below every tile, the op keeps the default (its kernel record
says so, codegen and tk-ram run it) and the IR records both estimates."""

from __future__ import annotations

import pytest

from tilekit.codegen import generate
from tilekit.hw import load_profile
from tilekit.ir.graph import op_analysis
from tilekit.roll.cost import default_estimate, machine
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
