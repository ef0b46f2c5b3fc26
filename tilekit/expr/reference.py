"""NumPy reference evaluation of an analysed statement, whole or over one box of its axes.

Vectorised throughout: each tensor read becomes an array over the iteration axes (a strided
view for affine index maps, fancy indexing for quasi-affine ones), the body is evaluated with
NumPy broadcasting, and the reduction is one NumPy reduction. Sums of products of reads (matmul,
convolution) go through `np.einsum`, which hands them to BLAS. Large iteration spaces are split
so that no intermediate exceeds `CHUNK_ELEMENTS` elements.
"""

from __future__ import annotations

import itertools
import math
from typing import Mapping

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tilekit.errors import ExprError
from tilekit.expr.analysis import AccessInfo, Analysis, interval
from tilekit.expr.contract import contract_pair, shifted_window_sum
from tilekit.expr.ast import Access, Axis, Binary, Call, Node, Num, Unary, format_node
from tilekit.expr.ops import (BINARY_OPERATORS, FUNCTIONS, PAD_VALUES, REDUCTIONS,
                              is_half)

#: Largest iteration box evaluated in one piece (elements of the broadcast body).
CHUNK_ELEMENTS = 1 << 23

#: The float each pad value stands for (the one table: tilekit.expr.ops).
PAD_FLOATS = PAD_VALUES

def evaluate(analysis: Analysis, env: Mapping[str, np.ndarray], pad: str | None = None,
             box: Mapping[str, tuple[int, int]] | None = None,
             out_dtype: str | np.dtype | None = None) -> np.ndarray:
    """Evaluate the statement. Returns an array over the spatial axes of `box`.

    `box` maps axes to half-open ranges; missing axes take their full extent. When the box
    restricts reduction axes, the result is the partial reduction over that range (combine
    partial results with the statement's operator).
    """
    pad = pad if pad is not None else analysis.pad
    full = analysis.full_box()
    if box:
        for a, r in box.items():
            if a not in full:
                raise ExprError(f"box names axis {a!r} which the statement does not have")
            full[a] = (int(r[0]), int(r[1]))
    for t in analysis.inputs:
        if t not in env:
            raise ExprError(f"no value for input tensor {t!r}", analysis.output)
    env = as_compute(env, analysis.inputs)
    dtype = np.dtype(out_dtype or analysis.out_dtype) if (out_dtype or analysis.out_dtype) \
        else None
    with np.errstate(all="ignore"):
        result = _eval_chunked(analysis, env, pad, full)
    if dtype is not None and result.dtype != dtype:
        with np.errstate(all="ignore"):  # float32 beyond float16's range rounds to inf
            result = result.astype(dtype)
    return result


def as_compute(env: Mapping[str, np.ndarray], names) -> Mapping[str, np.ndarray]:
    """`env` with the half-typed arrays among `names` as float32 (their compute type), so
    that the body computes and reduces in float32; the others as they are."""
    half = [n for n in names if is_half(np.asarray(env[n]).dtype)]
    if not half:
        return env
    return {**env, **{n: np.asarray(env[n]).astype(np.float32) for n in half}}


def _box_shape(analysis: Analysis, box, axes) -> tuple[int, ...]:
    return tuple(box[a][1] - box[a][0] for a, _ in axes)


