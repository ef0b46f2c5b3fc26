"""Reductions and the composites built on them (Softmax, LogSoftmax, LpNormalization, ...).

A reduction is one statement with reduction axes (`r`, or `r0, r1, ...` named after the input
dimension they run over): `y[i, k] += x[i, r, k]`. Composites are a short chain of such
statements: Softmax is `max=`, `+= exp(x - m)`, `= exp(x - m) / s`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter


def reduction_names(reduced: Sequence[int]) -> dict[int, str]:
    """Reduction axis names: `r` for one, `r<dim>` for several."""
    if len(reduced) == 1:
        return {reduced[0]: "r"}
    return {d: f"r{d}" for d in reduced}


def reduced_shape(shape: Sequence[int], reduced: Sequence[int], keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if d in reduced else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in reduced)


def indices_in(shape_rank: int, reduced: Sequence[int], keepdims: bool,
               out_axes: Sequence[str]) -> tuple[list[str], list[str]]:
    """For a reduction of a rank-`shape_rank` input: (input indices, reduction names).

    Output axes map to the kept input dimensions in order; with `keepdims` the output keeps a
    size-1 dimension (and an unused axis) where the input is reduced.
    """
    names = reduction_names(list(reduced))
    indices, kept = [], iter(out_axes)
    for d in range(shape_rank):
        if d in reduced:
            indices.append(names[d])
            if keepdims:
                next(kept)
        else:
            indices.append(next(kept))
    return indices, [names[d] for d in sorted(reduced)]


def reduce_to(ctx: NodeContext, x: Value, out: Value, reduced: Sequence[int], keepdims: bool,
              assign: str, term: str, step: str | None = None) -> Value:
    """Emit `out[...] <assign> term(x[...])`; `term` is a format string over `{x}`."""
    ax = text.axes(out.rank)
    idx, _ = indices_in(x.rank, reduced, keepdims, ax)
    ctx.assign(out, ax, assign, term.format(x=ctx.access(x, idx)), step=step)
    return out


def keep_indices(rank: int, reduced: Sequence[int], ax: Sequence[str]) -> list[str]:
    """Indices of a keepdims=False reduction result read from a full-rank iteration."""
    return [ax[d] for d in range(rank) if d not in reduced]


def _axes_arg(ctx: NodeContext, rank: int, input_since: int) -> list[int] | None:
    """The reduced axes (normalised, sorted); None when none are given (an absent or empty
    list: every axis, or none at all under `noop_with_empty_axes`, see `_noop`)."""
    if ctx.opset >= input_since:
        if not ctx.has_input(1):
            axes = None
        else:
            axes = [int(a) for a in ctx.require_const(1, "axes").reshape(-1)]
    else:
        axes = ctx.attr("axes")
    if axes is not None and len(axes) == 0:
        axes = None
    if axes is None:
        return None
    return sorted(ctx.axes_in(axes, rank)) if rank else []


def _noop(ctx: NodeContext, input_since: int) -> bool:
    """`noop_with_empty_axes` (from the opset where the axes became an input: 13 for
    ReduceSum, 18 for the others). Read whether or not the axes are given: exporters write
    it explicitly (`noop_with_empty_axes=0` on RMSNorm's ReduceMean at opset 18)."""
    return ctx.opset >= input_since and bool(ctx.flag("noop_with_empty_axes", 0))


_REDUCE = {
    # op: (assign, term over {x} and {n}, final over {t} or None)
    "ReduceSum": ("+=", "{x}", None),
    "ReduceMean": ("+=", "{x} / {n}", None),
    "ReduceMax": ("max=", "{x}", None),
    "ReduceMin": ("min=", "{x}", None),
    "ReduceProd": ("*=", "{x}", None),
    "ReduceL1": ("+=", "abs({x})", None),
    "ReduceL2": ("+=", "{x} * {x}", "sqrt({t})"),
    "ReduceSumSquare": ("+=", "{x} * {x}", None),
    "ReduceLogSum": ("+=", "{x}", "log({t})"),
}


def _reduce(op_type: str):
    assign, term, final = _REDUCE[op_type]
    since = 13 if op_type == "ReduceSum" else 18

    def convert(ctx: NodeContext) -> None:
        x, out = ctx.input(0), ctx.output(0)
        keepdims = bool(ctx.flag("keepdims", 1))
        axes = _axes_arg(ctx, x.rank, since)
        noop = _noop(ctx, since)
        if axes is None:
            if noop:
                ctx.copy(0, x)
                return
            axes = list(range(x.rank))
        n = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
        body = term.replace("{n}", text.literal(n))
        if final is None:
            reduce_to(ctx, x, out, axes, keepdims, assign, body)
            return
        t = ctx.temp("acc", out.shape, out.dtype)
        reduce_to(ctx, x, t, axes, keepdims, assign, body, step="acc")
        ax = text.axes(out.rank)
        ctx.assign(out, ax, "=", final.format(t=ctx.access(t, ax)))
    return convert


def _summary(op_type: str) -> str:
    assign, term, final = _REDUCE[op_type]
    body = term.format(x="x", n="n")
    return f"y {assign} {body}" if final is None else \
        f"t {assign} {body}; y = {final.format(t='t')}"


for _op in _REDUCE:
    converter(_op, summary=_summary(_op))(_reduce(_op))


@converter("ReduceLogSumExp", summary="m max= x; s += exp(x - m); y = log(s) + m")
def reduce_log_sum_exp(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    keepdims = bool(ctx.flag("keepdims", 1))
    axes = _axes_arg(ctx, x.rank, 18)
    noop = _noop(ctx, 18)
    if axes is None:
        if noop:
            ctx.copy(0, x)
            return
        axes = list(range(x.rank))
    m = reduce_to(ctx, x, ctx.temp("max", out.shape, out.dtype), axes, keepdims, "max=", "{x}",
                  step="max")
    ax = text.axes(out.rank)
    s = ctx.temp("sum", out.shape, out.dtype)
    idx, _ = indices_in(x.rank, axes, keepdims, ax)
    ctx.assign(s, ax, "+=", f"exp({ctx.access(x, idx)} - {ctx.access(m, ax)})", step="sum")
    ctx.assign(out, ax, "=", f"log({ctx.access(s, ax)}) + {ctx.access(m, ax)}")


def _softmax_axes(ctx: NodeContext, rank: int) -> list[int]:
    """Opset >= 13: one axis (default -1). Before: the input is flattened to 2-D at `axis`
    (default 1) and normalised over the whole second part."""
    if ctx.opset >= 13:
        return [ctx.axis("axis", -1, rank)]
    axis = ctx.axis("axis", 1, rank) if rank else 0
    return list(range(axis, rank))


def _softmax(kind: str):
    def convert(ctx: NodeContext) -> None:
        x, out = ctx.input(0), ctx.output(0)
        reduced = _softmax_axes(ctx, x.rank)
        small = reduced_shape(x.shape, reduced, False)
        ax = text.axes(x.rank)
        keep = keep_indices(x.rank, reduced, ax)
        m = reduce_to(ctx, x, ctx.temp("max", small, x.dtype), reduced, False, "max=", "{x}",
                      step="max")
        # The sum runs over the same axes, so its output axes read m directly.
        s = reduce_to(ctx, x, ctx.temp("sum", small, x.dtype), reduced, False, "+=",
                      "exp({x} - " + ctx.access(m, text.axes(m.rank)) + ")", step="sum")
        xa, ma, sa = ctx.access(x, ax), ctx.access(m, keep), ctx.access(s, keep)
        if kind == "softmax":
            body = f"exp({xa} - {ma}) / {sa}"
        else:
            body = f"{xa} - {ma} - log({sa})"
        ctx.assign(out, ax, "=", body)
    return convert


converter("Softmax", summary="m max= x; s += exp(x - m); y = exp(x - m) / s")(_softmax("softmax"))
converter("LogSoftmax", summary="m max= x; s += exp(x - m); y = x - m - log(s)")(
    _softmax("logsoftmax"))


@converter("LpNormalization", summary="n += |x|^p; y = x / n^(1/p) (0 where n is 0)")
def lp_normalization(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    axis = ctx.axis("axis", -1, x.rank)
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise ctx.unsupported(f"p={p}", "p must be 1 or 2")
    small = reduced_shape(x.shape, [axis], False)
    term = "abs({x})" if p == 1 else "{x} * {x}"
    n = reduce_to(ctx, x, ctx.temp("norm", small, x.dtype), [axis], False, "+=", term,
                  step="norm")
    ax = text.axes(x.rank)
    na = ctx.access(n, keep_indices(x.rank, [axis], ax))
    # a row of zeros stays zeros (onnxruntime and the ONNX reference), not 0 / 0
    ctx.assign(out, ax, "=", f"select({na} > 0, {ctx.access(x, ax)} / "
               + (na if p == 1 else f"sqrt({na})") + ", 0)")


@converter("MeanVarianceNormalization", summary="mean, variance, (x - mean) / sqrt(var + 1e-9)")
def mean_variance_normalization(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    axes = sorted(ctx.axes_in(ctx.attr("axes", [0, 2, 3]), x.rank))
    n = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    small = reduced_shape(x.shape, axes, False)
    ax = text.axes(x.rank)
    keep = keep_indices(x.rank, axes, ax)
    mean = reduce_to(ctx, x, ctx.temp("mean", small, x.dtype), axes, False, "+=",
                     "{x} / " + str(n), step="mean")
    mean_in = ctx.access(mean, text.axes(len(small)))
    var = reduce_to(ctx, x, ctx.temp("var", small, x.dtype), axes, False, "+=",
                    f"({{x}} - {mean_in}) * ({{x}} - {mean_in}) / {n}", step="var")
    ctx.assign(out, ax, "=", f"({ctx.access(x, ax)} - {ctx.access(mean, keep)}) / "
                             f"sqrt({ctx.access(var, keep)} + 1e-09)")


@converter("CumSum", summary="y[.., j, ..] += select(r <= j, x[.., r, ..], 0)")
def cumsum(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    axis = ctx.axes_in(ctx.require_const(1, "axis").reshape(-1)[:1], x.rank, "axis")[0]
    exclusive, reverse = ctx.flag("exclusive", 0), ctx.flag("reverse", 0)
    ax = text.axes(x.rank)
    j = ax[axis]
    cmp = {(0, 0): "r <= {j}", (1, 0): "r < {j}", (0, 1): "r >= {j}", (1, 1): "r > {j}"}
    cond = cmp[(int(bool(exclusive)), int(bool(reverse)))].format(j=j)
    idx = list(ax)
    idx[axis] = "r"
    ctx.assign(out, ax, "+=", f"select({cond}, {ctx.access(x, idx)}, 0)")
