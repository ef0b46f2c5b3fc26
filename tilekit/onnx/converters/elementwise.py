"""Elementwise ops: one `=` statement each, inputs broadcast by NumPy's rules.

Activations that the expression language has no function for are written with the ones it has
(`LeakyRelu` -> `select(x > 0, x, x*alpha)`, `Softplus` -> a stable `log`/`exp` form, `Gelu` ->
`erf` or `tanh` forms), so that later stages can fuse them into their producers.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from tilekit.onnx import text
from tilekit.onnx.dtypes import ONNX_DTYPES, elem_type_name
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter


def _emit(ctx: NodeContext, make: Callable[..., str], inputs: list[Value] | None = None,
          out_index: int = 0) -> None:
    """Emit `out[axes] = make(*reads)`, each input read broadcast to the output."""
    out = ctx.output(out_index)
    ax = text.axes(out.rank)
    reads = [ctx.read(v, ax, out.shape) for v in (inputs if inputs is not None
                                                    else ctx.inputs())]
    ctx.assign(out, ax, "=", make(*reads))


def _lit(ctx: NodeContext, value) -> str:
    """An attribute value as a literal in the output's dtype."""
    return text.literal(value, ctx.output(0).dtype)


# -- unary, no attributes ----------------------------------------------------------------

_UNARY = {
    "Abs": "abs({x})", "Neg": "-{x}", "Exp": "exp({x})", "Log": "log({x})",
    "Sqrt": "sqrt({x})", "Reciprocal": "1 / {x}", "Sigmoid": "sigmoid({x})",
    "Tanh": "tanh({x})", "Erf": "erf({x})", "Sign": "sign({x})", "Floor": "floor({x})",
    "Ceil": "ceil({x})", "Round": "round({x})", "Sin": "sin({x})", "Cos": "cos({x})",
    "Tan": "sin({x}) / cos({x})", "Relu": "max({x}, 0)", "Not": "!{x}",
    "Softsign": "{x} / (1 + abs({x}))",
    # log(1 + exp(x)) without overflow for large x.
    "Softplus": "max({x}, 0) + log(1 + exp(-abs({x})))",
    "Sinh": "(exp({x}) - exp(-{x})) / 2", "Cosh": "(exp({x}) + exp(-{x})) / 2",
    "Asinh": "log({x} + sqrt({x} * {x} + 1))", "Acosh": "log({x} + sqrt({x} * {x} - 1))",
    "Atanh": "log((1 + {x}) / (1 - {x})) / 2",
    "Asin": "asin({x})", "Acos": "acos({x})", "Atan": "atan({x})",
    "IsNaN": "{x} != {x}",
    "Mish": "{x} * tanh(max({x}, 0) + log(1 + exp(-abs({x}))))",
}


def _unary(template: str) -> Callable[[NodeContext], None]:
    def convert(ctx: NodeContext) -> None:
        _emit(ctx, lambda x: template.format(x=x), ctx.inputs()[:1])
    return convert


for _op, _template in _UNARY.items():
    converter(_op, summary=_template.format(x="x"))(_unary(_template))


# -- unary with attributes ---------------------------------------------------------------

@converter("LeakyRelu", ignore=("consumed_inputs",), summary="select(x > 0, x, x*alpha)")
def leaky_relu(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 0.01))
    _emit(ctx, lambda x: f"select({x} > 0, {x}, {x} * {alpha})", ctx.inputs()[:1])


@converter("Elu", ignore=("consumed_inputs",), summary="select(x > 0, x, alpha*(exp(x) - 1))")
def elu(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 1.0))
    _emit(ctx, lambda x: f"select({x} > 0, {x}, {alpha} * (exp({x}) - 1))", ctx.inputs()[:1])


@converter("Selu", ignore=("consumed_inputs",),
           summary="gamma * select(x > 0, x, alpha*(exp(x) - 1))")
def selu(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 1.6732632423543772848170429916717))
    gamma = _lit(ctx, ctx.attr("gamma", 1.0507009873554804934193349852946))
    _emit(ctx, lambda x: f"{gamma} * select({x} > 0, {x}, {alpha} * (exp({x}) - 1))",
          ctx.inputs()[:1])


