"""Tensor expressions -> tile expressions -> C: index code, literals, kinds and casts; the
printer's spelling of them; runtime.cuh helpers on the host."""

from __future__ import annotations

import math
import subprocess

import pytest

from tilekit.codegen.emulate import find_cxx, host_program
from tilekit.codegen.values import (ValueCompiler, index_expr, literal, pad_literal,
                                    store_value)
from tilekit.errors import UnsupportedError
from tilekit.expr import parse, parse_index
from tilekit.tile import expr as tx
from tilekit.tile.cpp import CppPrinter
from tilekit.tile.cuda import CudaPrinter
from tilekit.tile.emit import Emitter
from tilekit.tile.expr import KIND_DTYPE, Var
from tilekit.tile.nodes import Kernel, Seq

PRINTER = CudaPrinter(Kernel("k", (), (), Seq(()), 1, 1))


def c(e) -> str:
    return PRINTER.expr(e)


def body(text: str):
    return parse(f"out[i] = {text}").body


def compile_value(text: str, kinds=None):
    kinds = kinds or {}
    axis = {"i": Var("a_i", "int32"), "j": Var("a_j", "int32")}
    comp = ValueCompiler(axis, lambda t: kinds.get(t, "f"),
                         lambda n: Var(f"{n.tensor}_v", KIND_DTYPE[kinds.get(n.tensor, "f")]))
    return c(comp.emit(body(text)))


def test_emitter_blocks_and_temporaries():
    e = Emitter()
    with e.block("if (x)"):
        name = e.let("int", "t", "1")
        e.line(f"y = {name};")
    assert e.tmp("t") == "t1"
    assert e.text() == "if (x) {\n  const int t0 = 1;\n  y = t0;\n}\n"


def test_linear_forms():
    a, b = Var("a", "int32"), Var("b", "int32")
    assert c(tx.linear([(1, a), (-2, b)], 3)) == "a - 2 * b + 3"
    assert c(tx.linear([(-1, a)], -4)) == "-a - 4"
    assert c(tx.linear([], 0)) == "0"
    assert c(tx.linear([(0, a)], 5)) == "5"


def test_index_code_affine_and_floor_semantics():
    h, kh, cc = Var("a_h", "int32"), Var("a_kh", "int32"), Var("a_c", "int32")
    assert c(index_expr(parse_index("h*2 + kh - 3"), {"h": h, "kh": kh})) == \
        "2 * a_h + a_kh - 3"
    # Non-negative numerator (proved by intervals): plain C division.
    ranges = {"h": (0, 31)}
    assert c(index_expr(parse_index("c*4 + h // 8"), {"c": cc, "h": h},
                        {**ranges, "c": (0, 2)})) == "4 * a_c + a_h / 8"
    # Possibly negative: floor helpers.
    assert "tk_floordiv" in c(index_expr(parse_index("(h - 5) // 2"), {"h": h}, ranges))
    assert "tk_floormod" in c(index_expr(parse_index("(h - 5) % 3"), {"h": h}, ranges))


def test_literals_and_pads():
    assert c(literal(1e-05, "f")) == "1e-05f"
    assert c(literal(2, "f")) == "2.0f" and c(literal(2, "d")) == "2.0"
    assert c(literal(-math.inf, "f")) == "(-TK_INF)"
    assert c(literal(math.nan, "f")) == "TK_NAN"
    assert c(literal(True, "b")) == "true"
    assert c(pad_literal("-inf", "float32")) == "(-TK_INF)"
    assert c(pad_literal("-inf", "int32")) == "-2147483648LL"    # integers compute in 64 bits
    assert c(pad_literal("inf", "uint8")) == "255LL"
    assert c(pad_literal("inf", "bool")) == "true"
    assert c(pad_literal(None, "float32")) == "0.0f"


def test_value_kinds_follow_the_operands():
    assert compile_value("x[i] * 2") == "x_v * 2.0f"               # int literal in float code
    assert compile_value("x[i] + i") == "x_v + ((float)(a_i))"     # axis value as float
    assert compile_value("i / 2") == "((float)(a_i)) / 2.0f"       # true division
    assert compile_value("i // 2") == "tk_floordiv(((long long)(a_i)), 2LL)"
    assert compile_value("max(x[i], 0.0)") == "tk_max_c(x_v, 0.0f)"   # a constant bound
    assert compile_value("min(x[i], 6.0)") == "tk_min_c(x_v, 6.0f)"
    assert compile_value("max(x[i], y[i])") == "tk_max(x_v, y_v)"
    assert compile_value("max(0.0, x[i])") == "tk_max(0.0f, x_v)"
    assert compile_value("max(x[i], nan)") == "tk_max(x_v, TK_NAN)"
    assert compile_value("select(j <= i, x[i], -inf)") == "(a_j <= a_i ? x_v : (-TK_INF))"
    assert compile_value("exp(x[i]) + erf(x[i])") == "expf(x_v) + erff(x_v)"
    assert compile_value("x[i] > 0.0") == "x_v > 0.0f"
    assert compile_value("x[i] * y[i]", {"y": "d"}) == "((double)(x_v)) * y_v"
    assert compile_value("sigmoid(x[i])") == "tk_sigmoid(x_v)"
    assert compile_value("rsqrt(x[i] + 1e-05)") == "rsqrtf(x_v + 1e-05f)"
    assert compile_value("x[i] - (x[i] - 1.0)") == "x_v - (x_v - 1.0f)"   # right operand kept


