"""The exchange a plan implies on a distributed-memory device (the IPU profile: tiles as vEUs).

On a machine without shared global memory every vEU (tile) holds what it computed; an rTask
that reads data another tile produced needs it sent over the exchange first. `exchange_volume`
replays the program's placement: each element of every computed tensor is owned by the vEU
whose rTask wrote it (an ordinary-kernel segment spreads its blocks round-robin over the
tiles); each rTask's reads (the input box of every access, halo included, clamped: the same
regions the CPU program mode checks) count the elements owned by another vEU. Inputs and
weights are streamed from off-chip memory and counted apart. It is a volume, not a time: a
real IPU program would also replicate or re-layout data, which this count does not plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilekit.expr.analysis import input_box
from tilekit.ir.graph import graph
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.program import TASK, Program
from tilekit.schedule.shape import ITEMSIZE


@dataclass(frozen=True)
class Exchange:
    bytes: int              # read by an rTask from another vEU's results
    local_bytes: int        # read from the rTask's own vEU
    streamed_bytes: int     # inputs and weights read (from off-chip memory)
    veus: int

    def describe(self) -> str:
        total = self.bytes + self.local_bytes
        share = 100.0 * self.bytes / total if total else 0.0
        return (f"{share:.1f}% of computed data read by rTasks crosses tiles; "
                f"{self.local_bytes} B local, {self.streamed_bytes} B of inputs and weights "
                f"streamed, over {self.veus} vEUs")


def _placements(program: Program) -> list[tuple[int, int, int]]:
    """(operator, block, vEU) of every rTask, in run order."""
    out = []
    for seg in program.segments:
        if seg.kind == "kernel":
            op = seg.operators[0]
            veus = max((s.veus for s in program.segments), default=1) or 1
            out.extend((op, b, b % veus) for b in range(program.operators[op].tasks))
            continue
        for v, items in enumerate(seg.lists):
            for it in items:
                if it.kind == TASK:
                    out.extend((it.op, b, v) for b in range(it.first, it.first + it.count))
    return out


def _region_bytes(module: Module, owner, tensor: str, region, v: int) -> tuple[int, int, int]:
    """(remote, local, streamed) bytes of reading `region` of `tensor` on vEU `v`."""
    size = ITEMSIZE.get(module.tensors[tensor].dtype, 4)
    if tensor not in owner:  # an input or a weight
        return 0, 0, int(np.prod([s.stop - s.start for s in region])) * size
    where = owner[tensor][region]
    away = int(np.count_nonzero(where != v))
    return away * size, (where.size - away) * size, 0


def _boxes(module: Module, node, boxes, owner, v: int) -> tuple[int, int, int]:
    a = node.analysis
    total = [0, 0, 0]
    for box in boxes:
        spatial = dict(zip((x for x, _ in a.spatial), box))
        for k, access in enumerate(a.accesses):
            region = tuple(slice(lo, hi) for lo, hi in input_box(a, k, spatial, clamp=True))
            for i, n in enumerate(_region_bytes(module, owner, access.tensor, region, v)):
                total[i] += n
        out = node.writes[0]
        if out not in owner:
            owner[out] = np.full(module.tensors[out].shape, -1, dtype=np.int32)
        owner[out][tuple(slice(lo, hi) for lo, hi in box)] = v
    return total[0], total[1], total[2]


def _opaque(module: Module, node, owner, v: int, b: int) -> tuple[int, int, int]:
    """An opaque op reads its inputs whole (counted once, at its block 0); its outputs are
    owned by the vEU of block 0."""
    total = [0, 0, 0]
    if b == 0:
        for t in node.reads:
            region = tuple(slice(0, d) for d in module.tensors[t].shape)
            for i, n in enumerate(_region_bytes(module, owner, t, region, v)):
                total[i] += n
        for t in node.writes:
            if t:
                owner[t] = np.full(module.tensors[t].shape, v, dtype=np.int32)
    return total[0], total[1], total[2]


def exchange_volume(module: Module, program: Program) -> Exchange:
    from tilekit.ram.tasks import operators, program_profile

    profile = program_profile(program)
    rops = operators(module, profile)
    kernels = module.kernels or default_kernels(module.ops)
    g = graph(module)
    owner: dict[str, np.ndarray] = {}
    remote = local = streamed = 0
    layouts = {}
    for op, b, v in _placements(program):
        if op not in layouts:
            layouts[op] = rops[op].variant(program.operators[op].variant).layout
        lay = layouts[op]
        boxes = lay.boxes(b) if lay.kind != "whole" else lay.boxes(0)
        for name in kernels[op].ops:
            node = g.node(name)
            counts = _opaque(module, node, owner, v, b) if node.analysis is None else \
                _boxes(module, node, boxes, owner, v)
            remote, local, streamed = remote + counts[0], local + counts[1], \
                streamed + counts[2]
    veus = max((s.veus for s in program.segments), default=0)
    return Exchange(remote, local, streamed, veus)


__all__ = ["Exchange", "exchange_volume"]
