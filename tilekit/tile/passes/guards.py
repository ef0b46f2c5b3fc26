"""Index-set splitting: guards out of the interior of vector loops (the CPU lowering).

A `simd` loop over `v` whose body guards reads with `in_range(e, n)` (a convolution's
padding: `0 <= w + kw - 1 < 56`), where `e` is `s * v + rest` for a positive constant `s` (a
strided window: `2 * w + kw`) and `rest` and `n` do not change in the loop, holds every such
guard exactly on one interval of `v`: `[-rest, n - rest)`, or `[ceil(-rest / s),
ceil((n - rest) / s))`. The pass
runs the loop as three, over the iterations before the interval where all guards hold, the
interior (the guards replaced by `true`, so its reads are plain vector loads instead of masked
ones or gathers), and the rest:

    for v in simd(start, stop): B
      ->
    let lo = min(max(max(-rest_1, ...), start), stop)
    let hi = max(min(min(n_1 - rest_1, ...), stop), lo)
    for v in serial(start, lo): B
    for v in simd(lo, hi): B[in_range(...) := true]
    for v in serial(hi, stop): B

The edges are a few iterations (a window's overhang) and stay serial, which also makes the
pass idempotent: no `simd` loop it leaves has a guard it could split.

Values defined inside the body (`let a_w = j0 + v`) are followed when reading `e`. Guards
with a coefficient that is not a positive constant, or on values the body computes otherwise,
stay where they are.
"""

from __future__ import annotations

from dataclasses import replace

from tilekit.tile import expr as tx
from tilekit.tile.expr import Call, Const, Expr, Var
from tilekit.tile.nodes import Decl, For, Kernel, Let, Seq, Stmt, exprs, transform, walk
from tilekit.tile.passes.copies import affine
from tilekit.tile.rewrite import map_exprs, substitute


def split_guards(k: Kernel) -> Kernel:
    """`k` with its guarded `simd` loops split (module docstring)."""
    names = _Names(k)
    return replace(k, body=transform(k.body, lambda s: _split(s, names) or s))


class _Names:
    """Fresh names for the bounds (the pass may run on a program that has `lo_0`)."""

    def __init__(self, k: Kernel) -> None:
        self.taken = {d.var.name for d in walk(k.body) if isinstance(d, (Let, Decl))}
        self.taken |= {d.var.name for d in walk(k.body) if isinstance(d, For)}

    def fresh(self, prefix: str) -> str:
        n = 0
        while f"{prefix}{n}" in self.taken:
            n += 1
        self.taken.add(f"{prefix}{n}")
        return f"{prefix}{n}"


def _split(s: Stmt, names: _Names) -> Stmt | None:
    if not (isinstance(s, For) and s.kind == "simd" and isinstance(s.step, Const)
            and s.step.value == 1):
        return None
    v = s.var
    lets: dict[str, Expr] = {}
    inside: set[str] = set()
    for x in walk(s.body):
        if isinstance(x, Let):
            lets[x.var.name] = x.value
        if isinstance(x, (Let, Decl)):
            inside.add(x.var.name)
        if isinstance(x, For):
            inside.add(x.var.name)
    assigned = {x.var.name for x in walk(s.body) if isinstance(x, Decl)}

    def expand(e: Expr, depth: int = 0) -> Expr:
        if depth > 32:
            return e
        env = {n: expand(val, depth + 1) for n, val in lets.items()
               if n not in assigned and n in tx.free_vars(e)}
        return substitute(e, env) if env else e

    guards: dict[Call, tuple[Expr, Expr]] = {}
    for x in walk(s.body):
        for e in exprs(x):
            for call in _in_range_calls(e):
                bound = _interval(call, v, expand, inside)
                if bound is not None:
                    guards[call] = bound
    if not guards:
        return None
    dtype = v.dtype
    lows = [lo for lo, _ in guards.values()]
    highs = [hi for _, hi in guards.values()]
    lo_e = _fold("max", lows + [s.start], dtype)
    lo_e = tx.call("min", lo_e, s.stop)
    lo = Var(names.fresh(f"{v.name}_lo"), dtype)
    hi_e = tx.call("max", tx.call("min", _fold("min", highs, dtype), s.stop), lo)
    hi = Var(names.fresh(f"{v.name}_hi"), dtype)
    inner = map_exprs_deep(s.body, lambda e: tx.const(True) if e in guards else e)
    return Seq((Let(lo, lo_e), Let(hi, hi_e),
                replace(s, stop=lo, kind="serial"),
                replace(s, start=lo, stop=hi, body=inner),
                replace(s, start=hi, kind="serial")))


def _fold(fn: str, xs: list[Expr], dtype: str) -> Expr:
    out = tx.cast(dtype, xs[0])
    for x in xs[1:]:
        out = tx.call(fn, out, tx.cast(dtype, x))
    return out


def _in_range_calls(e: Expr) -> list[Call]:
    out = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Call) and x.fn == "in_range":
            out.append(x)
        stack.extend(tx.children(x))
    return out


def _interval(call: Call, v: Var, expand, inside: set[str]) -> tuple[Expr, Expr] | None:
    """[lo, hi) of `v` where the guard holds, or None when it is not `v + invariant`."""
    index, bound = call.args
    form = affine(expand(index))
    if form is None:
        return None
    coefs, vars_, const = form
    step = coefs.get(v.name)
    if not isinstance(step, int) or step < 1:
        return None
    rest = [(c, vars_[n]) for n, c in coefs.items() if n != v.name and c]
    if any(n in inside for n, c in coefs.items() if n != v.name and c):
        return None
    if tx.free_vars(bound) & inside:
        return None
    rest_e = tx.linear(rest, const, v.dtype)
    if step == 1:
        return tx.neg(rest_e), tx.sub(tx.cast(v.dtype, bound), rest_e)
    # 0 <= step * v + rest < n  <=>  ceil(-rest / step) <= v < ceil((n - rest) / step),
    # with ceil(a / s) = -floordiv(-a, s)
    return (tx.neg(tx.call("floordiv", rest_e, tx.const(step, v.dtype))),
            tx.neg(tx.call("floordiv", tx.sub(rest_e, tx.cast(v.dtype, bound)),
                           tx.const(step, v.dtype))))


def map_exprs_deep(s: Stmt, fn) -> Stmt:
    """`fn` on every expression of `s` and of everything under it."""
    return transform(s, lambda x: map_exprs(x, fn))


__all__ = ["split_guards"]