def _eval_chunked(analysis: Analysis, env, pad, box) -> np.ndarray:
    spatial_shape = _box_shape(analysis, box, analysis.spatial)
    reduce_shape = _box_shape(analysis, box, analysis.reduction)
    assign = analysis.assign
    if 0 in spatial_shape:
        return np.zeros(spatial_shape, dtype=np.float32)
    if 0 in reduce_shape:
        return np.full(spatial_shape, REDUCTIONS[assign].identity, dtype=np.float32)
    operands = _einsum_operands(analysis)
    if operands is not None and len(operands[0]) == 2 and box == analysis.full_box():
        # Stride-1 windows (convolutions, depthwise too) first: no im2col, no per-point pass.
        result = _eval_window_sum(analysis, operands[0], env, pad)
        if result is not None:
            scale = operands[1]
            return _owned(result * scale if scale != 1.0 else result, env, analysis.inputs)
    window = math.prod(reduce_shape)
    if (analysis.reduction and window <= SMALL_WINDOW and math.prod(spatial_shape) >=
            PLANE_ELEMENTS and _has_batch_axes(analysis)):
        return _eval_per_point(analysis, env, pad, box)
    if _einsum_operands(analysis) is not None:
        return _eval_einsum(analysis, env, pad, box)
    size = math.prod(spatial_shape) * math.prod(reduce_shape)
    if size > CHUNK_ELEMENTS:
        axes = analysis.spatial if math.prod(spatial_shape) > 1 else analysis.reduction
        name = max(axes, key=lambda ae: box[ae[0]][1] - box[ae[0]][0])[0]
        start, stop = box[name]
        if stop - start > 1:
            mid = (start + stop) // 2
            lo = _eval_chunked(analysis, env, pad, {**box, name: (start, mid)})
            hi = _eval_chunked(analysis, env, pad, {**box, name: (mid, stop)})
            if name in dict(analysis.spatial):
                pos = [a for a, _ in analysis.spatial].index(name)
                return np.concatenate([lo, hi], axis=pos)
            return REDUCTIONS[assign].combine(lo, hi)
    return _eval_box(analysis, env, pad, box)


#: Reductions over at most this many points (pool windows, depthwise taps) are evaluated
#: one point at a time over whole output planes: NumPy reduces strided windows slowly.
SMALL_WINDOW = 64
#: ... but only when the planes are large enough to amortise a Python step per point.
PLANE_ELEMENTS = 1024


def _eval_box(analysis: Analysis, env, pad, box, padded=None) -> np.ndarray:
    axes = [a for a, _ in analysis.axes]
    ctx = _Context(analysis, env, pad, box, axes, padded)
    value = np.asarray(ctx.eval(analysis.stmt.body))
    nspatial = len(analysis.spatial)
    full_shape = tuple(box[a][1] - box[a][0] for a in axes)
    value = value.reshape((1,) * (len(axes) - value.ndim) + value.shape)
    if analysis.reduction and math.prod(full_shape[nspatial:]) == 1:
        value = value.reshape(value.shape[:nspatial])  # one point: nothing to combine
    elif analysis.reduction:
        value = np.broadcast_to(value, value.shape[:nspatial] + full_shape[nspatial:])
        value = REDUCTIONS[analysis.assign].reduce(value, axis=tuple(range(nspatial, len(axes))))
    if value.shape != full_shape[:nspatial]:
        value = np.broadcast_to(value, full_shape[:nspatial])
    return _owned(value, env, analysis.inputs)


def _eval_per_point(analysis: Analysis, env, pad, box) -> np.ndarray:
    """Combine the body over whole spatial planes, one reduction point at a time.

    Each read's window (padded where it overhangs) is taken once for the whole box.
    """
    padded: dict[int, tuple[np.ndarray, list[int]]] = {}
    axes = [a for a, _ in analysis.axes]
    ranges = {a: (box[a][0], box[a][1] - 1) for a in axes}
    for info in analysis.accesses:
        if info.affine and info.tensor in env:
            padded[id(info.node)] = _window(info, _check_array(info, env[info.tensor]),
                                            ranges, pad)
    names = [a for a, _ in analysis.reduction]
    combine = REDUCTIONS[analysis.assign].combine
    acc = None
    for point in itertools.product(*(range(*box[a]) for a in names)):
        sub = {**box, **{a: (p, p + 1) for a, p in zip(names, point)}}
        part = _eval_box(analysis, env, pad, sub, padded)
        if acc is None:
            acc = part
        elif acc.dtype == np.result_type(acc, part):
            combine(acc, part, out=acc)
        else:
            acc = combine(acc, part)
    return acc


def _has_batch_axes(analysis: Analysis) -> bool:
    """Whether a sum of products has an output axis that every operand reads (depthwise
    convolution): then a batch of tiny matrix products loses to per-point planes."""
    operands = _einsum_operands(analysis)
    if operands is None:
        return True
    infos = {id(i.node): i for i in analysis.accesses}
    used = [{a for m in infos[id(acc)].maps for a, _ in m.terms} for acc in operands[0]]
    return len(used) > 1 and any(all(a in u for u in used) for a, _ in analysis.spatial)


