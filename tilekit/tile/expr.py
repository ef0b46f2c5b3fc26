"""Scalar expressions of tile programs: small frozen nodes with C semantics and a dtype.

A tile program's arithmetic is a tree of these nodes. They mean what the same C expression
means (integer `/` and `%` truncate; `floordiv`/`floormod` are calls with the expression
language's floor semantics), every node knows its dtype, and nothing is text: the printers
(`tilekit.tile.cuda`, `tilekit.tile.cpp`) spell them per target, the interpreter
(`tilekit.tile.interp`) evaluates them on NumPy arrays.

Dtypes are the IR's element types plus `uint32` (progress counters) and `ptr` (the address of
an element, only as an argument of an intrinsic). Compute happens in four of them, as in the
expression language: `bool`, `int64`, `float32`, `float64`; storage-only types (`float16`,
`bfloat16`, narrow integers) appear as loads, stores and explicit casts.

Constructors simplify as they build (`x + 0` is `x`, `2 * 3` is `6`, `x * 1` is `x`), so a
builder can write index arithmetic plainly and the printed code stays readable. Arithmetic
operators are overloaded for `+`, `-`, `*` only; comparisons are functions (`lt`, `eq`, ...),
because `==` on frozen nodes is structural equality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Union

INT_DTYPES = ("int8", "uint8", "int16", "int32", "uint32", "int64")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: `float4`: four float32 values moved by one 16-byte access (a vector load or store).
DTYPES = ("bool",) + INT_DTYPES + FLOAT_DTYPES + ("float4", "ptr")
HALF = ("float16", "bfloat16")

#: Bytes of an element of each dtype.
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "uint32": 4,
            "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float4": 16,
            "ptr": 8}

#: The compute dtype of each expression-language kind (tilekit.codegen.values).
KIND_DTYPE = {"b": "bool", "i": "int64", "f": "float32", "d": "float64"}

_RANK = {"bool": 0, "int8": 1, "uint8": 1, "int16": 2, "int32": 3, "uint32": 3.5, "int64": 4,
         "float16": 5, "bfloat16": 5, "float32": 6, "float64": 7}

ARITH = ("+", "-", "*", "/", "%")
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
LOGIC = ("&&", "||")
BITS = ("&", "|", "^", "<<", ">>")
BINARY_OPS = ARITH + COMPARE + LOGIC + BITS
UNARY_OPS = ("-", "!", "~")


class Expr:
    """Base of every expression node; `dtype` is the C type of its value."""

    __slots__ = ()
    dtype: str

    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __neg__(self): return neg(self)


Operand = Union[Expr, int, float, bool]


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int | float | bool
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES or self.dtype == "ptr":
            raise ValueError(f"constant of unknown dtype {self.dtype!r}")


@dataclass(frozen=True, eq=True)
class Var(Expr):
    """A named value: a loop variable, a `Let`, a mutable `Decl`, a thread index, or one of
    the body's launch values (`BLOCK`, `NBLOCKS`)."""

    name: str
    dtype: str


@dataclass(frozen=True, eq=True)
class Binary(Expr):
    op: str
    lhs: Expr
    rhs: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Unary(Expr):
    op: str
    arg: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """A pure function of its arguments, by its name in `tilekit.tile.functions`."""

    fn: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    """`arg` converted to `dtype` (C's conversion; half types round to nearest even)."""

    arg: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Select(Expr):
    cond: Expr
    then: Expr
    other: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Load(Expr):
    """Element `index` (one expression per dimension) of buffer `buffer`. A buffer of
    vector width `lanes` > 1 loads `lanes` consecutive elements at once (a float4 load)."""

    buffer: str
    index: tuple[Expr, ...]
    dtype: str
    lanes: int = 1


@dataclass(frozen=True, eq=True)
class Addr(Expr):
    """The address of element `index` of `buffer`: an intrinsic's pointer argument."""

    buffer: str
    index: tuple[Expr, ...]
    dtype: str = "ptr"


#: The body's view of its launch (every body is a function of these: tilekit.tile.nodes).
BLOCK = Var("tk_block", "int32")
NBLOCKS = Var("tk_nblocks", "int32")


# -- construction -------------------------------------------------------------------------

