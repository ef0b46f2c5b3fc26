"""One roll for a range of sizes: a symbolic module rolled for a CPU profile (DietCode).

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


def roll_symbolic(module, profile, dtypes: Mapping[str, str], opaque):
    """The ops' CPU tiles of a symbolic module (the module docstring): (ops, estimates by op
    name). `opaque(module, op, profile)` rolls an opaque op (tilekit.roll.schedule's)."""
    from tilekit.ir.dims import instantiate

    sizes = pricing_sizes(module.dims)
    instances = [instantiate(module, v) for v in sizes]
    candidates = micro_candidates(profile)
    ops, estimates = [], {}
    for index, op in enumerate(module.ops):
        if op.kind == "opaque":        # its implementation: priced at the first size
            rolled = opaque(instances[0], instances[0].ops[index], profile)
            ops.append(replace(op, tile=rolled.tile))
            estimates[op.name] = rolled.estimate
            continue
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
        ops.append(replace(op, tile={**tile.record(), "priced": priced}))
        estimates[op.name] = first
    return tuple(ops), estimates


__all__ = ["BY_SIZE", "FMA_IN_FLIGHT", "MAX_PRICED", "micro_candidates", "micro_efficiency",
           "pricing_sizes", "roll_symbolic"]
