"""Tiles as codegen reads them, the explicit default schedule, and the launch limits.

A tile comes from the IR (an op's `tile`, written by tk-roll, or a kernel's `tile`, written by
tk-weld for the last op's output) and is checked here: `block` gives every spatial axis a
positive size, `thread` divides `block` per axis, `step` (reduction axes) is positive, and a
block has at most `MAX_THREADS` threads. A broken tile is bad input naming its IR path.

When no stage wrote a tile, codegen uses the **default schedule** (docs/codegen.md):
`DEFAULT_THREADS` threads per block, one output point per thread (or one *lane group* of up to
32 threads per point for a reduction over a contiguous axis), a grid-stride loop over the
output, and a grid of `ceil(points / points_per_block)` blocks capped at `MAX_DEFAULT_GRID`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from tilekit.errors import TilekitError
# Threads per block of the default schedule and of the fused shape without a tile: one
# default shared with tk-roll's schedule for opaque ops.
from tilekit.roll.rtile import DEFAULT_THREADS  # noqa: F401

#: The default schedule's grid cap; a grid-stride loop covers the rest.
MAX_DEFAULT_GRID = 65535
#: CUDA's limit on threads per block (every NVIDIA architecture since sm_20).
MAX_THREADS = 1024
#: Static shared memory a kernel may declare without opting in (every NVIDIA arch).
STATIC_SMEM_LIMIT = 48 * 1024
#: Lane groups: a reduction whose innermost reduction axis is contiguous in memory and at
#: least this long is split over up to 32 lanes (warp shuffles combine the partial results).
LANE_MIN_EXTENT = 16
WARP = 32
#: Bytes of one shared-memory element per compute kind (bool, int64, float32, float64).
KIND_BYTES = {"b": 1, "i": 8, "f": 4, "d": 8}


def shared_bytes(count: int, kind: str) -> int:
    """Bytes of a shared buffer of `count` elements of `kind`, rounded up to 16 so that the
    next buffer carved from the same dynamic allocation stays 16-byte aligned (float4)."""
    return -(-count * KIND_BYTES[kind] // 16) * 16


@dataclass(frozen=True)
class Tile:
    """Block/thread sizes per spatial axis and a step per reduction axis, in axis order."""

    block: tuple[int, ...]
    thread: tuple[int, ...]
    step: tuple[int, ...]
    source: str  # "roll" (op tile), "weld" (kernel tile) or "default"

    @property
    def threads(self) -> int:
        return math.prod(b // t for b, t in zip(self.block, self.thread))

    def grid(self, extents: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(-(-n // b) for n, b in zip(extents, self.block))

    def describe(self, spatial: tuple[str, ...], reduction: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source,
                               "block": dict(zip(spatial, self.block)),
                               "thread": dict(zip(spatial, self.thread))}
        if reduction:
            out["step"] = dict(zip(reduction, self.step))
        return out


def _sizes(payload: Mapping[str, Any], key: str, axes: tuple[str, ...], where: str,
           default: int | None) -> tuple[int, ...]:
    table = payload.get(key)
    if table is None:
        table = {}
    if not isinstance(table, Mapping):
        raise TilekitError(f"'{key}' must be a mapping of axis to size", f"{where}.{key}")
    unknown = sorted(set(table) - set(axes))
    if unknown:
        kind = "reduction" if key == "step" else "spatial"
        raise TilekitError(f"names axes {unknown} which are not {kind} axes of the op "
                           f"(have: {', '.join(axes) or 'none'})", f"{where}.{key}",
                           "re-run tk-roll on this IR")
    out = []
    for a in axes:
        value = table.get(a, default)
        if value is None:
            raise TilekitError(f"axis '{a}' has no size", f"{where}.{key}",
                               "a tile lists every spatial axis in block and every reduction "
                               "axis in step")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TilekitError(f"size of axis '{a}' must be a positive integer, got {value!r}",
                               f"{where}.{key}.{a}")
        out.append(value)
    return tuple(out)


def read_tile(payload: Mapping[str, Any] | None, where: str, spatial: tuple[tuple[str, int], ...],
              reduction: tuple[tuple[str, int], ...], source: str,
              axis_names: tuple[str, ...] | None = None,
              require_step: bool = True) -> Tile | None:
    """Validate a tile payload against an op's axes; None when there is none.

    `axis_names` renames the payload's spatial axes by position (a kernel tile is written
    for the last op of a group, whose axes may be named differently from the stage's).
    Without `require_step`, a missing step means the whole extent (kernel tiles: the fused
    shape loops over whole reductions; the staged shape shrinks steps to fit).
    """
    if payload is None:
        return None
    if not isinstance(payload, Mapping):
        raise TilekitError("a tile must be a mapping", where)
    names = tuple(a for a, _ in spatial)
    payload = dict(payload)
    if axis_names:
        rename = dict(zip(axis_names, names))
        for key in ("block", "thread"):
            if isinstance(payload.get(key), Mapping):
                payload[key] = {rename.get(k, k): v for k, v in payload[key].items()}
    block = _sizes(payload, "block", names, where, None)
    thread = _sizes(payload, "thread", names, where, 1)
    rnames = tuple(a for a, _ in reduction)
    step = _sizes(payload, "step", rnames, where, None if require_step else 1 << 30) \
        if rnames else ()
    for a, b, t in zip(names, block, thread):
        if b % t:
            raise TilekitError(f"block size {b} of axis '{a}' is not a multiple of its thread "
                               f"size {t}", f"{where}.thread.{a}", "re-run tk-roll on this IR")
    grid = payload.get("grid")
    if isinstance(grid, Mapping) and not axis_names:
        for a, b, (_, extent) in zip(names, block, spatial):
            if a in grid and grid[a] != -(-extent // b):
                raise TilekitError(f"grid {grid[a]} of axis '{a}' does not match "
                                   f"ceil({extent} / block {b}) = {-(-extent // b)}",
                                   f"{where}.grid.{a}", "re-run tk-roll on this IR")
    # Sizes larger than the extent waste threads but stay correct; clamp steps only.
    step = tuple(min(s, e) for s, (_, e) in zip(step, reduction))
    tile = Tile(block, thread, step, source)
    if tile.threads > MAX_THREADS:
        raise TilekitError(f"the tile needs {tile.threads} threads per block, more than "
                           f"{MAX_THREADS}", f"{where}.block", "re-run tk-roll on this IR")
    return tile


def lane_count(reduction: tuple[tuple[str, int], ...], contiguous: bool) -> int:
    """Lanes per output point for a reduction: a power of two <= 32, or 1."""
    if not reduction or not contiguous:
        return 1
    extent = reduction[-1][1]
    if extent < LANE_MIN_EXTENT:
        return 1
    return min(WARP, 1 << (extent.bit_length() - 1))


def default_grid(points: int, points_per_block: int) -> int:
    return max(1, min(MAX_DEFAULT_GRID, -(-points // points_per_block)))
