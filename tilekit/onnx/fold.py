"""Constant folding and static shapes: what an import knows before any converter runs.

`evaluate(node, inputs, opset)` evaluates one ONNX node whose inputs are all known. Common
shape arithmetic and weight producers (Constant, ConstantOfShape, Shape, Gather, Concat,
Unsqueeze, Reshape, Cast, ...) have NumPy fast paths because real models hold hundreds
of them (ResNet-50's weights are 239 ConstantOfShape fills); anything else goes through
`onnx.reference.ReferenceEvaluator` on the single node, so every deterministic standard op
folds.

`ShapeFolding` (a base of `tilekit.onnx.importer.Importer`) applies it to a whole graph:
`--shape` overrides, ONNX shape inference and folding (an `If` on a folded condition
replaced by its branch), repeated until every tensor that is read has a static shape;
declared dimensions that are symbolic or -1 are left open for inference.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import NodeProto, helper, numpy_helper

from tilekit import limits
from tilekit.errors import TilekitError, UnsupportedError, excerpt
from tilekit.onnx.dtypes import ONNX_DTYPES, elem_type_name
from tilekit.onnx.names import node_where, sanitize

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
    limits.elements(shape, None, "a ConstantOfShape fill")
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


def _gather_elements(node, ins, attrs, opset):
    # onnx.reference's GatherElements fails on an axis longer than 32 (numpy.choose).
    x, idx = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
    axis = attrs.get("axis", 0) % max(x.ndim, 1)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take_along_axis(x, idx, axis=axis)]


FAST: dict[str, Callable] = {
    "GatherElements": _gather_elements,
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze, "Reshape": _reshape, "Gather": _gather, "Concat": _concat,
    "Cast": _cast, "Add": _binary(np.add), "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply), "Div": _div, "Identity": _identity, "Dropout": _identity,
    "Transpose": _transpose,
}


def predicted_elements(node: NodeProto, inputs: Arrays) -> int | None:
    """The element count of the largest output of a node that can make more data than it
    reads (a fill, a broadcast, a repetition, a range), from its constant inputs, or None.
    Folding checks it against `limits.TENSOR_ELEMENTS` before allocating anything."""
    try:
        if node.op_type in ("ConstantOfShape", "Expand", "Tile") and len(inputs) >= 1:
            if node.op_type == "ConstantOfShape":
                return _product(np.asarray(inputs[0]).reshape(-1))
            given = np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else None
            shape = list(np.shape(inputs[0]))
            if given is None:
                return None
            if node.op_type == "Tile":
                return _product([d * r for d, r in zip(shape, given)])
            rank = max(len(shape), len(given))
            shape = [1] * (rank - len(shape)) + shape
            wide = [1] * (rank - len(given)) + [int(g) for g in given]
            return _product([max(a, b) for a, b in zip(shape, wide)])
        if node.op_type == "Range" and len(inputs) == 3:
            start, stop, step = (float(np.asarray(v).reshape(-1)[0]) for v in inputs)
            if step == 0 or not all(map(np.isfinite, (start, stop, step))):
                return None
            return max(0, int(np.ceil((stop - start) / step)))
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return None


def _product(dims) -> int:
    n = 1
    for d in dims:
        n *= max(int(d), 0)
    return n


def evaluate(node: NodeProto, inputs: Arrays, opset: int) -> list[np.ndarray]:
    """The outputs of `node` on constant `inputs` (None for an absent optional input).

    Floating-point warnings are silenced: a model may compute values it then discards (T5's
    relative-position buckets take log(0) and cast -inf to int64, then select the other
    branch), and the import says nothing about them, as onnxruntime does not."""
    attrs = attributes(node)
    fast = FAST.get(node.op_type)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
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


# -- whole-graph shapes ------------------------------------------------------------------

#: Ops whose output shape depends on input values: importable only when folded.
_DATA_DEPENDENT_SHAPES = frozenset({"NonZero", "Unique", "NonMaxSuppression", "Compress",
                                    "StringSplit", "RandomNormalLike"})
#: Shape inference + folding rounds before giving up on a still-unknown shape.
_MAX_ROUNDS = 4


def type_of(vi: onnx.ValueInfoProto) -> tuple[tuple[int | None, ...] | None, int] | None:
    """(shape with None for unknown dims, elem type), or None for a non-tensor type."""
    t = vi.type
    if not t.HasField("tensor_type"):
        return None
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return dims, tt.elem_type


class ShapeFolding:
    """Steps 1-3 of an import (`tilekit.onnx.importer`): static graph inputs, ONNX shape
    inference, and folding of every node whose inputs are known, repeated until every read
    tensor has a static shape.

    A base of `Importer`, whose state it reads and fills: `model`, `graph`, `nodes`,
    `input_names`, `graph_outputs`, `shape_overrides`, `opset`, `lenient` (read); `types`,
    `consts`, `strict_failure`, `folded`, `warnings` (filled); `unfoldable` (read): values
    that stay ops because their size depends on a symbolic dimension (`tilekit.onnx.symbolic`). The importer supplies
    `_inline_constant_ifs()` (an If whose condition folded becomes its branch: new nodes,
    more rounds), `_unsupported_op(index, node, others)` (the error for nodes without a
    converter) and `_dynamic_hint(*names)` (which inputs to fix when a shape stays open).
    """

    def _static_inputs(self) -> onnx.ModelProto:
        """The model with `--shape` overrides applied; every real input must be static."""
        overrides = dict(self.shape_overrides)
        by_sanitized = {sanitize(n): n for n in self.input_names}
        for key in list(overrides):
            if key not in self.input_names and key in by_sanitized:
                overrides[by_sanitized[key]] = overrides.pop(key)
        unknown = sorted(set(overrides) - set(self.input_names))
        if unknown:
            raise TilekitError(f"--shape names '{unknown[0]}', which is not a graph input",
                               "--shape", f"graph inputs: {', '.join(self.input_names[:8])}")
        model = self.model
        if overrides:
            model = onnx.ModelProto()
            model.CopyFrom(self.model)
            for vi in model.graph.input:
                if vi.name in overrides:
                    dims = [int(d) for d in overrides[vi.name]]
                    shape = vi.type.tensor_type.shape
                    if shape.dim and len(shape.dim) != len(dims):
                        raise TilekitError(
                            f"--shape gives {len(dims)} dimensions for '{vi.name}', which has "
                            f"rank {len(shape.dim)}", "--shape", "give one size per dimension")
                    vi.type.tensor_type.ClearField("shape")
                    for d in dims:
                        vi.type.tensor_type.shape.dim.add().dim_value = d
            self.graph = model.graph
            self.nodes = list(self.graph.node)
        for vi in model.graph.input:
            if vi.name not in self.input_names:
                continue
            typ = type_of(vi)
            if typ is None:
                raise UnsupportedError(f"graph input '{vi.name}' is not a tensor",
                                       "graph.input", "only tensor inputs are supported")
            shape, elem = typ
            if elem not in ONNX_DTYPES:
                raise UnsupportedError(
                    f"graph input '{vi.name}' has element type "
                    f"{elem_type_name(elem)}", "graph.input",
                    f"supported element types: {', '.join(sorted(set(ONNX_DTYPES.values())))}")
            if shape is None or any(d is None or d <= 0 for d in shape):
                dims = vi.type.tensor_type.shape.dim if shape is not None else []
                shown = ",".join(str(d.dim_value) if d.HasField("dim_value")
                                 else (d.dim_param or "?") for d in dims) or "unknown rank"
                example = ",".join(str(d.dim_value) if d.HasField("dim_value") and d.dim_value
                                   else "1" for d in dims) or "1,3,224,224"
                raise TilekitError(
                    f"graph input '{vi.name}' has a symbolic or unknown shape [{shown}]; "
                    "tilekit needs static shapes", "graph.input",
                    f"give it one with --shape {vi.name}={example}")
        return model

    def _infer(self, model: onnx.ModelProto) -> None:
        inferred = None
        data_prop = _data_prop_bounded(model)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=True,
                                                         strict_mode=True, data_prop=data_prop)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - refused, or lenient inference below
            self.strict_failure = _first_line(exc)[:300]
            if not self.lenient and _declared_shapes_contradict(model):
                raise UnsupportedError("a declared shape contradicts the model's ops (ONNX's "
                                       f"strict shape inference: {self.strict_failure})",
                                       "model", "fix the model's declared output and "
                                       "value_info shapes, or pass --lenient-shapes to trust "
                                       "them") from None
            self.warnings.append(f"strict shape inference failed ({self.strict_failure}); "
                                 "using lenient inference")
            try:
                inferred = onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
            except MemoryError:
                raise
            except Exception as exc2:  # noqa: BLE001
                raise TilekitError(f"ONNX shape inference failed: {_first_line(exc2)}",
                                   "model", "check the model with onnx.checker") from None
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            typ = type_of(vi)
            if typ is None:
                continue
            if typ[0] is not None and None not in typ[0]:
                limits.elements(typ[0], f"tensor '{excerpt(vi.name, quote=False)}'")
            old = self.types.get(vi.name)
            if old is None or old[0] is None or (typ[0] is not None and None not in typ[0]):
                self.types[vi.name] = typ

    # -- folding -------------------------------------------------------------------------
    def _fold_until_static(self, model: onnx.ModelProto) -> None:
        rounds = 0
        while rounds < _MAX_ROUNDS:
            progress = len(self.folded)
            self._fold()
            inlined = self._inline_constant_ifs()
            missing = self._missing_shapes()
            if not missing and not inlined:
                # Shapes that became static in this round (a Reshape whose target folded
                # last) can let a Shape or Size of them fold now: fold until nothing moves.
                before = len(self.folded)
                self._fold()
                if len(self.folded) == before:
                    return
            self._infer(self._partially_folded(model))
            # An inlined branch is new graph: its rounds start afresh; so does a round that
            # folded something (a deep model's shape arithmetic folds a block per round, and
            # the folded set only grows, so this ends).
            if not inlined and len(self.folded) == progress:
                rounds += 1
        missing = self._missing_shapes()
        if missing:
            from tilekit.onnx.converters import lookup

            for index, _ in missing:
                node = self.nodes[index]
                if node.op_type in _DATA_DEPENDENT_SHAPES:
                    raise UnsupportedError(
                        f"op type '{node.op_type}' (opset {self.opset}) has an output shape "
                        "that depends on the input values", node_where(index, node),
                        "tilekit needs static shapes; such an op is only importable when its "
                        "inputs are constants (it is then folded)")
            unconvertible = [i for i, node in enumerate(self.nodes) if i not in self.folded
                             and lookup(node.op_type) is None
                             and node.op_type not in ("Shape", "Size")]
            for index, _ in missing:
                if lookup(self.nodes[index].op_type) is None:
                    raise self._unsupported_op(index, self.nodes[index], unconvertible)
            index, name = missing[0]
            node = self.nodes[index]
            raise TilekitError(
                f"the shape of '{name}' (output of {node.op_type} {node_where(index, node)}) "
                "is not static after shape inference: a dimension is dynamic", "model",
                self._dynamic_hint(*_shape_arguments(node, self._static_shape)))

    def _fold(self) -> None:
        for index, node in enumerate(self.nodes):
            if index in self.folded or node.op_type in NOT_FOLDABLE:
                continue
            if any(name in self.unfoldable for name in node.output):
                continue  # sized by a symbolic dimension: an op, not a weight
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for a in node.attribute):
                continue
            results = self._try_fold(node)
            if results is None:
                continue
            for name, array in zip(node.output, results):
                if name:
                    self.consts[name] = array
            self.folded.add(index)

    def _try_fold(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        if node.op_type in ("Shape", "Size"):
            shape = self._static_shape(node.input[0])
            if shape is None:
                return None
            if node.op_type == "Size":
                return [np.asarray(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
            attrs = attributes(node)
            start, end = attrs.get("start", 0), attrs.get("end", None)
            return [np.asarray(shape[start:end], dtype=np.int64)]
        ins = [n for n in node.input if n]
        if not ins and node.op_type != "Constant":
            return None
        if any(n not in self.consts for n in ins):
            return None
        inputs = [self.consts[n] if n else None for n in node.input]
        self._check_fold_budget(node, inputs)
        try:
            results = evaluate(node, inputs, self.opset)
        except limits.LimitError as exc:
            raise limits.LimitError(exc.what, self._node_where(node), exc.hint) from None
        except MemoryError:
            raise limits.LimitError(
                f"memory ran out folding {node.op_type} (the constants folded so far: "
                f"{self._folded_bytes:,} bytes)", self._node_where(node),
                f"lower {limits.TOTAL_BYTES.env} below the memory this process may use, so "
                "that such a model is refused before it allocates") from None
        except Exception:  # noqa: BLE001 - an op the evaluators cannot fold is converted
            return None
        for array in results:
            self._folded_bytes += array.nbytes
            limits.TOTAL_BYTES.check(self._folded_bytes, self._node_where(node),
                                     "the constants folded so far")
        return results

    def _node_where(self, node: onnx.NodeProto) -> str:
        return node_where(self.nodes.index(node), node)

    def _check_fold_budget(self, node: onnx.NodeProto, inputs: Arrays) -> None:
        """Refuse, before evaluating it, a fold whose result would be over the tensor size
        budget: from inferred output shapes, else from the op's own arithmetic."""
        sizes = [predicted_elements(node, inputs) or 0]
        for name in node.output:
            typ = self.types.get(name)
            if typ is not None and typ[0] is not None and None not in typ[0]:
                sizes.append(_product(typ[0]))
        if max(sizes) > limits.TENSOR_ELEMENTS.value:
            raise limits.TENSOR_ELEMENTS.error(f"the folded value of {node.op_type} "
                                               f"({max(sizes):,} elements)",
                                               self._node_where(node))
        # Its bytes join the constants folded so far, checked before the fold allocates.
        itemsize = max((helper.tensor_dtype_to_np_dtype(t[1]).itemsize
                        for t in (self.types.get(n) for n in node.output)
                        if t is not None and t[1] in ONNX_DTYPES), default=4)
        limits.TOTAL_BYTES.check(self._folded_bytes + max(sizes) * itemsize,
                                 self._node_where(node),
                                 f"the constants folded so far with {node.op_type}'s value")

    def _static_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        typ = self.types.get(name)
        if typ is None or typ[0] is None or None in typ[0]:
            return None
        return tuple(int(d) for d in typ[0])

    def _missing_shapes(self) -> list[tuple[int, str]]:
        missing = []
        for index, node in enumerate(self.nodes):
            if index in self.folded:
                continue
            for name in node.output:
                if name and name in self._read_anywhere and self._static_shape(name) is None:
                    missing.append((index, name))
        return missing

    def _partially_folded(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """`model` with folded nodes replaced by their values, for shape inference.

        Small constants travel as initializers (inference reads their values: shapes, axes);
        large ones only as typed inputs, so that no weight data is serialised for inference.
        """
        g = model.graph
        keep = [n for i, n in enumerate(self.nodes) if i not in self.folded]
        needed = {name for n in keep for name in n.input if name in self.consts}
        needed |= {o for o in self.graph_outputs if o in self.consts}
        inits, inputs = [], [vi for vi in g.input if vi.name in self.input_names]
        for name in sorted(needed):
            array = self.consts[name]
            if array.size <= 4096:
                inits.append(numpy_helper.from_array(array, name))
            else:
                inputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)))
        # A folded value's own shape is exact; the model's declaration of it (open dims for
        # a dynamic export) would take precedence in inference and hide it.
        graph = helper.make_graph(keep, g.name or "g", inputs,
                                  [_open_dims(vi) for vi in g.output], inits,
                                  value_info=[_open_dims(vi) for vi in g.value_info
                                              if vi.name not in self.consts])
        out = helper.make_model(graph, opset_imports=list(model.opset_import))
        out.ir_version = max(model.ir_version, 4)
        return out


