"""What each generated kernel does to memory and to the execution units, without a GPU.

`kernel_report(generated, module)` runs sampled blocks of a kernel's tile program in the
interpreter (tilekit.tile.interp) on buffers of the module's shapes (zeros: index tensors
then index element 0; the counters depend on the addresses a schedule makes, not on
values) and returns its counters:

- `coalescing`: useful fraction of the 32-byte sectors global requests touched (1.0: every
  warp request as few sectors as its bytes need);
- `bank_conflict_degree`: shared-memory wavefronts per the fewest the bytes need (1.0:
  conflict-free);
- per block: FMA-pipe flops, special-function calls, tensor-core flops, integer operations;
- `worst`: the access site with the lowest efficiency (buffer, scope, load/store), when one is
  below 1.0.

The sampled blocks are the first and the last of the grid (a boundary tile when the tiles
overhang). Kernels whose blocks wait on each other (tk-ram's programs, tk-grind's device
loops) are reported through the bodies they compose, each interpreted as its own kernel.
Kernels with the same text up to names (ResNet's repeated blocks) are interpreted once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilekit.codegen.kernel import GeneratedKernel
from tilekit.tile.interp import Counters, Interpreter, np_dtype
from tilekit.tile.nodes import Kernel


def _memory(k: Kernel) -> dict[str, np.ndarray]:
    return {b.name: np.zeros(b.shape[0], np_dtype(b.dtype)) for b in k.params}


def program_report(k: Kernel, blocks: int = 2) -> dict[str, Any]:
    """Counters of `k`'s first and last blocks (or of every body it composes)."""
    if k.calls:
        return {"composes": [c.name for c in k.calls]}
    sample = sorted({0, k.grid - 1})[:blocks]
    counters = Interpreter(k, _memory(k), Counters()).run(sample)
    totals = counters.totals()
    per_block = {key: totals[key] // max(totals["blocks"], 1)
                 for key in ("flops", "sfu", "tensor_flops", "int_ops")}
    out: dict[str, Any] = {
        "blocks_sampled": sample, "coalescing": totals["coalescing"],
        "bank_conflict_degree": totals["bank_conflict_degree"],
        "per_block": per_block}
    worst = min(counters.sites.values(), key=lambda s: s.efficiency, default=None)
    if worst is not None and worst.efficiency < 1.0:
        out["worst"] = worst.record()
    return out


def kernel_reports(kernels: tuple[GeneratedKernel, ...]) -> dict[str, dict[str, Any]]:
    """kernel name -> its report (module docstring); the bodies composed by persistent
    kernels are reported under their own entry names."""
    from tilekit.codegen.module import canonical_body

    done: dict[str, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, Kernel, str]] = []
    for g in kernels:
        todo.append((g.name, g.program, canonical_body(g)))
        for callee in g.program.calls:
            todo.append((callee.name, callee, callee.name))
    for name, program, key in todo:
        if key not in done:
            done[key] = program_report(program)
        out[name] = done[key]
    return out


__all__ = ["kernel_reports", "program_report"]
