"""The `program` section (tk-ram): rTasks placed on virtual execution units, typed and verified.

tk-ram writes it; codegen, the CPU `program` mode, reports and pictures read it, always through
`read_program`, which checks the payload against the module and then runs `verify_program`.
The format (docs/ram.md, "The program format"):

    program:
      policy: wavefront                 # or serial
      hardware: h100
      launch_overhead: {us: 4.0, source: "assumed: ..."}
      operators:                        # one rOperator per kernel group, in module.kernels order
        - {kernel: k_conv1, variant: 0, tasks: 98, threads: 128, task_us: 1.2, kernel_us: 2.4,
           segment: 0}
      segments:                         # run one after another
        - kind: persistent              # one persistent kernel: a block per vEU
          operators: [0, 1, 2]
          threads: 128
          veus: 264
          residency: "2 block(s)/SM x 132 SMs = 264 (limited by ...)"
          lists:                        # per vEU, in order: what it runs
            - "0:0+1 w1 2:3+1"
        - {kind: kernel, operators: [3]}   # an ordinary kernel between segments
      estimate: {...}                   # figures for reports (tk-ram --report)

A vEU's list is one string of items separated by spaces (compact: a ResNet-50 plan holds tens
of thousands of items). `OP:FIRST+COUNT` runs blocks `FIRST .. FIRST+COUNT-1` of operator
`OP` (an index into `operators`) and then adds COUNT to OP's progress counter; `wOP` waits
until OP's counter reaches OP's task count (dependencies are on whole operators).

`verify_program` is the contract every consumer relies on:

- every rTask of every operator is placed exactly once: in a persistent segment, each block
  of each of its operators appears in exactly one task item; a kernel segment holds one
  operator and no lists; every operator is in exactly one segment;
- segments respect data flow: an operator's producers are in its own or an earlier segment;
- barriers only where a task reads what another writes: a wait names an operator of the
  same segment that a later task of this vEU reads from, with the operator's task count;
  every task that reads from an operator of its own segment is preceded on its vEU by a
  wait on it, or by all of that operator's tasks;
- deadlock freedom: the graph of items (program order on each vEU; each wait after every task
  of the operator it waits on) has no cycle. This includes a vEU that waits on a task
  scheduled after the wait on the same vEU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
import re
from typing import Any, Mapping, Sequence

from tilekit.errors import IRError
from tilekit.ir.keys import read_int, read_list, read_mapping, read_number
from tilekit.ir.model import Module, default_kernels
from tilekit.ir.payloads import MAX_THREADS
from tilekit.limits import RTASKS

POLICIES = ("wavefront", "serial")
SEGMENT_KINDS = ("persistent", "kernel")
TASK, WAIT = "task", "wait"
_HINT = "re-run tk-ram"


@dataclass(frozen=True)
class Operator:
    """One rOperator: a kernel group, the variant chosen, its rTasks."""

    kernel: str
    variant: int
    tasks: int
    threads: int
    task_us: float          # one rTask (the cost model's wave time)
    kernel_us: float        # the operator as a kernel alone on the device, no launch overhead
    segment: int

    def record(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "variant": self.variant, "tasks": self.tasks,
                "threads": self.threads, "task_us": self.task_us,
                "kernel_us": self.kernel_us, "segment": self.segment}


@dataclass(frozen=True)
class Item:
    """A task item `OP:FIRST+COUNT` or a wait `wOP` (first is 0 and count is the operator's
    task count for a wait)."""

    kind: str
    op: int
    first: int
    count: int

    def text(self) -> str:
        return f"{self.op}:{self.first}+{self.count}" if self.kind == TASK else f"w{self.op}"


@dataclass(frozen=True)
class Segment:
    """A persistent kernel (`lists` per vEU) or an ordinary kernel of one operator."""

    kind: str
    operators: tuple[int, ...]
    threads: int = 0
    veus: int = 0
    residency: str = ""
    lists: tuple[tuple[Item, ...], ...] = ()

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "operators": list(self.operators)}
        if self.kind == "persistent":
            out.update(threads=self.threads, veus=self.veus, residency=self.residency,
                       lists=[" ".join(i.text() for i in items) for items in self.lists])
        return out


@dataclass(frozen=True)
class Program:
    """The whole `program` section."""

    policy: str
    hardware: str
    launch_us: float
    launch_source: str
    operators: tuple[Operator, ...]
    segments: tuple[Segment, ...]
    estimate: Mapping[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"policy": self.policy, "hardware": self.hardware,
                "launch_overhead": {"us": self.launch_us, "source": self.launch_source},
                "operators": [o.record() for o in self.operators],
                "segments": [s.record() for s in self.segments],
                "estimate": dict(self.estimate)}

    @property
    def tasks(self) -> int:
        return sum(o.tasks for o in self.operators)


# -- reading ---------------------------------------------------------------------------------

_map = partial(read_mapping, hint=_HINT)
_list = partial(read_list, hint=_HINT)
_int = partial(read_int, hint=_HINT)
_num = partial(read_number, minimum=0, hint=_HINT)


_ITEM = re.compile(r"(?:(\d+):(\d+)\+(\d+)|w(\d+))\Z")


def _items(raw: Any, where: str, tasks: Sequence[int]) -> tuple[Item, ...]:
    if not isinstance(raw, str):
        raise IRError(f"a vEU list is a string of items, got {type(raw).__name__}", where, _HINT)
    out = []
    for k, word in enumerate(raw.split()):
        m = _ITEM.match(word)
        if m is None:
            raise IRError(f"item {k} is {word[:40]!r}; an item is OP:FIRST+COUNT or wOP", where,
                          _HINT)
        if m.group(4) is not None:
            op = int(m.group(4))
            if op >= len(tasks):
                raise IRError(f"item {k} waits on operator {op}; there are {len(tasks)}", where,
                              _HINT)
            out.append(Item(WAIT, op, 0, tasks[op]))
            continue
        op, first, count = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if count < 1:
            raise IRError(f"item {k} runs no block", where, _HINT)
        out.append(Item(TASK, op, first, count))
    return tuple(out)


def _segment(raw: Any, where: str, tasks: Sequence[int]) -> Segment:
    p = _map(raw, where)
    kind = p.get("kind")
    if kind not in SEGMENT_KINDS:
        raise IRError(f"kind must be one of {', '.join(SEGMENT_KINDS)}, got {kind!r}",
                      f"{where}.kind", _HINT)
    ops = tuple(_int(o, f"{where}.operators[{i}]")
                for i, o in enumerate(_list(p.get("operators"), f"{where}.operators")))
    if kind == "kernel":
        if len(ops) != 1 or "lists" in p:
            raise IRError("a kernel segment holds exactly one operator and no lists", where,
                          _HINT)
        return Segment(kind, ops)
    lists = _list(p.get("lists"), f"{where}.lists")
    veus = _int(p.get("veus"), f"{where}.veus", 1)
    if len(lists) != veus:
        raise IRError(f"has {len(lists)} vEU lists for {veus} vEUs", f"{where}.lists", _HINT)
    items = tuple(_items(x, f"{where}.lists[{v}]", tasks) for v, x in enumerate(lists))
    residency = p.get("residency", "")
    return Segment(kind, ops, _int(p.get("threads"), f"{where}.threads", 1, MAX_THREADS), veus,
                   residency if isinstance(residency, str) else "", items)


def parse_program(payload: Any, where: str = "program") -> Program:
    """The payload as a `Program` (structure only; `read_program` also verifies it)."""
    p = _map(payload, where)
    policy = p.get("policy")
    if policy not in POLICIES:
        raise IRError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}",
                      f"{where}.policy", _HINT)
    launch = _map(p.get("launch_overhead", {}), f"{where}.launch_overhead")
    ops = []
    for i, raw in enumerate(_list(p.get("operators"), f"{where}.operators")):
        w = f"{where}.operators[{i}]"
        o = _map(raw, w)
        ops.append(Operator(str(o.get("kernel")), _int(o.get("variant"), f"{w}.variant"),
                            _int(o.get("tasks"), f"{w}.tasks", 1),
                            _int(o.get("threads"), f"{w}.threads", 1, MAX_THREADS),
                            _num(o.get("task_us"), f"{w}.task_us"),
                            _num(o.get("kernel_us"), f"{w}.kernel_us"),
                            _int(o.get("segment"), f"{w}.segment")))
    tasks = [o.tasks for o in ops]
    # every rTask is placed and checked one by one: the count is a budget
    if sum(tasks) > RTASKS.value:   # an IRError, so that the file is named with it
        over = RTASKS.error(f"the program's rTasks ({sum(tasks):,})", None)
        raise IRError(over.what, f"{where}.operators", over.hint)
    segments = tuple(_segment(s, f"{where}.segments[{i}]", tasks)
                     for i, s in enumerate(_list(p.get("segments"), f"{where}.segments")))
    estimate = p.get("estimate", {})
    return Program(str(policy), str(p.get("hardware", "")),
                   _num(launch.get("us", 0.0), f"{where}.launch_overhead.us"),
                   str(launch.get("source", "")), tuple(ops), segments,
                   dict(estimate) if isinstance(estimate, Mapping) else {})


def read_program(module: Module, where: str = "program") -> Program:
    """The module's program, parsed and verified (`verify_program`)."""
    if module.program is None:
        raise IRError("the module has no program section", where, "run tk-ram first")
    program = parse_program(module.program, where)
    verify_program(module, program, where)
    return program


