"""ONNX -> PyTorch for the GPU benchmark's baselines: a small interpreter, not a converter.

    model = TorchModel(onnx_model, "cuda")
    outputs = model(x)                     # eager: one torch call per ONNX node, in graph order
    compiled = torch.compile(model)        # the same forward through TorchDynamo and Inductor

Construction puts the initializers on the device as buffers and folds every node whose inputs
are all constants (weight fills, Reshape or Unsqueeze of weights, Constant, Shape of a tensor
whose shape is known), so that a timed run computes only what depends on the graph inputs.
The small integer constants that ops read as Python values (Reshape shapes, Split sizes, axes,
Slice bounds) become lists at construction: forward never calls `.item()` or `.tolist()`, so
TorchDynamo traces it as one static graph. LSTM runs through `torch.nn.LSTM` (cuDNN on a GPU,
the kernel a PyTorch user gets), its weights reordered at construction from ONNX's gate order.

`OPS` is the whole table: ONNX op type -> `fn(node, *inputs)`, returning one tensor or a tuple
in the order of the node's outputs; an absent optional input arrives as None. An op type that is
not in the table is refused at construction with the list of those that are.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


class UnsupportedOnnx(ValueError):
    """A node this interpreter has no rule for (or an attribute value it does not handle)."""


@dataclass
class Node:
    """One ONNX node with its attributes decoded and its constant integer inputs as lists."""

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    opset: int
    static: dict[int, list] = field(default_factory=dict)
    module: torch.nn.Module | None = None      # state built at construction (LSTM)

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def has_input(self, i: int) -> bool:
        return len(self.inputs) > i and self.inputs[i] != ""

    def ints(self, i: int) -> list | None:
        """Input `i` as a Python list (None when absent); it must be a constant."""
        if not self.has_input(i):
            return None
        if i not in self.static:
            raise UnsupportedOnnx(f"{self.op_type} node {self.name!r}: input {i} "
                                  f"({self.inputs[i]!r}) must be a constant integer tensor")
        return self.static[i]

    def axes(self, i: int) -> list | None:
        """Axes from the `axes` attribute (older opsets) or from input `i` (newer ones)."""
        attr = self.attr("axes")
        return list(attr) if attr is not None else self.ints(i)

    def fail(self, what: str) -> UnsupportedOnnx:
        return UnsupportedOnnx(f"{self.op_type} node {self.name!r}: {what}")


# -- helpers -------------------------------------------------------------------------------

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}

#: ONNX TensorProto element type -> torch dtype (what Cast and ConstantOfShape may produce).
_DTYPES = {onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64,
           onnx.TensorProto.FLOAT16: torch.float16, onnx.TensorProto.BFLOAT16: torch.bfloat16,
           onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
           onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.UINT8: torch.uint8,
           onnx.TensorProto.BOOL: torch.bool}


def _spatial_pads(node: Node, spatial, kernel, strides, dilations) -> list[int]:
    """ONNX pads [begin..., end...] after auto_pad, for input extents `spatial`."""
    rank = len(kernel)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        return list(node.attr("pads", [0] * 2 * rank))
    if auto_pad == "VALID":
        return [0] * 2 * rank
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise node.fail(f"auto_pad {auto_pad!r}")
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin + end


def _torch_padding(x: torch.Tensor, pads: list[int], kernel, value: float,
                   pool: bool = False) -> tuple[torch.Tensor, list[int]]:
    """Symmetric pads go to the torch op (its fast path); others are applied with F.pad."""
    rank = len(pads) // 2
    begin, end = pads[:rank], pads[rank:]
    if begin == end and (not pool or all(p <= k // 2 for p, k in zip(begin, kernel))):
        return x, begin
    flat = [p for b, e in zip(reversed(begin), reversed(end)) for p in (b, e)]
    return F.pad(x, flat, value=value), [0] * rank


def _elementwise(fn: Callable) -> Callable:
    return lambda node, *xs: fn(*xs)


def _variadic(fn: Callable) -> Callable:
    return lambda node, *xs: functools.reduce(fn, xs)


# -- the ops -------------------------------------------------------------------------------

def conv(node, x, w, b=None):
    rank = x.dim() - 2
    strides = node.attr("strides", [1] * rank)
    dilations = node.attr("dilations", [1] * rank)
    kernel = list(w.shape[2:])
    pads = _spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    x, padding = _torch_padding(x, pads, kernel, 0.0)
    return _CONV[rank](x, w, b, strides, padding, dilations, node.attr("group", 1))


def max_pool(node, x):
    if len(node.outputs) > 1 and node.outputs[1]:
        raise node.fail("the Indices output is not supported")
    rank = x.dim() - 2
    kernel = node.attr("kernel_shape")
    strides = node.attr("strides", [1] * rank)
    dilations = node.attr("dilations", [1] * rank)
    pads = _spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    x, padding = _torch_padding(x, pads, kernel, -math.inf, pool=True)
    return _MAX_POOL[rank](x, kernel, strides, padding, dilations,
                           ceil_mode=bool(node.attr("ceil_mode", 0)))


def average_pool(node, x):
    rank = x.dim() - 2
    kernel = node.attr("kernel_shape")
    strides = node.attr("strides", [1] * rank)
    if any(d != 1 for d in node.attr("dilations", [1] * rank)):
        raise node.fail("dilated AveragePool is not supported")
    include_pad = bool(node.attr("count_include_pad", 0))
    ceil_mode = bool(node.attr("ceil_mode", 0))
    pads = _spatial_pads(node, x.shape[2:], kernel, strides, [1] * rank)
    padded, padding = _torch_padding(x, pads, kernel, 0.0, pool=True)
    pool = functools.partial(_AVG_POOL[rank], kernel_size=kernel, stride=strides,
                             padding=padding, ceil_mode=ceil_mode,
                             count_include_pad=include_pad)
    if padded is x or include_pad:
        return pool(padded)
    # Asymmetric padding applied outside: divide by the number of real (unpadded) elements.
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    return pool(padded) / pool(_torch_padding(ones, pads, kernel, 0.0, pool=True)[0])


def global_average_pool(node, x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


def global_max_pool(node, x):
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


def lrn(node, x):
    """y = x / (bias + alpha / size * sum of x^2 over `size` neighbouring channels)^beta, the
    window [c - floor((size-1)/2), c + ceil((size-1)/2)] (torch's own LRN centres it the other
    way for an even size)."""
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    square = (x * x).unsqueeze(1)                                  # [N, 1, C, ...]
    flat = [0, 0] * (x.dim() - 2) + [(size - 1) // 2, size // 2]
    window = (size,) + (1,) * (x.dim() - 2)
    pool = F.avg_pool3d if x.dim() == 4 else F.avg_pool2d if x.dim() == 3 else None
    if pool is None:
        raise node.fail(f"LRN on a rank-{x.dim()} tensor")
    mean = pool(F.pad(square, flat), window, stride=1).squeeze(1)  # sum / size
    return x / (bias + alpha * mean).pow(beta)


def batch_normalization(node, x, scale, bias, mean, var):
    if len(node.outputs) > 1 and any(node.outputs[1:]):
        raise node.fail("training-mode outputs are not supported")
    if node.attr("spatial", 1) != 1:
        raise node.fail("spatial=0 is not supported")
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, node.attr("epsilon", 1e-5))


def layer_normalization(node, x, scale, bias=None):
    if len(node.outputs) > 1 and any(node.outputs[1:]):
        raise node.fail("the Mean and InvStdDev outputs are not supported")
    axis = node.attr("axis", -1) % x.dim()
    shape = tuple(x.shape[axis:])
    eps = node.attr("epsilon", 1e-5)
    if tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
        return F.layer_norm(x, shape, scale, bias, eps)
    y = F.layer_norm(x, shape, None, None, eps) * scale      # broadcast scale and bias
    return y if bias is None else y + bias


def gemm(node, a, b, c=None):
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    trans_a, trans_b = node.attr("transA", 0), node.attr("transB", 0)
    if trans_b and not trans_a and alpha == 1.0 and beta == 1.0 and c is not None and c.dim() <= 1:
        return F.linear(a, b, c)                                     # the usual classifier
    a = a.t() if trans_a else a
    b = b.t() if trans_b else b
    if c is None:
        return alpha * (a @ b)
    return torch.addmm(c.expand(a.shape[0], b.shape[1]), a, b, beta=beta, alpha=alpha)


def softmax(node, x, log: bool = False):
    fn = torch.log_softmax if log else torch.softmax
    if node.opset >= 13:
        return fn(x, dim=node.attr("axis", -1))
    # Before opset 13: flattened to 2-D at `axis` (default 1), normalised over the second.
    axis = node.attr("axis", 1) % x.dim()
    return fn(x.reshape(*x.shape[:axis], -1), dim=-1).reshape(x.shape)


def clip(node, x, lo=None, hi=None):
    if node.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")
    if lo is None and hi is None:
        return x
    return torch.clamp(x, lo, hi)


def div(node, a, b):
    if not a.is_floating_point() and not b.is_floating_point():
        return torch.div(a, b, rounding_mode="trunc")
    return a / b


def reshape(node, x, shape=None):
    target = node.ints(1)
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    return x.reshape(target)


def flatten(node, x):
    axis = node.attr("axis", 1) % (x.dim() + 1)
    return x.reshape(math.prod(x.shape[:axis]), -1)


def transpose(node, x):
    return x.permute(node.attr("perm", list(range(x.dim() - 1, -1, -1))))


def concat(node, *xs):
    return torch.cat([x for x in xs if x is not None], dim=node.attr("axis"))


def split(node, x, sizes=None):
    axis = node.attr("axis", 0)
    sizes = node.attr("split") if node.opset < 13 else node.ints(1)
    if sizes is None:
        # Equal parts (num_outputs from opset 18: the last part may be smaller).
        parts = node.attr("num_outputs", len(node.outputs))
        sizes = -(-x.shape[axis] // parts)
    return torch.split(x, sizes, dim=axis)


def squeeze(node, x, axes=None):
    axes = node.axes(1)
    return x.squeeze() if axes is None else x.squeeze(tuple(axes))


def unsqueeze(node, x, axes=None):
    axes = node.axes(1)
    rank = x.dim() + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = x.unsqueeze(axis)
    return x


def slice_(node, x, *bounds):
    if node.opset < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends, axes, steps = (node.ints(i) for i in (1, 2, 3, 4))
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= x.dim()
        if step > 0:
            index = [slice(None)] * axis + [slice(start, end, step)]
            x = x[tuple(index)]
        else:  # Python's slice gives ONNX's clamping for negative steps too
            picks = range(*slice(start, end, step).indices(x.shape[axis]))
            x = x.index_select(axis, torch.tensor(list(picks), device=x.device))
    return x


def gather(node, x, indices):
    axis = node.attr("axis", 0) % x.dim()
    idx = indices.long()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    picked = x.index_select(axis, idx.reshape(-1))
    return picked.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])


def expand(node, x, shape=None):
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(node.ints(1))))


def reduce(fn: Callable) -> Callable:
    """ReduceX: axes from the attribute (older opsets) or the second input (newer ones)."""
    def op(node, x, axes=None):
        dims = node.axes(1)
        if not dims:
            if node.attr("noop_with_empty_axes", 0):
                return x
            dims = list(range(x.dim()))
        return fn(x, dim=tuple(dims), keepdim=bool(node.attr("keepdims", 1)))
    return op


def cast(node, x):
    return x.to(_DTYPES[node.attr("to")])


def shape(node, x):
    dims = list(x.shape)[node.attr("start", 0):node.attr("end", None)]
    return torch.tensor(dims, dtype=torch.int64, device=x.device)


def constant(node, *unused):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in node.attrs:
            dtype = {"value_float": np.float32, "value_floats": np.float32,
                     "value_int": np.int64, "value_ints": np.int64}.get(key)
            return torch.from_numpy(np.array(node.attrs[key], dtype=dtype))
    raise node.fail(f"no supported value attribute among {sorted(node.attrs)}")


def constant_of_shape(node, shape=None):
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    return torch.full(node.ints(0), value.reshape(-1)[0].item(),
                      dtype=torch.from_numpy(value).dtype)


def dropout(node, x, *unused):
    if len(node.outputs) > 1 and node.outputs[1]:
        return x, torch.ones_like(x, dtype=torch.bool)
    return x


#: ONNX LSTM gates are ordered i, o, f, c; torch's are i, f, g(=c), o.
_LSTM_GATES = (0, 2, 3, 1)


def _prepare_lstm(node: Node, constants: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A torch.nn.LSTM holding the node's weights (they must be initializers)."""
    if node.attr("activations") not in (None, ["Sigmoid", "Tanh", "Tanh"]):
        raise node.fail(f"activations {node.attr('activations')}")
    if node.attr("clip") is not None or node.attr("input_forget", 0):
        raise node.fail("clip and input_forget are not supported")
    if node.has_input(4) or node.has_input(7):
        raise node.fail("sequence_lens and peepholes (P) are not supported")
    for i in (1, 2, 3):
        if node.has_input(i) and node.inputs[i] not in constants:
            raise node.fail(f"input {i} ({node.inputs[i]!r}) must be an initializer")
    w, r = constants[node.inputs[1]], constants[node.inputs[2]]
    dirs, hidden = w.shape[0], node.attr("hidden_size")
    b = constants[node.inputs[3]] if node.has_input(3) else w.new_zeros(dirs, 8 * hidden)

    def gates(t):  # [4H, ...] in ONNX order -> torch order
        return torch.cat([t[g * hidden:(g + 1) * hidden] for g in _LSTM_GATES])

    lstm = torch.nn.LSTM(w.shape[2], hidden, bidirectional=dirs == 2).to(w.device, w.dtype)
    with torch.no_grad():
        for d in range(dirs):
            suffix = "_reverse" if d == 1 else ""
            getattr(lstm, f"weight_ih_l0{suffix}").copy_(gates(w[d]))
            getattr(lstm, f"weight_hh_l0{suffix}").copy_(gates(r[d]))
            getattr(lstm, f"bias_ih_l0{suffix}").copy_(gates(b[d, :4 * hidden]))
            getattr(lstm, f"bias_hh_l0{suffix}").copy_(gates(b[d, 4 * hidden:]))
    lstm.requires_grad_(False)
    lstm.flatten_parameters()
    return lstm.eval()


