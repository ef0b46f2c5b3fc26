"""What a statement means over its tensors: axes, extents, index maps, ranges and boxes.

This is the part of the expression language that Roller and Welder consume: the iteration
space (spatial then reduction axes), each input's index map, and for a tile box (a half-open
range per axis) the box of each input that it touches, halo included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from tilekit.errors import ExprError
from tilekit.expr.ast import (COMPARISONS, LOGICAL, REDUCE_OPS, Access, Axis, Binary, Call,
                              Node, Num, Statement, Unary, body_accesses, format_node, walk)
from tilekit.expr.box import Span, map_box
from tilekit.expr.intervals import affine_form, interval

Box = Mapping[str, tuple[int, int]]  # axis -> half-open [start, stop)


@dataclass(frozen=True)
class IndexMap:
    """One dimension's index as a function of the axes.

    `terms` and `const` hold the affine form `sum(coef * axis) + const` when `affine`;
    quasi-affine indices (with `//` or `%`) keep only `node` and are handled by intervals.
    """

    node: Node
    terms: tuple[tuple[str, int], ...]
    const: int
    affine: bool

    @property
    def axes(self) -> tuple[str, ...]:
        if self.affine:
            return tuple(a for a, _ in self.terms)
        return tuple(dict.fromkeys(n.name for n in walk(self.node) if isinstance(n, Axis)))

    @property
    def plain_axis(self) -> str | None:
        """The axis when the index is exactly one axis (`x[.., k, ..]`), else None."""
        return self.node.name if isinstance(self.node, Axis) else None

    def __str__(self) -> str:
        return format_node(self.node)


@dataclass(frozen=True)
class AccessInfo:
    """One occurrence of a tensor read in the body."""

    tensor: str
    shape: tuple[int, ...]
    maps: tuple[IndexMap, ...]
    node: Access

    @property
    def affine(self) -> bool:
        return all(m.affine for m in self.maps)


@dataclass(frozen=True)
class Analysis:
    stmt: Statement
    output: str
    out_shape: tuple[int, ...]
    spatial: tuple[tuple[str, int], ...]
    reduction: tuple[tuple[str, int], ...]
    accesses: tuple[AccessInfo, ...]
    pad: str | None = None
    out_dtype: str | None = None

    @property
    def assign(self) -> str:
        return self.stmt.assign

    @property
    def inputs(self) -> tuple[str, ...]:
        """Tensors read, each once, in order of first use."""
        return tuple(dict.fromkeys(a.tensor for a in self.accesses))

    @property
    def axes(self) -> tuple[tuple[str, int], ...]:
        return self.spatial + self.reduction

    @property
    def extents(self) -> dict[str, int]:
        return dict(self.axes)

    def full_box(self) -> dict[str, tuple[int, int]]:
        return {a: (0, e) for a, e in self.axes}

    @property
    def flops_per_point(self) -> int:
        """Arithmetic operations per iteration point (body ops, plus the reduction combine)."""
        ops = sum(1 for n in walk(self.stmt.body)
                  if isinstance(n, (Binary, Call, Unary)) and not _inside_index(n, self.stmt))
        return ops + (1 if self.stmt.assign in REDUCE_OPS else 0)


def _inside_index(node: Node, stmt: Statement) -> bool:
    for acc in body_accesses(stmt.body):
        for idx in acc.indices:
            if any(n is node for n in walk(idx)):
                return True
    return False


# -- index maps --------------------------------------------------------------------------

def _check_index_node(node: Node, where: str) -> None:
    for n in walk(node):
        if isinstance(n, Num) and not isinstance(n.value, int):
            raise ExprError(f"index {format_node(node)!r} uses a non-integer constant", where)
        if isinstance(n, Binary):
            if n.op == "*" and affine_form(n.lhs) is not None and affine_form(n.rhs) is not None:
                if affine_form(n.lhs)[0] and affine_form(n.rhs)[0]:
                    raise ExprError(f"index {format_node(node)!r} multiplies two axes", where,
                                    "indices must be affine: axis * constant")
            if n.op in ("//", "%"):
                if not (isinstance(n.rhs, Num) and isinstance(n.rhs.value, int)
                        and n.rhs.value > 0):
                    raise ExprError(f"index {format_node(node)!r}: {n.op} needs a positive "
                                    "integer constant on the right", where)


def index_map(node: Node, where: str = "") -> IndexMap:
    _check_index_node(node, where)
    aff = affine_form(node)
    if aff is None:
        return IndexMap(node, (), 0, False)
    return IndexMap(node, tuple(sorted(aff[0].items())), aff[1], True)


def input_box(analysis: Analysis, access: int | AccessInfo, box: Box | None = None,
              clamp: bool = False) -> list[tuple[int, int]]:
    """Half-open box of an input touched by the iteration `box` (default: everything).

    `access` is an index into `analysis.accesses` or the AccessInfo itself. Axes missing from
    `box` range over their full extent. With `clamp`, the box is cut to the tensor's bounds
    (what is actually loaded when out-of-range reads are padding).
    """
    info = analysis.accesses[access] if isinstance(access, int) else access
    spans = {a: Span.of(0, e) for a, e in analysis.axes}
    if box:
        for a, (start, stop) in box.items():
            if a in spans:
                spans[a] = Span.of(start, stop)
    return [s.range for s in map_box(info.maps, spans, info.shape, clamp_to_tensor=clamp)]


# -- analysis ----------------------------------------------------------------------------

def _spatial_axes(out: Access, shapes: Mapping[str, tuple[int, ...]]
                  ) -> tuple[tuple[int, ...], list[tuple[str, int]]]:
    """The output's shape and its axes with their extents (plain, distinct axis names)."""
    if out.tensor not in shapes:
        raise ExprError(f"output tensor {out.tensor!r} is not declared", "output",
                        "declare it under tensors:")
    out_shape = tuple(shapes[out.tensor])
    if len(out.indices) != len(out_shape):
        raise ExprError(f"output {out.tensor} has rank {len(out_shape)} but is indexed with "
                        f"{len(out.indices)} indices", "output")
    spatial: list[tuple[str, int]] = []
    for pos, idx in enumerate(out.indices):
        if not isinstance(idx, Axis):
            raise ExprError(f"output index {pos} of {out.tensor} is {format_node(idx)!r}; "
                            "output indices must be plain axis names", "output")
        if idx.name in dict(spatial):
            raise ExprError(f"axis {idx.name!r} appears twice in the output", "output",
                            "use one axis per output dimension (diagonals are not expressible)")
        spatial.append((idx.name, out_shape[pos]))
    return out_shape, spatial


