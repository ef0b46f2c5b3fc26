"""What each generated kernel does to memory and to the execution units, and what the cost
model makes of it, without a GPU.

`program_report(program, profile)` runs sampled blocks of a kernel's tile program in the
interpreter (tilekit.tile.interp) on buffers of the module's shapes (zeros: index tensors
then index element 0; the counters depend on the addresses a schedule makes, not on
values) and returns its counters:

- `coalescing`: useful fraction of the 32-byte sectors global requests touched (1.0: every
  warp request as few sectors as its bytes need);
- `bank_conflict_degree`: shared-memory wavefronts per the fewest the bytes need (1.0:
  conflict-free);
- per block: FMA-pipe flops, special-function calls, tensor-core flops, integer operations,
  staging round trips waited for;
- `worst`: the access site with the lowest efficiency (buffer, scope, load/store), when one is
  below 1.0;
- with a profile, `estimate`: the program priced by the one cost model
  (`tilekit.roll.cost.predict`) from those counters: the sampled blocks' work, sectors,
  wavefronts and waits scaled to the grid (`program_work`), the registers ptxas reported
  when the kernels were compiled, else `DEFAULT_REGS`.

The sampled blocks are the first and the last of the grid (a boundary tile when the tiles
overhang). Kernels whose blocks wait on each other (tk-ram's programs, tk-grind's device
loops) are reported through the bodies they compose, each interpreted as its own kernel.
Kernels with the same text up to names (ResNet's repeated blocks) are interpreted once.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tilekit.codegen.kernel import GeneratedKernel
from tilekit.ir.payloads import Estimate
from tilekit.schedule.defaults import DEFAULT_REGS
from tilekit.tile.expr import ITEMSIZE
from tilekit.tile.functions import WGMMA
from tilekit.tile.interp import Counters, Interpreter, np_dtype
from tilekit.tile.nodes import Kernel

SECTOR = 32
WAVEFRONT = 128


def _memory(k: Kernel) -> dict[str, np.ndarray]:
    return {b.name: np.zeros(b.shape[0], np_dtype(b.dtype)) for b in k.params}


def _sample(k: Kernel) -> list[int]:
    return sorted({0, k.grid - 1})


def program_work(k: Kernel, counters: Counters, m, registers: int | None = None):
    """The cost model's `Work` of program `k` from its sampled blocks' counters."""
    from tilekit.roll.cost import Work

    t = counters.totals()
    per = max(t["blocks"], 1)
    unit = _tensor_unit(k) if t["tensor_flops"] > 0 else None
    tensor = unit is not None and m.hw.has_peak(unit, tensor_core=True)
    peak = m.hw.achievable_flops(unit, tensor_core=True) if tensor else m.peak
    flops = (t["tensor_flops"] if tensor else t["flops"]) / per * k.grid
    block_bytes = t["global_sectors"] * SECTOR / per
    return Work(flops=float(flops), peak=peak,
                smem_traffic=t["shared_wavefronts"] * WAVEFRONT / per * k.grid,
                block_bytes=block_bytes, traffic=block_bytes * k.grid,
                unique=float(sum(b.shape[0] * ITEMSIZE[b.dtype] for b in k.params)),
                blocks=k.grid, threads=k.threads,
                registers=registers or DEFAULT_REGS, smem_bytes=k.smem_bytes,
                latency_steps=t["stage_waits"] / per)


def _tensor_unit(k: Kernel) -> str | None:
    """The tensor-core input type of `k`'s mma instructions (a profile's peak key)."""
    from tilekit.tile.expr import Call, children
    from tilekit.tile.nodes import exprs, walk

    for s in walk(k.body):
        for e in exprs(s):
            stack = [e]
            while stack:
                x = stack.pop()
                if isinstance(x, Call) and (x.fn.startswith("mma_")
                                            or x.fn in WGMMA):
                    return {"f16": "fp16", "bf16": "bf16", "tf32": "tf32"}[x.fn.rsplit("_", 1)[1]]
                stack.extend(children(x))
    return None


def program_estimate(k: Kernel, profile, counters: Counters | None = None,
                     registers: int | None = None) -> Estimate:
    """Program `k` priced by the one cost model (module docstring)."""
    from tilekit.roll.cost import machine, predict, prediction_estimate

    dtype = next((b.dtype for b in k.params if b.access == "write"), "float32")
    m = machine(profile, dtype)
    counters = counters or Interpreter(k, _memory(k), Counters()).run(_sample(k))
    work = program_work(k, counters, m, registers)
    return prediction_estimate(predict(m, work), float(work.flops),
                               float(work.traffic), float(work.smem_traffic))


def program_report(k: Kernel, profile=None, registers: int | None = None) -> dict[str, Any]:
    """Counters of `k`'s first and last blocks (or of every body it composes)."""
    if k.calls:
        return {"composes": [c.name for c in k.calls]}
    sample = _sample(k)
    counters = Interpreter(k, _memory(k), Counters()).run(sample)
    totals = counters.totals()
    per_block = {key: totals[key] // max(totals["blocks"], 1)
                 for key in ("flops", "sfu", "tensor_flops", "int_ops", "stage_waits")}
    out: dict[str, Any] = {
        "blocks_sampled": sample, "coalescing": totals["coalescing"],
        "bank_conflict_degree": totals["bank_conflict_degree"],
        "per_block": per_block}
    worst = min(counters.sites.values(), key=lambda s: s.efficiency, default=None)
    if worst is not None and worst.efficiency < 1.0:
        out["worst"] = worst.record()
    if profile is not None and profile.kind == "simt":
        out["estimate"] = program_estimate(k, profile, counters, registers).as_dict()
    return out


def kernel_reports(kernels: tuple[GeneratedKernel, ...], profile=None,
                   registers: Mapping[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """kernel name -> its report (module docstring); the bodies composed by persistent
    kernels are reported under their own entry names. `registers`: entry -> ptxas' count."""
    from tilekit.codegen.module import canonical_body

    registers = registers or {}
    done: dict[str, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, Kernel, str]] = []
    for g in kernels:
        todo.append((g.name, g.program, canonical_body(g)))
        for callee in g.program.calls:
            todo.append((callee.name, callee, callee.name))
    for name, program, key in todo:
        if key not in done:
            done[key] = program_report(program, profile, registers.get(program.name))
        out[name] = done[key]
    return out


__all__ = ["kernel_reports", "program_estimate", "program_report", "program_work"]