def lstm(node, x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None):
    """ONNX LSTM (forward, reverse or bidirectional; layout 0 or 1) through torch.nn.LSTM."""
    batch_first = node.attr("layout", 0) == 1
    if batch_first:  # [batch, seq, in] and states [batch, dirs, H]
        x = x.transpose(0, 1)
        h0 = None if h0 is None else h0.transpose(0, 1)
        c0 = None if c0 is None else c0.transpose(0, 1)
    dirs, hidden = w.shape[0], node.attr("hidden_size")
    seq, batch = x.shape[0], x.shape[1]
    zeros = x.new_zeros(dirs, batch, hidden)
    reverse = node.attr("direction", "forward") == "reverse"
    y, (h, c) = node.module(x.flip(0) if reverse else x,
                            (zeros if h0 is None else h0, zeros if c0 is None else c0))
    y = (y.flip(0) if reverse else y).reshape(seq, batch, dirs, hidden).permute(0, 2, 1, 3)
    if batch_first:
        return y.permute(2, 0, 1, 3), h.transpose(0, 1), c.transpose(0, 1)
    return y, h, c


OPS: dict[str, Callable] = {
    # elementwise and broadcasting
    "Add": _elementwise(torch.add), "Sub": _elementwise(torch.sub),
    "Mul": _elementwise(torch.mul), "Div": div, "Pow": _elementwise(torch.pow),
    "Sum": _variadic(torch.add), "Max": _variadic(torch.maximum),
    "Min": _variadic(torch.minimum),
    "Mean": lambda node, *xs: functools.reduce(torch.add, xs) / len(xs),
    "Relu": _elementwise(torch.relu), "Sigmoid": _elementwise(torch.sigmoid),
    "Tanh": _elementwise(torch.tanh), "Erf": _elementwise(torch.erf),
    "Exp": _elementwise(torch.exp), "Log": _elementwise(torch.log),
    "Sqrt": _elementwise(torch.sqrt), "Neg": _elementwise(torch.neg),
    "Abs": _elementwise(torch.abs), "Reciprocal": _elementwise(torch.reciprocal),
    "Where": _elementwise(torch.where), "Equal": _elementwise(torch.eq),
    "Less": _elementwise(torch.lt), "Greater": _elementwise(torch.gt),
    "Not": _elementwise(torch.logical_not), "Clip": clip, "Cast": cast,
    "Identity": _elementwise(lambda x: x), "Dropout": dropout,
    # contractions and windows
    "MatMul": _elementwise(torch.matmul), "Gemm": gemm, "Conv": conv,
    "MaxPool": max_pool, "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool, "GlobalMaxPool": global_max_pool,
    "LRN": lrn, "LSTM": lstm,
    # normalisations and reductions
    "BatchNormalization": batch_normalization, "LayerNormalization": layer_normalization,
    "Softmax": softmax, "LogSoftmax": functools.partial(softmax, log=True),
    "ReduceMean": reduce(torch.mean), "ReduceSum": reduce(torch.sum),
    "ReduceMax": reduce(torch.amax),
    # layout
    "Reshape": reshape, "Flatten": flatten, "Transpose": transpose, "Concat": concat,
    "Split": split, "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Slice": slice_,
    "Gather": gather, "Expand": expand,
    # constants and shapes (folded at construction)
    "Constant": constant, "ConstantOfShape": constant_of_shape, "Shape": shape,
}