def analyze(stmt: Statement, shapes: Mapping[str, tuple[int, ...]],
            axes: Mapping[str, int] | None = None, pad: str | None = None,
            dtypes: Mapping[str, str] | None = None) -> Analysis:
    """Derive axes, extents and index maps of `stmt` over tensors of the given shapes.

    Raises ExprError for unknown tensors, rank mismatches, unknown or conflicting axis
    extents, out-of-range reads without `pad`, and `=` statements with reduction axes.
    """
    explicit = dict(axes or {})
    out = stmt.output
    out_shape, spatial = _spatial_axes(out, shapes)
    spatial_names = dict(spatial)

    reads = body_accesses(stmt.body)
    for acc in reads:
        for idx in acc.indices:
            _check_index_node(idx, acc.tensor)
    # Reduction extents: explicit first, then plain-axis uses, in order of first use.
    reduction: dict[str, int] = {}
    extent_source: dict[str, str] = {}
    for name, extent in spatial:
        extent_source[name] = f"{out.tensor} dimension"
    for acc in reads:
        if acc.tensor not in shapes:
            raise ExprError(f"tensor {acc.tensor!r} is not declared", acc.tensor,
                            "declare it under tensors: or fix the name")
        shape = tuple(shapes[acc.tensor])
        if len(acc.indices) != len(shape):
            raise ExprError(f"{acc.tensor} has rank {len(shape)} but is indexed with "
                            f"{len(acc.indices)} indices", acc.tensor)
        for pos, idx in enumerate(acc.indices):
            for n in walk(idx):
                if isinstance(n, Axis) and n.name not in spatial_names:
                    if n.name in explicit:
                        reduction.setdefault(n.name, int(explicit[n.name]))
                        extent_source.setdefault(n.name, "op axes")
                    elif isinstance(idx, Axis):
                        if n.name in reduction and reduction[n.name] != shape[pos]:
                            raise ExprError(
                                f"axis {n.name!r} has extent {reduction[n.name]} from "
                                f"{extent_source[n.name]} but {shape[pos]} from "
                                f"{acc.tensor} dimension {pos}", acc.tensor,
                                "the shapes of the operands disagree")
                        reduction.setdefault(n.name, shape[pos])
                        extent_source.setdefault(n.name, f"{acc.tensor} dimension {pos}")
    # Axes used as values or only inside compound indices must now have an extent.
    for n in walk(stmt.body):
        if isinstance(n, Axis) and n.name not in spatial_names:
            if n.name in explicit:
                reduction.setdefault(n.name, int(explicit[n.name]))
            elif n.name not in reduction:
                raise ExprError(f"axis {n.name!r} has no extent", n.name,
                                f"index a tensor dimension with it alone, or give it in the "
                                f"op's axes: {{{n.name}: N}}")
    # Keep reduction axes in order of first use in the body.
    order = [n.name for n in walk(stmt.body) if isinstance(n, Axis) and n.name in reduction]
    reduction_axes = tuple((a, reduction[a]) for a in dict.fromkeys(order))
    for a, e in reduction_axes:
        if e <= 0 and not (e == 0):
            raise ExprError(f"axis {a!r} has extent {e}", a)
    unused = set(explicit) - set(reduction) - set(spatial_names)
    if unused:
        raise ExprError(f"op axes name {sorted(unused)} which the expression does not use",
                        "axes", "remove them")
    if reduction_axes and stmt.assign not in REDUCE_OPS:
        names = ", ".join(a for a, _ in reduction_axes)
        raise ExprError(f"axes {names} are not in the output, so the statement reduces over "
                        f"them, but it assigns with '='", "assign",
                        "use += (sum), max=, min= or *=, or index the output with them")

    all_extents = dict(spatial) | dict(reduction_axes)
    infos = [_access_info(acc, shapes, all_extents, pad) for acc in reads]
    _check_body(stmt.body, set(all_extents))
    out_dtype = dtypes.get(out.tensor) if dtypes else None
    return Analysis(stmt, out.tensor, out_shape, tuple(spatial), reduction_axes, tuple(infos),
                    pad, out_dtype)


