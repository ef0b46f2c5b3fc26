"""ONNX model -> tile-IR module: the graph walk.

The order of work, each step relying on the one before:

1. refuse what cannot be static: foreign op domains, graph inputs with symbolic dimensions
   (unless `--shape NAME=d0,d1,...` overrides them); inputs fixed by `--value` become
   constants;
2. run ONNX shape inference (strict, data propagation on) so every tensor has a static shape;
3. fold constants: initializers, Constant, ConstantOfShape, Shape/Size of static tensors and any
   node whose inputs are all constants; an If whose condition folded becomes its branch.
   Folding can reveal shapes (a Reshape whose target is computed), so inference and folding
   repeat until nothing changes; then every node left must have a converter (all that do
   not are named in one error);
4. name every ONNX tensor once, in graph order (`tilekit.onnx.names`), before any converter
   runs, so that a name never depends on how an earlier op was decomposed;
5. convert the remaining nodes in graph order through the converter registry
   (`tilekit.onnx.converters`); converters emit one statement per op;
6. make graph outputs real tensors (a copy where an output is an alias, a constant or an input),
   drop ops whose results nothing reads, and keep only the constants that some op reads as
   weights.

The result is a `Module` with one singleton kernel per op and the `import` stage recorded, plus
the weights as arrays; `tilekit.onnx.attach_files` writes the weights sidecar and records
the files in the module. Steps 1-3 live in `tilekit.onnx.fold` (`ShapeFolding`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tilekit import limits
from tilekit.errors import ExprError, TilekitError, UnsupportedError, excerpt
from tilekit.ir.graph import op_tensors
from tilekit.ir.model import Module, Op, Tensor, default_kernels
from tilekit.onnx import fold, text
from tilekit.onnx.dtypes import ONNX_DTYPES, elem_type_name
from tilekit.onnx.fold import ShapeFolding, type_of
from tilekit.onnx.context import NodeContext, Value
from tilekit.onnx.names import NameTable, node_where, sanitize

#: A formal parameter taking any number of inputs (a Loop's carried values, Concat's inputs).
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic

_NUMPY_TO_IR = {"float32": "float32", "float16": "float16", "float64": "float64",
                "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
                "uint8": "uint8", "bool": "bool", "bfloat16": "bfloat16"}

_STANDARD_DOMAINS = ("", "ai.onnx")
#: Opsets the converters are written and tested against; newer ones import with a warning.
TESTED_OPSETS = (6, 21)
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
                 shapes: Mapping[str, Sequence[int]] | None = None,
                 lenient: bool = False, max_trips: int | None = None,
                 values: Mapping[str, Sequence[float]] | None = None,
                 random_weights: int | None = None,
                 dims: Mapping[str, Any] | None = None) -> Imported:
    """Convert an ONNX model to a tile-IR module. `shapes` overrides graph-input shapes
    (keyed by ONNX name or by its sanitised form). A model that ONNX's strict shape
    inference refuses is bad input, unless `lenient` (then lenient inference, a warning).
    `max_trips` bounds the scan outputs of loops whose trip count is known at run time only
    (docs/grind.md). `values` fixes graph inputs to constants (`--value NAME=V0,V1,...`:
    the input is no longer an input, its value folds). `random_weights` replaces the weights
    with seeded random values first (`tilekit.onnx.random_weights`).

    An input dimension that the model leaves open (a `dim_param`, or unknown) and `shapes`
    does not fix becomes a symbol of the module's `dims` (`tilekit.onnx.symbolic`); `dims`
    maps a symbol to its `--dim` (`symbolic.DimFlag`: a range, or one size)."""
    from tilekit.onnx.standard import standard_form
    from tilekit.onnx.symbolic import import_symbolic

    model = standard_form(model)
    if random_weights is not None:
        from tilekit.onnx.random_weights import randomize

        model = randomize(model, random_weights)

    def one(shapes: Mapping[str, Sequence[int]], unfoldable: frozenset[str] = frozenset(),
            fold_only: bool = False) -> Any:
        importer = Importer(model, name, shapes, lenient, max_trips=max_trips,
                            values=values or {})
        importer.unfoldable = unfoldable
        return importer.fold() if fold_only else importer.run()

    return import_symbolic(one, model, shapes or {}, values or {}, dims or {})


def _opset_of(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in _STANDARD_DOMAINS:
            if entry.version < 1:
                raise UnsupportedError(f"the model imports opset {entry.version} of the "
                                       "standard ONNX operator set, which has none below 1",
                                       "opset_import", "re-export the model with a standard "
                                       f"opset ({TESTED_OPSETS[0]}..{TESTED_OPSETS[1]})")
            return int(entry.version)
    if not model.opset_import and model.ir_version:
        return 1
    raise UnsupportedError("the model imports no version of the standard ONNX operator set",
                           "opset_import", "re-export the model with a standard opset")


@functools.lru_cache(maxsize=None)
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The standard operator set's schema of `op_type` at `opset` (domain '' or 'ai.onnx':
    the only ones imported), or None where it has no such op."""
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


