"""The price of a group: the shared micro performance model (`tilekit.roll.cost`) applied to
the kernel the group becomes.

- **One stage** (a main op with elementwise ops chained onto it or inlined into it): the
  kernel is the main op's rolled kernel (staged, mma, tiled or default) with an epilogue, so
  the group's estimate is the members' single-op estimates combined by
  `cost.combine_estimates`, less the DRAM bytes of the intermediates that stay in registers
  (their store, and every in-group reader's load).
- **Several stages** (the fused kernel shape: each stage a block-wide loop of passes over
  its region, results for later stages in shared memory): priced as that kernel runs,
  through the stage loops' thread mapping (a point per thread, or a lane group per point
  splitting the reduction: `tilekit.schedule.defaults.fused_lanes`, codegen's count).
  Compute is every member's flops times its recompute; the L1/shared-memory unit moves the
  shared buffers and one line per wavefront of every global read (`read_bytes`: a warp
  whose lanes read 32 rows costs 32 lines); global traffic is the reads' distinct
  transactions and each stored result, against the compulsory bytes (the box of each
  external tensor the members read, once) from DRAM; all priced by the one formula,
  `tilekit.roll.cost.predict`. Two terms it does not hold are added as floors: the block's
  passes in sequence, a memory round trip each (`ROUND_TRIP_S`, fitted on an H200), and a
  contraction no faster than at its own rolled tile.

Both are estimates; docs/weld.md has the measurements they were checked against and lists
what the model cannot see.
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from tilekit.expr.analysis import input_box
from tilekit.expr.reference import eval_index
from tilekit.ir.graph import graph, per_module
from tilekit.ir.model import Module
from tilekit.ir.payloads import BOUNDS, Estimate
from tilekit.roll.cost import Work, combine_estimates, machine, predict
from tilekit.roll.problem import ITEMSIZE
from tilekit.schedule.defaults import FUSED_REGS, WARP, fused_lanes
from tilekit.schedule.shape import walks_contiguously
from tilekit.roll.problem import tensor_bytes as total_bytes
from tilekit.weld.structure import Propagation, Structure, expanded_reads

#: Threads of a fused kernel whose tile has more points (extra points loop).
FUSED_THREADS = 256


def tensor_bytes(module: Module, name: str) -> int:
    """Bytes of tensor `name` (tilekit.roll.schedule.tensor_bytes of one tensor)."""
    return total_bytes(module, (name,))


def op_estimate(module: Module, i: int) -> Estimate:
    """The single-op estimate tk-roll recorded for op `i` (a control op has no tile: the
    estimate of the kernel group tk-roll gave it, one run of its regions)."""
    op = module.ops[i]
    if op.kind == "control":
        n, kernel = next((n, k) for n, k in enumerate(module.kernels) if op.name in k.ops)
        return Estimate.read(kernel.estimate, f"kernels[{n}] ({kernel.name}).estimate")
    return Estimate.read((op.tile or {}).get("estimate"), f"ops[{i}] ({op.name}).tile.estimate")


@dataclass(frozen=True)
class Unwelded:
    """The members run as the kernels they were before welding (one per op)."""

    time_us: float
    dram_bytes: float
    kernels: int


def unwelded(module: Module, members: Sequence[int]) -> Unwelded:
    parts = [op_estimate(module, i) for i in members]
    return Unwelded(sum(p.time_us for p in parts), sum(p.dram_bytes for p in parts),
                    len(parts))


def compulsory_bytes(module: Module, kernels: Sequence[Sequence[int]]) -> int:
    """DRAM bytes no schedule of these kernels can avoid: every tensor a kernel reads from
    outside it, and every result it stores (read by a later kernel, or an output), once.
    The fusion's effect alone, without tk-roll's model of re-reads."""
    g = graph(module)
    total = 0
    for members in kernels:
        inside = set(members)
        written = {t for i in members for t in g.nodes[i].writes}
        reads = {t for i in members for t in g.nodes[i].reads if t not in written}
        stored = {t for t in written if t in g.outputs
                  or any(r not in inside for r in g.consumers.get(t, ()))}
        total += sum(tensor_bytes(module, t) for t in reads | stored)
    return total


_EXTERNAL: dict[int, dict] = {}


def external_bytes(module: Module, members: Sequence[int]) -> dict[str, int]:
    """External tensor -> bytes of the bounding box the members read of it (clamped to the
    tensor), over the whole iteration spaces: what a group must load at least once. Cached
    per module and group (it does not depend on the tile)."""
    cache = per_module(_EXTERNAL, module, lambda m: {})
    key = tuple(members)
    if key not in cache:
        g = graph(module)
        written = {g.nodes[i].writes[0] for i in members}
        boxes: dict[str, list[tuple[int, int]]] = {}
        for i in members:
            a = g.nodes[i].analysis
            for acc in a.accesses:
                if acc.tensor in written:
                    continue
                box = input_box(a, acc, clamp=True)
                old = boxes.get(acc.tensor)
                boxes[acc.tensor] = box if old is None else [
                    (min(x[0], y[0]), max(x[1], y[1])) for x, y in zip(old, box)]
        cache[key] = {t: math.prod(max(0, hi - lo) for lo, hi in box)
                      * ITEMSIZE.get(module.tensors[t].dtype, 4) for t, box in boxes.items()}
    return cache[key]


def saved_bytes(module: Module, s: Structure) -> float:
    """DRAM bytes an edge on chip saves: the producer's store (unless it is stored anyway)
    and one load per in-group reader."""
    saved = 0.0
    for e in s.edges:
        nbytes = tensor_bytes(module, e.tensor)
        saved += nbytes * len(e.consumers) + (0 if e.stored else nbytes)
    return saved


def group_estimate(module: Module, s: Structure, prop: Propagation | None, profile,
                   threads: int = FUSED_THREADS, smem: int = 0) -> Estimate:
    """The estimate of group `s` (see the module docstring); `prop` is needed for several
    stages, with the kernel's `threads` and shared-memory footprint `smem`."""
    parts = [op_estimate(module, i) for i in s.members]
    if s.stages == 1:
        main = s.members[s.roles.index("stage")]
        return combine_estimates(profile, parts, saved_bytes(module, s),
                                 op_estimate(module, main))
    if prop is None:
        raise ValueError("a group of several stages needs its propagation")
    return _fused(module, s, prop, profile, parts, threads, smem)


