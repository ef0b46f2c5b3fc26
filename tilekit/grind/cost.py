"""What a control op costs on the host and on the device: the figures tk-grind decides by.

Host-driven (the loop or branch stays on the host): every iteration launches each body
kernel (its estimate includes the launch overhead), copies each scan result into its row,
and reads the condition back (a host synchronisation) when the loop has one; a branch reads
its predicate back, then launches the taken side.

On the device (Cocktailer's persistent cooperative kernel): one launch; each iteration runs
the body kernels in order over a block-strided loop of the persistent grid with a grid
barrier after each (and one after the carried copies); the trip count and the condition are
read on the device, so no host round trip. What it costs: the barriers, and lost parallelism:
the persistent grid is capped by co-residency (`tilekit.schedule.residency`: every body's
threads, registers and shared memory in one slot), so a body kernel with more blocks than the
grid runs in `ceil(blocks / grid)` rounds where it had `ceil(blocks / (its own blocks per SM
x SMs))` waves.

Figures not in the hardware profile are this module's assumptions, named with their source:
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from tilekit.ir.control import ControlOp, Region, read_control
from tilekit.ir.keys import read_int, read_mapping
from tilekit.ir.model import default_kernels
from tilekit.ir.payloads import Estimate, is_split, refuse_cpu_tile
from tilekit.schedule.block import BARRIER_SHAPES, BodyBlock, shared_block
from tilekit.schedule.residency import Residency, common_residency, residency
from tilekit.schedule.shape import ITEMSIZE

#: One cooperative-groups grid barrier (grid.sync()) across a full persistent grid. Assumed:
#: published measurements put it at 1-3 us on V100/A100-class GPUs; not measured here.
GRID_SYNC_US = 2.0
#: One host round trip: a device-to-host copy of a flag plus the stream synchronisation it
#: waits for. Assumed: 5-10 us with CUDA's synchronous copies; not measured here.
HOST_SYNC_US = 8.0
#: Iterations assumed for a loop whose trip count is known only at run time and that
#: declares no maximum (the estimate says so: `trips_assumed`).
ASSUMED_TRIPS = 16


@dataclass(frozen=True)
class BodyKernel:
    """One kernel of a region as the cost model sees it (from tk-roll's tiles)."""

    name: str
    blocks: int
    threads: int
    regs: int
    smem_bytes: int
    time_us: float
    barriers: bool = False       # its kernel shape synchronises the block (staged, mma)
    collectives: bool = False    # warp collectives across lanes (a default kernel with lanes)
    launches: int = 1            # a nested control op: its own launches and host syncs
    syncs: int = 0

    def block(self) -> BodyBlock:
        """The body as the shared-block rule (tilekit.schedule.block) sees it."""
        return BodyBlock(self.name, self.threads, self.barriers,
                         not (self.barriers or self.collectives))


def body_kernels(region: Region, where: str = "region"
                 ) -> tuple[list[BodyKernel], str | None]:
    """The region's kernels with their launch figures, and why they cannot run inside a
    persistent kernel (None: they can). A nested control op counts as what its own
    placement costs (regions are placed inside out); an op without a tile costs nothing
    known and keeps the region on the host. `where` locates the region in messages."""
    out, why = [], None
    for kernel, ops, tile_path, g in _region_kernels(region, where):
        if g is not None:
            est = g.get("estimate") or {}
            device = g.get("run") == "device"
            out.append(BodyKernel(kernel.name, 0, 0, 0, 0,
                                  float(est.get("device_us" if device else "host_us", 0.0)),
                                  launches=1 if device else int(est.get("host_launches", 0)),
                                  syncs=0 if device else int(est.get("host_syncs", 0))))
            why = why or (f"its body holds control op '{ops[0].name}' (nested control flow "
                           "runs on the host around it)")
            continue
        untiled = [op.name for op in ops if not op.tile]
        if untiled:
            why = why or f"op '{untiled[0]}' has no tile (run tk-roll first)"
            continue
        figures = [_TileFigures.read(op.tile, tile_path(op)) for op in ops]
        split = [op.name for op in ops if is_split(op.tile)]
        if split:    # scratch partial sums and counters (or a second kernel): codegen's rule
            why = why or (f"op '{split[0]}' is split-K, which does not compose into a "
                          "persistent kernel")
        time_us = (Estimate.read(kernel.estimate, f"{where}.kernels ({kernel.name}).estimate")
                   .time_us if kernel.estimate else 0.0) or sum(f.time_us for f in figures)
        out.append(BodyKernel(kernel.name, max(f.blocks for f in figures),
                              max(f.threads for f in figures), max(f.regs for f in figures),
                              max(f.smem_bytes for f in figures), time_us,
                              len(ops) > 1 or any(f.barriers for f in figures),
                              any(f.collectives for f in figures)))
    return out, why


def _region_kernels(region: Region, where: str):
    """Each kernel of `region`: (kernel, its ops, the IR path of an op's tile, the `grind`
    record of the control op it is, else None)."""
    by_name = {op.name: op for op in region.ops}
    position = {op.name: i for i, op in enumerate(region.ops)}
    nested = read_control(region.control)

    def tile_path(op) -> str:
        return f"{where}.ops[{position[op.name]}] ({op.name}).tile"
    for kernel in region.kernels or default_kernels(region.ops):
        ops = [by_name[n] for n in kernel.ops]
        grind = (nested[ops[0].name].grind or {}) if ops[0].kind == "control" else None
        yield kernel, ops, tile_path, grind


_HINT = "re-run tk-roll"


class _TileFigures(NamedTuple):
    """What the cost model reads of a rolled op tile, each value checked (a tampered tile is
    an IRError at its path, exit 2)."""

    blocks: int
    threads: int
    regs: int
    smem_bytes: int
    time_us: float
    barriers: bool       # its kernel shape synchronises the block
    collectives: bool    # warp collectives across lanes

    @staticmethod
    def read(tile, where: str) -> "_TileFigures":
        refuse_cpu_tile(tile, where)
        t = read_mapping(tile, where, "a tile", _HINT)
        est = t.get("estimate")
        k = read_mapping(t.get("kernel") or {}, f"{where}.kernel", "'kernel'", _HINT)
        # the threads of the kernel codegen makes (`kernel.threads`: the default's when the
        # roll kept it over the tile), else the tile's
        threads = (read_int(k["threads"], f"{where}.kernel.threads", 1, hint=_HINT)
                   if "threads" in k else
                   read_int(t.get("threads", 1), f"{where}.threads", 1, hint=_HINT))
        return _TileFigures(
            read_int(t.get("blocks", 1), f"{where}.blocks", 1, hint=_HINT),
            threads,
            read_int(t.get("regs", 0), f"{where}.regs", hint=_HINT),
            read_int(t.get("smem_bytes", 0), f"{where}.smem_bytes", hint=_HINT),
            Estimate.read(est, f"{where}.estimate").time_us if est is not None else 0.0,
            isinstance(k.get("shape"), str) and k["shape"] in BARRIER_SHAPES,
            read_int(k.get("lanes", 1), f"{where}.kernel.lanes", 1, hint=_HINT) > 1)


@dataclass(frozen=True)
class Costs:
    """Both placements of one control op, per run of the op."""

    trips: int
    trips_assumed: bool
    host_us: float
    host_launches: int
    host_syncs: int
    device_us: float | None            # None: cannot run on the device (`why`)
    grid: int
    threads: int
    residency: Residency | None
    why: str = ""

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trips": self.trips, "host_us": round(self.host_us, 3),
            "host_launches": self.host_launches, "host_syncs": self.host_syncs}
        if self.trips_assumed:
            out["trips_assumed"] = True
        if self.device_us is not None:
            out.update({"device_us": round(self.device_us, 3), "device_launches": 1,
                        "device_syncs": 0, "grid": self.grid, "threads": self.threads})
            if self.residency is not None:      # a GPU's persistent grid
                out["residency"] = self.residency.why()
        return out


