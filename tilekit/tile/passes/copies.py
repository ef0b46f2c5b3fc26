"""Copies: proving the vector width of a copy, and lowering copies to the block's threads.

- `vectorize(k)`: a float32 copy moves 4 elements per 16-byte access when it can prove,
  from the program alone, that every 4-element chunk of the tile is contiguous in the
  source, starts at a multiple of 4 elements (so 16-byte aligned, tensor bases being
  allocation-aligned) and is wholly valid or wholly padding. The proof is a divisibility
  analysis of the block-level values (`Divisibility`: `o = b * 64` is a multiple of 64, a
  loop from 0 by 32 visits multiples of 32).
- `lower_copies(k)` (thread binding): a copy becomes a thread region in which thread `t`
  takes tile elements (or vector chunks) `t, t + T, t + 2T, ...` (a warp's accesses are
  consecutive: coalesced), with a constant, unrolled trip count when the threads divide the
  tile; each element is `valid ? src[offset] : pad`, or a `cp.async` of 16 bytes that
  zero-fills where invalid.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tilekit.tile import expr as tx
from tilekit.tile.expr import (Binary, Call, Cast, Const, Expr, Load, Var, Addr)
from tilekit.tile.nodes import (Copy, Evaluate, For, If, Kernel, Let, Seq, Stmt, Store,
                                Threads, seq, transform, walk)

#: Unroll a copy's per-thread loop when the threads divide the tile and it runs at most
#: this many times (the copies then issue back to back, their index math hoisted).
MAX_UNROLLED = 16


# -- divisibility and affine forms ------------------------------------------------------------

class Divisibility:
    """What every variable of a kernel is known to be a multiple of (0: always zero)."""

    def __init__(self, k: Kernel) -> None:
        self.known: dict[str, int] = {}
        for s in walk(k.body):
            if isinstance(s, Let):
                self.known[s.var.name] = self.of(s.value)
            elif isinstance(s, For):
                self.known[s.var.name] = math.gcd(self.of(s.start), self.of(s.step))

    def of(self, e: Expr) -> int:
        if isinstance(e, Const):
            return abs(int(e.value)) if e.dtype in tx.INT_DTYPES else 1
        if isinstance(e, Var):
            return self.known.get(e.name, 1)
        if isinstance(e, Cast) and e.dtype in tx.INT_DTYPES and e.arg.dtype in tx.INT_DTYPES:
            return self.of(e.arg)
        if isinstance(e, Binary):
            if e.op in ("+", "-"):
                return math.gcd(self.of(e.lhs), self.of(e.rhs))
            if e.op == "*":
                return self.of(e.lhs) * self.of(e.rhs)
        return 1


def affine(e: Expr) -> tuple[dict[str, int], dict[str, Var], int] | None:
    """`e` as sum(coef * var) + const ({name: coef}, {name: var}, const), or None."""
    if isinstance(e, Const):
        return ({}, {}, int(e.value)) if e.dtype in tx.INT_DTYPES else None
    if isinstance(e, Var):
        return {e.name: 1}, {e.name: e}, 0
    if isinstance(e, Cast) and e.dtype in tx.INT_DTYPES and e.arg.dtype in tx.INT_DTYPES:
        return affine(e.arg)
    if isinstance(e, Binary) and e.op in ("+", "-"):
        a, b = affine(e.lhs), affine(e.rhs)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "+" else -1
        coefs = dict(a[0])
        for n, c in b[0].items():
            coefs[n] = coefs.get(n, 0) + sign * c
        return coefs, {**a[1], **b[1]}, a[2] + sign * b[2]
    if isinstance(e, Binary) and e.op == "*":
        a, b = affine(e.lhs), affine(e.rhs)
        if a is None or b is None:
            return None
        if not a[0]:
            a, b = b, a
        if b[0]:
            return None           # a product of two variables
        return {n: c * b[2] for n, c in a[0].items()}, a[1], a[2] * b[2]
    return None


def _chunk_aligned(e: Expr, inner: str, width: int, div: Divisibility,
                   local: set[str]) -> bool:
    """`e` is affine with coefficient 1 on `inner` and a multiple of `width` when `inner`
    is a multiple of `width`, for every value of everything else."""
    form = affine(e)
    if form is None:
        return False
    coefs, vars_, const = form
    if coefs.get(inner) != 1 or const % width:
        return False
    for name, coef in coefs.items():
        if name == inner:
            continue
        base = 1 if name in local else div.of(vars_[name])
        if (coef * base) % width:
            return False
    return True


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "&&":
        return _terms(e.lhs) + _terms(e.rhs)
    return [e]


def _uniform_per_chunk(valid: Expr, inner: str, width: int, div: Divisibility,
                       local: set[str]) -> bool:
    """Every term of `valid` that depends on `inner` is a bound `0 <= x < n` (or `x < n`)
    with `x` chunk-aligned and `n` a multiple of `width`: a chunk is wholly in or out."""
    for term in _terms(valid):
        if inner not in tx.free_vars(term):
            continue
        if isinstance(term, Call) and term.fn == "in_range":
            x, n = term.args
        elif isinstance(term, Binary) and term.op == "<":
            x, n = term.lhs, term.rhs
        else:
            return False
        if not (isinstance(n, Const) and int(n.value) % width == 0):
            return False
        if not _chunk_aligned(x, inner, width, div, local):
            return False
    return True


def vector_width(c: Copy, k: Kernel, div: Divisibility) -> int:
    """4 when the copy's float32 chunks of 4 are provably contiguous, aligned and wholly
    valid or padding (module docstring); else 1."""
    dst = k.buffer(c.dst)
    src = k.buffer(c.src)
    if c.asynchronous or dst.dtype != "float32" or src.dtype != "float32" or not c.local \
            or not isinstance(c.pad, Const):
        return 1
    tile = dst.shape[len(c.dst_prefix):]
    if tile[-1] % 4 or dst.layout.row_length(dst.shape) % 4 or dst.layout.swizzle:
        return 1
    inner = c.local[-1].name
    local = {v.name for v in c.local}
    if not _chunk_aligned(c.offset, inner, 4, div, local):
        return 1
    if not _uniform_per_chunk(c.valid, inner, 4, div, local):
        return 1
    return 4


def vectorize(k: Kernel) -> Kernel:
    """Every copy with its provable vector width (module docstring)."""
    div = Divisibility(k)

    def visit(s: Stmt) -> Stmt:
        if isinstance(s, Copy) and s.vector == 1:
            width = vector_width(s, k, div)
            if width > 1:
                return replace(s, vector=width)
        return s
    return replace(k, body=transform(k.body, visit))


# -- thread binding -------------------------------------------------------------------------

def lower_copies(k: Kernel) -> Kernel:
    """Every copy as a thread region over its tile (module docstring)."""
    def visit(s: Stmt) -> Stmt:
        return lower_copy(s, k) if isinstance(s, Copy) else s
    return replace(k, body=transform(k.body, visit))


def lower_copy(c: Copy, k: Kernel) -> Stmt:
    dst = k.buffer(c.dst)
    src = k.buffer(c.src)
    tile = list(dst.shape[len(c.dst_prefix):])
    width = 16 // tx.ITEMSIZE[dst.dtype] if c.asynchronous else c.vector
    chunks = tile[:-1] + [tile[-1] // width]
    count = math.prod(chunks)
    threads = k.threads
    stem = c.local[-1].name
    tid = Var(f"{stem}_t", "int32")
    body: list[Stmt] = []
    i = Var(f"{stem}_i", "int32")
    if count <= threads:
        # one chunk or none per thread
        body.append(Let(i, tid))
        element = seq(*_element(c, dst, i, chunks, width))
        body.append(element if count == threads else If(tx.lt(i, count), element))
    elif count % threads == 0 and count // threads <= MAX_UNROLLED:
        it = Var(f"{stem}_it", "int32")
        inner = seq(Let(i, tx.add(tid, tx.mul(it, threads))), *_element(c, dst, i, chunks,
                                                                         width))
        body.append(For(it, tx.const(0), tx.const(count // threads), inner, kind="unroll"))
    else:
        body.append(For(i, tid, tx.const(count), seq(*_element(c, dst, i, chunks, width)),
                        tx.const(threads)))
    return Threads(tid, threads, seq(*body))


def _element(c: Copy, dst, i: Var, chunks: list[int], width: int) -> list[Stmt]:
    """The statements copying chunk `i` (row-major over `chunks`)."""
    out: list[Stmt] = []
    coords: list[Expr] = []
    for d in range(len(chunks)):
        stride = math.prod(chunks[d + 1:])
        x = tx.div(i, stride)
        coords.append(tx.mod(x, chunks[d]) if d > 0 else x)
    for v, x, d in zip(c.local, coords, range(len(chunks))):
        out.append(Let(v, tx.mul(x, width) if d == len(chunks) - 1 else x))
    index = tuple(c.dst_prefix) + tuple(c.local)
    if c.asynchronous:
        ok = Var(f"{c.local[-1].name}_ok", "bool")
        out.append(Let(ok, c.valid))
        at = tx.select(ok, c.offset, tx.const(0, c.offset.dtype))
        out.append(Evaluate(tx.call("cp_async16", Addr(c.dst, index), Addr(c.src, (at,)), ok)))
        return out
    if width == 4:
        value = tx.select(c.valid, Load(c.src, (c.offset,), "float4", 4),
                          Const(float(c.pad.value), "float4"))
        out.append(Store(c.dst, index, value, 4))
        return out
    value = tx.select(c.valid, Load(c.src, (c.offset,), dst.dtype), c.pad)
    out.append(Store(c.dst, index, value))
    return out


__all__ = ["Divisibility", "MAX_UNROLLED", "affine", "lower_copies", "lower_copy",
           "vector_width", "vectorize"]
