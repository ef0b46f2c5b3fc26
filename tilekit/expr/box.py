"""The one box algebra: what part of a tensor a tile of an iteration space touches.

Roller sizes tiles by their input footprints, Welder propagates a tile backwards through a
group of ops, the code generator stages boxes in shared memory and the tile-by-tile executor
evaluates boxes: all of them ask the same question, answered here.

A **span** is a range of one dimension whose start may be *symbolic*: linear in the origins of
a block's tile (`Lin`: `sum(coef * origin[position]) + const`) with a fixed length, so that one
span describes the box of every block of a grid. A concrete range is a span whose start has no
origin terms. Through an affine index map `sum(c_a * a) + k`, axes ranging over spans
`[lo_a, lo_a + len_a)` touch

    start  = k + sum(c_a * lo_a) + sum(c_a * (len_a - 1) for c_a < 0)
    length = 1 + sum(|c_a| * (len_a - 1))                       (halo included)

exactly; a quasi-affine index (`//`, `%`) is bounded by interval arithmetic when every span it
uses is concrete, and takes the whole dimension otherwise. `union` and `clamp` combine spans
of several readers and cut them to the tensor.

`extent` is the same length formula over NumPy arrays of tile sizes, so that Roller costs many
candidate tiles in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from tilekit.expr.intervals import interval


@dataclass(frozen=True)
class Lin:
    """`sum(coef * origin[pos] for pos, coef in coefs) + const`: a start linear in the origins
    of a block's tile (positions index the block's axes)."""

    coefs: tuple[tuple[int, int], ...] = ()
    const: int = 0

    @property
    def concrete(self) -> bool:
        return not self.coefs

    def scale(self, k: int) -> "Lin":
        return Lin(tuple((p, c * k) for p, c in self.coefs if c * k), self.const * k)

    def shift(self, k: int) -> "Lin":
        return Lin(self.coefs, self.const + k)

    def __add__(self, other: "Lin") -> "Lin":
        acc = dict(self.coefs)
        for p, c in other.coefs:
            acc[p] = acc.get(p, 0) + c
        return Lin(tuple(sorted((p, c) for p, c in acc.items() if c)), self.const + other.const)

    def at(self, origins: Sequence[int]) -> int:
        """The start for concrete block origins."""
        return self.const + sum(c * origins[p] for p, c in self.coefs)


@dataclass(frozen=True)
class Span:
    """`[lo, lo + length)` of one dimension, `lo` possibly symbolic."""

    lo: Lin
    length: int

    @staticmethod
    def of(start: int, stop: int) -> "Span":
        """The concrete half-open range [start, stop)."""
        return Span(Lin((), start), stop - start)

    @staticmethod
    def whole(dim: int) -> "Span":
        return Span(Lin(), dim)

    @property
    def range(self) -> tuple[int, int]:
        """(start, stop) of a concrete span."""
        if not self.lo.concrete:
            raise ValueError("a symbolic span has no concrete range")
        return self.lo.const, self.lo.const + self.length

    def at(self, origins: Sequence[int]) -> tuple[int, int]:
        start = self.lo.at(origins)
        return start, start + self.length


def tile_spans(block: Sequence[int]) -> tuple[Span, ...]:
    """The spans of a block's own tile: axis q starts at origin q and is block[q] long."""
    return tuple(Span(Lin(((q, 1),), 0), b) for q, b in enumerate(block))


def affine_span(terms: Iterable[tuple[str, int]], const: int,
                spans: Mapping[str, Span]) -> Span:
    """The span an affine index `sum(c * axis) + const` covers while each axis ranges over its
    span (halo included; see the module docstring)."""
    lo = Lin((), const)
    length = 1
    for axis, c in terms:
        s = spans[axis]
        lo = lo + s.lo.scale(c)
        if c < 0:
            lo = lo.shift(c * (s.length - 1))
        length += abs(c) * (s.length - 1)
    return Span(lo, length)


def map_box(maps, spans: Mapping[str, Span], dims: Sequence[int],
            clamp_to_tensor: bool = False) -> tuple[Span, ...]:
    """The box of a tensor read through index `maps` (tilekit.expr.IndexMap, one per
    dimension) while the axes range over `spans`. A quasi-affine map is bounded by intervals
    when its axes' spans are concrete, else it takes the whole dimension."""
    out = []
    for m, dim in zip(maps, dims):
        if m.affine:
            span = affine_span(m.terms, m.const, spans)
        elif all(spans[a].lo.concrete for a in m.axes):
            lo, hi = interval(m.node, {a: (spans[a].lo.const,
                                           spans[a].lo.const + spans[a].length - 1)
                                       for a in m.axes})
            span = Span.of(lo, hi + 1)
        else:
            span = Span.whole(dim)
        out.append(clamp(span, dim) if clamp_to_tensor else span)
    return tuple(out)


def union(a: Span, b: Span, dim: int) -> Span:
    """The smallest span holding both; the whole dimension when their starts move
    differently with the block origins."""
    if a.lo.coefs != b.lo.coefs:
        return Span.whole(dim)
    lo = min(a.lo.const, b.lo.const)
    hi = max(a.lo.const + a.length, b.lo.const + b.length)
    return Span(Lin(a.lo.coefs, lo), hi - lo)


def clamp(s: Span, dim: int) -> Span:
    """A span cut to a dimension of size `dim`: exact for concrete spans; a symbolic span as
    long as the dimension becomes the whole dimension (its start is no longer needed)."""
    if s.lo.concrete:
        start, stop = max(s.lo.const, 0), min(s.lo.const + s.length, dim)
        return Span.of(start, max(start, stop))
    return Span.whole(dim) if s.length >= dim else s


def extent(coefs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Vectorised span lengths: `1 + |coefs| @ (sizes - 1)`.

    `coefs` is (n_dims, n_axes) (index coefficients of each tensor dimension), `sizes` is
    (n_axes, n) (one column per candidate tile): the (n_dims, n) lengths of the box each tile
    reads, halo included, before clamping to the tensor.
    """
    return 1 + np.abs(coefs) @ (sizes - 1)
