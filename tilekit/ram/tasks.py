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
persistent-program candidate when codegen runs it as one stage (its main op's kernel, with
the ops before it inlined and those after it chained: its blocks are the main op's, which
tk-weld's group tile names, or the first op's for a chain without one) or as the `fused`
shape over tk-weld's tile (several stages sharing one output tile: a block per tile of the
last op's output, the tile's threads rounded up to whole warps, tk-weld's shared footprint
plus an upper bound of codegen's cross-warp partials, and `FUSED_REGS` registers). Any other
group (the flash form of attention, several stages without tk-weld's tile, a group holding an
opaque op) stays an ordinary kernel (`fixed`), with a reason. A group tile is read for its
form only: what it means for the module is the weld verifier's, run by codegen and the CPU
executor. Codegen checks the block counts and threads again when it composes the program,
and `--compile` the registers (spills) and co-residency.

Durations come from the shared cost model (`kernels[i].estimate` / `ops[i].tile` estimates,
tilekit.roll.cost): a kernel's time without the launch overhead the model adds, spread over its
waves; a task lasts one wave's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tilekit.errors import TilekitError
from tilekit.ir.graph import graph
from tilekit.ir.model import Kernel, Module, default_kernels
from tilekit.ir.payloads import (Estimate, GroupTile, OpTile, Tile, is_split, read_group_tile,
                                  welded)
from tilekit.roll.cost import estimate_bytes, registers_per_thread
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.problem import tensor_bytes
from tilekit.schedule.block import BARRIER_SHAPES
from tilekit.schedule.defaults import (DEFAULT_REGS, DEFAULT_THREADS, FUSED_REGS, WARP,
                                       default_grid)
from tilekit.schedule.mma import recorded_precision
from tilekit.schedule.shape import (Target, align_smem, analysis_facts, decide, default_blocks,
                                    kept_default)



# -- where each rTask writes ------------------------------------------------------------------

Box = tuple[tuple[int, int], ...]   # half-open range per dimension


@dataclass(frozen=True)
class Layout:
    """Which output points block `b` of an operator's kernel computes, over the spatial
    extents of its main op (a fused group's: its last op's): `box` (a tile grid in row-major
    block order, as codegen decomposes the block index), `flat` (a grid-stride loop: `per_block` consecutive points
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
    layout: Layout        # which output points each of its blocks computes

    @property
    def barriers(self) -> bool:
        """The body synchronises its block (`__syncthreads`: the staged, SIMT GEMM and
        tensor-core shapes, tilekit.schedule.block.BARRIER_SHAPES):
        it must run on exactly `threads` threads. Other bodies (tiled, default) may run on
        the first `threads` threads of a larger block (tilekit.schedule.block). A fused
        group's body synchronises between its stages; an opaque op's may (a scatter's one
        block copies, then meets at a barrier), so every opaque body counts; so does a fixed
        group's (`kernel`: never packed)."""
        return self.shape in BARRIER_SHAPES or self.shape in ("fused", "kernel", "opaque")


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

    def variant(self, k: int, where: str = "program.operators") -> Variant:
        """Variant `k`, as a program names it (refused when the operator has no such)."""
        if not 0 <= k < len(self.variants):
            raise TilekitError(f"variant {k} of {self.kernel}: the operator has "
                               f"{len(self.variants)}", where, "re-run tk-ram")
        return self.variants[k]


def program_profile(program):
    """The hardware profile a program was planned for (`program.hardware`), refused at that
    IR path when it is not one."""
    from tilekit.hw import load_profile

    try:
        return load_profile(program.hardware)
    except TilekitError as exc:
        raise TilekitError(f"'{program.hardware}': {exc.what}", "program.hardware",
                           exc.hint) from None


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
    # bodies composed into persistent blocks run mma.sync, never wgmma (warp roles and TMA
    # descriptors do not compose): codegen generates a program's operators so
    target = replace(Target.of(profile, recorded_precision(module)), wgmma=frozenset())
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
    main = first
    if len(kernel.ops) > 1:
        group = welded_group(module, k)
        if isinstance(group, str):
            return _fixed(module, k, kernel, profile, launch, group)
        if group is not None and max(m.stage for m in group.members) > 0:
            return _fused(module, k, kernel, group, profile, launch)
        if group is not None:   # one stage: its main op's kernel (inlined producers before it)
            main = g.node(next(m.op for m in group.members if m.role == "stage"))
        elif not _is_chain(module, kernel):
            return _fixed(module, k, kernel, profile, launch,
                          "a group of several stages without tk-weld's tile: its tile is "
                          "codegen's choice")
    variants = _expr_variants(module, main, profile, target, dtypes, launch)
    if len(kernel.ops) > 1:  # the main op's kernel with an epilogue; the group's time
        est = _kernel_estimate(kernel)
        v = variants[0]
        busy = _busy(est, launch) if est is not None else v.busy_us
        variants = (replace(v, busy_us=busy, task_us=busy * v.task_us / v.busy_us),)
    if is_split(main.op.tile):
        # A persistent body would run the tile unsplit (its slices' partial sums and per-tile
        # counters are a kernel's own): on an H100 ResNet-50, DenseNet-121 and VGG-19 ran
        # 1.5-2.6x slower as programs that did so than as welded kernels
        return ROperator(k, kernel.name, kernel.ops, variants[:1],
                         fixed=f"a split-K tile ({main.op.tile['split_k']} slices of its "
                               "reduction, per-tile counters): a kernel of its own")
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


