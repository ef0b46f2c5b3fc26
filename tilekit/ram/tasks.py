"""rOperators and their rTasks: what each kernel group offers the scheduler.

An rOperator is a kernel group (`module.kernels[i]`: a singleton after import or roll, a
welded group after tk-weld); its rTasks are the thread blocks of the kernel tk-codegen makes of
it. A *variant* is one way to run it: the tile tk-roll chose (variant 0) or one of its
runners-up (`ops[i].tile.candidates`, variant k for candidate k-1), each with its own block
count, threads, shared memory, registers and time. Only singleton groups of one expr op have
variants beyond 0; a group's kernel is the one its tiles make.

The block count is the one codegen will launch, decided by the same rules: the shared shape
decision (`tilekit.schedule.shape.decide`) for one op, the grid-stride default for an op
without a tile, the opaque kernels' grid-stride launch. A group of several ops is a
persistent-program candidate only when codegen will run it as one stage (the ops after the
first are elementwise at the same points: a chain, run in the first op's epilogue), so its
blocks are the first op's; any other group (a fused multi-stage kernel whose tile codegen
picks, a group holding an opaque op) stays an ordinary kernel (`fixed`), with a reason.
Codegen checks the block counts again when it composes the program.

Durations come from the shared cost model (`kernels[i].estimate` / `ops[i].tile` estimates,
tilekit.roll.cost): a kernel's time without the launch overhead the model adds, spread over its
waves; a task lasts one wave's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilekit.errors import TilekitError
from tilekit.ir.graph import graph
from tilekit.ir.model import Kernel, Module, default_kernels
from tilekit.ir.payloads import Estimate, OpTile, Tile
from tilekit.roll.cost import estimate_bytes, registers_per_thread
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.schedule import tensor_bytes
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid
from tilekit.schedule.mma import recorded_precision
from tilekit.schedule.block import BARRIER_SHAPES
from tilekit.schedule.shape import Target, analysis_facts, decide, default_blocks

#: Registers assumed for a default-shape or opaque body when nothing better is known (ptxas
#: gives the grid-stride kernels of the model zoo 16-40; codegen re-checks with ptxas').
DEFAULT_REGS = 40


@dataclass(frozen=True)
class Variant:
    """One way to run an rOperator."""

    index: int            # 0: the tile tk-roll chose; k: ops[].tile.candidates[k-1]
    tasks: int            # thread blocks = rTasks
    threads: int
    regs: int             # per thread (the cost model's estimate)
    smem_bytes: int       # per block
    busy_us: float        # the kernel alone on the device, without launch overhead
    task_us: float        # one rTask (one wave's time)
    shape: str

    @property
    def barriers(self) -> bool:
        """The body synchronises its block (`__syncthreads`: staged and tensor-core shapes):
        it must run on exactly `threads` threads. Other bodies (tiled, default, opaque) may
        run on the first `threads` threads of a larger block (tilekit.schedule.block). A
        fixed group's body (`kernel`: never packed) counts as synchronising."""
        return self.shape in BARRIER_SHAPES or self.shape == "kernel"


@dataclass(frozen=True)
class ROperator:
    """A kernel group as the scheduler sees it."""

    index: int
    kernel: str
    ops: tuple[str, ...]
    variants: tuple[Variant, ...]
    fixed: str = ""       # why it must stay an ordinary kernel ("" when it may be packed)

    @property
    def best(self) -> Variant:
        return self.variants[0]


def launch_us(profile) -> tuple[float, str]:
    """The profile's launch overhead in microseconds and its source."""
    seconds = float(profile.launch_overhead or 0.0)
    try:
        source = profile.source("launch.overhead")
    except TilekitError:
        source = "not in the profile: 0"
    return seconds * 1e6, source


def _busy(est: Estimate, launch: float) -> float:
    return max(est.time_us - launch, 1e-3)


def _task_us(busy: float, est: Estimate) -> float:
    return busy / max(1, est.waves)


def operators(module: Module, profile) -> tuple[ROperator, ...]:
    """Every kernel group of `module` as an rOperator (module.kernels order)."""
    launch, _ = launch_us(profile)
    target = Target.of(profile, recorded_precision(module))
    dtypes = {n: t.dtype for n, t in module.tensors.items()}
    out = []
    for k, kernel in enumerate(module.kernels or default_kernels(module.ops)):
        out.append(_operator(module, k, kernel, profile, target, dtypes, launch))
    return tuple(out)


