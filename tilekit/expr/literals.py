"""Integer literals against the integer types they meet: `x[i] + 300` with an int8 `x`.

NumPy (the reference executor) refuses such a literal at run time, and C would wrap it
silently; either way the statement means nothing useful, so the verifier refuses it: every
integer literal that meets an integer-typed operand (in `+ - * // %`, comparisons, `max`,
`min`, `pow`, `fmod` or a `select` branch) must lie in that type's range. Types follow
NumPy's promotion closely enough for this purpose (casts, `/` and float functions give
floats; comparisons give bools).
"""

from __future__ import annotations

from typing import Mapping, Union

import numpy as np

from tilekit.expr.ast import (CAST_FUNCS, Access, Axis, Binary, Call, Node, Num, Statement,
                              Unary, format_node)

_INTS = ("int8", "int16", "int32", "int64", "uint8")
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_SAME_TYPE_FUNCS = frozenset(("abs", "neg", "sign", "floor", "ceil", "round"))
_BOOL_FUNCS = frozenset(("isnan", "isinf", "not"))
_COMBINING = frozenset(("max", "min", "pow", "fmod"))

#: The type of a sub-expression: a dtype name, or ("int", value) for an integer literal.
Type = Union[str, tuple]


class LiteralError(Exception):
    """(message, node) of the first literal out of its operand's range."""


def _promote(a: str, b: str) -> str:
    if a in _FLOATS or b in _FLOATS:
        return max((t for t in (a, b) if t in _FLOATS), key=_FLOATS.index)
    if a == "bool":
        return b
    if b == "bool":
        return a
    return str(np.promote_types(a, b))


def _meet(a: Type, b: Type, node: Node) -> Type:
    """The type of `a op b`, checking a literal against an integer operand."""
    for lit, other in ((a, b), (b, a)):
        if isinstance(lit, tuple) and isinstance(other, str) and other in _INTS:
            info = np.iinfo(other)
            if not info.min <= lit[1] <= info.max:
                raise LiteralError(f"integer literal {lit[1]} is out of range for {other} "
                                   f"[{info.min}, {info.max}] in {format_node(node)[:80]}")
    if isinstance(a, tuple) and isinstance(b, tuple):
        return ("int", 0)  # literal with literal: Python arithmetic, checked where it lands
    if isinstance(a, tuple):
        return b
    if isinstance(b, tuple):
        return a
    return _promote(a, b)


def _type(node: Node, dtypes: Mapping[str, str]) -> Type:
    if isinstance(node, Num):
        return ("int", node.value) if isinstance(node.value, int) else "float64"
    if isinstance(node, Axis):
        return "int64"
    if isinstance(node, Access):
        return dtypes.get(node.tensor, "float32")
    if isinstance(node, Unary):
        inner = _type(node.arg, dtypes)
        return "bool" if node.op == "!" else inner
    if isinstance(node, Binary):
        lhs, rhs = _type(node.lhs, dtypes), _type(node.rhs, dtypes)
        if node.op in ("&&", "||"):
            return "bool"
        result = _meet(lhs, rhs, node)
        if node.op in ("<", "<=", ">", ">=", "==", "!="):
            return "bool"
        if node.op == "/":
            return result if isinstance(result, str) and result in _FLOATS else "float64"
        return result
    if isinstance(node, Call):
        args = [_type(a, dtypes) for a in node.args]
        if node.fn in CAST_FUNCS:
            return node.fn
        if node.fn == "select":
            return _meet(args[1], args[2], node)
        if node.fn in _COMBINING:
            return _meet(args[0], args[1], node)
        if node.fn in _BOOL_FUNCS:
            return "bool"
        if node.fn in _SAME_TYPE_FUNCS:
            return args[0]
        return "float64" if not isinstance(args[0], str) or args[0] not in _FLOATS else args[0]
    return "float64"


def literal_problem(stmt: Statement, dtypes: Mapping[str, str]) -> str | None:
    """Why an integer literal of `stmt` cannot meet its operand, or None."""
    try:
        value = _type(stmt.body, dtypes)
        out = dtypes.get(stmt.output.tensor)
        if out is not None:  # `y[i] = 300` or `y[i] += 300` into an int8 `y`
            _meet(value, out, stmt.body)
    except LiteralError as exc:
        return str(exc)
    return None


def check_expr_limits(stmt: Statement, analysis, dtypes: Mapping[str, str]) -> None:
    """What the verifier checks of an analysed statement beyond the analysis itself:
    integer literals against their operands, and within `limits.TENSOR_ELEMENTS` the
    reduction domain (the product of the reduction extents, the work per output point) and
    the region each read covers, padding included (what an executor pads a tensor to: a
    window reaching 10^12 elements past a 4-element tensor is refused here, not allocated)."""
    from tilekit import limits
    from tilekit.errors import ExprError
    from tilekit.expr.analysis import interval

    problem = literal_problem(stmt, dtypes)
    if problem is not None:
        raise ExprError(problem, None, "write a literal the type can hold, or cast the "
                        "operand first, e.g. int32(x[i]) + 300")
    try:
        domain = 1
        for _, extent in analysis.reduction:
            domain *= extent
        limits.TENSOR_ELEMENTS.check(domain, None, "the reduction domain")
        ranges = {a: (0, e - 1) for a, e in (*analysis.spatial, *analysis.reduction)}
        for info in analysis.accesses:
            for m in info.maps:  # an index's coefficients too: they become byte strides
                for value in (m.const, *(c for _, c in m.terms)):
                    limits.TENSOR_ELEMENTS.check(abs(value), None, f"a coefficient of a "
                                                 f"{info.tensor} index")
            region = 1
            for m, dim in zip(info.maps, info.shape):
                try:
                    lo, hi = interval(m.node, ranges)
                except KeyError:
                    continue
                region *= max(hi, dim - 1) - min(lo, 0) + 1
            limits.TENSOR_ELEMENTS.check(region, None, f"the region of {info.tensor} read "
                                         "(padding included)")
    except limits.LimitError as exc:
        raise ExprError(exc.what, None, exc.hint) from None
