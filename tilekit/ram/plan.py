"""Rammer's scheduling: rOperators cut into segments, their rTasks packed onto vEUs.

`plan(module, profile, policy)` -> `Program` (tilekit.ir.program). The steps:

1. **Waves.** An operator's wave is one more than the latest wave of the operators it reads
   from. Segments are cut along these waves under both policies; within a segment the
   wavefront policy packs wave by wave, the serial policy one operator at a time in module
   order (each starting when the previous one ended: the comparison Rammer draws).
2. **Segments.** Operators are taken wave by wave. One that fills the device by itself (its
   best variant has at least one full wave of co-resident blocks) or that cannot be packed
   (`ROperator.fixed`) stays an ordinary kernel between segments; the others join the current
   persistent segment while they share its threads per block (a body runs on exactly the
   block's threads: its barriers count them all). Within a wave, operators with the current
   segment's threads come first, so a wave splits into as few segments as it must. The
   segment's vEUs are what co-residency allows for a slot that fits every body placed on it
   (`tilekit.schedule.residency.common_residency`).
3. **Packing.** Within a segment, wave by wave, each operator's variants (the roll's top-k
   with the segment's threads) are tried: every task goes to the vEU that frees first, no
   earlier than the operator's producers finish; the variant whose last task ends first wins
   (fewer tasks on a tie: fewer, longer tasks when the wave is full, more when it is not).
   A vEU's tasks of one operator get consecutive blocks.
4. **Barriers.** Before a vEU's first task of an operator, a wait on each producer in the
   segment that this vEU has not waited on yet, unless all of the producer's tasks ran
   earlier on this vEU.

Everything is deterministic: ties break on indices, never on hashes or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilekit.errors import TilekitError
from tilekit.ir.model import Module
from tilekit.ir.program import (TASK, WAIT, Item, Operator, Program, Segment, operator_flow,
                                verify_program)
from tilekit.ir.payloads import round_sig
from tilekit.ram.tasks import ROperator, Variant, launch_us, operators
from tilekit.ram.timeline import simulate
from tilekit.schedule.residency import common_residency, residency


#: Registers a body is assumed to need in a program beyond the cost model's estimate: the
#: walk over the vEU's items and the switch live across the bodies. The estimate itself is
#: calibrated to 0.56-1.5x of ptxas' for a kernel alone (docs/architecture.md), and in a
#: program ptxas allocates for the most demanding body plus the loop, and more when many
#: bodies share the kernel, so the slot takes 5/4 of the estimate (at least
#: `PROGRAM_MIN_REGS`) plus this. The program's `__launch_bounds__`
#: caps ptxas at what co-residency allows; too tight a cap spills, which
#: `tk-codegen --compile --strict` refuses.
PROGRAM_REGS = 24
#: The least a body is assumed to need in a program: ptxas gave a program of 14 tiled bodies
#: estimated (and compiled alone) at 16-20 registers 74 (Inception v2 on the H100).
PROGRAM_MIN_REGS = 48


#: Register-file partitions per SM (sm_70 and later): a block's warps are spread over them.
PARTITIONS = 4


def launch_bound_regs(profile, threads: int, per_sm: int) -> int:
    """The registers per thread ptxas allows under `__launch_bounds__(threads, per_sm)`:
    the resident warps spread over the SM's register-file partitions, a multiple of 8 (what
    ptxas 13 gives: 224 threads x 3 blocks get 80, not the 96 of the SM-wide division)."""
    warps = -(-threads // profile.warp_size) * per_sm
    per_partition = profile.regs_per_sm // PARTITIONS
    regs = per_partition // (-(-warps // PARTITIONS) * profile.warp_size)
    return min(profile.max_regs_per_thread, regs // 8 * 8)


def launch_bound_blocks(profile, threads: int, regs: int, per_sm: int) -> int:
    """`per_sm` lowered until ptxas can give each thread `regs` registers at it (>= 1)."""
    while per_sm > 1 and launch_bound_regs(profile, threads, per_sm) < regs:
        per_sm -= 1
    return per_sm


def program_regs(v: Variant) -> int:
    """Registers per thread planned for `v`'s body in a persistent program."""
    return -(-max(v.regs, PROGRAM_MIN_REGS) * 5 // 32) * 8 + PROGRAM_REGS


@dataclass
class _Open:
    """A persistent segment being formed: its slot's threads, and whether a member's body
    holds block barriers (then the slot's threads are that body's, exactly); the slot's
    registers and shared memory are the most of any member's. It holds at most one SIMT
    GEMM body (tilekit.codegen.simt), the member whose own choice it is (`pack_segment`
    gives no other member a SIMT candidate): 8x8 register tiles take 119-159 registers in
    a kernel of their own, and a program holding two (ResNet-50's 1x1 convolutions rolled
    for the H100) took more than a thread's 255 and spilled (ptxas 13.0); one beside
    smaller bodies (BERT-base's attention product) did not."""

    threads: int
    members: list[int]
    pinned: bool
    regs: int = 0
    smem: int = 0
    simt: bool = False      # a member runs as the SIMT GEMM (at most one)

    def admits(self, v: Variant, holds) -> bool:
        """`holds(threads, registers, smem)`: an SM holds a block of that slot."""
        if v.shape == "simt" and self.simt:
            return False
        if v.barriers:
            fits = v.threads == self.threads or (not self.pinned and v.threads >= self.threads)
        else:
            fits = v.threads <= self.threads or not self.pinned
        # each body fits an SM alone, but the slot takes the most of every resource: a
        # 1024-thread body beside a 72-register one would make a slot no SM holds
        return fits and holds(max(self.threads, v.threads), max(self.regs, program_regs(v)),
                              max(self.smem, v.smem_bytes))

    def add(self, i: int, v: Variant) -> None:
        self.members.append(i)
        self.threads = max(self.threads, v.threads)
        self.pinned = self.pinned or v.barriers
        self.regs = max(self.regs, program_regs(v))
        self.smem = max(self.smem, v.smem_bytes)
        self.simt = self.simt or v.shape == "simt"


def waves(ops: tuple[ROperator, ...], producers: list[set[int]], policy: str) -> list[int]:
    if policy == "serial":
        return list(range(len(ops)))
    level: list[int] = []
    for i in range(len(ops)):
        level.append(1 + max((level[p] for p in producers[i]), default=-1))
    return level


def fills_device(profile, v: Variant) -> bool:
    """One full wave of co-resident blocks or more: nothing gained by packing it."""
    r = residency(profile, v.threads, v.regs, v.smem_bytes)
    return r.grid == 0 or v.tasks >= r.grid


def segments_of(ops: tuple[ROperator, ...], level: list[int], profile
                ) -> list[tuple[str, list[int], int]]:
    """(kind, operators, threads) per segment, in run order (step 2 of the module docstring).
    On a distributed profile (tiles as vEUs, no kernel launches) every operator that can be
    packed joins one segment."""
    distributed = profile.kind == "distributed"
    held: dict[tuple[int, int, int], bool] = {}

    def holds(threads: int, regs: int, smem: int) -> bool:
        key = (threads, regs, smem)
        if key not in held:
            held[key] = residency(profile, threads, regs, smem).per_sm >= 1
        return held[key]

    out: list[tuple[str, list[int], int]] = []
    current: _Open | None = None
    by_wave: dict[int, list[int]] = {}
    for i, lv in enumerate(level):
        by_wave.setdefault(lv, []).append(i)
    for lv in sorted(by_wave):
        members = by_wave[lv]
        if current is not None:
            members = sorted(members, key=lambda i: (not current.admits(ops[i].best, holds), i))
        for i in members:
            op = ops[i]
            if op.fixed or (not distributed and fills_device(profile, op.best)):
                if current is not None:
                    out.append(("persistent", current.members, current.threads))
                    current = None
                out.append(("kernel", [i], op.best.threads))
                continue
            if current is not None and not distributed and not current.admits(op.best, holds):
                out.append(("persistent", current.members, current.threads))
                current = None
            if current is None:
                current = _Open(op.best.threads, [], False)
            current.add(i, op.best)
    if current is not None:
        out.append(("persistent", current.members, current.threads))
    # A persistent kernel of one operator gains nothing over its ordinary kernel.
    return [("kernel", m, t) if kind == "persistent" and len(m) == 1 else (kind, m, t)
            for kind, m, t in out]


def _fits(v: Variant, threads: int, regs: int, smem: int) -> bool:
    if threads == 0:  # a distributed device: a tile runs any body
        return True
    fits_threads = v.threads == threads if v.barriers else v.threads <= threads
    return fits_threads and program_regs(v) <= regs and v.smem_bytes <= smem


def _trial(free: np.ndarray, tasks: int, task_us: float, ready: float
           ) -> tuple[float, list[tuple[int, int]]]:
    """Place `tasks` equal tasks one by one on the vEU that frees first (ties: the lowest
    index), none starting before `ready`: (finish, [(vEU, tasks on it)]).

    Computed without the loop: the tasks take the `tasks` smallest start times
    `max(free[v], ready) + k * task_us`; a bisection finds the threshold below which there
    are at least that many, and the surplus at the threshold goes from the highest index."""
    eff = np.maximum(free, ready)
    d = max(task_us, 1e-12)
    lo, hi = float(eff.min()), float(eff.min()) + tasks * d

    def count(x: float) -> np.ndarray:  # starts strictly below x, per vEU
        return np.maximum(np.ceil((x - eff) / d - 1e-9), 0).astype(np.int64)

    for _ in range(64):
        mid = (lo + hi) / 2
        if count(mid).sum() >= tasks:
            hi = mid
        else:
            lo = mid
        if hi - lo <= d * 1e-6:
            break
    n = count(hi)
    surplus = int(n.sum()) - tasks
    if surplus > 0:  # drop the latest starts, ties from the highest vEU index
        last = np.where(n > 0, eff + (n - 1) * d, -np.inf)
        order = np.lexsort((-np.arange(len(n)), -last))
        for v in order[:surplus]:
            n[v] -= 1
    used = np.nonzero(n)[0]
    finish = float((eff[used] + n[used] * d).max()) if len(used) else ready
    return finish, [(int(v), int(n[v])) for v in used]


def pack_segment(ops: tuple[ROperator, ...], members: list[int], level: list[int],
                 producers: list[set[int]], veus: int, threads: int, regs: int, smem: int,
                 policy: str) -> tuple[list[list[Item]], dict[int, Variant]]:
    """The vEU lists of one persistent segment and each member's chosen variant (step 3)."""
    free = np.zeros(veus)
    finish: dict[int, float] = {}
    chosen: dict[int, Variant] = {}
    lists: list[list[Item]] = [[] for _ in range(veus)]
    waited: list[set[int]] = [set() for _ in range(veus)]
    ran: list[dict[int, int]] = [{} for _ in range(veus)]
    inside = set(members)
    previous_end = 0.0
    for i in sorted(members, key=lambda i: (level[i], i)):
        deps = producers[i] & inside
        ready = max((finish[p] for p in deps), default=0.0)
        if policy == "serial":
            ready = max(ready, previous_end)
        best = None
        for v in ops[i].variants:
            if not _fits(v, threads, regs, smem):
                continue
            if v.shape == "simt" and ops[i].best.shape != "simt":
                continue    # the segment's one SIMT body is its own member's (_Open)
            end, counts = _trial(free, v.tasks, v.task_us, ready)
            key = (end, v.tasks, v.index)
            if best is None or key < best[0]:
                best = (key, v, counts)
        if best is None:  # pragma: no cover - the best variant always fits its own slot
            raise TilekitError(f"operator {ops[i].kernel} fits no slot", "program")
        _, variant, counts = best
        chosen[i] = variant
        first = 0
        for v, n in counts:
            for p in sorted(deps):
                if p not in waited[v] and ran[v].get(p, 0) < chosen[p].tasks:
                    lists[v].append(Item(WAIT, p, 0, chosen[p].tasks))
                    waited[v].add(p)
            lists[v].append(Item(TASK, i, first, n))
            ran[v][i] = n
            first += n
            free[v] = max(free[v], ready) + n * variant.task_us
        finish[i] = max(free[v] for v, _ in counts)
        previous_end = finish[i]
    return lists, chosen


def plan(module: Module, profile, policy: str = "wavefront", hardware: str | None = None,
         verify: bool = True, ops: tuple[ROperator, ...] | None = None) -> Program:
    """The program of `module` on `profile` under `policy` (see the module docstring);
    verified (tilekit.ir.program.verify_program) unless `verify` is false (a plan made only
    for its estimate)."""
    ops = ops if ops is not None else operators(module, profile)
    producers, _ = operator_flow(module)
    # Both policies run the same segments (cut along the wavefront); the serial policy only
    # orders each segment's operators one after another.
    cut = waves(ops, producers, "wavefront")
    level = waves(ops, producers, policy)
    launch, source = launch_us(profile)
    chosen: dict[int, Variant] = {}
    segment_of: dict[int, int] = {}
    segments: list[Segment] = []
    for s, (kind, members, threads) in enumerate(segments_of(ops, cut, profile)):
        for i in members:
            segment_of[i] = s
        if kind == "kernel":
            chosen[members[0]] = ops[members[0]].best
            segments.append(Segment("kernel", tuple(members)))
            continue
        if profile.kind == "distributed":  # one vEU per tile, any body
            veus, why, fit = profile.sm_count, (f"one vEU per tile: {profile.sm_count} tiles "
                                                "of distributed memory"), (0, 0, 0)
        else:
            slot = common_residency(profile, [(threads, program_regs(ops[i].best),
                                               ops[i].best.smem_bytes) for i in members])
            per_sm = launch_bound_blocks(profile, threads, slot.registers, slot.per_sm)
            veus, why = per_sm * profile.sm_count, slot.why()
            if per_sm < slot.per_sm:
                why += (f"; {per_sm} block(s)/SM so that ptxas can give {slot.registers} "
                        "registers under the launch bounds")
            fit = (threads, slot.registers, slot.smem_bytes)
        lists, picked = pack_segment(ops, members, level, producers, veus, *fit, policy)
        chosen.update(picked)
        while lists and not lists[-1]:  # vEUs left idle by the packing (the last ones)
            lists.pop()
        segments.append(Segment("persistent", tuple(sorted(members)), threads, len(lists),
                                why, tuple(tuple(items) for items in lists)))
    program_ops = tuple(Operator(op.kernel, chosen[i].index, chosen[i].tasks,
                                 chosen[i].threads, round_sig(chosen[i].task_us),
                                 round_sig(chosen[i].busy_us), segment_of[i]) for i, op in enumerate(ops))
    program = Program(policy, hardware or profile.name, round_sig(launch), source,
                      program_ops, tuple(segments))
    if verify:
        verify_program(module, program)
    return program


def with_estimate(program: Program, ops: tuple[ROperator, ...], serial_us: float,
                  launch: float) -> Program:
    """`program` with its `estimate` figures: its makespan (segments back to back, one launch
    each), the serial policy's, and one kernel per operator (each with a launch)."""
    from dataclasses import replace

    timeline = simulate(program, boxes=False)
    busy = {i: timeline.kernel_us(i) for i in range(len(ops))}
    makespan = sum(timeline.segment_us) + launch * len(program.segments)
    per_op = sum(op.best.busy_us + launch for op in ops)
    kernel_busy = sum(busy[s.operators[0]] for s in program.segments if s.kind == "kernel")
    estimate = {
        "makespan_us": round_sig(makespan),
        "serial_us": round_sig(serial_us),
        "per_op_kernels_us": round_sig(per_op),
        "speedup_vs_per_op": round_sig(per_op / makespan) if makespan else 0.0,
        "launches": len(program.segments),
        "per_op_launches": len(ops),
        "segments": len(program.segments),
        "persistent_segments": sum(1 for s in program.segments if s.kind == "persistent"),
        "packed_operators": sum(len(s.operators) for s in program.segments
                                if s.kind == "persistent"),
        "rtasks": program.tasks,
        "max_veus": max((s.veus for s in program.segments), default=0),
        "kernel_segments_us": round_sig(kernel_busy),
    }
    return replace(program, estimate=estimate)


def makespan_us(program: Program) -> float:
    timeline = simulate(program, boxes=False)
    return sum(timeline.segment_us) + program.launch_us * len(program.segments)


__all__ = ["fills_device", "makespan_us", "pack_segment", "plan", "segments_of", "waves",
           "with_estimate"]