def _operator(module: Module, k: int, kernel: Kernel, profile, target: Target, dtypes,
              launch: float) -> ROperator:
    g = graph(module)
    first = g.node(kernel.ops[0])
    if first.op.kind == "control":
        return _fixed(module, k, kernel, profile, launch,
                      "a control op: tk-grind's device loop or branch, or host-driven regions")
    if any(g.node(name).op.kind != "expr" for name in kernel.ops):
        if len(kernel.ops) > 1:
            return _fixed(module, k, kernel, profile, launch,
                          "a group with an opaque op: codegen runs it as several kernels")
        return ROperator(k, kernel.name, kernel.ops,
                         (_opaque_variant(module, first, profile, launch),))
    if len(kernel.ops) > 1 and not _is_chain(module, kernel):
        return _fixed(module, k, kernel, profile, launch,
                      "a fused multi-stage group: its tile is codegen's choice")
    variants = _expr_variants(module, first, profile, target, dtypes, launch)
    if len(kernel.ops) > 1:  # a chain: the first op's kernel with an epilogue; group time
        est = _kernel_estimate(kernel)
        v = variants[0]
        busy = _busy(est, launch) if est is not None else v.busy_us
        variants = (Variant(0, v.tasks, v.threads, v.regs, v.smem_bytes, busy,
                            busy * v.task_us / v.busy_us, v.shape),)
    return ROperator(k, kernel.name, kernel.ops, variants)


def _is_chain(module: Module, kernel: Kernel) -> bool:
    """The ops after the first are elementwise over the same output shape (codegen's chain)."""
    g = graph(module)
    head = g.node(kernel.ops[0])
    if head.analysis is None:
        return False
    shape = tuple(e for _, e in head.analysis.spatial)
    for name in kernel.ops[1:]:
        a = g.node(name).analysis
        if a is None or a.reduction or tuple(e for _, e in a.spatial) != shape:
            return False
    return True


def _kernel_estimate(kernel: Kernel) -> Estimate | None:
    if kernel.estimate:
        return Estimate.read(kernel.estimate, f"kernels[{kernel.name}].estimate")
    return None


def _fixed(module: Module, k: int, kernel: Kernel, profile, launch: float, why: str
           ) -> ROperator:
    est = _kernel_estimate(kernel) or _bytes_estimate(module, kernel.ops,
                                                                       profile)
    busy = _busy(est, launch)
    blocks = max(1, est.waves) * profile.sm_count
    return ROperator(k, kernel.name, kernel.ops,
                     (Variant(0, blocks, DEFAULT_THREADS, DEFAULT_REGS, 0, busy,
                              _task_us(busy, est), "kernel"),), fixed=why)


def _bytes_estimate(module: Module, ops, profile) -> Estimate:
    g = graph(module)
    reads = {t for n in ops for t in g.node(n).reads}
    writes = {t for n in ops for t in g.node(n).writes if t}
    elements = max((module.tensors[t].size for t in writes), default=1)
    return estimate_bytes(profile, tensor_bytes(module, reads - writes),
                          tensor_bytes(module, writes), DEFAULT_THREADS, elements)


def _opaque_variant(module: Module, node, profile, launch: float) -> Variant:
    outputs = [t for t in (node.op.opaque or {}).get("outputs", ()) if t in module.tensors]
    elements = module.tensors[outputs[0]].size if outputs else 1
    est = None
    if node.op.tile and isinstance(node.op.tile.get("estimate"), dict):
        est = Estimate.read(node.op.tile["estimate"], f"{node.where}.tile.estimate")
    est = est or _bytes_estimate(module, (node.name,), profile)
    busy = _busy(est, launch)
    tasks = default_grid(elements, DEFAULT_THREADS)
    return Variant(0, tasks, DEFAULT_THREADS, DEFAULT_REGS, 0, busy, _task_us(busy, est),
                   "opaque")


def _expr_variants(module: Module, node, profile, target: Target, dtypes, launch: float
                   ) -> tuple[Variant, ...]:
    analysis = node.analysis
    facts = analysis_facts(analysis, dtypes)
    extents = tuple(e for _, e in analysis.spatial)
    if node.op.tile is None:  # not rolled: codegen's default schedule
        shape = decide(facts, None, target)
        est = _bytes_estimate(module, (node.name,), profile)
        busy = _busy(est, launch)
        return (Variant(0, default_blocks(facts, shape), shape.threads, DEFAULT_REGS, 0, busy,
                        _task_us(busy, est), "default"),)
    rolled = OpTile.read(node.op.tile, analysis.spatial, analysis.reduction,
                         f"{node.where}.tile")
    choices = [(rolled.tile, rolled.estimate, rolled.regs)]
    if rolled.candidates:
        problem = problem_from_analysis(analysis, dtypes)
        for c in rolled.candidates:
            regs = int(registers_per_thread(problem, np.array(c.tile.thread).reshape(-1, 1),
                                            ptxas=True)[0])
            choices.append((c.tile, c.estimate, regs))
    variants = []
    for index, (tile, est, regs) in enumerate(choices):
        variants.append(_tile_variant(index, facts, tile, est, regs, extents, target, launch))
    return tuple(variants)


def _tile_variant(index: int, facts, tile: Tile, est: Estimate, regs: int, extents,
                  target: Target, launch: float) -> Variant:
    shape = decide(facts, tile, target)
    busy = _busy(est, launch)
    if shape.shape == "default":
        tasks, regs = default_blocks(facts, shape), max(regs, DEFAULT_REGS)
    else:
        tasks = math.prod(tile.grid(extents))
    return Variant(index, tasks, shape.threads, regs, shape.smem_bytes, busy,
                   _task_us(busy, est), shape.shape)


