"""A model in the one form the importer reads: what ONNX allows to be written several ways
is rewritten into the plain form before import, on a copy (the caller's model is untouched,
and `tk-run --check` still runs the file as it is).

- Model-local functions (`ModelProto.functions`, a node whose op type is a function of the
  model) are inlined (`onnx.inliner`): the importer then sees their standard-domain nodes.
- Sparse tensors (`graph.sparse_initializer`, a Constant's `sparse_value`) become dense
  initializers and `value` attributes; the dense size is checked against the tensor limit
  before any memory is taken.

A model needing none of these is returned as it is (no copy).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tilekit import limits
from tilekit.errors import TilekitError, excerpt


def standard_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with local functions inlined and sparse tensors dense (see the module doc)."""
    if model.functions:
        try:
            from onnx import inliner

            model = inliner.inline_local_functions(model)
        except Exception as exc:  # a malformed function body
            raise TilekitError(f"cannot inline the model's local functions: "
                               f"{excerpt(str(exc), 200, quote=False)}", "model.functions",
                               "check the model with onnx.checker") from None
    if not any(_has_sparse(g) for g in _graphs(model.graph)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for graph in _graphs(copy.graph):
        for sparse in graph.sparse_initializer:
            graph.initializer.append(dense(sparse, "graph.sparse_initializer"))
        del graph.sparse_initializer[:]
        for node in graph.node:
            for attr in node.attribute:
                if attr.name == "sparse_value" and node.op_type == "Constant":
                    value = dense(attr.sparse_tensor, f"node '{node.name or node.output[0]}'")
                    attr.Clear()
                    attr.CopyFrom(onnx.helper.make_attribute("value", value))
    return copy


def dense(sparse: onnx.SparseTensorProto, where: str) -> onnx.TensorProto:
    """The dense TensorProto of `sparse` (values at COO indices, zeros elsewhere)."""
    name = sparse.values.name
    dims = [int(d) for d in sparse.dims]
    try:
        if any(d < 0 for d in dims):
            raise ValueError(f"negative dimension in {dims}")
        limits.elements(dims, f"sparse tensor '{excerpt(name, quote=False)}'")
        values = numpy_helper.to_array(sparse.values).reshape(-1)
        indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
        size = int(np.prod(dims, dtype=np.int64))
        if indices.ndim == 2:       # [nnz, rank] coordinates
            if indices.shape[1] != len(dims) or np.any(indices < 0) or \
                    np.any(indices >= np.asarray(dims, dtype=np.int64)):
                raise ValueError("coordinates outside the dimensions")
            flat = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices
        else:                       # linear indices
            flat = indices.reshape(-1)
            if np.any(flat < 0) or np.any(flat >= size):
                raise ValueError("linear indices outside the tensor")
        if flat.reshape(-1).shape[0] != values.shape[0]:
            raise ValueError(f"{values.shape[0]} values for {flat.reshape(-1).shape[0]} indices")
        out = np.zeros(size, dtype=values.dtype)
        out[flat.reshape(-1)] = values
    except limits.LimitError:
        raise
    except Exception as exc:
        raise TilekitError(f"cannot read sparse tensor '{excerpt(name, quote=False)}': "
                           f"{excerpt(str(exc), 120, quote=False)}", where,
                           "check the model with onnx.checker") from None
    return numpy_helper.from_array(out.reshape(dims), name)


def _graphs(graph: onnx.GraphProto):
    """`graph` and every subgraph (If branches, Loop and Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _has_sparse(graph: onnx.GraphProto) -> bool:
    return bool(graph.sparse_initializer) or any(
        a.name == "sparse_value" for n in graph.node if n.op_type == "Constant"
        for a in n.attribute)
