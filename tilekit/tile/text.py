"""Tile programs as text for people: `format_kernel(k)`, deterministic, one line per node.

    kernel tk_k0  grid 6  threads 128  bounds (128, 1)
      param t_x: float32[1850] read  (x)
      shared s_x_0: float32[32, 8] @0  (x box [32, 8])
      let o_i: int32 = b_1 * 32
      local acc: float32[8]
      threads tid < 128:
        for k in unroll(0, 8):
          acc[k] = 0.0f
      for q_k in serial(0, 37, 8):
        barrier
        copy s_x_0[l_0, l_1] = x[...] if in_range(...) else 0.0f
        ...

Expressions read as C does (the same operators and precedence, `floordiv`/`floormod` named)
and loops as ranges, so a program reads the same before and after lowering; what the CUDA
and C++ printers add (thread indices, pragmas, casts of the target) is theirs. `tk-codegen
--emit-dir DIR` writes each kernel's program as `DIR/<entry>.tile`, before and after
lowering.
"""

from __future__ import annotations

from tilekit.tile.cstyle import CStyle
from tilekit.tile.emit import INDENT, comment_text
from tilekit.tile.expr import Expr
from tilekit.tile.nodes import (Alloc, Assign, Barrier, Break, CallBody, Comment, Continue, Copy,
                                Decl, Evaluate, For, If, Kernel, Let, Seq, Stmt, Store, Switch,
                                Threads, While)


class _Expressions(CStyle):
    """Expressions as C reads them, buffers indexed logically (no layout, no flattening)."""

    TYPES = {**CStyle.TYPES, "float16": "half", "bfloat16": "bfloat16"}

    def element(self, buffer: str, index) -> str:
        return f"{buffer}[{', '.join(self.expr(i) for i in index)}]"

    def intrinsic(self, e, args) -> str:
        return f"{e.fn}({', '.join(args)})"

    def cast(self, e) -> str:
        return f"{e.dtype}({self.expr(e.arg)})"

    def call(self, e) -> str:
        return f"{e.fn}({', '.join(self.expr(a) for a in e.args)})"


def format_kernel(k: Kernel) -> str:
    """The program as text (module docstring)."""
    p = _Expressions(k)
    lines: list[str] = []
    bounds = f"  bounds ({k.threads}, {k.min_blocks})" if k.min_blocks else ""
    lines.append(f"kernel {k.name}  grid {k.grid}  threads {k.threads}{bounds}"
                 + ("  grid barriers" if k.grid_sync else ""))
    for c in k.comments:
        lines.append(f"{INDENT}# {comment_text(c)}")
    for b in k.params:
        lines.append(f"{INDENT}param {b.name}: {b.dtype}[{b.shape[0]}] {b.access}"
                     + (f"  ({comment_text(b.comment)})" if b.comment else ""))
    for b in k.shared:
        layout = ""
        if b.layout.pad:
            layout = f" pad {b.layout.pad}"
        if b.layout.swizzle:
            layout += f" swizzle {b.layout.swizzle}"
        lines.append(f"{INDENT}shared {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]"
                     f" @{b.offset}{layout}" + (f"  ({comment_text(b.comment)})"
                                                 if b.comment else ""))
    for m in k.tensor_maps:
        lines.append(f"{INDENT}tensor map {m.name}: {m.buffer} as {m.dtype}"
                     f"[{', '.join(map(str, m.dims))}] box [{', '.join(map(str, m.box))}]"
                     + (f" swizzle {m.swizzle}" if m.swizzle else ""))
    if k.smem_align > 16:
        lines.append(f"{INDENT}shared base aligned to {k.smem_align}")
    for t in k.tables:
        lines.append(f"{INDENT}table {t.name}[{len(t.values)}]")
    for c in k.calls:
        lines.append(f"{INDENT}calls {c.name} ({c.threads} threads)")
    _stmt(p, k.body, 1, lines)
    return "\n".join(lines) + "\n"


def _stmt(p: _Expressions, s: Stmt, depth: int, out: list[str]) -> None:
    pad = INDENT * depth
    e = p.expr
    if isinstance(s, Seq):
        for x in s.body:
            _stmt(p, x, depth, out)
    elif isinstance(s, Comment):
        out.append(f"{pad}# {comment_text(s.text)}")
    elif isinstance(s, Let):
        out.append(f"{pad}let {s.var.name}: {s.var.dtype} = {e(s.value)}")
    elif isinstance(s, Decl):
        init = f" = {e(s.init)}" if s.init is not None else ""
        out.append(f"{pad}var {s.var.name}: {s.var.dtype}{init}")
    elif isinstance(s, Assign):
        out.append(f"{pad}{s.var.name} = {e(s.value)}")
    elif isinstance(s, Alloc):
        b = s.buffer
        out.append(f"{pad}local {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]"
                   + (f"  ({comment_text(b.comment)})" if b.comment else ""))
    elif isinstance(s, Store):
        vec = f" x{s.lanes}" if s.lanes > 1 else ""
        out.append(f"{pad}{p.element(s.buffer, s.index)}{vec} = {e(s.value)}")
    elif isinstance(s, Evaluate):
        out.append(f"{pad}{e(s.call)}")
    elif isinstance(s, For):
        kind = f"pipelined[{s.stages}]" if s.kind == "pipelined" else \
            f"unroll[{s.unroll}]" if s.kind == "unroll" and s.unroll else s.kind
        step = f", {e(s.step)}" if e(s.step) != "1" else ""
        out.append(f"{pad}for {s.var.name} in {kind}({e(s.start)}, {e(s.stop)}{step}):")
        _stmt(p, s.body, depth + 1, out)
    elif isinstance(s, While):
        out.append(f"{pad}while {e(s.cond)}:")
        _stmt(p, s.body, depth + 1, out)
    elif isinstance(s, If):
        out.append(f"{pad}if {e(s.cond)}:")
        _stmt(p, s.then, depth + 1, out)
        if s.other is not None:
            out.append(f"{pad}else:")
            _stmt(p, s.other, depth + 1, out)
    elif isinstance(s, Switch):
        out.append(f"{pad}switch {e(s.value)}:")
        for value, body in s.cases:
            out.append(f"{pad}{INDENT}case {value}:")
            _stmt(p, body, depth + 2, out)
    elif isinstance(s, Threads):
        out.append(f"{pad}threads {s.var.name} < {s.count}:")
        _stmt(p, s.body, depth + 1, out)
    elif isinstance(s, Barrier):
        out.append(f"{pad}barrier")
    elif isinstance(s, CallBody):
        out.append(f"{pad}call {s.kernel}(block {e(s.block)} of {e(s.nblocks)})")
    elif isinstance(s, Copy):
        tile = ", ".join(v.name for v in s.local)
        prefix = "".join(f"{e(x)}, " for x in s.dst_prefix)
        how = ("async 16B" if s.asynchronous else f"x{s.vector}" if s.vector > 1 else "")
        out.append(f"{pad}copy{(' ' + how) if how else ''} {s.dst}[{prefix}{tile}] = "
                   f"{s.src}[{e(s.offset)}] if {e(s.valid)} else {e(s.pad)}")
    elif isinstance(s, (Break, Continue)):
        out.append(f"{pad}{type(s).__name__.lower()}")
    else:  # pragma: no cover
        out.append(f"{pad}<{type(s).__name__}>")


def format_expr(k: Kernel, x: Expr) -> str:
    return _Expressions(k).expr(x)


__all__ = ["format_expr", "format_kernel"]
