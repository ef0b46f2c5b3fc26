"""The kernels of opaque ops (tilekit.codegen.opaque), one per registered type, against the
reference executor: compiled for the CPU target and, as CUDA, run through the emulation. An
ONNX export's GatherND (BERT's masks at run-time indices) and a greedy decoder's ArgMax were
refused by tk-codegen once; docs/import.md lists which types have kernels and why the others
do not (tests/unit/test_codegen_docs.py keeps that table current)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from tilekit.codegen import generate
from tilekit.codegen.cxx import find_cxx
from tilekit.codegen.emulate import emulate
from tilekit.codegen.opaque import OPAQUE_KERNELS
from tilekit.onnx import import_model
from tilekit.runtime.compiled import CpuProgram
from tilekit.runtime.cpu import run_module

pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")

#: Run-time index inputs (in range, negative ones included, repeated scatter targets so the
#: order of updates matters).
INDICES = {
    "gi": np.array([[2, 0], [-1, 1]], np.int64),
    "ei": np.array([[3, 0, 1, 1, 2], [0, 0, 4, -1, 2], [1, 2, 3, 0, 0]], np.int64),
    "ni": np.array([[0, 4], [2, 1], [-1, 3]], np.int64),
    "si": np.array([[1], [3], [1]], np.int64),
    "xi": np.array([[1, 1, 0, 4, 2], [0, 3, 3, 3, 1], [2, 2, 2, 0, 4]], np.int64),
}


def _model():
    vi = h.make_tensor_value_info
    nodes = [
        h.make_node("ArgMax", ["x"], ["amax"], axis=1, keepdims=0),
        h.make_node("ArgMin", ["x"], ["amin"], axis=0, keepdims=1, select_last_index=1),
        h.make_node("Gather", ["x", "gi"], ["g"], axis=0),
        h.make_node("GatherElements", ["x", "ei"], ["ge"], axis=1),
        h.make_node("GatherND", ["x", "ni"], ["gnd"]),
        h.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=1, largest=1),
        h.make_node("ScatterND", ["x", "si", "rows"], ["snd"], reduction="add"),
        h.make_node("ScatterElements", ["x", "xi", "upd"], ["sel"], axis=1),
    ]
    inputs = [vi("x", T.FLOAT, [4, 5])] + [vi(n, T.INT64, list(a.shape))
                                           for n, a in INDICES.items()]
    outputs = [vi(n, T.FLOAT if n in ("g", "ge", "gnd", "tv", "snd", "sel") else T.INT64,
                  None) for n in ("amax", "amin", "g", "ge", "gnd", "tv", "ti", "snd", "sel")]
    rng = np.random.default_rng(1)
    inits = [nh.from_array(np.array([3], np.int64), "k"),
             nh.from_array(rng.standard_normal((3, 5)).astype(np.float32), "upd"),
             nh.from_array(rng.standard_normal((3, 5)).astype(np.float32), "rows")]
    graph = h.make_graph(nodes, "opaque_kinds", inputs, outputs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


@pytest.fixture(scope="session")
def case():
    imported = import_model(_model())
    module = imported.module
    kinds = {op.opaque["type"] for op in module.ops if op.kind == "opaque"}
    # every type with a kernel but the two that have none as ops of this model
    assert kinds == set(OPAQUE_KERNELS), sorted(set(OPAQUE_KERNELS) ^ kinds)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    x[1, 2] = x[1, 4] = x[1].max() + 1  # ties: the first (ArgMax) and last (ArgMin) index
    x[3, 0] = x[2, 0] = x[:, 0].min() - 1
    inputs = {"x": x, **INDICES}
    want = run_module(module, inputs, imported.weights)
    import onnxruntime
    session = onnxruntime.InferenceSession(_model().SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    _same(dict(zip(names, session.run(None, inputs))), want)  # the reference is right
    return module, inputs, imported.weights, want


def _same(got, want):
    for name, expected in want.items():
        assert got[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(got[name], expected, err_msg=name)


def test_opaque_kernels_on_the_cpu_target_equal_the_reference(case):
    module, inputs, weights, want = case
    generated = generate(module, target="cpu").module
    _same(CpuProgram(generated, 1).run(inputs, weights), want)


def test_opaque_cuda_kernels_emulated_equal_the_reference(case):
    module, inputs, weights, want = case
    _same(emulate(generate(module).module, inputs, weights), want)


@pytest.mark.parametrize("shape,axis,index", [
    ((3, 7, 50), 1, [[4, 6], [-2, 0], [3, 3]]),    # runs of 50 across the 256-point blocks
    ((10, 300), 0, [2, 9, 0, -1]),                  # an embedding's rows, longer than a block
    ((6, 4), 1, [3, 0, -4]),                         # one point per row
])
def test_a_cpu_gather_copies_runs_of_rows(shape, axis, index):
    """The CPU Gather takes each block's points as runs within output rows (vector loops):
    at row and block boundaries that fall anywhere, on one thread and three."""
    vi = h.make_tensor_value_info
    ind = np.array(index, np.int64)
    graph = h.make_graph([h.make_node("Gather", ["x", "i"], ["y"], axis=axis)], "gather",
                         [vi("x", T.FLOAT, list(shape)), vi("i", T.INT64, list(ind.shape))],
                         [vi("y", T.FLOAT, None)])
    imported = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    generated = generate(imported.module, target="cpu").module
    (kernel,) = generated.codegen["kernels"]
    assert "#pragma omp simd" in kernel["source"]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    want = np.take(x, ind, axis=axis)
    for threads in (1, 3):
        got = CpuProgram(generated, threads).run({"x": x, "i": ind}, imported.weights)
        np.testing.assert_array_equal(got[generated.outputs[0]], want)


@pytest.mark.parametrize("shape,batch_dims,index", [
    ((3, 6, 50), 0, [[[1, 4], [-1, 0]], [[2, 5], [0, 0]]]),   # slices of 50 by index pairs
    ((2, 6, 100), 1, [[[5], [0], [-2]], [[1], [1], [3]]]),     # per batch, slices of 100
])
def test_a_cpu_gather_nd_copies_runs_of_slices(shape, batch_dims, index):
    vi = h.make_tensor_value_info
    ind = np.array(index, np.int64)
    graph = h.make_graph([h.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
                         "gather_nd", [vi("x", T.FLOAT, list(shape)),
                                       vi("i", T.INT64, list(ind.shape))],
                         [vi("y", T.FLOAT, None)])
    imported = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    generated = generate(imported.module, target="cpu").module
    assert "#pragma omp simd" in generated.codegen["kernels"][0]["source"]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = run_module(imported.module, {"x": x, "i": ind}, imported.weights)
    for threads in (1, 3):
        got = CpuProgram(generated, threads).run({"x": x, "i": ind}, imported.weights)
        np.testing.assert_array_equal(got[generated.outputs[0]], want[generated.outputs[0]])

