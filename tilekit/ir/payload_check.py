"""The form of every stage payload a document carries, checked when a stage command reads it.

A stage command refuses a tampered payload even when it only passes it on (it used to copy
it, exit 0, and the command after it refused it). What a payload means for the module
(members, regions, placements) is checked where it is used: the weld verifier, the program
reader, codegen's recorded-kernel check.
"""

from __future__ import annotations

from typing import Any, Mapping

from tilekit.ir.keys import read_int, read_list
from tilekit.ir.payloads import (CpuOpTile, Estimate, is_cpu_tile, read_group_tile,
                                  read_split_k, read_tile, welded)


def check_payloads(module) -> None:
    """The form of every stage payload a document carries, in its regions too: each expr
    op's tile (`OpTile`, or `CpuOpTile` for a CPU profile's), each group's tile (`GroupTile`) and estimate. Every command checks
    them on reading, so a tampered payload stops at the first command, not at the one that
    uses it; what a payload means for the module (members, regions, placements) is checked
    by the weld verifier and the program reader where they are used."""
    from tilekit.ir.control import region_module, walk
    from tilekit.ir.graph import graph

    def check(m, prefix: str) -> None:
        g = graph(m)
        for node in g.nodes:
            if is_cpu_tile(node.op.tile):   # rolled for a CPU profile (CpuOpTile)
                CpuOpTile.read(node.op.tile, f"{prefix}{node.where}.tile",
                               node.analysis is not None)
            elif node.op.tile is not None and node.analysis is not None:
                _check_op_tile(node.op.tile, node.analysis, f"{prefix}{node.where}.tile")
        index = m.op_index()
        for n, kernel in enumerate(m.kernels):
            where = f"{prefix}kernels[{n}] ({kernel.name})"
            if kernel.estimate is not None:
                Estimate.read(kernel.estimate, f"{where}.estimate")
            if welded(kernel):
                analyses = [g.nodes[index[o]].analysis for o in kernel.ops if o in index]
                if len(analyses) == len(kernel.ops) and all(analyses):
                    read_group_tile(kernel.tile, analyses, f"{where}.tile")

    if module.dims:  # the payloads are the same at every size: checked at the smallest
        from tilekit.ir.dims import instantiate
        module = instantiate(module, {s: d.min for s, d in module.dims.items()})
    check(module, "")
    for path, rec, scope in walk(module):
        for rname, region in zip(rec.region_names(), rec.regions):
            check(region_module(scope, region, rec.name), f"{path}.{rname}.")


def _check_op_tile(payload: Any, a, where: str) -> None:
    """An op's tile: the tile itself (`read_tile`), and what tk-roll adds when present
    (shared memory, registers, the estimate, the runners-up); a hand-written tile may carry
    the tile alone."""
    read_tile(payload, a.spatial, a.reduction, where)
    for key in ("smem_bytes", "regs"):
        if payload.get(key) is not None:
            read_int(payload[key], f"{where}.{key}")
    read_split_k(payload, where)
    for key in ("estimate", "rolled_estimate"):
        if payload.get(key) is not None:
            Estimate.read(payload[key], f"{where}.{key}")
    cands = payload.get("candidates")
    for k, c in enumerate(read_list(cands, f"{where}.candidates", "'candidates'")
                          if cands is not None else ()):
        read_tile(c, a.spatial, a.reduction, f"{where}.candidates[{k}]")
        if isinstance(c, Mapping) and c.get("estimate") is not None:
            Estimate.read(c["estimate"], f"{where}.candidates[{k}].estimate")


__all__ = ["check_payloads"]