def _eval_window_sum(analysis: Analysis, accesses, env, pad) -> np.ndarray | None:
    """A stride-1 convolution-like sum without im2col (see contract.shifted_window_sum)."""
    infos = {id(i.node): i for i in analysis.accesses}
    ranges = {a: (0, e - 1) for a, e in analysis.axes}

    def padded(info: AccessInfo, extra: list[tuple[int, int]]):
        arr = _check_array(info, env[info.tensor])
        widths = _needed_padding(info, ranges)
        if any(w != (0, 0) for w in widths) and pad is None:
            raise ExprError(f"{format_node(info.node)} reads outside {info.tensor} and the op "
                            "declares no pad value", info.tensor)
        lead = len(widths) - len(extra)
        widths = widths[:lead] + [(b + eb, a + ea) for (b, a), (eb, ea)
                                  in zip(widths[lead:], extra)]
        value = _pad_scalar(pad, arr.dtype) if pad is not None else 0
        return _pad_constant(arr, widths, value), widths

    first, second = (infos[id(a)] for a in accesses)
    for image, filt in ((first, second), (second, first)):
        result = shifted_window_sum(analysis, image, filt, env, padded)
        if result is not None:
            return result
    return None


def _owned(x: np.ndarray, env, inputs) -> np.ndarray:
    """`x` as a writable C-contiguous array that shares no memory with the op's inputs:
    `x` itself when it already is one (a fresh result), else a copy."""
    if (x.flags.c_contiguous and x.flags.writeable
            and not any(np.may_share_memory(x, env[t]) for t in inputs)):
        return x
    return np.array(x, order="C")


# -- sums of products through einsum ------------------------------------------------------

#: `_einsum_operands` by analysis identity (the analysis is kept, so its id is not reused);
#: a tiled run asks it for every tile of every op.
_OPERANDS: dict[int, tuple[Analysis, tuple[list[Access], float] | None]] = {}
_OPERANDS_KEPT = 4096


def _einsum_operands(analysis: Analysis) -> tuple[list[Access], float] | None:
    """(accesses, scale) when the statement is `out += c * a[..] * b[..] ...` with affine
    reads, else None."""
    hit = _OPERANDS.get(id(analysis))
    if hit is not None and hit[0] is analysis:
        return hit[1]
    if len(_OPERANDS) >= _OPERANDS_KEPT:
        _OPERANDS.clear()
    found = _find_einsum_operands(analysis)
    _OPERANDS[id(analysis)] = (analysis, found)
    return found


def _find_einsum_operands(analysis: Analysis) -> tuple[list[Access], float] | None:
    if analysis.assign != "+=" or not analysis.reduction:
        return None
    factors: list[Node] = []

    def flatten(n: Node) -> None:
        if isinstance(n, Binary) and n.op == "*":
            flatten(n.lhs)
            flatten(n.rhs)
        else:
            factors.append(n)

    flatten(analysis.stmt.body)
    accesses = [f for f in factors if isinstance(f, Access)]
    nums = [f for f in factors if isinstance(f, Num)]
    if len(accesses) + len(nums) != len(factors) or not 1 <= len(accesses) <= 3:
        return None
    by_node = {id(i.node): i for i in analysis.accesses}
    if not all(by_node[id(a)].affine for a in accesses):
        return None
    return accesses, math.prod(float(n.value) for n in nums)


def _eval_einsum(analysis: Analysis, env, pad, box) -> np.ndarray:
    accesses, scale = _einsum_operands(analysis)
    axes = [a for a, _ in analysis.axes]
    letters = {a: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26)
               for i, a in enumerate(axes)}
    infos = {id(i.node): i for i in analysis.accesses}
    operands, subscripts = [], []
    used: set[str] = set()
    for acc in accesses:
        info = infos[id(acc)]
        view, view_axes = _affine_view(info, env[info.tensor], box, axes, pad, squeeze=True)
        operands.append(view)
        subscripts.append("".join(letters[a] for a in view_axes))
        used.update(view_axes)
    spatial = [a for a, _ in analysis.spatial]
    out_axes = [a for a in spatial if a in used]
    if len(operands) == 2:
        result = contract_pair(operands[0], subscripts[0], operands[1], subscripts[1],
                                [letters[a] for a in out_axes])
    else:
        spec = ",".join(subscripts) + "->" + "".join(letters[a] for a in out_axes)
        result = np.einsum(spec, *operands)
    if scale != 1.0:
        result = result * scale
    # Reduction axes that no operand uses still multiply the sum by their extent.
    for a, _ in analysis.reduction:
        if a not in used:
            result = result * (box[a][1] - box[a][0])
    shape = tuple(box[a][1] - box[a][0] for a in spatial)
    expanded = result.reshape(tuple(box[a][1] - box[a][0] if a in used else 1 for a in spatial))
    if expanded.shape != shape:
        expanded = np.broadcast_to(expanded, shape)
    return _owned(expanded, env, analysis.inputs)


