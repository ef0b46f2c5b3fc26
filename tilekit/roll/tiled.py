"""Tile-faithful CPU execution: an op run block by block and reduction step by step.

`run_op_tiled` executes an expr op the way its `tile` (docs/roll.md) says a device would: for
every block of the grid (boundary blocks clipped to the extents), for every reduction step in
order, `tilekit.expr.evaluate` computes the partial result of that box, and partials are
combined with the statement's operator (`+=` add, `max=` maximum, ...). Comparing its result
with the whole-op evaluation checks a schedule (coverage, boundary tiles, halos, step
boundaries) without a GPU.

`check_tile_cover` is tilekit's one tile checker: it checks a tile against its op (axes,
positive sizes, thread tiles dividing blocks, `grid == ceil(extent / block)` from the tile's
own grid and block), so that the blocks and steps the executor walks compute every output
point once and combine every reduction point once.

Speed: blocks are independent, so `max_boxes` lets the executor evaluate several whole,
adjacent blocks as one box (never splitting a block, and keeping every boundary block on
its own); reduction steps are always run one by one, in order. The CPU execution mode
"tiled" (`tk-run --mode tiled`) is registered with the runtime on import.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Any, Iterator, Mapping

import numpy as np

from tilekit.errors import IRError
from tilekit.expr import Analysis, evaluate
from tilekit.expr.ops import REDUCTIONS
from tilekit.roll.rtile import DEFAULT_THREADS

#: Boxes (blocks x steps) one op may evaluate in the runtime's tiled mode before adjacent
#: whole blocks are merged; keeps `tk-run --mode tiled` on a ResNet-50 in seconds.
RUNTIME_BOX_BUDGET = 64

Interval = tuple[int, int]


def default_tile(analysis: Analysis) -> dict[str, Any]:
    """The schedule an un-rolled op runs with: one thread per output element, blocks of up to
    `DEFAULT_THREADS` threads laid over the innermost axes, the whole reduction in one step."""
    block: dict[str, int] = {}
    budget = DEFAULT_THREADS
    for axis, extent in reversed(analysis.spatial):
        size = max(1, min(extent, budget))
        block[axis] = size
        budget = max(1, budget // size)
    block = {a: block[a] for a, _ in analysis.spatial}
    grid = {a: -(-e // block[a]) if e else 0 for a, e in analysis.spatial}
    return {"block": block, "thread": {a: 1 for a in block},
            "step": {a: max(1, e) for a, e in analysis.reduction}, "grid": grid,
            "blocks": math.prod(grid.values()), "threads": math.prod(block.values())}


# -- coverage ------------------------------------------------------------------------------

def axis_intervals(extent: int, size: int) -> list[Interval]:
    """The half-open intervals of the tiles along one axis: `[g*size, min((g+1)*size, N))`."""
    return [(g * size, min((g + 1) * size, extent)) for g in range(-(-extent // size))]


def _sizes(tile: Mapping[str, Any], key: str, axes, where: str) -> dict[str, int]:
    given = tile.get(key)
    if not isinstance(given, Mapping):
        raise IRError(f"'{key}' must be a mapping of axis sizes, got {given!r}",
                      f"{where}.{key}", "re-run tk-roll on this module")
    names = [a for a, _ in axes]
    missing = [a for a in names if a not in given]
    extra = [a for a in given if a not in names]
    if missing or extra:
        raise IRError(f"'{key}' must list exactly the axes {names}"
                      + (f"; missing {missing}" if missing else "")
                      + (f"; unknown {extra}" if extra else ""), f"{where}.{key}",
                      "re-run tk-roll on this module")
    sizes = {}
    for a in names:
        v = given[a]
        if type(v) is not int or v < 1:
            raise IRError(f"size of axis '{a}' must be a positive integer, got {v!r}",
                          f"{where}.{key}.{a}", "re-run tk-roll on this module")
        sizes[a] = v
    return sizes


def check_tile_cover(analysis: Analysis, tile: Mapping[str, Any], where: str = "tile"
                     ) -> None:
    """Raise IRError (located at the field to fix) unless `tile` is a schedule of the op that
    computes every output point once and combines every reduction point once.

    The one tile checker of tilekit: the CPU tiled mode and the code generator both call it.
    It checks the tile against the op, from the tile's own numbers:

    - `block` and `step` list exactly the op's spatial and reduction axes, sizes positive
      integers; `thread`, when given, too, and each thread size divides its block size;
    - `grid`, when given, lists exactly the spatial axes; along each, the blocks cover the
      extent (`grid * block >= extent`) and none lies wholly outside it
      (`(grid - 1) * block < extent`), i.e. `grid == ceil(extent / block)`;
    - `blocks` and `threads`, when given, are the products of the grid and of block/thread.

    Reduction steps need no grid: the executor walks `ceil(extent / step)` of them, clipping
    the last, so a positive step covers the reduction exactly once.
    """
    block = _sizes(tile, "block", analysis.spatial, where)
    step = _sizes(tile, "step", analysis.reduction, where)
    thread = None
    if "thread" in tile:
        thread = _sizes(tile, "thread", analysis.spatial, where)
        for a in block:
            if block[a] % thread[a]:
                raise IRError(f"block size {block[a]} of axis '{a}' is not a multiple of the "
                              f"thread size {thread[a]}", f"{where}.thread.{a}",
                              "re-run tk-roll on this module")
    grid = _sizes(tile, "grid", analysis.spatial, where) if "grid" in tile else \
        {a: -(-e // block[a]) for a, e in analysis.spatial}
    for a, extent in analysis.spatial:
        g, b = grid[a], block[a]
        if g * b < extent:
            raise IRError(f"grid x block of axis '{a}' is {g} x {b} = {g * b}, leaving points "
                          f"{g * b}..{extent - 1} of its extent {extent} uncomputed",
                          f"{where}.grid.{a}", f"the grid must be ceil({extent}/{b}) = "
                          f"{-(-extent // b)}")
        if (g - 1) * b >= extent:
            raise IRError(f"grid of axis '{a}' has {g} blocks of {b}, but {g - 1} blocks "
                          f"already cover its extent {extent}", f"{where}.grid.{a}",
                          f"the grid must be ceil({extent}/{b}) = {-(-extent // b)}")
    if "blocks" in tile and tile["blocks"] != math.prod(grid.values()):
        raise IRError(f"'blocks' is {tile['blocks']!r}, the grid has "
                      f"{math.prod(grid.values())}", f"{where}.blocks",
                      "re-run tk-roll on this module")
    if "threads" in tile and thread is not None and \
            tile["threads"] != math.prod(block[a] // thread[a] for a in block):
        raise IRError(f"'threads' is {tile['threads']!r}, block / thread gives "
                      f"{math.prod(block[a] // thread[a] for a in block)}", f"{where}.threads",
                      "re-run tk-roll on this module")
    del step  # checked above; any positive step covers the reduction (see the docstring)


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


def block_boxes(analysis: Analysis, block: Mapping[str, int], max_boxes: int | None = None
                ) -> Iterator[dict[str, Interval]]:
    """The spatial boxes to evaluate, in grid order (row-major over the spatial axes): one per
    block, or with `max_boxes`, runs of whole adjacent blocks merged until at most that many
    boxes remain (merging the axis with the most boxes first)."""
    names = [a for a, _ in analysis.spatial]
    per_axis = [axis_intervals(e, block[a]) for a, e in analysis.spatial]
    if max_boxes is not None:
        groups = [1] * len(names)
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
    for combo in product(*per_axis):
        yield dict(zip(names, combo))


def step_boxes(analysis: Analysis, step: Mapping[str, int]) -> list[dict[str, Interval]]:
    """The reduction boxes, one per step, in execution order (row-major over the axes)."""
    names = [a for a, _ in analysis.reduction]
    per_axis = [axis_intervals(e, step[a]) for a, e in analysis.reduction]
    return [dict(zip(names, combo)) for combo in product(*per_axis)]


def run_op_tiled(analysis: Analysis, env: Mapping[str, np.ndarray], tile: Mapping[str, Any],
                 pad: str | None = None, out_dtype=None, max_boxes: int | None = None
                 ) -> np.ndarray:
    """Evaluate an op block by block over its grid and step by step over its reduction.

    Every block (boundary blocks clipped) gets its partial results for each reduction step in
    order, combined with the statement's operator from the first partial on. `max_boxes`
    (None: every block on its own) bounds the number of spatial boxes by merging whole
    adjacent blocks. Returns the output array, cast to `out_dtype` (default: the analysis's).
    """
    check_tile_cover(analysis, tile)
    shape = tuple(e for _, e in analysis.spatial)
    dtype = np.dtype(out_dtype or analysis.out_dtype or np.float32)
    steps = step_boxes(analysis, tile.get("step", {}))
    reduction = REDUCTIONS.get(analysis.assign)
    combine = reduction.combine if reduction else None
    out = np.empty(shape, dtype=dtype)
    if 0 in shape:
        return out
    budget = None if max_boxes is None else max(1, max_boxes // max(1, len(steps)))
    for box in block_boxes(analysis, tile["block"], budget):
        where = tuple(slice(lo, hi) for lo, hi in box.values())
        acc = None
        for red in steps or [{}]:
            part = evaluate(analysis, env, pad=pad, box={**box, **red})
            acc = part if acc is None else combine(acc, part)
        out[where] = np.reshape(acc, out[where].shape)
    return out


def run_step_tiled(step, env: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The CPU runtime's "tiled" op runner (tilekit.runtime.cpu.register_mode): expr ops run
    with their `tile` (or `default_tile` when the module was not rolled), opaque ops as in
    every mode."""
    from tilekit.runtime.cpu import run_opaque

    if step.op.kind != "expr":
        return run_opaque(step, env)
    tile = step.op.tile if step.op.tile else default_tile(step.analysis)
    try:
        check_tile_cover(step.analysis, tile)
    except IRError as exc:
        raise exc.located(f"{step.where}") from None
    return [run_op_tiled(step.analysis, env, tile, pad=step.op.pad, out_dtype=step.dtypes[0],
                         max_boxes=RUNTIME_BOX_BUDGET)]


def _register() -> None:
    from tilekit.runtime.cpu import register_mode

    register_mode("tiled", run_step_tiled)


_register()
