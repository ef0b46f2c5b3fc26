"""tk-weld's report: a row per group (ops, tile, levels, bytes saved, estimate) and the
model's totals for the module, before welding (one kernel per op, tk-roll's estimates) and
after (the groups' estimates), with the compulsory DRAM bytes of both (every tensor a kernel
reads from outside or stores, once: the fusion's effect without tk-roll's re-reads)."""

from __future__ import annotations

from dataclasses import dataclass

from tilekit.ir.model import Module
from tilekit.weld.model import compulsory_bytes

COLUMNS = ("kernel", "ops", "stages", "block", "levels (reg/shared/stored)", "dram saved",
           "before us", "after us")


@dataclass(frozen=True)
class Totals:
    kernels_before: int
    kernels_after: int
    dram_before: float
    dram_after: float
    time_before: float
    time_after: float
    compulsory_before: int = 0
    compulsory_after: int = 0

    @property
    def dram_ratio(self) -> float:
        return self.dram_after / self.dram_before if self.dram_before else 1.0


def totals(module: Module) -> Totals:
    """Before: every op its own kernel at its rolled estimate; after: the kernels as welded."""
    dram_b = time_b = dram_a = time_a = 0.0
    for op in module.ops:
        est = (op.tile or {}).get("estimate", {})
        dram_b += float(est.get("dram_bytes", 0))
        time_b += float(est.get("time_us", 0))
    for k in module.kernels:
        est = k.estimate or {}
        dram_a += float(est.get("dram_bytes", 0))
        time_a += float(est.get("time_us", 0))
    index = module.op_index()
    return Totals(len(module.ops), len(module.kernels), dram_b, dram_a, time_b, time_a,
                  compulsory_bytes(module, [[i] for i in range(len(module.ops))]),
                  compulsory_bytes(module, [[index[o] for o in k.ops]
                                            for k in module.kernels]))


def _sizes(sizes: dict) -> str:
    return " ".join(f"{a}{s}" for a, s in sizes.items()) or "-"


def report_rows(module: Module) -> list[tuple[str, ...]]:
    """One row per group of several ops."""
    rows = []
    for k in module.kernels:
        t = k.tile
        if not t or t.get("source") != "weld":
            continue
        edges = t.get("edges", [])
        n = {lv: sum(1 for e in edges if e["level"] == lv) for lv in ("register", "shared")}
        stored = len(t.get("stored", []))
        saved = sum(e.get("dram_saved", 0) for e in edges)
        rows.append((k.name, ",".join(k.ops) if len(k.ops) <= 4 else
                     f"{k.ops[0]},..,{k.ops[-1]} ({len(k.ops)})", str(t.get("stages", 1)),
                     _sizes(t.get("block", {})), f"{n['register']}/{n['shared']}/{stored}",
                     f"{saved:,}", f"{t['unwelded']['time_us']:g}",
                     f"{(k.estimate or {}).get('time_us', 0):g}"))
    return rows


def summary(module: Module) -> str:
    t = totals(module)
    return (f"tk-weld: {module.model} on {module.hardware}: kernels {t.kernels_before} -> "
            f"{t.kernels_after}, DRAM bytes {t.dram_before:,.0f} -> {t.dram_after:,.0f} "
            f"({100 * (1 - t.dram_ratio):.1f}% less; compulsory {t.compulsory_before:,} -> "
            f"{t.compulsory_after:,}), estimated time {t.time_before:,.1f} -> "
            f"{t.time_after:,.1f} us")