def _access_info(acc: Access, shapes: Mapping[str, tuple[int, ...]],
                 extents: Mapping[str, int], pad: str | None) -> AccessInfo:
    """One read's index maps; without `pad`, a proof that no index leaves its dimension."""
    shape = tuple(shapes[acc.tensor])
    maps = tuple(index_map(idx, acc.tensor) for idx in acc.indices)
    if pad is None and not any(e == 0 for e in extents.values()):
        ranges = {a: (0, e - 1) for a, e in extents.items()}
        for pos, (m, dim) in enumerate(zip(maps, shape)):
            lo, hi = interval(m.node, ranges)
            if lo < 0 or hi >= dim:
                raise ExprError(
                    f"{format_node(acc)} reads index {lo}..{hi} of dimension {pos}, "
                    f"which has size {dim}", acc.tensor,
                    "fix the index map or extents, or declare the op's pad value "
                    "(pad: '0') if out-of-range reads are padding")
    return AccessInfo(acc.tensor, shape, maps, acc)


def _check_body(node: Node, axes: set[str]) -> None:
    if isinstance(node, Access):
        return
    if isinstance(node, Axis) and node.name not in axes:
        raise ExprError(f"axis {node.name!r} has no extent", node.name)
    if isinstance(node, Binary) and node.op not in COMPARISONS | LOGICAL | {
            "+", "-", "*", "/", "//", "%"}:
        raise ExprError(f"unknown operator {node.op!r}")
    if isinstance(node, Call):
        for a in node.args:
            _check_body(a, axes)
        return
    if isinstance(node, (Unary, Binary)):
        for c in ((node.arg,) if isinstance(node, Unary) else (node.lhs, node.rhs)):
            _check_body(c, axes)