#: Ops whose state is built once at construction; stored on `Node.module`.
PREPARE: dict[str, Callable[[Node, dict], torch.nn.Module]] = {"LSTM": _prepare_lstm}

#: Integer constants up to this many elements are also kept as Python lists (Node.static).
_STATIC_LIMIT = 4096


def _attrs(proto: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in proto.attribute:
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        out[a.name] = value
    return out


def _known_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static shapes from ONNX shape inference (only asked for when a Shape node needs one)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    shapes = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    return shapes


class TorchModel(torch.nn.Module):
    """An ONNX graph run node by node with torch ops; forward(*inputs) -> tuple of outputs.

    Inputs are the graph inputs that are not initializers, in graph order (`input_names`);
    outputs follow the graph's outputs (`output_names`)."""

    def __init__(self, model: onnx.ModelProto, device: str | torch.device = "cpu"):
        super().__init__()
        self.device = torch.device(device)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        graph = model.graph
        nodes = [Node(p.op_type, p.name or f"{p.op_type}_{i}", tuple(p.input), tuple(p.output),
                      _attrs(p), opset) for i, p in enumerate(graph.node)]
        unknown = sorted({n.op_type for n in nodes if n.op_type not in OPS})
        if unknown:
            raise UnsupportedOnnx(f"no PyTorch rule for ONNX op types {unknown}; "
                                  f"known: {', '.join(sorted(OPS))}")
        constants = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(self.device)
                     for t in graph.initializer}
        self.input_names = [vi.name for vi in graph.input if vi.name not in constants]
        self.output_names = [vi.name for vi in graph.output]
        shapes = _known_shapes(model) if any(n.op_type == "Shape" for n in nodes) else {}
        self.nodes: list[Node] = []
        prepared = torch.nn.ModuleList()
        for node in nodes:
            node.static = {i: constants[name].tolist() for i, name in enumerate(node.inputs)
                           if name in constants and not constants[name].is_floating_point()
                           and constants[name].numel() <= _STATIC_LIMIT}
            if node.op_type in PREPARE:
                node.module = PREPARE[node.op_type](node, constants)
                prepared.append(node.module)
            foldable = all(not name or name in constants for name in node.inputs) or (
                node.op_type == "Shape" and node.inputs[0] in shapes)
            if not foldable:
                self.nodes.append(node)
                continue
            args = [constants.get(name) if name else None for name in node.inputs]
            if node.op_type == "Shape" and args[0] is None:  # a stand-in of that shape
                args[0] = torch.zeros(()).expand(shapes[node.inputs[0]])
            with torch.no_grad():
                for name, value in zip(node.outputs, self._outputs(node, args)):
                    if name:
                        constants[name] = value.to(self.device)
        self.prepared = prepared
        # Only the constants that forward reads are kept. A plain dict, not buffers: ONNX
        # names are not attribute names, and TorchDynamo lifts the tensors it finds there.
        needed = {name for n in self.nodes for name in n.inputs} | set(self.output_names)
        self.constants = {name: t for name, t in constants.items() if name in needed}

    @staticmethod
    def _outputs(node: Node, args: list) -> tuple:
        out = OPS[node.op_type](node, *args)
        return out if isinstance(out, (tuple, list)) else (out,)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = dict(self.constants)
        values.update(zip(self.input_names, inputs))
        for node in self.nodes:
            args = [values[name] if name else None for name in node.inputs]
            for name, value in zip(node.outputs, self._outputs(node, args)):
                if name:
                    values[name] = value
        return tuple(values[name] for name in self.output_names)