#: One memory round trip of a fused-shape pass (s): a pass issues its loads, waits for them,
#: and the next pass (or stage, after its barrier) starts only then. Fitted on the Nsight
#: Compute durations of the four multi-stage kernels of the welded BERT encoder layer (test
#: size) on an H200 (tests/bench/results/ncu-h200.json; docs/weld.md, "Measured"), in line
#: with the L2 hit latency of an H100 (about 260 cycles at 1.98 GHz).
ROUND_TRIP_S = 0.16e-6
#: Iterations of a reduction loop whose loads ptxas issues together: the body of the BERT-base
#: FFN stage's lane loop (trip count unknown to ptxas) is unrolled by 16 with its 16 loads
#: first (sm_90, CUDA 13.0; its remainder loop by 4), and short fixed loops are unrolled
#: whole, so a loop of `n` iterations waits about `ceil(n / LOOP_UNROLL)` round trips.
LOOP_UNROLL = 16


@dataclass(frozen=True)
class _Read:
    """A read as tilekit.schedule.shape.walks_contiguously sees it."""

    tensor: str
    maps: tuple


@lru_cache(maxsize=4096)
def read_bytes(maps, shape: tuple[int, ...], itemsize: int, txn: int, line: int, spatial,
               lens, lanes: int, red: tuple[str, int] | None, over_reduction: bool
               ) -> tuple[float, float]:
    """(L1, L2) bytes per point of a fused stage's read through index maps `maps` into a
    tensor of `shape`, counted on the block's first warp as the stage loops map it
    (consecutive threads take consecutive points of the region, innermost axis first, or
    `lanes` threads share a point and split the innermost reduction axis `red`), over
    `txn / itemsize` iterations of the reduction loop when the read is `over_reduction`:

    - L1: every warp-wide load is served in one wavefront per distinct `line`-byte line it
      touches (the unified L1/shared-memory unit moves a line per clock), so a load whose
      lanes read 32 rows costs 32 lines for 128 useful bytes (a weight [K, N] read by lanes
      along K, a depthwise convolution over the channels of an NCHW map);
    - L2: the distinct `txn`-byte transactions over those iterations (a thread walking a
      row in its own loop is served by L1 after the first element of each transaction).

    The rule of tilekit.roll.cost.default_estimate (coalesced, broadcast, a transaction per
    element), counted on the fused shape's thread mapping."""
    group = min(lanes, WARP)                       # lanes of one point inside a warp
    npoints = max(1, min(WARP // group, math.prod(lens)))
    pt = np.arange(npoints, dtype=np.int64)
    coords: dict[str, np.ndarray] = {}
    for (axis, _), n in zip(reversed(spatial), reversed(lens)):
        coords[axis] = pt % max(n, 1)
        pt = pt // max(n, 1)
    steps = 1
    if over_reduction and red is not None:
        steps = max(1, min(txn // itemsize, -(-red[1] // max(lanes, 1))))
    lane = np.arange(group, dtype=np.int64)
    it = np.arange(steps, dtype=np.int64)
    shape3 = (npoints, group, steps)
    grid = {a: np.broadcast_to(v[:, None, None], shape3) for a, v in coords.items()}
    if over_reduction and red is not None:
        grid[red[0]] = np.broadcast_to((lane[:, None] + it[None, :] * max(lanes, 1))[None],
                                       shape3)
    zero = np.zeros(shape3, dtype=np.int64)
    address = zero.copy()
    stride = 1
    for mp, n in zip(reversed(maps), reversed(shape)):
        value = eval_index(mp.node, lambda name: grid.get(name, zero))
        address = address + np.asarray(value, dtype=np.int64) * stride
        stride *= max(int(n), 1)
    byte = address * itemsize
    reads = npoints * (group if over_reduction else 1) * steps
    # distinct lines per iteration (one key per iteration and line), distinct transactions
    # over all of them
    lines = len(np.unique((byte // line) * steps + np.arange(steps, dtype=np.int64)))
    sectors = len(np.unique(byte // txn))
    return lines * line / reads, sectors * txn / reads


_READS: dict[int, dict] = {}


def member_reads(module: Module, s: Structure) -> tuple[tuple[_Read, ...], ...]:
    """Per member, its reads as the kernel issues them (inlined producers expanded into
    their readers, tilekit.weld.structure); cached per module and group (they do not
    depend on the tile)."""
    cache = per_module(_READS, module, lambda m: {})
    if s.members not in cache:
        g = graph(module)
        inline = {g.nodes[i].writes[0]: i for i, r in zip(s.members, s.roles) if r == "inline"}
        cache[s.members] = tuple(
            () if r == "inline" else tuple(_Read(t, tuple(maps)) for t, maps in
                                           expanded_reads(module, i, inline))
            for i, r in zip(s.members, s.roles))
    return cache[s.members]


#: Rolled kernel shapes that reuse a contraction's operands from shared memory or registers
#: (tilekit.schedule.shape); the fused shape's plain loop does not.
REUSING_SHAPES = frozenset({"staged", "simt", "mma", "wgmma", "tiled"})


def _forced(module: Module, i: int, a) -> bool:
    """Does the fused shape force a plain loop on op `i`, a contraction that tk-roll gave a
    kernel reusing its operands?"""
    shape = ((module.ops[i].tile or {}).get("kernel") or {}).get("shape")
    return (bool(a.reduction) and len({acc.tensor for acc in a.accesses}) > 1
            and shape in REUSING_SHAPES)


def _fused(module, s: Structure, prop: Propagation, profile, parts, threads, smem) -> Estimate:
    g = graph(module)
    m = machine(profile, module.tensors[g.nodes[s.members[-1]].writes[0]].dtype)
    written = {g.nodes[i].writes[0]: k for k, i in enumerate(s.members)}
    shared = {e.tensor for e in s.shared}
    expanded = member_reads(module, s)
    warps_threads = -(-threads // WARP) * WARP      # the kernel's block: whole warps
    flops = dram = smem_traffic = pulled = wavefronts = 0.0
    line = profile.smem_transaction_bytes        # a wavefront of the L1/shared unit
    trips = 0.0                              # memory round trips one block waits, in sequence
    floor = 0.0                              # the contractions at their own rolled tiles
    rereads: dict[str, float] = {}          # external tensor -> its readers' worst recompute
    lanes_of: dict[int, int] = {}           # stage -> lanes per point
    for k, i in enumerate(s.members):
        a = g.nodes[i].analysis
        factor = prop.work[k] / max(1.0, prop.own[k])
        flops += parts[k].flops * factor
        for acc in a.accesses:
            t = acc.tensor
            if t in written:
                if t in shared:
                    smem_traffic += prop.work[k] * tensor_bytes(module, t) / module.tensors[t].size
                continue
            rereads[t] = max(rereads.get(t, 1.0), min(factor, prop.blocks))
        if s.roles[k] == "inline":           # read through its readers' expanded reads
            continue
        lens = prop.lengths(k)
        points = math.prod(lens)
        reads = expanded[k]
        innermost = a.reduction[-1] if a.reduction else None
        if s.roles[k] == "stage":
            lanes = fused_lanes(a.reduction, walks_contiguously(a.reduction, reads), points,
                                warps_threads)
            lanes_of[s.stage_of[k]] = lanes
            passes = -(-points // max(1, warps_threads // lanes))
            steps = -(-math.prod(n for _, n in a.reduction) // lanes) if a.reduction else 0
            trips += passes * (1 + -(-steps // LOOP_UNROLL))
            if _forced(module, i, a):
                own = parts[k].time_us - parts[k].latency_us - m.launch_s * 1e6
                floor += max(0.0, own) * 1e-6 * factor
            lanes_here = lanes
        else:                # a chain op: the stage's epilogue, on one lane of each group
            lanes_here = lanes_of[s.stage_of[k]]
        red = {n for n, _ in a.reduction}
        for r in reads:
            if r.tensor in written:
                continue
            item = ITEMSIZE.get(module.tensors[r.tensor].dtype, 4)
            over = any(ax in red for mp in r.maps for ax in mp.axes)
            l1, l2 = read_bytes(r.maps, tuple(module.tensors[r.tensor].shape), item,
                                m.transaction_bytes, line, tuple(a.spatial), tuple(lens),
                                lanes_here, innermost, over)
            count = prop.work[k] if over else prop.blocks * points
            wavefronts += l1 * count
            pulled += l2 * count
    unique = 0.0
    for t, nbytes in external_bytes(module, s.members).items():
        dram += nbytes * rereads[t]
        unique += nbytes
    for e in s.shared:
        smem_traffic += tensor_bytes(module, e.tensor)
    for t in s.stored:
        dram += tensor_bytes(module, t)
        unique += tensor_bytes(module, t)
        pulled += tensor_bytes(module, t)
    traffic = max(dram, pulled)
    # The one formula (tilekit.roll.cost.predict): compute over the waves; the L1/shared
    # unit moving the shared buffers and a line per wavefront of every global load (the
    # fused shape's thread mapping: a warp reading 32 rows costs 32 lines); the global
    # traffic the blocks pull (distinct transactions; halos and re-reads served by L2)
    # against the compulsory bytes from DRAM and the busiest SM's port.
    p = predict(m, Work(flops=flops, peak=m.peak, smem_traffic=smem_traffic + wavefronts,
                        block_bytes=traffic / max(prop.blocks, 1), traffic=traffic,
                        unique=unique, blocks=prop.blocks, threads=threads,
                        registers=FUSED_REGS, smem_bytes=smem, latency_steps=0))
    top = float(p.time_s) - m.launch_s
    # What the throughput terms leave out. The serial work: every SM runs `waves` rounds of
    # its blocks, each block its passes one after another, a round trip each and one per
    # `LOOP_UNROLL` steps of a reduction loop; a grid of a few blocks on 132 SMs pays it
    # whole. And the forced tile: a contraction run as the fused shape's plain loop is no
    # faster than at its own rolled tile (tk-roll searched that tile for this op alone).
    chain = float(p.waves) * trips * ROUND_TRIP_S
    busy = max(top, chain, floor)
    bound = BOUNDS[int(p.bound)]
    if busy > top:
        bound = "latency" if chain >= floor else "compute"
    if m.launch_s > busy:
        bound = "launch"
    return Estimate(time_us=(busy + m.launch_s) * 1e6, flops=float(flops),
                    dram_bytes=float(dram), smem_bytes=float(smem_traffic), bound=bound,
                    waves=int(p.waves), wave_efficiency=float(p.eff),
                    latency_us=chain * 1e6)


def gain_us(module: Module, members: Sequence[int], estimate: Estimate) -> float:
    """Time saved by running `members` as one kernel: their single-op estimates' sum minus
    the group's estimate (Welder's connect-then-fuse test: fuse only when positive)."""
    return unwelded(module, members).time_us - estimate.time_us


def threads_for(points: int) -> int:
    """Threads of a fused block with `points` output points: whole warps, at most
    `FUSED_THREADS` (the stage loops are block-strided)."""
    return max(32, min(FUSED_THREADS, -(-points // 32) * 32))


__all__ = ["FUSED_THREADS", "LOOP_UNROLL", "REUSING_SHAPES", "ROUND_TRIP_S", "Unwelded",
           "compulsory_bytes", "external_bytes", "gain_us", "group_estimate", "member_reads",
           "op_estimate", "read_bytes", "saved_bytes", "tensor_bytes", "threads_for",
           "unwelded"]
