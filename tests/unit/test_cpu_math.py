"""runtime_cpu.h's exp, tanh, erf and sigmoid (straight-line code the compiler runs in vector
lanes) against float64 over a sweep of float32 inputs, specials included, through the real
pipeline: an ONNX model of the four ops, compiled for the CPU."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T, helper as h

from tilekit.codegen import generate
from tilekit.codegen.cpu_program import program_unit
from tilekit.codegen.cxx import build, find_cxx
from tilekit.onnx import import_model
from tilekit.runtime.compiled import CpuProgram

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import onnx_models  # noqa: E402

pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")

#: Relative error allowed against float64: a few float32 ulps (2^-23 is 1.2e-7).
BOUND = 3e-7


def _sweep() -> np.ndarray:
    grid = [np.linspace(-100, 100, 20001), np.linspace(-6, 6, 24001),
            np.geomspace(1e-30, 1e3, 4001), -np.geomspace(1e-30, 1e3, 4001),
            [np.inf, -np.inf, np.nan, 0.0, -0.0, 88.7, 88.8, -87.3, -87.4, -104.0]]
    return np.concatenate([np.asarray(g, np.float64) for g in grid]).astype(np.float32)


def test_math_functions_are_accurate_in_vector_lanes():
    x = _sweep()
    vi = h.make_tensor_value_info
    ops = {"Exp": np.exp, "Tanh": np.tanh, "Erf": np.vectorize(math.erf, otypes=[float]),
           "Sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v))}
    nodes = [h.make_node(op, ["x"], [op.lower()]) for op in ops]
    graph = h.make_graph(nodes, "math", [vi("x", T.FLOAT, [len(x)])],
                         [vi(op.lower(), T.FLOAT, None) for op in ops])
    imported = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    module = generate(imported.module, target="cpu").module
    sources = "".join(k["source"] for k in module.codegen["kernels"])
    assert all(f"tk_{op.lower()}f(" in sources for op in ops)
    got = CpuProgram(module, 1).run({"x": x}, imported.weights)
    x64 = x.astype(np.float64)
    finite = np.isfinite(x64)
    for op, ref_fn in ops.items():
        with np.errstate(over="ignore", invalid="ignore"):
            ref = np.full_like(x64, np.nan)
            ref[finite] = ref_fn(x64[finite])
            ref[x64 == np.inf] = {"Exp": np.inf, "Tanh": 1, "Erf": 1, "Sigmoid": 1}[op]
            ref[x64 == -np.inf] = {"Exp": 0, "Tanh": -1, "Erf": -1, "Sigmoid": 0}[op]
        out = got[op.lower()].astype(np.float64)
        with np.errstate(over="ignore"):
            want32 = ref.astype(np.float32).astype(np.float64)
        normal = np.isfinite(want32) & (np.abs(want32) > 1e-37)
        rel = np.abs(out[normal] - ref[normal]) / np.abs(ref[normal])
        assert rel.max() < BOUND, (op, rel.max(), x[normal][rel.argmax()])
        special = ~normal
        same = (out[special] == want32[special]) | (np.isnan(out[special])
                                                    & np.isnan(want32[special]))
        tiny = (np.abs(want32[special]) <= 1e-37) & (np.abs(out[special]) <= 1e-37)
        assert np.all(same | tiny), (op, x[special][~(same | tiny)])


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm (binutils) to read symbols")
def test_math_functions_are_inlined_in_a_unit_of_many_kernels():
    """In a unit of many kernels GCC's inliner runs out of its growth budget; a math helper it
    then calls instead of inlining leaves its loop unvectorised (scalar code, a branch per
    select). An LSTM unrolled over 32 steps (a gate kernel per step, each with sigmoid and
    tanh) compiles to a library without a standalone copy of any of them."""
    imported = import_model(onnx_models.lstm_model(seq=32, batch=1, inputs=16, hidden=64))
    module = generate(imported.module, target="cpu").module
    source, _ = program_unit(module)
    assert source.count("tk_tanhf(") >= 64
    symbols = subprocess.run(["nm", "-C", str(build(source))], capture_output=True,
                             text=True, check=True).stdout   # demangled: tk_tanhf(float)
    helpers = re.findall(r"\btk_(?:expf|erff|tanhf|sigmoidf)\(.*", symbols)
    assert helpers == []