# -- reads -------------------------------------------------------------------------------

def _pad_scalar(pad: str | None, dtype: np.dtype):
    value = PAD_FLOATS[pad]
    if dtype.kind in "iub" and math.isinf(value):
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        return (info.min if value < 0 else info.max) if info else bool(value > 0)
    return value


def _pad_constant(arr: np.ndarray, widths, value) -> np.ndarray:
    """`np.pad(arr, widths, constant_values=value)`, as one fill and one copy (np.pad is
    several times slower for the small widths of convolutions)."""
    shape = tuple(d + lo + hi for d, (lo, hi) in zip(arr.shape, widths))
    out = np.full(shape, value, dtype=arr.dtype)
    out[tuple(slice(lo, lo + d) for d, (lo, _) in zip(arr.shape, widths))] = arr
    return out


def _map_range(m, ranges) -> tuple[int, int]:
    """Inclusive [lo, hi] of one index map over `ranges` (affine maps without the tree)."""
    if not m.affine:
        return interval(m.node, ranges)
    lo = hi = m.const
    for a, c in m.terms:
        alo, ahi = ranges[a]
        lo, hi = (lo + c * alo, hi + c * ahi) if c >= 0 else (lo + c * ahi, hi + c * alo)
    return lo, hi


def _needed_padding(info: AccessInfo, ranges) -> list[tuple[int, int]]:
    widths = []
    for m, dim in zip(info.maps, info.shape):
        lo, hi = _map_range(m, ranges)
        widths.append((max(0, -lo), max(0, hi - (dim - 1))))
    return widths