@converter("Celu", summary="max(x, 0) + min(0, alpha*(exp(x/alpha) - 1))")
def celu(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 1.0))
    _emit(ctx, lambda x: f"max({x}, 0) + min(0, {alpha} * (exp({x} / {alpha}) - 1))",
          ctx.inputs()[:1])


@converter("ThresholdedRelu", summary="select(x > alpha, x, 0)")
def thresholded_relu(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 1.0))
    _emit(ctx, lambda x: f"select({x} > {alpha}, {x}, 0)", ctx.inputs()[:1])


@converter("HardSigmoid", ignore=("consumed_inputs",), summary="max(0, min(1, alpha*x + beta))")
def hard_sigmoid(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 0.2))
    beta = _lit(ctx, ctx.attr("beta", 0.5))
    _emit(ctx, lambda x: f"max(0, min(1, {alpha} * {x} + {beta}))", ctx.inputs()[:1])


@converter("Swish", summary="x * sigmoid(alpha*x)")
def swish(ctx: NodeContext) -> None:
    alpha = _lit(ctx, ctx.attr("alpha", 1.0))
    _emit(ctx, lambda x: f"{x} * sigmoid({alpha} * {x})", ctx.inputs()[:1])


@converter("HardSwish", summary="x * max(0, min(1, x/6 + 0.5))")
def hard_swish(ctx: NodeContext) -> None:
    _emit(ctx, lambda x: f"{x} * max(0, min(1, {x} / 6 + 0.5))", ctx.inputs()[:1])


@converter("Shrink", summary="select(x < -lambd, x + bias, select(x > lambd, x - bias, 0))")
def shrink(ctx: NodeContext) -> None:
    lambd = _lit(ctx, ctx.attr("lambd", 0.5))
    bias = _lit(ctx, ctx.attr("bias", 0.0))
    _emit(ctx, lambda x: f"select({x} < -{lambd}, {x} + {bias}, "
                         f"select({x} > {lambd}, {x} - {bias}, 0))", ctx.inputs()[:1])


@converter("Gelu", summary="0.5*x*(1 + erf(x/sqrt(2))), or the tanh form")
def gelu(ctx: NodeContext) -> None:
    approximate = ctx.attr("approximate", "none")
    if approximate == "tanh":
        k = _lit(ctx, math.sqrt(2.0 / math.pi))
        _emit(ctx, lambda x: f"0.5 * {x} * (1 + tanh({k} * ({x} + 0.044715 * {x} * {x} * {x})))",
              ctx.inputs()[:1])
    elif approximate == "none":
        k = _lit(ctx, 1.0 / math.sqrt(2.0))
        _emit(ctx, lambda x: f"0.5 * {x} * (1 + erf({x} * {k}))", ctx.inputs()[:1])
    else:
        raise ctx.unsupported(f"approximate='{approximate}'", "use 'none' or 'tanh'")


@converter("IsInf", summary="abs(x) == inf (per detect_negative/detect_positive)")
def is_inf(ctx: NodeContext) -> None:
    neg, pos = ctx.attr("detect_negative", 1), ctx.attr("detect_positive", 1)
    if neg and pos:
        make = lambda x: f"abs({x}) == inf"  # noqa: E731
    elif pos:
        make = lambda x: f"{x} == inf"  # noqa: E731
    elif neg:
        make = lambda x: f"{x} == -inf"  # noqa: E731
    else:
        make = lambda x: f"{x} != {x} && {x} == {x}"  # noqa: E731 - all false
    _emit(ctx, make, ctx.inputs()[:1])


@converter("Clip", ignore=("consumed_inputs",), summary="min(max(x, lo), hi)")
def clip(ctx: NodeContext) -> None:
    out = ctx.output(0)
    ax = text.axes(out.rank)
    x = ctx.read(ctx.input(0), ax, out.shape)
    if ctx.opset < 11:
        lo = ctx.attr("min", None)
        hi = ctx.attr("max", None)
        lo = None if lo is None else _lit(ctx, lo)
        hi = None if hi is None else _lit(ctx, hi)
    else:
        lo = ctx.read(ctx.input(1), ax, out.shape) if ctx.has_input(1) else None
        hi = ctx.read(ctx.input(2), ax, out.shape) if ctx.has_input(2) else None
    body = x
    if lo is not None:
        body = f"max({body}, {lo})"
    if hi is not None:
        body = f"min({body}, {hi})"
    ctx.assign(out, ax, "=", body)


