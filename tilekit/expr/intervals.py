"""Affine normal forms and interval arithmetic of index expressions.

`affine_form(node)` is an index as `({axis: coefficient}, constant)` when it is affine in the
axes; `interval(node, ranges)` bounds any index expression (affine, or quasi-affine with `//`
and `%` by positive constants) when each axis ranges over an inclusive interval. The analysis
(`tilekit.expr.analysis`), the box algebra (`tilekit.expr.box`) and the code generator's index
compiler all stand on these two.
"""

from __future__ import annotations

from typing import Mapping

from tilekit.errors import ExprError
from tilekit.expr.ast import Axis, Binary, Node, Num, Unary, format_node


def affine_form(node: Node) -> tuple[dict[str, int], int] | None:
    """`node` as (coefficients, constant) if it is affine in the axes, else None."""
    if isinstance(node, Num):
        return ({}, int(node.value)) if isinstance(node.value, int) else None
    if isinstance(node, Axis):
        return ({node.name: 1}, 0)
    if isinstance(node, Unary) and node.op == "-":
        inner = affine_form(node.arg)
        return None if inner is None else ({a: -c for a, c in inner[0].items()}, -inner[1])
    if isinstance(node, Binary) and node.op in ("+", "-"):
        lhs, rhs = affine_form(node.lhs), affine_form(node.rhs)
        if lhs is None or rhs is None:
            return None
        sign = 1 if node.op == "+" else -1
        terms = dict(lhs[0])
        for a, c in rhs[0].items():
            terms[a] = terms.get(a, 0) + sign * c
        return ({a: c for a, c in terms.items() if c != 0}, lhs[1] + sign * rhs[1])
    if isinstance(node, Binary) and node.op == "*":
        lhs, rhs = affine_form(node.lhs), affine_form(node.rhs)
        if lhs is None or rhs is None:
            return None
        if lhs[0] and rhs[0]:
            return None  # product of two axes: not affine
        (terms, k), scale = (lhs, rhs[1]) if not rhs[0] else (rhs, lhs[1])
        return ({a: c * scale for a, c in terms.items() if c * scale != 0}, k * scale)
    return None


# -- interval arithmetic (ranges and boxes) ----------------------------------------------

def interval(node: Node, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """Inclusive [lo, hi] of an index expression when each axis ranges over `ranges`
    (inclusive bounds). Exact for affine indices where each axis appears once."""
    if isinstance(node, Num):
        v = int(node.value)
        return v, v
    if isinstance(node, Axis):
        return ranges[node.name]
    if isinstance(node, Unary):
        lo, hi = interval(node.arg, ranges)
        return -hi, -lo
    if isinstance(node, Binary):
        aff = affine_form(node)
        if aff is not None:  # exact even when an axis appears in several terms
            lo = hi = aff[1]
            for a, c in aff[0].items():
                alo, ahi = ranges[a]
                lo += min(c * alo, c * ahi)
                hi += max(c * alo, c * ahi)
            return lo, hi
        llo, lhi = interval(node.lhs, ranges)
        rlo, rhi = interval(node.rhs, ranges)
        if node.op == "+":
            return llo + rlo, lhi + rhi
        if node.op == "-":
            return llo - rhi, lhi - rlo
        if node.op == "*":
            prods = (llo * rlo, llo * rhi, lhi * rlo, lhi * rhi)
            return min(prods), max(prods)
        if node.op == "//":
            return llo // rlo, lhi // rlo
        if node.op == "%":
            if llo // rlo == lhi // rlo:
                return llo % rlo, lhi % rlo
            return 0, rlo - 1
    raise ExprError(f"not an index expression: {format_node(node)}")
