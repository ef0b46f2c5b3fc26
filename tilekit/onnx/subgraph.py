"""ONNX subgraphs (the bodies of Loop, Scan and the branches of If) imported as IR regions.

A body is imported by a nested `Importer` on a model made from it, so every converter, the
shape inference and the folding apply inside a body exactly as outside:

- the body's own inputs become graph inputs with the static shapes the control op gives
  them (iteration number and condition scalars, carried values, scan slices);
- values it reads from enclosing scopes (captures, found recursively through nested bodies)
  become graph inputs too, or initializers when they are constants of the outer import (so
  they fold, or become weights);
- names come from a child of the outer name table: captures keep their outer IR names, a
  body's own tensors get names unique in the whole module, op names share the outer table.

The nested import's module becomes a `Region` (its inputs, outputs, tensors and ops; the
captures and weights stay outside): weights move up to the enclosing import, and captures
are read by name, as tilekit.ir.control describes.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.control import Region
from tilekit.ir.model import Tensor
from tilekit.onnx.dtypes import ONNX_DTYPES
from tilekit.onnx.fold import attributes, type_of

#: IR dtype -> ONNX element type.
ELEM_TYPES = {name: elem for elem, name in ONNX_DTYPES.items()}


def graph_free_names(graph: onnx.GraphProto) -> list[str]:
    """Names a graph reads that it does not define, nested subgraphs included."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for node in graph.node for o in node.output if o}
    used: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                used.setdefault(name, None)
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                for name in graph_free_names(sub):
                    if name not in defined:
                        used.setdefault(name, None)
    return list(used)


class Param(NamedTuple):
    """A body input: its ONNX name, and the static shape and IR dtype it takes."""

    onnx_name: str
    shape: tuple[int, ...]
    dtype: str


def body_model(parent, graph: onnx.GraphProto, params: Sequence[Param], label: str,
               resolve) -> onnx.ModelProto:
    """`graph` as a model of its own: its inputs with the params' static types, captures as
    inputs (or initializers, for constants). `resolve(onnx name)` gives a capture's
    (shape, IR dtype, constant or None); a capture it cannot resolve raises."""
    inputs, inits = [], list(graph.initializer)
    for p, declared in zip(params, graph.input):
        inputs.append(helper.make_tensor_value_info(declared.name, ELEM_TYPES[p.dtype],
                                                    list(p.shape)))
    for name in graph_free_names(graph):
        shape, dtype, const = resolve(name)
        if const is not None:
            inits.append(numpy_helper.from_array(np.asarray(const), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, ELEM_TYPES[dtype], list(shape)))
    outputs = [helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
               for o in graph.output]
    body = helper.make_graph(list(graph.node), graph.name or label, inputs, outputs, inits)
    model = helper.make_model(body, opset_imports=list(parent.model.opset_import))
    model.ir_version = parent.model.ir_version or 8
    return model


def body_output_types(parent, graph: onnx.GraphProto, params: Sequence[Param]
                      ) -> list[tuple[tuple[int | None, ...] | None, int] | None]:
    """The body's output types by ONNX shape inference alone (no conversion), with captures
    resolved from the enclosing import's inferred types; None where inference cannot tell."""
    def resolve(name):
        shape, elem = parent._static_shape(name), _elem(parent, name)
        if shape is None or elem not in ONNX_DTYPES:
            raise LookupError(name)
        return shape, ONNX_DTYPES[elem], parent.consts.get(name)

    try:
        model = body_model(parent, graph, params, "body", resolve)
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - not known yet (a later round), or never: conversion says
        return [None] * len(graph.output)
    return [type_of(o) for o in inferred.graph.output]


def import_body(parent, graph: onnx.GraphProto, params: Sequence[Param], label: str,
                where: str) -> Region:
    """Import `graph` (a body of the node at `where`) as a region of `parent`'s import."""
    params = [Param(*p) for p in params]
    if len(graph.input) != len(params):
        raise UnsupportedError(f"the {label} has {len(graph.input)} inputs, the op gives it "
                               f"{len(params)}", where, "check the model with onnx.checker")
    outer = {name: parent.value(name) for name in graph_free_names(graph)}
    model = body_model(parent, graph, params, label,
                       lambda n: (outer[n].shape, outer[n].dtype, outer[n].const))
    sub = type(parent)(model, label, {}, parent.lenient, max_trips=parent.max_trips)
    sub.names = parent.names.child({n: v.name for n, v in outer.items()})
    sub.op_names = parent.op_names
    try:
        imported = sub.run()
    except TilekitError as exc:
        raise type(exc)(exc.what, f"{where}: {label}: {exc.where}" if exc.where
                        else f"{where}: {label}", exc.hint) from None
    for warning in imported.warnings:
        parent.warnings.append(f"{where}: {label}: {warning}")
    module = imported.module
    for name, array in imported.weights.items():
        parent.weights.setdefault(name, array)
        t = module.tensors[name]
        parent.tensors.setdefault(name, Tensor(t.shape, t.dtype, "weight"))
    outer_names = {v.name for v in outer.values()}
    own = {n: t for n, t in module.tensors.items()
           if t.role != "weight" and n not in outer_names}
    region_inputs = tuple(module.inputs[:len(params)])
    return Region(inputs=region_inputs, outputs=tuple(module.outputs), tensors=own,
                  ops=module.ops, control=module.control)


