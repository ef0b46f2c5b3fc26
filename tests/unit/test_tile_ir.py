"""Tile programs as data: constructors that simplify, the verifier's rules, the two printers,
and the structural rule that no kernel text is formed outside the printers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tilekit.errors import InternalError
from tilekit.tile import cpp, cuda
from tilekit.tile import expr as tx
from tilekit.tile.expr import BLOCK, Const, Load, Var
from tilekit.tile.nodes import (Alloc, Assign, Barrier, Buffer, Decl, For, Kernel, Let, Store,
                                Threads, seq)
from tilekit.tile.passes import lower_for_cpu
from tilekit.tile.verify import verify

I = "int32"
X = Buffer("t_x", "global", "float32", (256,))
Y = Buffer("t_y", "global", "float32", (256,), access="write")
PACKAGE = Path(__file__).resolve().parents[2] / "tilekit"


def kernel(body, threads=64) -> Kernel:
    return Kernel("k", (X, Y), (), body, threads, 4)


def test_constructors_simplify():
    v = Var("v", I)
    assert tx.add(v, 0) is v and tx.mul(v, 1) is v
    assert tx.mul(v, 0) == Const(0, I)
    assert tx.add(2, 3) == Const(5, I) and tx.div(-7, 2) == Const(-3, I)   # C truncation
    assert tx.mod(-7, 2) == Const(-1, I)
    assert tx.and_(True, tx.lt(v, 3)) == tx.lt(v, 3)
    assert tx.cast("float32", tx.cast("int64", v)) == tx.cast("float32", v)
    assert tx.call("max", v, tx.const(2, "int64")).args[0] == tx.cast("int64", v)


def test_the_verifier_catches_broken_programs():
    tid = Var("tid", I)
    good = kernel(Threads(tid, 64, Store("t_y", (tid,), Load("t_x", (tid,), "float32"))))
    verify(good)
    broken = {
        "reads undefined variable": Store("t_y", (Const(0, I),), Var("nope", "float32")),
        "a barrier inside a thread region": Threads(tid, 64, Barrier()),
        "stores into read-only parameter": Threads(tid, 64, Store("t_x", (tid,),
                                                                  tx.const(0.0))),
        "thread regions are nested": Threads(tid, 64, Threads(Var("t2", I), 64,
                                                              Barrier())),
        "a region of 128 threads": Threads(tid, 128, Store("t_y", (tid,), tx.const(0.0))),
        "declared outside": seq(Decl(Var("acc", "float32"), tx.const(0.0)),
                                Threads(tid, 64, Assign(Var("acc", "float32"),
                                                        tx.const(1.0)))),
        "defined twice": seq(Let(Var("a", I), Const(1, I)), Let(Var("a", I), Const(2, I))),
        "indexes t_x with 2 subscripts": Store("t_y", (Const(0, I),),
                                              Load("t_x", (Const(0, I), Const(0, I)),
                                                   "float32")),
    }
    for rule, body in broken.items():
        with pytest.raises(InternalError, match=rule):
            verify(kernel(body))


def _copy_program() -> Kernel:
    tid, i = Var("tid", I), Var("i", I)
    acc = Buffer("acc", "local", "float32", (2,))
    return kernel(seq(
        Let(Var("base", I), tx.mul(BLOCK, 64)),
        Alloc(acc),
        Threads(tid, 64, For(i, Const(0, I), Const(2, I), Store("acc", (i,), tx.call(
            "exp", Load("t_x", (tx.add(Var("base", I), tid),), "float32"))), kind="unroll")),
        Barrier(),
        Threads(tid, 64, Store("t_y", (tx.add(Var("base", I), tid),),
                               tx.add(Load("acc", (Const(0, I),), "float32"),
                                      Load("acc", (Const(1, I),), "float32"))))))


def test_the_cuda_printer():
    text = cuda.kernel_text(_copy_program())
    # (the shared-memory base is not __restrict__: tilekit/tile/cuda.py body_signature)
    assert "__device__ __forceinline__ void k_body(const float* __restrict__ t_x, float* " \
        "__restrict__ t_y, const int tk_block, const int tk_nblocks, unsigned char* " \
        "tk_smem) {" in text
    assert "const int base = tk_block * 64;" in text
    assert "    const int tid = threadIdx.x;\n    #pragma unroll\n" in text
    assert "acc[i] = expf(t_x[base + tid]);" in text and "__syncthreads();" in text
    assert 'extern "C" __global__ void __launch_bounds__(64)\nk(' in text
    assert "k_body(t_x, t_y, (int)blockIdx.x, (int)gridDim.x, nullptr);" in text


def test_the_cpp_printer_runs_threads_one_after_another():
    text = cpp.kernel_text(lower_for_cpu(_copy_program()))
    assert "static inline void k_body(" in text
    assert "float acc[64][2];" in text                     # one copy per thread
    assert "for (int tid = 0; tid < 64; ++tid) {" in text
    assert "acc[tid][i] = tk_expf(t_x[base + tid]);" in text     # runtime_cpu.h's exp
    assert "__syncthreads" not in text and "threadIdx" not in text
    assert "#pragma omp parallel for schedule(static)" in text
    with pytest.raises(InternalError, match="serialize"):
        cpp.kernel_text(_copy_program())                   # regions must be lowered first


# -- no kernel text outside the printers -----------------------------------------------------

#: What kernel text looks like: CUDA qualifiers and built-ins, C loops and casts, pragmas.
KERNEL_TEXT = re.compile(r'__global__|__syncthreads|threadIdx|blockIdx|__device__|__shared__|'
                         r'#pragma|for \(int |reinterpret_cast|__launch_bounds__|extern "C"|'
                         r'\bconst (int|float|long long) [a-z_]+\d* = ')
#: The printers; the CPU emulation's host harness (a C++ main() that loads tensors and launches
#: the printed kernels: it forms no kernel); the compiled CPU runtime's thread-count hook.
ALLOWED = {"tile/cuda.py", "tile/cpp.py", "tile/cstyle.py", "tile/emit.py",
           "codegen/emulate.py", "codegen/cxx.py"}


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.body and isinstance(node.body[0], ast.Expr) and \
                    isinstance(node.body[0].value, ast.Constant):
                out.add(id(node.body[0].value))
    return out


def test_no_kernel_text_is_formed_outside_the_printers():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in ALLOWED:
            continue
        tree = ast.parse(path.read_text(), rel)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in docs and KERNEL_TEXT.search(node.value):
                found.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
            if isinstance(node, ast.JoinedStr):
                parts = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                if KERNEL_TEXT.search(parts):
                    found.append(f"{rel}:{node.lineno}: f-string {parts[:60]!r}")
    assert not found, "kernel text formed outside the printers:\n" + "\n".join(found)


def test_the_structural_rule_would_see_an_fstring_kernel():
    source = 'def gen(n):\n    return f"for (int i = 0; i < {n}; ++i) y[i] = x[i];"\n'
    tree = ast.parse(source)
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)]
    parts = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    assert KERNEL_TEXT.search(parts)
