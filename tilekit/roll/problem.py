"""An expression op reduced to what tiling needs: its iteration space and its data footprints.

`Problem` is the hashable, name-free summary of one `expr` op that every other module of
`tilekit.roll` works on: axes with extents (spatial first, then reduction), and for each tensor
read, per dimension, how the index depends on the axes. Tensor names are left out on purpose:
two ResNet convolutions with the same shapes are the same problem, so rolling one serves both
(see `tilekit.roll.schedule`).

Footprints are vectorised: `Operand.spans(sizes)` takes a (n_axes, n) integer array of tile
sizes (one column per candidate tile) and returns the per-dimension extents of the input box
touched, halo included, as `tilekit.expr.input_box` gives them for a tile at the origin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

import numpy as np

from tilekit.expr import Analysis, interval
from tilekit.expr.box import extent
from tilekit.schedule.mma import Contraction
from tilekit.schedule.shape import ITEMSIZE, analysis_facts
from tilekit.expr.ast import Node

@dataclass(frozen=True)
class DimMap:
    """How one dimension of an input is indexed.

    Affine: `index = sum(coefs[a] * axis_a) + const` over all axes of the problem (zeros for
    axes it does not use; the constant does not change a footprint, so it is not kept).
    Quasi-affine (`//`, `%`): `coefs` flags the axes used (1) and `node` gives the span by
    interval arithmetic.
    """

    size: int
    coefs: tuple[int, ...]
    affine: bool
    node: Node | None = None


@dataclass(frozen=True)
class Operand:
    """One distinct read of an input tensor (same tensor, same index maps: one operand).

    `slot` is the tensor's position among the op's inputs: it tells two tensors apart
    within an op while keeping the name out of the problem's identity.
    """

    slot: int
    dims: tuple[DimMap, ...]
    itemsize: int
    axis_names: tuple[str, ...]
    tensor: str = field(default="", compare=False)

    @cached_property
    def axes_used(self) -> frozenset[int]:
        return frozenset(a for d in self.dims for a, c in enumerate(d.coefs) if c)

    @cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
        coefs = np.array([[abs(c) for c in d.coefs] for d in self.dims],
                         dtype=np.int64).reshape(len(self.dims), len(self.axis_names))
        sizes = np.array([d.size for d in self.dims], dtype=np.int64).reshape(-1, 1)
        quasi = tuple(i for i, d in enumerate(self.dims) if not d.affine)
        return coefs, sizes, quasi

    def spans(self, sizes: np.ndarray) -> np.ndarray:
        """Per-dimension extents (n_dims, n) of the box read by tiles of `sizes` (n_axes, n):
        `1 + sum |coef| * (size - 1)` for affine dimensions, interval arithmetic otherwise,
        never more than the dimension."""
        coefs, dims, quasi = self._tables
        out = extent(coefs, sizes)
        for i in quasi:
            out[i] = self._quasi_span(self.dims[i], sizes)
        return np.minimum(out, dims)

    def _quasi_span(self, d: DimMap, sizes: np.ndarray) -> np.ndarray:
        spans = np.empty(sizes.shape[1], dtype=np.int64)
        cache: dict[tuple[int, ...], int] = {}
        for k in range(sizes.shape[1]):
            key = tuple(int(x) for x in sizes[:, k])
            if key not in cache:
                lo, hi = interval(d.node, {n: (0, key[i] - 1) for i, n in
                                           enumerate(self.axis_names)})
                cache[key] = hi - lo + 1
            spans[k] = cache[key]
        return spans

    def box_volume(self, sizes: np.ndarray) -> np.ndarray:
        """Elements of the box a tile of `sizes` (n_axes, n) stages, halo included and not
        clamped to the tensor (boxes of boundary tiles overhang it and hold padding)."""
        coefs, _, _ = self._tables
        return extent(coefs, sizes).prod(axis=0)

    def footprint(self, sizes: np.ndarray) -> np.ndarray:
        """Elements of the input box read by tiles of `sizes` (n_axes, n)."""
        return self.spans(sizes).prod(axis=0)

    def contiguous_run(self, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(footprint, run): elements read and the length of each contiguous run of them.

        A run extends over an outer dimension only while every inner dimension is read whole
        (row-major layout), so a weight tile that spans whole `kh, kw` rows is one run.
        """
        spans = self.spans(sizes)
        total = spans.prod(axis=0)
        run = np.ones(sizes.shape[1], dtype=np.int64)
        whole = np.ones(sizes.shape[1], dtype=bool)
        for d in reversed(range(len(self.dims))):
            run = np.where(whole, run * spans[d], run)
            whole = whole & (spans[d] == self.dims[d].size)
        return total, run