def test_the_cpu_printer_divides_by_a_constant_as_a_product():
    """The C++ printer multiplies by a constant divisor's reciprocal (a vector division takes
    10-20 cycles), where that reciprocal is a normal number; the CUDA printer divides."""
    cpu = CppPrinter(Kernel("k", (), (), Seq(()), 1, 1))
    x = Var("x", "float32")

    def div(rhs, dtype="float32"):
        return cpu.expr(tx.Binary("/", Var("x", dtype), rhs, dtype))

    assert div(tx.const(2.0, "float32")) == "x * 0.5f"
    assert div(tx.const(1.4142135, "float32")) == "x * 0.7071068286895752f"
    assert div(tx.const(4.0, "float64"), "float64") == "x * 0.25"
    assert div(tx.const(0.0, "float32")) == "x / 0.0f"        # no reciprocal
    assert div(tx.const(1e-39, "float32")) == "x / 1e-39f"    # 1e39 is not a float32
    assert div(Var("y", "float32")) == "x / y"
    assert c(tx.Binary("/", x, tx.const(2.0, "float32"), "float32")) == "x / 2.0f"


def test_casts():
    assert compile_value("int32(x[i] * 4.0)") == "((long long)(((int)(x_v * 4.0f))))"
    assert compile_value("float16(x[i])") == "__half2float(__float2half_rn(x_v))"
    assert compile_value("bool(x[i])") == "x_v != 0.0f"
    v = Var("v", "float32")
    assert c(store_value(v, "int32")) == "((int)(v))"
    assert c(store_value(v, "float16")) == "__float2half_rn(v)"
    assert c(store_value(v, "float32")) == "v"


def test_unknown_function_is_reported():
    from tilekit.expr.ast import Call, Num
    comp = ValueCompiler({}, lambda t: "f", lambda n: Var("x", "float32"))
    with pytest.raises(UnsupportedError, match="has no kernel translation"):
        comp.emit(Call("frobnicate", (Num(1.0),)))


HOST_CHECK = r"""
#include <cstdio>
#include <cstring>
int main() {
  const int as[] = {-7, -6, -1, 0, 1, 5, 6, 7};
  const int bs[] = {1, 2, 3, 4};
  for (int a : as) for (int b : bs)
    std::printf("%d %d %d %d %lld %lld\n", a, b, tk_floordiv(a, b), tk_floormod(a, b),
                tk_floordiv((long long)a, (long long)b), tk_floormod((long long)a, (long long)b));
  std::printf("mod %g %g\n", tk_floormod(-7.5f, 2.0f), tk_floormod(7.5f, -2.0f));
  std::printf("nan %d %d %d\n", (int)isnan(tk_max(TK_NAN, 1.0f)), (int)isnan(tk_max(1.0f, TK_NAN)),
              (int)isnan(tk_min(TK_NAN, 1.0f)));
  // max and min against a constant bound (tk_max_c, tk_min_c): the same bits as the general
  // form for every value and bound, signed zeros and NaN included
  const float vs[] = {TK_NAN, -TK_INF, -6.5f, -1.0f, -0.0f, 0.0f, 1e-39f, 1.0f, 6.0f, 7.0f,
                      TK_INF};
  const float cs[] = {-TK_INF, -1.0f, -0.0f, 0.0f, 6.0f, TK_INF};
  int differ = 0;
  for (float v : vs) for (float c : cs) {
    const float m[4] = {tk_max(v, c), tk_max_c(v, c), tk_min(v, c), tk_min_c(v, c)};
    unsigned bits[4];
    std::memcpy(bits, m, sizeof bits);
    differ += (bits[0] != bits[1]) + (bits[2] != bits[3]);
  }
  std::printf("bounds differ %d\n", differ);
  std::printf("sig %.7f %.7f\n", tk_sigmoid(-100.0f), tk_sigmoid(3.0f));
  std::printf("sign %g %g %g\n", tk_sign(-2.0f), tk_sign(0.0f), tk_sign(5.0f));
  std::printf("in %d %d %d\n", (int)tk_in(-1, 4), (int)tk_in(3, 4), (int)tk_in(4, 4));
  return 0;
}
"""


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
def test_runtime_helpers_on_the_host(tmp_path):
    """runtime.cuh's floor division/modulo match Python; max/min propagate NaN like NumPy,
    and against a constant bound (tk_max_c, tk_min_c) give the general form's bits."""
    src = tmp_path / "check.cpp"
    src.write_text('#include "runtime.cuh"\n' + HOST_CHECK)
    exe = tmp_path / "check"
    host_program(src, exe)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    for line in lines:
        if line[0] in "-0123456789":
            a, b, q, r, q64, r64 = map(int, line.split())
            assert (q, r, q64, r64) == (a // b, a % b, a // b, a % b), line
    assert "mod 0.5 -0.5" in out
    assert "nan 1 1 1" in out
    assert "bounds differ 0" in out
    assert "sig 0.0000000 0.9525741" in out
    assert "sign -1 0 1" in out
    assert "in 0 1 0" in out
