"""Threads on a CPU: a block's threads run one after another (the CPU lowering).

A CPU runs a block as one task: each thread region becomes a serial loop over the block's
threads, in order, and the barriers between regions have nothing left to order (a region
ends for every thread before the next begins). What a thread keeps across regions (a local
buffer declared at block level: the accumulators of a register tile across reduction steps)
gets one copy per thread, indexed by the thread. Warp collectives (shuffles, tensor-core
instructions) have no serial form: a program for the CPU is built without them, and meeting
one here is a bug of its builder.
"""

from __future__ import annotations

from dataclasses import replace

from tilekit.errors import InternalError
from tilekit.tile import expr as tx
from tilekit.tile.expr import Addr, Call, Expr, Load, Var, children as expr_children
from tilekit.tile.functions import WARP_COLLECTIVES, function
from tilekit.tile.nodes import (Alloc, Barrier, Buffer, For, Kernel, Seq, Stmt, Store, Threads,
                                exprs, transform, walk)
from tilekit.tile.rewrite import map_exprs


def shared_locals(k: Kernel) -> set[str]:
    """Local buffers declared outside every thread region (per-thread state across them)."""
    inside: set[str] = set()
    for s in walk(k.body):
        if isinstance(s, Threads):
            inside |= {x.buffer.name for x in walk(s.body) if isinstance(x, Alloc)}
    return {s.buffer.name for s in walk(k.body) if isinstance(s, Alloc)} - inside


def serialize_threads(k: Kernel) -> Kernel:
    """`k` with every thread region a serial loop over its threads (module docstring); a
    kernel without regions (serialized already) is returned as it is."""
    if not any(isinstance(s, Threads) for s in walk(k.body)):
        return k
    for s in walk(k.body):
        for e in exprs(s):
            _check_serial(e, k)
    expand = shared_locals(k)
    threads = k.threads

    def index(var: Var):
        def rewrite(e: Expr) -> Expr:
            if isinstance(e, (Load, Addr)) and e.buffer in expand:
                return replace(e, index=(var,) + e.index)
            return e
        return rewrite

    def visit(s: Stmt) -> Stmt:
        if isinstance(s, Seq) and any(isinstance(x, Barrier) for x in s.body):
            return replace(s, body=tuple(x for x in s.body if not isinstance(x, Barrier)))
        if isinstance(s, Alloc) and s.buffer.name in expand:
            b = s.buffer
            return Alloc(replace(b, shape=(threads,) + b.shape))
        if isinstance(s, Threads):
            body = s.body
            if expand:
                body = _per_thread(body, s.var, expand, index(s.var))
            return For(s.var, tx.const(0), tx.const(s.count), body)
        return s
    body = transform(k.body, visit)
    # a barrier that is a loop's or a branch's whole body: nothing left
    body = transform(body, lambda s: Seq(()) if isinstance(s, Barrier) else s)
    return replace(k, body=body)


def _per_thread(body: Stmt, var: Var, expand: set[str], rewrite) -> Stmt:
    def visit(s: Stmt) -> Stmt:
        s = map_exprs(s, rewrite)
        if isinstance(s, Store) and s.buffer in expand:
            s = replace(s, index=(var,) + s.index)
        return s
    return transform(body, visit)


def _check_serial(e: Expr, k: Kernel) -> None:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Call) and (x.fn in WARP_COLLECTIVES or (
                function(x.fn).gpu_only and x.fn != "grid_sync")):
            raise InternalError(f"tile program {k.name}: {x.fn} has no serial form on a CPU")
        stack.extend(expr_children(x))


__all__ = ["serialize_threads", "shared_locals"]