def _check_array(info: AccessInfo, arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if tuple(arr.shape) != info.shape:
        raise ExprError(f"value of {info.tensor} has shape {tuple(arr.shape)}, "
                        f"declared {info.shape}", info.tensor)
    return arr


def _window(info: AccessInfo, arr: np.ndarray, ranges, pad) -> tuple[np.ndarray, list[int]]:
    """The part of `arr` that the read touches when the axes span `ranges` (inclusive), and
    the index of its first element in each dimension. Inside the tensor it is a view; where
    the read overhangs, a copy of just that box with the pad value around (never the whole
    tensor padded: a boundary tile costs its box, not the tensor)."""
    bounds = [_map_range(m, ranges) for m in info.maps]
    if all(lo >= 0 and hi < dim for (lo, hi), dim in zip(bounds, arr.shape)):
        return arr[tuple(slice(lo, hi + 1) for lo, hi in bounds)], [lo for lo, _ in bounds]
    if pad is None:
        raise ExprError(f"{format_node(info.node)} reads outside {info.tensor} and the op "
                        "declares no pad value", info.tensor)
    out = np.full(tuple(hi - lo + 1 for lo, hi in bounds), _pad_scalar(pad, arr.dtype),
                  dtype=arr.dtype)
    src, dst = [], []
    for (lo, hi), dim in zip(bounds, arr.shape):
        a, b = max(lo, 0), min(hi, dim - 1)
        if a > b:            # wholly outside the tensor in this dimension: all padding
            return out, [lo for lo, _ in bounds]
        src.append(slice(a, b + 1))
        dst.append(slice(a - lo, b - lo + 1))
    out[tuple(dst)] = arr[tuple(src)]
    return out, [lo for lo, _ in bounds]


def _affine_view(info: AccessInfo, arr: np.ndarray, box, axes: list[str], pad,
                 squeeze: bool, padded=None) -> tuple[np.ndarray, list[str]]:
    """A strided view of the tensor's window (`_window`) indexed by the iteration axes of
    `box`; `padded` is a window taken once for an enclosing box.

    With `squeeze`, only the axes this read depends on are kept (in `axes` order);
    otherwise the view has one dimension per axis (size 1 where it does not depend on it).
    """
    arr = _check_array(info, arr)
    if padded is None:
        padded = _window(info, arr, {a: (box[a][0], box[a][1] - 1) for a in axes}, pad)
    window, first = padded
    axis_stride = {a: 0 for a in axes}
    origin = []
    for m, base, stride in zip(info.maps, first, window.strides):
        origin.append(m.const + sum(c * box[a][0] for a, c in m.terms) - base)
        for a, c in m.terms:
            axis_stride[a] += c * stride
    start = window[tuple(slice(o, None) for o in origin)] if window.ndim else window
    dep = {a for m in info.maps for a, _ in m.terms}
    keep = [a for a in axes if a in dep] if squeeze else axes
    shape = [box[a][1] - box[a][0] if a in dep else 1 for a in keep]
    strides = [axis_stride[a] for a in keep]
    view = as_strided(start, shape=shape, strides=strides, writeable=False)
    return view, keep


def _gather_read(info: AccessInfo, arr: np.ndarray, axis_values, box, axes, pad) -> np.ndarray:
    """A read with quasi-affine indices (// and %): fancy indexing with computed indices."""
    arr = _check_array(info, arr)
    ranges = {a: (box[a][0], box[a][1] - 1) for a in axes}
    idx, mask = [], None
    for m, dim in zip(info.maps, info.shape):
        index = np.asarray(eval_index(m.node, axis_values), dtype=np.int64)
        lo, hi = interval(m.node, ranges)
        if lo < 0 or hi >= dim:
            if pad is None:
                raise ExprError(f"{format_node(info.node)} reads outside {info.tensor} and "
                                "the op declares no pad value", info.tensor)
            ok = (index >= 0) & (index < dim)
            mask = ok if mask is None else mask & ok
            index = np.clip(index, 0, dim - 1)
        idx.append(index)
    value = arr[tuple(idx)] if idx else arr[()]
    if mask is not None:
        value = np.where(mask, value, _pad_scalar(pad, arr.dtype))
    value = np.asarray(value)
    return value.reshape((1,) * (len(axes) - value.ndim) + value.shape)


def eval_index(node: Node, axis_values):
    """An index expression's value (NumPy arrays broadcast) given each axis's values
    (`axis_values(name)`), with Python's floor division and modulo."""
    if isinstance(node, Num):
        return int(node.value)
    if isinstance(node, Axis):
        return axis_values(node.name)
    if isinstance(node, Unary):
        return -eval_index(node.arg, axis_values)
    lhs, rhs = eval_index(node.lhs, axis_values), eval_index(node.rhs, axis_values)
    return {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide,
            "%": np.mod}[node.op](lhs, rhs)


class _Context:
    """Evaluates body nodes over one box; caches axis ranges and reads."""

    def __init__(self, analysis: Analysis, env, pad, box, axes: list[str], padded=None):
        self.analysis, self.env, self.pad, self.box, self.axes = analysis, env, pad, box, axes
        self.padded = padded or {}
        self.infos = {id(i.node): i for i in analysis.accesses}
        self._axis_cache: dict[str, np.ndarray] = {}

    def axis_values(self, name: str) -> np.ndarray:
        if name not in self._axis_cache:
            pos = self.axes.index(name)
            start, stop = self.box[name]
            shape = [1] * len(self.axes)
            shape[pos] = stop - start
            self._axis_cache[name] = np.arange(start, stop, dtype=np.int64).reshape(shape)
        return self._axis_cache[name]

    def eval(self, node: Node):
        if isinstance(node, Num):
            return node.value
        if isinstance(node, Axis):
            return self.axis_values(node.name)
        if isinstance(node, Access):
            info = self.infos[id(node)]
            arr = self.env[info.tensor]
            if info.affine:
                return _affine_view(info, arr, self.box, self.axes, self.pad, squeeze=False,
                                    padded=self.padded.get(id(node)))[0]
            return _gather_read(info, arr, self.axis_values, self.box, self.axes, self.pad)
        if isinstance(node, Unary):
            arg = self.eval(node.arg)
            return np.logical_not(arg) if node.op == "!" else np.negative(arg)
        if isinstance(node, Binary):
            return BINARY_OPERATORS[node.op](self.eval(node.lhs), self.eval(node.rhs))
        if isinstance(node, Call):
            args = [self.eval(a) for a in node.args]
            return FUNCTIONS[node.fn].numpy(*args)
        raise ExprError(f"cannot evaluate {node!r}")