#: Ops whose ONNX data propagation (shape values carried through the graph) builds one shape
#: entry per element of a 1-D tensor, tens of bytes each.
_PROPAGATING = frozenset({"Add", "Sub", "Mul", "Div", "Cast", "Concat", "Gather", "Shape",
                          "Size", "Slice", "Squeeze", "Unsqueeze"})
#: 1-D tensors longer than this never carry a shape (rank <= 64): see `_data_prop_bounded`.
_MAX_PROPAGATED = 4096
#: Ops whose output length can be known only through data propagation and be huge.
_GROWING = frozenset({"ConstantOfShape", "Expand", "Tile", "Range"})


def _data_prop_bounded(model: onnx.ModelProto) -> bool:
    """Whether ONNX's data propagation may run on `model`: no op that propagates touches a
    1-D tensor longer than `_MAX_PROPAGATED`, known or possibly grown from values. A
    200-byte model whose ConstantOfShape makes 2^28 floats for a Mul made it allocate
    gigabytes (std::bad_alloc, or a SIGSEGV under a memory limit). Without it, ONNX's
    inference still runs, and folding gives the shapes it would have propagated."""
    try:
        plain = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the real call reports it
        return False
    g = plain.graph
    lengths: dict[str, int | None] = {t.name: (t.dims[0] if len(t.dims) == 1 else 0)
                                      for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        typ = type_of(vi)
        if typ is not None and typ[0] is not None and len(typ[0]) == 1:
            lengths[vi.name] = typ[0][0]
    grown = {o for n in g.node if n.op_type in _GROWING for o in n.output}
    for node in g.node:
        if node.op_type not in _PROPAGATING:
            continue
        for name in (*node.input, *node.output):
            if name not in lengths:
                continue
            n = lengths[name]
            if (n is None and name in grown) or (n is not None and n > _MAX_PROPAGATED):
                return False
    return True


#: The inputs that decide an op's output shape (by their values), where not all do.
_SHAPE_ARGUMENTS = {"If": (0,), "Loop": (0, 1), "Reshape": (1,), "Expand": (1,), "Tile": (1,),
                    "ConstantOfShape": (0,), "Slice": (1, 2, 3, 4), "Pad": (1,),
                    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,),
                    "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "CenterCropPad": (1,),
                    **{f"Reduce{k}": (1,) for k in ("Sum", "Mean", "Max", "Min", "Prod", "L1",
                                                    "L2", "SumSquare", "LogSum",
                                                    "LogSumExp")}}