# -- verifying ------------------------------------------------------------------------------

def operator_flow(module: Module) -> tuple[list[set[int]], list[tuple[str, ...]]]:
    """Per kernel group: the groups it reads from (producers), and the tensors it writes."""
    from tilekit.ir.graph import graph

    g = graph(module)
    kernels = module.kernels or default_kernels(module.ops)
    group_of = {name: k for k, kernel in enumerate(kernels) for name in kernel.ops}
    producers: list[set[int]] = []
    writes: list[tuple[str, ...]] = []
    for k, kernel in enumerate(kernels):
        deps: set[int] = set()
        out: list[str] = []
        for name in kernel.ops:
            node = g.node(name)
            out.extend(t for t in node.writes if t)
            for t in node.reads:
                p = g.producer.get(t)
                if p is not None and group_of[g.nodes[p].name] != k:
                    deps.add(group_of[g.nodes[p].name])
        producers.append(deps)
        writes.append(tuple(out))
    return producers, writes


def verify_program(module: Module, program: Program, where: str = "program") -> None:
    """Raise IRError unless `program` is a complete, data-flow-respecting, deadlock-free plan
    of `module` (the rules in the module docstring)."""
    kernels = module.kernels or default_kernels(module.ops)
    if len(program.operators) != len(kernels):
        raise IRError(f"has {len(program.operators)} operators, the module has "
                      f"{len(kernels)} kernel groups", f"{where}.operators", _HINT)
    for i, (o, k) in enumerate(zip(program.operators, kernels)):
        if o.kernel != k.name:
            raise IRError(f"names kernel '{o.kernel}', kernels[{i}] is '{k.name}'",
                          f"{where}.operators[{i}].kernel", _HINT)
    producers, _ = operator_flow(module)
    seg_of = _segments_of(program, where)
    for i, deps in enumerate(producers):
        for d in deps:
            if seg_of[d] > seg_of[i]:
                raise IRError(f"operator {i} ({program.operators[i].kernel}) reads from "
                              f"operator {d} ({program.operators[d].kernel}), which runs in "
                              f"a later segment", f"{where}.operators[{i}].segment", _HINT)
    for s, seg in enumerate(program.segments):
        if seg.kind == "persistent":
            _verify_segment(program, seg, producers, f"{where}.segments[{s}]")


