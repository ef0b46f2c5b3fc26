"""Constant folding: evaluate an ONNX node whose inputs are all known at import.

Common shape arithmetic and weight producers (Constant, ConstantOfShape, Shape, Gather,
Concat, Unsqueeze, Reshape, Cast, ...) have NumPy fast paths because real models hold hundreds
of them (ResNet-50's weights are 239 ConstantOfShape fills); anything else goes through
`onnx.reference.ReferenceEvaluator` on the single node, so every deterministic standard op
folds.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from onnx import NodeProto, helper, numpy_helper

#: Ops that must never be folded: their value is not a function of their inputs.
NOT_FOLDABLE = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli", "If", "Loop", "Scan", "SequenceEmpty", "SequenceConstruct", "SequenceInsert",
    "SequenceAt", "SequenceErase", "SequenceLength", "SplitToSequence", "ConcatFromSequence",
    "Optional", "OptionalGetElement", "OptionalHasElement", "Gradient", "StringNormalizer",
})

Arrays = Sequence["np.ndarray | None"]


def attributes(node: NodeProto) -> dict[str, Any]:
    """A node's attributes as plain Python values (tensors as arrays)."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", "replace") for v in value]
        elif hasattr(value, "dims") and hasattr(value, "data_type"):
            value = numpy_helper.to_array(value)
        out[a.name] = value
    return out


def _constant(node, ins, attrs, opset):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            v = attrs[key]
            if key in ("value_float", "value_floats"):
                return [np.asarray(v, dtype=np.float32)]
            if key in ("value_int", "value_ints"):
                return [np.asarray(v, dtype=np.int64)]
            return [np.asarray(v)]
    return None


def _constant_of_shape(node, ins, attrs, opset):
    value = attrs.get("value")
    fill = np.asarray(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    shape = tuple(int(d) for d in np.asarray(ins[0]).reshape(-1))
    # A read-only broadcast view: a 100 MB fill costs no memory until it is written out.
    return [np.broadcast_to(fill[:1].reshape(()), shape)]


def _axes(attrs, ins, index, opset, since):
    if opset >= since:
        return None if len(ins) <= index or ins[index] is None else [int(a) for a in ins[index]]
    return attrs.get("axes")


def _unsqueeze(node, ins, attrs, opset):
    axes = _axes(attrs, ins, 1, opset, 13)
    x = np.asarray(ins[0])
    rank = x.ndim + len(axes)
    shape = list(x.shape)
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    return [x.reshape(shape)]


def _squeeze(node, ins, attrs, opset):
    axes = _axes(attrs, ins, 1, opset, 13)
    x = np.asarray(ins[0])
    if axes is None:
        return [x.reshape([d for d in x.shape if d != 1])]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _reshape(node, ins, attrs, opset):
    x = np.asarray(ins[0])
    shape = [int(d) for d in (ins[1] if opset >= 5 else attrs["shape"])]
    allowzero = attrs.get("allowzero", 0)
    shape = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _gather(node, ins, attrs, opset):
    return [np.take(ins[0], np.asarray(ins[1]), axis=attrs.get("axis", 0))]


def _concat(node, ins, attrs, opset):
    return [np.concatenate([np.asarray(i) for i in ins if i is not None], axis=attrs["axis"])]


def _cast(node, ins, attrs, opset):
    return [np.asarray(ins[0]).astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))]


def _binary(fn):
    def run(node, ins, attrs, opset):
        a, b = np.asarray(ins[0]), np.asarray(ins[1])
        return [np.asarray(fn(a, b)).astype(np.result_type(a, b), copy=False)]
    return run


def _div(node, ins, attrs, opset):
    a, b = np.asarray(ins[0]), np.asarray(ins[1])
    if a.dtype.kind in "iu":
        return [np.trunc(a / b).astype(a.dtype)]
    return [(a / b).astype(a.dtype)]


def _identity(node, ins, attrs, opset):
    outs = [np.asarray(ins[0])]
    if node.op_type == "Dropout" and len(node.output) > 1:
        outs.append(np.ones(outs[0].shape, dtype=bool))
    return outs


def _transpose(node, ins, attrs, opset):
    return [np.transpose(ins[0], attrs.get("perm"))]


FAST: dict[str, Callable] = {
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze, "Reshape": _reshape, "Gather": _gather, "Concat": _concat,
    "Cast": _cast, "Add": _binary(np.add), "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply), "Div": _div, "Identity": _identity, "Dropout": _identity,
    "Transpose": _transpose,
}


def evaluate(node: NodeProto, inputs: Arrays, opset: int) -> list[np.ndarray]:
    """The outputs of `node` on constant `inputs` (None for an absent optional input)."""
    attrs = attributes(node)
    fast = FAST.get(node.op_type)
    if fast is not None:
        result = fast(node, inputs, attrs, opset)
        if result is not None:
            return [np.asarray(r) for r in result]
    return _reference(node, inputs, opset)


def _reference(node: NodeProto, inputs: Arrays, opset: int) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"out{i}" if o else "" for i, o in enumerate(node.output)]
    clone = helper.make_node(node.op_type, names, outs, domain=node.domain or None)
    clone.attribute.extend(node.attribute)
    evaluator = ReferenceEvaluator(clone, opsets={"": opset})
    feeds = {n: np.asarray(x) for n, x in zip(names, inputs) if n}
    results = evaluator.run(None, feeds)
    return [np.asarray(r) for r in results]