class Importer(ShapeFolding):
    """One import: mutable while it runs, producing an immutable `Imported`."""

    def __init__(self, model: onnx.ModelProto, name: str, shapes: Mapping[str, Sequence[int]],
                 lenient: bool = False, max_trips: int | None = None,
                 values: Mapping[str, Sequence[float]] | None = None):
        self.model = model
        self.fixed_values = dict(values or {})
        self.max_trips = max_trips
        #: Control records (tilekit.ir.control) of the control ops converted, by op name.
        self.control: dict[str, Any] = {}
        #: Static shapes fixed for control-op outputs that ONNX inference leaves open (a
        #: Loop's scan outputs), fed back to later rounds of inference.
        self.control_shapes: dict[str, tuple[tuple[int, ...], int]] = {}
        self.lenient = lenient
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
        #: ONNX values never folded into weights (tilekit.onnx.symbolic: sized by a symbol).
        self.unfoldable: frozenset[str] = frozenset()
        self._folded_bytes = 0
        #: Why ONNX's strict shape inference refused the model (None: it did not), for the
        #: message when a node cannot be converted.
        self.strict_failure: str | None = None
        self.absorbed: set[int] = set()
        self.warnings: list[str] = []
        self.graph_outputs = [o.name for o in self.graph.output]
        init_names = {t.name for t in self.graph.initializer}
        self.input_names = [i.name for i in self.graph.input if i.name not in init_names]
        self.consumers: dict[str, list[int]] = {}
        #: Every tensor some node or the graph output list reads (an unread optional output,
        #: like a Dropout mask, may have no inferred shape and needs none).
        self._read_anywhere = {n for node in self.nodes for n in node_reads(node)} | set(
            self.graph_outputs)

    # -- the steps -----------------------------------------------------------------------
    def run(self) -> Imported:
        self.fold()
        self._check_convertible()
        self._claim_names()
        self._convert()
        self._finish_outputs()
        return self._build()

    def fold(self) -> "Importer":
        """Steps 1-3: static inputs, shape inference, folding (`consts`, `folded`)."""
        self._check_names()
        self._check_nodes()
        if self.opset > TESTED_OPSETS[1]:
            self.warnings.append(f"the model uses opset {self.opset}; the converters are "
                                 f"tested with opsets {TESTED_OPSETS[0]}..{TESTED_OPSETS[1]}")
        for init in self.graph.initializer:
            self.consts[init.name] = self._initializer(init)
        self._fix_values()
        model = self._static_inputs()
        self._infer(self._partially_folded(model))
        self._check_types()
        self._fold_until_static(model)
        return self

    def _check_names(self) -> None:
        """Every ONNX tensor name is defined once: graph inputs, initializers (which may
        give a graph input its default) and node outputs. A duplicate makes the graph
        ambiguous, whichever definition a converter would pick."""
        defined: dict[str, str] = {}

        def define(name: str, what: str) -> None:
            if name in defined:
                raise UnsupportedError(f"tensor name '{excerpt(name, quote=False)}' is "
                                       f"defined twice ({defined[name]}, {what})", "graph",
                                       "each tensor of an ONNX graph has one producer; "
                                       "check the model with onnx.checker")
            defined[name] = what

        for i, vi in enumerate(self.graph.input):
            define(vi.name, f"graph input {i}")
        inputs = set(defined)
        for i, init in enumerate(self.graph.initializer):
            if init.name in inputs:  # the default value of that graph input
                inputs.discard(init.name)
                continue
            define(init.name, f"initializer {i}")
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    define(name, f"output of node {index} ({excerpt(node.op_type, quote=False)})")
        self._check_declared_sizes()

    def _check_declared_sizes(self) -> None:
        """Before ONNX's shape inference sees the model (it allocates from declared shapes:
        an Expand whose shape input is declared with 2^40 elements makes it build a shape of
        rank 2^40): every declared shape and initializer within the tensor budget and rank,
        and every input that gives an output's rank (a shape input) at most `MAX_RANK` long."""
        declared: dict[str, tuple[int, ...]] = {}
        for vi in list(self.graph.input) + list(self.graph.output) + list(self.graph.value_info):
            typ = fold.type_of(vi)
            if typ is not None and typ[0] is not None:
                dims = tuple(d for d in typ[0] if d is not None)
                limits.elements(dims, f"tensor '{excerpt(vi.name, quote=False)}'")
                declared[vi.name] = typ[0]
        for init in self.graph.initializer:
            limits.elements(tuple(init.dims), f"initializer '{excerpt(init.name, quote=False)}'")
            declared[init.name] = tuple(init.dims)
        for index, node in enumerate(self.nodes):
            for position in _SHAPE_INPUTS.get(node.op_type, ()):
                name = node.input[position] if position < len(node.input) else ""
                dims = declared.get(name)
                if dims and dims[0] is not None and dims[0] > limits.MAX_RANK:
                    raise limits.LimitError(
                        f"input {position} of {node.op_type} gives a rank of {dims[0]:,}, more "
                        f"than {limits.MAX_RANK}", node_where(index, node),
                        "tilekit handles tensors of rank 64 or less")

    def _check_nodes(self) -> None:
        """Refuse early what no amount of folding can make convertible: foreign domains and
        op types without a converter that never fold (sequences, control flow, strings)."""
        from tilekit.onnx.converters import lookup

        foreign = [i for i, node in enumerate(self.nodes)
                   if node.domain not in _STANDARD_DOMAINS]
        if foreign:
            index, node = foreign[0], self.nodes[foreign[0]]
            counts: dict[str, int] = {}
            for i in foreign:
                key = f"{self.nodes[i].domain}::{self.nodes[i].op_type}"
                counts[key] = counts.get(key, 0) + 1
            what = f"op {node.domain}::{node.op_type} is from a non-standard domain"
            if len(foreign) > 1:
                what += (f" ({len(foreign)} such nodes: " +
                         ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) + ")")
            raise UnsupportedError(
                what, node_where(index, node),
                "only the standard ONNX operator set (domain '' / ai.onnx) is imported")
        never = [i for i, node in enumerate(self.nodes)
                 if node.op_type in fold.NOT_FOLDABLE and lookup(node.op_type) is None]
        if never:
            raise self._unsupported_op(never[0], self.nodes[never[0]], never)
        for index, node in enumerate(self.nodes):
            self._check_arity(index, node)

    def _check_arity(self, index: int, node: onnx.NodeProto) -> None:
        """The node's inputs and outputs are as many as its op's schema allows at the model's
        opset (a Relu given two inputs imported as a Relu of the first: lenient shape
        inference only warns about it)."""
        schema = _schema(node.op_type, self.opset)
        if schema is None:
            return                      # no such op at this opset: the converters say so
        for what, count, low, high in (("inputs", len(node.input), schema.min_input,
                                        schema.max_input),
                                       ("outputs", len(node.output), schema.min_output,
                                        schema.max_output)):
            if not low <= count <= high:
                allowed = f"{low}" if low == high else f"{low} to {high}"
                raise UnsupportedError(
                    f"{node.op_type} (opset {self.opset}) has {count} {what}; its schema "
                    f"allows {allowed}", node_where(index, node),
                    "fix the node, or re-export the model")

    def _check_types(self) -> None:
        """Every node's input element types are among those its schema's type constraints
        allow, and inputs bound to one type parameter share one type (a Cos of int64 or an
        Add of float and int64: onnxruntime refuses both; ONNX's strict inference says so,
        but a model failing it is otherwise imported by lenient inference)."""
        for index, node in enumerate(self.nodes):
            schema = _schema(node.op_type, self.opset)
            if schema is None or not schema.inputs:
                continue                # no such op at this opset: the converters say so
            allowed = {c.type_param_str: set(c.allowed_type_strs)
                       for c in schema.type_constraints}
            bound: dict[str, tuple[str, int]] = {}
            for position, name in enumerate(node.input):
                elem = self._elem_type(name) if name else None
                if elem is None or elem not in onnx.TensorProto.DataType.values():
                    continue
                formal = schema.inputs[min(position, len(schema.inputs) - 1)]
                param = formal.type_str
                typ = f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
                legal = allowed.get(param, {param})
                if typ not in legal:
                    shown = sorted(t[7:-1] for t in legal if t.startswith("tensor("))
                    raise UnsupportedError(
                        f"{node.op_type} (opset {self.opset}) input {position} "
                        f"'{excerpt(name, 40, quote=False)}' is {typ[7:-1]}; its schema "
                        f"allows {', '.join(shown) or 'no tensor'}",
                        node_where(index, node), "cast the input (a Cast node), or "
                        "re-export the model")
                heterogeneous = formal.option == _VARIADIC and not formal.is_homogeneous
                first = (bound.setdefault(param, (typ, position))
                         if param in allowed and not heterogeneous else None)
                if first is not None and first[0] != typ:
                    raise UnsupportedError(
                        f"{node.op_type} (opset {self.opset}) inputs {first[1]} and "
                        f"{position} share type {param} but are {first[0][7:-1]} and "
                        f"{typ[7:-1]}", node_where(index, node),
                        "cast one of them (a Cast node), or re-export the model")

    def _elem_type(self, name: str) -> int | None:
        """The ONNX element type of tensor `name` as inference or a constant gives it."""
        typ = self.types.get(name)
        if typ is not None and typ[1]:
            return typ[1]
        if name in self.consts:
            try:
                return helper.np_dtype_to_tensor_dtype(self.consts[name].dtype)
            except (KeyError, TypeError, ValueError):
                return None
        return None

    def _unsupported_op(self, index: int, node: onnx.NodeProto,
                        others: Sequence[int] = ()) -> UnsupportedError:
        """The error for node `index`, whose op type has no converter; `others` are the
        indices of every node that cannot be converted (all named, with counts)."""
        from tilekit.onnx.converters import supported_op_types

        if node.op_type in ("Shape", "Size"):
            return self._dynamic_shape_op(index, node)
        known = supported_op_types()
        counts: dict[str, int] = {}
        for i in others or [index]:
            counts[self.nodes[i].op_type] = counts.get(self.nodes[i].op_type, 0) + 1
        if len(counts) == 1 and counts.get(node.op_type) == 1:
            what = f"op type '{node.op_type}' (opset {self.opset}) is not supported"
        else:
            listed = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
            what = (f"{sum(counts.values())} nodes of {len(counts)} op types are not "
                    f"supported (opset {self.opset}): {listed}; the first is "
                    f"'{node.op_type}'")
        return UnsupportedError(
            what, node_where(index, node),
            f"supported op types ({len(known)}): {_trimmed(known)}")

    def _dynamic_shape_op(self, index: int, node: onnx.NodeProto) -> UnsupportedError:
        """A Shape or Size that did not fold: its input's shape is not known at import."""
        name = node.input[0] if node.input else ""
        typ = self.types.get(name)
        shown = "unknown rank" if typ is None or typ[0] is None else \
            "[" + ", ".join("?" if d is None else str(d) for d in typ[0]) + "]"
        return UnsupportedError(
            f"{node.op_type} of '{excerpt(name, quote=False)}' cannot be computed at import: "
            f"that tensor has a dynamic dimension ({shown})",
            node_where(index, node),
            self._dynamic_hint(name))

    def _dynamic_hint(self, *names: str) -> str:
        """How to make `names` static: the graph inputs whose values they depend on (fix
        them with --value), else give inputs static shapes."""
        found = {s for name in names for s in self.value_inputs(name)}
        sources = [n for n in self.input_names if n in found]
        if sources:
            listed = ", ".join(f"'{s}'" for s in sources[:4])
            return (f"it depends on the value of graph input {listed}: fix it at import with "
                    f"--value {sources[0]}=V (or give every input a static shape with --shape)")
        return "give every graph input a static shape with --shape NAME=d0,d1,..."

    def value_inputs(self, name: str) -> list[str]:
        """The graph inputs whose *values* (not only shapes) tensor `name` depends on, in
        graph order: walks producers back, stopping at Shape and Size (those read shapes)."""
        producer = {o: n for n in self.nodes for o in n.output if o}
        found: set[str] = set()
        seen: set[str] = set()
        stack = [name]
        while stack:
            current = stack.pop()
            if current in seen or current in self.consts:
                continue
            seen.add(current)
            if current in self.input_names:
                found.add(current)
                continue
            node = producer.get(current)
            if node is None or node.op_type in ("Shape", "Size"):
                continue
            stack.extend(node_reads(node))
        return [n for n in self.input_names if n in found]

    def _check_convertible(self) -> None:
        """After folding: every node left has a converter; otherwise one error that names
        every op type that has none, with counts."""
        from tilekit.onnx.converters import lookup

        left = [i for i, node in enumerate(self.nodes)
                if i not in self.folded and lookup(node.op_type) is None]
        if left:
            raise self._unsupported_op(left[0], self.nodes[left[0]], left)

    def _fix_values(self) -> None:
        """`--value NAME=V0,V1,...`: each named graph input becomes a constant of its
        declared element type and shape (a dimension the model leaves open takes the count
        of values), so what depends on it folds (an If on a sample rate)."""
        if not self.fixed_values:
            return
        by_sanitized = {sanitize(n): n for n in self.input_names}
        declared = {vi.name: vi for vi in self.graph.input}
        overrides = set(self.shape_overrides) | {by_sanitized.get(k, k)
                                                 for k in self.shape_overrides}
        for key, raw in self.fixed_values.items():
            name = key if key in self.input_names else by_sanitized.get(key)
            where = f"--value {excerpt(key, quote=False)}"
            if name is None:
                raise TilekitError(f"--value names '{excerpt(key, quote=False)}', which is not "
                                   "a graph input", where,
                                   f"graph inputs: {', '.join(self.input_names[:8])}")
            if name in overrides or key in overrides:
                raise TilekitError(f"'{name}' is given both --value and --shape", where,
                                   "a fixed value has its own shape: drop the --shape")
            typ = type_of(declared[name])
            if typ is None or typ[1] not in ONNX_DTYPES:
                raise TilekitError(f"graph input '{name}' is not a tensor of a supported type",
                                   where, "only numeric tensor inputs can be fixed")
            dims, elem = typ
            self.consts[name] = fixed_array(raw, dims, ONNX_DTYPES[elem], name, where)
            self.input_names.remove(name)

    def _initializer(self, init: onnx.TensorProto) -> np.ndarray:
        if init.data_type not in ONNX_DTYPES:
            raise UnsupportedError(
                f"initializer '{excerpt(init.name, quote=False)}' has element type "
                f"{elem_type_name(init.data_type)}", "graph.initializer",
                f"supported element types: {', '.join(sorted(set(ONNX_DTYPES.values())))}")
        try:
            return numpy_helper.to_array(init)
        except Exception as exc:  # external data missing, malformed raw data
            raise TilekitError(f"cannot read initializer '{init.name}': {exc}",
                               "graph.initializer",
                               "keep external data files next to the model") from None

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
            for name in node_reads(node):
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
            where = node_where(index, node)
            try:
                entry.convert(ctx)
            except ExprError as exc:   # a statement the node's attributes made unreadable
                raise self._malformed(where, f"converts to an invalid statement "
                                             f"({exc.what})") from None
            except TilekitError:
                raise
            except Exception as exc:  # noqa: BLE001 - a malformed node (or a converter bug)
                raise self._malformed(where, f"cannot convert the node ({type(exc).__name__}: "
                                             f"{excerpt(str(exc), 80, quote=False)})") from None
            ctx.check_attrs(entry.ignore)

    def _malformed(self, where: str, what: str) -> UnsupportedError:
        """A node that converts to nothing valid: its attributes or types contradict each
        other (ONNX's own checks miss some, e.g. `keepdims: 2**40` with a declared shape)."""
        if self.strict_failure is not None:
            hint = (f"the model fails ONNX's strict shape inference ({self.strict_failure}); "
                    "check it with onnx.checker")
        else:
            hint = ("check the node's attributes and shapes; if the model is valid, this is a "
                    "tilekit bug: please report it (--debug shows the traceback)")
        return UnsupportedError(what, where, hint)

    def _verify_built(self, module: Module) -> None:
        """Check the module before it leaves the importer; what fails is reported as bad
        input at the node the op came from (see `_malformed`)."""
        from tilekit.ir.verify import verify

        placeholder = {"file": "weights.npz", "sha256": "0" * 64}  # attach_files sets it
        try:
            verify(replace(module, weights=placeholder) if self.weights else module)
        except TilekitError as exc:
            where = exc.where or ""
            found = re.match(r"ops\[(\d+)\]", where)
            if found and int(found.group(1)) < len(module.ops):
                origin = module.ops[int(found.group(1))].origin or "?"
                where = f"node '{excerpt(origin, 60, quote=False)}' ({where})"
            if isinstance(exc, limits.LimitError):
                raise limits.LimitError(exc.what, where, exc.hint) from None
            raise self._malformed(where, f"converts to an invalid op: {exc.what}") from None

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
            what = (f"tensor '{excerpt(onnx_name, quote=False)}' has element type "
                    f"{elem_type_name(elem) if elem else 'unknown'}")
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
            _check_shape(value)
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
            _check_shape(value)
            self.tensors[value.name] = Tensor(tuple(value.shape), value.dtype)

    def _op_name(self, ctx: NodeContext, step: str | None) -> str:
        base = sanitize(ctx.origin)
        return self.op_names.fresh(base if step is None else f"{base}_{step}")

    def add_expr_op(self, ctx: NodeContext, out: Value, stmt: str, *, pad: str | None,
                    extents: Mapping[str, int] | None, step: str | None) -> None:
        self._declare(out)
        self.ops.append(Op(name=self._op_name(ctx, step), expr=stmt, pad=pad,
                           axes=dict(extents or {}), origin=ctx.origin))

    def add_control_op(self, ctx: NodeContext, record, outputs: Sequence[Value]) -> None:
        """Emit a control op (loop, if, scan) whose record is `record` (a ControlOp)."""
        from dataclasses import replace as _replace

        for v in outputs:
            self._declare(v)
        name = self._op_name(ctx, None)
        self.control[name] = _replace(record, name=name).record()
        self.ops.append(Op(name=name, kind="control", origin=ctx.origin))

    # -- control flow: shapes that ONNX inference leaves open ---------------------------
    def _inline_constant_ifs(self) -> bool:
        """Replace every `If` whose condition folded to a constant by the branch it takes
        (its nodes spliced into the graph, its outputs copied to the If's by Identity
        nodes), so shape tests and fixed input values (`--value`) select a branch at
        import. Returns whether any If was inlined."""
        from tilekit.onnx.subgraph import inline_branch

        taken = None
        new_nodes: list[onnx.NodeProto] = []
        new_index: dict[int, int] = {}
        for index, node in enumerate(self.nodes):
            cond = node.input[0] if node.op_type == "If" and node.input else ""
            if index not in self.folded and cond in self.consts \
                    and np.asarray(self.consts[cond]).size == 1:
                if taken is None:
                    taken = self._defined_names()
                branch = "then_branch" if bool(np.asarray(self.consts[cond]).reshape(-1)[0]) \
                    else "else_branch"
                graph = next(a.g for a in node.attribute if a.name == branch)
                nodes, consts = inline_branch(graph, node, taken)
                self.consts.update(consts)
                new_nodes.extend(nodes)
                continue
            new_index[index] = len(new_nodes)
            new_nodes.append(node)
        if taken is None:
            return False
        self.folded = {new_index[i] for i in self.folded if i in new_index}
        self.nodes = new_nodes
        self._read_anywhere = {n for node in self.nodes for n in node_reads(node)} | set(
            self.graph_outputs)
        return True

    def _defined_names(self) -> set[str]:
        """Every name the main graph defines (inputs, initializers, node outputs, constants)."""
        names = {vi.name for vi in self.graph.input} | {t.name for t in self.graph.initializer}
        return names | {o for n in self.nodes for o in n.output if o} | set(self.consts)

    def _fold(self) -> None:
        super()._fold()
        from tilekit.onnx.subgraph import fix_control_shapes

        fix_control_shapes(self)

    def import_body(self, graph: onnx.GraphProto, params, label: str, where: str):
        """A subgraph (Loop/Scan body, If branch) as a region: `params` are its inputs'
        (ONNX name, static shape, IR dtype); see tilekit.onnx.subgraph."""
        from tilekit.onnx.subgraph import import_body

        return import_body(self, graph, params, label, where)

    def _partially_folded(self, model: onnx.ModelProto) -> onnx.ModelProto:
        out = super()._partially_folded(model)
        if self.control_shapes:
            kept = [vi for vi in out.graph.value_info if vi.name not in self.control_shapes]
            del out.graph.value_info[:]
            out.graph.value_info.extend(kept)
            for name, (shape, elem) in sorted(self.control_shapes.items()):
                out.graph.value_info.append(helper.make_tensor_value_info(name, elem,
                                                                          list(shape)))
        return out

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
        ops = _live_ops(self.ops, set(self.output_names), self.control)
        read: set[str] = set()
        written: set[str] = set()
        for op in ops:
            r, w = op_tensors(op, self.control)
            read.update(r)
            written.update(w)
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
        control = {op.name: self.control[op.name] for op in ops if op.kind == "control"}
        module = Module(model=self.model_name, tensors=tensors, ops=ops, inputs=tuple(inputs),
                        outputs=tuple(self.output_names), kernels=default_kernels(ops),
                        source=source or None, control=control or None)
        self._verify_built(module)
        return Imported(module, weights, tuple(self.warnings))