def trips_of(rec: ControlOp, scope) -> tuple[int, bool]:
    """The iterations to price: the scan length, the declared maximum, else an assumption."""
    if rec.kind == "if":
        return 1, False
    if rec.kind == "scan":
        src = scope[rec.scan_inputs[0]]
        return src.shape[rec.input_axes[0]], False
    if rec.max_trips is not None:
        return rec.max_trips, False
    return ASSUMED_TRIPS, True


def _host_run(kernels: list[BodyKernel]) -> tuple[float, int, int]:
    return (sum(k.time_us for k in kernels), sum(k.launches for k in kernels),
            sum(k.syncs for k in kernels))


def _device_run(profile, kernels: list[BodyKernel], grid: int) -> float:
    """One run of the region's kernels inside the persistent grid, barriers included."""
    launch_us = (profile.launch_overhead or 0.0) * 1e6
    total = 0.0
    for k in kernels:
        own = residency(profile, k.threads, k.regs, k.smem_bytes).grid or 1
        own_waves = math.ceil(k.blocks / own)
        rounds = math.ceil(k.blocks / grid)
        total += max(0.0, k.time_us - launch_us) * max(1.0, rounds / max(1, own_waves))
        total += GRID_SYNC_US
    return total


def control_costs(rec: ControlOp, scope, profile) -> Costs:
    """Host-driven and device figures of `rec` (see the module docstring)."""
    trips, assumed = trips_of(rec, scope)
    sides = [body_kernels(region, f"control.{rec.name}.{name}")
             for name, region in zip(rec.region_names(), rec.regions)]
    launch_us = (profile.launch_overhead or 0.0) * 1e6
    reasons = [why for _, why in sides if why]
    priced = [kernels for kernels, _ in sides]
    host = [_host_run(kernels) for kernels in priced]
    if rec.kind == "if":
        host_us = HOST_SYNC_US + sum(h[0] for h in host) / len(host)
        launches = max(h[1] for h in host)
        syncs = 1 + max(h[2] for h in host)
    else:
        per_iter, n, inner_syncs = host[0]
        copies = len(rec.scans)
        # the condition read before the first iteration and after each, the trip count once
        syncs = (trips + 1 if rec.cond else 0) + (1 if rec.trip_count else 0) + (
            trips * inner_syncs)
        host_us = trips * (per_iter + copies * launch_us) + syncs * HOST_SYNC_US
        launches = trips * (n + copies)
    if reasons:
        return Costs(trips, assumed, host_us, launches, syncs, None, 0, 0, None, reasons[0])
    bodies = [k for side in priced for k in side]
    if not bodies:
        return Costs(trips, assumed, host_us, launches, syncs, None, 0, 0, None,
                     "its regions hold no kernels")
    threads = shared_block(k.block() for k in bodies)
    if isinstance(threads, str):
        return Costs(trips, assumed, host_us, launches, syncs, None, 0, 0, None, threads)
    res = common_residency(profile, [(threads, k.regs, k.smem_bytes) for k in bodies])
    if res.grid < 1:
        return Costs(trips, assumed, host_us, launches, syncs, None, 0, 0, res,
                     f"no block fits co-resident ({res.why()})")
    grid = min(res.grid, max(k.blocks for k in bodies))
    runs = [_device_run(profile, side, grid) for side in priced]
    if rec.kind == "if":
        device_us = launch_us + sum(runs) / len(runs)
    else:
        carried_bytes = sum(scope[n].size * ITEMSIZE.get(scope[n].dtype, 4)
                            for n in (*rec.carried, *rec.scans))
        carry_us = carried_bytes / profile.dram_bandwidth * 1e6 + GRID_SYNC_US
        device_us = launch_us + trips * (runs[0] + carry_us)
    return Costs(trips, assumed, host_us, launches, syncs, device_us, grid, threads, res)