@converter("Cast", summary="dtype(x)")
def cast(ctx: NodeContext) -> None:
    out = ctx.output(0)
    to = ctx.attr("to")
    if to not in ONNX_DTYPES:
        raise ctx.unsupported(f"cast to element type {elem_type_name(to)}",
                              f"supported: {', '.join(sorted(set(ONNX_DTYPES.values())))}")
    ctx.attr("saturate")
    ctx.attr("round_mode")
    x = ctx.input(0)
    _emit(ctx, lambda v: f"{out.dtype}({v})" if x.dtype != out.dtype else v, [x])


@converter("CastLike", ignore=("saturate",), summary="dtype(x)")
def cast_like(ctx: NodeContext) -> None:
    out = ctx.output(0)
    _emit(ctx, lambda v: f"{out.dtype}({v})", ctx.inputs()[:1])


@converter("Identity", summary="no op (an alias; a copy when it is a graph output)")
def identity(ctx: NodeContext) -> None:
    ctx.alias(0, ctx.input(0))


@converter("Dropout", ignore=("ratio", "is_test", "seed", "consumed_inputs"),
           summary="inference: identity; mask output all true")
def dropout(ctx: NodeContext) -> None:
    training = ctx.const(2) if ctx.has_input(2) else None
    if ctx.has_input(2) and (training is None or bool(np.asarray(training).reshape(-1)[0])):
        raise ctx.unsupported("training_mode must be a constant false",
                              "export the model in inference (eval) mode")
    ctx.alias(0, ctx.input(0))
    if ctx.n_outputs > 1 and ctx.output_used(1):
        mask = ctx.output(1)
        ax = text.axes(mask.rank)
        ctx.assign(mask, ax, "=", "1", step="mask")


# -- binary and variadic -----------------------------------------------------------------

_BINARY = {
    "Add": "{a} + {b}", "Sub": "{a} - {b}", "Mul": "{a} * {b}", "Div": "{a} / {b}",
    "Pow": "pow({a}, {b})", "Equal": "{a} == {b}", "Less": "{a} < {b}",
    "LessOrEqual": "{a} <= {b}", "Greater": "{a} > {b}", "GreaterOrEqual": "{a} >= {b}",
    "And": "{a} && {b}", "Or": "{a} || {b}", "Xor": "{a} != {b}",
}


def _binary(template: str) -> Callable[[NodeContext], None]:
    def convert(ctx: NodeContext) -> None:
        a, b = ctx.input(0), ctx.input(1)
        out = ctx.output(0)
        ax = text.axes(out.rank)
        axis = ctx.attr("axis")
        legacy = ctx.opset < 7 and ctx.attr("broadcast", 0)
        if legacy and axis is not None and 0 < b.rank < out.rank and b.size > 1:
            # Opset < 7 broadcasting: b's dimensions line up with a's from `axis` on.
            start = axis % out.rank
            rb = ctx.access(b, [ax[start + d] if n == out.shape[start + d] else "0"
                                for d, n in enumerate(b.shape)])
        else:
            rb = ctx.read(b, ax, out.shape)
        ctx.assign(out, ax, "=", template.format(a=ctx.read(a, ax, out.shape), b=rb))
    return convert


for _op, _template in _BINARY.items():
    converter(_op, ignore=("consumed_inputs",),
              summary=_template.format(a="a", b="b"))(_binary(_template))


@converter("Mod", summary="a - floor(a/b)*b (fmod=0), a - b*trunc(a/b) (fmod=1)")
def mod(ctx: NodeContext) -> None:
    if ctx.attr("fmod", 0):
        _emit(ctx, lambda a, b: f"{a} - {b} * sign({a} / {b}) * floor(abs({a} / {b}))")
    else:
        _emit(ctx, lambda a, b: f"{a} - floor({a} / {b}) * {b}")


