"""The price of a group: the shared micro performance model (`tilekit.roll.cost`) applied to
the kernel the group becomes.

- **One stage** (a main op with elementwise ops chained onto it or inlined into it): the
  kernel is the main op's rolled kernel (staged, mma, tiled or default) with an epilogue, so
  the group's estimate is the members' single-op estimates combined by
  `cost.combine_estimates`, less the DRAM bytes of the intermediates that stay in registers
  (their store, and every in-group reader's load).
- **Several stages** (the fused kernel shape: each stage a block-wide loop over its region,
  results for later stages in shared memory): priced directly. Compute is every member's
  flops times its recompute over the SIMT peak and the wave efficiency; a stage that reduces
  reads its non-shared operands from the memory system at every reduction point (the fused
  shape does not stage them), served by L2; shared buffers are written once and read per
  point; DRAM moves the box of each external tensor the members read (the bounding box over
  its readers, once, times the worst reader's recompute: halos) and each stored result once,
  priced by the one formula, `tilekit.roll.cost.predict` (as a candidate tile of tk-roll).

Both are estimates, never measurements; docs/weld.md lists what the model cannot see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tilekit.expr.analysis import input_box
from tilekit.ir.graph import graph, per_module
from tilekit.ir.model import Module
from tilekit.ir.payloads import Estimate
from tilekit.roll.cost import Work, combine_estimates, machine, predict, prediction_estimate
from tilekit.roll.problem import ITEMSIZE
from tilekit.schedule.defaults import FUSED_REGS
from tilekit.roll.problem import tensor_bytes as total_bytes
from tilekit.weld.structure import Propagation, Structure

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


def _fused(module, s: Structure, prop: Propagation, profile, parts, threads, smem) -> Estimate:
    g = graph(module)
    m = machine(profile, module.tensors[g.nodes[s.members[-1]].writes[0]].dtype)
    written = {g.nodes[i].writes[0]: k for k, i in enumerate(s.members)}
    shared = {e.tensor for e in s.shared}
    flops = dram = l2 = smem_traffic = 0.0
    rereads: dict[str, float] = {}          # external tensor -> its readers' worst recompute
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
            if a.reduction and s.roles[k] == "stage":
                l2 += prop.work[k] * ITEMSIZE.get(module.tensors[t].dtype, 4)
    unique = 0.0
    for t, nbytes in external_bytes(module, s.members).items():
        dram += nbytes * rereads[t]
        unique += nbytes
    for e in s.shared:
        smem_traffic += tensor_bytes(module, e.tensor)
    for t in s.stored:
        dram += tensor_bytes(module, t)
        unique += tensor_bytes(module, t)
    # The one formula (tilekit.roll.cost.predict): compute over the waves, shared buffers
    # at the shared-memory bandwidth, global traffic (the boxes with their halo re-reads and
    # the operands a reducing stage reads per point, served by L2) against the compulsory
    # bytes from DRAM and the busiest SM's port.
    p = predict(m, Work(flops=flops, peak=m.peak, smem_traffic=smem_traffic,
                        block_bytes=(dram + l2) / max(prop.blocks, 1), traffic=dram + l2,
                        unique=unique, blocks=prop.blocks, threads=threads,
                        registers=FUSED_REGS, smem_bytes=smem, latency_steps=0))
    return prediction_estimate(p, flops, dram, smem_traffic)


def gain_us(module: Module, members: Sequence[int], estimate: Estimate) -> float:
    """Time saved by running `members` as one kernel: their single-op estimates' sum minus
    the group's estimate (Welder's connect-then-fuse test: fuse only when positive)."""
    return unwelded(module, members).time_us - estimate.time_us


def threads_for(points: int) -> int:
    """Threads of a fused block with `points` output points: whole warps, at most
    `FUSED_THREADS` (the stage loops are block-strided)."""
    return max(32, min(FUSED_THREADS, -(-points // 32) * 32))


__all__ = ["FUSED_THREADS", "Unwelded", "compulsory_bytes", "external_bytes", "gain_us", "group_estimate", "op_estimate",
           "saved_bytes", "tensor_bytes", "threads_for", "unwelded"]
