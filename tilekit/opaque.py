"""The registry of opaque op types: ops that are not tensor expressions.

An opaque op (`Op(kind="opaque", opaque={type, inputs, outputs, attrs})`) is one whose index
maps are not affine: its reads depend on data (Gather with run-time indices, Scatter), it sorts
(TopK, ArgMax), or it interpolates (Resize). Each type here has

- `run(inputs, attrs) -> [arrays]`: the NumPy reference implementation (an absent optional
  input is None), used by the CPU executor and as the oracle for other backends;
- `shapes(inputs, attrs) -> [(shape, dtype)]`: output shapes and dtypes from the inputs'
  `(shape, dtype)` (None for an absent input) and the attributes, so that tools can check an
  opaque op without running it.

`get(name)` refuses an unknown type with the list of known ones. Attributes are JSON-like
values (they are written into the IR).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilekit.errors import TilekitError, UnsupportedError

Arrays = Sequence["np.ndarray | None"]
Specs = Sequence["tuple[tuple[int, ...], str] | None"]
Attrs = Mapping[str, Any]


@dataclass(frozen=True)
class OpaqueType:
    name: str
    run: Callable[[Arrays, Attrs], list]
    shapes: Callable[[Specs, Attrs], list]
    doc: str = ""


REGISTRY: dict[str, OpaqueType] = {}


def register(name: str, shapes: Callable[[Specs, Attrs], list], doc: str = "") -> Callable:
    def add(run: Callable[[Arrays, Attrs], list]) -> Callable:
        if name in REGISTRY:
            raise ValueError(f"opaque type {name} registered twice")
        REGISTRY[name] = OpaqueType(name, run, shapes, doc)
        return run
    return add


def get(name: str) -> OpaqueType:
    """The registry entry of `name`; an UnsupportedError listing the known types otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnsupportedError(f"unknown opaque op type '{name}'", "opaque.type",
                               f"known types: {', '.join(known())}") from None


def known() -> list[str]:
    return sorted(REGISTRY)


def run(name: str, inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    """Run opaque type `name` (index inputs are range-checked first: `check_indices`)."""
    check_indices(name, inputs, attrs)
    return list(get(name).run(inputs, dict(attrs)))


# -- gathers and scatters ----------------------------------------------------------------

def _gather_shapes(ins: Specs, attrs: Attrs) -> list:
    (data, dt), (ind, _) = ins[0], ins[1]
    axis = attrs.get("axis", 0) % len(data)
    return [(tuple(data[:axis]) + tuple(ind) + tuple(data[axis + 1:]), dt)]


@register("Gather", _gather_shapes, "ONNX Gather: take along `axis` at run-time indices "
                                    "(negative indices count from the end)")
def _gather(ins: Arrays, attrs: Attrs) -> list:
    data, ind = ins[0], np.asarray(ins[1]).astype(np.int64)
    return [np.take(data, ind, axis=attrs.get("axis", 0))]


def _same_as_index(ins: Specs, attrs: Attrs) -> list:
    return [(tuple(ins[1][0]), ins[0][1])]


@register("GatherElements", _same_as_index, "ONNX GatherElements (take_along_axis)")
def _gather_elements(ins: Arrays, attrs: Attrs) -> list:
    data, ind = ins[0], np.asarray(ins[1]).astype(np.int64)
    axis = attrs.get("axis", 0) % data.ndim
    ind = np.where(ind < 0, ind + data.shape[axis], ind)
    # The output has the indices' shape: other dimensions of data are cut to it, not
    # broadcast (as NumPy's take_along_axis would).
    data = data[tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(ind.shape))]
    return [np.take_along_axis(data, ind, axis=axis)]


def _gather_nd_shapes(ins: Specs, attrs: Attrs) -> list:
    (data, dt), (ind, _) = ins[0], ins[1]
    b = attrs.get("batch_dims", 0)
    return [(tuple(ind[:-1]) + tuple(data[b + ind[-1]:]), dt)]


@register("GatherND", _gather_nd_shapes, "ONNX GatherND with batch_dims")
def _gather_nd(ins: Arrays, attrs: Attrs) -> list:
    data, ind = ins[0], np.asarray(ins[1]).astype(np.int64)
    b = attrs.get("batch_dims", 0)
    batch = data.shape[:b]
    nb = int(np.prod(batch, dtype=np.int64))
    d = data.reshape((nb,) + data.shape[b:])
    i = ind.reshape((nb, -1, ind.shape[-1]))
    out = []
    for k in range(nb):
        for row in i[k]:
            idx = tuple(int(v) + (d.shape[1 + j] if v < 0 else 0) for j, v in enumerate(row))
            out.append(d[k][idx])
    shape = ind.shape[:-1] + data.shape[b + ind.shape[-1]:]
    return [np.asarray(out, dtype=data.dtype).reshape(shape)]


