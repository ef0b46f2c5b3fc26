"""rTiles: tile shapes aligned to the hardware, and the padding-waste rule for tile sizes.

An `RTile` is one rProgram candidate: a per-thread register tile and a per-block
(shared-memory) tile over the spatial axes, and a reduction step per reduction axis. The grid
follows (`ceil(extent / block)` per axis).

Which sizes an axis may take (Roller's alignment rules, in our words):

- **padding waste**: a size `s` for an axis of extent `N` is allowed only when the padded
  extent stays close to `N`: `ceil(N/s)*s <= (1+e)*N`. `e` starts at 0 and is swept upwards
  (`WASTE_STEPS`) until the axis has at least `MIN_SIZES` sizes to choose from;
- **transactions**: on an axis that indexes the innermost, contiguous dimension of a tensor
  (`Problem.innermost`), a block size (or reduction step) is a multiple of one memory
  transaction in elements (`profile.transaction_bytes / itemsize`: 8 fp32 on NVIDIA) so that
  every row of a staged tile is whole transactions; an extent smaller than that is taken whole;
- **warps**: a block should hold whole warps; one that does not is costed with its idle lanes
  (`tilekit.roll.cost`), so construction prefers whole warps without forbidding small blocks
  for small ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from tilekit.roll.problem import Problem

#: Padding-waste tolerances tried in order until an axis has `MIN_SIZES` sizes.
WASTE_STEPS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
MIN_SIZES = 6
#: Largest per-axis size considered for a block tile or a reduction step.
MAX_BLOCK_SIZE = 4096
#: Largest per-axis size of a thread (register) tile.
MAX_THREAD_SIZE = 16


@dataclass(frozen=True, order=True)
class RTile:
    """One rProgram: sizes in the problem's axis order (spatial for block/thread, reduction
    for step)."""

    block: tuple[int, ...]
    thread: tuple[int, ...]
    step: tuple[int, ...]

    def grid(self, problem: Problem) -> tuple[int, ...]:
        return tuple(-(-n // b) for n, b in zip(problem.extents, self.block))

    def threads(self) -> int:
        return math.prod(b // t for b, t in zip(self.block, self.thread))


def padded(extent: int, size: int) -> int:
    return -(-extent // size) * size


def waste_ok(extent: int, size: int, e: float) -> bool:
    """The padding-waste rule: `ceil(N/s)*s <= (1+e)*N`."""
    return padded(extent, size) <= (1.0 + e) * extent + 1e-9


@lru_cache(maxsize=4096)
def _raw_sizes(extent: int, cap: int) -> tuple[int, ...]:
    """Sizes worth trying before the waste rule: powers of two (up to the first one past the
    extent), divisors of the extent, and the extent itself, all <= cap."""
    sizes = {extent} if extent <= cap else set()
    p = 1
    while p <= cap:
        sizes.add(p)
        if p >= extent:
            break
        p *= 2
    for d in range(1, int(math.isqrt(extent)) + 1):
        if extent % d == 0:
            sizes.update(x for x in (d, extent // d) if x <= cap)
    return tuple(sorted(sizes))


@lru_cache(maxsize=4096)
def axis_sizes(extent: int, cap: int = MAX_BLOCK_SIZE, align: int = 1,
               min_sizes: int = MIN_SIZES) -> tuple[int, ...]:
    """Sizes allowed for an axis of `extent`: aligned (see `aligned`), and passing the
    padding-waste rule with `e` swept up from 0 until at least `min_sizes` sizes (or every
    aligned candidate) pass."""
    raw = tuple(s for s in _raw_sizes(extent, cap) if aligned(s, extent, align)) or (extent,)
    for e in WASTE_STEPS:
        ok = tuple(s for s in raw if waste_ok(extent, s, e))
        if len(ok) >= min(min_sizes, len(raw)):
            return ok
    return raw


def align_elements(problem: Problem, transaction_bytes: int, axis: int) -> int:
    """Elements per memory transaction on `axis` (1 if the axis is not innermost anywhere)."""
    if axis not in problem.innermost:
        return 1
    itemsizes = [problem.out_itemsize] + [op.itemsize for op in problem.operands]
    return max(1, transaction_bytes // min(itemsizes))


def aligned(size: int, extent: int, align: int) -> bool:
    """A block size or step is aligned when it fills whole transactions, or takes a small
    extent (smaller than one transaction) whole."""
    if align <= 1:
        return True
    if extent <= align:
        return size == extent
    return size % align == 0 or size == extent


def block_sizes(problem: Problem, transaction_bytes: int, axis: int) -> tuple[int, ...]:
    """Allowed block sizes (spatial axis) or reduction steps (reduction axis) for `axis`,
    aligned to memory transactions of `transaction_bytes` (`Machine.transaction_bytes`)."""
    extent = problem.extents[axis]
    return axis_sizes(extent, MAX_BLOCK_SIZE, align_elements(problem, transaction_bytes, axis))


def thread_sizes(problem: Problem, axis: int) -> tuple[int, ...]:
    """Allowed register-tile sizes for spatial `axis` (not aligned: a register tile is not a
    memory transaction), at most `MAX_THREAD_SIZE` and never past the extent."""
    extent = problem.extents[axis]
    return tuple(s for s in axis_sizes(extent, MAX_THREAD_SIZE) if s <= extent) or (1,)