# -- on a CPU ----------------------------------------------------------------------------------

#: What the host adds per iteration of a loop it drives on a CPU, beyond the body's
#: kernels: the Python step of the compiled runtime (the iteration number and condition set,
#: the carried values and scan rows copied with NumPy, the condition read back) and the
#: ctypes call of the unit's program entry. Measured on a 2-core AVX-512 Xeon VM: 5-32 us a
#: step (tests/bench/test_cpu_grind_bench.py's LSTM and GRU of 256 units over 32 steps, the
#: host-driven median less the in-library one, on one thread and two).
CPU_HOST_STEP_US = 20.0


def cpu_body_kernels(region: Region, where: str = "region"
                     ) -> tuple[list[tuple[str, float, int]], str | None]:
    """(kernel, estimated us, parallel blocks) of a region rolled for a CPU profile, and why
    its kernels cannot run inside one compiled loop (None: they can): a nested control op
    placed on the host, or an op without a CPU tile. A nested control op placed inside
    compiled code is one of the body's kernels (the whole team runs it)."""
    from tilekit.ir.payloads import CpuOpTile, is_cpu_tile

    out, why = [], None
    for kernel, ops, tile_path, g in _region_kernels(region, where):
        if g is not None:
            est = g.get("estimate") or {}
            device = g.get("run") == "device"
            out.append((kernel.name, float(est.get("device_us" if device else "host_us", 0.0)),
                        2 if device else 1))
            if not device:
                why = why or (f"its body holds control op '{ops[0].name}', which runs on the "
                              "host")
            continue
        untiled = [op.name for op in ops if not is_cpu_tile(op.tile)]
        if untiled:
            why = why or f"op '{untiled[0]}' has no CPU tile (run tk-roll with a CPU profile)"
            continue
        tiles = [CpuOpTile.read(op.tile, tile_path(op), op.kind != "opaque") for op in ops]
        time_us = (Estimate.read(kernel.estimate, f"{where}.kernels ({kernel.name}).estimate")
                   .time_us if kernel.estimate else sum(t.estimate.time_us for t in tiles))
        out.append((kernel.name, time_us, max(t.blocks for t in tiles)))
    return out, why


