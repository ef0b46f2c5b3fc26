"""The estimated timeline of a program: when each rTask runs on its vEU.

`simulate(program)` replays every persistent segment item by item with the durations the
program records (`operators[i].task_us`): a task starts when its vEU is free, a wait releases
when the last task of the awaited operator ends. Under the serial policy an operator also
starts no earlier than the previous one (in the segment's order) ends: the program run one
operator at a time, which is what one kernel per operator would do without launch overhead.
A kernel segment lasts its operator's `kernel_us`. The report's makespans and the picture
(tilekit.ram.svg) are read from here, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilekit.ir.program import TASK, Program, Segment


@dataclass(frozen=True)
class Box:
    """One task item on the timeline (times in microseconds from the segment's start)."""

    veu: int
    op: int
    first: int
    count: int
    start: float
    end: float


@dataclass(frozen=True)
class Barrier:
    """A wait on its vEU: reached at `start`, released at `end` (when the awaited operator
    ended, or at once when it had already)."""

    veu: int
    op: int
    start: float
    end: float


@dataclass
class SegmentTimeline:
    index: int
    kind: str
    veus: int
    length_us: float
    boxes: list[Box] = field(default_factory=list)
    barriers: list[Barrier] = field(default_factory=list)


@dataclass
class Timeline:
    program: Program
    segments: list[SegmentTimeline]

    @property
    def segment_us(self) -> list[float]:
        return [s.length_us for s in self.segments]

    def kernel_us(self, op: int) -> float:
        return self.program.operators[op].kernel_us


def simulate(program: Program, boxes: bool = True) -> Timeline:
    """The timeline of `program`; without `boxes`, only the segments' lengths (faster)."""
    out = []
    for s, seg in enumerate(program.segments):
        if seg.kind == "kernel":
            op = program.operators[seg.operators[0]]
            out.append(SegmentTimeline(s, "kernel", 0, op.kernel_us))
        else:
            out.append(_persistent(program, s, seg, boxes))
    return Timeline(program, out)


def _persistent(program: Program, s: int, seg: Segment, record: bool) -> SegmentTimeline:
    """Work-list replay: run each vEU until it waits on an unfinished operator; when an
    operator's last task ends, wake its waiters."""
    serial = program.policy == "serial"
    order = list(seg.operators)
    gate = {op: (order[k - 1] if k else None) for k, op in enumerate(order)}
    remaining = {op: program.operators[op].tasks for op in seg.operators}
    finish: dict[int, float] = {}
    ends: dict[int, float] = {}
    waiters: dict[int, list[int]] = {}
    pos = [0] * seg.veus
    clock = [0.0] * seg.veus
    line = SegmentTimeline(s, "persistent", seg.veus, 0.0)
    pending = list(range(seg.veus))
    while pending:
        v = pending.pop()
        items = seg.lists[v]
        while pos[v] < len(items):
            it = items[pos[v]]
            need = it.op if it.kind != TASK else (gate[it.op] if serial else None)
            if need is not None and need not in finish:
                waiters.setdefault(need, []).append(v)
                break
            if it.kind != TASK:
                if record:
                    line.barriers.append(Barrier(v, it.op, clock[v], finish[it.op]))
                clock[v] = max(clock[v], finish[it.op])
                pos[v] += 1
                continue
            if need is not None:
                clock[v] = max(clock[v], finish[need])
            start = clock[v]
            clock[v] = start + it.count * program.operators[it.op].task_us
            if record:
                line.boxes.append(Box(v, it.op, it.first, it.count, start, clock[v]))
            remaining[it.op] -= it.count
            ends[it.op] = max(ends.get(it.op, 0.0), clock[v])
            if remaining[it.op] == 0:
                finish[it.op] = ends[it.op]
                pending.extend(waiters.pop(it.op, []))
            pos[v] += 1
    if any(pos[v] < len(seg.lists[v]) for v in range(seg.veus)):  # pragma: no cover
        raise RuntimeError("the program deadlocks (verify_program should have refused it)")
    line.boxes.sort(key=lambda b: (b.veu, b.start))
    line.barriers.sort(key=lambda b: (b.veu, b.start))
    line.length_us = max(clock, default=0.0)
    return line


__all__ = ["Barrier", "Box", "SegmentTimeline", "Timeline", "simulate"]