def welded_group(module: Module, k: int) -> GroupTile | str | None:
    """tk-weld's tile of kernel group `k`; None when it has none; why tk-ram cannot plan its
    blocks (str) for the flash form of attention."""
    kernel = module.kernels[k] if module.kernels else None
    if kernel is None or not welded(kernel):
        return None
    g = graph(module)
    group = read_group_tile(kernel.tile, [g.node(o).analysis for o in kernel.ops],
                            f"kernels[{k}] ({kernel.name}).tile")
    if group.flash is not None:
        return "attention in the flash form: its blocks loop over key steps of their own"
    return group


def _fused(module: Module, k: int, kernel: Kernel, group: GroupTile, profile, launch: float
           ) -> ROperator:
    """Several stages (codegen's `fused` shape): a block per tile of the group's tile over
    its last op's output."""
    est = _kernel_estimate(kernel) or _bytes_estimate(module, kernel.ops, profile)
    busy = _busy(est, launch)
    threads = -(-group.tile.threads // WARP) * WARP
    stages = 1 + max(m.stage for m in group.members)
    smem = group.smem_bytes + stages * align_smem(threads // WARP * 8)
    extents = tuple(e for _, e in graph(module).node(kernel.ops[-1]).analysis.spatial)
    blocks = math.prod(group.grid)
    return ROperator(k, kernel.name, kernel.ops,
                     (Variant(0, blocks, threads, FUSED_REGS, smem, busy, _task_us(busy, est),
                              "fused", Layout("box", extents, block=tuple(group.tile.block),
                                              blocks=blocks)),))


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
    first = graph(module).node(kernel.ops[0]).analysis
    whole = Layout("whole", tuple(e for _, e in first.spatial) if first else ())
    return ROperator(k, kernel.name, kernel.ops,
                     (Variant(0, blocks, DEFAULT_THREADS, DEFAULT_REGS, 0, busy,
                              _task_us(busy, est), "kernel", whole),), fixed=why)


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
                   "opaque", Layout("flat", (elements,), per_block=DEFAULT_THREADS,
                                    blocks=tasks))


def _expr_variants(module: Module, node, profile, target: Target, dtypes, launch: float
                   ) -> tuple[Variant, ...]:
    analysis = node.analysis
    facts = analysis_facts(analysis, dtypes)
    extents = tuple(e for _, e in analysis.spatial)
    if node.op.tile is None or kept_default(node.op.tile):
        # not rolled, or tk-roll kept the default schedule: codegen's default schedule
        shape = decide(facts, None, target)
        est = (Estimate.read(node.op.tile["estimate"], f"{node.where}.tile.estimate")
               if node.op.tile is not None else _bytes_estimate(module, (node.name,), profile))
        busy = _busy(est, launch)
        blocks = default_blocks(facts, shape)
        return (Variant(0, blocks, shape.threads, DEFAULT_REGS, 0, busy, _task_us(busy, est),
                        "default", _strided(extents, shape, blocks)),)
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
        where = _strided(extents, shape, tasks)
    else:
        tasks = math.prod(tile.grid(extents))
        where = Layout("box", extents, block=tuple(tile.block), blocks=tasks)
    return Variant(index, tasks, shape.threads, regs, shape.smem_bytes, busy,
                   _task_us(busy, est), shape.shape, where)


def _strided(extents: tuple[int, ...], shape, blocks: int) -> Layout:
    """The default shape's grid-stride loop: a point per thread, or per lane group."""
    return Layout("flat", extents, per_block=DEFAULT_THREADS // max(shape.lanes, 1),
                  blocks=blocks)


__all__ = ["DEFAULT_REGS", "FUSED_REGS", "Layout", "ROperator", "Variant", "flat_boxes",
           "launch_us", "operators", "program_profile", "welded_group"]
