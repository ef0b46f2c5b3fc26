"""The explicit default schedule and the limits every NVIDIA GPU shares.

When no stage chose a tile, an op still runs with a stated schedule, never a guess
(docs/codegen.md, "Kernel shapes"): `DEFAULT_THREADS` threads per block, one output point per
thread, or one *lane group* of up to 32 threads per point for a reduction over a contiguous
axis, in a grid-stride loop of `ceil(points / points_per_block)` blocks capped at
`MAX_DEFAULT_GRID`. The tiled CPU executor runs an un-rolled op with `default_tile`, the same
blocking laid over the innermost axes.
"""

from __future__ import annotations

import math

from tilekit.tile.nodes import STATIC_SMEM_LIMIT

#: Threads per block of the default schedule (and of opaque ops' fixed schedule).
DEFAULT_THREADS = 256
#: The default schedule's grid cap; a grid-stride loop covers the rest.
MAX_DEFAULT_GRID = 65535
WARP = 32
#: Registers per thread assumed for a fused group's body (ptxas is asked only at codegen):
#: the welded kernels of the bundled models use 24-56 (tk-codegen --compile, sm_90, BERT, GPT,
#: MLP-Mixer and MobileNet blocks). tk-weld prices its groups and tk-ram plans its slots with
#: it; a program's launch bounds make ptxas fit what co-residency leaves, and `tk-codegen
#: --compile` reports a body that would spill.
FUSED_REGS = 64
#: Registers assumed for a default-shape or opaque kernel when nothing better is known (ptxas
#: gives the grid-stride kernels of the model zoo 16-40; codegen re-checks with ptxas').
DEFAULT_REGS = 40
#: Lane groups: a reduction whose innermost reduction axis is contiguous in memory and at
#: least this long is split over up to 32 lanes (warp shuffles combine the partial results).
LANE_MIN_EXTENT = 16


def lane_count(reduction: tuple[tuple[str, int], ...], contiguous: bool,
               varies: bool = False) -> int:
    """Lanes per output point for a reduction: a power of two <= 32, or 1. `varies`: the
    innermost reduction axis's extent moves with a symbol of the module (a size read at run
    time): a warp, whatever this size's extent, so that every size has one structure."""
    if not reduction or not contiguous:
        return 1
    if varies:
        return WARP
    extent = reduction[-1][1]
    if extent < LANE_MIN_EXTENT:
        return 1
    return min(WARP, 1 << (extent.bit_length() - 1))


def fused_lanes(reduction: tuple[tuple[str, int], ...], contiguous: bool, volume: int,
                threads: int, varies: bool = False) -> int:
    """Lanes per point of a stage of the fused kernel shape (tilekit.codegen.fused) whose
    region has `volume` points, in a block of `threads` (whole warps): a warp's worth for a
    contiguous reduction (`lane_count`), more (up to the whole block) when the region has
    fewer points than warps, so that a block reducing one long row keeps every warp busy.
    tk-weld prices the stage with the same count (tilekit.weld.model). `varies`: as
    `lane_count`'s (a warp, never more: the region's points may vary too)."""
    lanes = lane_count(reduction, contiguous, varies)
    if lanes < WARP or varies:
        return min(lanes, threads)
    extent = reduction[-1][1]
    points = 1 << max(0, (volume - 1).bit_length())          # next power of two
    wide = max(WARP, threads // points)
    # A lane group must divide the block (threads & -threads: its largest power-of-two
    # divisor, a multiple of WARP): a thread past the last whole group would take part in a
    # point that belongs to the next pass.
    wide = min(wide, threads & -threads, 1 << (extent.bit_length() - 1))
    return max(lanes, 1 << (wide.bit_length() - 1))


def default_grid(points: int, points_per_block: int) -> int:
    return max(1, min(MAX_DEFAULT_GRID, -(-points // points_per_block)))


def default_tile(spatial, reduction) -> dict:
    """The tile an un-rolled op runs with in the tiled CPU mode: one thread per output
    element, blocks of up to `DEFAULT_THREADS` threads laid over the innermost axes, the whole
    reduction in one step (a `tile` payload, tilekit.ir.payloads)."""
    block: dict[str, int] = {}
    budget = DEFAULT_THREADS
    for axis, extent in reversed(spatial):
        size = max(1, min(extent, budget))
        block[axis] = size
        budget = max(1, budget // size)
    block = {a: block[a] for a, _ in spatial}
    grid = {a: -(-e // block[a]) if e else 0 for a, e in spatial}
    return {"block": block, "thread": {a: 1 for a in block},
            "step": {a: max(1, e) for a, e in reduction}, "grid": grid,
            "blocks": math.prod(grid.values()), "threads": math.prod(block.values())}


#: Bytes of one shared-memory element per compute kind (bool, int64, float32, float64).
KIND_BYTES = {"b": 1, "i": 8, "f": 4, "d": 8}


def shared_bytes(count: int, kind: str) -> int:
    """Bytes of a shared buffer of `count` elements of `kind`, rounded up to 16 so that the
    next buffer carved from the same dynamic allocation stays 16-byte aligned (float4)."""
    return -(-count * KIND_BYTES[kind] // 16) * 16
