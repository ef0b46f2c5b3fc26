"""`tk-import --random-weights SEED`: a model's weights replaced by seeded random values.

Models shipped for testing often carry placeholder weights (the light models bundled with
onnx fill every weight with 0.02, so every output is the same number and a check that
compares outputs proves nothing). `randomize(model, seed)` returns a copy of the ONNX model
whose weights are random, deterministically:

- what is a weight: a float initializer (or a float `ConstantOfShape` fill of a constant
  shape, how the light models store theirs; it becomes an initializer) of two or more
  elements that some node reads, in the main graph or in a Loop, If or Scan body (whose
  own initializers count too). Integer and bool tensors (shapes, indices, masks) and one-element constants
  (epsilons, exponents, scale factors) are never touched, and neither is a tensor that some
  node reads in a role that is not a weight: Resize's roi/scales, Clip's bounds, Pad's
  value, Pow's exponent, Range, a shape;
- the values: `normal(0, 1) / sqrt(fan_in)`, fan_in being the product of the dimensions
  after the first (a MatMul's right operand: its rows; Gemm's B: by `transB`); positive
  `uniform(0.5, 1.5)` where positive values are needed: BatchNormalization's scale and
  variance, a divisor, the argument of Sqrt, Log or Reciprocal;
- each tensor draws from its own stream, `(seed, crc32 of its name)`, so the values do not
  depend on the order of the graph or on the other tensors.

The import records `random_weights: SEED`; `tk-run --check` applies the same function to the
source model before running it with onnxruntime, so both sides compute the same network.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: (op type, input position) that hold parameters, never weights: left as they are.
_NOT_WEIGHTS = {("Resize", 1), ("Resize", 2), ("Resize", 3), ("Upsample", 1), ("Clip", 1),
                ("Clip", 2), ("Pad", 1), ("Pad", 2), ("Pow", 1), ("Range", 0), ("Range", 1),
                ("Range", 2), ("Reshape", 1), ("Expand", 1), ("Tile", 1), ("Slice", 1),
                ("Slice", 2), ("Slice", 3), ("Slice", 4), ("ConstantOfShape", 0),
                ("CumSum", 1), ("TopK", 1), ("OneHot", 1), ("OneHot", 2), ("Trilu", 1),
                ("QuantizeLinear", 1), ("QuantizeLinear", 2), ("DequantizeLinear", 1),
                ("DequantizeLinear", 2), ("Loop", 0), ("Loop", 1), ("If", 0)}
#: (op type, input position) that must be positive.
_POSITIVE = {("BatchNormalization", 1), ("BatchNormalization", 4), ("Div", 1), ("Sqrt", 0),
             ("Log", 0), ("Reciprocal", 0)}
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
           onnx.TensorProto.BFLOAT16)


def randomize(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy of `model` whose weights are seeded random values (see the module doc)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _randomize_graph(out.graph, seed)
    return out


def _randomize_graph(graph: onnx.GraphProto, seed: int) -> None:
    """`graph`'s weights randomised in place, then those of its Loop/If/Scan bodies (a body
    may hold its weights as its own initializers)."""
    roles = _roles(graph)
    inits = {t.name: t for t in graph.initializer}
    for name, tensor in inits.items():
        if tensor.data_type not in _FLOATS:
            continue
        shape = tuple(int(d) for d in tensor.dims)
        new = _draw(name, shape, roles.get(name, set()), seed)
        if new is not None:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            tensor.CopyFrom(_tensor(new, dtype, name))
    kept = []
    for node in graph.node:
        fill = _constant_fill(node, inits)
        if fill is not None:
            name, shape, dtype = fill
            new = _draw(name, shape, roles.get(name, set()), seed)
            if new is not None:
                graph.initializer.append(_tensor(new, dtype, name))
                continue
        kept.append(node)
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _randomize_graph(sub, seed)


def _tensor(values: np.ndarray, dtype, name: str) -> onnx.TensorProto:
    array = values.astype(dtype)
    return numpy_helper.from_array(array, name)


def _roles(graph: onnx.GraphProto) -> dict[str, set[tuple[str, int]]]:
    """For each tensor name: the (op type, input position) pairs that read it (transB of a
    Gemm recorded as position -1 when set; a read inside a Loop/If/Scan body, position -2)."""
    from tilekit.onnx.subgraph import graph_free_names

    roles: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name:
                roles.setdefault(name, set()).add((node.op_type, i))
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                for name in graph_free_names(sub):
                    roles.setdefault(name, set()).add((node.op_type, -2))
        if node.op_type == "Gemm" and len(node.input) > 1:
            trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
            if trans:
                roles.setdefault(node.input[1], set()).add(("Gemm", -1))
    return roles


def _constant_fill(node: onnx.NodeProto, inits) -> tuple[str, tuple[int, ...], object] | None:
    """(output, shape, NumPy dtype) of a float ConstantOfShape whose shape is an
    initializer: a weight stored as a fill."""
    if node.op_type != "ConstantOfShape" or not node.input or node.input[0] not in inits:
        return None
    value = next((a.t for a in node.attribute if a.name == "value"), None)
    elem = value.data_type if value is not None else onnx.TensorProto.FLOAT
    if elem not in _FLOATS or not node.output or not node.output[0]:
        return None
    shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).reshape(-1))
    return node.output[0], shape, helper.tensor_dtype_to_np_dtype(elem)


def _draw(name: str, shape: tuple[int, ...], roles: set[tuple[str, int]],
          seed: int) -> np.ndarray | None:
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if size < 2 or not roles or roles & _NOT_WEIGHTS:
        return None
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode("utf-8"))])
    if roles & _POSITIVE:
        return rng.uniform(0.5, 1.5, size=shape)
    if ("MatMul", 1) in roles and len(shape) >= 2:
        fan_in = shape[-2]
    elif ("Gemm", 1) in roles and len(shape) == 2:
        fan_in = shape[1] if ("Gemm", -1) in roles else shape[0]
    else:
        fan_in = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    scale = 1.0 / np.sqrt(max(fan_in, 1)) if len(shape) > 1 else 0.1
    return rng.standard_normal(size=shape) * scale
