"""ONNX model -> tile-IR module: the graph walk.

The order of work, each step relying on the one before:

1. refuse what cannot be static: foreign op domains, graph inputs with symbolic dimensions
   (unless `--shape NAME=d0,d1,...` overrides them);
2. run ONNX shape inference (strict, data propagation on) so every tensor has a static shape;
3. fold constants: initializers, Constant, ConstantOfShape, Shape/Size of static tensors and any
   node whose inputs are all constants. Folding can reveal shapes (a Reshape whose target is
   computed), so inference and folding repeat until nothing changes;
4. name every ONNX tensor once, in graph order (`tilekit.onnx.names`), before any converter
   runs, so that a name never depends on how an earlier op was decomposed;
5. convert the remaining nodes in graph order through the converter registry
   (`tilekit.onnx.converters`); converters emit one statement per op;
6. make graph outputs real tensors (a copy where an output is an alias, a constant or an input),
   drop ops whose results nothing reads, and keep only the constants that some op reads as
   weights.

The result is a `Module` with one singleton kernel per op and the `import` stage recorded, plus
the weights as arrays; `tilekit.onnx.save` writes both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.model import Module, Op, Tensor, default_kernels
from tilekit.onnx import fold, text
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.names import NameTable, sanitize

#: ONNX element types the tile IR can hold.
ONNX_DTYPES = {
    TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64",
    TensorProto.INT64: "int64", TensorProto.INT32: "int32", TensorProto.INT16: "int16",
    TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.BOOL: "bool",
}
_NUMPY_TO_IR = {"float32": "float32", "float16": "float16", "float64": "float64",
                "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
                "uint8": "uint8", "bool": "bool", "bfloat16": "bfloat16"}

_STANDARD_DOMAINS = ("", "ai.onnx")
#: Opsets the converters are written and tested against; newer ones import with a warning.
TESTED_OPSETS = (6, 21)
#: Ops whose output shape depends on input values: importable only when folded.
_DATA_DEPENDENT_SHAPES = frozenset({"NonZero", "Unique", "NonMaxSuppression", "Compress",
                                    "StringSplit", "RandomNormalLike"})
#: Shape inference + folding rounds before giving up on a still-unknown shape.
_MAX_ROUNDS = 4


@dataclass(frozen=True)
class Imported:
    """An imported model: the module and its weights (by tensor name).

    The module's `source` holds only the ONNX names of renamed inputs and outputs
    (`{inputs: {ir name: onnx name}, outputs: {...}}`); `tilekit.onnx.attach_files` adds the
    file path and checksum, and `weights`. `warnings` are for the user (stderr).
    """

    module: Module
    #: Arrays by weight-tensor name; folded fills are read-only broadcast views.
    weights: Mapping[str, np.ndarray]
    warnings: tuple[str, ...] = ()


def import_model(model: onnx.ModelProto, *, name: str = "model",
                 shapes: Mapping[str, Sequence[int]] | None = None) -> Imported:
    """Convert an ONNX model to a tile-IR module. `shapes` overrides graph-input shapes
    (keyed by ONNX name or by its sanitised form)."""
    return Importer(model, name, shapes or {}).run()


def _opset_of(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in _STANDARD_DOMAINS:
            return int(entry.version)
    if not model.opset_import and model.ir_version:
        return 1
    raise UnsupportedError("the model imports no version of the standard ONNX operator set",
                           "opset_import", "re-export the model with a standard opset")


def _type_of(vi: onnx.ValueInfoProto) -> tuple[tuple[int | None, ...] | None, int] | None:
    """(shape with None for unknown dims, elem type), or None for a non-tensor type."""
    t = vi.type
    if not t.HasField("tensor_type"):
        return None
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return dims, tt.elem_type


class Importer:
    """One import: mutable while it runs, producing an immutable `Imported`."""

    def __init__(self, model: onnx.ModelProto, name: str, shapes: Mapping[str, Sequence[int]]):
        self.model = model
        self.graph = model.graph
        self.model_name = name
        self.opset = _opset_of(model)
        self.shape_overrides = dict(shapes)
        self.nodes = list(self.graph.node)
        self.names = NameTable()
        self.op_names = NameTable()
        self.consts: dict[str, np.ndarray] = {}
        self.types: dict[str, tuple[tuple[int | None, ...] | None, int]] = {}
        self.values: dict[str, Value] = {}
        self.tensors: dict[str, Tensor] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.ops: list[Op] = []
        self.folded: set[int] = set()
        self.absorbed: set[int] = set()
        self.warnings: list[str] = []
        self.graph_outputs = [o.name for o in self.graph.output]
        init_names = {t.name for t in self.graph.initializer}
        self.input_names = [i.name for i in self.graph.input if i.name not in init_names]
        self.consumers: dict[str, list[int]] = {}
        #: Every tensor some node or the graph output list reads (an unread optional output,
        #: like a Dropout mask, may have no inferred shape and needs none).
        self._read_anywhere = {n for node in self.nodes for n in node.input if n} | set(
            self.graph_outputs)

    # -- the steps -----------------------------------------------------------------------
    def run(self) -> Imported:
        self._check_nodes()
        if self.opset > TESTED_OPSETS[1]:
            self.warnings.append(f"the model uses opset {self.opset}; the converters are "
                                 f"tested with opsets {TESTED_OPSETS[0]}..{TESTED_OPSETS[1]}")
        for init in self.graph.initializer:
            self.consts[init.name] = self._initializer(init)
        model = self._static_inputs()
        self._infer(self._partially_folded(model))
        self._fold_until_static(model)
        self._claim_names()
        self._convert()
        self._finish_outputs()
        return self._build()

    def _check_nodes(self) -> None:
        """Refuse early what no amount of folding can make convertible: foreign domains and
        op types without a converter that never fold (sequences, control flow, strings)."""
        from tilekit.onnx.converters import lookup

        for index, node in enumerate(self.nodes):
            if node.domain not in _STANDARD_DOMAINS:
                raise UnsupportedError(
                    f"op {node.domain}::{node.op_type} is from a non-standard domain",
                    f"node {index} '{node.name or f'{node.op_type}_{index}'}'",
                    "only the standard ONNX operator set (domain '' / ai.onnx) is imported")
            if node.op_type in fold.NOT_FOLDABLE and lookup(node.op_type) is None:
                raise self._unsupported_op(index, node)

    def _unsupported_op(self, index: int, node: onnx.NodeProto) -> UnsupportedError:
        from tilekit.onnx.converters import supported_op_types

        known = supported_op_types()
        return UnsupportedError(
            f"op type '{node.op_type}' (opset {self.opset}) is not supported",
            f"node {index} '{node.name or f'{node.op_type}_{index}'}'",
            f"supported op types ({len(known)}): {_trimmed(known)}")

    def _initializer(self, init: onnx.TensorProto) -> np.ndarray:
        if init.data_type not in ONNX_DTYPES:
            raise UnsupportedError(
                f"initializer '{init.name}' has element type "
                f"{helper.tensor_dtype_to_string(init.data_type)}", "graph.initializer",
                f"supported element types: {', '.join(sorted(set(ONNX_DTYPES.values())))}")
        try:
            return numpy_helper.to_array(init)
        except Exception as exc:  # external data missing, malformed raw data
            raise TilekitError(f"cannot read initializer '{init.name}': {exc}",
                               "graph.initializer",
                               "keep external data files next to the model") from None

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
            typ = _type_of(vi)
            if typ is None:
                raise UnsupportedError(f"graph input '{vi.name}' is not a tensor",
                                       "graph.input", "only tensor inputs are supported")
            shape, elem = typ
            if elem not in ONNX_DTYPES:
                raise UnsupportedError(
                    f"graph input '{vi.name}' has element type "
                    f"{helper.tensor_dtype_to_string(elem)}", "graph.input",
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
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=True,
                                                         strict_mode=True, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - fall back to lenient inference below
            self.warnings.append(f"strict shape inference failed ({_first_line(exc)}); "
                                 "using lenient inference")
            try:
                inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
            except Exception as exc2:  # noqa: BLE001
                raise TilekitError(f"ONNX shape inference failed: {_first_line(exc2)}",
                                   "model", "check the model with onnx.checker") from None
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            typ = _type_of(vi)
            if typ is None:
                continue
            old = self.types.get(vi.name)
            if old is None or old[0] is None or (typ[0] is not None and None not in typ[0]):
                self.types[vi.name] = typ

    # -- folding -------------------------------------------------------------------------
    def _fold_until_static(self, model: onnx.ModelProto) -> None:
        for _ in range(_MAX_ROUNDS):
            self._fold()
            missing = self._missing_shapes()
            if not missing:
                return
            self._infer(self._partially_folded(model))
        missing = self._missing_shapes()
        if missing:
            from tilekit.onnx.converters import lookup

            for index, _ in missing:
                node = self.nodes[index]
                if node.op_type in _DATA_DEPENDENT_SHAPES:
                    raise UnsupportedError(
                        f"op type '{node.op_type}' (opset {self.opset}) has an output shape "
                        "that depends on the input values", f"node {index} "
                        f"'{node.name or f'{node.op_type}_{index}'}'",
                        "tilekit needs static shapes; such an op is only importable when its "
                        "inputs are constants (it is then folded)")
                if lookup(node.op_type) is None:
                    raise self._unsupported_op(index, node)
            index, name = missing[0]
            node = self.nodes[index]
            raise TilekitError(
                f"the shape of '{name}' (output of {node.op_type} node {index} "
                f"'{node.name or f'{node.op_type}_{index}'}') is not static after shape "
                "inference", "model",
                "give every graph input a static shape with --shape NAME=d0,d1,...")

    def _fold(self) -> None:
        for index, node in enumerate(self.nodes):
            if index in self.folded or node.op_type in fold.NOT_FOLDABLE:
                continue
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
            attrs = fold.attributes(node)
            start, end = attrs.get("start", 0), attrs.get("end", None)
            return [np.asarray(shape[start:end], dtype=np.int64)]
        ins = [n for n in node.input if n]
        if not ins and node.op_type != "Constant":
            return None
        if any(n not in self.consts for n in ins):
            return None
        inputs = [self.consts[n] if n else None for n in node.input]
        try:
            return fold.evaluate(node, inputs, self.opset)
        except Exception:  # noqa: BLE001 - an op the evaluators cannot fold is converted
            return None

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
        graph = helper.make_graph(keep, g.name or "g", inputs, list(g.output), inits,
                                  value_info=list(g.value_info))
        out = helper.make_model(graph, opset_imports=list(model.opset_import))
        out.ir_version = max(model.ir_version, 4)
        return out

    # -- naming --------------------------------------------------------------------------
    def _claim_names(self) -> None:
        for name in self.input_names:
            self.names.claim(name)
        for init in self.graph.initializer:
            self.names.claim(init.name)
        for node in self.nodes:
            for name in node.output:
                if name:
                    self.names.claim(name)
        for index, node in enumerate(self.nodes):
            if index in self.folded:
                continue
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(index)

    def output_base(self, node: onnx.NodeProto) -> str:
        """The readable stem of names derived from `node`: its first output's IR name."""
        for name in node.output:
            if name:
                return self.names.claim(name)
        return sanitize(node.name or node.op_type)

    # -- conversion ----------------------------------------------------------------------
    def _convert(self) -> None:
        from tilekit.onnx.converters import lookup

        for index, node in enumerate(self.nodes):
            if index in self.folded or index in self.absorbed:
                continue
            entry = lookup(node.op_type)
            if entry is None:
                raise self._unsupported_op(index, node)
            ctx = NodeContext(self, node, index, fold.attributes(node))
            entry.convert(ctx)
            ctx.check_attrs(entry.ignore)

    def value(self, onnx_name: str) -> Value:
        """The Value an ONNX tensor name stands for (a constant, an alias or a tensor)."""
        if onnx_name in self.values:
            return self.values[onnx_name]
        if onnx_name in self.consts:
            array = self.consts[onnx_name]
            v = Value(self.names.claim(onnx_name), tuple(array.shape),
                      self.ir_dtype(array.dtype, onnx_name), array)
            self.values[onnx_name] = v
            return v
        if onnx_name in self.input_names:
            shape = self._static_shape(onnx_name)
            v = Value(self.names.claim(onnx_name), shape, self._onnx_dtype(onnx_name))
            self.values[onnx_name] = v
            return v
        raise TilekitError(f"tensor '{onnx_name}' is read before any node produces it",
                           "graph", "the graph must be topologically sorted and complete")

    def output_value(self, node: onnx.NodeProto, i: int, ctx: NodeContext) -> Value:
        onnx_name = node.output[i] if i < len(node.output) else ""
        if onnx_name and onnx_name in self.values:
            return self.values[onnx_name]
        if not onnx_name:
            raise ctx.unsupported(f"output {i} is absent but needed")
        shape = self._static_shape(onnx_name)
        if shape is None:
            raise ctx.unsupported(f"the shape of output '{onnx_name}' is unknown",
                                  "give graph inputs static shapes with --shape")
        v = Value(self.names.claim(onnx_name), shape, self._onnx_dtype(onnx_name, ctx))
        self.values[onnx_name] = v
        return v

    def _onnx_dtype(self, onnx_name: str, ctx: NodeContext | None = None) -> str:
        typ = self.types.get(onnx_name)
        elem = typ[1] if typ else 0
        if elem not in ONNX_DTYPES:
            what = (f"tensor '{onnx_name}' has element type "
                    f"{helper.tensor_dtype_to_string(elem) if elem else 'unknown'}")
            hint = f"supported element types: {', '.join(sorted(set(ONNX_DTYPES.values())))}"
            if ctx is not None:
                raise ctx.unsupported(what, hint)
            raise UnsupportedError(what, "graph", hint)
        return ONNX_DTYPES[elem]

    def ir_dtype(self, dtype: np.dtype, name: str) -> str:
        key = str(np.dtype(dtype)) if np.dtype(dtype).name != "bfloat16" else "bfloat16"
        if key not in _NUMPY_TO_IR:
            raise UnsupportedError(f"constant '{name}' has element type {key}", "graph",
                                   f"supported: {', '.join(sorted(_NUMPY_TO_IR))}")
        return _NUMPY_TO_IR[key]

    def is_used(self, onnx_name: str) -> bool:
        return bool(self.consumers.get(onnx_name)) or onnx_name in self.graph_outputs

    def sole_consumer(self, onnx_name: str) -> int | None:
        """The index of the only node reading `onnx_name`, if it is not also a graph output."""
        users = self.consumers.get(onnx_name, [])
        if len(users) != 1 or onnx_name in self.graph_outputs:
            return None
        return users[0]

    def context(self, index: int) -> NodeContext:
        node = self.nodes[index]
        return NodeContext(self, node, index, fold.attributes(node))

    def absorb(self, index: int) -> NodeContext:
        """Mark node `index` as converted by another node's converter (a fold) and return its
        context, for reading its inputs and attributes and writing its outputs."""
        self.absorbed.add(index)
        return self.context(index)

    def materialize(self, value: Value) -> None:
        if value.name not in self.weights:
            self.weights[value.name] = value.const
            self.tensors.setdefault(value.name, Tensor(value.shape, value.dtype, "weight"))

    def new_tensor(self, wanted: str, shape: tuple[int, ...], dtype: str) -> Value:
        return Value(self.names.fresh(wanted), shape, dtype)

    def alias(self, node: onnx.NodeProto, i: int, value: Value) -> None:
        onnx_name = node.output[i]
        if onnx_name:
            self.values[onnx_name] = value

    def _declare(self, value: Value) -> None:
        if value.name not in self.tensors:
            self.tensors[value.name] = Tensor(tuple(value.shape), value.dtype)

    def _op_name(self, ctx: NodeContext, step: str | None) -> str:
        base = sanitize(ctx.origin)
        return self.op_names.fresh(base if step is None else f"{base}_{step}")

    def add_expr_op(self, ctx: NodeContext, out: Value, stmt: str, *, pad: str | None,
                    extents: Mapping[str, int] | None, step: str | None) -> None:
        self._declare(out)
        self.ops.append(Op(name=self._op_name(ctx, step), expr=stmt, pad=pad,
                           axes=dict(extents or {}), origin=ctx.origin))

    def add_opaque_op(self, ctx: NodeContext, type_name: str, inputs: Sequence[Value | None],
                      outputs: Sequence[Value], attrs: dict[str, Any],
                      step: str | None) -> None:
        from tilekit import opaque

        opaque.get(type_name)  # an unknown type is a bug in a converter: fail here
        for v in outputs:
            self._declare(v)
        names = [ctx.name_of(v) if v is not None else "" for v in inputs]
        record = {"type": type_name, "inputs": names, "outputs": [v.name for v in outputs],
                  "attrs": _plain(attrs)}
        self.ops.append(Op(name=self._op_name(ctx, step), kind="opaque", opaque=record,
                           origin=ctx.origin))

    # -- outputs and the module ----------------------------------------------------------
    def _finish_outputs(self) -> None:
        """Every graph output becomes a tensor of its own name, written by some op."""
        self.output_names: list[str] = []
        input_ir = {self.names.claim(n) for n in self.input_names}
        for onnx_name in self.graph_outputs:
            v = self.value(onnx_name)
            want = self.names.claim(onnx_name)
            if v.name == want and v.const is None and want not in input_ir \
                    and want not in self.output_names:
                self.output_names.append(want)
                continue
            if v.name == want and v.const is not None and want not in self.weights:
                # A folded constant that is a graph output: the output keeps the name, the
                # value becomes a weight beside it.
                v = Value(self.names.fresh(f"{want}_value"), v.shape, v.dtype, v.const)
            target = want if (want != v.name and want not in self.output_names
                              and want not in self.tensors) else self.names.fresh(f"{want}_out")
            out = Value(target, v.shape, v.dtype)
            ctx = NodeContext(self, helper.make_node("Identity", [onnx_name], [onnx_name]),
                              len(self.nodes), {})
            ctx.origin = f"output {onnx_name}"
            ax = text.axes(len(v.shape))
            ctx.assign(out, ax, "=", ctx.access(v, ax))
            self.output_names.append(target)

    def _build(self) -> Imported:
        ops = _live_ops(self.ops, set(self.output_names))
        read: set[str] = set()
        written: set[str] = set()
        for op in ops:
            r, w = _op_tensors(op)
            read |= r
            written |= w
        inputs = [self.names.claim(n) for n in self.input_names]
        tensors: dict[str, Tensor] = {}
        for onnx_name, name in zip(self.input_names, inputs):
            v = self.value(onnx_name)
            tensors[name] = Tensor(tuple(v.shape), v.dtype, "input")
        weights = {}
        for name in sorted(self.weights):
            if name in read and name not in written:
                t = self.tensors[name]
                tensors[name] = Tensor(t.shape, t.dtype, "weight")
                weights[name] = self.weights[name]
        for name, t in self.tensors.items():
            if name in written and name not in tensors:
                role = "output" if name in self.output_names else "intermediate"
                tensors[name] = Tensor(t.shape, t.dtype, role)
        ops = tuple(ops)
        renamed_in = {ir: onnx_name for onnx_name, ir in zip(self.input_names, inputs)
                      if ir != onnx_name}
        renamed_out = {ir: onnx_name for onnx_name, ir in zip(self.graph_outputs,
                                                               self.output_names)
                       if ir != onnx_name}
        source = {}
        if renamed_in:
            source["inputs"] = renamed_in
        if renamed_out:
            source["outputs"] = renamed_out
        module = Module(model=self.model_name, tensors=tensors, ops=ops, inputs=tuple(inputs),
                        outputs=tuple(self.output_names), kernels=default_kernels(ops),
                        source=source or None)
        return Imported(module, weights, tuple(self.warnings))


def _op_tensors(op: Op) -> tuple[set[str], set[str]]:
    """(tensors read, tensors written) by an op, from its statement or opaque record."""
    if op.kind == "opaque":
        return ({n for n in op.opaque["inputs"] if n}, set(op.opaque["outputs"]))
    head, _, body = op.expr.partition("]")
    written = {head.split("[", 1)[0].strip()}
    read = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\[", body))
    return read, written


def _live_ops(ops: list[Op], outputs: set[str]) -> list[Op]:
    """Drop ops whose results no later op and no graph output reads (unused optional
    outputs, a Dropout mask nobody reads, a Split part nobody uses)."""
    needed = set(outputs)
    keep: list[Op] = []
    for op in reversed(ops):
        read, written = _op_tensors(op)
        if written & needed:
            keep.append(op)
            needed |= read
    keep.reverse()
    return keep


def _plain(value: Any) -> Any:
    """Attributes as JSON-like data (no NumPy scalars or arrays in the IR)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _trimmed(names: Sequence[str], limit: int = 24) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names) - limit} more)"