def fix_control_shapes(imp) -> None:
    """Static shapes for Loop outputs that ONNX inference leaves open: carried outputs take
    their initial values' shapes (a body that changes them is refused at conversion, with
    the reason), scan outputs get `max_trips` rows. Fed back to inference by the importer."""
    for index, node in enumerate(imp.nodes):
        if node.op_type != "Loop" or index in imp.folded:
            continue
        inputs = list(node.input)
        n = len(inputs) - 2
        for i, out in enumerate(node.output[:n]):
            shape = imp._static_shape(inputs[2 + i]) if inputs[2 + i] else None
            elem = _elem(imp, inputs[2 + i])
            if out and shape is not None and elem is not None:
                _fix(imp, out, shape, elem)
        trip = imp.consts.get(inputs[0]) if inputs and inputs[0] else None
        bound = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else imp.max_trips
        scans = [(j, out) for j, out in enumerate(node.output[n:]) if out]
        if scans and bound is None:
            raise UnsupportedError(
                "the loop has scan outputs and its trip count is known only at run time",
                f"node {index} '{node.name or f'Loop_{index}'}'",
                "give a bound with tk-import --max-trips N")
        if bound is None or bound < 1 or all(out in imp.control_shapes for _, out in scans):
            continue
        body_types = None
        for j, out in scans:
            typ = imp.types.get(out)
            rest = typ[0][1:] if typ is not None and typ[0] is not None else None
            if rest is None or None in rest:
                body_types = body_types or _body_types(imp, node, n)
                found = body_types[1 + n + j] if body_types else None
                if found is None or found[0] is None or None in found[0]:
                    continue
                rest, typ = found[0], found
            _fix(imp, out, (bound, *rest), typ[1])


def _body_types(imp, node, n: int):
    """A Loop body's output types by inference, once its carried inputs' shapes are known."""
    body = attributes(node)["body"]
    params = [Param(body.input[0].name, (), "int64"), Param(body.input[1].name, (), "bool")]
    for g, name in zip(body.input[2:], list(node.input)[2:]):
        shape, elem = imp._static_shape(name), _elem(imp, name)
        if shape is None or elem not in ONNX_DTYPES:
            return None
        params.append(Param(g.name, shape, ONNX_DTYPES[elem]))
    return body_output_types(imp, body, params)


def _elem(imp, name: str) -> int | None:
    """The ONNX element type of `name` in the import: inferred, or its constant's."""
    typ = imp.types.get(name)
    if typ is not None:
        return typ[1]
    const = imp.consts.get(name)
    if const is None:
        return None
    return ELEM_TYPES.get(imp.ir_dtype(const.dtype, name))


def _fix(imp, name: str, shape, elem: int) -> None:
    shape = tuple(int(d) for d in shape)
    imp.types[name] = (shape, elem)
    imp.control_shapes[name] = (shape, elem)




def inline_branch(graph: onnx.GraphProto, node: onnx.NodeProto, taken: set[str]
                  ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """The nodes that replace `If` node `node` whose condition is known: the branch `graph`'s
    nodes, then one Identity per If output copying the branch's output to it. Names the
    branch defines that are already `taken` in the enclosing graph are renamed (in nested
    bodies too); `taken` gains every name defined here. Returns (nodes, the branch's
    initializers as constants by their new names)."""
    local = [o for n in graph.node for o in n.output if o] + [t.name for t in graph.initializer]
    renamed: dict[str, str] = {}
    for name in local:
        new = name
        k = 0
        while new in taken:
            k += 1
            new = f"{name}__{k}"
        renamed[name] = new
        taken.add(new)
    consts = {renamed[t.name]: numpy_helper.to_array(t) for t in graph.initializer}
    nodes = []
    for inner in graph.node:
        clone = onnx.NodeProto()
        clone.CopyFrom(inner)
        _rename_io(clone, renamed)
        nodes.append(clone)
    label = node.name or "If"
    for i, (out, branch_out) in enumerate(zip(node.output, graph.output)):
        if out:
            nodes.append(helper.make_node("Identity", [renamed.get(branch_out.name,
                                                                   branch_out.name)],
                                          [out], name=f"{label}_out{i}"))
    return nodes, consts


def _rename_io(node: onnx.NodeProto, renamed: dict[str, str]) -> None:
    """Rename `node`'s inputs and outputs by `renamed`, and the names its subgraphs read
    from outside themselves (a name a subgraph defines itself shadows the outer one)."""
    if not renamed:
        return
    for i, name in enumerate(node.input):
        node.input[i] = renamed.get(name, name)
    for i, name in enumerate(node.output):
        node.output[i] = renamed.get(name, name)
    for attr in node.attribute:
        subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in subs:
            own = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            own |= {o for n in sub.node for o in n.output if o}
            inner = {k: v for k, v in renamed.items() if k not in own}
            for n in sub.node:
                _rename_io(n, inner)
            for out in sub.output:
                if out.name in inner:
                    out.name = inner[out.name]
