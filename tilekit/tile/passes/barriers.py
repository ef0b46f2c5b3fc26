"""Barriers: drop the ones that synchronise nothing new.

A builder puts a barrier wherever its own step needs one (after a stage, after the partials
of a pass are read); composed, two can meet with nothing between them. A barrier is dropped
when the statement before it, ignoring comments, already ends with a barrier on every path:
another barrier, or a loop whose body ends with one and that runs at least once (constant
bounds). Nothing between two such barriers touches memory, so every thread arrives at the
second in the state it left the first.
"""

from __future__ import annotations

from dataclasses import replace

from tilekit.tile.expr import Const
from tilekit.tile.nodes import Barrier, Comment, For, Kernel, Seq, Stmt, transform


def ends_with_barrier(s: Stmt) -> bool:
    if isinstance(s, Barrier):
        return True
    if isinstance(s, Seq):
        rest = [x for x in s.body if not isinstance(x, Comment)]
        return bool(rest) and ends_with_barrier(rest[-1])
    if isinstance(s, For) and isinstance(s.start, Const) and isinstance(s.stop, Const):
        return int(s.stop.value) > int(s.start.value) and ends_with_barrier(s.body)
    return False


def drop_redundant_barriers(k: Kernel) -> Kernel:
    """`k` without barriers that follow one (module docstring)."""
    def visit(s: Stmt) -> Stmt:
        if not isinstance(s, Seq):
            return s
        out: list[Stmt] = []
        for x in s.body:
            if isinstance(x, Barrier):
                before = [y for y in out if not isinstance(y, Comment)]
                if before and ends_with_barrier(before[-1]):
                    continue
            out.append(x)
        return s if len(out) == len(s.body) else replace(s, body=tuple(out))
    return replace(k, body=transform(k.body, visit))


__all__ = ["drop_redundant_barriers", "ends_with_barrier"]
