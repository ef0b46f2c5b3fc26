"""The verifier on modules built in code (the bad-input corpus covers documents)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilekit.errors import ExprError, IRError, TilekitError
from tilekit.ir import Kernel, Module, Op, Tensor, default_kernels, verify

W = {"file": "m.weights.npz", "sha256": "ab" * 32}


def matmul_chain() -> Module:
    """x @ w1 -> relu -> @ w2: three ops, two weights."""
    return Module(
        model="chain",
        tensors={"x": Tensor((2, 4), "float32", "input"),
                 "w1": Tensor((4, 8), "float32", "weight"),
                 "w2": Tensor((8, 3), "float32", "weight"),
                 "t": Tensor((2, 8)), "h": Tensor((2, 8)),
                 "y": Tensor((2, 3), "float32", "output")},
        ops=(Op("mm1", "t[i,j] += x[i,k] * w1[k,j]"),
             Op("relu", "h[i,j] = max(t[i,j], 0.0)"),
             Op("mm2", "y[i,j] += h[i,k] * w2[k,j]")),
        inputs=("x",), outputs=("y",), weights=W)


def message(module: Module, origin: str | None = None) -> str:
    with pytest.raises(TilekitError) as info:
        verify(module, origin)
    text = info.value.message()
    assert "\n" not in text
    return text


def test_valid_module_passes() -> None:
    verify(matmul_chain())
    verify(replace(matmul_chain(), kernels=default_kernels(matmul_chain().ops)))
    verify(matmul_chain().with_stage("import", opset=17))


def test_origin_prefixes_the_ir_path() -> None:
    m = replace(matmul_chain(), outputs=("t",))
    assert message(m, "m.yaml").startswith("m.yaml: outputs[0]: 't' is listed in outputs")
    assert message(m).startswith("outputs[0]: ")


def test_expression_errors_are_located_expr_errors() -> None:
    ops = list(matmul_chain().ops)
    ops[1] = replace(ops[1], expr="h[i,j] = max(t[i,j], 0.0) +")
    with pytest.raises(ExprError) as info:
        verify(replace(matmul_chain(), ops=tuple(ops)), "m.yaml")
    assert info.value.where.startswith("m.yaml: ops[1].expr col ")


def test_numpy_values_are_refused_with_a_hint() -> None:
    m = matmul_chain()
    t = dict(m.tensors, x=Tensor((np.int64(2), 4), "float32", "input"))
    assert "tensors.x.shape[0]: dimension must be a positive integer" in message(
        replace(m, tensors=t))
    bad = replace(m, codegen={"eps": np.float32(1e-5)})
    assert "codegen.eps" in message(bad) and "NumPy" in message(bad)
    ok = replace(m, codegen={"eps": float(np.float32(1e-5))})
    verify(ok)


def test_tuples_in_payloads_are_refused() -> None:
    ops = list(matmul_chain().ops)
    ops[0] = replace(ops[0], tile={"block": (2, 8)})
    text = message(replace(matmul_chain(), ops=tuple(ops)))
    assert text.startswith("ops[0].tile.block: value is a tuple; payloads are JSON data")


def test_booleans_are_not_dimensions() -> None:
    t = dict(matmul_chain().tensors, x=Tensor((True, 4), "float32", "input"))
    assert "got boolean True" in message(replace(matmul_chain(), tensors=t))


def test_zero_sized_tensors_are_refused() -> None:
    """tk-roll divided by a zero extent; no importer conformance case needs an empty tensor."""
    m = Module(model="empty", tensors={"x": Tensor((0, 3), "float32", "input"),
                                       "y": Tensor((0, 3), "float32", "output")},
               ops=(Op("neg", "y[i,j] = -x[i,j]"),), inputs=("x",), outputs=("y",))
    assert "tensors.x.shape[0]: dimension must be a positive integer, got integer 0" in \
        message(m)


def test_opaque_op_data_flow() -> None:
    m = Module(
        model="g",
        tensors={"ids": Tensor((3,), "int64", "input"), "table": Tensor((10, 4), "float32",
                                                                        "weight"),
                 "e": Tensor((3, 4)), "y": Tensor((3, 4), "float32", "output")},
        ops=(Op("gather", kind="opaque", opaque={"type": "Gather", "inputs": ["table", "ids"],
                                                 "outputs": ["e"], "attrs": {"axis": 0}}),
             Op("scale", "y[i,j] = e[i,j] * 2.0")),
        inputs=("ids",), outputs=("y",), weights=W)
    verify(m)
    swapped = replace(m, ops=m.ops[::-1])
    assert "reads 'e' before ops[1] ('gather') writes it" in message(swapped)
    no_out = replace(m, ops=(replace(m.ops[0], opaque={**m.ops[0].opaque, "outputs": []}),
                             m.ops[1]))
    assert "ops[0].opaque.outputs: an opaque op writes no tensor" in message(no_out)


def test_input_not_listed() -> None:
    m = replace(matmul_chain(), inputs=())
    assert message(m) == "tensors.x: has role 'input' but is not listed in inputs; add it to inputs"


def test_unknown_output_name_suggests() -> None:
    assert "did you mean 'y'?" in message(replace(matmul_chain(), outputs=("y2",)))


def test_every_op_in_exactly_one_kernel() -> None:
    m = replace(matmul_chain(), kernels=(Kernel("k0", ("mm1", "relu")),))
    assert message(m) == ("kernels: op 'mm2' is in no kernel; when kernels are listed, every "
                          "op belongs to one")
    empty = replace(matmul_chain(), kernels=(Kernel("k0", ()),) + default_kernels(
        matmul_chain().ops))
    assert message(empty) == "kernels[0].ops: a kernel has no ops"


def test_fused_kernel_in_order_passes() -> None:
    m = replace(matmul_chain(), kernels=(Kernel("k0", ("mm1", "relu")), Kernel("k1", ("mm2",))))
    verify(m)


def test_stage_entries() -> None:
    m = replace(matmul_chain(), stages=({"name": ""},))
    assert message(m).startswith("stages[0].name: a stage name must be a non-empty string")
    m = replace(matmul_chain(), stages=({"name": "roll", "options": {"hw": "h100"}},))
    verify(m)


def test_source_path_must_be_relative() -> None:
    m = replace(matmul_chain(), source={"onnx": "C:\\models\\m.onnx"})
    assert "source.onnx: the source model 'C:\\models\\m.onnx' is an absolute path" in message(m)


def test_not_a_module() -> None:
    with pytest.raises(IRError, match="expected a Module, got dict"):
        verify({"model": "x"})  # type: ignore[arg-type]


def test_opaque_inputs_may_repeat_or_be_absent() -> None:
    """`""` is an absent optional input (ONNX style); a tensor may be read twice."""
    m = Module(
        model="ge", tensors={"ids": Tensor((3, 2), "int64", "input"),
                             "y": Tensor((3, 2), "int64", "output")},
        ops=(Op("ge", kind="opaque", opaque={"type": "GatherElements", "inputs": ["ids", "ids"],
                                             "outputs": ["y"], "attrs": {"axis": 1}}),),
        inputs=("ids",), outputs=("y",))
    verify(m)
    absent = replace(m, ops=(replace(m.ops[0], opaque={**m.ops[0].opaque,
                                                        "inputs": ["ids", ""]}),))
    assert message(absent).startswith("ops[0].opaque: GatherElements cannot derive its output "
                                      "shapes")

