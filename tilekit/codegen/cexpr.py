"""Tensor-expression nodes -> CUDA C expressions: values, index maps, loads with padding.

Two small compilers share this module:

- **index code** (`index_code`, `linear`): the integer C of an index map. Floor division and
  modulo follow the expression language (Python semantics, `//` rounds down); when interval
  analysis proves the left side is never negative, plain C `/` and `%` are emitted.
- **value code** (`ValueCompiler`): a body expression in one of four compute kinds
  (`b` bool, `i` 64-bit integer, `f` float, `d` double), with casts where kinds meet. Tensor
  reads are delegated to a callback, so a kernel decides whether a read is a global load
  (bounds-checked, padded), a shared-memory read, a register, or an inlined producer.

Compute kinds vs NumPy: a float32 tensor combined with an integer (an axis value) stays float32
here where NumPy would widen to float64; float16/bfloat16 values are computed in float and
rounded on store (or where an explicit cast asks for it). See docs/codegen.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from tilekit.errors import UnsupportedError
from tilekit.expr.intervals import affine_form, interval
from tilekit.expr.ast import (BINARY_FUNCS, CAST_FUNCS, COMPARISONS, LOGICAL, Access, Axis,
                              Binary, Call, Node, Num, Unary, format_node)
from tilekit.expr.ops import FUNCTIONS, PAD_VALUES, REDUCTIONS

KINDS = "bifd"
KIND_CTYPE = {"b": "bool", "i": "long long", "f": "float", "d": "double"}


@dataclass(frozen=True)
class Storage:
    """How one IR dtype is stored in memory and which compute kind it loads as."""

    ctype: str
    kind: str


STORAGE = {
    "float32": Storage("float", "f"),
    "float64": Storage("double", "d"),
    "float16": Storage("__half", "f"),
    "bfloat16": Storage("__nv_bfloat16", "f"),
    "int64": Storage("long long", "i"),
    "int32": Storage("int", "i"),
    "int16": Storage("short", "i"),
    "int8": Storage("signed char", "i"),
    "uint8": Storage("unsigned char", "i"),
    "bool": Storage("bool", "b"),
}

#: dtypes that need cuda_fp16.h / cuda_bf16.h.
HALF_DTYPES = ("float16", "bfloat16")
_INT_LIMITS = {"int64": (-(2 ** 63), 2 ** 63 - 1), "int32": (-(2 ** 31), 2 ** 31 - 1),
               "int16": (-(2 ** 15), 2 ** 15 - 1), "int8": (-128, 127), "uint8": (0, 255)}


def storage(dtype: str) -> Storage:
    try:
        return STORAGE[dtype]
    except KeyError:
        raise UnsupportedError(f"dtype '{dtype}' has no CUDA storage type",
                               hint=f"known: {', '.join(STORAGE)}") from None


def promote(*kinds: str) -> str:
    return max(kinds, key=KINDS.index)


# -- literals and conversions ------------------------------------------------------------

def literal(value, kind: str) -> str:
    """A C literal of `value` in compute kind `kind`."""
    if kind == "b":
        return "true" if value else "false"
    if kind == "i":
        if isinstance(value, float):
            if math.isinf(value):
                return "LLONG_MAX" if value > 0 else "LLONG_MIN"
            value = int(value)
        if value < -(2 ** 31) or value >= 2 ** 31:
            return f"{value}LL" if value != -(2 ** 63) else "LLONG_MIN"
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "TK_NAN" if kind == "f" else "((double)TK_NAN)"
    if math.isinf(value):
        text = "TK_INF" if kind == "f" else "((double)TK_INF)"
        return text if value > 0 else f"(-{text})"
    text = repr(value)
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f" if kind == "f" else text


def convert(code: str, src: str, dst: str) -> str:
    """`code` (compute kind `src`) as compute kind `dst`."""
    if src == dst:
        return code
    if dst == "b":
        return f"(({code}) != 0)"
    return f"(({KIND_CTYPE[dst]})({code}))"


def load_value(code: str, dtype: str) -> str:
    """A stored element (`code` is an lvalue of the storage type) as its compute kind."""
    if dtype == "float16":
        return f"__half2float({code})"
    if dtype == "bfloat16":
        return f"__bfloat162float({code})"
    if dtype in ("int32", "int16", "int8", "uint8"):
        return f"((long long){code})"
    return code


def store_value(code: str, kind: str, dtype: str) -> str:
    """A compute value of kind `kind` converted for storing as `dtype` (NumPy's astype)."""
    if dtype == "float16":
        return f"__float2half_rn({convert(code, kind, 'f')})"
    if dtype == "bfloat16":
        return f"__float2bfloat16_rn({convert(code, kind, 'f')})"
    st = storage(dtype)
    if st.kind == kind and dtype in ("float32", "float64", "int64", "bool"):
        return code
    if dtype == "bool":
        return f"(({code}) != 0)"
    return f"(({st.ctype})({code}))"


def pad_literal(pad: str | None, dtype: str) -> str:
    """The value an out-of-range read of a `dtype` tensor yields, in its compute kind.

    Matches the reference: integer tensors pad -inf/inf with their type's min/max, bool with
    false/true. Without a declared pad (a read the kernel never uses) the value is 0.
    """
    value = PAD_VALUES.get(pad, 0.0) if pad is not None else 0.0
    kind = storage(dtype).kind
    if kind == "i" and math.isinf(value):
        lo, hi = _INT_LIMITS[dtype]
        return literal(lo if value < 0 else hi, "i")
    if kind == "b":
        return literal(value > 0, "b")
    return literal(value, kind)


def stored_pad(pad: str | None, dtype: str) -> str:
    """The pad value as an element of `dtype`'s storage type (for staged buffers)."""
    return store_value(pad_literal(pad, dtype), storage(dtype).kind, dtype)


# -- index code --------------------------------------------------------------------------

def linear(terms: Iterable[tuple[int, str]], const: int = 0) -> str:
    """`c0 * v0 + c1 * v1 + k` with unit and zero coefficients simplified; "0" when empty."""
    parts: list[str] = []
    for coef, var in terms:
        if coef == 0:
            continue
        mag = abs(coef)
        text = var if mag == 1 else f"{mag} * {var}"
        if not parts:
            parts.append(text if coef > 0 else f"-{text}")
        else:
            parts.append(f"+ {text}" if coef > 0 else f"- {text}")
    if const or not parts:
        if not parts:
            parts.append(str(const))
        else:
            parts.append(f"+ {const}" if const > 0 else f"- {-const}")
    return " ".join(parts)


Ranges = Mapping[str, tuple[int, int]]  # axis -> inclusive [lo, hi]


def index_code(node: Node, axis_code: Mapping[str, str], ranges: Ranges | None = None) -> str:
    """Integer C for an index expression. `axis_code[a]` is the C variable of axis `a`.

    With `ranges`, a `//` or `%` whose left side is provably non-negative uses C's `/` and
    `%` directly; otherwise the floor-semantics helpers of runtime.cuh.
    """
    aff = affine_form(node)
    if aff is not None:
        coefs, const = aff
        return linear(((c, axis_code[a]) for a, c in sorted(coefs.items())), const)
    if isinstance(node, Num):
        return str(int(node.value))
    if isinstance(node, Axis):
        return axis_code[node.name]
    if isinstance(node, Unary) and node.op == "-":
        return f"(-{_paren(index_code(node.arg, axis_code, ranges))})"
    if isinstance(node, Binary) and node.op in ("+", "-", "*"):
        lhs = _paren(index_code(node.lhs, axis_code, ranges))
        rhs = _paren(index_code(node.rhs, axis_code, ranges))
        return f"{lhs} {node.op} {rhs}"
    if isinstance(node, Binary) and node.op in ("//", "%"):
        lhs = index_code(node.lhs, axis_code, ranges)
        rhs = index_code(node.rhs, axis_code, ranges)
        nonneg = ranges is not None and _safe_interval(node.lhs, ranges)[0] >= 0
        if nonneg:
            return f"({_paren(lhs)} {'/' if node.op == '//' else '%'} {rhs})"
        helper = "tk_floordiv" if node.op == "//" else "tk_floormod"
        return f"{helper}({lhs}, {rhs})"
    raise UnsupportedError(f"cannot compile index {format_node(node)!r}")


def _safe_interval(node: Node, ranges: Ranges) -> tuple[int, int]:
    try:
        return interval(node, ranges)
    except KeyError:
        return (-1, 1)


def _paren(code: str) -> str:
    simple = code.replace("_", "").isalnum() or (code.startswith("(") and code.endswith(")")
                                                 and _balanced_outer(code))
    return code if simple else f"({code})"


def _balanced_outer(code: str) -> bool:
    depth = 0
    for pos, ch in enumerate(code):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and pos != len(code) - 1:
            return False
    return True


def _ll(code: str) -> str:
    """An integer operand as `long long`, so that overloaded helpers resolve unambiguously
    (an `int` axis variable beside a `long long` value)."""
    return code if code.startswith("((long long)") else f"((long long)({code}))"


# -- value code --------------------------------------------------------------------------

_CAST_KIND = {"float32": "f", "float64": "d", "float16": "f", "bfloat16": "f", "int64": "i",
              "int32": "i", "int16": "i", "int8": "i", "uint8": "i", "bool": "b"}

def identity(assign: str, kind: str) -> str:
    """The C literal of a reduction's identity in compute kind `kind` (tilekit.expr.ops)."""
    r = REDUCTIONS[assign]
    return literal(r.identity_bool if kind == "b" else r.identity, kind)


#: Identity of each reduction, per compute kind.
IDENTITY = {assign: {kind: identity(assign, kind) for kind in KINDS} for assign in REDUCTIONS}


def accumulator_kind(assign: str, body_kind: str) -> str:
    """Sums and products of bools count in integers (NumPy's sum of a bool array)."""
    if assign in ("+=", "*=") and body_kind == "b":
        return "i"
    return body_kind


def combine(assign: str, acc: str, value: str) -> str:
    """The statement that folds `value` into accumulator `acc`."""
    helper = REDUCTIONS[assign].c_helper
    if helper is None:
        return f"{acc} {assign} {value};"
    return f"{acc} = {helper}({acc}, {value});"


#: Warp-shuffle reduction helper per assignment (runtime.cuh).
WARP_REDUCE = {assign: r.warp_helper for assign, r in REDUCTIONS.items()}


class ValueCompiler:
    """Compiles body expressions to C. `read(access) -> code` gives a tensor read as its
    compute kind (`tensor_kind(name)`); `axis_code[a]` is an axis' integer C variable."""

    def __init__(self, axis_code: Mapping[str, str], tensor_kind: Callable[[str], str],
                 read: Callable[[Access], str], ranges: Ranges | None = None):
        self.axis_code = axis_code
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

    def emit(self, node: Node, want: str | None = None) -> str:
        """C code for `node`, converted to compute kind `want` (default: its own kind)."""
        kind, _ = self.kind(node)
        code = self._emit(node, kind)
        return convert(code, kind, want) if want else code

    def _emit(self, node: Node, kind: str) -> str:
        """Code for `node` whose kind is `kind` (literals are written in `kind` directly)."""
        if isinstance(node, Num):
            return literal(node.value, kind)
        if isinstance(node, Axis):
            code = self.axis_code[node.name]
            return code if kind == "i" else convert(code, "i", kind)
        if isinstance(node, Access):
            return self.read(node)
        if isinstance(node, Unary):
            if node.op == "!":
                return f"(!{self.emit(node.arg, 'b')})"
            return f"(-{self._emit(node.arg, kind)})"
        if isinstance(node, Binary):
            return self._binary(node, kind)
        if isinstance(node, Call):
            return self._call(node, kind)
        raise UnsupportedError(f"cannot compile {node!r}")

    def _operands(self, lhs: Node, rhs: Node) -> tuple[str, str, str]:
        kind, _ = self._join(self.kind(lhs), self.kind(rhs))
        if kind == "b":
            kind = "i"
        return self._as(lhs, kind), self._as(rhs, kind), kind

    def _as(self, node: Node, kind: str) -> str:
        own, weak = self.kind(node)
        if weak:
            return self._emit(node, kind)
        return convert(self._emit(node, own), own, kind)

    def _binary(self, node: Binary, kind: str) -> str:
        op = node.op
        if op in LOGICAL:
            return f"({self.emit(node.lhs, 'b')} {op} {self.emit(node.rhs, 'b')})"
        if op in COMPARISONS:
            lhs, rhs, _ = self._operands(node.lhs, node.rhs)
            return f"({lhs} {op} {rhs})"
        if op == "/":
            return f"({self._as(node.lhs, kind)} / {self._as(node.rhs, kind)})"
        lhs, rhs = self._as(node.lhs, kind), self._as(node.rhs, kind)
        if op == "//":
            if kind == "i":
                return f"tk_floordiv({_ll(lhs)}, {_ll(rhs)})"
            return f"{'floorf' if kind == 'f' else 'floor'}({lhs} / {rhs})"
        if op == "%":
            if kind == "i":
                return f"tk_floormod({_ll(lhs)}, {_ll(rhs)})"
            return f"tk_floormod({lhs}, {rhs})"
        return f"({lhs} {op} {rhs})"

    def _call(self, node: Call, kind: str) -> str:
        fn, args = node.fn, node.args
        if fn in CAST_FUNCS:
            inner_kind, _ = self.kind(args[0])
            inner = self._emit(args[0], inner_kind)
            if fn == "float16":
                return f"__half2float(__float2half_rn({convert(inner, inner_kind, 'f')}))"
            if fn == "bfloat16":
                return f"__bfloat162float(__float2bfloat16_rn({convert(inner, inner_kind, 'f')}))"
            if fn in ("int32", "int16", "int8", "uint8"):
                ctype = STORAGE[fn].ctype
                return f"((long long)({ctype})({inner}))"
            return convert(inner, inner_kind, kind)
        if fn == "select":
            cond = self.emit(args[0], "b")
            return f"({cond} ? {self._as(args[1], kind)} : {self._as(args[2], kind)})"
        if fn in ("isnan", "isinf"):
            inner_kind, _ = self.kind(args[0])
            if inner_kind in "bi":
                return "false"
            return f"{fn}({self._emit(args[0], inner_kind)})"
        if fn == "not":
            return f"(!{self.emit(args[0], 'b')})"
        if fn in BINARY_FUNCS:
            a, b = self._as(args[0], kind), self._as(args[1], kind)
            if fn in ("max", "min"):
                if kind == "i":
                    a, b = _ll(a), _ll(b)
                return f"tk_{fn}({a}, {b})"
            if fn == "pow":
                return f"{'powf' if kind == 'f' else 'pow'}({a}, {b})"
            if kind == "i":
                return f"({a} % {b})"  # C's % truncates like fmod
            return f"{'fmodf' if kind == 'f' else 'fmod'}({a}, {b})"
        arg = self._as(args[0], kind)
        if fn == "neg":
            return f"(-{arg})"
        if fn in ("abs", "sign"):
            return f"tk_{fn}({_ll(arg) if kind == 'i' else arg})"
        if fn == "reciprocal":
            return f"({literal(1, kind)} / {arg})"
        entry = FUNCTIONS.get(fn)
        if entry is not None and entry.c_float:
            return f"{entry.c_float if kind == 'f' else entry.c_double}({arg})"
        known = sorted(f.name for f in FUNCTIONS.values() if f.c_float)
        raise UnsupportedError(f"function '{fn}' has no CUDA translation",
                               hint=f"known: {', '.join(known)}")
