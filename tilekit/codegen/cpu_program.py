"""The CPU unit's program entry: a run of kernels from one call, in one OpenMP team.

Each kernel of the CPU target prints as a body function (one block) and an `extern "C"`
entry that opens its own parallel region (tilekit.tile.cpp). Calling the entries one by one
from Python costs a ctypes call and a fork/join per kernel, which dominates models of many
small kernels (an LSTM unrolled over its sequence). `program_source(kernels, plan)` adds to
the unit one more entry that runs any sequence of the unit's kernels:

    extern "C" void tk_run(void* const* tk_a, const int* tk_seq, const unsigned char* tk_wait,
                           int tk_n, int tk_parallel, double* tk_times);

- `tk_a`: the argument table, every kernel's buffer pointers one after another in kernel
  order (kernel k's at `offsets(kernels)[k]`), bound once when the library is loaded;
- `tk_seq[0..tk_n)`: the kernels to run, in order; `tk_wait[i]`: a team barrier after the
  i-th (`barriers`: only before a kernel that reads what one since the last barrier wrote,
  or writes what one since then touched, unless both ran on the first thread); the barrier
  is the unit's own `tk_team_barrier` (tilekit.tile.cpp: a spin that adapts, then a futex),
  not libgomp's, whose passive policy sleeps at every barrier;
- one parallel region for the whole sequence (`tk_parallel` 0: none, the caller's thread runs
  it all: `parallel_run`), in which a kernel's blocks are shared out as OpenMP's static
  schedule would (`tk_share`: each thread a run of them, no barrier after), every other such
  kernel walking its run backwards (`serpentine`), a one-block kernel, or a loop nest of at
  most one block's work (`one_thread` in its schedule), runs on the team's first thread (so
  a chain of them needs no barrier), a persistent kernel (a loop tk-grind placed inside the
  library: `team_kernel`) on every thread, one block each, its grid barriers the team's
  (runtime_cpu.h `tk_grid_sync`), and threads persist across kernels;
- `tk_times` (profiling): null, or `tk_n + 1` wall-clock times: the start and the end of each
  kernel (a barrier after every kernel while profiling, so that each time is its own).

With a CPU plan of tk-ram (`CpuPlan`, tilekit.ram.cpu: operators' blocks placed on vEUs, one
vEU per thread, waits on whole operators), the unit also gets

    extern "C" int tk_run_plan(void* const* tk_a, int tk_segment);

which runs one persistent segment of the plan: thread v walks vEU v's items (`OP:FIRST+COUNT`
runs those blocks of the operator's kernel on this thread, then adds COUNT to the
operator's counter with a release; `wOP` waits until OP's counter is its task count:
acquire loads for up to 100 microseconds, then asleep on the counter, a futex on Linux,
woken by the signaller only when someone sleeps). It returns 0, or 1 without running
anything when the threads the runtime may use (`omp_get_max_threads`, what tk_set_threads
set) or the team it got are fewer than the segment's vEUs: a vEU left to run after another
on one thread could wait forever, so the caller then runs the segment's kernels op by op.
The counters are the library's own: one plan runs at a time per loaded library.

Kernel bodies are called through `tk_call<body>` (printed by tilekit.tile.cpp.program_entries, like all the entries), a template that casts each `void*` of the
table to the body's own parameter type: the types come from the body's signature, so nothing
here re-derives them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from tilekit.ir.payloads import KernelRecord

@dataclass(frozen=True)
class CpuPlan:
    """A tk-ram plan as the unit runs it. `order`: the plan's segments in run order, each
    (kind, the indices of its kernels in the unit, in module order); `persistent`: per entry
    of `order`, its index in `segments` (-1 for a kernel segment); `segments`: per persistent
    segment, per vEU, its items ((kernel, first block, count) for a task, (kernel, -1, task
    count) for a wait); `operators`: the kernel of each counter."""

    order: tuple[tuple[str, tuple[int, ...]], ...]
    persistent: tuple[int, ...]
    segments: tuple[tuple[tuple[tuple[int, int, int], ...], ...], ...]
    operators: tuple[int, ...]


_PLAN_HINT = "re-run tk-ram with the CPU profile, then tk-codegen --target cpu"


def unit_plan(module, kernels: Sequence[KernelRecord]) -> CpuPlan:
    """The module's tk-ram program (read and verified) as the unit runs it over `kernels`
    (the codegen section's, in order). A packed operator must be one kernel whose blocks are
    its rTasks; every kernel must belong to exactly one segment."""
    from tilekit.errors import TilekitError
    from tilekit.ir.program import TASK, read_program

    program = read_program(module)
    by_group: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        by_group.setdefault(k.group, []).append(i)
    order, persistent, segments, counters = [], [], [], []
    covered: set[int] = set()
    for s, seg in enumerate(program.segments):
        seq = sorted(i for o in seg.operators for i in by_group.get(
            program.operators[o].kernel, ()))
        covered.update(seq)
        order.append((seg.kind, tuple(seq)))
        if seg.kind != "persistent":
            persistent.append(-1)
            continue
        kernel_of = {}
        for o in seg.operators:
            op = program.operators[o]
            made = by_group.get(op.kernel, [])
            where = f"program.operators[{o}]"
            if len(made) != 1:
                raise TilekitError(f"operator {op.kernel} is packed, but codegen made "
                                   f"{len(made)} CPU kernels of it", where, _PLAN_HINT)
            if _grid(kernels[made[0]]) != op.tasks:
                raise TilekitError(f"operator {op.kernel} has {op.tasks} rTasks, its CPU "
                                   f"kernel {_grid(kernels[made[0]])} blocks", where,
                                   _PLAN_HINT)
            kernel_of[o] = made[0]
            counters.append(made[0])
        persistent.append(len(segments))
        segments.append(tuple(
            tuple((kernel_of[it.op], it.first, it.count) if it.kind == TASK
                  else (kernel_of[it.op], -1, it.count) for it in items)
            for items in seg.lists))
    missing = sorted(set(range(len(kernels))) - covered)
    if missing:
        raise TilekitError(f"kernel {kernels[missing[0]].name} of group "
                           f"{kernels[missing[0]].group} is in no segment of the program",
                           "program.segments", _PLAN_HINT)
    return CpuPlan(tuple(order), tuple(persistent), tuple(segments), tuple(counters))


def offsets(kernels: Sequence[KernelRecord]) -> tuple[int, ...]:
    """Where each kernel's pointers start in the argument table."""
    out, at = [], 0
    for k in kernels:
        out.append(at)
        at += len(k.args)
    return tuple(out)


def reads(k: KernelRecord) -> frozenset[str]:
    """The buffers a kernel may read: every argument (a kernel that writes part of a tensor
    may read it too, so written arguments count as read)."""
    return frozenset(k.args)


def barriers(kernels: Sequence[KernelRecord], seq: Sequence[int]) -> tuple[bool, ...]:
    """Per position of `seq`: a team barrier after it? A kernel of one block (or marked
    `one_thread`) runs on the team's first thread, so such kernels in a row are ordered by
    that thread alone; a
    barrier is needed before a kernel that reads what a kernel since the last barrier wrote,
    or writes what one since then touched, unless both ran on the first thread. The last
    kernel of the sequence always gets one (the caller reads the results)."""
    wait = [False] * len(seq)
    team_w: set[str] = set()        # since the last barrier, by kernels shared out
    team_t: set[str] = set()
    first_w: set[str] = set()       # by one-block kernels (the first thread)
    first_t: set[str] = set()
    for i, k in enumerate(seq):
        r, w = reads(kernels[k]), frozenset(kernels[k].writes)
        shared = not on_first_thread(kernels[k])
        clash = r & team_w or w & team_t
        if shared:
            clash = clash or r & first_w or w & first_t
        if i and clash:
            wait[i - 1] = True
            team_w, team_t, first_w, first_t = set(), set(), set(), set()
        (team_w if shared else first_w).update(w)
        (team_t if shared else first_t).update(r | w)
    if seq:
        wait[-1] = True
    return tuple(wait)


def parallel_run(kernels: Sequence[KernelRecord], seq: Sequence[int]) -> bool:
    """Open a parallel region for `seq`? Not when every kernel of it is one block: there is
    nothing to share out, and the fork/join and barriers would be all the team adds (the
    LSTM's host-driven steps are single-block statements)."""
    return any(not on_first_thread(kernels[k]) for k in seq)


def on_first_thread(k: KernelRecord) -> bool:
    """Does the team's first thread run all of `k`? A kernel of one block, or one whose
    schedule says `one_thread` (a loop nest of at most one block's work:
    tilekit.schedule.cpu.one_thread), whose blocks it runs one after another; never a
    persistent kernel (`team_kernel`)."""
    return not team_kernel(k) and (_grid(k) == 1 or bool(k.schedule.get("one_thread")))


def team_kernel(k: KernelRecord) -> bool:
    """Is `k` a persistent kernel whose blocks are the team's threads (`coresident`: a loop
    or branch tk-grind placed inside compiled code, tilekit.codegen.control)? Every thread
    of the team runs its one block, and the kernel's grid barriers are the team's."""
    return k.coresident


#: How the C++ printer sizes a kernel's block memory in its entry (tilekit.tile.cpp
#: entry_function): from each thread's arena, or on the stack.
_BLOCK_MEMORY = re.compile(r"tk_block_memory\((\d+)\)|unsigned char tk_smem\[(\d+)\]")


def block_memory(kernels: Sequence[KernelRecord]) -> int:
    """Bytes of block memory the largest kernel's body needs: what its entry takes (a record's
    `smem_bytes` is the GPU's dynamic shared memory, 0 for the CPU's static buffers)."""
    sizes = [16]
    for k in kernels:
        sizes.append(int(k.smem_bytes))
        sizes += [int(a or b) for a, b in _BLOCK_MEMORY.findall(k.source)]
    return max(sizes)


def _grid(k: KernelRecord) -> int:
    return int(k.grid[0]) * int(k.grid[1]) * int(k.grid[2])


def program_source(kernels: Sequence[KernelRecord], plan: CpuPlan | None = None) -> str:
    """The program entries of a unit of `kernels` (appended after their sources), printed by
    the C++ printer (`tilekit.tile.cpp.program_entries`) from the table's layout."""
    from tilekit.tile.cpp import program_entries

    tables = None if plan is None else (plan.operators, plan.segments)
    return program_entries(program_calls(kernels, [_grid(k) for k in kernels]),
                           block_memory(kernels), tables)


def program_calls(kernels: Sequence[KernelRecord], grids: Sequence) -> list[tuple]:
    """What the C++ printer's program entries take per kernel (tilekit.tile.cpp
    program_entries): its entry, the offset of its pointers in the argument table, its grid
    (`grids`: a number, or an expression of a template's size tables), who runs its blocks
    (`share`: shared out over the team; `first`: the team's first thread; `team`: a
    persistent kernel, one block per thread of the team), and whether each thread walks its
    run of them backwards (`serpentine`)."""
    at = offsets(kernels)
    modes = ["team" if team_kernel(k) else "first" if on_first_thread(k) else "share"
             for k in kernels]
    return [(k.entry, at[i], grid, mode, backward) for i, (k, grid, mode, backward) in
            enumerate(zip(kernels, grids, modes, serpentine([m == "share" for m in modes])))]


def serpentine(shared: Sequence[bool]) -> tuple[bool, ...]:
    """Which kernels walk their share of blocks backwards: every other one of those whose
    blocks are shared out (`shared`), in the unit's order. A thread's share of a kernel is a
    run of blocks; walked in the opposite direction to the kernel before, it starts on the
    blocks that kernel finished last, whose outputs (a layer's activations, written in block
    order) are still in the core's L2, where in one direction it would start on those
    evicted first (ResNet-50 0.986-0.992x on one core and 0.986x on two of an AVX-512 Xeon)."""
    out, backward = [], False
    for s in shared:
        out.append(s and backward)
        backward = backward != s
    return tuple(out)


def module_plan(module, kernels: Sequence[KernelRecord]) -> CpuPlan | None:
    """The plan the unit of `module` runs: its tk-ram program when that was planned for a CPU
    profile (the module is rolled for one) and no control op needs host steps; else None (a
    GPU plan's operators are GPU blocks: its kernels run op by op on the CPU)."""
    from tilekit.ir.graph import control_records
    from tilekit.ir.payloads import cpu_rolled

    if module.program is None or not cpu_rolled(module) or control_records(module):
        return None
    return unit_plan(module, kernels)


def program_unit(module, plan: bool = True) -> tuple[str, CpuPlan | None]:
    """The translation unit the compiled CPU runtime loads for `module` (its codegen
    section's kernels and the program entries, with its plan unless `plan` is false), and
    the plan. `tk-codegen --compile` builds the same unit, so tk-run finds it cached."""
    from tilekit.codegen.cxx import unit_source
    from tilekit.ir.payloads import CodegenSection

    kernels = CodegenSection.read(module.codegen).kernels
    chosen = module_plan(module, kernels) if plan else None
    return unit_source(kernels) + program_source(kernels, chosen), chosen


__all__ = ["CpuPlan", "barriers", "block_memory", "module_plan", "offsets", "on_first_thread",
           "parallel_run", "program_calls", "program_source", "program_unit", "reads", "serpentine",
           "team_kernel", "unit_plan"]
