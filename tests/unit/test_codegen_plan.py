"""Stages, chains and inlining of kernel groups (tilekit.codegen.plan)."""

from __future__ import annotations

from tilekit.codegen.fused import plan_regions
from tilekit.codegen.plan import GroupPlan, plan_group, readers

from codegen_support import fixture


def plan_of(name: str) -> GroupPlan:
    module = fixture(name)
    kernel = module.kernels[0]
    return plan_group(module, kernel, kernel.name, readers(module))


def stages(plan: GroupPlan):
    return [(s.main.op.name, tuple(c.op.name for c in s.chain)) for s in plan.stages]


def test_matmul_bias_relu_is_one_stage_with_a_chain():
    plan = plan_of("matmul_bias_relu")
    assert stages(plan) == [("mm", ("bias_relu",))]
    assert plan.stored == {"y"} and not plan.shared and not plan.inlined


def test_softmax_inlines_exp_and_shares_row_statistics():
    plan = plan_of("softmax")
    assert stages(plan) == [("max", ()), ("sum", ()), ("div", ())]
    assert plan.inlined == ("exp",)
    assert plan.shared == {"m", "s"} and plan.stored == {"y"}
    # exp's body replaced every read of e (no read of e remains)
    assert all(r.tensor != "e" for s in plan.stages for p in s.ops for r in p.read_list())


def test_layernorm_chains_statistics_and_inlines_the_centred_value():
    plan = plan_of("layernorm")
    assert stages(plan) == [("sum1", ("mean",)), ("sum2", ("rstd",)), ("norm", ())]
    assert plan.inlined == ("centre",)
    assert plan.shared == {"mu", "r"}


def test_regions_carry_the_convolution_halo():
    module = fixture("conv_chain")
    plan = plan_of("conv_chain")
    regions = plan_regions(module, plan, (4, 4, 4))
    first = regions.spans[0]
    assert [s.length for s in first] == [4, 6, 6]
    # channel: whole (4 of 4); rows and columns: tile origin - 1
    assert first[0].lo.coefs == () and first[0].lo.const == 0
    assert first[1].lo.coefs == ((1, 1),) and first[1].lo.const == -1
    assert regions.smem == 4 * 6 * 6 * 4


def test_an_intermediate_read_outside_the_group_is_stored():
    from dataclasses import replace
    from tilekit.ir.model import Kernel
    module = fixture("softmax")
    module = replace(module, outputs=("y", "s"))
    kernel = Kernel("g", ("max", "exp", "sum", "div"))
    plan = plan_group(module, kernel, "g", readers(module))
    assert plan.stored == {"y", "s"}
