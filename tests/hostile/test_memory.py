"""Class 2b: memory. A small input must not make a command allocate without bound, and when
memory does run out the command says so in one line (exit 2), never dies by a signal.

A 200-byte model asking for a 1 GiB ConstantOfShape that feeds a Mul was killed by SIGSEGV
under a 4 GiB address-space limit: ONNX's data propagation built one shape entry per element
(gigabytes for 2^28 elements). Now data propagation runs only where it stays small, the bytes
of every folded constant are checked against `TILEKIT_MAX_TOTAL_BYTES` before the fold
allocates, a fold that runs out of memory names its node and the budget, and a MemoryError
anywhere in a command is one line naming the budgets to lower.

The subprocesses run under `RLIMIT_AS` with one BLAS thread (each thread reserves address
space, which would make the limit depend on the machine's cores).
"""

from __future__ import annotations

import resource

import numpy as np

from hostile_support import assert_refused, run, spawn, write_doc

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _address_space(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def _fill_then_mul(path, elements: int):
    """y = c * c with c = ConstantOfShape([elements]) of 1.5: under 300 bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Mul", ["c", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], [numpy_helper.from_array(
            np.array([elements], np.int64), "s")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert path.stat().st_size < 300
    return path


def test_fold_out_of_memory_is_one_line_naming_the_op_and_the_budget(tmp_path):
    """1 GiB of address space, a fold of 1 GiB: memory runs out in the fold itself."""
    model = _fill_then_mul(tmp_path / "m.onnx", 2**28)
    proc = spawn("tk-import", model, "-o", tmp_path / "m.yaml", env=ONE_THREAD,
                 preexec_fn=_address_space(2**30))
    assert_refused(proc, "tk-import", "m.onnx", "Mul", "memory ran out",
                   "TILEKIT_MAX_TOTAL_BYTES")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_folded_bytes_are_budgeted_before_the_fold_allocates(tmp_path):
    """The issue's case (1 GiB fill, 4 GiB of address space) with a budget below what the
    folds need together: refused by the budget before the Mul allocates."""
    model = _fill_then_mul(tmp_path / "m.onnx", 2**28)
    proc = spawn("tk-import", model, "-o", tmp_path / "m.yaml",
                 env={**ONE_THREAD, "TILEKIT_MAX_TOTAL_BYTES": "1536M"},
                 preexec_fn=_address_space(4 * 2**30))
    assert_refused(proc, "tk-import", "Mul", "total size limit", "TILEKIT_MAX_TOTAL_BYTES")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_data_propagation_only_where_it_stays_small(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from tilekit.onnx.fold import _data_prop_bounded

    assert not _data_prop_bounded(onnx.load(str(_fill_then_mul(tmp_path / "a.onnx", 2**28))))
    assert _data_prop_bounded(onnx.load(str(_fill_then_mul(tmp_path / "b.onnx", 64))))
    big = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "g",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**28])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert not _data_prop_bounded(helper.make_model(big))
    # a fill whose length only data propagation would know (Shape -> ConstantOfShape)
    grown = helper.make_graph([helper.make_node("Shape", ["x"], ["s"]),
                               helper.make_node("ConstantOfShape", ["s"], ["c"]),
                               helper.make_node("Mul", ["c", "c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert not _data_prop_bounded(helper.make_model(grown))


def test_shape_fed_fill_imports_within_its_budget(tmp_path):
    """Shape -> ConstantOfShape -> Mul over a declared input of 2^28 elements (1 GiB): the
    import must neither crash in inference nor allocate the fill; with a budget below the
    fill it is refused by that budget."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["s"]),
                               helper.make_node("ConstantOfShape", ["s"], ["c"]),
                               helper.make_node("Mul", ["c", "x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    proc = spawn("tk-import", path, "-o", tmp_path / "m.yaml",
                 env={**ONE_THREAD, "TILEKIT_MAX_TOTAL_BYTES": "512M"},
                 preexec_fn=_address_space(2**30))
    assert_refused(proc, "tk-import", "total size limit", "TILEKIT_MAX_TOTAL_BYTES")


def test_out_of_memory_in_a_run_is_one_line(tmp_path):
    """A run within its budget (2 GiB of tensors, under the 8 GiB default) in a process that
    may use 1 GiB: the allocation fails, the command says memory ran out and what to lower."""
    doc = {"tilekit": 1, "model": "big", "stages": [{"name": "import"}], "inputs": ["x"],
           "outputs": ["y"], "tensors": {
               "x": {"shape": [2**28], "dtype": "float32", "role": "input"},
               "y": {"shape": [2**28], "dtype": "float32", "role": "output"}},
           "ops": [{"name": "twice", "expr": "y[i] = x[i] * 2.0"}]}
    ir = write_doc(tmp_path / "big.json", doc)
    proc = spawn("tk-run", ir, "--seed", "0", "-o", tmp_path / "out.npz", env=ONE_THREAD,
                 preexec_fn=_address_space(2**30))
    assert_refused(proc, "tk-run", "memory ran out", "TILEKIT_MAX_TOTAL_BYTES")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json"]


def test_memory_error_anywhere_is_exit_2(tmp_path, monkeypatch):
    import tilekit.runtime.io as runtime_io
    from hostile_support import write_mlp

    def exhausted(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr(runtime_io, "random_input", exhausted)
    result = run("tk-run", write_mlp(tmp_path), "--seed", "0")
    assert_refused(result, "tk-run", "memory ran out", "TILEKIT_MAX_TOTAL_BYTES")
