"""Tensor expressions -> tile-program expressions: values, index maps, loads with padding.

Two small compilers share this module, both producing `tilekit.tile.expr` nodes:

- **index code** (`index_expr`): the integer expression of an index map. Floor division and
  modulo follow the expression language (Python semantics, `//` rounds down); when interval
  analysis proves the left side is never negative, C's truncating `/` and `%` (the same
  there) are used.
- **value code** (`ValueCompiler`): a body expression in one of four compute kinds
  (`b` bool, `i` 64-bit integer, `f` float32, `d` float64), with casts where kinds meet.
  Tensor reads are delegated to a callback, so a kernel decides whether a read is a global
  load (bounds-checked, padded), a shared-memory read, a register, or an inlined producer.

Compute kinds vs NumPy: a float32 tensor combined with an integer (an axis value) stays float32
here where NumPy would widen to float64; float16/bfloat16 values are computed in float32 and
rounded on store (or where an explicit cast asks for it). See docs/codegen.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from tilekit.errors import UnsupportedError
from tilekit.expr.ast import (BINARY_FUNCS, CAST_FUNCS, COMPARISONS, LOGICAL, Access, Axis,
                              Binary, Call, Node, Num, Unary, format_node)
from tilekit.expr.intervals import affine_form, interval
from tilekit.expr.ops import FUNCTIONS, PAD_VALUES, REDUCTIONS
from tilekit.tile import expr as tx
from tilekit.tile.expr import KIND_DTYPE, Const, Expr

KINDS = "bifd"
HALF_DTYPES = ("float16", "bfloat16")
_INT_LIMITS = {"int64": (-(2 ** 63), 2 ** 63 - 1), "int32": (-(2 ** 31), 2 ** 31 - 1),
               "int16": (-(2 ** 15), 2 ** 15 - 1), "int8": (-128, 127), "uint8": (0, 255)}
#: The compute kind each stored dtype loads as.
STORAGE_KIND = {"float32": "f", "float64": "d", "float16": "f", "bfloat16": "f", "int64": "i",
                "int32": "i", "int16": "i", "int8": "i", "uint8": "i", "bool": "b"}


def storage_kind(dtype: str) -> str:
    try:
        return STORAGE_KIND[dtype]
    except KeyError:
        raise UnsupportedError(f"dtype '{dtype}' has no kernel storage type",
                               hint=f"known: {', '.join(STORAGE_KIND)}") from None


def kind_of(dtype: str) -> str:
    """The compute kind of a tile dtype (a storage dtype loads as its compute kind)."""
    return {"bool": "b", "int64": "i", "float32": "f", "float64": "d"}.get(
        dtype, STORAGE_KIND.get(dtype, "i"))


def promote(*kinds: str) -> str:
    return max(kinds, key=KINDS.index)


# -- literals and conversions ------------------------------------------------------------

def literal(value, kind: str) -> Const:
    """`value` as a constant of compute kind `kind` (infinities of an integer kind are its
    limits)."""
    dtype = KIND_DTYPE[kind]
    if kind == "b":
        return Const(bool(value), dtype)
    if kind == "i":
        if isinstance(value, float):
            if math.isinf(value):
                return Const(2 ** 63 - 1 if value > 0 else -(2 ** 63), dtype)
            value = int(value)
        return Const(int(value), dtype)
    return Const(float(value), dtype)


def convert(x: Expr, dst: str) -> Expr:
    """`x` as compute kind `dst`."""
    dtype = KIND_DTYPE[dst]
    if x.dtype == dtype:
        return x
    if dst == "b":
        return tx.ne(x, tx.as_expr(0, x.dtype))
    return tx.cast(dtype, x)


def load_value(x: Expr, dtype: str) -> Expr:
    """A stored element (`x` of the storage dtype) as its compute kind."""
    return convert(x, storage_kind(dtype))


def store_value(x: Expr, dtype: str) -> Expr:
    """A compute value converted for storing as `dtype` (NumPy's astype)."""
    if x.dtype == dtype:
        return x
    if dtype == "bool":
        return tx.ne(x, tx.as_expr(0, x.dtype))
    return tx.cast(dtype, x)


def pad_literal(pad: str | None, dtype: str) -> Const:
    """The value an out-of-range read of a `dtype` tensor yields, in its compute kind.

    Matches the reference: integer tensors pad -inf/inf with their type's min/max, bool with
    false/true. Without a declared pad (a read the kernel never uses) the value is 0.
    """
    value = PAD_VALUES.get(pad, 0.0) if pad is not None else 0.0
    kind = storage_kind(dtype)
    if kind == "i" and math.isinf(value):
        lo, hi = _INT_LIMITS[dtype]
        return literal(lo if value < 0 else hi, "i")
    if kind == "b":
        return literal(value > 0, "b")
    return literal(value, kind)


def stored_pad(pad: str | None, dtype: str) -> Expr:
    """The pad value as an element of `dtype` (for staged buffers)."""
    return store_value(pad_literal(pad, dtype), dtype)


def identity(assign: str, kind: str) -> Const:
    """A reduction's identity in compute kind `kind` (tilekit.expr.ops)."""
    r = REDUCTIONS[assign]
    return literal(r.identity_bool if kind == "b" else r.identity, kind)


def accumulator_kind(assign: str, body_kind: str) -> str:
    """Sums and products of bools count in integers (NumPy's sum of a bool array)."""
    if assign in ("+=", "*=") and body_kind == "b":
        return "i"
    return body_kind


def combine(assign: str, acc: Expr, value: Expr) -> Expr:
    """The new value of accumulator `acc` after folding in `value`."""
    op = {"+=": "+", "*=": "*"}.get(assign)
    if op is not None:
        return tx.binary(op, acc, value, acc.dtype)
    return tx.call("max" if assign == "max=" else "min", acc, value)


# -- index code --------------------------------------------------------------------------

Ranges = Mapping[str, tuple[int, int]]  # axis -> inclusive [lo, hi]


def index_expr(node: Node, axis: Mapping[str, Expr], ranges: Ranges | None = None) -> Expr:
    """The integer expression of an index map node; `axis[a]` is axis `a`'s variable.

    With `ranges`, a `//` or `%` whose left side is provably non-negative uses C's division;
    otherwise the floor-semantics helpers.
    """
    aff = affine_form(node)
    if aff is not None:
        coefs, const = aff
        dtype = _int_dtype(axis[a] for a in coefs)
        return tx.linear(((c, axis[a]) for a, c in sorted(coefs.items())), const, dtype)
    if isinstance(node, Num):
        return tx.as_expr(int(node.value))
    if isinstance(node, Axis):
        return axis[node.name]
    if isinstance(node, Unary) and node.op == "-":
        return tx.neg(index_expr(node.arg, axis, ranges))
    if isinstance(node, Binary) and node.op in ("+", "-", "*"):
        return tx.binary(node.op, index_expr(node.lhs, axis, ranges),
                         index_expr(node.rhs, axis, ranges))
    if isinstance(node, Binary) and node.op in ("//", "%"):
        lhs = index_expr(node.lhs, axis, ranges)
        rhs = index_expr(node.rhs, axis, ranges)
        if ranges is not None and _safe_interval(node.lhs, ranges)[0] >= 0:
            return tx.binary("/" if node.op == "//" else "%", lhs, rhs)
        return tx.call("floordiv" if node.op == "//" else "floormod", lhs, rhs)
    raise UnsupportedError(f"cannot compile index {format_node(node)!r}")


def _int_dtype(xs) -> str:
    return "int64" if any(x.dtype == "int64" for x in xs) else "int32"


def _safe_interval(node: Node, ranges: Ranges) -> tuple[int, int]:
    try:
        return interval(node, ranges)
    except KeyError:
        return (-1, 1)


# -- value code --------------------------------------------------------------------------

_CAST_KIND = {"float32": "f", "float64": "d", "float16": "f", "bfloat16": "f", "int64": "i",
              "int32": "i", "int16": "i", "int8": "i", "uint8": "i", "bool": "b"}


class ValueCompiler:
    """Compiles body expressions to tile expressions. `read(access) -> Expr` gives a tensor
    read as its compute kind (`tensor_kind(name)`); `axis[a]` is an axis' integer variable."""

    def __init__(self, axis: Mapping[str, Expr], tensor_kind: Callable[[str], str],
                 read: Callable[[Access], Expr], ranges: Ranges | None = None):
        self.axis = axis
        self.tensor_kind = tensor_kind
        self.read = read
        self.ranges = ranges

    # Kinds: (kind, weak). Literals are weak: they take the kind of the other operand.
    def kind(self, node: Node) -> tuple[str, bool]:
        if isinstance(node, Num):
            return ("i" if isinstance(node.value, int) and not isinstance(node.value, bool)
                    else "f"), True
        if isinstance(node, Axis):
            return "i", False
        if isinstance(node, Access):
            return self.tensor_kind(node.tensor), False
        if isinstance(node, Unary):
            if node.op == "!":
                return "b", False
            return self.kind(node.arg)
        if isinstance(node, Binary):
            if node.op in COMPARISONS or node.op in LOGICAL:
                return "b", False
            kind, weak = self._join(self.kind(node.lhs), self.kind(node.rhs))
            if node.op == "/":
                kind = promote(kind, "f")
            elif kind == "b":
                kind = "i"  # arithmetic on bools counts
            return kind, weak
        if isinstance(node, Call):
            fn = node.fn
            if fn in CAST_FUNCS:
                return _CAST_KIND[fn], False
            if fn in ("isnan", "isinf", "not"):
                return "b", False
            if fn == "select":
                return self._join(self.kind(node.args[1]), self.kind(node.args[2]))
            if fn in BINARY_FUNCS:
                kind, weak = self._join(self.kind(node.args[0]), self.kind(node.args[1]))
                return (promote(kind, "f") if fn == "pow" else kind), weak
            kind, weak = self.kind(node.args[0])
            if fn in ("abs", "neg", "sign"):
                return ("i" if kind == "b" else kind), weak
            return promote(kind, "f"), weak
        raise UnsupportedError(f"cannot compile {node!r}")

    @staticmethod
    def _join(a: tuple[str, bool], b: tuple[str, bool]) -> tuple[str, bool]:
        (ka, wa), (kb, wb) = a, b
        if wa and not wb:
            # A float literal beside an integer operand makes a float (NumPy: float64).
            return (promote(kb, "f") if ka == "f" and kb in "bi" else kb), False
        if wb and not wa:
            return (promote(ka, "f") if kb == "f" and ka in "bi" else ka), False
        return promote(ka, kb), wa and wb

    def emit(self, node: Node, want: str | None = None) -> Expr:
        """The expression of `node`, converted to compute kind `want` (default: its own)."""
        kind, _ = self.kind(node)
        x = self._emit(node, kind)
        return convert(x, want) if want else x

    def _emit(self, node: Node, kind: str) -> Expr:
        """`node` (whose kind is `kind`; literals are made in `kind` directly)."""
        if isinstance(node, Num):
            return literal(node.value, kind)
        if isinstance(node, Axis):     # an index variable is already an integer
            v = self.axis[node.name]
            return v if kind == "i" else convert(v, kind)
        if isinstance(node, Access):
            return self.read(node)
        if isinstance(node, Unary):
            if node.op == "!":
                return tx.not_(self.emit(node.arg, "b"))
            return tx.neg(self._emit(node.arg, kind))
        if isinstance(node, Binary):
            return self._binary(node, kind)
        if isinstance(node, Call):
            return self._call(node, kind)
        raise UnsupportedError(f"cannot compile {node!r}")

    def _int(self, node: Node) -> Expr:
        own, weak = self.kind(node)
        x = self._emit(node, "i" if weak else own)
        return x if x.dtype in tx.INT_DTYPES else convert(x, "i")

    def _as(self, node: Node, kind: str) -> Expr:
        own, weak = self.kind(node)
        if weak:
            return self._emit(node, kind)
        return convert(self._emit(node, own), kind)

    def _binary(self, node: Binary, kind: str) -> Expr:
        op = node.op
        if op in LOGICAL:
            return tx.binary(op, self.emit(node.lhs, "b"), self.emit(node.rhs, "b"))
        if op in COMPARISONS:
            k, _ = self._join(self.kind(node.lhs), self.kind(node.rhs))
            k = "i" if k == "b" else k
            if k == "i":     # integers of any width compare exactly as they are
                return tx.binary(op, self._int(node.lhs), self._int(node.rhs))
            return tx.binary(op, self._as(node.lhs, k), self._as(node.rhs, k))
        lhs, rhs = self._as(node.lhs, kind), self._as(node.rhs, kind)
        if op == "/":
            return tx.binary("/", lhs, rhs, KIND_DTYPE[kind])
        if op == "//":
            if kind == "i":
                return tx.call("floordiv", lhs, rhs)
            return tx.call("floor", tx.binary("/", lhs, rhs, KIND_DTYPE[kind]))
        if op == "%":
            return tx.call("floormod", lhs, rhs)
        return tx.binary(op, lhs, rhs, KIND_DTYPE[kind])

    def _call(self, node: Call, kind: str) -> Expr:
        fn, args = node.fn, node.args
        if fn in CAST_FUNCS:
            inner_kind, _ = self.kind(args[0])
            inner = self._emit(args[0], inner_kind)
            if fn in HALF_DTYPES:   # round to the half type, keep computing in float32
                return tx.cast("float32", tx.cast(fn, convert(inner, "f")))
            if fn in ("int32", "int16", "int8", "uint8"):
                return tx.cast("int64", tx.cast(fn, inner))
            return convert(inner, kind)
        if fn == "select":
            return tx.select(self.emit(args[0], "b"), self._as(args[1], kind),
                             self._as(args[2], kind))
        if fn in ("isnan", "isinf"):
            inner_kind, _ = self.kind(args[0])
            if inner_kind in "bi":
                return literal(False, "b")
            return tx.call(fn, self._emit(args[0], inner_kind))
        if fn == "not":
            return tx.not_(self.emit(args[0], "b"))
        if fn in BINARY_FUNCS:
            a, b = self._as(args[0], kind), self._as(args[1], kind)
            if fn == "pow" and kind in "fd" and isinstance(args[1], Num) \
                    and float(args[1].value) in (2.0, 3.0):
                # x**2 and x**3 (GELU's tanh form) as products: no pow call, vectorisable
                square = tx.mul(a, a)
                return square if float(args[1].value) == 2.0 else tx.mul(square, a)
            if fn in ("max", "min", "pow"):
                return tx.call(fn, a, b)
            if kind == "i":
                return tx.binary("%", a, b)  # C's % truncates like fmod
            return tx.call("fmod", a, b)
        arg = self._as(args[0], kind)
        if fn == "neg":
            return tx.neg(arg)
        if fn in ("abs", "sign"):
            return tx.call(fn, arg)
        if fn == "reciprocal":
            return tx.binary("/", literal(1, kind), arg)
        if fn == "round":
            return tx.call("rint", arg)
        entry = FUNCTIONS.get(fn)
        if entry is not None and entry.c_float:
            return tx.call(fn, arg)
        known = sorted(f.name for f in FUNCTIONS.values() if f.c_float)
        raise UnsupportedError(f"function '{fn}' has no kernel translation",
                               hint=f"known: {', '.join(known)}")


@dataclass(frozen=True)
class Storage:
    """How one IR dtype is stored in memory and which compute kind it loads as."""

    dtype: str
    kind: str


def storage(dtype: str) -> Storage:
    return Storage(dtype, storage_kind(dtype))


__all__ = ["HALF_DTYPES", "KINDS", "STORAGE_KIND", "Storage", "ValueCompiler",
           "accumulator_kind", "combine", "convert", "identity", "index_expr", "kind_of",
           "literal", "load_value", "pad_literal", "promote", "storage", "storage_kind",
           "store_value", "stored_pad"]
