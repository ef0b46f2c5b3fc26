"""The tile-program interpreter: it computes what the program says (against the reference
executor and a float64 GEMM), and its counters catch what a GPU would pay for: an
uncoalesced copy, a conflicting shared layout, fragment reads without the layout pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from codegen_support import fixture, random_values, unpadded, without_tiles
from tilekit.codegen import generate
from tilekit.codegen.kernel import tvar
from tilekit.codegen.report import program_report
from tilekit.expr.ops import numpy_dtype
from tilekit.runtime.cpu import run_module
from tilekit.tile import expr as tx
from tilekit.tile.expr import BLOCK, Const, Load, Var
from tilekit.tile.interp import Interpreter, interpret
from tilekit.tile.nodes import Buffer, Kernel, Layout, Let, Store, Threads, seq

I = "int32"


def _memory(module, inputs, weights):
    memory = {}
    for name, t in module.tensors.items():
        value = inputs.get(name, weights.get(name))
        dtype = numpy_dtype(t.dtype)
        memory[tvar(name)] = (np.asarray(value, dtype).reshape(-1).copy() if value is not None
                              else np.zeros(max(t.size, 1), dtype))
    return memory


@pytest.mark.parametrize("name,variant", [("matmul_bias_relu", None), ("softmax", None),
                                          ("conv_chain", None), ("layernorm", without_tiles),
                                          ("gather", None)])
def test_interpreted_kernels_compute_the_reference(name, variant):
    module = fixture(name) if variant is None else variant(fixture(name))
    inputs, weights = random_values(module)
    memory = _memory(module, inputs, weights)
    for g in generate(module).kernels:
        interpret(g.program, memory)
    want = run_module(module, inputs, weights)
    for out in module.outputs:
        got = memory[tvar(out)].reshape(module.tensors[out].shape)
        np.testing.assert_allclose(got, want[out], rtol=2e-5, atol=2e-5)


def _copy_kernel(stride: int) -> Kernel:
    """Thread t of each block reads x[(b * 128 + t) * stride] (a column of a row-major
    matrix when stride > 1) and writes y[b * 128 + t]."""
    x = Buffer("t_x", "global", "float32", (128 * 4 * stride,))
    y = Buffer("t_y", "global", "float32", (128 * 4,), access="write")
    tid = Var("tid", I)
    i = tx.add(tx.mul(BLOCK, 128), tid)
    body = Threads(tid, 128, Store("t_y", (i,), Load("t_x", (tx.mul(i, stride),), "float32")))
    return Kernel("copy", (x, y), (), body, 128, 4)


def test_an_uncoalesced_copy_is_caught():
    good = _copy_kernel(1)
    bad = _copy_kernel(32)
    mem = {"t_x": np.arange(128 * 4 * 32, dtype=np.float32), "t_y": np.zeros(512, np.float32)}
    assert interpret(good, dict(mem)).totals()["coalescing"] == 1.0
    counters = interpret(bad, dict(mem))
    # 32 lanes, 4 bytes each, 128 bytes apart: 32 sectors where 4 would do (the store: 4)
    assert counters.totals()["coalescing"] == pytest.approx((4 + 4) / (32 + 4), abs=1e-4)
    (load,) = [s for s in counters.sites.values() if s.kind == "load"]
    assert load.sectors == 32 * load.requests and load.efficiency == pytest.approx(4 / 32)


def _transpose_kernel(pad: int) -> Kernel:
    """A 32x32 tile through shared memory: rows written, columns read (the classic
    transpose): without padding every lane of a warp reads the same bank."""
    x = Buffer("t_x", "global", "float32", (1024,))
    y = Buffer("t_y", "global", "float32", (1024,), access="write")
    s = Buffer("s_t", "shared", "float32", (32, 32), Layout(pad=pad))
    tid = Var("tid", I)
    r, c = Var("r", I), Var("c", I)
    body = seq(
        Threads(tid, 1024, seq(Let(r, tx.div(tid, 32)), Let(c, tx.mod(tid, 32)),
                               Store("s_t", (r, c), Load("t_x", (tid,), "float32")))),
        Threads(tid, 1024, seq(Let(r, tx.div(tid, 32)), Let(c, tx.mod(tid, 32)),
                               Store("t_y", (tid,), Load("s_t", (c, r), "float32")))))
    return Kernel("transpose", (x, y), (s,), body, 1024, 1)


def test_a_conflicting_shared_layout_is_caught_and_padding_removes_it():
    mem = {"t_x": np.arange(1024, dtype=np.float32), "t_y": np.zeros(1024, np.float32)}
    conflicting = interpret(_transpose_kernel(0), dict(mem))
    read = [s for s in conflicting.sites.values() if s.scope == "shared" and s.kind == "load"]
    assert read[0].wavefronts == 32 * read[0].requests      # 32-way conflicts
    out = dict(mem, t_y=np.zeros(1024, np.float32))
    padded = interpret(_transpose_kernel(1), out)
    assert padded.totals()["bank_conflict_degree"] == 1.0
    np.testing.assert_array_equal(out["t_y"].reshape(32, 32), mem["t_x"].reshape(32, 32).T)


def test_tensor_core_fragments_are_conflict_free_only_with_the_layout_pass():
    from test_codegen_mma import H100, gemm, values

    module = gemm(64, 64, 64, "float16")
    (g,) = generate(module, H100).kernels
    v = values(module)
    memory = {tvar(n): np.asarray(v[n], np.float16).reshape(-1).copy() for n in module.inputs}
    memory[tvar("c")] = np.zeros(64 * 64, np.float32)
    counters = interpret(g.program, memory)
    np.testing.assert_allclose(memory[tvar("c")].reshape(64, 64),
                               v["a"].astype(np.float64) @ v["b"].astype(np.float64),
                               rtol=1e-4, atol=1e-4)

    def ldmatrix_degree(c) -> float:
        sites = [s for s in c.sites.values() if s.scope == "shared" and s.kind == "load"]
        return sum(s.wavefronts for s in sites) / sum(s.ideal_wavefronts for s in sites)
    assert ldmatrix_degree(counters) == 1.0
    # the same program with the rows unpadded: the fragment reads conflict
    assert ldmatrix_degree(interpret(unpadded(g.program), memory)) > 2


def test_the_report_of_a_staged_contraction():
    (g,) = generate(fixture("matmul_aligned")).kernels
    report = program_report(g.program)
    assert report["blocks_sampled"] == [0, 3]
    assert report["coalescing"] == 1.0 and report["bank_conflict_degree"] == 1.0
    # a 32x64 block tile over k = 48: 2 flops per multiply-add
    assert report["per_block"]["flops"] == 2 * 32 * 64 * 48 and "worst" not in report


def test_kernels_whose_blocks_wait_are_not_interpreted():
    k = replace(_copy_kernel(1), grid_sync=True)
    with pytest.raises(Exception, match="wait on each other"):
        Interpreter(k, {}).run()