@dataclass(frozen=True)
class Problem:
    """The iteration space of one expr op and the footprints of its reads.

    `axes`/`extents`: spatial axes (output order) then reduction axes (order of first use).
    `reduced[i]`: operand i depends on a reduction axis, so it is staged per reduction step.
    `flops_per_point`: arithmetic per iteration point (tilekit.expr.Analysis.flops_per_point).
    """

    axes: tuple[str, ...]
    extents: tuple[int, ...]
    n_spatial: int
    operands: tuple[Operand, ...]
    out_itemsize: int
    dtype: str
    flops_per_point: int
    assign: str
    #: The shared kernel-shape decision's facts (tilekit.schedule.shape): can some tile
    #: stage this op's reads, and how many lanes a default kernel gives each output point.
    stageable: bool = False
    lanes: int = 1
    #: The op as a GEMM (tilekit.schedule.mma.Contraction: axes roles and operands), or None.
    contraction: Contraction | None = None

    @property
    def spatial(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.axes[:self.n_spatial], self.extents[:self.n_spatial]))

    @property
    def reduction(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.axes[self.n_spatial:], self.extents[self.n_spatial:]))

    @property
    def has_reduction(self) -> bool:
        return len(self.axes) > self.n_spatial

    @cached_property
    def reduced(self) -> tuple[bool, ...]:
        red = set(range(self.n_spatial, len(self.axes)))
        return tuple(bool(op.axes_used & red) for op in self.operands)

    @property
    def output_points(self) -> int:
        n = 1
        for e in self.extents[:self.n_spatial]:
            n *= e
        return n

    @property
    def reduction_points(self) -> int:
        n = 1
        for e in self.extents[self.n_spatial:]:
            n *= e
        return n

    @cached_property
    def innermost(self) -> frozenset[int]:
        """Axes that index the innermost (contiguous) dimension of a tensor with unit stride:
        the output's last axis, and for each read the axis with coefficient +-1 in its last
        dimension. These are the axes whose tile sizes must fill memory transactions."""
        inner = set()
        if self.n_spatial:
            inner.add(self.n_spatial - 1)
        for op in self.operands:
            if not op.dims:
                continue
            last = op.dims[-1]
            if last.affine:
                inner.update(a for a, c in enumerate(last.coefs) if abs(c) == 1)
        return frozenset(inner)


def walks_reduction(problem: "Problem", op: Operand) -> bool:
    """Does `op`'s last (contiguous) dimension walk the innermost reduction axis with unit
    stride and nothing else (tilekit.schedule.shape.walks_contiguously, per operand)?"""
    if not problem.has_reduction or not op.dims or not op.dims[-1].affine:
        return False
    last = len(problem.axes) - 1
    return all(c == (1 if a == last else 0) for a, c in enumerate(op.dims[-1].coefs))


def problem_from_analysis(analysis: Analysis, dtypes: Mapping[str, str] | None = None
                          ) -> Problem:
    """The `Problem` of an analysed statement; `dtypes` maps tensor names to IR dtypes
    (float32 when missing)."""
    dtypes = dtypes or {}
    names = tuple(a for a, _ in analysis.axes)
    index = {a: i for i, a in enumerate(names)}
    slots = {t: i for i, t in enumerate(analysis.inputs)}
    operands: dict[Operand, None] = {}
    for info in analysis.accesses:
        dims = []
        for m, size in zip(info.maps, info.shape):
            if m.affine:
                coefs = [0] * len(names)
                for a, c in m.terms:
                    coefs[index[a]] = c
                dims.append(DimMap(size, tuple(coefs), True))
            else:
                used = set(m.axes)
                dims.append(DimMap(size, tuple(1 if a in used else 0 for a in names), False,
                                   m.node))
        itemsize = ITEMSIZE.get(dtypes.get(info.tensor, "float32"), 4)
        operand = Operand(slots[info.tensor], tuple(dims), itemsize, names, info.tensor)
        operands.setdefault(operand, None)
    out_dtype = analysis.out_dtype or dtypes.get(analysis.output, "float32")
    facts = analysis_facts(analysis, dtypes)
    return Problem(axes=names, extents=tuple(e for _, e in analysis.axes),
                   n_spatial=len(analysis.spatial), operands=tuple(operands),
                   out_itemsize=ITEMSIZE.get(out_dtype, 4), dtype=out_dtype,
                   flops_per_point=analysis.flops_per_point, assign=analysis.assign,
                   stageable=facts.stageable is None, lanes=facts.lanes,
                   contraction=facts.contraction if isinstance(facts.contraction, Contraction)
                   else None)


def tensor_bytes(module, names) -> int:
    """Bytes of the module's tensors `names` (each once)."""
    return sum(module.tensors[n].size * ITEMSIZE.get(module.tensors[n].dtype, 4) for n in names)

