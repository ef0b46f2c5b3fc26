"""One roll for a range of sizes: a symbolic module rolled for a CPU or a GPU profile
(DietCode). The CPU's, below; a GPU's at `roll_symbolic_gpu`.

A static module's CPU tile records the kernel the shared decision makes of an op at its
sizes (`tilekit.schedule.cpu.cpu_shape`: `cpu_gemm` or `cpu_loops` with blocks). For a
symbolic module those depend on the sizes a run binds, so `roll_symbolic` records what
does not:

- **the micro-kernel**, chosen from the hardware, not from the shapes: the candidates are
  every `mr x nr` register tile the profile's vector registers hold (`nr` in whole
  `NR_ALIGN` columns, the accumulators, B's vectors and one broadcast of A in registers),
  each with the cache tiles it implies (`tilekit.schedule.cpu.tiles_for`). An op that the
  decision makes a GEMM at some **pricing size** is priced with each candidate at every
  pricing size, and the candidate of the least total time is kept (the profile's own tile
  on a tie); other ops keep the profile's tile. As DietCode's cost model, the price is a
  micro-kernel part times a spatial part: the CPU roofline's time for the kernel
  (`tilekit.roll.cpu_cost`: padded micro-tiles included, DietCode's "local padding")
  divided by the micro-kernel's efficiency, `min(1, accumulators / FMA_IN_FLIGHT)` (an
  `mr x nr` tile keeps `mr * nr / lanes` independent FMA chains; fewer than the core's
  pipes times their latency leave it idle between dependent FMAs).
- **the kernel by size**: the tile's `kernel` is `{shape: by size}`: the code generator
  makes the decision at each size it generates (with the recorded tiles), so a size where
  a contraction is too small for packing runs as loops and a large one as a GEMM. These are
  DietCode's variants, and the dispatch rule is the shared decision itself; the sizes whose
  code has one structure share one build (tilekit.runtime.family).
- `priced`: per pricing size, the kernel the decision made and its estimate; `estimate` is
  the first pricing size's (what reports and totals read).

The **pricing sizes** are each symbol's likely values, else its smallest, its largest and
one between (the geometric mean), combined over the symbols (at most `MAX_PRICED`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any, Mapping

from tilekit.ir.payloads import CPU_BY_SIZE, CpuOpTile
from tilekit.roll import cpu_cost
from tilekit.schedule.cpu import (MAX_MR, MAX_NR, NR_ALIGN, CpuTiles, cpu_shape, cpu_tiles,
                                  machine_of, max_mr, tiles_for)

#: The tile's `kernel.shape` of an op whose kernel is decided at each size.
BY_SIZE = CPU_BY_SIZE
#: At most this many pricing sizes.
MAX_PRICED = 9
#: Independent FMA chains a core needs to keep its FMA pipes busy: two pipes of four cycles'
#: latency (Zen 3 and 4, Skylake and later, Neoverse V1 and N2 have 2-4 pipes of 4 cycles).
FMA_IN_FLIGHT = 8


def micro_efficiency(tiles: CpuTiles) -> float:
    """The fraction of the FMA peak an `mr x nr` micro-kernel's dependent chains allow."""
    chains = tiles.mr * -(-tiles.nr // tiles.machine.f32_lanes)
    return min(1.0, chains / FMA_IN_FLIGHT)


def pricing_sizes(dims: Mapping[str, Any]) -> list[dict[str, int]]:
    """The sizes a symbolic module is priced at (the module docstring)."""
    per = []
    for name, d in dims.items():
        values = list(d.likely) or sorted({d.min, round(math.sqrt(d.min * d.max)), d.max})
        per.append([(name, v) for v in values])
    combos = [dict(c) for c in itertools.product(*per)]
    if len(combos) > MAX_PRICED:      # the diagonal: the k-th value of every symbol
        n = max(len(p) for p in per)
        combos = [dict(p[min(k, len(p) - 1)] for p in per) for k in range(n)][:MAX_PRICED]
    return combos


def micro_candidates(profile) -> list[CpuTiles]:
    """The profile's own tiles first, then every other register tile that fits."""
    m = machine_of(profile)
    own = cpu_tiles(profile)
    out = [own]
    for nr in range(NR_ALIGN, MAX_NR + 1, NR_ALIGN):
        for mr in range(1, min(max_mr(m, nr), MAX_MR) + 1):
            if (mr, nr) != (own.mr, own.nr):
                out.append(tiles_for(m, mr, nr))
    return out


def _each_op(module, profile, opaque, expr_tile):
    """(ops, estimates by op name) of a symbolic module: an expr op's (tile, estimate) from
    `expr_tile(index, sizes, instances)` (the pricing sizes and the module at each), an
    opaque op's implementation (`opaque(module, op, profile)`, tilekit.roll.schedule's)
    priced at the first pricing size."""
    from tilekit.ir.dims import instantiate

    sizes = pricing_sizes(module.dims)
    instances = [instantiate(module, v) for v in sizes]
    ops, estimates = [], {}
    for index, op in enumerate(module.ops):
        if op.kind == "opaque":
            rolled = opaque(instances[0], instances[0].ops[index], profile)
            tile, est = rolled.tile, rolled.estimate
        else:
            tile, est = expr_tile(index, sizes, instances)
        ops.append(replace(op, tile=tile))
        estimates[op.name] = est
    return tuple(ops), estimates


def roll_symbolic(module, profile, dtypes: Mapping[str, str], opaque):
    """The ops' CPU tiles of a symbolic module (the module docstring): (ops, estimates by op
    name). `opaque(module, op, profile)` rolls an opaque op (tilekit.roll.schedule's)."""
    candidates = micro_candidates(profile)

    def expr_tile(index: int, sizes, instances):
        per_size = [cpu_cost.op_inputs(inst, index, dtypes) for inst in instances]
        best, best_time, best_rows = None, math.inf, None
        for tiles in candidates:
            rows = []
            for facts, problem, moved in per_size:
                shape = cpu_shape(facts, tiles)
                rows.append((shape, cpu_cost.op_estimate(profile, problem, shape, moved)))
            total = sum(est.time_us / (micro_efficiency(tiles) if shape.shape == "cpu_gemm"
                                       else 1.0) for shape, est in rows)
            if total < best_time:
                best, best_time, best_rows = tiles, total, rows
            if not any(shape.shape == "cpu_gemm" for shape, _ in rows):
                break                 # no packing at any size: the micro-tile changes nothing
        priced = [{"dims": dict(sorted(v.items())), "kernel": shape.shape,
                   "blocks": int(shape.grid), "time_us": est.record()["time_us"]}
                  for v, (shape, est) in zip(sizes, best_rows)]
        first = best_rows[0][1]
        tile = CpuOpTile(profile.name, {"shape": BY_SIZE}, int(best_rows[0][0].grid), first,
                         (best.mr, best.nr), {"mc": best.mc, "nc": best.nc, "kc": best.kc})
        return {**tile.record(), "priced": priced}, first

    return _each_op(module, profile, opaque, expr_tile)


# -- GPU profiles: Roller's tiles over the range ----------------------------------------------

#: Tiles each pricing size contributes to an op's candidates on a GPU (Roller's construction
#: at that size, best first).
GPU_CANDIDATES = 4


def _gpu_problems(instances, index: int, dtypes: Mapping[str, str]):
    """(analysis, problem) of op `index` at each instance."""
    from tilekit.ir.graph import op_analysis
    from tilekit.roll.problem import problem_from_analysis

    out = []
    for inst in instances:
        analysis = op_analysis(inst, index)
        out.append((analysis, problem_from_analysis(analysis, dtypes)))
    return out


def roll_symbolic_gpu(module, profile, dtypes: Mapping[str, str], opaque,
                      precision: str = "fp32"):
    """The ops' GPU tiles of a symbolic module, one roll for the range (DietCode on
    Roller's tiles): (ops, estimates by op name).

    An expr op's candidates are the best `GPU_CANDIDATES` tiles Roller constructs at each
    pricing size (`pricing_sizes`: tiles aligned to the hardware at sizes the range will
    see); every candidate is priced at every pricing size (the same micro performance
    model: padding at a size its blocks do not divide is its waste, DietCode's local
    padding), and the one of the least total time is kept (the first found on a tie). Its
    `kernel` is `{shape: by size}`: codegen makes the shared decision at each size
    (tilekit.schedule.shape.decide), so a contraction may run on tensor cores at one size
    and as a staged kernel at another; `priced` lists each pricing size's kernel and
    estimate. As for a static op, the roll never makes an op slower than the default
    schedule by its own estimate: when the default's total over the pricing sizes is below
    the tile's, the op keeps the default (`rolled_estimate` recorded). A tile has no grid:
    it is each size's. An op whose axes differ between pricing sizes, or that no candidate
    runs at every one, keeps no tile (the default schedule)."""
    from tilekit.ir.payloads import Tile, round_sig
    from tilekit.roll.construct import cost_candidates, roll_problem
    from tilekit.roll.cost import default_estimate, machine
    from tilekit.schedule.shape import Target, analysis_facts, decide

    target = Target.of(profile, precision)
    done: dict[tuple, tuple] = {}        # problems at the sizes -> (record, estimate)
    constructed: dict = {}               # problem -> Roller's candidates

    def expr_tile(index: int, sizes, instances):
        at = _gpu_problems(instances, index, dtypes)
        problems = [p for _, p in at]
        key = tuple(problems)          # ops of one problem at every size share their roll
        if key not in done:
            done[key] = gpu_tile(sizes, at, problems)
        return done[key]

    def gpu_tile(sizes, at, problems):
        machines = [machine(profile, p.dtype, precision) for p in problems]
        defaults = [default_estimate(p, m) for p, m in zip(problems, machines)]
        if len({(p.axes, p.n_spatial) for p in problems}) > 1:
            return None, defaults[0]   # its axes differ between sizes: no one tile
        tiles: list = []
        for p in problems:
            if p not in constructed:
                constructed[p] = roll_problem(p, profile, GPU_CANDIDATES, precision)
            for c in constructed[p]:
                if c.split == 1 and c.tile not in tiles:   # split-K is a size's decision
                    tiles.append(c.tile)
        costs = [cost_candidates(p, m, tiles) for p, m in zip(problems, machines)]
        valid = [k for k in range(len(tiles)) if all(bool(c.valid[k]) for c in costs)]
        if not valid:                  # no tile runs at every size: the default, no tile
            return None, defaults[0]
        totals = {k: sum(float(c.time_s[k]) for c in costs) for k in valid}
        best = min(valid, key=lambda k: (round_sig(totals[k], 6), k))
        tile = Tile(tiles[best].block, tiles[best].thread, tiles[best].step)
        kept = round_sig(sum(d.time_us for d in defaults), 6) < round_sig(
            totals[best] * 1e6, 6)
        priced = []
        for v, (analysis, _), c, d in zip(sizes, at, costs, defaults):
            shape = decide(analysis_facts(analysis, dtypes), tile, target).shape
            priced.append({"dims": dict(sorted(v.items())),
                           "kernel": "default" if kept else shape,
                           "time_us": (d if kept else c.estimate(best)).record()["time_us"]})
        est = defaults[0] if kept else costs[0].estimate(best)
        record = {**tile.sizes(tuple(a for a, _ in problems[0].spatial),
                               tuple(a for a, _ in problems[0].reduction)),
                  "threads": tile.threads, "kernel": {"shape": BY_SIZE},
                  "estimate": est.record(), "priced": priced}
        if kept:
            record["rolled_estimate"] = costs[0].estimate(best).record()
        return record, est

    return _each_op(module, profile, opaque, expr_tile)


def by_size(tile) -> bool:
    """A GPU op tile whose kernel is decided at each size (`roll_symbolic_gpu`)."""
    kernel = tile.get("kernel") if isinstance(tile, Mapping) else None
    return (isinstance(kernel, Mapping) and tile.get("target") is None
            and kernel.get("shape") == BY_SIZE)


__all__ = ["BY_SIZE", "FMA_IN_FLIGHT", "GPU_CANDIDATES", "MAX_PRICED", "by_size",
           "micro_candidates", "micro_efficiency", "pricing_sizes", "roll_symbolic",
           "roll_symbolic_gpu"]
