"""The C++ printer: a tile program as C++ for CPUs (g++ or clang++, OpenMP).

A kernel prints as a body function, the same as on the GPU (its parameters, its block
index, its grid size and a base of `smem_bytes` bytes of block-local memory), and an
`extern "C"` entry that runs the grid's blocks over the machine's cores:

    static inline void tk_k0_body(const float* __restrict__ t_x, ..., const int tk_block,
                                  const int tk_nblocks, unsigned char* __restrict__ tk_smem) {
      float* s_x = reinterpret_cast<float*>(tk_smem + 0);       // block-local buffers
      ...
      for (int tid = 0; tid < 128; ++tid) { ... }               // a thread region, serial
    }
    extern "C" void tk_k0(const float* __restrict__ t_x, ...) {
    #pragma omp parallel for schedule(static)
      for (int tk_b = 0; tk_b < 96; ++tk_b) {
        alignas(64) unsigned char tk_smem[2048];
        tk_k0_body(t_x, ..., tk_b, 96, tk_smem);
      }
    }

The program reaches this printer lowered for the CPU (tilekit.tile.passes.lower_for_cpu:
thread regions are serial loops, barriers gone), so nothing here knows about threads; a
shared buffer is the block's own memory, sized and laid out as on the GPU (a block's tile of
an input, staged once per reduction step, stays in the cache the GPU's shared memory stands
for). A kernel that composes others (`CallBody`) calls their body functions. Each kernel
includes runtime_cpu.h, the same helpers as the device's.
"""

from __future__ import annotations

from tilekit import __version__
from tilekit.errors import InternalError
from tilekit.tile.cstyle import CStyle
from tilekit.tile.emit import INDENT, Emitter, check_line, comment_text
from tilekit.tile.expr import BLOCK, NBLOCKS, Call, Const
from tilekit.tile.nodes import Barrier, Buffer, CallBody, Kernel, Threads

SMEM = "tk_smem"
HELPERS = "runtime_cpu.h"
#: Block memory above this many bytes comes from each thread's arena (runtime_cpu.h
#: tk_block_memory), not the stack: a worker thread's stack may be as small as 2 MiB.
STACK_BLOCK_MEMORY = 32 * 1024


class CppPrinter(CStyle):
    TYPES = {**CStyle.TYPES, "float16": "__half", "bfloat16": "__nv_bfloat16"}
    #: A grid barrier of a kernel run as one block (a device loop on the CPU) orders nothing.
    INTRINSICS = {}
    #: runtime_cpu.h's straight-line versions: inlined into `simd` loops, in vector lanes.
    FLOAT_MATH = {"exp": "tk_expf", "tanh": "tk_tanhf", "erf": "tk_erff",
                  "sigmoid": "tk_sigmoidf"}

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        for t in kernel.tables:
            self.buffers[t.name] = Buffer(t.name, "global", "int32", (len(t.values),))

    def unroll_pragma(self, e: Emitter) -> None:
        pass        # -O3 unrolls constant trip counts by itself

    def simd_pragma(self, e: Emitter) -> None:
        e.line("#pragma omp simd")

    def intrinsic(self, e: Call, args: list[str]) -> str:
        if e.fn == "grid_sync":
            return "(void)0"
        if e.fn in ("gemm_micro", "gemm_micro_rows"):
            mr, nr = e.args[0], e.args[1]
            assert isinstance(mr, Const) and isinstance(nr, Const)
            return f"tk_{e.fn}<{mr.value}, {nr.value}>({', '.join(args[2:])})"
        if e.fn == "pack_row":
            assert isinstance(e.args[0], Const)
            return f"tk_pack_row<{e.args[0].value}>({', '.join(args[1:])})"
        raise InternalError(f"{e.fn} reached the C++ printer (no CPU form)")

    def s_Threads(self, s: Threads, e: Emitter) -> None:
        raise InternalError("a thread region reached the C++ printer (serialize it first)")

    def s_Barrier(self, s: Barrier, e: Emitter) -> None:
        raise InternalError("a barrier reached the C++ printer (serialize the threads first)")

    def s_CallBody(self, s: CallBody, e: Emitter) -> None:
        args = ", ".join([*s.args, self.expr(s.block), self.expr(s.nblocks), SMEM])
        e.line(f"{s.kernel}_body({args});")