def _like_data(ins: Specs, attrs: Attrs) -> list:
    return [(tuple(ins[0][0]), ins[0][1])]


_REDUCE = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum,
           "min": np.minimum}


def _scatter_nd_shapes(ins: Specs, attrs: Attrs) -> list:
    """data's shape; the updates must be indices.shape[:-1] + data.shape[k:] (ONNX)."""
    data, ind, upd = (tuple(s[0]) for s in ins[:3])
    k = ind[-1] if ind else 0
    want = ind[:-1] + data[k:]
    if not ind or k > len(data) or upd != want:
        raise TilekitError(f"ScatterND updates have shape {list(upd)}; indices {list(ind)} "
                           f"into data {list(data)} need {list(want)}", None,
                           "updates must be indices.shape[:-1] + data.shape[k:]")
    return _like_data(ins, attrs)


def _scatter_elements_shapes(ins: Specs, attrs: Attrs) -> list:
    """data's shape; the updates must have the indices' shape, of data's rank (ONNX)."""
    data, ind, upd = (tuple(s[0]) for s in ins[:3])
    if upd != ind or len(ind) != len(data):
        raise TilekitError(f"ScatterElements updates have shape {list(upd)} and indices "
                           f"{list(ind)} (data {list(data)})", None,
                           "updates and indices must have one shape, of the data's rank")
    return _like_data(ins, attrs)


@register("ScatterND", _scatter_nd_shapes, "ONNX ScatterND (reduction none/add/mul/max/min)")
def _scatter_nd(ins: Arrays, attrs: Attrs) -> list:
    data, ind, upd = np.array(ins[0], copy=True), np.asarray(ins[1]).astype(np.int64), ins[2]
    fn = _REDUCE[attrs.get("reduction", "none")]
    k = ind.shape[-1]
    flat_ind = ind.reshape(-1, k)
    flat_upd = np.asarray(upd).reshape((flat_ind.shape[0],) + data.shape[k:])
    for row, u in zip(flat_ind, flat_upd):
        idx = tuple(int(v) for v in row)
        data[idx] = u if fn is None else fn(data[idx], u)
    return [data]


@register("ScatterElements", _scatter_elements_shapes, "ONNX ScatterElements / Scatter (reduction "
                                         "none/add/mul/max/min)")
def _scatter_elements(ins: Arrays, attrs: Attrs) -> list:
    data, ind, upd = np.array(ins[0], copy=True), np.asarray(ins[1]).astype(np.int64), \
        np.asarray(ins[2])
    axis = attrs.get("axis", 0) % data.ndim
    fn = _REDUCE[attrs.get("reduction", "none")]
    for pos in np.ndindex(*ind.shape):
        target = list(pos)
        v = int(ind[pos])
        target[axis] = v + data.shape[axis] if v < 0 else v
        t = tuple(target)
        data[t] = upd[pos] if fn is None else fn(data[t], upd[pos])
    return [data]


# -- sorting -----------------------------------------------------------------------------

def _topk_shapes(ins: Specs, attrs: Attrs) -> list:
    shape, dt = ins[0]
    axis = attrs["axis"] % len(shape)
    out = tuple(shape[:axis]) + (attrs["k"],) + tuple(shape[axis + 1:])
    return [(out, dt), (out, "int64")]


@register("TopK", _topk_shapes, "ONNX TopK with a constant k (ties: lower index first)")
def _topk(ins: Arrays, attrs: Attrs) -> list:
    x = np.asarray(ins[0])
    axis, k = attrs["axis"] % x.ndim, attrs["k"]
    key = -x if attrs.get("largest", 1) else x
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


def _arg_shapes(ins: Specs, attrs: Attrs) -> list:
    shape = list(ins[0][0])
    axis = attrs.get("axis", 0) % len(shape)
    if attrs.get("keepdims", 1):
        shape[axis] = 1
    else:
        del shape[axis]
    return [(tuple(shape), "int64")]


def _arg(fn: Callable) -> Callable:
    def run(ins: Arrays, attrs: Attrs) -> list:
        x = np.asarray(ins[0])
        axis = attrs.get("axis", 0) % x.ndim
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis=axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            idx = np.expand_dims(idx, axis)
        return [idx.astype(np.int64)]
    return run


register("ArgMax", _arg_shapes, "ONNX ArgMax")(_arg(np.argmax))
register("ArgMin", _arg_shapes, "ONNX ArgMin")(_arg(np.argmin))


# -- resampling and transposed convolution -----------------------------------------------

def _resize_shapes(ins: Specs, attrs: Attrs) -> list:
    return [(tuple(attrs["sizes"]), ins[0][1])]


@register("Resize", _resize_shapes, "ONNX Resize to constant output `sizes`, coordinates mapped "
                                    "by the given `scales` when the model gives them (all modes, "
                                    "via the ONNX reference implementation)")
