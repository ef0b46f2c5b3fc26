"""Ops that are not tensor expressions become explicit opaque ops (see `tilekit.opaque`).

Where a constant makes an op affine it is written as an expression instead: Resize/Upsample in
nearest mode with integer scale factors (and a coordinate mode that maps to `x // s`) is
`y[n, c, h, w] = x[n, c, h // 2, w // 2]`; any other float Resize with constant scales or
sizes (linear, cubic, nearest by other factors) is separable, one contraction with a constant
interpolation matrix per resized axis; Gather with constant indices is in `layout`.
"""

from __future__ import annotations

import numpy as np

from tilekit.onnx import text
from tilekit.onnx.context import NodeContext
from tilekit.onnx.converters.registry import converter


@converter("GatherElements", summary="opaque GatherElements")
def gather_elements(ctx: NodeContext) -> None:
    x, ind, out = ctx.input(0), ctx.input(1), ctx.output(0)
    ctx.opaque("GatherElements", [x, ind], [out], {"axis": ctx.axis("axis", 0, x.rank)})


@converter("GatherND", summary="constant indices affine in their position: an index map; "
                               "otherwise opaque GatherND")
def gather_nd(ctx: NodeContext) -> None:
    # The dynamo exporter reads an attention mask at constant (batch, key) index grids:
    # as an index map it is a statement later stages can fuse and CUDA can run.
    x, ind, out = ctx.input(0), ctx.input(1), ctx.output(0)
    batch = int(ctx.attr("batch_dims", 0))
    reads = _gather_nd_indices(x, ind, out, batch)
    if reads is None:
        ctx.opaque("GatherND", ctx.inputs(), [out], {"batch_dims": batch})
        return
    ctx.assign(out, text.axes(out.rank), "=", ctx.access(x, reads))


def _gather_nd_indices(x, ind, out, batch: int) -> list[str] | None:
    """The index of `x` read at each output point when GatherND's constant indices are
    affine in their position, else None."""
    if ind.const is None or ind.rank < 1 or not 0 <= batch < ind.rank:
        return None
    k = ind.shape[-1]
    if not 1 <= k <= x.rank - batch or ind.size == 0:
        return None
    ax = text.axes(out.rank)
    grid = ax[:ind.rank - 1]
    values = ind.const.astype(np.int64)
    reads = list(ax[:batch])
    for c in range(k):
        size = x.shape[batch + c]
        component = values[..., c]
        if component.min() < -size or component.max() >= size:
            return None        # out of range: the opaque op reports it at run time
        index = text.affine_index(component % size, grid)
        if index is None:
            return None
        reads.append(index)
    return reads + ax[ind.rank - 1:]


@converter("ScatterND", summary="opaque ScatterND")
def scatter_nd(ctx: NodeContext) -> None:
    ctx.opaque("ScatterND", ctx.inputs(), [ctx.output(0)],
               {"reduction": ctx.attr("reduction", "none")})


@converter("ScatterElements", "Scatter", summary="opaque ScatterElements")
def scatter_elements(ctx: NodeContext) -> None:
    x = ctx.input(0)
    ctx.opaque("ScatterElements", ctx.inputs(), [ctx.output(0)],
               {"axis": ctx.axis("axis", 0, x.rank),
                "reduction": ctx.attr("reduction", "none")})


@converter("TopK", summary="opaque TopK (k constant)")
def topk(ctx: NodeContext) -> None:
    x = ctx.input(0)
    k = int(ctx.attr("k")) if ctx.opset < 10 else int(ctx.require_const(1, "k").reshape(-1)[0])
    outs = [ctx.output(0), ctx.output(1)]
    ctx.opaque("TopK", [x], outs, {"axis": ctx.axis("axis", -1, x.rank), "k": k,
                                   "largest": ctx.flag("largest", 1),
                                   "sorted": ctx.flag("sorted", 1)})


def _arg(kind: str):
    def convert(ctx: NodeContext) -> None:
        x = ctx.input(0)
        ctx.opaque(kind, [x], [ctx.output(0)],
                   {"axis": ctx.axis("axis", 0, x.rank), "keepdims": ctx.flag("keepdims", 1),
                    "select_last_index": ctx.flag("select_last_index", 0)})
    return convert


converter("ArgMax", summary="opaque ArgMax")(_arg("ArgMax"))
converter("ArgMin", summary="opaque ArgMin")(_arg("ArgMin"))

#: (coordinate_transformation_mode, nearest_mode) pairs where nearest resizing by an integer
#: factor s reads source index `o // s`.
_FLOOR_DIV_MODES = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                    ("half_pixel", "round_prefer_ceil"),
                    ("pytorch_half_pixel", "round_prefer_floor"),
                    ("pytorch_half_pixel", "round_prefer_ceil"),
                    ("tf_half_pixel_for_nn", "floor")}