# -- where each rTask writes ------------------------------------------------------------------

Box = tuple[tuple[int, int], ...]   # half-open range per dimension


@dataclass(frozen=True)
class Layout:
    """Which output points block `b` of an operator's kernel computes, over the spatial
    extents of the group's first op: `box` (a tile grid in row-major block order, as codegen
    decomposes the block index), `flat` (a grid-stride loop: `per_block` consecutive points
    per block, `blocks` blocks striding over all points) or `whole` (one kernel, all points)."""

    kind: str
    extents: tuple[int, ...]
    block: tuple[int, ...] = ()
    per_block: int = 0
    blocks: int = 1

    def boxes(self, b: int) -> list[Box]:
        if self.kind == "whole":
            return [tuple((0, e) for e in self.extents)]
        if self.kind == "box":
            grid = [-(-e // s) for e, s in zip(self.extents, self.block)]
            coords = []
            for g in reversed(grid):
                coords.append(b % g)
                b //= g
            coords.reverse()
            return [tuple((c * s, min((c + 1) * s, e))
                          for c, s, e in zip(coords, self.block, self.extents))]
        points = math.prod(self.extents)
        out: list[Box] = []
        start = b * self.per_block
        while start < points:
            out.extend(flat_boxes(start, min(start + self.per_block, points), self.extents))
            start += self.blocks * self.per_block
        return out


    def boxes_of(self, first: int, count: int) -> list[Box]:
        """The boxes of blocks `first .. first+count-1` together, merged where blocks are
        adjacent (one flat range, or runs along the last grid axis): the same points as
        the blocks' boxes one by one."""
        if self.kind == "flat" and self.blocks * self.per_block >= math.prod(self.extents):
            points = math.prod(self.extents)
            return flat_boxes(first * self.per_block,
                              min((first + count) * self.per_block, points), self.extents)
        if self.kind != "box" or count == 1:
            return [box for b in range(first, first + count) for box in self.boxes(b)]
        out: list[Box] = []
        for b in range(first, first + count):
            box = self.boxes(b)[0]
            if out and out[-1][:-1] == box[:-1] and out[-1][-1][1] == box[-1][0]:
                out[-1] = out[-1][:-1] + ((out[-1][-1][0], box[-1][1]),)
            else:
                out.append(box)
        return out


def flat_boxes(start: int, stop: int, extents: tuple[int, ...]) -> list[Box]:
    """The row-major flat range [start, stop) of an array of `extents` as boxes."""
    if start >= stop:
        return []
    if not extents:
        return [()]
    inner = math.prod(extents[1:])
    lo_row, lo_off = divmod(start, inner)
    hi_row, hi_off = divmod(stop, inner)
    if lo_row == hi_row:
        return [((lo_row, lo_row + 1),) + b
                for b in flat_boxes(lo_off, hi_off, extents[1:])]
    out: list[Box] = []
    if lo_off:
        out += [((lo_row, lo_row + 1),) + b for b in flat_boxes(lo_off, inner, extents[1:])]
        lo_row += 1
    if hi_row > lo_row:
        out.append(((lo_row, hi_row),) + tuple((0, e) for e in extents[1:]))
    if hi_off:
        out += [((hi_row, hi_row + 1),) + b for b in flat_boxes(0, hi_off, extents[1:])]
    return out


def layout(module: Module, op: ROperator, variant: int, profile) -> Layout:
    """The layout of `op`'s kernel under `variant` (the rules of `operators`)."""
    g = graph(module)
    first = g.node(op.ops[0])
    if op.fixed:
        extents = tuple(e for _, e in first.analysis.spatial) if first.analysis else ()
        return Layout("whole", extents)
    if first.op.kind != "expr":
        outputs = [t for t in (first.op.opaque or {}).get("outputs", ()) if t in module.tensors]
        elements = module.tensors[outputs[0]].size if outputs else 1
        return Layout("flat", (elements,), per_block=DEFAULT_THREADS,
                      blocks=default_grid(elements, DEFAULT_THREADS))
    analysis = first.analysis
    extents = tuple(e for _, e in analysis.spatial)
    facts = analysis_facts(analysis, {n: t.dtype for n, t in module.tensors.items()})
    tile = None
    if first.op.tile is not None:
        rolled = OpTile.read(first.op.tile, analysis.spatial, analysis.reduction,
                             f"{first.where}.tile")
        tile = rolled.tile if variant == 0 else rolled.candidates[variant - 1].tile
    shape = decide(facts, tile, Target.of(profile, recorded_precision(module)))
    if shape.shape == "default":
        return Layout("flat", extents, per_block=DEFAULT_THREADS // max(shape.lanes, 1),
                      blocks=default_blocks(facts, shape))
    return Layout("box", extents, block=tuple(tile.block), blocks=math.prod(tile.grid(extents)))


__all__ = ["Layout", "flat_boxes", "layout", "DEFAULT_REGS", "ROperator", "Variant", "launch_us", "operators"]
