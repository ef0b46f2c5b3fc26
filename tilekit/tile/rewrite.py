"""Rewriting expressions inside tile programs: a function applied to every node, bottom up,
and variables replaced by expressions (a pass that duplicates a loop body for another
iteration, or gives each thread its own copy of a buffer, uses them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping

from tilekit.tile import expr as tx
from tilekit.tile.expr import (Addr, Binary, Call, Cast, Expr, Load, Select, Unary, Var)
from tilekit.tile.nodes import (Assign, CallBody, Copy, Decl, Evaluate, For, If, Let, Stmt,
                                Store, Switch, While, children, rebuild)


def map_expr(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """`fn` applied to every node of `e` after its children were rewritten (constructors
    simplify as they rebuild)."""
    if isinstance(e, Binary):
        e = tx.binary(e.op, map_expr(e.lhs, fn), map_expr(e.rhs, fn), e.dtype)
    elif isinstance(e, Unary):
        arg = map_expr(e.arg, fn)
        e = e if arg is e.arg else replace(e, arg=arg)
    elif isinstance(e, Cast):
        e = tx.cast(e.dtype, map_expr(e.arg, fn))
    elif isinstance(e, Select):
        e = tx.select(map_expr(e.cond, fn), map_expr(e.then, fn), map_expr(e.other, fn))
    elif isinstance(e, Call):
        e = replace(e, args=tuple(map_expr(a, fn) for a in e.args))
    elif isinstance(e, (Load, Addr)):
        e = replace(e, index=tuple(map_expr(i, fn) for i in e.index))
    return fn(e)


def map_exprs(s: Stmt, fn: Callable[[Expr], Expr]) -> Stmt:
    """`s` with `map_expr(., fn)` applied to every expression it holds (not its children's
    statements)."""
    def sub(e: Expr) -> Expr:
        return map_expr(e, fn)

    if isinstance(s, Let):
        return replace(s, value=sub(s.value))
    if isinstance(s, Decl):
        return replace(s, init=None if s.init is None else sub(s.init))
    if isinstance(s, Assign):
        return replace(s, value=sub(s.value))
    if isinstance(s, Store):
        return replace(s, index=tuple(map(sub, s.index)), value=sub(s.value))
    if isinstance(s, Evaluate):
        return replace(s, call=sub(s.call))
    if isinstance(s, For):
        return replace(s, start=sub(s.start), stop=sub(s.stop), step=sub(s.step))
    if isinstance(s, (If, While)):
        return replace(s, cond=sub(s.cond))
    if isinstance(s, Switch):
        return replace(s, value=sub(s.value))
    if isinstance(s, CallBody):
        return replace(s, block=sub(s.block), nblocks=sub(s.nblocks))
    if isinstance(s, Copy):
        return replace(s, dst_prefix=tuple(map(sub, s.dst_prefix)), offset=sub(s.offset),
                       valid=sub(s.valid), pad=sub(s.pad))
    return s


def substitute(e: Expr, env: Mapping[str, Expr]) -> Expr:
    """`e` with every variable named in `env` replaced."""
    return map_expr(e, lambda x: env.get(x.name, x) if isinstance(x, Var) else x)


def substitute_stmt(s: Stmt, env: Mapping[str, Expr]) -> Stmt:
    """`s` and everything under it with the variables of `env` replaced."""
    s = map_exprs(s, lambda x: env.get(x.name, x) if isinstance(x, Var) else x)
    kids = children(s)
    if kids:
        s = rebuild(s, tuple(substitute_stmt(k, env) for k in kids))
    return s


__all__ = ["map_expr", "map_exprs", "substitute", "substitute_stmt"]