def fixed_array(raw: Sequence[float], dims, dtype: str, name: str, where: str) -> np.ndarray:
    """The values of `--value NAME=...` as an array of the input's declared dtype and shape:
    one value per element, or one value for every element of a static shape; one open
    dimension takes its size from the count of values (more are refused)."""
    from tilekit.expr.ops import numpy_dtype

    values = np.asarray(list(raw), dtype=np.float64)
    np_dtype = numpy_dtype(dtype)
    if np_dtype.kind in "iub" and not np.all(values == np.round(values)):
        raise TilekitError(f"'{name}' holds {dtype}, and the values are not all whole "
                           "numbers", where, f"give whole numbers, e.g. {where}=16000")
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise TilekitError(f"a value is out of the range of {dtype}", where,
                               f"give values in [{info.min}, {info.max}]")
    if dims is None:
        shape: tuple[int, ...] = (values.size,) if values.size != 1 else ()
    else:
        open_dims = [d for d, n in enumerate(dims) if n is None or n <= 0]
        known = int(np.prod([n for n in dims if n is not None and n > 0], dtype=np.int64))
        if len(open_dims) > 1:
            raise TilekitError(f"'{name}' has {len(open_dims)} open dimensions; a value fixes "
                               "at most one", where, "give the input a static shape in the "
                               "model, or fix another input")
        if open_dims and known and values.size % known == 0:
            full = list(dims)
            full[open_dims[0]] = values.size // known
            shape = tuple(int(d) for d in full)
        elif not open_dims and values.size == known:
            shape = tuple(int(d) for d in dims)
        elif not open_dims and values.size == 1:      # one value fills the declared shape
            shape = tuple(int(d) for d in dims)
            values = np.full(shape, values.reshape(-1)[0])
        else:
            shown = "[" + ", ".join("?" if n is None or n <= 0 else str(n) for n in dims) + "]"
            raise TilekitError(f"{values.size} values do not fill '{name}' of shape {shown}",
                               where, "give one value per element, comma-separated")
    with np.errstate(all="ignore"):
        return values.astype(np_dtype).reshape(shape)