@converter("PRelu", ignore=("consumed_inputs",), summary="select(x > 0, x, x*slope)")
def prelu(ctx: NodeContext) -> None:
    x, slope = ctx.input(0), ctx.input(1)
    if ctx.opset < 7 and 1 <= slope.rank < x.rank and slope.shape[0] == x.shape[1] \
            and slope.shape[0] > 1 and slope.const is not None:
        # Opset < 7: a slope of shape [C] (or [C, 1, ...]) is per channel (axis 1), not
        # aligned with the last axis as NumPy broadcasting would have it.
        array = slope.const.reshape((slope.shape[0],) + (1,) * (x.rank - 2))
        slope = ctx.weight("slope", array)
    _emit(ctx, lambda v, s: f"select({v} > 0, {v}, {v} * {s})", [x, slope])


@converter("Where", summary="select(c, a, b)")
def where(ctx: NodeContext) -> None:
    _emit(ctx, lambda c, a, b: f"select({c}, {a}, {b})")


def _variadic(kind: str) -> Callable[[NodeContext], None]:
    def convert(ctx: NodeContext) -> None:
        inputs = ctx.inputs()
        if len(inputs) == 1:
            ctx.copy(0, inputs[0])
            return

        def make(*reads: str) -> str:
            if kind in ("max", "min"):
                return text.nest(kind, list(reads))
            total = text.balanced_sum(list(reads))
            return total if kind == "sum" else f"({total}) / {len(reads)}"
        _emit(ctx, make, inputs)
    return convert


converter("Sum", ignore=("consumed_inputs",), summary="a + b + ...")(_variadic("sum"))
converter("Mean", ignore=("consumed_inputs",), summary="(a + b + ...) / n")(_variadic("mean"))
converter("Max", ignore=("consumed_inputs",), summary="max(a, max(b, ...))")(_variadic("max"))
converter("Min", ignore=("consumed_inputs",), summary="min(a, min(b, ...))")(_variadic("min"))


# -- quantisation ------------------------------------------------------------------------

def _per_axis(ctx: NodeContext, v: Value | None, ax: list[str], shape, axis: int) -> str:
    """A scale or zero point: a scalar (read broadcast) or 1-D along `axis`."""
    if v is None:
        return "0"
    if v.rank == 1 and v.shape[0] > 1:
        return ctx.access(v, [ax[axis % len(ax)]])
    return ctx.read(v, ax, shape)


@converter("DequantizeLinear", summary="(float(x) - float(zero_point)) * scale")
def dequantize_linear(ctx: NodeContext) -> None:
    x, scale, zero = ctx.input(0), ctx.input(1), ctx.input(2)
    out = ctx.output(0)
    axis = ctx.attr("axis", 1)
    if ctx.attr("block_size", 0):
        raise ctx.unsupported("blocked quantisation (block_size)")
    ax = text.axes(out.rank)
    s = _per_axis(ctx, scale, ax, out.shape, axis)
    z = _per_axis(ctx, zero, ax, out.shape, axis)
    xf = f"{out.dtype}({ctx.read(x, ax, out.shape)})"
    body = f"{xf} * {s}" if z == "0" else f"({xf} - {out.dtype}({z})) * {s}"
    ctx.assign(out, ax, "=", body)


_INT_RANGE = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767),
              "int32": (-2**31, 2**31 - 1)}


@converter("QuantizeLinear", summary="min(max(round(x / scale) + zero_point, lo), hi)")
def quantize_linear(ctx: NodeContext) -> None:
    x, scale, zero = ctx.input(0), ctx.input(1), ctx.input(2)
    out = ctx.output(0)
    axis = ctx.attr("axis", 1)
    ctx.attr("saturate")      # float8 outputs only: none of the types below
    ctx.attr("output_dtype")  # opset 21: the output's type, which inference already gives
    if ctx.attr("block_size", 0) or out.dtype not in _INT_RANGE:
        raise ctx.unsupported(f"quantising to {out.dtype} or blocked quantisation")
    lo, hi = _INT_RANGE[out.dtype]
    ax = text.axes(out.rank)
    s = _per_axis(ctx, scale, ax, out.shape, axis)
    z = _per_axis(ctx, zero, ax, out.shape, axis)
    q = f"round({ctx.read(x, ax, out.shape)} / {s})"
    if z != "0":
        q = f"{q} + {z}"
    ctx.assign(out, ax, "=", f"min(max({q}, {text.literal(lo)}), {hi})")
