"""Test support: import an ONNX model, run it on the CPU executor, compare with onnxruntime."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from pathlib import Path

from onnx import helper, numpy_helper

from tilekit.ir.verify import verify
from tilekit.onnx import Imported, import_model

#: ONNX element type -> NumPy dtype, for random inputs.
_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
       onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
       onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.FLOAT16: np.float16,
       onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for the graph inputs that have no initializer, keyed by ONNX name."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dtype = _NP[tt.elem_type]
        if dtype == np.bool_:
            feeds[vi.name] = rng.random(shape) > 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[vi.name] = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def run_imported(imported: Imported, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run an import on the CPU executor with inputs keyed by ONNX name; outputs in order."""
    from tilekit.runtime.cpu import run_module

    module = imported.module
    renamed = dict((module.source or {}).get("inputs") or {})
    inputs = {ir: feeds[renamed.get(ir, ir)] for ir in module.inputs}
    got = run_module(module, inputs, dict(imported.weights))
    return [got[name] for name in module.outputs]


def onnxruntime_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list:
    return onnxruntime_runs(model, [feeds])[0]


def onnxruntime_runs(model: onnx.ModelProto, runs: list[Mapping[str, np.ndarray]]) -> list:
    """onnxruntime's outputs for each of `runs` (feeds), from one session of `model`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return [session.run(None, {k: v for k, v in feeds.items() if k in names})
            for feeds in runs]


def reference_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list:
    """The ONNX reference evaluator's outputs (for what onnxruntime does not implement)."""
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, dict(feeds)))


def check_against_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None
                              = None, rtol: float = 1e-4, atol: float = 1e-5,
                              seed: int = 0, reference: str = "onnxruntime") -> Imported:
    """Import `model`, verify the IR, run both and assert every output matches.

    `reference="onnx"` compares with the ONNX reference evaluator instead (for the few
    cases onnxruntime refuses, e.g. batch-first LSTM)."""
    onnx.checker.check_model(model)
    feeds = dict(feeds) if feeds is not None else random_inputs(model, seed)
    imported = import_model(model, name="test")
    from dataclasses import replace
    verify(replace(imported.module, weights={"file": "w.npz", "sha256": "0" * 64}
                   if imported.weights else None))
    got = run_imported(imported, feeds)
    expected = (onnxruntime_outputs(model, feeds) if reference == "onnxruntime"
                else reference_outputs(model, feeds))
    assert len(got) == len(expected)
    for name, g, e in zip(imported.module.outputs, got, expected):
        assert g.shape == e.shape, f"{name}: shape {g.shape} != {e.shape}"
        np.testing.assert_allclose(g.astype(np.float64) if g.dtype != np.bool_ else g,
                                   e.astype(np.float64) if e.dtype != np.bool_ else e,
                                   rtol=rtol, atol=atol, err_msg=name)
    return imported


def single_node_model(op_type: str, inputs: list, outputs: list, *, opset: int = 17,
                      initializers: list | None = None, **attrs) -> onnx.ModelProto:
    """A model of one node. `inputs`: (name, elem_type, shape) for a graph input, a bare name
    for one of `initializers` ("" for an absent optional input); `outputs`: (name, elem_type,
    shape), shape None when unknown."""
    inits = initializers or []
    init_names = {t.name for t in inits}

    def info(spec):
        if isinstance(spec, onnx.ValueInfoProto):
            return spec
        name, elem, shape = spec
        return helper.make_tensor_value_info(name, elem, shape)

    in_infos = [info(s) for s in inputs if not isinstance(s, str)]
    names = [s if isinstance(s, str) else (s.name if isinstance(s, onnx.ValueInfoProto)
                                           else s[0]) for s in inputs]
    missing = [n for n in names if isinstance(n, str) and n and n not in init_names
               and n not in {i.name for i in in_infos}]
    assert not missing, f"inputs {missing} are neither graph inputs nor initializers"
    out_infos = [info(s) for s in outputs]
    node = helper.make_node(op_type, names, [o.name for o in out_infos], **attrs)
    graph = helper.make_graph([node], op_type.lower(), in_infos, out_infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def with_random_weights(path: Path, seed: int = 0) -> onnx.ModelProto:
    """The bundled model with its ConstantOfShape fills replaced by random initializers
    (positive where a BatchNorm variance or scale is expected), to check real arithmetic."""
    model = onnx.load(str(path))
    g = model.graph
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    keep, inits = [], list(g.initializer)
    for node in g.node:
        if node.op_type != "ConstantOfShape":
            keep.append(node)
            continue
        shape = [int(d) for d in shapes[node.input[0]]]
        name = node.output[0]
        if any(k in name for k in ("var", "riv", "scale", "_s_0")):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(max(np.prod(shape[1:]), 1))
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        # IR version 3 wants every initializer declared as a graph input too.
        g.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape))
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(inits)
    return model
