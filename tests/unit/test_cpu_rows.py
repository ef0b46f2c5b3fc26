"""Row chains on the CPU: tk-weld groups softmax and layer norm (the ONNX op and the form
exporters write) with a scale and mask before them into one kernel for a CPU profile
(tilekit.weld.cpu.row_chain), codegen runs it as one `cpu_rows` kernel
(tilekit.codegen.cpu_rows), and its results equal the reference executor's and
onnxruntime's on odd sizes: rows not a multiple of the vector width, one row, a row shorter
than the lanes, a row longer than L1."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h

from tilekit.codegen import generate
from tilekit.codegen.cxx import find_cxx
from tilekit.hw import load_profile
from tilekit.onnx import import_model
from tilekit.roll.schedule import roll_module
from tilekit.runtime.compiled import CpuProgram
from tilekit.runtime.cpu import run_module
from tilekit.weld import weld_module
from tilekit.weld.cpu import row_chain

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import onnx_models  # noqa: E402
from models.onnx_check import onnxruntime_outputs  # noqa: E402

needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")

PROFILE = load_profile("milan").with_cpu(cores=2)


def _welded(model: onnx.ModelProto):
    imported = import_model(model)
    module = weld_module(roll_module(imported.module.with_stage("import"), PROFILE), PROFILE)
    return imported, module


def _generated(model: onnx.ModelProto):
    imported, welded = _welded(model)
    return imported, welded, generate(welded, PROFILE, target="cpu").module


def _kernels(generated) -> list[dict]:
    return list(generated.codegen["kernels"])


# -- the weld ------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [
    onnx_models.softmax_chain(rows=6, seq=45),
    onnx_models.layer_norm_chain(tokens=5, hidden=37),
    onnx_models.layer_norm_chain(tokens=5, hidden=37, decomposed=True),
], ids=["softmax", "layer_norm", "layer_norm_decomposed"])
def test_a_row_chain_is_one_group(model):
    imported, welded = _welded(model)
    ops = [op.name for op in welded.ops if op.kind != "opaque"]
    chained = [k for k in welded.kernels if len(k.ops) > 1]
    assert len(chained) == 1 and list(chained[0].ops) == ops
    index = welded.op_index()
    assert row_chain(welded, [index[o] for o in ops]) is not None


def test_a_row_read_by_every_pass_counts_once():
    """The LayerNormalization op's three passes read the same row; priced once per pass,
    the chain looked dearer than two kernels for an AVX-512 profile on 2 cores."""
    profile = load_profile("icelake").with_cpu(cores=2)
    imported = import_model(onnx_models.layer_norm_chain(tokens=512, hidden=768))
    welded = weld_module(roll_module(imported.module.with_stage("import"), profile), profile)
    assert [len(k.ops) for k in welded.kernels] == [len(welded.ops)]


def test_row_chain_roles_and_refusals():
    imported = import_model(onnx_models.layer_norm_chain(tokens=3, hidden=9, decomposed=True))
    m = imported.module
    chain = row_chain(m, range(len(m.ops) - 1))      # the Identity at the end is not one
    assert chain is not None and chain.rows == (3,) and chain.length == 9
    assert [op.role for op in chain.ops] == ["reduce", "row", "row", "reduce", "scalar",
                                             "scalar", "row", "row", "row"]
    assert row_chain(m, [0]) is None                  # one op
    # a reduction over the rows' first axis is no row chain
    vi = h.make_tensor_value_info
    graph = h.make_graph([h.make_node("ReduceMean", ["x"], ["mu"], axes=[0], keepdims=1),
                          h.make_node("Sub", ["x", "mu"], ["y"])], "cols",
                         [vi("x", T.FLOAT, [4, 6])], [vi("y", T.FLOAT, None)])
    cols = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])).module
    assert row_chain(cols, [0, 1]) is None


def test_elementwise_ops_over_the_same_points_weld_into_one_kernel():
    vi = h.make_tensor_value_info
    graph = h.make_graph([h.make_node("Mul", ["x", "x"], ["a"]),
                          h.make_node("Add", ["a", "x"], ["b"]),
                          h.make_node("Tanh", ["b"], ["y"])], "ew",
                         [vi("x", T.FLOAT, [64, 300])], [vi("y", T.FLOAT, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    _, welded = _welded(model)
    assert [len(k.ops) for k in welded.kernels] == [3]


# -- the kernel ----------------------------------------------------------------------------

def test_softmax_is_three_passes_with_the_exponential_kept():
    _, _, generated = _generated(onnx_models.softmax_chain(rows=6, seq=45))
    (k,) = _kernels(generated)
    assert k["shape"] == "cpu_rows"
    sched = k["schedule"]
    assert sched["length"] == 45 and sched["rows"] == 6
    assert len(sched["passes"]) == 3
    assert len(sched["row_buffers"]) == 2           # the masked scores, the exponentials
    source = k["source"]
    assert source.count("tk_expf(") == 2            # once per point (and once in the tail)
    assert source.count("1.0f / v_probs_sum") == 1  # one division per row, not per point


def test_decomposed_layer_norm_is_three_passes():
    _, _, generated = _generated(onnx_models.layer_norm_chain(tokens=5, hidden=37,
                                                              decomposed=True))
    (k,) = _kernels(generated)
    assert k["shape"] == "cpu_rows"
    kinds = [len(p) for p in k["schedule"]["passes"]]
    assert len(kinds) == 4                          # mean; centre, square, variance;
    assert kinds[2] == 2                            # epsilon and sqrt; normalise, scale, shift
    assert k["schedule"]["row_buffers"] == [generated.ops[1].expr.split("[")[0]]


CASES = {
    "softmax_odd": lambda: onnx_models.softmax_chain(rows=7, seq=45),
    "softmax_one_row": lambda: onnx_models.softmax_chain(rows=1, seq=19),
    "softmax_short_row": lambda: onnx_models.softmax_chain(rows=9, seq=5),
    "softmax_row_over_l1": lambda: onnx_models.softmax_chain(rows=3, seq=12001),
    "layer_norm_odd": lambda: onnx_models.layer_norm_chain(tokens=5, hidden=37),
    "layer_norm_one_row": lambda: onnx_models.layer_norm_chain(tokens=1, hidden=768),
    "layer_norm_decomposed_odd": lambda: onnx_models.layer_norm_chain(
        tokens=11, hidden=53, decomposed=True),
    "layer_norm_decomposed_row_over_l1": lambda: onnx_models.layer_norm_chain(
        tokens=2, hidden=10007, decomposed=True),
    "mlp_epilogue_odd": lambda: onnx_models.mlp_epilogue(tokens=13, d_in=24, d_out=40),
}


@needs_cxx
@pytest.mark.parametrize("case", list(CASES))
def test_equals_the_reference_and_onnxruntime(case):
    model = CASES[case]()
    imported, welded, generated = _generated(model)
    shapes = {k["shape"] for k in _kernels(generated)}
    assert shapes == ({"cpu_gemm"} if case.startswith("mlp") else {"cpu_rows"})
    rng = np.random.default_rng(5)
    feeds = {vi.name: (3 * rng.standard_normal([d.dim_value for d in
                                                vi.type.tensor_type.shape.dim]))
             .astype(np.float32) for vi in model.graph.input}
    renamed = (imported.module.source or {}).get("inputs", {})
    inputs = {ir: feeds[renamed.get(ir, ir)] for ir in imported.module.inputs}
    want = run_module(imported.module, inputs, imported.weights)
    ort = onnxruntime_outputs(model, feeds)
    for threads in (1, 2):
        got = CpuProgram(generated, threads).run(inputs, imported.weights)
        for out, expected in zip(imported.module.outputs, ort):
            np.testing.assert_allclose(got[out], want[out], rtol=2e-5, atol=2e-6,
                                       err_msg=f"{case}: {out} against the reference")
            np.testing.assert_allclose(got[out], expected, rtol=2e-5, atol=2e-6,
                                       err_msg=f"{case}: {out} against onnxruntime")


@needs_cxx
def test_the_compiled_runtime_reads_contiguous_inputs_in_place():
    """A C-contiguous float32 input is passed to the kernels as it is (no copy per run); a
    strided view or another dtype is copied into the kernels' buffer; both give the same."""
    model = onnx_models.softmax_chain(rows=4, seq=24)
    imported, _, generated = _generated(model)
    (name,) = imported.module.inputs
    program = CpuProgram(generated, 1)
    x = np.random.default_rng(1).standard_normal((4, 24)).astype(np.float32)
    want = run_module(imported.module, {name: x}, imported.weights)
    out = imported.module.outputs[0]
    strided = np.asfortranarray(x)
    for given in (x, strided, x.astype(np.float64)):
        got = program.run({name: given}, imported.weights)
        np.testing.assert_allclose(got[out], want[out], rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(program.tensors()[name], x.astype(np.float32))
        assert (program.last[name] is given) == (given is x)   # in place only when it can
    assert not np.shares_memory(program.buffers[name], x)


@needs_cxx
def test_the_compiled_runtime_hands_its_outputs_over():
    """A run returns the buffers its kernels wrote (no copy out) and the next run writes
    fresh ones: an earlier result stays as it was."""
    model = onnx_models.layer_norm_chain(tokens=3, hidden=40)
    imported, _, generated = _generated(model)
    (name,) = imported.module.inputs
    out = imported.module.outputs[0]
    program = CpuProgram(generated, 1)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 40)).astype(np.float32) for _ in range(2)]
    got = [program.run({name: x}, imported.weights)[out] for x in xs]
    for x, g in zip(xs, got):
        want = run_module(imported.module, {name: x}, imported.weights)[out]
        np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-6)
    assert not np.shares_memory(got[0], got[1])
    np.testing.assert_array_equal(program.tensors()[out], got[1])
