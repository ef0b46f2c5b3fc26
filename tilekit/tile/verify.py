"""The tile-program checker: run after building and after every lowering pass.

A program that breaks a rule here is a bug in tilekit (a builder or a pass), never bad
input, so violations are `InternalError`s naming the kernel and the rule:

- names: every buffer and variable is a C identifier; a variable is defined before it is
  read, once along any path from the body's root (siblings may reuse a name);
- buffers: every load, store and address names a buffer of the kernel with one index per
  dimension (global buffers are flat); nothing stores into a read-only parameter;
- types: every expression's dtype is known; loop bounds are integers;
- threads: thread regions are not nested and have at most the kernel's threads; barriers and
  `CallBody` are block-level (outside regions); a scalar declared outside a region is never
  assigned inside one (only local buffers carry per-thread state across regions);
- lowering: with `lowered=True`, no tile operation (`Copy`) and no `parallel` or `pipelined`
  loop is left for the printers;
- composition: a `CallBody` names a kernel of `calls` with one argument per parameter.
"""

from __future__ import annotations

import re

from tilekit.errors import InternalError
from tilekit.tile.expr import (BLOCK, DTYPES, INT_DTYPES, NBLOCKS, Addr, Expr, Load, Var,
                               children as expr_children)
from tilekit.tile.nodes import (Alloc, Assign, Barrier, CallBody, Copy, Decl, For, If, Kernel,
                                Let, Seq, Stmt, Store, Switch, Threads, While, children, exprs,
                                walk)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def verify(k: Kernel, lowered: bool = True) -> Kernel:
    """`k` if it keeps every rule of the module docstring, else `InternalError`."""
    _Checker(k, lowered).run()
    for callee in k.calls:
        verify(callee, lowered)
    return k


