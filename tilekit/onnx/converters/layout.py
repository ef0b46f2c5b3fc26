"""Layout ops: one `=` statement each whose index map does the work.

- Reshape / Flatten / Squeeze / Unsqueeze: dimensions are grouped where the two shapes agree on
  a product, and only inside a group is the linear index rebuilt with `//` and `%`
  (`[N, C*H*W]` from `[N, C, H, W]` reads `x[n, j // (H*W), j // W % H, j % W]`).
- Transpose: a permutation of axes. Expand, Tile (`%`), Slice (`start + i*step`, negative steps
  included), Split (one statement per output), DepthToSpace / SpaceToDepth (`//`, `%`),
  Gather with constant indices (a constant or an arithmetic progression).
- Concat: one statement selecting on the concatenation axis, `pad: '0'` making the reads of
  the inputs not selected at a point well defined:
  `y[i, j] = select(j < 3, a[i, j], b[i, j - 3])`.
- Pad: constant mode by `pad: '0'`/`'-inf'`/`'inf'` or a select on the axis ranges; edge and
  reflect by a select over the border regions of each padded axis; wrap by `%`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter


# -- reshape family ----------------------------------------------------------------------

def reshape_indices(in_shape: Sequence[int], out_shape: Sequence[int],
                    out_axes: Sequence[str]) -> list[str]:
    """Indices into a tensor of `in_shape` for the same elements in row-major order, read at
    `out_axes` of `out_shape`."""
    result = ["0"] * len(in_shape)
    ins = [(d, n) for d, n in enumerate(in_shape) if n != 1]
    outs = [(a, n) for a, n in zip(out_axes, out_shape) if n != 1]
    i = o = 0
    while i < len(ins) and o < len(outs):
        gi, go = [ins[i]], [outs[o]]
        pi, po = ins[i][1], outs[o][1]
        i, o = i + 1, o + 1
        while pi != po:
            if pi < po:
                gi.append(ins[i])
                pi *= ins[i][1]
                i += 1
            else:
                go.append(outs[o])
                po *= outs[o][1]
                o += 1
        if len(gi) == 1 and len(go) == 1:
            result[gi[0][0]] = go[0][0]
            continue
        strides, acc = [], 1
        for _, n in reversed(go):
            strides.append(acc)
            acc *= n
        linear = text.term([(a, s) for (a, _), s in zip(go, reversed(strides))])
        lin = f"({linear})" if len(go) > 1 else linear
        stride = pi
        for k, (d, n) in enumerate(gi):
            stride //= n
            idx = lin if stride == 1 else f"{lin} // {stride}"
            if k > 0:
                idx = f"{idx} % {n}"
            result[d] = idx
    return result


def _reshape_like(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    if x.shape == out.shape:
        ctx.alias(0, x)
        return
    if x.size != out.size:
        raise ctx.unsupported(f"cannot reshape {list(x.shape)} to {list(out.shape)}")
    ax = text.axes(out.rank)
    ctx.assign(out, ax, "=", ctx.access(x, reshape_indices(x.shape, out.shape, ax)))


@converter("Reshape", ignore=("allowzero",),
           summary="index map: linear index rebuilt with // and % inside groups of dims")
def reshape(ctx: NodeContext) -> None:
    if ctx.opset >= 5:
        ctx.require_const(1, "the target shape")
    else:
        ctx.attr("shape")
    _reshape_like(ctx)


@converter("Flatten", summary="index map like Reshape")
def flatten(ctx: NodeContext) -> None:
    ctx.axis("axis", 1, ctx.input(0).rank, inclusive=True)
    _reshape_like(ctx)


@converter("Squeeze", summary="index map (size-1 dims dropped)")
def squeeze(ctx: NodeContext) -> None:
    ctx.attr("axes")
    _reshape_like(ctx)


@converter("Unsqueeze", summary="index map (size-1 dims added)")
def unsqueeze(ctx: NodeContext) -> None:
    ctx.attr("axes")
    _reshape_like(ctx)


@converter("Transpose", summary="y[i, j, k] = x[perm...]")
def transpose(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    perm = ctx.axes_in(ctx.attr("perm") or list(reversed(range(x.rank))), x.rank, "perm")
    if len(perm) != x.rank:
        raise ctx.unsupported(f"perm has {len(perm)} axes, the input has rank {x.rank}",
                              f"give a permutation of 0..{x.rank - 1}")
    ax = text.axes(out.rank)
    idx = [""] * x.rank
    for d, p in enumerate(perm):
        idx[p] = ax[d]
    ctx.assign(out, ax, "=", ctx.access(x, idx))


@converter("Expand", summary="broadcast read (index 0 on size-1 dims)")
def expand(ctx: NodeContext) -> None:
    # A shape computed at run time is fine when the output's shape is declared statically:
    # the statement broadcasts to that shape and the shape input is not read.
    x, out = ctx.input(0), ctx.output(0)
    ax = text.axes(out.rank)
    ctx.assign(out, ax, "=", ctx.read(x, ax, out.shape))


@converter("Tile", summary="y[i, j] = x[i % n0, j % n1]")
def tile(ctx: NodeContext) -> None:
    ctx.require_const(1, "repeats")
    x, out = ctx.input(0), ctx.output(0)
    ax = text.axes(out.rank)
    idx = [a if n == o else ("0" if n == 1 else f"{a} % {n}")
           for a, n, o in zip(ax, x.shape, out.shape)]
    ctx.assign(out, ax, "=", ctx.access(x, idx))


# -- slicing and joining -----------------------------------------------------------------

@converter("Concat", summary="select on the axis ranges (pad '0')")
def concat(ctx: NodeContext) -> None:
    out = ctx.output(0)
    axis = ctx.axis("axis", 1, out.rank)
    inputs = [v for v in ctx.inputs() if v.shape[axis] > 0]
    if len(inputs) == 1:
        ctx.copy(0, inputs[0])
        return
    ax = text.axes(out.rank)
    a = ax[axis]
    offsets, off = [], 0
    for v in inputs:
        offsets.append(off)
        off += v.shape[axis]

    def read(v: Value, offset: int) -> str:
        idx = list(ax)
        idx[axis] = text.term([(a, 1)], -offset)
        return ctx.access(v, idx)

    body = text.select_by_range(a, offsets, [read(v, o) for v, o in zip(inputs, offsets)])
    ctx.assign(out, ax, "=", body, pad="0")


def _split_sizes(ctx: NodeContext, total: int, parts: int) -> list[int]:
    if ctx.opset >= 13 and ctx.has_input(1):
        return [int(s) for s in ctx.require_const(1, "split sizes").reshape(-1)]
    split = ctx.attr("split")
    if split:
        return [int(s) for s in split]
    if ctx.opset < 13 and ctx.has_input(1):
        return [int(s) for s in ctx.require_const(1, "split sizes").reshape(-1)]
    n = int(ctx.attr("num_outputs", parts))
    chunk = -(-total // n)
    return [min(chunk, total - k * chunk) for k in range(n)]


@converter("Split", summary="one statement per output: y_k[..] = x[.., a + offset_k, ..]")
def split(ctx: NodeContext) -> None:
    x = ctx.input(0)
    axis = ctx.axis("axis", 0, x.rank)
    sizes = _split_sizes(ctx, x.shape[axis], ctx.n_outputs)
    offset = 0
    for k, size in enumerate(sizes):
        if ctx.output_used(k):
            out = ctx.output(k)
            ax = text.axes(out.rank)
            idx = list(ax)
            idx[axis] = text.term([(ax[axis], 1)], offset)
            ctx.assign(out, ax, "=", ctx.access(x, idx), step=None if k == 0 else str(k))
        offset += size


@converter("Slice", summary="y[i] = x[start + i*step]")
def slice_(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    if ctx.opset >= 10:
        starts = ctx.require_const(1, "starts").reshape(-1).tolist()
        ends = ctx.require_const(2, "ends").reshape(-1).tolist()
        axes = ctx.require_const(3, "axes").reshape(-1).tolist() if ctx.has_input(3) else None
        steps = ctx.require_const(4, "steps").reshape(-1).tolist() if ctx.has_input(4) else None
    else:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes, steps = ctx.attr("axes"), None
    axes = list(range(len(starts))) if axes is None else ctx.axes_in(axes, x.rank)
    steps = steps or [1] * len(starts)
    ax = text.axes(out.rank)
    idx = list(ax)
    for a, start, end, step in zip(axes, starts, ends, steps):
        lo, _, st = slice(int(start), int(end), int(step)).indices(x.shape[a])
        idx[a] = text.term([(ax[a], st)], lo)
    ctx.assign(out, ax, "=", ctx.access(x, idx))


@converter("Gather", summary="constant indices affine in their position (a constant, an "
                             "arithmetic progression, a grid): an index map; otherwise opaque "
                             "Gather")
def gather(ctx: NodeContext) -> None:
    x, ind, out = ctx.input(0), ctx.input(1), ctx.output(0)
    axis = ctx.axis("axis", 0, x.rank)
    ax = text.axes(out.rank)
    read = None if ind.const is None else text.gather_access(
        ctx.name_of(x), x.shape[axis], axis, ind.const, ax)
    if read is None:
        ctx.opaque("Gather", [x, ind], [out], {"axis": axis})
        return
    ctx.assign(out, ax, "=", read)


# -- padding -----------------------------------------------------------------------------

@converter("Pad", summary="constant: pad '0' or select on ranges; edge/reflect: select over "
                          "border regions; wrap: %")
def pad(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    if ctx.opset >= 11:
        pads = [int(p) for p in ctx.require_const(1, "pads").reshape(-1)]
        value = ctx.const(2) if ctx.has_input(2) else None
        if ctx.has_input(2) and value is None:
            raise ctx.unsupported("a computed constant_value")
        value = 0.0 if value is None or value.size == 0 else value.reshape(-1)[0].item()
        axes = (ctx.axes_in(ctx.require_const(3, "axes").reshape(-1), x.rank)
                if ctx.has_input(3) else list(range(x.rank)))
    else:
        pads = list(ctx.attr("pads") or ctx.attr("paddings"))
        value = ctx.attr("value", 0.0)
        axes = list(range(x.rank))
    mode = ctx.attr("mode", "constant")
    n = len(axes)
    begin = {a: pads[k] for k, a in enumerate(axes)}
    end = {a: pads[k + n] for k, a in enumerate(axes)}
    ax = text.axes(out.rank)
    src = [text.term([(a, 1)], -begin.get(d, 0)) for d, a in enumerate(ax)]
    padded = [d for d in range(x.rank) if begin.get(d, 0) > 0 or end.get(d, 0) > 0]
    if mode == "constant":
        pad_value = {0.0: "0", float("-inf"): "-inf", float("inf"): "inf"}.get(float(value))
        if pad_value is not None or not padded:
            ctx.assign(out, ax, "=", ctx.access(x, src),
                       pad=(pad_value or "0") if padded else None)
            return
        inside = " && ".join(
            f"{ax[d]} >= {begin[d]} && {ax[d]} < {begin[d] + x.shape[d]}" for d in padded)
        ctx.assign(out, ax, "=", f"select({inside}, {ctx.access(x, src)}, "
                                 f"{text.literal(value, x.dtype)})", pad="0")
        return
    if mode == "wrap":
        idx = list(src)
        for d in padded:
            size = x.shape[d]
            shift = size * math.ceil(begin[d] / size) - begin[d]
            idx[d] = f"({text.term([(ax[d], 1)], shift)}) % {size}"
        ctx.assign(out, ax, "=", ctx.access(x, idx))
        return
    if mode not in ("edge", "reflect"):
        raise ctx.unsupported(f"mode='{mode}'")
    ctx.assign(out, ax, "=", _border_select(ctx, x, ax, src, padded, begin, end, mode),
               pad="0")


def _border_select(ctx: NodeContext, x: Value, ax: Sequence[str], src: Sequence[str],
                   padded: Sequence[int], begin: dict, end: dict, mode: str) -> str:
    """Nested selects choosing, per padded axis, the region (before / inside / after) and the
    source index there (edge: clamp; reflect: mirror without repeating the border)."""
    def regions(d: int) -> list[tuple[str | None, str]]:
        a, pb, size = ax[d], begin.get(d, 0), x.shape[d]
        out = []
        if pb > 0:
            first = "0" if mode == "edge" else text.term([(a, -1)], pb)
            out.append((f"{a} < {pb}", first))
        if end.get(d, 0) > 0:
            out.append((f"{a} < {pb + size}", src[d]))
            last = str(size - 1) if mode == "edge" else text.term([(a, -1)], 2 * size - 2 + pb)
            out.append((None, last))
        else:
            out.append((None, src[d]))
        return out

    def build(k: int, idx: list[str]) -> str:
        if k == len(padded):
            return ctx.access(x, idx)
        d = padded[k]
        options = regions(d)
        body = None
        for cond, index in reversed(options):
            chosen = list(idx)
            chosen[d] = index
            inner = build(k + 1, chosen)
            body = inner if cond is None else f"select({cond}, {inner}, {body})"
        return body

    return build(0, list(src))


# -- depth and space ---------------------------------------------------------------------

@converter("DepthToSpace", summary="y[n, c, h, w] = x[n, (h % b)*b*C + (w % b)*C + c, h // b, "
                                   "w // b] (DCR; CRD analogous)")
def depth_to_space(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    b = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR")
    c_out = out.shape[1]
    if mode == "DCR":
        chan = f"(h % {b})*{b * c_out} + (w % {b})*{c_out} + c"
    else:
        chan = f"c*{b * b} + (h % {b})*{b} + w % {b}"
    ctx.assign(out, ["n", "c", "h", "w"], "=",
               ctx.access(x, ["n", chan, f"h // {b}", f"w // {b}"]))


@converter("SpaceToDepth", summary="y[n, c, h, w] = x[n, c % C, h*b + c // (b*C), "
                                   "w*b + c // C % b]")
def space_to_depth(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    b = int(ctx.attr("blocksize"))
    c_in = x.shape[1]
    ctx.assign(out, ["n", "c", "h", "w"], "=",
               ctx.access(x, ["n", f"c % {c_in}", f"h*{b} + c // {b * c_in}",
                              f"w*{b} + c // {c_in} % {b}"]))


# -- generated values --------------------------------------------------------------------

@converter("EyeLike", summary="select(j - i == k, 1, 0)")
def eye_like(ctx: NodeContext) -> None:
    out = ctx.output(0)
    ctx.attr("dtype")
    k = int(ctx.attr("k", 0))
    ctx.assign(out, ["i", "j"], "=", f"select(j - i == {k}, 1, 0)")


@converter("Trilu", summary="select(j - i >= k, x, 0) (upper) / <= k (lower)")
def trilu(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    k = int(ctx.require_const(1, "k").reshape(-1)[0]) if ctx.has_input(1) else 0
    ax = text.axes(out.rank)
    i, j = ax[-2], ax[-1]
    cond = f"{j} - {i} >= {k}" if ctx.attr("upper", 1) else f"{j} - {i} <= {k}"
    ctx.assign(out, ax, "=", f"select({cond}, {ctx.access(x, ax)}, 0)")


@converter("OneHot", summary="select(idx == a || idx + depth == a, on, off)")
def one_hot(ctx: NodeContext) -> None:
    ind, out = ctx.input(0), ctx.output(0)
    depth = int(ctx.require_const(1, "depth").reshape(-1)[0])
    values = ctx.input(2)
    axis = ctx.axis("axis", -1, out.rank)
    ax = text.axes(out.rank)
    a = ax[axis]
    idx = ctx.access(ind, [x for d, x in enumerate(ax) if d != axis])
    if values.const is not None:
        off, on = (text.literal(v.item(), out.dtype) for v in values.const.reshape(-1)[:2])
    else:
        off, on = ctx.access(values, ["0"]), ctx.access(values, ["1"])
    ctx.assign(out, ax, "=", f"select({idx} == {a} || {idx} + {depth} == {a}, {on}, {off})")


@converter("Range", summary="y[i] = start + i*delta (folded at import when its inputs are "
                            "constants)")
def range_(ctx: NodeContext) -> None:
    # Constant inputs fold before conversion; here the length is static (from inference)
    # and start or delta is computed at run time.
    start, delta, out = ctx.input(0), ctx.input(2), ctx.output(0)
    for i, v in ((0, start), (1, ctx.input(1)), (2, delta)):
        if v.size != 1:
            raise ctx.unsupported(f"input {i} has {v.size} elements", "Range takes scalars")
    ctx.assign(out, ["i"], "=", f"{ctx.read(start, ['i'], out.shape)} + "
                                f"i * {ctx.read(delta, ['i'], out.shape)}")


@converter("CenterCropPad", summary="y[i] = x[i + offset] (pad '0'): a centred crop or zero "
                                    "pad per axis")
def center_crop_pad(ctx: NodeContext) -> None:
    # Opset 18. Per axis: crop from (n - s) // 2, or pad (s - n) // 2 zeros before.
    x, out = ctx.input(0), ctx.output(0)
    sizes = [int(v) for v in ctx.require_const(1, "shape").reshape(-1)]
    axes = ctx.axes_in(ctx.attr("axes"), x.rank) if ctx.attr("axes") is not None \
        else list(range(x.rank))
    if len(sizes) != len(axes):
        raise ctx.unsupported(f"{len(sizes)} sizes for {len(axes)} axes")
    ax = text.axes(out.rank)
    idx, padded = list(ax), False
    for a, size in zip(axes, sizes):
        n = x.shape[a]
        offset = (n - size) // 2 if size <= n else -((size - n) // 2)
        padded = padded or size > n
        idx[a] = text.term([(ax[a], 1)], offset)
    ctx.assign(out, ax, "=", ctx.access(x, idx), pad="0" if padded else None)


@converter("ConstantOfShape", summary="y[...] = value; folded when its shape is a constant "
                                      "(sized by a symbolic dimension it stays an op)")
def constant_of_shape(ctx: NodeContext) -> None:
    out = ctx.output(0)
    value = ctx.attr("value", None)
    fill = np.asarray(0.0 if value is None else value).reshape(-1)
    if fill.size != 1:
        raise ctx.unsupported(f"attribute 'value' has {fill.size} elements, not one",
                              "ConstantOfShape fills with one value")
    ctx.assign(out, text.axes(out.rank), "=", text.literal(fill[0].item(), out.dtype))
