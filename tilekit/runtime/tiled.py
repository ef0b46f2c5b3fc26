"""Tile-faithful CPU execution (`tk-run --mode tiled`): an op run block by block and reduction
step by step.

`run_op_tiled` executes an expr op the way its `tile` (docs/roll.md) says a device would: for
every block of the grid (boundary blocks clipped to the extents), for every reduction step in
order, `tilekit.expr.evaluate` computes the partial result of that box, and partials are
combined with the statement's operator (`+=` add, `max=` maximum, ...). Comparing its result
with the whole-op evaluation checks a schedule (coverage, boundary tiles, halos, step
boundaries) without a GPU. The tile is read with tilekit's one tile checker
(`tilekit.ir.payloads.read_tile`), so the blocks and steps it walks compute every output point
once and combine every reduction point once; an op without a tile runs with the explicit
default (`tilekit.schedule.defaults.default_tile`).

Speed: blocks are independent, so `max_boxes` lets the executor evaluate several whole,
adjacent blocks as one box (never splitting a block, and keeping every boundary block on
its own). Reduction steps are combined in order, and run vectorised where that changes no
result (`reduce_steps`): a `max=`/`min=` op in one evaluation (the maximum of the steps'
maxima is the maximum), steps of one point each (the partial of a step is then the body at
that point) as one evaluation of the body over many points and a sequential
`ufunc.accumulate`, which makes the same combines in the same order as the loop. Other
steps run one by one, at most `limits.TILE_STEPS` evaluations per op (a one-point step over
4M points took minutes before).
"""

from __future__ import annotations

import dataclasses
import math
from itertools import product
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from tilekit import limits
from tilekit.errors import IRError
from tilekit.expr import Analysis, evaluate
from tilekit.expr.ops import REDUCTIONS, is_half
from tilekit.expr.reference import CHUNK_ELEMENTS, as_compute
from tilekit.ir.payloads import Tile, read_tile
from tilekit.schedule.defaults import default_tile

#: Boxes (blocks x steps) one op may evaluate in the runtime's tiled mode before adjacent
#: whole blocks are merged; keeps `tk-run --mode tiled` on a ResNet-50 in seconds.
RUNTIME_BOX_BUDGET = 64

Interval = tuple[int, int]


# -- coverage ------------------------------------------------------------------------------

