"""Convolution, pooling and normalisation.

- Conv (1-3 spatial dims, strides, dilations, pads incl. auto_pad, groups, depthwise): one
  `+=` statement over input channels and kernel offsets, `pad: '0'` where a window leaves the
  input; a bias is a second statement. A BatchNormalization that alone reads a Conv with
  constant weights is folded into them (computed in float64, cast back).
- ConvTranspose: a gather form. Stride 1: `x[.., o + p - k*d]`; stride s, dilation 1: output
  phases, `x[.., (o + p) // s - j] * w[.., (o + p) % s + j*s]`. Other cases are opaque.
- MaxPool / AveragePool: `max=` / `+=` over window axes given in `axes:`; the average divides by
  a constant or, where windows are clipped by padding, by a count computed from axis values with
  min/max (count_include_pad both ways, ceil_mode).
- BatchNormalization (inference), InstanceNormalization, LayerNormalization,
  RMSNormalization, GroupNormalization, LRN: decomposed into reductions and one elementwise statement.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.converters.registry import converter
from tilekit.onnx.converters.reduce import reduce_to, reduced_shape


def spatial_names(n: int) -> list[str]:
    return {1: ["w"], 2: ["h", "w"], 3: ["d", "h", "w"]}.get(n, [f"s{i}" for i in range(n)])


def _pads(ctx: NodeContext, in_sizes: Sequence[int], kernel: Sequence[int],
          strides: Sequence[int], dilations: Sequence[int]) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial dimension, auto_pad resolved."""
    n = len(in_sizes)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    pads = ctx.attr("pads")
    if auto_pad in ("NOTSET", "", None):
        pads = list(pads) if pads else [0] * (2 * n)
        return [(int(pads[i]), int(pads[i + n])) for i in range(n)]
    if auto_pad == "VALID":
        return [(0, 0)] * n
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
            o = -(-size // s)
            total = max((o - 1) * s + (k - 1) * d + 1 - size, 0)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            out.append((begin, total - begin))
        return out
    raise ctx.unsupported(f"auto_pad='{auto_pad}'")


def _window(ctx: NodeContext, x: Value, kernel: Sequence[int]):
    n = x.rank - 2
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    pads = _pads(ctx, x.shape[2:], kernel, strides, dilations)
    return strides, dilations, pads


def _window_leaves(kernel, strides, dilations, pads, in_sizes, out_sizes) -> bool:
    for k, s, d, (pb, _), size, o in zip(kernel, strides, dilations, pads, in_sizes, out_sizes):
        if pb > 0 or (o - 1) * s + (k - 1) * d - pb > size - 1:
            return True
    return False


# -- Conv --------------------------------------------------------------------------------

def _folded_batchnorm(ctx: NodeContext, w: Value, b: Value | None):
    """If a BatchNormalization alone reads this Conv's output and everything is constant,
    absorb it: returns (its context, folded weight array, folded bias array)."""
    bn = ctx.sole_consumer(0)
    if bn is None or bn.op_type != "BatchNormalization" or w.const is None:
        return None
    if b is not None and b.const is None:
        return None
    probe = ctx.peek(bn)
    params = [probe.const(i) for i in range(1, 5)]
    if any(p is None for p in params) or probe.attrs.get("training_mode", 0) \
            or probe.attrs.get("spatial", 1) != 1 \
            or any(probe.output_used(i) for i in range(1, probe.n_outputs)):
        return None
    bctx = ctx.absorb(bn)
    scale, bias, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
    eps = float(bctx.attr("epsilon", 1e-5))
    a = scale / np.sqrt(var + eps)
    weight = w.const.astype(np.float64) * a.reshape((-1,) + (1,) * (w.rank - 1))
    conv_bias = b.const.astype(np.float64) if b is not None else 0.0
    shift = (conv_bias - mean) * a + bias
    return bctx, weight.astype(w.const.dtype), shift.astype(w.const.dtype)


@converter("Conv", summary="y += x[n, c, h*s + kh*d - p, ...] * w[f, c, kh, ...]; + b[f]")
def conv(ctx: NodeContext) -> None:
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    out = ctx.output(0)
    nsp = x.rank - 2
    if nsp < 1:
        raise ctx.unsupported(f"input of rank {x.rank}")
    kernel = list(w.shape[2:])
    if ctx.attr("kernel_shape") and list(ctx.attr("kernel_shape")) != kernel:
        raise ctx.unsupported("kernel_shape disagrees with the weight shape")
    group = int(ctx.attr("group", 1))
    strides, dilations, pads = _window(ctx, x, kernel)
    folded = _folded_batchnorm(ctx, w, b)
    if folded is not None:
        bctx, weight, shift = folded
        out = bctx.output(0)
        w = ctx.rewritten(1, weight, "w")
        b = ctx.rewritten(2, shift, "b") if b is not None else \
            bctx.rewritten(2, shift, "b")
    f_total, cg = w.shape[0], w.shape[1]
    fg = f_total // group
    sp = spatial_names(nsp)
    ksp = [f"k{s}" for s in sp]
    # Input channel read by output channel f and reduction channel c.
    if group == 1:
        x_chan, w_chan = ("c", "c") if cg > 1 else ("0", "0")
    elif cg == 1:
        x_chan, w_chan = ("f" if fg == 1 else f"f // {fg}"), "0"
    else:
        x_chan, w_chan = (f"(f // {fg})*{cg} + c" if fg > 1 else f"f*{cg} + c"), "c"
    wi = ctx.access(w, ["f", w_chan] + [k if kk > 1 else "0" for k, kk in zip(ksp, kernel)])
    leaves = _window_leaves(kernel, strides, dilations, pads, x.shape[2:], out.shape[2:])
    pad = "0" if leaves else None
    # Kernel axes of extent 1 are read as 0 in w; in x they must go too.
    xi = ctx.access(x, ["n", x_chan] + [
        text.term([(s, st), (k, d if kk > 1 else 0)], -pb)
        for s, k, st, d, (pb, _), kk in zip(sp, ksp, strides, dilations, pads, kernel)])
    ax = ["n", "f"] + sp
    if b is None:
        ctx.assign(out, ax, "+=", f"{xi} * {wi}", pad=pad)
        return
    acc = ctx.temp("conv", out.shape, out.dtype)
    ctx.assign(acc, ax, "+=", f"{xi} * {wi}", pad=pad, step="conv")
    ctx.assign(out, ax, "=", f"{ctx.access(acc, ax)} + {ctx.access(b, ['f'])}")


@converter("ConvTranspose", summary="gather form over output phases; opaque when dilated "
                                    "and strided")
def conv_transpose(ctx: NodeContext) -> None:
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    out = ctx.output(0)
    nsp = x.rank - 2
    kernel = list(w.shape[2:])
    group = int(ctx.attr("group", 1))
    strides = list(ctx.attr("strides") or [1] * nsp)
    dilations = list(ctx.attr("dilations") or [1] * nsp)
    ctx.attr("kernel_shape")
    begins = _transpose_pad_begins(ctx, x.shape[2:], out.shape[2:], kernel, strides, dilations)
    if any(s > 1 and d > 1 for s, d in zip(strides, dilations)):
        attrs = {"strides": strides, "dilations": dilations, "group": group,
                 "pads_begin": begins, "output_shape": list(out.shape)}
        ctx.opaque("ConvTranspose", [x, w, b], [out], attrs)
        return
    cg, fg = x.shape[1] // group, w.shape[1]
    sp = spatial_names(nsp)
    x_idx, w_idx, extents = [], [], {}
    for s, st, d, pb, k in zip(sp, strides, dilations, begins, kernel):
        if st == 1:
            x_idx.append(text.term([(s, 1), (f"k{s}", -d)], pb))
            w_idx.append(f"k{s}")
        else:
            j = f"j{s}"
            shifted = text.term([(s, 1)], pb)
            x_idx.append(f"({shifted}) // {st} - {j}" if pb else f"{s} // {st} - {j}")
            w_idx.append(f"({shifted}) % {st} + {j}*{st}" if pb else f"{s} % {st} + {j}*{st}")
            extents[j] = -(-k // st)
    if group == 1:
        x_chan, w_chan, w_out = "c", "c", "f"
    else:
        x_chan = f"(f // {fg})*{cg} + c" if fg > 1 else f"f*{cg} + c"
        w_chan, w_out = x_chan, (f"f % {fg}" if fg > 1 else "0")
        extents["c"] = cg
    ax = ["n", "f"] + sp
    body = f"{ctx.access(x, ['n', x_chan] + x_idx)} * {ctx.access(w, [w_chan, w_out] + w_idx)}"
    if b is None:
        ctx.assign(out, ax, "+=", body, pad="0", extents=extents)
        return
    acc = ctx.temp("convt", out.shape, out.dtype)
    ctx.assign(acc, ax, "+=", body, pad="0", extents=extents, step="convt")
    ctx.assign(out, ax, "=", f"{ctx.access(acc, ax)} + {ctx.access(b, ['f'])}")


def _transpose_pad_begins(ctx: NodeContext, in_sizes, out_sizes, kernel, strides,
                          dilations) -> list[int]:
    n = len(in_sizes)
    out_pad = list(ctx.attr("output_padding") or [0] * n)
    output_shape = ctx.attr("output_shape")
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    pads = ctx.attr("pads")
    if output_shape is None and auto_pad in ("NOTSET", "", None, "VALID"):
        if auto_pad == "VALID" or not pads:
            return [0] * n
        return [int(p) for p in pads[:n]]
    target = list(output_shape)[-n:] if output_shape is not None else \
        [size * s for size, s in zip(in_sizes, strides)]
    begins = []
    for size, k, s, d, op, o in zip(in_sizes, kernel, strides, dilations, out_pad, target):
        total = s * (size - 1) + op + (k - 1) * d + 1 - o
        begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    return begins


# -- pooling -----------------------------------------------------------------------------

def _pool_setup(ctx: NodeContext):
    x, out = ctx.input(0), ctx.output(0)
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = _window(ctx, x, kernel)
    if ctx.attr("ceil_mode", 0):  # the output extent comes from shape inference, unless...
        for d, (size, o, st, (pb, _)) in enumerate(zip(x.shape[2:], out.shape[2:], strides,
                                                       pads)):
            if (o - 1) * st - pb >= size:
                raise ctx.unsupported(
                    f"ceil_mode=1 where the last window along spatial axis {d} starts in the "
                    f"right padding: ONNX shape inference gives {o} outputs, the operator's "
                    f"definition (and onnxruntime) {o - 1}; set ceil_mode=0 or smaller pads")
    sp = spatial_names(len(kernel))
    ksp = [f"k{s}" for s in sp]
    reads = [text.term([(s, st), (k, d)], -pb)
             for s, k, st, d, (pb, _) in zip(sp, ksp, strides, dilations, pads)]
    leaves = _window_leaves(kernel, strides, dilations, pads, x.shape[2:], out.shape[2:])
    return x, out, kernel, strides, dilations, pads, sp, ksp, reads, leaves


@converter("MaxPool", ignore=("storage_order",),
           summary="y max= x[n, c, h*s + kh*d - p, ...] (pad -inf)")
def max_pool(ctx: NodeContext) -> None:
    if ctx.n_outputs > 1 and ctx.output_used(1):
        raise ctx.unsupported("the Indices output is not supported")
    x, out, kernel, strides, dilations, pads, sp, ksp, reads, leaves = _pool_setup(ctx)
    ax = ["n", "c"] + sp
    ctx.assign(out, ax, "max=", ctx.access(x, ["n", "c"] + reads),
               pad="-inf" if leaves else None, extents=dict(zip(ksp, kernel)))


@converter("AveragePool", summary="y += x[n, c, h*s + kh*d - p, ...] / count")
def average_pool(ctx: NodeContext) -> None:
    x, out, kernel, strides, dilations, pads, sp, ksp, reads, leaves = _pool_setup(ctx)
    include_pad = bool(ctx.attr("count_include_pad", 0))
    const, factors = 1, []
    for s, k, st, d, (pb, pe), size, o in zip(sp, kernel, strides, dilations, pads,
                                              x.shape[2:], out.shape[2:]):
        start = text.term([(s, st)], -pb)
        if include_pad:
            hi = size + pe  # windows are clipped to the padded input (ceil_mode overhang)
            if (o - 1) * st - pb + (k - 1) * d + 1 <= hi:
                const *= k
            elif d == 1:
                factors.append(f"(min({text.term([(s, st)], k - pb)}, {hi}) - ({start}))")
            else:
                factors.append(f"(min({k - 1}, floor(({text.term([(s, -st)], hi - 1 + pb)}) "
                               f"/ {d})) + 1)")
        else:
            if pb == 0 and (o - 1) * st + (k - 1) * d + 1 <= size:
                const *= k
            elif d == 1:
                factors.append(f"(min({text.term([(s, st)], k - pb)}, {size}) - "
                               f"max({start}, 0))")
            else:
                factors.append(f"(min({k - 1}, floor(({text.term([(s, -st)], size - 1 + pb)}) "
                               f"/ {d})) - max(0, ceil(({text.term([(s, -st)], pb)}) / {d})) "
                               "+ 1)")
    divisor = " * ".join(([str(const)] if const != 1 or not factors else []) + factors)
    if len(factors) + (const != 1) > 1:
        divisor = f"({divisor})"
    ax = ["n", "c"] + sp
    ctx.assign(out, ax, "+=", f"{ctx.access(x, ['n', 'c'] + reads)} / {divisor}",
               pad="0" if leaves else None, extents=dict(zip(ksp, kernel)))


@converter("LpPool", summary="t += pow(abs(x), p); y = pow(t, 1/p)")
def lp_pool(ctx: NodeContext) -> None:
    x, out, kernel, strides, dilations, pads, sp, ksp, reads, leaves = _pool_setup(ctx)
    p = ctx.attr("p", 2)
    ax = ["n", "c"] + sp
    acc = ctx.temp("acc", out.shape, out.dtype)
    xa = ctx.access(x, ["n", "c"] + reads)
    term = f"{xa} * {xa}" if p == 2 else f"pow(abs({xa}), {p})"
    ctx.assign(acc, ax, "+=", term, pad="0" if leaves else None,
               extents=dict(zip(ksp, kernel)), step="acc")
    root = f"sqrt({ctx.access(acc, ax)})" if p == 2 else \
        f"pow({ctx.access(acc, ax)}, {text.literal(1.0 / p, out.dtype)})"
    ctx.assign(out, ax, "=", root)


def _global(kind: str):
    def convert(ctx: NodeContext) -> None:
        x, out = ctx.input(0), ctx.output(0)
        reduced = list(range(2, x.rank))
        n = int(np.prod(x.shape[2:], dtype=np.int64))
        if kind == "avg":
            reduce_to(ctx, x, out, reduced, True, "+=", "{x} / " + str(n))
        elif kind == "max":
            reduce_to(ctx, x, out, reduced, True, "max=", "{x}")
        else:
            p = ctx.attr("p", 2)
            acc = reduce_to(ctx, x, ctx.temp("acc", out.shape, out.dtype), reduced, True, "+=",
                            "pow(abs({x}), " + str(p) + ")", step="acc")
            ax = text.axes(out.rank)
            ctx.assign(out, ax, "=", f"pow({ctx.access(acc, ax)}, "
                                     f"{text.literal(1.0 / p, out.dtype)})")
    return convert


converter("GlobalAveragePool", summary="y += x / (H*W)")(_global("avg"))
converter("GlobalMaxPool", summary="y max= x")(_global("max"))
converter("GlobalLpPool", summary="t += pow(abs(x), p); y = pow(t, 1/p)")(_global("lp"))


# -- normalisation -----------------------------------------------------------------------

@converter("BatchNormalization", ignore=("momentum", "consumed_inputs", "is_test"),
           summary="inference: y = x*a[c] + b[c] (a, b folded at import); folded into a "
                   "preceding Conv when it alone reads it")
def batch_normalization(ctx: NodeContext) -> None:
    if ctx.attr("training_mode", 0):
        raise ctx.unsupported("training_mode=1", "export the model in inference (eval) mode")
    if ctx.attr("spatial", 1) != 1:
        raise ctx.unsupported("spatial=0")
    for i in range(1, ctx.n_outputs):
        if ctx.output_used(i):
            raise ctx.unsupported(f"output {i} (training statistics) is used")
    x, out = ctx.input(0), ctx.output(0)
    eps = float(ctx.attr("epsilon", 1e-5))
    ax = text.axes(x.rank)
    chan = [ax[1]] if x.rank > 1 else ["0"]
    params = [ctx.const(i) for i in range(1, 5)]
    xa = ctx.access(x, ax)
    if all(p is not None for p in params):
        scale, bias, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
        a = scale / np.sqrt(var + eps)
        shift = bias - mean * a
        dtype = np.dtype(params[0].dtype)
        av = ctx.weight("scale", a.astype(dtype))
        bv = ctx.weight("shift", shift.astype(dtype))
        ctx.assign(out, ax, "=", f"{xa} * {ctx.access(av, chan)} + {ctx.access(bv, chan)}")
        return
    scale, bias, mean, var = (ctx.access(ctx.input(i), chan) for i in range(1, 5))
    e = text.literal(eps, x.dtype)
    ctx.assign(out, ax, "=", f"({xa} - {mean}) / sqrt({var} + {e}) * {scale} + {bias}")


def _moments(ctx: NodeContext, x: Value, reduced: list[int], extents_of_mean: dict | None = None
             ) -> tuple[Value, Value]:
    """mean and (biased) variance over `reduced`, keepdims=False: two statements."""
    n = int(np.prod([x.shape[d] for d in reduced], dtype=np.int64))
    small = reduced_shape(x.shape, reduced, False)
    mean = reduce_to(ctx, x, ctx.temp("mean", small, x.dtype), reduced, False, "+=",
                     "{x} / " + str(n), step="mean")
    m = ctx.access(mean, text.axes(len(small)))
    var = reduce_to(ctx, x, ctx.temp("var", small, x.dtype), reduced, False, "+=",
                    f"({{x}} - {m}) * ({{x}} - {m}) / {n}", step="var")
    return mean, var


@converter("InstanceNormalization", ignore=("consumed_inputs",),
           summary="mean, var over spatial dims; (x - mean) / sqrt(var + eps) * s[c] + b[c]")
def instance_normalization(ctx: NodeContext) -> None:
    x, scale, bias, out = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0)
    eps = text.literal(ctx.attr("epsilon", 1e-5), x.dtype)
    mean, var = _moments(ctx, x, list(range(2, x.rank)))
    ax = text.axes(x.rank)
    nc = ax[:2]
    ctx.assign(out, ax, "=", f"({ctx.access(x, ax)} - {ctx.access(mean, nc)}) / "
                             f"sqrt({ctx.access(var, nc)} + {eps}) * "
                             f"{ctx.access(scale, [ax[1]])} + {ctx.access(bias, [ax[1]])}")


@converter("LayerNormalization", ignore=("stash_type",),
           summary="mean, var over the trailing dims; (x - mean) / sqrt(var + eps) * s + b")
def layer_normalization(ctx: NodeContext) -> None:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    out = ctx.output(0)
    axis = ctx.axis("axis", -1, x.rank)
    eps = text.literal(ctx.attr("epsilon", 1e-5), x.dtype)
    reduced = list(range(axis, x.rank))
    mean, var = _moments(ctx, x, reduced)
    ax = text.axes(x.rank)
    lead = ax[:axis]
    body = (f"({ctx.access(x, ax)} - {ctx.access(mean, lead)}) / "
            f"sqrt({ctx.access(var, lead)} + {eps}) * {ctx.read(scale, ax, x.shape)}")
    if bias is not None:
        body += f" + {ctx.read(bias, ax, x.shape)}"
    ctx.assign(out, ax, "=", body)
    if ctx.n_outputs > 1 and ctx.output_used(1):
        m = ctx.output(1)
        ctx.assign(m, text.axes(m.rank), "=", ctx.access(mean, text.axes(m.rank)[:axis]),
                   step="mean_out")
    if ctx.n_outputs > 2 and ctx.output_used(2):
        r = ctx.output(2)
        ctx.assign(r, text.axes(r.rank), "=",
                   f"1 / sqrt({ctx.access(var, text.axes(r.rank)[:axis])} + {eps})",
                   step="inv_std")


@converter("RMSNormalization", ignore=("stash_type",),
           summary="t += x*x / n over the trailing dims; y = x / sqrt(t + eps) * s")
def rms_normalization(ctx: NodeContext) -> None:
    x, scale, out = ctx.input(0), ctx.input(1), ctx.output(0)
    axis = ctx.axis("axis", -1, x.rank)
    eps = text.literal(ctx.attr("epsilon", 1e-5), x.dtype)
    reduced = list(range(axis, x.rank))
    n = int(np.prod([x.shape[d] for d in reduced], dtype=np.int64))
    small = reduced_shape(x.shape, reduced, False)
    ms = reduce_to(ctx, x, ctx.temp("meansq", small, x.dtype), reduced, False, "+=",
                   "{x} * {x} / " + str(n), step="meansq")
    ax = text.axes(x.rank)
    ctx.assign(out, ax, "=", f"{ctx.access(x, ax)} / sqrt({ctx.access(ms, ax[:axis])} + {eps})"
                             f" * {ctx.read(scale, ax, x.shape)}")


@converter("GroupNormalization", ignore=("stash_type",),
           summary="mean, var per (n, group); (x - mean) / sqrt(var + eps) * s + b")
def group_normalization(ctx: NodeContext) -> None:
    x, scale, bias, out = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0)
    groups = int(ctx.attr("num_groups"))
    eps = text.literal(ctx.attr("epsilon", 1e-5), x.dtype)
    cg = x.shape[1] // groups
    n = cg * int(np.prod(x.shape[2:], dtype=np.int64))
    sp = [f"r{d}" for d in range(2, x.rank)]
    xa = ctx.access(x, ["i", f"g*{cg} + c"] + sp)
    mean = ctx.temp("mean", (x.shape[0], groups), x.dtype)
    var = ctx.temp("var", (x.shape[0], groups), x.dtype)
    ctx.assign(mean, ["i", "g"], "+=", f"{xa} / {n}", extents={"c": cg}, step="mean")
    m = ctx.access(mean, ["i", "g"])
    ctx.assign(var, ["i", "g"], "+=", f"({xa} - {m}) * ({xa} - {m}) / {n}", extents={"c": cg},
               step="var")
    ax = text.axes(x.rank)
    grp = [ax[0], f"{ax[1]} // {cg}"]
    per_channel = scale.shape[0] == x.shape[1] and (ctx.opset >= 21 or groups != x.shape[1])
    sidx = [ax[1]] if per_channel else [f"{ax[1]} // {cg}"]
    ctx.assign(out, ax, "=", f"({ctx.access(x, ax)} - {ctx.access(mean, grp)}) / "
                             f"sqrt({ctx.access(var, grp)} + {eps}) * {ctx.access(scale, sidx)}"
                             f" + {ctx.access(bias, sidx)}")


@converter("LRN", summary="s += x[n, c + k - (size-1)/2, ...]^2; y = x / pow(bias + "
                          "alpha/size*s, beta)")
def lrn(ctx: NodeContext) -> None:
    x, out = ctx.input(0), ctx.output(0)
    size = int(ctx.attr("size"))
    alpha = ctx.attr("alpha", 1e-4)
    beta = ctx.attr("beta", 0.75)
    bias = ctx.attr("bias", 1.0)
    pre = (size - 1) // 2
    ax = text.axes(x.rank)
    shifted = list(ax)
    shifted[1] = text.term([(ax[1], 1), ("r", 1)], -pre)
    xs = ctx.access(x, shifted)
    sq = ctx.temp("sqsum", x.shape, x.dtype)
    ctx.assign(sq, ax, "+=", f"{xs} * {xs}", pad="0", extents={"r": size}, step="sqsum")
    dt = x.dtype
    ctx.assign(out, ax, "=", f"{ctx.access(x, ax)} / pow({text.literal(bias, dt)} + "
                             f"{text.literal(alpha / size, dt)} * {ctx.access(sq, ax)}, "
                             f"{text.literal(beta, dt)})")

