"""tk-weld's report: a row per group (ops, tile, levels, bytes saved, estimate) and the
model's totals for the module, before welding (one kernel per op, tk-roll's estimates) and
after (the groups' estimates), with the compulsory DRAM bytes of both (every tensor a kernel
reads from outside or stores, once: the fusion's effect without tk-roll's re-reads).
Both totals count the same work (a control op as one run of its regions' kernels), and a
change is said as "less" or "more", never as a negative "less"."""

from __future__ import annotations

from dataclasses import dataclass

from tilekit.ir.control import region_module
from tilekit.ir.graph import control_records, graph
from tilekit.ir.model import Module
from tilekit.ir.payloads import is_cpu_tile
from tilekit.roll.problem import tensor_bytes
from tilekit.weld.model import compulsory_bytes

COLUMNS = ("kernel", "ops", "stages", "block", "grid", "levels (reg/shared/stored)",
           "dram saved", "before us", "after us", "bound")


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
    """Before: every op its own kernel at its rolled estimate; after: the kernels as welded.

    Both sides count the same work: every top-level op, and a control op as one run of its
    regions' kernels (before: each region op its own kernel; after: the region's welded
    groups), which is how tk-roll prices a control op; kernels are counted the same way.
    tk-grind prices the iterations."""
    n_b, dram_b, time_b = _unwelded(module)
    n_a, dram_a, time_a = _welded(module)
    index = module.op_index()
    return Totals(n_b, n_a, dram_b, dram_a, time_b, time_a,
                  compulsory_bytes(module, [[i] for i in range(len(module.ops))]),
                  compulsory_bytes(module, [[index[o] for o in k.ops]
                                            for k in module.kernels]))


def _regions(module: Module, name: str):
    rec = control_records(module).get(name)
    if rec is None:
        return ()
    return tuple(region_module(module.tensors, region, name) for region in rec.regions)


def _unwelded(module: Module) -> tuple[int, float, float]:
    """(kernels, DRAM bytes, time) with every op its own kernel at tk-roll's estimate."""
    kernels, dram, time = 0, 0.0, 0.0
    for op in module.ops:
        if op.kind == "control":
            for region in _regions(module, op.name):
                n, d, t = _unwelded(region)
                kernels, dram, time = kernels + n, dram + d, time + t
            continue
        est = (op.tile or {}).get("estimate", {})
        kernels += 1
        dram += float(est.get("dram_bytes", 0))
        time += float(est.get("time_us", 0))
    return kernels, dram, time


def _welded(module: Module) -> tuple[int, float, float]:
    """(kernels, DRAM bytes, time) of the module's kernels; a control op's kernel is its
    regions' kernels."""
    kinds = {op.name: op.kind for op in module.ops}
    kernels, dram, time = 0, 0.0, 0.0
    for k in module.kernels:
        if len(k.ops) == 1 and kinds.get(k.ops[0]) == "control":
            for region in _regions(module, k.ops[0]):
                n, d, t = _welded(region)
                kernels, dram, time = kernels + n, dram + d, time + t
            continue
        est = k.estimate or {}
        kernels += 1
        dram += float(est.get("dram_bytes", 0))
        time += float(est.get("time_us", 0))
    return kernels, dram, time


def change(before: float, after: float) -> str:
    """`34.6% less`, `12.0% more` or `no change`: the direction in words, never a negative
    'less'."""
    if before == after:
        return "no change"
    if before == 0:
        return "from none"
    pct = 100 * abs(1 - after / before)
    return f"{pct:.1f}% {'less' if after < before else 'more'}"


def _sizes(sizes: dict) -> str:
    return " ".join(f"{a}{s}" for a, s in sizes.items()) or "-"


def report_rows(module: Module, full: bool = False) -> list[tuple]:
    """One row per group of several ops (text cells; with `full`, the ops as a list and
    the figures as numbers, for the JSON report). Groups inside a control op's regions are
    listed after it, named `op.region/kernel`."""
    rows: list[tuple] = []
    _group_rows(module, full, "", rows)
    return rows


