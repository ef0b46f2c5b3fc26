"""What the CUDA and C++ printers share: C expressions, statements and types from a tile
program, with a table per target for what differs (type names, function spellings, how a
thread region, a barrier or a shared buffer is written).

A target subclasses `CStyle` and fills its tables (tilekit.tile.cuda, tilekit.tile.cpp); the
kernel layout (body function, entry) is the target's own. Every line goes through the
emitter's check (printable ASCII, comments escaped), so no name or expression can change the
meaning of the code around it.
"""

from __future__ import annotations

import math
import struct
from typing import Mapping

from tilekit.errors import InternalError
from tilekit.tile.emit import Emitter, comment_text
from tilekit.tile.expr import (FLOAT_DTYPES, HALF, INT_DTYPES, Addr, Binary, Call, Cast, Const,
                               Expr, Load, Select, Unary, Var)
from tilekit.tile.functions import function
from tilekit.tile.nodes import (Alloc, Assign, Barrier, Break, Buffer, CallBody, Comment,
                                Continue, Copy, Decl, Evaluate, For, If, Kernel, Let, Seq, Stmt,
                                Store, Switch, Threads, While)

#: C operator precedence (higher binds tighter).
_PRECEDENCE = {"*": 13, "/": 13, "%": 13, "+": 12, "-": 12, "<<": 11, ">>": 11, "<": 10,
               "<=": 10, ">": 10, ">=": 10, "==": 9, "!=": 9, "&": 8, "^": 7, "|": 6,
               "&&": 5, "||": 4}
_ATOM = 20
#: The size tables of a unit whose sizes are parameters (tilekit.codegen.parametric): the
#: integers and the floats that differ between the sizes it serves, set before a run (the
#: C++ unit's `tk_set_sizes`; the CUDA unit's `__constant__` arrays, set by the runtime).
#: Every printer knows them, so a kernel reads them as global buffers.
SIZE_TABLES = (("tk_iz", "int64"), ("tk_fz", "float64"))
#: Math functions: the float32 spelling (the float64 one drops the trailing `f`).
MATH = {"exp": "expf", "log": "logf", "tanh": "tanhf", "erf": "erff", "sqrt": "sqrtf",
        "rsqrt": "rsqrtf", "floor": "floorf", "ceil": "ceilf", "rint": "rintf", "sin": "sinf",
        "cos": "cosf", "tan": "tanf", "asin": "asinf", "acos": "acosf", "atan": "atanf",
        "sinh": "sinhf", "cosh": "coshf", "asinh": "asinhf", "acosh": "acoshf",
        "atanh": "atanhf", "pow": "powf", "fmod": "fmodf"}
#: The runtime header's helpers (runtime.cuh, runtime_cpu.h), the same on every target.
HELPERS = {"sigmoid": "tk_sigmoid", "max": "tk_max", "min": "tk_min", "abs": "tk_abs",
           "sign": "tk_sign", "floordiv": "tk_floordiv", "floormod": "tk_floormod",
           "isnan": "isnan", "isinf": "isinf", "in_range": "tk_in"}


