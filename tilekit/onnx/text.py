"""Small builders for expression text: literals, axis names, index terms, accesses.

Converters write statements as text (the language of specs/expressions.md); these helpers keep
that text canonical and readable: `h*2 + kh - 3` rather than `h*2+kh*1+-3`, literals that
round-trip exactly in the tensor's dtype, and broadcasting by NumPy's rules.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Generic spatial axes, in order (`y[i, j, k] = ...`); more than 8 get `i8`, `i9`, ...
_GENERIC = ("i", "j", "k", "l", "m", "n", "o", "p")


def axes(rank: int, prefix: str | None = None) -> list[str]:
    """Axis names for an output of `rank` (`i, j, k...`, or `<prefix>0, <prefix>1...`)."""
    if prefix is not None:
        return [f"{prefix}{d}" for d in range(rank)]
    return [_GENERIC[d] if d < len(_GENERIC) else f"i{d}" for d in range(rank)]


def literal(value, dtype: str | np.dtype | None = None) -> str:
    """A number as expression text that reads back to the same value in `dtype`.

    Float literals are the shortest decimal that round-trips in the tensor's float type (the
    evaluator casts a literal to the operand's type); negative numbers come parenthesised so
    they can stand anywhere.
    """
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    kind = np.dtype(dtype).kind if dtype is not None else None
    if isinstance(value, (int, np.integer)) and kind in (None, "i", "u", "b"):
        text = str(int(value))
        return f"({text})" if text.startswith("-") else text
    if kind == "f" and np.dtype(dtype).itemsize in (2, 4, 8):
        v = np.dtype(dtype).type(value)
    else:
        v = np.float64(value)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "(-inf)"
    text = str(v).replace("e+", "e")
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text})" if text.startswith("-") else text


def term(parts: Sequence[tuple[str, int]], const: int = 0) -> str:
    """An affine index `sum(axis*coef) + const` as text: `h*2 + kh - 3`, `0`."""
    text = ""
    for name, coef in parts:
        if coef == 0:
            continue
        mag = abs(coef)
        piece = name if mag == 1 else f"{name}*{mag}"
        if not text:
            text = piece if coef > 0 else f"-{piece}"
        else:
            text += f" + {piece}" if coef > 0 else f" - {piece}"
    if not text:
        return str(const)
    if const > 0:
        text += f" + {const}"
    elif const < 0:
        text += f" - {-const}"
    return text


def affine_index(values: np.ndarray, axes: Sequence[str]) -> str | None:
    """`values` (integers over a grid, one grid dimension per name in `axes`) as an affine
    index `c + sum(coef * axis)` when it is exactly one, else None: constant indices of a
    gather that an index map can read instead (`idx[i, j] = 3 + j` -> `j + 3`)."""
    values = np.asarray(values, dtype=np.int64)
    if values.ndim != len(axes) or values.size == 0:
        return None
    base = int(values.reshape(-1)[0])
    coefs = []
    for d, n in enumerate(values.shape):
        at = [0] * values.ndim
        if n > 1:
            at[d] = 1
        coefs.append(int(values[tuple(at)]) - base)
    grid = np.indices(values.shape, dtype=np.int64)
    predicted = base + sum(c * g for c, g in zip(coefs, grid))
    if not np.array_equal(predicted, values):
        return None
    return term(list(zip(axes, coefs)), base)


def access(name: str, indices: Sequence[str]) -> str:
    return f"{name}[{', '.join(indices)}]"


def gather_access(name: str, extent: int, axis: int, indices: np.ndarray,
                  out_axes: Sequence[str]) -> str | None:
    """The read `name[.., index, ..]` of a Gather along `axis` (of `extent` points) at the
    constant `indices` (negative ones from the end), for the output indexed by `out_axes`,
    when the indices are in range and form an affine index (`affine_index`); else None (a
    general Gather)."""
    rank = np.ndim(indices)
    if np.size(indices) < 1:
        return None
    values = np.asarray(indices).astype(np.int64)
    if values.min() < -extent or values.max() >= extent:
        return None        # out of range: the opaque Gather reports it at run time
    index = affine_index(values % extent,
                         out_axes[axis:axis + rank])
    if index is None:
        return None
    return access(name, list(out_axes[:axis]) + [index] + list(out_axes[axis + rank:]))


def broadcast_indices(shape: Sequence[int], out_axes: Sequence[str],
                      out_shape: Sequence[int]) -> list[str]:
    """Indices reading a tensor of `shape` broadcast (NumPy rules) to the output's axes.

    Dimensions are right-aligned; a size-1 dimension under a larger output dimension reads
    index 0, leading output dimensions the input lacks are not read.
    """
    rank, out_rank = len(shape), len(out_shape)
    if rank > out_rank:
        raise ValueError(f"cannot broadcast shape {tuple(shape)} to {tuple(out_shape)}")
    indices = []
    for d, size in enumerate(shape):
        od = out_rank - rank + d
        if size == out_shape[od]:
            indices.append(out_axes[od])
        elif size == 1:
            indices.append("0")
        else:
            raise ValueError(f"cannot broadcast shape {tuple(shape)} to {tuple(out_shape)}")
    return indices


def atom(expr: str) -> str:
    """`expr` parenthesised unless it already is one operand: a name, number, access
    `x[..]`, call `f(..)` or parenthesised group (so templates can substitute it anywhere)."""
    text = expr.strip()
    head = 0
    while head < len(text) and (text[head].isalnum() or text[head] in "_."):
        head += 1
    if head == len(text):
        return text
    if text[head] in "([":
        close = {"(": ")", "[": "]"}[text[head]]
        depth = 0
        for pos in range(head, len(text)):
            ch = text[pos]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
                if depth == 0:
                    if pos == len(text) - 1 and ch == close:
                        return text
                    break
    return f"({text})"


def nest(op: str, items: Sequence[str]) -> str:
    """`op(op(a, b), op(c, d))`: a binary function across several operands, as a balanced
    tree so that the nesting depth grows with log(n), not n."""
    if len(items) == 1:
        return items[0]
    mid = (len(items) + 1) // 2
    return f"{op}({nest(op, items[:mid])}, {nest(op, items[mid:])})"


def balanced_sum(items: Sequence[str]) -> str:
    """`(a + b) + (c + d)`: a sum of several operands as a balanced tree, so that its
    nesting depth (bounded by `limits.EXPR_DEPTH`) grows with log(n), not n."""
    if len(items) <= 2:
        return " + ".join(items)
    mid = (len(items) + 1) // 2
    return f"({balanced_sum(items[:mid])}) + ({balanced_sum(items[mid:])})"


def select_by_range(axis: str, starts: Sequence[int], items: Sequence[str]) -> str:
    """The item whose range holds `axis`: item k covers `starts[k] <= axis < starts[k+1]`.

    A balanced tree of `select(axis < start, ..., ...)`, nesting depth log2(n) (a long
    Concat or an unrolled sequence would otherwise nest as deep as it is long).
    """
    if len(items) == 1:
        return items[0]
    mid = len(items) // 2
    return (f"select({axis} < {starts[mid]}, {select_by_range(axis, starts[:mid], items[:mid])}"
            f", {select_by_range(axis, starts[mid:], items[mid:])})")