def _segments_of(program: Program, where: str) -> list[int]:
    seg_of = [-1] * len(program.operators)
    for s, seg in enumerate(program.segments):
        for o in seg.operators:
            if o >= len(program.operators):
                raise IRError(f"names operator {o}; there are {len(program.operators)}",
                              f"{where}.segments[{s}].operators", _HINT)
            if seg_of[o] >= 0:
                raise IRError(f"operator {o} is in segments {seg_of[o]} and {s}",
                              f"{where}.segments[{s}].operators",
                              "every operator is placed exactly once; " + _HINT)
            seg_of[o] = s
    for o, s in enumerate(seg_of):
        if s < 0:
            raise IRError(f"operator {o} ({program.operators[o].kernel}) is in no segment",
                          f"{where}.segments", "every operator is placed exactly once; " + _HINT)
        if program.operators[o].segment != s:
            raise IRError(f"says segment {program.operators[o].segment}, it is in segment {s}",
                          f"{where}.operators[{o}].segment", _HINT)
    return seg_of


def _verify_segment(program: Program, seg: Segment, producers: list[set[int]],
                    where: str) -> None:
    members = set(seg.operators)
    placed = {o: [0] * program.operators[o].tasks for o in seg.operators}
    for v, items in enumerate(seg.lists):
        for k, it in enumerate(items):
            w = f"{where}.lists[{v}][{k}]"
            if it.op not in members:
                raise IRError(f"names operator {it.op}, which is not in this segment", w, _HINT)
            if it.kind == TASK:
                blocks = placed[it.op]
                if it.first + it.count > len(blocks):
                    raise IRError(f"blocks {it.first}..{it.first + it.count - 1} of operator "
                                  f"{it.op}, which has {len(blocks)}", w, _HINT)
                for b in range(it.first, it.first + it.count):
                    blocks[b] += 1
            elif it.count != program.operators[it.op].tasks:
                raise IRError(f"waits for {it.count} tasks of operator {it.op}, which has "
                              f"{program.operators[it.op].tasks}", w,
                              "waits are on whole operators; " + _HINT)
    for o, blocks in placed.items():
        for b, n in enumerate(blocks):
            if n != 1:
                raise IRError(f"block {b} of operator {o} ({program.operators[o].kernel}) is "
                              f"placed {n} times", f"{where}.lists",
                              "every rTask is placed exactly once; " + _HINT)
    _verify_barriers(seg, producers, where)
    _verify_acyclic(program, seg, where)