def cpu_control_costs(rec: ControlOp, scope, profile) -> Costs:
    """Both placements of `rec` on a CPU profile.

    Driven by the host, each iteration is a Python step (`CPU_HOST_STEP_US`) and one call of
    the unit's program entry, a parallel region (the profile's fork/join) running the body's
    kernels. Inside compiled code (one persistent kernel whose blocks are the team's
    threads: tilekit.codegen.control) it is one fork/join for the whole loop, and per
    iteration a team barrier after each body kernel whose blocks the team shares (one-block
    kernels run on the first thread, in a chain without barriers) and after the slot and
    carried copies; a barrier is taken as half a fork/join (the join's half; assumed, not
    probed)."""
    trips, assumed = trips_of(rec, scope)
    sides = [cpu_body_kernels(region, f"control.{rec.name}.{name}")
             for name, region in zip(rec.region_names(), rec.regions)]
    fork_us = profile.fork_join_s * 1e6
    barrier_us = fork_us / 2
    bodies = [sum(t for _, t, _ in kernels) for kernels, _ in sides]
    counts = [sum(blocks > 1 for *_, blocks in kernels) for kernels, _ in sides]
    made = any(kernels for kernels, _ in sides)
    reasons = [why for _, why in sides if why]
    if rec.kind == "if":
        host_us = CPU_HOST_STEP_US + fork_us + sum(bodies) / len(bodies)
        launches, syncs = 1, 1
        device_us = fork_us + sum(b + barrier_us * c for b, c in zip(bodies, counts)) \
            / len(bodies)
    else:
        host_us = trips * (CPU_HOST_STEP_US + fork_us + bodies[0])
        launches = trips
        syncs = (trips + 1 if rec.cond else 0) + (1 if rec.trip_count else 0)
        device_us = fork_us + trips * (bodies[0] + barrier_us * (counts[0] + 2))
    if reasons:
        return Costs(trips, assumed, host_us, launches, syncs, None, 0, 0, None, reasons[0])
    if not made:
        return Costs(trips, assumed, host_us, launches, syncs, None, 0, 0, None,
                     "its regions hold no kernels")
    return Costs(trips, assumed, host_us, launches, syncs, device_us, profile.cores, 1, None)

