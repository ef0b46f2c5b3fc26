"""Multi-stage pipelining: a `pipelined` loop's copies run `stages - 1` iterations ahead.

Before (the builder's form), iteration `s` copies its own tiles into stage buffer `s % S`
and computes on them:

    for s in pipelined(n, stages=S):
        <lets of s>; copy ... -> buf[s % S]; ...      the loop's head: scalars and copies
        <compute on buf[s % S]>                        the rest

After:

    for s0 in [0, S - 1):                              prologue: the first S - 1 steps
        if s0 < n: <lets of s0>; copies of s0
        commit                                         (asynchronous copies only)
    for s in [0, n):
        wait until at most S - 2 groups are in flight  (asynchronous copies only)
        barrier                                        step s has landed for every thread;
                                                       step s - 1's buffer is free
        if s + S - 1 < n: <lets of s + S - 1>; copies of s + S - 1
        commit
        <compute on buf[s % S]>

Synchronous copies (element by element) take the same places: the barrier at the top of an
iteration orders them after the compute that read the buffer they overwrite. The head must
not define anything the compute reads (the compute reads the stage buffer only).
"""

from __future__ import annotations

from dataclasses import replace

from tilekit.errors import InternalError
from tilekit.tile import expr as tx
from tilekit.tile.expr import Var
from tilekit.tile.nodes import (Assign, Barrier, Comment, Copy, Decl, Evaluate, For, If,
                                Kernel, Let, Seq, Stmt, Threads, seq, transform)
from tilekit.tile.rewrite import substitute_stmt


def pipeline(k: Kernel) -> Kernel:
    """Every `pipelined` loop of `k` in the form of the module docstring."""
    def visit(s: Stmt) -> Stmt:
        if isinstance(s, For) and s.kind == "pipelined":
            return pipelined(s, k.threads)
        return s
    return replace(k, body=transform(k.body, visit))


def pipelined(loop: For, threads: int) -> Stmt:
    stages = loop.stages
    if stages < 2:
        raise InternalError(f"pipelined loop {loop.var.name} with {stages} stage(s)")
    body = loop.body.body if isinstance(loop.body, Seq) and not loop.body.scoped \
        else (loop.body,)
    n = 0
    while n < len(body) and isinstance(body[n], (Let, Decl, Assign, Copy, Comment)):
        n += 1
    head, compute = body[:n], body[n:]
    if not any(isinstance(x, Copy) for x in head):
        raise InternalError(f"pipelined loop {loop.var.name} starts with no copy")
    asynchronous = any(isinstance(x, Copy) and x.asynchronous for x in head)
    s, stop = loop.var, loop.stop
    tid = Var(f"{s.name}_t", "int32")

    def in_threads(call: str, *args) -> Stmt:
        return Threads(tid, threads, Evaluate(tx.call(call, *args)))

    def issue(at) -> Stmt:
        return seq(*(substitute_stmt(x, {s.name: at}) for x in head))

    commit = in_threads("cp_async_commit") if asynchronous else None
    first = Var(f"{s.name}_0", s.dtype)
    prologue = For(first, tx.const(0, s.dtype), tx.const(stages - 1, s.dtype),
                   seq(If(tx.lt(first, stop), issue(first)), commit))
    ahead = tx.add(s, stages - 1)
    steady = For(s, loop.start, stop, seq(
        in_threads("cp_async_wait", tx.const(stages - 2)) if asynchronous else None,
        Barrier(),
        If(tx.lt(ahead, stop), issue(ahead)),
        commit,
        *compute), loop.step)
    return seq(prologue, steady)


__all__ = ["pipeline", "pipelined"]