def _scales(ctx: NodeContext, value) -> list[float] | None:
    """The given per-axis scales (None when the node gives output sizes instead): ONNX maps
    output coordinates through the given scale, which differs from out / in when the scale
    times the input size is not a whole number (1.5 x 5 -> 7 points, mapped by 1.5, not 1.4)."""
    if value is None:
        return None
    scales = [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]
    if not scales:
        return None
    if len(scales) != ctx.input(0).rank or not all(np.isfinite(scales)) or min(scales) <= 0:
        raise ctx.unsupported(f"scales {scales}: one positive finite scale per axis")
    return scales


def _resize(ctx: NodeContext, mode: str, coord: str, nearest: str,
            scales: list[float] | None = None) -> None:
    x, out = ctx.input(0), ctx.output(0)
    factors = scales or [o / i for o, i in zip(out.shape, x.shape)]
    integer = all(f == int(f) and f >= 1 and o == i * int(f)
                  for f, o, i in zip(factors, out.shape, x.shape))
    if mode == "nearest" and integer and (coord, nearest) in _FLOOR_DIV_MODES:
        ax = text.axes(out.rank)
        idx = [a if f == 1 else f"{a} // {int(f)}" for a, f in zip(ax, factors)]
        ctx.assign(out, ax, "=", ctx.access(x, idx))
        return
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest,
             "sizes": list(out.shape)}
    if scales is not None:
        attrs["scales"] = scales
    for key in ("cubic_coeff_a", "exclude_outside", "extrapolation_value"):
        if key in ctx.attrs:
            attrs[key] = ctx.attr(key)
    if coord == "tf_crop_and_resize":
        raise ctx.unsupported("coordinate_transformation_mode='tf_crop_and_resize' is not "
                              "supported", "its crop box (roi) is not imported")
    if coord == "tf_half_pixel_for_nn":
        # opsets 11-12 only; the ONNX reference no longer knows it, so its matrices are made
        # here (nearest only: the mode is TensorFlow's half-pixel nearest neighbour)
        if mode != "nearest" or np.dtype(x.dtype).kind != "f" or x.dtype == "bfloat16":
            raise ctx.unsupported("coordinate_transformation_mode='tf_half_pixel_for_nn' "
                                  f"with mode '{mode}' on {x.dtype}",
                                  "it is imported for nearest resizing of float tensors")
        matrices = _half_pixel_nn_matrices(ctx, x.shape, out.shape, factors, nearest)
    else:
        matrices = _axis_matrices(x, out, attrs)
    if matrices is None:
        ctx.opaque("Resize", [x], [out], attrs)
        return
    if not matrices:            # every axis keeps its size at scale 1: a copy
        ctx.copy(0, x)
        return
    # Separable: one contraction per resized axis, y[.., o, ..] += w[o, r] * x[.., r, ..].
    ax = text.axes(out.rank)
    cur, shape = x, list(x.shape)
    last = max(matrices)
    for d in sorted(matrices):
        shape[d] = out.shape[d]
        w = ctx.weight(f"resize{d}", matrices[d].astype(x.dtype))
        dst = out if d == last else ctx.temp(f"resize{d}", shape, x.dtype)
        src = list(ax)
        src[d] = "r"
        ctx.assign(dst, ax, "+=", f"{ctx.access(w, [ax[d], 'r'])} * {ctx.access(cur, src)}",
                   step=None if d == last else f"resize{d}")
        cur = dst


#: `nearest_mode` as a rounding of a source coordinate (ONNX Resize).
_NEAREST = {"round_prefer_floor": lambda v: np.ceil(v - 0.5),
            "round_prefer_ceil": lambda v: np.floor(v + 0.5),
            "floor": np.floor, "ceil": np.ceil}


def _half_pixel_nn_matrices(ctx: NodeContext, shape, out_shape, factors,
                            nearest: str) -> dict[int, np.ndarray]:
    """The 0/1 selection matrix of each resized axis for `tf_half_pixel_for_nn`: output
    point `o` reads source `nearest((o + 0.5) / scale)`, clamped to the axis."""
    if nearest not in _NEAREST:
        raise ctx.unsupported(f"nearest_mode='{nearest}'", "one of: " + ", ".join(_NEAREST))
    found = {}
    for d, (n, m, f) in enumerate(zip(shape, out_shape, factors)):
        if n == m and f == 1.0:
            continue
        if n * m > _MAX_MATRIX:
            raise ctx.unsupported(f"a {n} -> {m} resize with coordinate_transformation_mode"
                                  "='tf_half_pixel_for_nn' is over the interpolation "
                                  "matrix's size")
        source = _NEAREST[nearest]((np.arange(m) + 0.5) / f)
        matrix = np.zeros((m, n), np.float64)
        matrix[np.arange(m), np.clip(source, 0, n - 1).astype(np.int64)] = 1.0
        found[d] = matrix
    return found


#: The largest interpolation matrix (output x input points of one axis) written as a weight;
#: a larger resize stays an opaque op.
_MAX_MATRIX = 1 << 22


