"""Contractions: MatMul (batched, broadcast, 1-D operands), Gemm, Einsum.

Each is one `+=` statement over the contracted axis `k`; Gemm's bias (and alpha/beta when
there is a bias) is a second elementwise statement.
"""

from __future__ import annotations

import re

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext
from tilekit.onnx.converters.registry import converter


@converter("MatMul", summary="y[b.., i, j] += a[b.., i, k] * b[b.., k, j]")
def matmul(ctx: NodeContext) -> None:
    a, b, out = ctx.input(0), ctx.input(1), ctx.output(0)
    if a.rank == 0 or b.rank == 0:
        raise ctx.unsupported("scalar operands")
    batch = out.rank - (a.rank > 1) - (b.rank > 1)
    bax = ["b"] if batch == 1 else text.axes(batch, "b")
    out_ax = bax + (["i"] if a.rank > 1 else []) + (["j"] if b.rank > 1 else [])
    batch_shape = out.shape[:batch]

    def batch_idx(shape) -> list[str]:
        return text.broadcast_indices(shape, bax, batch_shape) if shape else []

    ai = (batch_idx(a.shape[:-2]) + ["i", "k"]) if a.rank > 1 else ["k"]
    bi = (batch_idx(b.shape[:-2]) + ["k", "j"]) if b.rank > 1 else ["k"]
    ctx.assign(out, out_ax, "+=", f"{ctx.access(a, ai)} * {ctx.access(b, bi)}")


@converter("Gemm", ignore=("broadcast",),
           summary="t[i, j] += a[i, k] * b[k, j]; y = alpha*t + beta*c")
def gemm(ctx: NodeContext) -> None:
    a, b, c, out = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    ai = ["k", "i"] if ctx.flag("transA", 0) else ["i", "k"]
    bi = ["j", "k"] if ctx.flag("transB", 0) else ["k", "j"]
    if a.rank != 2 or b.rank != 2:
        raise ctx.unsupported(f"operands of rank {a.rank} and {b.rank} (Gemm needs 2-D)")
    product = f"{ctx.access(a, ai)} * {ctx.access(b, bi)}"
    ax = ["i", "j"]
    if c is None or beta == 0.0:
        if alpha != 1.0:
            product += f" * {text.literal(alpha, out.dtype)}"
        ctx.assign(out, ax, "+=", product)
        return
    acc = ctx.temp("mm", out.shape, out.dtype)
    ctx.assign(acc, ax, "+=", product, step="mm")
    t = ctx.access(acc, ax)
    if alpha != 1.0:
        t = f"{t} * {text.literal(alpha, out.dtype)}"
    cr = ctx.read(c, ax, out.shape)
    if beta != 1.0:
        cr = f"{cr} * {text.literal(beta, out.dtype)}"
    ctx.assign(out, ax, "=", f"{t} + {cr}")


@converter("Einsum", summary="one statement: the product of the operands, summed over the "
                             "letters not in the output")
def einsum(ctx: NodeContext) -> None:
    equation = ctx.attr("equation").replace(" ", "")
    inputs, out = ctx.inputs(), ctx.output(0)
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(inputs):
        raise ctx.unsupported(f"equation '{equation}' names {len(terms)} operands, "
                              f"the node has {len(inputs)}")

    def axis(letter: str) -> str:
        return letter if letter.islower() else letter.lower() * 2

    ell_rank = max((v.rank - len(t.replace("...", "")) for t, v in zip(terms, inputs)
                    if "..." in t), default=0)
    ell = text.axes(ell_rank, "e")
    if not arrow:
        letters = re.sub(r"[^A-Za-z]", "", lhs)
        rhs = ("..." if ell_rank else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1))
    out_ax = []
    for part in re.findall(r"\.\.\.|[A-Za-z]", rhs):
        out_ax.extend(ell if part == "..." else [axis(part)])
    if len(out_ax) != out.rank:
        raise ctx.unsupported(f"equation '{equation}' does not match the output rank")
    ell_shape = out.shape[out_ax.index(ell[0]):out_ax.index(ell[0]) + ell_rank] if ell else ()
    factors = []
    for term, v in zip(terms, inputs):
        idx: list[str] = []
        parts = re.findall(r"\.\.\.|[A-Za-z]", term)
        for part in parts:
            if part == "...":
                n = v.rank - (len(parts) - 1)
                start = len(idx)
                idx.extend(text.broadcast_indices(v.shape[start:start + n], ell, ell_shape))
            else:
                idx.append(axis(part))
        factors.append(ctx.access(v, idx))
    reduces = set(re.sub(r"[^A-Za-z]", "", lhs)) - set(re.sub(r"[^A-Za-z]", "", rhs))
    ctx.assign(out, out_ax, "+=" if reduces else "=", " * ".join(factors))
