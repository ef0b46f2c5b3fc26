"""Building tile programs in Python: a small structured builder with fresh names.

    b = Builder()
    with b.threads(256) as tid:
        with b.loop("i", tid, n, step=256) as i:
            b.store("y", (i,), call("exp", load(x, i)))
    body = b.build()

Statements go into the innermost open block; `with` opens loops, branches, thread regions
and scopes; `let`/`decl` return the variable they declare. Names given with a trailing `_`
or through `fresh` get a number (`acc_` -> `acc_0`, `acc_1`), unique in the kernel; other
names are used as given (the caller keeps them unique where they meet).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from tilekit.tile.expr import Const, Expr, Load, Operand, Var, as_expr
from tilekit.tile.nodes import (SMEM_ALIGN, Alloc, Assign, Barrier, Buffer, Comment, Decl,
                                Evaluate, For, If, Layout, Let, Seq, Stmt, Store, Threads, seq)


class Names:
    """Fresh names, shared by every builder of one kernel."""

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        n = self._counters.get(prefix, 0)
        self._counters[prefix] = n + 1
        return f"{prefix}{n}"


class Builder:
    def __init__(self, names: Names | None = None) -> None:
        self.names = names or Names()
        self._blocks: list[list[Stmt]] = [[]]
        self._last_if: list[If | None] = [None]

    # -- naming ---------------------------------------------------------------------------
    def name(self, name: str) -> str:
        return self.names.fresh(name) if name.endswith("_") or not name else name

    def var(self, name: str, dtype: str = "int32") -> Var:
        return Var(self.name(name), dtype)

    # -- statements -----------------------------------------------------------------------
    def emit(self, stmt: Stmt | None) -> None:
        if stmt is None:
            return
        self._blocks[-1].append(stmt)
        self._last_if[-1] = stmt if isinstance(stmt, If) else None

    def comment(self, text: str) -> None:
        self.emit(Comment(text))

    def let(self, name: str, value: Operand, dtype: str | None = None) -> Var:
        value = as_expr(value, dtype)
        v = Var(self.name(name), dtype or value.dtype)
        if dtype is not None and value.dtype != dtype:
            from tilekit.tile.expr import cast
            value = cast(dtype, value)
        self.emit(Let(v, value))
        return v

    def decl(self, name: str, dtype: str, init: Operand | None = None) -> Var:
        v = Var(self.name(name), dtype)
        self.emit(Decl(v, None if init is None else as_expr(init, dtype)))
        return v

    def assign(self, var: Var, value: Operand) -> None:
        self.emit(Assign(var, as_expr(value, var.dtype)))

    def store(self, buffer: str | Buffer, index, value: Operand, lanes: int = 1) -> None:
        name = buffer.name if isinstance(buffer, Buffer) else buffer
        self.emit(Store(name, _index(index), as_expr(value), lanes))

    def evaluate(self, call: Expr) -> None:
        self.emit(Evaluate(call))

    def barrier(self) -> None:
        self.emit(Barrier())

    def alloc(self, name: str, dtype: str, shape: tuple[int, ...], comment: str = "") -> Buffer:
        buf = Buffer(self.name(name), "local", dtype, tuple(shape), comment=comment)
        self.emit(Alloc(buf))
        return buf

    # -- blocks ---------------------------------------------------------------------------
    def _open(self) -> None:
        self._blocks.append([])
        self._last_if.append(None)

    def _close(self) -> Stmt:
        body = self._blocks.pop()
        self._last_if.pop()
        return seq(*body) if body else Seq(())

    @contextmanager
    def loop(self, name: str, start: Operand, stop: Operand, step: Operand = 1,
             kind: str = "serial", dtype: str | None = None, stages: int = 0,
             unroll: int = 0) -> Iterator[Var]:
        start_e, stop_e = as_expr(start, dtype), as_expr(stop, dtype)
        dtype = dtype or _index_dtype(start_e, stop_e)
        v = Var(self.name(name), dtype)
        self._open()
        yield v
        body = self._close()
        self.emit(For(v, as_expr(start, dtype), as_expr(stop, dtype), body,
                      as_expr(step, dtype), kind, stages, unroll))

    @contextmanager
    def if_(self, cond: Operand) -> Iterator[None]:
        cond_e = as_expr(cond)
        if isinstance(cond_e, Const) and cond_e.value is True:
            yield       # statically true: the body without a branch
            return
        self._open()
        yield
        body = self._close()
        self.emit(If(cond_e, body))

    @contextmanager
    def else_(self) -> Iterator[None]:
        last = self._last_if[-1]
        if last is None or last.other is not None:
            raise ValueError("else_ without a preceding if_")
        self._open()
        yield
        other = self._close()
        self._blocks[-1][-1] = If(last.cond, last.then, other)
        self._last_if[-1] = None

    @contextmanager
    def threads(self, count: int, name: str = "tid") -> Iterator[Var]:
        v = Var(self.name(name), "int32")
        self._open()
        yield v
        self.emit(Threads(v, count, self._close()))

    @contextmanager
    def scope(self) -> Iterator[None]:
        self._open()
        yield
        body = self._close()
        self.emit(Seq(body.body if isinstance(body, Seq) else (body,), scoped=True))

    def build(self) -> Stmt:
        if len(self._blocks) != 1:
            raise ValueError("unclosed block")
        return seq(*self._blocks[0]) if self._blocks[0] else Seq(())


class SharedMemory:
    """One block's shared buffers, carved from one base: each after the ones before it,
    `SMEM_ALIGN`-aligned, or at byte `at` (a buffer placed by liveness, sharing bytes with
    one whose last reader ran before a barrier; the caller guarantees the lives are apart)."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []

    def carve(self, name: str, dtype: str, shape: tuple[int, ...], comment: str = "",
              layout: Layout = Layout(), at: int | None = None) -> Buffer:
        if any(b.name == name for b in self.buffers):
            raise ValueError(f"shared buffer {name!r} declared twice")
        if at is not None and at % SMEM_ALIGN:
            raise ValueError(f"shared buffer {name!r} at {at}, not {SMEM_ALIGN}-byte aligned")
        offset = at if at is not None else max(
            (b.offset + b.aligned_bytes for b in self.buffers), default=0)
        buf = Buffer(name, "shared", dtype, tuple(shape), layout, offset, comment)
        self.buffers.append(buf)
        return buf

    def all(self) -> tuple[Buffer, ...]:
        return tuple(self.buffers)


def _index(index) -> tuple[Expr, ...]:
    if isinstance(index, (tuple, list)):
        return tuple(as_expr(i) for i in index)
    return (as_expr(index),)


def _index_dtype(*xs: Expr) -> str:
    return "int64" if any(x.dtype == "int64" for x in xs) else "int32"


def load(buffer: Buffer, *index: Operand, lanes: int = 1) -> Load:
    """Element `index` of `buffer`, as the buffer's dtype."""
    return Load(buffer.name, tuple(as_expr(i) for i in index), buffer.dtype, lanes)


__all__ = ["Builder", "Names", "SharedMemory", "load"]
