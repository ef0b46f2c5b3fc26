"""Shared-memory layouts: rows padded so that a warp's row-wise accesses are conflict-free.

A tensor-core fragment is read row by row: `ldmatrix` reads eight rows of 16 bytes per 8x8
matrix, one row per lane group; a tf32 fragment's scalar loads read eight rows at four
consecutive words (lane `4g + q` reads row `g`, column `q`). Shared memory serves 128 bytes
(32 banks of 4 bytes) per cycle: the eight rows fall in distinct banks exactly when the row
pitch, in 16-byte units, is odd. `conflict_free_pad` gives the fewest elements of padding per
row that make it so; `pad_shared_rows(k)` applies it to every shared buffer read as a
fragment (an `ldmatrix` address, or a load rounded to tf32) and lays the buffers out again,
one after another. The
tensor-core plan (tilekit.schedule.mma) sizes its buffers with the same function, so the
shared memory it prices is the shared memory the kernel declares. A buffer whose rows were
chosen otherwise (a `swizzle`) is left alone.
"""

from __future__ import annotations

from dataclasses import replace

from tilekit.tile.expr import ITEMSIZE, Addr, Call, Load, children as expr_children
from tilekit.tile.nodes import SMEM_ALIGN, Buffer, Kernel, Layout, exprs, walk

#: The calls whose address arguments read rows of 16 bytes per lane group.
ROW_READERS = ("ldmatrix_x4", "ldmatrix_x4_trans")
#: The calls whose loaded arguments are fragment elements (tf32 operands).
FRAGMENT_VALUES = ("to_tf32",)


def conflict_free_pad(row_elements: int, itemsize: int) -> int:
    """Elements of padding after a row of `row_elements` so that the row pitch is an odd
    number of 16-byte chunks (a multiple of 16 bytes itself)."""
    chunk = 16 // itemsize if itemsize <= 16 else 1
    pad = (-row_elements) % chunk
    if ((row_elements + pad) * itemsize // 16) % 2 == 0:
        pad += chunk
    return pad


def row_read_buffers(k: Kernel) -> set[str]:
    out: set[str] = set()
    for s in walk(k.body):
        for e in exprs(s):
            stack = [e]
            while stack:
                x = stack.pop()
                if isinstance(x, Call) and x.fn in ROW_READERS:
                    out.update(a.buffer for a in x.args if isinstance(a, Addr))
                if isinstance(x, Call) and x.fn in FRAGMENT_VALUES:
                    out.update(a.buffer for a in x.args if isinstance(a, Load))
                stack.extend(expr_children(x))
    return out


def pad_shared_rows(k: Kernel) -> Kernel:
    """`k` with every row-read shared buffer padded (module docstring)."""
    targets = row_read_buffers(k)
    changed = False
    shared: list[Buffer] = []
    for b in k.shared:
        if b.name in targets and not b.layout.swizzle:
            pad = conflict_free_pad(b.shape[-1], ITEMSIZE[b.dtype])
            if pad != b.layout.pad:
                b = replace(b, layout=Layout(pad=pad))
                changed = True
        shared.append(b)
    if not changed:
        return k
    ordered = sorted(shared, key=lambda b: b.offset)
    offset, placed = 0, {}
    for b in ordered:
        placed[b.name] = replace(b, offset=offset)
        offset += -(-b.nbytes // SMEM_ALIGN) * SMEM_ALIGN
    return replace(k, shared=tuple(placed[b.name] for b in shared))


__all__ = ["FRAGMENT_VALUES", "ROW_READERS", "conflict_free_pad", "pad_shared_rows", "row_read_buffers"]