def _shape_arguments(node: NodeProto, static_shape: Callable) -> list[str]:
    """The inputs of `node` that make its output shape unknown: those whose values decide
    it (an If's condition, Reshape's target, all of Range's), else those whose own shapes
    are unknown (`static_shape(name)` is None)."""
    positions = _SHAPE_ARGUMENTS.get(node.op_type)
    if positions is None and node.op_type != "Range":
        return [n for n in node.input if n and static_shape(n) is None]
    return [n for i, n in enumerate(node.input) if n and (positions is None or i in positions)]


def _open_dims(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """A declared output or value_info with its symbolic and non-positive dimensions
    (`batch`, `-1`, exported for a dynamic batch) made unknown: once the graph inputs have
    static shapes, such a dimension claims nothing that inference could contradict. Static
    dimensions stay, so a real contradiction is still found."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return vi
    dims = vi.type.tensor_type.shape.dim
    if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
        return vi
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    for d in out.type.tensor_type.shape.dim:
        if not (d.HasField("dim_value") and d.dim_value > 0):
            d.Clear()
    return out


def _declared_shapes_contradict(model: onnx.ModelProto) -> bool:
    """Whether strict inference, which failed on `model`, succeeds once the declared shapes
    of graph outputs and `value_info` are dropped: then those declarations contradict the
    ops (a Softmax over [2, 20] declared [2, 1]), rather than ONNX failing on something else
    (some function ops fail strict inference in any model)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    for out in bare.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        onnx.shape_inference.infer_shapes(bare, check_type=True, strict_mode=True,
                                          data_prop=True)
    except Exception:  # noqa: BLE001 - it fails for another reason too
        return False
    return True


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__