class CStyle:
    """A printer of one kernel's statements and expressions for a C-family target."""

    #: dtype -> C type name.
    TYPES: Mapping[str, str] = {
        "bool": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
        "int32": "int", "uint32": "unsigned", "int64": "long long", "float32": "float",
        "float64": "double", "float4": "float4", "ptr": "void*"}
    #: Calls spelled by the target itself (intrinsics), name -> C function.
    INTRINSICS: Mapping[str, str] = {}
    #: float32 math functions the target spells with its own helpers (else libm's).
    FLOAT_MATH: Mapping[str, str] = {}
    #: Print a division by a float constant as a product with its reciprocal (`_by_reciprocal`).
    RECIPROCAL_DIVISION = False

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.buffers: dict[str, Buffer] = kernel.buffers()
        for name, dtype in SIZE_TABLES:
            self.buffers.setdefault(name, Buffer(name, "global", dtype, (1,)))

    # -- types and literals ---------------------------------------------------------------
    def ctype(self, dtype: str) -> str:
        try:
            return self.TYPES[dtype]
        except KeyError:
            raise InternalError(f"{type(self).__name__}: no C type for dtype {dtype!r}") from None

    def literal(self, c: Const) -> str:
        v, d = c.value, c.dtype
        if d == "bool":
            return "true" if v else "false"
        if d in INT_DTYPES:
            v = int(v)
            if d == "int64" and v == -(2 ** 63):
                return "LLONG_MIN"
            if d == "int64" and v == 2 ** 63 - 1:
                return "LLONG_MAX"
            if d == "int64":    # always typed: a helper's overloads must resolve
                return f"{v}LL"
            if d == "uint32":
                return f"{v}u"
            return str(v)
        if d == "float4":
            one = self.literal(Const(float(v), "float32"))
            return f"make_float4({one}, {one}, {one}, {one})"
        if d in HALF:
            return self.to_half(self.literal(Const(float(v), "float32")), d)
        v = float(v)
        if math.isnan(v):
            return "TK_NAN" if d == "float32" else "((double)TK_NAN)"
        if math.isinf(v):
            text = "TK_INF" if d == "float32" else "((double)TK_INF)"
            return text if v > 0 else f"(-{text})"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return text + "f" if d == "float32" else text

    # -- half precision (the target's spelling) -------------------------------------------
    def to_half(self, code: str, dtype: str) -> str:
        fn = "__float2half_rn" if dtype == "float16" else "__float2bfloat16_rn"
        return f"{fn}({code})"

    def from_half(self, code: str, dtype: str) -> str:
        fn = "__half2float" if dtype == "float16" else "__bfloat162float"
        return f"{fn}({code})"

    # -- expressions ----------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        return self._expr(e)[0]

    def _paren(self, e: Expr, min_prec: int) -> str:
        code, prec = self._expr(e)
        return code if prec >= min_prec else f"({code})"

    def _expr(self, e: Expr) -> tuple[str, int]:
        if isinstance(e, Const):
            code = self.literal(e)
            return code, (_ATOM if not code.startswith("-") else 14)
        if isinstance(e, Var):
            return e.name, _ATOM
        if isinstance(e, Load):
            return self.load(e), _ATOM
        if isinstance(e, Addr):
            return self.address(e), 14
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Unary):
            return f"{e.op}{self._paren(e.arg, 14)}", 14
        if isinstance(e, Cast):
            return self.cast(e), _ATOM
        if isinstance(e, Select):
            return (f"({self.expr(e.cond)} ? {self._paren(e.then, 4)} : "
                    f"{self._paren(e.other, 4)})"), _ATOM
        if isinstance(e, Call):
            return self.call(e), _ATOM
        raise InternalError(f"cannot print expression {e!r}")

    def binary(self, e: Binary) -> tuple[str, int]:
        if self.RECIPROCAL_DIVISION and e.op == "/":
            e = _by_reciprocal(e)
        prec = _PRECEDENCE[e.op]
        lhs = self._child(e.lhs, e.op, prec, right=False)
        rhs = self._child(e.rhs, e.op, prec, right=True)
        return f"{lhs} {e.op} {rhs}", prec

    def _child(self, child: Expr, op: str, prec: int, right: bool) -> str:
        code, cprec = self._expr(child)
        if isinstance(child, Binary):
            bits = ("&", "|", "^", "<<", ">>")
            mixed_logic = child.op != op and (
                (op in ("&&", "||") and child.op in ("&&", "||"))
                or op in bits or child.op in bits)
            if cprec < prec or (right and cprec == prec and op in ("-", "/", "%", "<<", ">>"))\
                    or (cprec == prec and op in ("*",) and child.op in ("/", "%")) \
                    or mixed_logic or (op in ("<", "<=", ">", ">=", "==", "!=")
                                       and cprec <= 10):
                return f"({code})"
            return code
        return code if cprec > prec else f"({code})"

    def cast(self, e: Cast) -> str:
        src, dst = e.arg.dtype, e.dtype
        inner = self.expr(e.arg)
        if dst in HALF:
            if src != "float32":
                inner = self.cast(Cast(e.arg, "float32"))
            return self.to_half(inner, dst)
        if src in HALF:
            as_float = self.from_half(inner, src)
            return as_float if dst == "float32" else f"(({self.ctype(dst)})({as_float}))"
        if dst == "bool":
            return f"(({inner}) != 0)"
        return f"(({self.ctype(dst)})({inner}))"

    def call(self, e: Call) -> str:
        fn = e.fn
        args = [self.expr(a) for a in e.args]
        f = function(fn)
        if f.family == "math":
            if e.dtype == "float32" and fn in self.FLOAT_MATH:
                return f"{self.FLOAT_MATH[fn]}({', '.join(args)})"
            spelled = MATH.get(fn)
            if spelled is None and fn == "sigmoid":
                spelled = "tk_sigmoid"
            if e.dtype == "float64" and spelled != "tk_sigmoid":
                spelled = spelled.removesuffix("f")
            return f"{spelled}({', '.join(args)})"
        if fn in ("max", "min") and e.dtype in ("float32", "float64") \
                and _plain_constant(e.args[1]):
            return f"{HELPERS[fn]}_c({', '.join(args)})"   # runtime.cuh: one compare
        if fn in HELPERS:
            return f"{HELPERS[fn]}({', '.join(args)})"
        return self.intrinsic(e, args)

    def intrinsic(self, e: Call, args: list[str]) -> str:
        spelled = self.INTRINSICS.get(e.fn)
        if spelled is None:
            raise InternalError(f"{type(self).__name__}: '{e.fn}' has no spelling on this "
                                "target")
        return f"{spelled}({', '.join(args)})"

    # -- memory ---------------------------------------------------------------------------
    def element(self, buffer: str, index: tuple[Expr, ...]) -> str:
        """`buf[...]`: local buffers as C arrays (one subscript per dimension), shared and
        global ones flat through their layout."""
        b = self.buffers[buffer]
        if b.scope == "local":
            return buffer + "".join(f"[{self.expr(i)}]" for i in index)
        return f"{buffer}[{self.expr(b.flat(index))}]"

    def load(self, e: Load) -> str:
        if e.lanes == 1:
            return self.element(e.buffer, e.index)
        return self.vector_load(e)

    def vector_load(self, e: Load) -> str:
        const = "const " if self.buffers[e.buffer].scope == "global" else ""
        return (f"*reinterpret_cast<{const}{self.ctype(e.dtype)}*>"
                f"(&{self.element(e.buffer, e.index)})")

    def address(self, e: Addr) -> str:
        b = self.buffers[e.buffer]
        if b.scope == "local" and len(e.index) < len(b.shape):
            return e.buffer + "".join(f"[{self.expr(i)}]" for i in e.index)
        return f"&{self.element(e.buffer, e.index)}"

    # -- statements -----------------------------------------------------------------------
    def stmts(self, s: Stmt, e: Emitter) -> None:
        method = getattr(self, f"s_{type(s).__name__}", None)
        if method is None:
            raise InternalError(f"{type(self).__name__} cannot print {type(s).__name__} "
                                "(lower tile operations first)")
        method(s, e)

    def s_Seq(self, s: Seq, e: Emitter) -> None:
        if s.scoped:
            with e.block():
                for x in s.body:
                    self.stmts(x, e)
        else:
            for x in s.body:
                self.stmts(x, e)

    def s_Comment(self, s: Comment, e: Emitter) -> None:
        e.comment(s.text)

    def s_Let(self, s: Let, e: Emitter) -> None:
        e.line(f"const {self.ctype(s.var.dtype)} {s.var.name} = {self.expr(s.value)};")

    def s_Decl(self, s: Decl, e: Emitter) -> None:
        init = f" = {self.expr(s.init)}" if s.init is not None else ""
        e.line(f"{self.ctype(s.var.dtype)} {s.var.name}{init};")

    def s_Assign(self, s: Assign, e: Emitter) -> None:
        v = s.value
        if isinstance(v, Binary) and v.lhs == s.var and v.op in ("+", "-", "*", "/"):
            e.line(f"{s.var.name} {v.op}= {self._paren(v.rhs, 4)};")
            return
        e.line(f"{s.var.name} = {self.expr(v)};")

    def s_Alloc(self, s: Alloc, e: Emitter) -> None:
        b = s.buffer
        dims = "".join(f"[{d}]" for d in b.shape) or "[1]"
        note = f"  // {comment_text(b.comment)}" if b.comment else ""
        align = f"alignas({b.align}) " if b.align else ""
        e.line(f"{align}{self.ctype(b.dtype)} {b.name}{dims};{note}")

    def s_Store(self, s: Store, e: Emitter) -> None:
        v = s.value
        if s.lanes > 1:
            target = (f"*reinterpret_cast<{self.ctype(v.dtype)}*>"
                      f"(&{self.element(s.buffer, s.index)})")
        else:
            target = self.element(s.buffer, s.index)
        if (s.lanes == 1 and isinstance(v, Binary) and v.op in ("+", "-", "*")
                and isinstance(v.lhs, Load) and v.lhs.buffer == s.buffer
                and v.lhs.index == s.index and v.lhs.lanes == 1):
            e.line(f"{target} {v.op}= {self._paren(v.rhs, 4)};")
            return
        e.line(f"{target} = {self.expr(v)};")

    def s_Evaluate(self, s: Evaluate, e: Emitter) -> None:
        e.line(f"{self.expr(s.call)};")

    def s_For(self, s: For, e: Emitter) -> None:
        if s.kind in ("parallel", "pipelined"):
            raise InternalError(f"a {s.kind} loop reached the printer (lower it first)")
        if s.kind == "unroll":
            self.unroll_pragma(e, s.unroll)
        elif s.kind == "simd":
            self.simd_pragma(e)
        v = s.var
        step = ("++" + v.name) if isinstance(s.step, Const) and s.step.value == 1 else \
            f"{v.name} += {self.expr(s.step)}"
        head = (f"for ({self.ctype(v.dtype)} {v.name} = {self.expr(s.start)}; "
                f"{v.name} < {self._paren(s.stop, 11)}; {step})")
        with e.block(head):
            self.stmts(s.body, e)

    def unroll_pragma(self, e: Emitter, factor: int = 0) -> None:
        """An `unroll` loop: wholly, or by `factor` iterations."""
        e.line(f"#pragma unroll {factor}" if factor else "#pragma unroll")

    def simd_pragma(self, e: Emitter) -> None:
        """A `simd` loop: its iterations are independent (each writes its own elements), so
        the compiler may run them in vector lanes. Nothing to say on a GPU."""

    def s_While(self, s: While, e: Emitter) -> None:
        with e.block(f"while ({self.expr(s.cond)})"):
            self.stmts(s.body, e)

    def s_Break(self, s: Break, e: Emitter) -> None:
        e.line("break;")

    def s_Continue(self, s: Continue, e: Emitter) -> None:
        e.line("continue;")

    def s_If(self, s: If, e: Emitter) -> None:
        with e.block(f"if ({self.expr(s.cond)})"):
            self.stmts(s.then, e)
        if s.other is not None:
            with e.block("else"):
                self.stmts(s.other, e)

    def s_Switch(self, s: Switch, e: Emitter) -> None:
        with e.block(f"switch ({self.expr(s.value)})"):
            for value, body in s.cases:
                with e.block(f"case {value}:"):
                    self.stmts(body, e)
                    e.line("break;")

    def s_Copy(self, s: Copy, e: Emitter) -> None:
        raise InternalError("a Copy reached the printer (tilekit.tile.passes lowers it)")

    # target-specific: s_Threads, s_Barrier, s_CallBody
    def s_Threads(self, s: Threads, e: Emitter) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def s_Barrier(self, s: Barrier, e: Emitter) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def s_CallBody(self, s: CallBody, e: Emitter) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def float_dtype(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def _by_reciprocal(e: Binary) -> Binary:
    """`x / c` as `x * (1 / c)` when c is a float constant whose reciprocal is a normal
    number: a multiply where a vector division takes 10 to 20 cycles (the GELU's x / sqrt(2)
    in an epilogue, 0.96x as long on an AVX-512 Xeon). The product is the quotient within an
    ulp (exactly it where c is a power of two); `e` unchanged otherwise."""
    c = e.rhs
    if not (isinstance(c, Const) and e.dtype in ("float32", "float64")
            and c.dtype == e.dtype and isinstance(c.value, float) and math.isfinite(c.value)
            and c.value != 0.0):
        return e
    tiny, big = (2.0 ** -126, 2.0 ** 126) if e.dtype == "float32" else (2.0 ** -1022,
                                                                          2.0 ** 1022)
    if not tiny <= abs(c.value) <= big:
        return e
    inverse = 1.0 / c.value
    if e.dtype == "float32":
        inverse = float(struct.unpack("<f", struct.pack("<f", inverse))[0])
    return Binary("*", e.lhs, Const(inverse, e.dtype), e.dtype)


def _plain_constant(e) -> bool:
    """Is `e` a float constant that is not NaN (tk_max_c's and tk_min_c's second argument)?"""
    return isinstance(e, Const) and e.dtype in FLOAT_DTYPES and not math.isnan(e.value)


__all__ = ["CStyle", "HELPERS", "MATH"]