def _params(k: Kernel, p: CStyle) -> list[str]:
    return [f"{'' if b.access == 'write' else 'const '}{p.ctype(b.dtype)}* __restrict__ {b.name}"
            for b in k.params]


def body_function(k: Kernel) -> str:
    p = CppPrinter(k)
    e = Emitter()
    sig = ", ".join(_params(k, p) + [f"const int {BLOCK.name}", f"const int {NBLOCKS.name}",
                                     f"unsigned char* __restrict__ {SMEM}"])
    with e.block(f"static inline void {k.name}_body({sig})"):
        e.line(f"(void){BLOCK.name}; (void){NBLOCKS.name}; (void){SMEM};")
        for b in k.shared:
            note = f"  // {comment_text(b.comment)}" if b.comment else ""
            e.line(f"{p.ctype(b.dtype)}* {b.name} = reinterpret_cast<{p.ctype(b.dtype)}*>"
                   f"({SMEM} + {b.offset});{note}")
        p.stmts(k.body, e)
    return e.text()


def entry_function(k: Kernel) -> str:
    p = CppPrinter(k)
    e = Emitter()
    smem = max(k.smem_bytes, 16)
    args = [b.name for b in k.params] + ["tk_b", str(k.grid), SMEM]
    with e.block(f'extern "C" void {k.name}({", ".join(_params(k, p))})'):
        if smem > STACK_BLOCK_MEMORY:  # each thread's arena, taken once per call
            if k.grid > 1:
                e.line("#pragma omp parallel")
            with e.block():
                e.line(f"unsigned char* {SMEM} = tk_block_memory({smem});")
                if k.grid > 1:
                    e.line("#pragma omp for schedule(static)")
                with e.block(f"for (int tk_b = 0; tk_b < {k.grid}; ++tk_b)"):
                    e.line(f"{k.name}_body({', '.join(args)});")
        else:
            if k.grid > 1:
                e.line("#pragma omp parallel for schedule(static)")
            with e.block(f"for (int tk_b = 0; tk_b < {k.grid}; ++tk_b)"):
                e.line(f"alignas(64) unsigned char {SMEM}[{smem}];")
                e.line(f"{k.name}_body({', '.join(args)});")
    return e.text()


def table_lines(k: Kernel, per_line: int = 8) -> list[str]:
    lines = []
    for t in k.tables:
        lines.append(f"static const int {t.name}[{len(t.values)}] = {{")
        for i in range(0, len(t.values), per_line):
            lines.append(INDENT + ", ".join(str(v) for v in t.values[i:i + per_line]) + ",")
        lines.append("};")
    return lines


def kernel_text(k: Kernel) -> str:
    """The kernel's text after the file's preamble (as tilekit.tile.cuda.kernel_text)."""
    parts = ["".join(f"// {comment_text(c)}\n" for c in k.comments)]
    seen: set[str] = set()
    for callee in k.calls:
        if callee.name not in seen:
            seen.add(callee.name)
            parts.append(body_function(callee) + "\n")
    if k.tables:
        parts.append("\n".join(table_lines(k)) + "\n")
    parts.append(body_function(k) + "\n" + entry_function(k))
    text = "".join(parts)
    for line in text.splitlines():
        check_line(line)
    return text


def preamble(extra: list[str]) -> str:
    lines = [f"// Generated by tk-codegen (tilekit {__version__}). Do not edit.", *extra,
             f'#include "{HELPERS}"']
    return "\n".join(lines) + "\n\n"


def file_preamble(name: str, ops, shape: str) -> str:
    """The head of one kernel's source file: a function of its record alone."""
    return preamble(["// " + comment_text(f"kernel {name}: ops {', '.join(ops)}; shape {shape}")])


def unit_text(bodies) -> str:
    return preamble([]) + "\n".join(bodies)


__all__ = ["CppPrinter", "HELPERS", "body_function", "entry_function", "file_preamble",
           "kernel_text", "preamble", "unit_text"]