def _axis_matrices(x, out, attrs: dict) -> dict[int, np.ndarray] | None:
    """Resize (every mode but tf_crop_and_resize) is separable: along each axis the output
    is a fixed matrix times the input. The matrix of axis d is the ONNX reference Resize of
    the identity along that axis (the other axis kept by scale 1, which every coordinate
    mode maps onto itself). {axis: [out, in] matrix} for the axes that change; None for
    non-float tensors or matrices over `_MAX_MATRIX` (the opaque op then resizes)."""
    from tilekit import opaque

    if np.dtype(x.dtype).kind != "f" or x.dtype == "bfloat16":
        return None
    scales = attrs.get("scales")
    found = {}
    for d, (n, m) in enumerate(zip(x.shape, out.shape)):
        scale = 1.0 if scales is None else scales[d]
        if n == m and scale == 1.0:
            continue
        if n * m > _MAX_MATRIX:
            return None
        axis_attrs = dict(attrs, sizes=[n, m])
        if scales is not None:
            axis_attrs["scales"] = [1.0, scale]
        basis = opaque.run("Resize", [np.eye(n, dtype=np.float64)], axis_attrs)[0]
        found[d] = np.ascontiguousarray(basis.T)
    return found


@converter("Resize", summary="nearest by integer factors: x[.., h // s, ..]; otherwise per "
                             "resized axis y += w[o, r] * x[.., r, ..] (w: the constant "
                             "interpolation matrix)")
def resize(ctx: NodeContext) -> None:
    for i in range(1, 4):
        if ctx.has_input(i) and ctx.const(i) is None:
            raise ctx.unsupported(f"input {i} (roi/scales/sizes) must be constant")
    if ctx.flag("antialias", 0):
        raise ctx.unsupported("antialias=1 (opset 18) is not supported")
    if ctx.opset < 11:
        # Resize-10 resamples like Upsample: asymmetric coordinates, nearest by flooring.
        _resize(ctx, ctx.attr("mode", "nearest"), "asymmetric", "floor",
                _scales(ctx, ctx.const(1)))
        return
    rank = ctx.input(0).rank
    # Opset 18: `axes` says which dimensions scales / sizes give (the others keep size 1.0).
    axes = ctx.axes_in(ctx.attr("axes"), rank) if ctx.attr("axes") is not None \
        else list(range(rank))
    sizes = ctx.const(3) if ctx.has_input(3) else None
    if sizes is not None and np.asarray(sizes).size:
        given = _policy_scales(ctx, [int(v) for v in np.asarray(sizes).reshape(-1)], axes)
    else:
        raw = ctx.const(2) if ctx.has_input(2) else None
        given = None if raw is None or not np.asarray(raw).size else \
            _scales(ctx, _full_rank(ctx, np.asarray(raw, np.float64).reshape(-1), axes, 1.0))
    _resize(ctx, ctx.attr("mode", "nearest"),
            ctx.attr("coordinate_transformation_mode", "half_pixel"),
            ctx.attr("nearest_mode", "round_prefer_floor"), given)


def _full_rank(ctx: NodeContext, values, axes: list[int], fill: float) -> list[float]:
    """Per-axis values given for `axes` (opset 18) spread over every dimension."""
    if len(values) != len(axes):
        raise ctx.unsupported(f"{len(values)} scales or sizes for {len(axes)} axes")
    full = [fill] * ctx.input(0).rank
    for a, v in zip(axes, values):
        full[a] = float(v)
    return full


def _policy_scales(ctx: NodeContext, sizes: list[int], axes: list[int]) -> list[float] | None:
    """Sizes given: None (the output shape maps coordinates, as before opset 18), or under
    `keep_aspect_ratio_policy` (opset 18) the one scale of the policy, which maps the
    coordinates: the output is round(scale * input) on `axes`."""
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        return None
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy='{policy}'")
    x = ctx.input(0)
    ratios = [s / x.shape[a] for s, a in zip(sizes, axes)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    scales = _full_rank(ctx, [scale] * len(axes), axes, 1.0)
    floor = [int(np.floor(n * s)) for n, s in zip(x.shape, scales)]
    if floor != list(ctx.output(0).shape):
        raise ctx.unsupported(f"keep_aspect_ratio_policy='{policy}' rounds to "
                              f"{list(ctx.output(0).shape)}, which the scale {scale:g} does not "
                              "give by flooring", "give the output sizes without the policy")
    return _scales(ctx, scales)


@converter("Upsample", summary="like Resize with asymmetric coordinates and floor rounding")
def upsample(ctx: NodeContext) -> None:
    mode = ctx.attr("mode", "nearest")
    mode = "linear" if mode in ("bilinear", "linear") else mode
    scales = ctx.attr("scales") if ctx.opset < 9 else (ctx.const(1) if ctx.has_input(1)
                                                           else None)
    _resize(ctx, mode, "asymmetric", "floor", _scales(ctx, scales))