def _resize(ins: Arrays, attrs: Attrs) -> list:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    keys = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
            "exclude_outside", "extrapolation_value")
    given = {k: attrs[k] for k in keys if k in attrs}
    if attrs.get("scales") is not None:   # coordinates mapped by the given scales
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **given)
        feed = {"scales": np.asarray(attrs["scales"], dtype=np.float32)}
    else:
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **given)
        feed = {"sizes": np.asarray(attrs["sizes"], dtype=np.int64)}
    y = ReferenceEvaluator(node, opsets={"": 19}).run(None, {"x": ins[0], **feed})[0]
    if tuple(y.shape) != tuple(attrs["sizes"]):
        raise TilekitError(f"Resize by scales {attrs['scales']} gives shape {list(y.shape)}, "
                           f"the IR declares {list(attrs['sizes'])}", "opaque.attrs",
                           "re-run tk-import")
    return [y]


def _conv_transpose_shapes(ins: Specs, attrs: Attrs) -> list:
    return [(tuple(attrs["output_shape"]), ins[0][1])]


@register("ConvTranspose", _conv_transpose_shapes,
          "ONNX ConvTranspose (the cases with both stride and dilation > 1): scatter-add of "
          "every input pixel's kernel window")
def _conv_transpose(ins: Arrays, attrs: Attrs) -> list:
    x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    strides, dilations = attrs["strides"], attrs["dilations"]
    group, begins = attrs["group"], attrs["pads_begin"]
    out_shape = tuple(attrs["output_shape"])
    n, c = x.shape[:2]
    cg, fg = c // group, w.shape[1]
    kernel = w.shape[2:]
    y = np.zeros(out_shape, dtype=np.float64)
    for g in range(group):
        xs = x[:, g * cg:(g + 1) * cg].astype(np.float64)
        ws = w[g * cg:(g + 1) * cg].astype(np.float64)
        for k in np.ndindex(*kernel):
            contrib = np.einsum("nc...,cf->nf...", xs, ws[(slice(None), slice(None)) + k])
            # Output position of input position i: i*s + k*d - pad.
            sl = [slice(None), slice(g * fg, (g + 1) * fg)]
            src = [slice(None), slice(None)]
            for i, (s, d, p, kk, size) in enumerate(zip(strides, dilations, begins, k,
                                                        out_shape[2:])):
                first = kk * d - p
                lo = max(0, -(-(-first) // s)) if first < 0 else 0
                hi = min(x.shape[2 + i], (size - 1 - first) // s + 1)
                if hi <= lo:
                    break
                sl.append(slice(first + lo * s, first + (hi - 1) * s + 1, s))
                src.append(slice(lo, hi))
            else:
                y[tuple(sl)] += contrib[tuple(src)]
    if b is not None:
        y += np.asarray(b, dtype=np.float64).reshape((1, -1) + (1,) * (len(out_shape) - 2))
    return [y.astype(x.dtype)]


# -- attribute rules and index ranges ----------------------------------------------------
# What the verifier checks of an opaque op's attributes before any shape rule or
# implementation sees them (a stride of 0, an axis past the rank, a k larger than the axis
# would otherwise surface as a ZeroDivisionError or a silently wrapped axis), and which
# inputs hold indices into which extent (for range checks at run time and for `--seed`).

Rule = Callable[[Any, Specs], "str | None"]


def _rank(specs: Specs, i: int = 0) -> int:
    return len(specs[i][0]) if i < len(specs) and specs[i] is not None else 0


def _int(value: Any) -> bool:
    return type(value) is int


def _axis(i: int = 0) -> Rule:
    def rule(value: Any, specs: Specs) -> str | None:
        r = _rank(specs, i)
        if not _int(value) or not -r <= value < r:
            return f"must be an axis of input {i} (rank {r}): an integer in [{-r}, {r})"
        return None
    return rule


def _choice(*options: Any) -> Rule:
    def rule(value: Any, specs: Specs) -> str | None:
        if value not in options or type(value) not in {type(o) for o in options}:
            return f"must be one of {', '.join(repr(o) for o in options)}"
        return None
    return rule


def _ints(low: int, count: Callable[[Specs], int] | None = None) -> Rule:
    def rule(value: Any, specs: Specs) -> str | None:
        want = count(specs) if count else None
        if not isinstance(value, list) or not all(_int(v) and v >= low for v in value) or (
                want is not None and len(value) != want):
            size = f"{want} " if want is not None else ""
            return f"must be a list of {size}integers >= {low}"
        return None
    return rule


def _int_range(low: int, high: Callable[[Specs], int]) -> Rule:
    def rule(value: Any, specs: Specs) -> str | None:
        top = high(specs)
        if not _int(value) or not low <= value <= top:
            return f"must be an integer in [{low}, {top}]"
        return None
    return rule


def _topk_extent(specs: Specs, attrs: Attrs) -> int:
    axis = attrs.get("axis", 0)
    return specs[0][0][axis] if _int(axis) and -_rank(specs) <= axis < _rank(specs) else 0


_FLAG = _choice(0, 1, True, False)
_REDUCTION = _choice(*_REDUCE)
_SPATIAL = (lambda specs: max(_rank(specs) - 2, 0))

#: type -> {attribute: rule}; `REQUIRED` lists the attributes a type cannot do without.
ATTR_RULES: dict[str, dict[str, Rule]] = {
    "Gather": {"axis": _axis(0)},
    "GatherElements": {"axis": _axis(0)},
    "GatherND": {"batch_dims": _int_range(0, lambda s: max(min(_rank(s, 0), _rank(s, 1)) - 1,
                                                            0))},
    "ScatterND": {"reduction": _REDUCTION},
    "ScatterElements": {"axis": _axis(0), "reduction": _REDUCTION},
    "TopK": {"axis": _axis(0), "k": _int_range(1, lambda s: max(s[0][0]) if s[0][0] else 1),
             "largest": _FLAG, "sorted": _FLAG},
    "ArgMax": {"axis": _axis(0), "keepdims": _FLAG, "select_last_index": _FLAG},
    "ArgMin": {"axis": _axis(0), "keepdims": _FLAG, "select_last_index": _FLAG},
    "Resize": {"sizes": _ints(1, lambda s: _rank(s))},
    "ConvTranspose": {"strides": _ints(1, _SPATIAL), "dilations": _ints(1, _SPATIAL),
                      "group": _int_range(1, lambda s: max(s[0][0][1], 1)
                                          if _rank(s) > 1 else 1),
                      "pads_begin": _ints(0, _SPATIAL), "output_shape": _ints(1, _rank)},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "TopK": ("axis", "k"), "Resize": ("sizes",),
    "ConvTranspose": ("strides", "dilations", "group", "pads_begin", "output_shape"),
}


def attrs_problem(name: str, specs: Specs, attrs: Attrs) -> tuple[str, str] | None:
    """(attribute, what is wrong) for the first attribute of an opaque op of type `name`
    that breaks its rule, else None. `specs` are the inputs' (shape, dtype)."""
    for key in REQUIRED.get(name, ()):
        if key not in attrs:
            return key, "is required"
    for key, rule in ATTR_RULES.get(name, {}).items():
        if key in attrs:
            problem = rule(attrs[key], specs)
            if problem is None and name == "TopK" and key == "k":
                extent = _topk_extent(specs, attrs)
                if extent and attrs[key] > extent:
                    problem = f"must be at most the extent of axis {attrs.get('axis')} ({extent})"
            if problem is not None:
                return key, problem
    if name == "ConvTranspose" and _rank(specs) > 1 and _int(attrs.get("group")) and \
            specs[0][0][1] % attrs["group"]:
        return "group", f"must divide the {specs[0][0][1]} input channels"
    return None


def index_bounds(name: str, specs: Specs, attrs: Attrs) -> dict[int, int]:
    """{input position: n} for the inputs of an opaque op that hold indices, each valid in
    [-n, n) (for GatherND/ScatterND, the smallest extent any index position addresses)."""
    if name in ("Gather", "GatherElements", "ScatterElements"):
        axis = attrs.get("axis", 0)
        return {1: specs[0][0][axis]} if _int(axis) and -_rank(specs) <= axis < _rank(specs) \
            else {}
    if name in ("GatherND", "ScatterND") and _rank(specs, 1) >= 1:
        b = attrs.get("batch_dims", 0) if name == "GatherND" else 0
        depth = specs[1][0][-1]
        dims = specs[0][0][b:b + depth]
        return {1: min(dims)} if dims else {}
    return {}


def check_indices(name: str, ins: Arrays, attrs: Attrs) -> None:
    """Refuse index inputs out of their range (as NumPy would, but as bad input, exit 2)."""
    specs = [(tuple(np.shape(a)), "") if a is not None else None for a in ins]
    for position, n in index_bounds(name, specs, attrs).items():
        ind = np.asarray(ins[position])
        if name in ("GatherND", "ScatterND") and ind.size:
            b = attrs.get("batch_dims", 0) if name == "GatherND" else 0
            limits_ = np.asarray(specs[0][0][b:b + ind.shape[-1]], dtype=np.int64)
            bad = (ind < -limits_) | (ind >= limits_)
        else:
            bad = (ind < -n) | (ind >= n)
        if ind.size and bad.any():
            value = int(ind[bad].reshape(-1)[0])
            raise TilekitError(f"{name} index {value} is out of range (input {position} "
                               f"indexes an extent of {n})", None,
                               "indices must lie in [-n, n) of the axis they index")