#: Inputs whose length is the rank of an output (ONNX shape inference builds that shape).
_SHAPE_INPUTS = {"Expand": (1,), "Reshape": (1,), "ConstantOfShape": (0,), "Tile": (1,),
                 "Unsqueeze": (1,), "Resize": (3,)}


def _check_shape(value: Value) -> None:
    """A tensor of the module: static, non-empty and within `limits.TENSOR_ELEMENTS`."""
    if any(int(d) < 1 for d in value.shape):
        raise UnsupportedError(f"tensor '{value.name}' has shape {list(value.shape)}, with a "
                               "zero or negative dimension", "graph",
                               "tilekit needs non-empty static shapes")
    limits.elements(value.shape, f"tensor '{value.name}'")



def node_reads(node: onnx.NodeProto) -> list[str]:
    """What a node reads: its inputs and what its subgraphs capture (a Loop body reading an
    outer tensor reads it as much as an input does)."""
    names = [n for n in node.input if n]
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for a in node.attribute):
        from tilekit.onnx.subgraph import graph_free_names

        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sub in subs:
                names.extend(graph_free_names(sub))
    return list(dict.fromkeys(names))


def _live_ops(ops: list[Op], outputs: set[str], control=None) -> list[Op]:
    """Drop ops whose results no later op and no graph output reads (unused optional
    outputs, a Dropout mask nobody reads, a Split part nobody uses)."""
    needed = set(outputs)
    keep: list[Op] = []
    for op in reversed(ops):
        read, written = op_tensors(op, control)
        if needed.intersection(written):
            keep.append(op)
            needed.update(read)
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


def _trimmed(names: Sequence[str], limit: int = 24) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names) - limit} more)"
