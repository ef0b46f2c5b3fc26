"""One cost model: one occupancy function, one time formula, the same estimate for the same
kernel whichever stage asks (tk-roll, tk-weld, tk-grind, tk-ram), and tile programs priced
by the same formula from the interpreter's counters."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tilekit import pipeline
from tilekit.codegen import generate
from tilekit.codegen.report import program_report
from tilekit.hw import load_profile
from tilekit.ir import Module, Op, Tensor
from tilekit.ir.payloads import Estimate
from tilekit.roll.cost import Work, as_columns, cost_tiles, machine, predict
from tilekit.ir.graph import graph
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.schedule import roll_module
from tilekit.schedule.residency import blocks_per_sm, residency

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import control_models, onnx_models  # noqa: E402

H100 = load_profile("h100")


def matmul(m=256, n=384, k=512) -> Module:
    return Module(model="mm", tensors={"a": Tensor((m, k), "float32", "input"),
                                       "b": Tensor((k, n), "float32", "input"),
                                       "c": Tensor((m, n), "float32", "output")},
                  ops=(Op("mm", "c[i,j] += a[i,k] * b[k,j]"),), inputs=("a", "b"),
                  outputs=("c",), stages=({"name": "import"},))


def test_one_occupancy_function():
    """tk-roll's candidates and the co-residency checks read the same blocks per SM."""
    module = roll_module(matmul(), H100, top_k=4)
    problem = problem_from_analysis(graph(module).nodes[0].analysis,
                                    {n: t.dtype for n, t in module.tensors.items()})
    m = machine(H100)
    tile = module.ops[0].tile
    cands = [tile] + list(tile.get("candidates", ()))
    block = as_columns([[c["block"][a] for c in cands] for a in ("i", "j")], len(cands))
    thread = as_columns([[c["thread"][a] for c in cands] for a in ("i", "j")], len(cands))
    step = as_columns([[c["step"]["k"] for c in cands]], len(cands))
    costs = cost_tiles(problem, m, block, thread, step)
    for k in range(len(cands)):
        r = residency(H100, int(costs.threads[k]), int(costs.regs[k]), int(costs.smem_tile[k]))
        assert costs.blocks_per_sm[k] == r.per_sm
    per_sm, _ = blocks_per_sm(H100, costs.threads, costs.regs, costs.smem_tile)
    assert (per_sm == costs.blocks_per_sm).all()


def test_the_time_formula_is_monotone_in_work():
    m = machine(H100)
    base = dict(flops=1e9, peak=m.peak, smem_traffic=1e6, block_bytes=1e5, traffic=1e8,
                unique=1e7, blocks=264, threads=256, registers=40, smem_bytes=8192,
                latency_steps=0)
    t0 = float(predict(m, Work(**base)).time_s)
    for key, more in (("flops", 2e9), ("traffic", 2e8), ("latency_steps", 8),
                      ("smem_traffic", 1e10)):
        assert float(predict(m, Work(**{**base, key: more})).time_s) >= t0


def _stage_estimates(tmp_path) -> dict:
    """For each op of the LSTM loop's body: what tk-roll recorded, what tk-weld prices the
    op as a group of one, what tk-grind reads for the body kernel, what tk-ram plans for the
    operator run as one kernel."""
    from tilekit.grind.cost import body_kernels
    from tilekit.ir.graph import control_records
    from tilekit.ram.tasks import launch_us, operators
    from tilekit.weld.model import group_estimate
    from tilekit.weld.structure import structure

    path = tmp_path / "lstm.onnx"
    onnx.save(control_models.MODELS["lstm_loop"](), str(path))
    rolled = pipeline.compile(path, passes=("roll",), hw="h100").module
    (rec,) = control_records(rolled).values()
    region = rec.regions[0]
    from tilekit.ir.control import region_module
    body = region_module(rolled.tensors, region, rec.name)
    launch, _ = launch_us(H100)
    grind = {k.name: k.time_us for k in body_kernels(region)[0]}
    ram = {o.kernel: o.best.busy_us + launch for o in operators(body, H100)}
    out = {}
    for i, op in enumerate(body.ops):
        if op.kind != "expr" or not op.tile:
            continue
        roll = Estimate.read(op.tile["estimate"], "estimate").time_us
        weld = group_estimate(body, structure(body, [i]), None, H100).time_us
        out[op.name] = (roll, weld, grind[f"k_{op.name}"], ram[f"k_{op.name}"])
    return out


def test_every_stage_gets_the_same_estimate_for_the_same_kernel(tmp_path):
    estimates = _stage_estimates(tmp_path)
    assert len(estimates) >= 10
    for name, (roll, weld, grind, ram) in estimates.items():
        assert weld == roll and grind == roll, name
        assert ram == pytest.approx(roll, rel=1e-9, abs=2e-3), name


@pytest.mark.parametrize("model", ["bert_encoder_layer", "mobilenet_block"])
def test_a_tile_program_priced_from_its_counters_agrees_with_the_roll(tmp_path, model):
    """The same formula from two derivations of the work: tk-roll's analytic tile figures,
    and the interpreter's counters on the generated program's first and last blocks."""
    path = tmp_path / f"{model}.onnx"
    onnx.save(onnx_models.ALL[model](), str(path))
    rolled = pipeline.compile(path, passes=("roll",), hw="h100").module
    ops = {op.name: op for op in rolled.ops}
    ratios = []
    for g in generate(rolled, H100).kernels:
        est = (ops[g.ops[0]].tile or {}).get("estimate") if len(g.ops) == 1 else None
        if not est:
            continue
        priced = program_report(g.program, H100)["estimate"]
        ratios.append(priced["time_us"] / est["time_us"])
    assert len(ratios) >= 10
    assert 0.5 <= min(ratios) and max(ratios) <= 2.0, ratios
    assert math.exp(np.mean(np.log(ratios))) == pytest.approx(1.0, abs=0.1)
