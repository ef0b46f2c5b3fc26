"""The tensor-expression syntax tree: small immutable nodes, printed back canonically.

Index expressions (inside `[]`) and body expressions share the node types; an `Axis` inside an
index is an iteration variable, an `Axis` in the body is that variable's integer value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from tilekit.expr.ops import FUNCTIONS, REDUCTIONS, functions_of

REDUCE_OPS = tuple(REDUCTIONS)
ASSIGN_OPS = ("=",) + REDUCE_OPS

#: Binary operators by precedence level (low to high).
BINARY_LEVELS = (("||",), ("&&",), ("<", "<=", ">", ">=", "==", "!="), ("+", "-"),
                 ("*", "/", "//", "%"))
COMPARISONS = frozenset(("<", "<=", ">", ">=", "==", "!="))
LOGICAL = frozenset(("&&", "||"))

#: Function names by arity and family, from the one table of semantics (tilekit.expr.ops).
CAST_FUNCS = functions_of("cast")
UNARY_FUNCS = frozenset(f.name for f in FUNCTIONS.values() if f.arity == 1) - CAST_FUNCS
BINARY_FUNCS = frozenset(f.name for f in FUNCTIONS.values() if f.arity == 2)
TERNARY_FUNCS = frozenset(f.name for f in FUNCTIONS.values() if f.arity == 3)
FUNC_ARITY = {f.name: f.arity for f in FUNCTIONS.values()}


@dataclass(frozen=True)
class Num:
    """A numeric literal: int, float, or +-inf / nan."""

    value: Union[int, float]


@dataclass(frozen=True)
class Axis:
    name: str


@dataclass(frozen=True)
class Access:
    """`tensor[i0, i1, ...]`; rank 0 is `tensor[]`."""

    tensor: str
    indices: tuple["Node", ...]


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "!"
    arg: "Node"


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: "Node"
    rhs: "Node"


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Node", ...]


Node = Union[Num, Axis, Access, Unary, Binary, Call]


@dataclass(frozen=True)
class Statement:
    output: Access
    assign: str
    body: Node

    def __str__(self) -> str:
        return format_statement(self)


# -- traversal ---------------------------------------------------------------------------

def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Access):
        return node.indices
    if isinstance(node, Unary):
        return (node.arg,)
    if isinstance(node, Binary):
        return (node.lhs, node.rhs)
    if isinstance(node, Call):
        return node.args
    return ()


def walk(node: Node):
    """Pre-order traversal."""
    yield node
    for child in children(node):
        yield from walk(child)


def body_accesses(node: Node) -> list[Access]:
    """Tensor accesses in the body in order of appearance (not those inside indices)."""
    found: list[Access] = []

    def visit(n: Node) -> None:
        if isinstance(n, Access):
            found.append(n)
            return
        for c in children(n):
            visit(c)

    visit(node)
    return found


# -- printing ----------------------------------------------------------------------------

_PREC = {op: level for level, ops in enumerate(BINARY_LEVELS) for op in ops}
_UNARY_PREC = len(BINARY_LEVELS)


def format_number(value: Union[int, float]) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    text = repr(float(value))
    return text


def format_node(node: Node, parent_prec: int = -1, right: bool = False) -> str:
    if isinstance(node, Num):
        text = format_number(node.value)
        if text.startswith("-") and parent_prec >= 0:
            return f"({text})"
        return text
    if isinstance(node, Axis):
        return node.name
    if isinstance(node, Access):
        return f"{node.tensor}[{', '.join(format_node(i) for i in node.indices)}]"
    if isinstance(node, Call):
        return f"{node.fn}({', '.join(format_node(a) for a in node.args)})"
    if isinstance(node, Unary):
        text = f"{node.op}{format_node(node.arg, _UNARY_PREC)}"
        return f"({text})" if parent_prec > _UNARY_PREC else text
    if isinstance(node, Binary):
        prec = _PREC[node.op]
        # Left-associative: a right operand of equal precedence needs parentheses.
        text = (f"{format_node(node.lhs, prec)} {node.op} "
                f"{format_node(node.rhs, prec, right=True)}")
        needs = parent_prec > prec or (right and parent_prec == prec)
        return f"({text})" if needs else text
    raise TypeError(f"not an expression node: {node!r}")


def format_statement(stmt: Statement) -> str:
    return f"{format_node(stmt.output)} {stmt.assign} {format_node(stmt.body)}"


def substitute(node: Node, axes) -> Node:
    """`node` with axis names replaced by index expressions (in indices and values); every
    Access is a fresh object, so a copy is `substitute(node, {})`."""
    if isinstance(node, Axis):
        return axes.get(node.name, node)
    if isinstance(node, Access):
        return Access(node.tensor, tuple(substitute(i, axes) for i in node.indices))
    if isinstance(node, Unary):
        return Unary(node.op, substitute(node.arg, axes))
    if isinstance(node, Binary):
        return Binary(node.op, substitute(node.lhs, axes), substitute(node.rhs, axes))
    if isinstance(node, Call):
        return Call(node.fn, tuple(substitute(a, axes) for a in node.args))
    return node