def axis_intervals(extent: int, size: int) -> list[Interval]:
    """The half-open intervals of the tiles along one axis: `[g*size, min((g+1)*size, N))`."""
    return [(g * size, min((g + 1) * size, extent)) for g in range(-(-extent // size))]


def check_tile_cover(analysis: Analysis, tile: Mapping[str, Any], where: str = "tile"
                     ) -> Tile:
    """`tile` read against the op (tilekit.ir.payloads.read_tile), or an IRError located at
    the field to fix."""
    return read_tile(tile, analysis.spatial, analysis.reduction, where)


# -- execution -----------------------------------------------------------------------------

def _merged(intervals: list[Interval], group: int) -> list[Interval]:
    """Runs of `group` adjacent whole tiles as one interval; a clipped last tile stays alone."""
    if group <= 1 or len(intervals) <= 1:
        return intervals
    full = intervals if intervals[-1][1] - intervals[-1][0] == intervals[0][1] - \
        intervals[0][0] else intervals[:-1]
    out = [(full[i][0], full[min(i + group, len(full)) - 1][1])
           for i in range(0, len(full), group)]
    return out + intervals[len(full):]


def block_boxes(analysis: Analysis, block: Sequence[int], max_boxes: int | None = None
                ) -> Iterator[dict[str, Interval]]:
    """The spatial boxes to evaluate, in grid order (row-major over the spatial axes): one per
    block, or with `max_boxes`, runs of whole adjacent blocks merged until at most that many
    boxes remain (merging the axis with the most boxes first)."""
    names = [a for a, _ in analysis.spatial]
    for combo in product(*_box_intervals(analysis, block, max_boxes)):
        yield dict(zip(names, combo))


def box_count(analysis: Analysis, block: Sequence[int], max_boxes: int | None = None) -> int:
    """How many boxes `block_boxes` yields (without making them)."""
    return math.prod(len(m) for m in _box_intervals(analysis, block, max_boxes))


def _box_intervals(analysis: Analysis, block: Sequence[int], max_boxes: int | None
                   ) -> list[list[Interval]]:
    per_axis = [axis_intervals(e, b) for (_, e), b in zip(analysis.spatial, block)]
    if max_boxes is not None:
        groups = [1] * len(per_axis)
        merged = list(per_axis)
        open_axes = {i for i, m in enumerate(merged) if len(m) > 1}
        while open_axes and math.prod(len(m) for m in merged) > max_boxes:
            a = max(open_axes, key=lambda i: (len(merged[i]), -i))
            groups[a] *= 2
            before = len(merged[a])
            merged[a] = _merged(per_axis[a], groups[a])
            if len(merged[a]) == before or len(merged[a]) <= 1:
                open_axes.discard(a)  # nothing (more) to merge on this axis
        per_axis = merged
    return per_axis


def step_boxes(analysis: Analysis, step: Sequence[int]) -> list[dict[str, Interval]]:
    """The reduction boxes, one per step, in execution order (row-major over the axes)."""
    names = [a for a, _ in analysis.reduction]
    per_axis = [axis_intervals(e, s) for (_, e), s in zip(analysis.reduction, step)]
    return [dict(zip(names, combo)) for combo in product(*per_axis)]


def step_count(analysis: Analysis, step: Sequence[int]) -> int:
    return math.prod(-(-e // s) for (_, e), s in zip(analysis.reduction, step))


def steps_one_by_one(analysis: Analysis, step: Sequence[int]) -> bool:
    """Whether `reduce_steps` runs the steps of `step` one evaluation each (the others are
    vectorised: see the module docstring)."""
    if not analysis.reduction or analysis.assign in ("max=", "min="):
        return False
    return not all(s == 1 or e == 1 for (_, e), s in zip(analysis.reduction, step))


def check_step_budget(analysis: Analysis, step: Sequence[int], boxes: int, where: str
                      ) -> None:
    """Refuse, before it starts, an op whose steps would run one by one more than
    `limits.TILE_STEPS` times (boxes x steps)."""
    if not steps_one_by_one(analysis, step):
        return
    count = boxes * step_count(analysis, step)
    if count > limits.TILE_STEPS.value:
        shown = ", ".join(f"{a}: {s}" for (a, _), s in zip(analysis.reduction, step))
        raise limits.TILE_STEPS.error(
            f"the tiled run of {boxes:,} box(es) x {step_count(analysis, step):,} reduction "
            f"steps of {{{shown}}} ({count:,} evaluations one by one)", where)


def reduce_steps(analysis: Analysis, env: Mapping[str, np.ndarray], pad: str | None,
                 box: Mapping[str, Interval], step: Sequence[int], partial=None,
                 vectorise: bool = True) -> np.ndarray:
    """The op over the spatial `box`, its reduction walked in the steps of `step` and the
    steps' partial results combined in order with the statement's operator (`partial`: the
    dtype of the partials). `vectorise=False` runs every step on its own (the definition
    the vectorised forms are tested against)."""
    if not analysis.reduction:
        return evaluate(analysis, env, pad=pad, box=dict(box), out_dtype=partial)
    if vectorise and analysis.assign in ("max=", "min="):
        # max (min) of the steps' maxima (minima) over any split: one evaluation, exact.
        return evaluate(analysis, env, pad=pad, box=dict(box), out_dtype=partial)
    if vectorise and not steps_one_by_one(analysis, step):
        return _one_point_steps(analysis, env, pad, box, partial)
    combine = REDUCTIONS[analysis.assign].combine
    acc = None
    for red in step_boxes(analysis, step):
        part = evaluate(analysis, env, pad=pad, box={**box, **red}, out_dtype=partial)
        with np.errstate(all="ignore"):  # as in evaluate: inf and NaN are values here
            acc = part if acc is None else combine(acc, part)
    return acc


def _one_point_steps(analysis: Analysis, env, pad, box, partial) -> np.ndarray:
    """Steps of one reduction point each: the partial of a step is the body at its point.
    The body is evaluated over many points at once (the reduction axes made spatial), and
    `ufunc.accumulate` combines the partials one after the other in step order (row-major
    over the reduction axes), carrying the result from one chunk of points to the next:
    the same combines, in the same order, as the step loop."""
    lifted = _lifted(analysis)
    combine = REDUCTIONS[analysis.assign].combine
    nspatial = len(analysis.spatial)
    spatial_shape = tuple(hi - lo for lo, hi in box.values())
    (first, extent), rest = analysis.reduction[0], analysis.reduction[1:]
    per_row = max(1, math.prod(spatial_shape) * math.prod(e for _, e in rest))
    rows = max(1, CHUNK_ELEMENTS // per_row)
    acc = None
    for lo in range(0, extent, rows):
        hi = min(extent, lo + rows)
        points = evaluate(lifted, env, pad=pad, out_dtype=partial,
                          box={**box, first: (lo, hi), **{a: (0, e) for a, e in rest}})
        points = np.moveaxis(points.reshape(spatial_shape + points.shape[nspatial:]),
                             tuple(range(nspatial, points.ndim)),
                             tuple(range(points.ndim - nspatial)))
        points = points.reshape((-1,) + spatial_shape)
        if acc is not None:
            points = np.concatenate([acc[None].astype(points.dtype, copy=False), points])
        with np.errstate(all="ignore"):  # dtype: no upcast of small integers
            acc = combine.accumulate(points, axis=0, dtype=points.dtype)[-1]
    return acc


def _lifted(analysis: Analysis) -> Analysis:
    """`analysis` with its reduction axes made spatial: the body at every point, unreduced."""
    extents = tuple(e for _, e in analysis.reduction)
    return dataclasses.replace(analysis, spatial=analysis.spatial + analysis.reduction,
                               reduction=(), out_shape=tuple(analysis.out_shape) + extents)


def run_op_tiled(analysis: Analysis, env: Mapping[str, np.ndarray], tile: Mapping[str, Any],
                 pad: str | None = None, out_dtype=None, max_boxes: int | None = None,
                 where: str = "tile") -> np.ndarray:
    """Evaluate an op block by block over its grid and step by step over its reduction.

    Every block (boundary blocks clipped) gets its partial results for each reduction step in
    order, combined with the statement's operator from the first partial on
    (`reduce_steps`). `max_boxes` (None: every block on its own) bounds the number of spatial
    boxes by merging whole adjacent blocks. Returns the output array, cast to `out_dtype`
    (default: the analysis's). Steps that would run one by one more than
    `limits.TILE_STEPS` times are refused (a `LimitError` at `where`) before any runs.
    """
    checked = check_tile_cover(analysis, tile)
    shape = tuple(e for _, e in analysis.spatial)
    dtype = np.dtype(out_dtype or analysis.out_dtype or np.float32)
    steps = step_count(analysis, checked.step) if analysis.reduction else 0
    out = np.empty(shape, dtype=dtype)
    if 0 in shape:
        return out
    budget = None if max_boxes is None else max(1, max_boxes // max(1, steps))
    if steps_one_by_one(analysis, checked.step):
        check_step_budget(analysis, checked.step,
                          box_count(analysis, checked.block, budget), where)
    # Half types compute and accumulate in float32 and round once, on store (the precision
    # rule of specs/expressions.md): partial results stay float32 across steps.
    env = as_compute(env, analysis.inputs)
    partial = np.float32 if is_half(dtype) else None
    for box in block_boxes(analysis, checked.block, budget):
        where_ = tuple(slice(lo, hi) for lo, hi in box.values())
        acc = reduce_steps(analysis, env, pad, box, checked.step, partial)
        out[where_] = np.reshape(acc, out[where_].shape)
    return out


def run_step_tiled(step, env: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The CPU runtime's "tiled" op runner (tilekit.runtime.cpu.register_mode): expr ops run
    with their `tile` (or `default_tile` when the module was not rolled), opaque ops as in
    every mode."""
    from tilekit.runtime.cpu import run_opaque

    if step.op.kind != "expr":
        return run_opaque(step, env)
    tile = step.op.tile if step.op.tile else default_tile(step.analysis.spatial,
                                                          step.analysis.reduction)
    try:
        check_tile_cover(step.analysis, tile)
    except IRError as exc:
        raise exc.located(f"{step.where}") from None
    return [run_op_tiled(step.analysis, env, tile, pad=step.op.pad, out_dtype=step.dtypes[0],
                         max_boxes=RUNTIME_BOX_BUDGET, where=f"{step.where}.tile")]


# -- welded groups -------------------------------------------------------------------------

class GroupBlocks:
    """A welded kernel group (docs/weld.md) run one block at a time as its kernel would:
    from the block's box of the last op's output, each member's region is propagated back
    (tilekit.weld.structure: halos, whole reduced rows) and evaluated in order, reductions
    step by step with the member's rolled step. An intermediate that stays in the group lives
    only in a per-tile buffer: a full-size array that holds NaN everywhere except the current
    tile's region (floating types), so a member reading outside what the tile computed gets
    NaN and the check fails. Results stored for readers outside the group go to `sink`.

    `run_group_tiled` runs every block; the program mode (tilekit.runtime.program) runs them
    as rTasks, checking with `need` that what a block reads from outside was produced."""

    def __init__(self, name: str, tile: Mapping[str, Any], steps):
        from tilekit.ir.payloads import read_group_tile

        for step in steps:
            if step.op.kind != "expr":
                raise IRError(f"kernel group '{name}' holds opaque op '{step.op.name}'",
                              "kernels", "re-run tk-weld (opaque ops run alone)")
        self.steps = tuple(steps)
        self.analyses = [st.analysis for st in steps]
        self.last = self.analyses[-1]
        self.where = f"kernels ({name}).tile"
        self.group = read_group_tile(tile, self.analyses, self.where)
        self.stored = set(self.group.stored)
        self.outputs = [a.output for a in self.analyses]
        self.scratch = {t: _poisoned(st) for t, st in zip(self.outputs, steps)
                        if t not in self.stored}
        self.names = [st.op.name for st in steps]
        boxes = box_count(self.last, self.group.tile.block, RUNTIME_BOX_BUDGET)
        for st, a in zip(self.steps, self.analyses):
            checked = check_tile_cover(a, _member_tile(st, a), f"{st.where}.tile")
            check_step_budget(a, checked.step, boxes, f"{st.where}.tile")

    def boxes(self, max_boxes: int | None = RUNTIME_BOX_BUDGET):
        return block_boxes(self.last, self.group.tile.block, max_boxes)

    def run(self, box: Sequence[Interval], env: Mapping[str, np.ndarray], sink,
            need=None) -> None:
        """One box of the last op's output (whole blocks): every member over its region;
        `sink(tensor, index, value)` writes each stored result into `env[tensor]` (where
        later members read it), `need(step, ranges)` (when
        given) checks a member's reads from outside the group before it runs."""
        from tilekit.expr.box import Span
        from tilekit.weld.structure import walk_regions

        spans = [Span.of(lo, hi) for lo, hi in box]
        regions = walk_regions(self.analyses, spans, self.names)
        local = {**env, **self.scratch}
        touched = []
        for st, a, region in zip(self.steps, self.analyses, regions):
            ranges = {n: s.range for (n, _), s in zip(a.spatial, region)}
            if any(hi <= lo for lo, hi in ranges.values()):
                continue
            if need is not None:
                need(st, ranges)
            value = _evaluate_steps(st, a, local, ranges)
            where_ = tuple(slice(lo, hi) for lo, hi in ranges.values())
            if a.output in self.stored:
                sink(a.output, where_, value)      # into env's array: later members read it
            else:
                buf = self.scratch[a.output]
                buf[where_] = np.reshape(value, buf[where_].shape)
                touched.append((buf, where_))
        for buf, where_ in touched:          # the per-tile buffers die with the tile
            if buf.dtype.kind in "fc":
                buf[where_] = np.nan


def run_group_tiled(name: str, tile: Mapping[str, Any], steps, env: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """Run a welded kernel group tile by tile (`GroupBlocks`) over every block of the last
    op's grid (adjacent whole blocks merged up to the runtime's budget). Every stored element
    must be written (else the group tile does not cover them: an IRError). Returns the stored
    tensors."""
    blocks = GroupBlocks(name, tile, steps)
    results = {t: np.empty(st.shapes[0], dtype=st.dtypes[0])
               for t, st in zip(blocks.outputs, steps) if t in blocks.stored}
    written = {t: np.zeros(a.shape, dtype=bool) for t, a in results.items()}

    def sink(t: str, index, value) -> None:
        results[t][index] = np.reshape(value, results[t][index].shape)
        written[t][index] = True

    env = {**env, **results}
    for box in blocks.boxes():
        blocks.run(list(box.values()), env, sink)
    for t, mask in written.items():
        if not mask.all():
            raise IRError(f"the blocks' regions leave {int((~mask).sum())} elements of "
                          f"'{t}' uncomputed, but readers outside the group need them",
                          f"{blocks.where}.block", "re-run tk-weld")
    return results


def _poisoned(step) -> np.ndarray:
    dtype = step.dtypes[0]
    if np.dtype(dtype).kind in "fc":
        return np.full(step.shapes[0], np.nan, dtype=dtype)
    return np.zeros(step.shapes[0], dtype=dtype)


def _evaluate_steps(step, analysis: Analysis, env, ranges) -> np.ndarray:
    """A member over its region, reduction step by step with its rolled step."""
    checked = check_tile_cover(analysis, _member_tile(step, analysis), f"{step.where}.tile")
    acc = reduce_steps(analysis, env, step.op.pad, ranges, checked.step)
    return np.asarray(acc).astype(step.dtypes[0], copy=False)


def _member_tile(step, analysis: Analysis) -> Mapping[str, Any]:
    return step.op.tile if step.op.tile else default_tile(analysis.spatial, analysis.reduction)


def _register() -> None:
    from tilekit.runtime.cpu import register_mode

    register_mode("tiled", run_step_tiled, run_group_tiled)


_register()