def const(value: int | float | bool, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else ("int32" if isinstance(value, int)
                                                         else "float32")
    return Const(value, dtype)


def as_expr(x: Operand, like: str | None = None) -> Expr:
    """`x` as a node; a Python number takes dtype `like` when given (a literal beside an
    operand takes the operand's type, as C's usual conversions would make it)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, int):
        if like in INT_DTYPES or like in FLOAT_DTYPES:
            return Const(x if like in INT_DTYPES else float(x), like)
        return Const(x, "int32" if -2 ** 31 <= x < 2 ** 31 else "int64")
    if isinstance(x, float):
        return Const(x, like if like in FLOAT_DTYPES else "float32")
    raise TypeError(f"not an expression: {x!r}")


def promote(a: str, b: str) -> str:
    """C's usual arithmetic conversions over the dtypes used here (half types compute as
    float32 and never meet arithmetic directly)."""
    if a == b:
        return a if a not in HALF and a not in ("bool", "int8", "uint8", "int16") else (
            "float32" if a in HALF else "int32")
    top = max(a, b, key=lambda d: _RANK[d])
    if top in HALF:
        return "float32"
    if top in ("bool", "int8", "uint8", "int16"):
        return "int32"
    return top


def _pair(a: Operand, b: Operand) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) and not isinstance(b, Expr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, Expr) and not isinstance(a, Expr):
        return as_expr(a, b.dtype), b
    return as_expr(a), as_expr(b)


def is_const(x: Expr, value=None) -> bool:
    return isinstance(x, Const) and (value is None or x.value == value)


def _fold(op: str, a: Const, b: Const, dtype: str):
    x, y = a.value, b.value
    if dtype in INT_DTYPES or dtype == "bool":
        x, y = int(x), int(y)
        if op == "/":
            if y == 0:
                return None
            q = abs(x) // abs(y)
            return q if (x >= 0) == (y >= 0) else -q
        if op == "%":
            if y == 0:
                return None
            return x - y * _fold("/", a, b, dtype)
    elif op == "%":
        return None
    if op == "/":
        return x / y if y else None
    return {"+": x + y, "-": x - y, "*": x * y}[op]


def binary(op: str, a: Operand, b: Operand, dtype: str | None = None) -> Expr:
    """`a op b` with C semantics, simplified where the result is certain."""
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary operator {op!r}")
    a, b = _pair(a, b)
    if dtype is None:
        if op in COMPARE or op in LOGIC:
            dtype = "bool"
        else:
            dtype = promote(a.dtype, b.dtype)
    if op in ("+", "-", "*", "/", "%") and isinstance(a, Const) and isinstance(b, Const):
        value = _fold(op, a, b, dtype)
        if value is not None and (dtype not in INT_DTYPES or -2 ** 63 <= value < 2 ** 63):
            return Const(int(value) if dtype in INT_DTYPES else float(value), dtype)
    if dtype in INT_DTYPES:
        if op == "+":
            if is_const(b, 0) and a.dtype == dtype:
                return a
            if is_const(a, 0) and b.dtype == dtype:
                return b
            if isinstance(b, Const) and b.value < 0:
                return binary("-", a, Const(-b.value, b.dtype), dtype)
        if op == "-":
            if is_const(b, 0) and a.dtype == dtype:
                return a
            if isinstance(b, Const) and b.value < 0:
                return binary("+", a, Const(-b.value, b.dtype), dtype)
        if op == "*":
            if (is_const(a, 0) or is_const(b, 0)):
                return Const(0, dtype)
            if is_const(b, 1) and a.dtype == dtype:
                return a
            if is_const(a, 1) and b.dtype == dtype:
                return b
        if op == "/" and is_const(b, 1) and a.dtype == dtype:
            return a
        if op == "%" and is_const(b, 1):
            return Const(0, dtype)
    if op == "&&":
        if is_const(a, True):
            return b
        if is_const(b, True):
            return a
    if op == "||":
        if is_const(a, False):
            return b
        if is_const(b, False):
            return a
    return Binary(op, a, b, dtype)


def add(a: Operand, b: Operand) -> Expr: return binary("+", a, b)
def sub(a: Operand, b: Operand) -> Expr: return binary("-", a, b)
def mul(a: Operand, b: Operand) -> Expr: return binary("*", a, b)
def div(a: Operand, b: Operand) -> Expr:
    """C division: truncates for integers (equal to floor division for non-negative ones)."""
    return binary("/", a, b)
def mod(a: Operand, b: Operand) -> Expr:
    """C remainder (the dividend's sign; equal to Python's % for non-negative ones)."""
    return binary("%", a, b)
def lt(a: Operand, b: Operand) -> Expr: return binary("<", a, b)
def le(a: Operand, b: Operand) -> Expr: return binary("<=", a, b)
def gt(a: Operand, b: Operand) -> Expr: return binary(">", a, b)
def ge(a: Operand, b: Operand) -> Expr: return binary(">=", a, b)
def eq(a: Operand, b: Operand) -> Expr: return binary("==", a, b)
def ne(a: Operand, b: Operand) -> Expr: return binary("!=", a, b)


def and_(*terms: Operand) -> Expr:
    out: Expr = Const(True, "bool")
    for t in terms:
        out = binary("&&", out, t)
    return out


def or_(*terms: Operand) -> Expr:
    out: Expr = Const(False, "bool")
    for t in terms:
        out = binary("||", out, t)
    return out


def neg(a: Operand) -> Expr:
    a = as_expr(a)
    if isinstance(a, Const) and a.dtype != "bool":
        return Const(-a.value, a.dtype)
    return Unary("-", a, promote(a.dtype, a.dtype))


def not_(a: Operand) -> Expr:
    a = as_expr(a)
    if isinstance(a, Const):
        return Const(not a.value, "bool")
    return Unary("!", a, "bool")


def cast(dtype: str, a: Operand) -> Expr:
    a = as_expr(a, dtype)
    if a.dtype == dtype:
        return a
    if (isinstance(a, Cast) and a.dtype in INT_DTYPES and a.arg.dtype in INT_DTYPES
            and ITEMSIZE[a.dtype] >= ITEMSIZE[a.arg.dtype]
            and not (a.arg.dtype == "uint32" and a.dtype != "int64")):
        return cast(dtype, a.arg)       # a widened integer: converting the original is equal
    if isinstance(a, Const) and dtype in INT_DTYPES and a.dtype in INT_DTYPES:
        return Const(a.value, dtype)
    return Cast(a, dtype)


def select(cond: Operand, then: Operand, other: Operand) -> Expr:
    cond = as_expr(cond)
    then, other = _pair(then, other)
    if is_const(cond, True):
        return then
    if is_const(cond, False):
        return other
    dtype = then.dtype if then.dtype == other.dtype else promote(then.dtype, other.dtype)
    return Select(cond, then, other, dtype)


def call(fn: str, *args: Operand, dtype: str | None = None) -> Call:
    """A call of function `fn` (tilekit.tile.functions knows its result type)."""
    from tilekit.tile.functions import function

    f = function(fn)
    nodes = tuple(as_expr(a) for a in args)
    if len(nodes) != f.arity:
        raise ValueError(f"{fn} takes {f.arity} argument(s), got {len(nodes)}")
    if dtype is None:
        if f.result is not None:
            dtype = f.result
        elif f.family == "predicate":
            dtype = "bool"
        elif f.family == "math":
            dtype = "float64" if any(a.dtype == "float64" for a in nodes) else "float32"
        elif f.family == "same" and f.arity == 2:
            dtype = promote(nodes[0].dtype, nodes[1].dtype)
        else:
            dtype = nodes[0].dtype
    if f.family == "same":
        # the helpers are overloaded per type: every argument in the result's type
        nodes = tuple(cast(dtype, a) for a in nodes)
    return Call(fn, nodes, dtype)


def linear(terms: Iterable[tuple[int, Expr]], constant: int = 0, dtype: str = "int32") -> Expr:
    """`c0 * v0 + c1 * v1 + ... + constant`, unit and zero coefficients simplified."""
    out: Expr = Const(0, dtype)
    for coef, var in terms:
        if coef == 0:
            continue
        if coef < 0:
            out = binary("-", out, mul(-coef, var)) if not is_const(out, 0) else neg(
                mul(-coef, var))
        else:
            out = binary("+", out, mul(coef, var))
    return binary("+", out, constant)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def free_vars(e: Expr) -> set[str]:
    """Names of the variables `e` reads."""
    out: set[str] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Var):
            out.add(x.name)
        else:
            stack.extend(children(x))
    return out


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, (Unary,)):
        return (e.arg,)
    if isinstance(e, Cast):
        return (e.arg,)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Select):
        return (e.cond, e.then, e.other)
    if isinstance(e, (Load, Addr)):
        return e.index
    return ()


def loads(e: Expr) -> list[Load]:
    """Every load in `e`, outermost first."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Load):
            out.append(x)
        stack.extend(reversed(children(x)))
    return out


def literal_value(x: Const) -> int | float | bool:
    """A constant's value as its dtype holds it (NaN and infinities for floats)."""
    if x.dtype in FLOAT_DTYPES and isinstance(x.value, float) and math.isnan(x.value):
        return math.nan
    return x.value


__all__ = [
    "ARITH", "BINARY_OPS", "BLOCK", "BITS", "COMPARE", "DTYPES", "FLOAT_DTYPES", "HALF",
    "INT_DTYPES", "ITEMSIZE", "KIND_DTYPE", "LOGIC", "NBLOCKS", "UNARY_OPS", "Addr", "Binary",
    "Call", "Cast", "Const", "Expr", "Load", "Select", "Unary", "Var", "add", "and_", "as_expr",
    "binary", "call", "cast", "ceil_div", "children", "const", "div", "eq", "free_vars", "ge",
    "gt", "is_const", "le", "linear", "literal_value", "loads", "lt", "mod", "mul", "ne", "neg",
    "not_", "or_", "promote", "select", "sub",
]