class _Checker:
    def __init__(self, k: Kernel, lowered: bool) -> None:
        self.k = k
        self.lowered = lowered
        self.buffers = {b.name: b for b in k.params + k.shared}
        self.buffers.update({t.name: None for t in k.tables})
        self.outside: set[str] = set()         # scalars declared at block level
        self.region_decls: set[str] = set()    # scalars declared in the current region
        for name in self.buffers:
            self.ident(name)

    def fail(self, message: str) -> None:
        raise InternalError(f"tile program {self.k.name}: {message}")

    def ident(self, name: str) -> None:
        if not _IDENT.match(name):
            self.fail(f"{name!r} is not an identifier")

    def run(self) -> None:
        self.ident(self.k.name)
        if self.k.threads < 1 or self.k.grid < 1:
            self.fail(f"launches {self.k.grid} block(s) of {self.k.threads} thread(s)")
        for b in self.k.params:
            if b.scope != "global" or len(b.shape) != 1:
                self.fail(f"parameter {b.name} is not a flat global buffer")
        for b in self.k.shared:
            if b.scope != "shared":
                self.fail(f"buffer {b.name} is listed as shared with scope {b.scope}")
        scope = {BLOCK.name: "int32", NBLOCKS.name: "int32"}
        for m in self.k.tensor_maps:     # TMA descriptors: read by the copies as variables
            self.ident(m.name)
            if m.buffer not in self.buffers:
                self.fail(f"tensor map {m.name} describes unknown buffer {m.buffer}")
            if not (len(m.dims) == len(m.box) == len(m.strides) + 1 <= 5):
                self.fail(f"tensor map {m.name} has {len(m.dims)} dimension(s), "
                          f"{len(m.box)} box size(s) and {len(m.strides)} stride(s)")
            scope[m.name] = "ptr"
        self.stmt(self.k.body, scope, set(), region=None)

    # -- statements ---------------------------------------------------------------------
    def define(self, var: Var, scope: dict, mutable: set, is_mutable: bool = False) -> None:
        self.ident(var.name)
        if var.dtype not in DTYPES:
            self.fail(f"variable {var.name} has unknown dtype {var.dtype!r}")
        if var.name in scope:
            self.fail(f"variable {var.name} is defined twice")
        scope[var.name] = var.dtype
        if is_mutable:
            mutable.add(var.name)

    def stmt(self, s: Stmt, scope: dict, mutable: set, region: Threads | None) -> None:
        if isinstance(s, Copy):     # its expressions read its local index too
            inner = dict(scope)
            for v in s.local:
                self.define(v, inner, mutable)
            for e in exprs(s):
                self.expr(e, inner)
        else:
            for e in exprs(s):
                self.expr(e, scope)
        if isinstance(s, Seq):
            inner = dict(scope) if s.scoped else scope
            for x in s.body:
                self.stmt(x, inner, mutable, region)
            return
        if isinstance(s, Let):
            self.define(s.var, scope, mutable)
        elif isinstance(s, Decl):
            self.define(s.var, scope, mutable, is_mutable=True)
            if region is None:
                self.outside.add(s.var.name)
        elif isinstance(s, Assign):
            if s.var.name not in mutable:
                self.fail(f"assigns {s.var.name}, which is not a mutable scalar in scope")
            if region is not None and s.var.name in self.outside \
                    and s.var.name not in self.region_decls:
                self.fail(f"assigns {s.var.name} inside a thread region; it was declared "
                          "outside (per-thread state across regions lives in local buffers)")
        elif isinstance(s, Alloc):
            self.ident(s.buffer.name)
            if s.buffer.name in self.buffers:
                self.fail(f"buffer {s.buffer.name} is declared twice")
            if s.buffer.scope != "local":
                self.fail(f"Alloc of a {s.buffer.scope} buffer {s.buffer.name}")
            self.buffers[s.buffer.name] = s.buffer
        elif isinstance(s, Store):
            b = self.buffer(s.buffer, s.index)
            if b is not None and b.scope == "global" and b.access != "write":
                self.fail(f"stores into read-only parameter {s.buffer}")
        elif isinstance(s, For):
            for e in (s.start, s.stop, s.step):
                if e.dtype not in INT_DTYPES:
                    self.fail(f"loop {s.var.name} has a {e.dtype} bound")
            if self.lowered and s.kind in ("parallel", "pipelined"):
                self.fail(f"a {s.kind} loop ({s.var.name}) is left after lowering")
            inner = dict(scope)
            self.define(s.var, inner, mutable)
            self.stmt(s.body, inner, set(mutable), region)
            return
        elif isinstance(s, Threads):
            if region is not None:
                self.fail("thread regions are nested")
            if s.count > self.k.threads:
                self.fail(f"a region of {s.count} threads in a block of {self.k.threads}")
            inner = dict(scope)
            self.define(s.var, inner, mutable)
            self.region_decls = {x.var.name for x in walk(s.body) if isinstance(x, Decl)}
            self.stmt(s.body, inner, set(mutable), s)
            self.region_decls = set()
            return
        elif isinstance(s, Barrier):
            if region is not None:
                self.fail("a barrier inside a thread region")
        elif isinstance(s, CallBody):
            if region is not None:
                self.fail(f"CallBody {s.kernel} inside a thread region")
            try:
                callee = self.k.callee(s.kernel)
            except KeyError:
                self.fail(f"calls {s.kernel}, which is not among its calls")
                return
            if len(s.args) != len(callee.params):
                self.fail(f"calls {s.kernel} with {len(s.args)} arguments for "
                          f"{len(callee.params)} parameters")
            for a in s.args:
                if a not in self.buffers:
                    self.fail(f"passes unknown buffer {a} to {s.kernel}")
        elif isinstance(s, Copy):
            if self.lowered:
                self.fail(f"a Copy into {s.dst} is left after lowering")
            self.buffer(s.dst, None)
            self.buffer(s.src, None)
        for kid in children(s):
            self.stmt(kid, dict(scope) if isinstance(s, (If, While, Switch)) else scope,
                      set(mutable), region)

    # -- expressions ----------------------------------------------------------------------
    def buffer(self, name: str, index):
        if name not in self.buffers:
            self.fail(f"uses unknown buffer {name}")
        b = self.buffers[name]
        if b is not None and index is not None and len(index) > len(b.shape):
            self.fail(f"indexes {name} with {len(index)} subscripts for {len(b.shape)} "
                      "dimension(s)")
        return b

    def expr(self, e: Expr, scope: dict) -> None:
        stack = [e]
        while stack:
            x = stack.pop()
            if x.dtype not in DTYPES:
                self.fail(f"expression of unknown dtype {x.dtype!r}: {x!r}")
            if isinstance(x, Var):
                if x.name not in scope:
                    self.fail(f"reads undefined variable {x.name}")
                elif scope[x.name] != x.dtype:
                    self.fail(f"reads {x.name} as {x.dtype}; it is {scope[x.name]}")
            elif isinstance(x, Load):
                b = self.buffer(x.buffer, x.index)
                if b is not None and len(x.index) != len(b.shape):
                    self.fail(f"loads {x.buffer} with {len(x.index)} subscripts for "
                              f"{len(b.shape)} dimension(s)")
            elif isinstance(x, Addr):
                self.buffer(x.buffer, x.index)
            stack.extend(expr_children(x))


__all__ = ["verify"]