def _verify_barriers(seg: Segment, producers: list[set[int]], where: str) -> None:
    """Waits exactly where a later task of the vEU reads what the awaited operator writes."""
    totals: dict[int, int] = {}
    for items in seg.lists:
        for it in items:
            if it.kind == TASK:
                totals[it.op] = totals.get(it.op, 0) + it.count
    members = set(seg.operators)
    for v, items in enumerate(seg.lists):
        waited: set[int] = set()
        done: dict[int, int] = {}
        for k, it in enumerate(items):
            w = f"{where}.lists[{v}][{k}]"
            if it.kind == WAIT:
                later = [x.op for x in items[k + 1:] if x.kind == TASK]
                if not any(it.op in producers[c] for c in later):
                    raise IRError(f"waits on operator {it.op}, but no later task of this vEU "
                                  "reads what it writes", w,
                                  "barriers only where a task reads what another writes; "
                                  + _HINT)
                waited.add(it.op)
                continue
            for p in producers[it.op] & members:
                if p not in waited and done.get(p, 0) < totals.get(p, 0):
                    raise IRError(f"task of operator {it.op} reads what operator {p} writes "
                                  "without waiting for it", w,
                                  "a dropped barrier: " + _HINT)
            done[it.op] = done.get(it.op, 0) + it.count


def _verify_acyclic(program: Program, seg: Segment, where: str) -> None:
    """Kahn's algorithm over items plus one node per operator ("all its tasks done"): edges
    from each item to the next on its vEU, from each task to its operator's node, and from
    that node to every wait on the operator."""
    index: list[tuple[int, int]] = []
    for v, items in enumerate(seg.lists):
        index.extend((v, k) for k in range(len(items)))
    n_items = len(index)
    done = {op: n_items + k for k, op in enumerate(seg.operators)}
    n = n_items + len(done)
    indegree = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    node = 0
    for items in seg.lists:
        for k, it in enumerate(items):
            if k + 1 < len(items):
                succ[node].append(node + 1)
                indegree[node + 1] += 1
            if it.kind == TASK:
                succ[node].append(done[it.op])
                indegree[done[it.op]] += 1
            else:
                succ[done[it.op]].append(node)
                indegree[node] += 1
            node += 1
    ready = [i for i in range(n) if indegree[i] == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in succ[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if seen != n:
        stuck = next(i for i in range(n_items) if indegree[i] > 0)
        v, k = index[stuck]
        raise IRError(f"the plan can deadlock: vEU {v} item {k} waits (directly or through "
                      "other vEUs) on a task that can only run after it",
                      f"{where}.lists[{v}][{k}]", "no vEU may wait on a task scheduled after "
                      "it on the same vEU or in a cycle across vEUs; " + _HINT)


__all__ = ["Item", "Operator", "POLICIES", "Program", "Segment", "TASK", "WAIT",
           "operator_flow", "parse_program", "read_program", "verify_program"]