def _group_rows(module: Module, full: bool, prefix: str, rows: list) -> None:
    kinds = {op.name: op.kind for op in module.ops}
    for k in module.kernels:
        if len(k.ops) == 1 and kinds.get(k.ops[0]) == "control":
            rec = control_records(module)[k.ops[0]]
            for rname, region in zip(rec.region_names(), rec.regions):
                _group_rows(region_module(module.tensors, region, k.ops[0]), full,
                            f"{prefix}{k.ops[0]}.{rname}/", rows)
            continue
        t = k.tile
        if not t and len(k.ops) > 1 and _cpu_group(module, k):
            rows.append(_cpu_row(module, k, full, prefix))
            continue
        if not t or t.get("source") != "weld":
            continue
        edges = t.get("edges", [])
        n = {lv: sum(1 for e in edges if e["level"] == lv) for lv in ("register", "shared")}
        stored = len(t.get("stored", []))
        saved = sum(e.get("dram_saved", 0) for e in edges)
        after = (k.estimate or {}).get("time_us", 0)
        bound = (k.estimate or {}).get("bound", "")
        # the grid as the group's kernel runs it: blocks x threads (a one-stage group keeps
        # its main op's rolled kernel, whose threads its op tile records)
        if full:
            rows.append((prefix + k.name, list(k.ops), t.get("stages", 1), dict(t.get("block", {})),
                         {"blocks": t.get("blocks", 0), "threads": t.get("threads", 0)},
                         {"register": n["register"], "shared": n["shared"], "stored": stored},
                         saved, t["unwelded"]["time_us"], after, bound))
            continue
        rows.append((prefix + k.name, ",".join(k.ops) if len(k.ops) <= 4 else
                     f"{k.ops[0]},..,{k.ops[-1]} ({len(k.ops)})", str(t.get("stages", 1)),
                     _sizes(t.get("block", {})), f"{t.get('blocks', 0)}x{t.get('threads', 0)}",
                     f"{n['register']}/{n['shared']}/{stored}",
                     f"{saved:,}", f"{t['unwelded']['time_us']:g}", f"{after:g}", bound))


def _cpu_group(module: Module, k) -> bool:
    ops = {op.name: op for op in module.ops}
    return all(is_cpu_tile(ops[n].tile) for n in k.ops if n in ops)


def _cpu_row(module: Module, k, full: bool, prefix: str) -> tuple:
    """A CPU group (tilekit.weld.cpu): one stage, its intermediates in registers, no tile."""
    g = graph(module)
    internal = g.internal_to(k.ops)
    index = module.op_index()
    stored = sum(1 for n in k.ops[:-1] for t in g.nodes[index[n]].writes
                 if t not in internal)
    saved = 2 * tensor_bytes(module, internal)
    ops = {op.name: op for op in module.ops}
    before = sum(float(ops[n].tile["estimate"]["time_us"]) for n in k.ops)
    after = (k.estimate or {}).get("time_us", 0)
    bound = (k.estimate or {}).get("bound", "")
    if full:
        return (prefix + k.name, list(k.ops), 1, {}, {},
                {"register": len(internal), "shared": 0, "stored": stored}, saved,
                round(before, 4), after, bound)
    return (prefix + k.name, ",".join(k.ops) if len(k.ops) <= 4 else
            f"{k.ops[0]},..,{k.ops[-1]} ({len(k.ops)})", "1", "cpu", "cpu",
            f"{len(internal)}/0/{stored}", f"{saved:,}", f"{before:g}", f"{after:g}", bound)


def summary(module: Module) -> str:
    t = totals(module)
    return (f"tk-weld: {module.model} on {module.hardware}: kernels {t.kernels_before} -> "
            f"{t.kernels_after}, DRAM bytes {t.dram_before:,.0f} -> {t.dram_after:,.0f} "
            f"({change(t.dram_before, t.dram_after)}; compulsory {t.compulsory_before:,} -> "
            f"{t.compulsory_after:,}), estimated time {t.time_before:,.1f} -> "
            f"{t.time_after:,.1f} us{_regions_note(module)}")


def _regions_note(module: Module) -> str:
    if not any(op.kind == "control" for op in module.ops):
        return ""
    return " (a control op counts as one run of its regions' kernels)"


def report_data(module: Module) -> dict:
    """The report as data (tk-weld --report-format json): totals and one entry per group."""
    t = totals(module)
    return {"model": module.model, "hardware": module.hardware,
            "totals": {"kernels": [t.kernels_before, t.kernels_after],
                       "dram_bytes": [round(t.dram_before), round(t.dram_after)],
                       "compulsory_bytes": [t.compulsory_before, t.compulsory_after],
                       "time_us": [round(t.time_before, 3), round(t.time_after, 3)],
                       "control_ops": sum(op.kind == "control" for op in module.ops)},
            "groups": [dict(zip(("kernel", "ops", "stages", "block", "grid", "levels",
                                 "dram_saved", "before_us", "after_us", "bound"), row))
                       for row in report_rows(module, full=True)]}
