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

import functools
from typing import Sequence

from tilekit import __version__
from tilekit.errors import InternalError
from tilekit.tile.cstyle import SIZE_TABLES, CStyle
from tilekit.tile.emit import INDENT, Emitter, check_line, comment_text
from tilekit.tile.expr import BLOCK, NBLOCKS, Call, Const, Expr, as_expr
from tilekit.tile.functions import FUNCTIONS
from tilekit.tile.nodes import Barrier, Buffer, CallBody, Kernel, Seq, Threads

SMEM = "tk_smem"
HELPERS = "runtime_cpu.h"
#: Block memory above this many bytes comes from each thread's arena (runtime_cpu.h
#: tk_block_memory), not the stack: a worker thread's stack may be as small as 2 MiB.
STACK_BLOCK_MEMORY = 32 * 1024


class CppPrinter(CStyle):
    TYPES = {**CStyle.TYPES, "float16": "__half", "bfloat16": "__nv_bfloat16"}
    #: A grid barrier of a kernel run as one block (a device loop on the CPU) orders nothing.
    INTRINSICS = {}
    RECIPROCAL_DIVISION = True
    #: runtime_cpu.h's straight-line versions: inlined into `simd` loops, in vector lanes.
    FLOAT_MATH = {"exp": "tk_expf", "tanh": "tk_tanhf", "erf": "tk_erff",
                  "sigmoid": "tk_sigmoidf"}

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        for t in kernel.tables:
            self.buffers[t.name] = Buffer(t.name, "global", "int32", (len(t.values),))

    def unroll_pragma(self, e: Emitter, factor: int = 0) -> None:
        pass        # -O3 unrolls constant trip counts by itself

    def simd_pragma(self, e: Emitter) -> None:
        e.line("#pragma omp simd")

    def intrinsic(self, e: Call, args: list[str]) -> str:
        if e.fn == "grid_sync":     # the team's barrier (runtime_cpu.h)
            return "tk_grid_sync()"
        if e.fn in ("gemm_micro", "gemm_micro_rows"):
            mr, nr, ldb = e.args[:3]
            assert isinstance(mr, Const) and isinstance(nr, Const) and isinstance(ldb, Const)
            shape = f"{mr.value}, {nr.value}" + (f", {ldb.value}" if ldb.value != nr.value
                                                 else "")
            return f"tk_{e.fn}<{shape}>({', '.join(args[3:])})"
        if e.fn == "prefetch":
            return f"__builtin_prefetch({args[0]})"
        n = FUNCTIONS[e.fn].templated if e.fn in FUNCTIONS else 0
        if n:       # the runtime's templates (runtime_cpu.h): the leading constants
            assert all(isinstance(a, Const) for a in e.args[:n])
            shape = ", ".join(str(a.value) for a in e.args[:n])
            return f"tk_{e.fn}<{shape}>({', '.join(args[n:])})"
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
                   f"({SMEM} + {p.expr(as_expr(b.offset, 'int32'))});{note}")
        p.stmts(k.body, e)
    return e.text()


def entry_function(k: Kernel, smem: int | Expr | None = None) -> str:
    """The kernel's `extern "C"` entry: its grid's blocks over the cores (a persistent
    kernel's, `grid_sync`: one per thread of the team, whose barrier its grid barriers are,
    whatever grid it records). `smem`: the block
    memory its body needs (default: the kernel's own); the grid and `smem` may be expressions
    of the unit's size tables (then at least two blocks, and the memory from the arena)."""
    p = CppPrinter(k)
    e = Emitter()
    smem = max(k.smem_bytes, 16) if smem is None else smem
    grid = p.expr(as_expr(k.grid, "int32"))
    several = not isinstance(k.grid, int) or k.grid > 1
    args = [b.name for b in k.params] + ["tk_b", grid, SMEM]
    with e.block(f'extern "C" void {k.name}({", ".join(_params(k, p))})'):
        if k.grid_sync:     # a persistent kernel: its blocks are the team's threads
            e.line("tk_barrier tk_bar;")
            e.line("#pragma omp parallel")
            with e.block():
                e.line(f"unsigned char* {SMEM} = tk_block_memory({p.expr(as_expr(smem))});")
                e.line("tk_team_enter(tk_bar, omp_get_num_threads());")
                team = [b.name for b in k.params] + ["omp_get_thread_num()",
                                                     "omp_get_num_threads()", SMEM]
                e.line(f"{k.name}_body({', '.join(team)});")
                e.line("tk_team_leave();")
        elif not isinstance(smem, int) or smem > STACK_BLOCK_MEMORY:  # each thread's arena
            if several:
                e.line("#pragma omp parallel")
            with e.block():
                e.line(f"unsigned char* {SMEM} = tk_block_memory({p.expr(as_expr(smem))});")
                if several:
                    e.line("#pragma omp for schedule(static)")
                with e.block(f"for (int tk_b = 0; tk_b < {grid}; ++tk_b)"):
                    e.line(f"{k.name}_body({', '.join(args)});")
        else:
            if several:
                e.line("#pragma omp parallel for schedule(static)")
            with e.block(f"for (int tk_b = 0; tk_b < {grid}; ++tk_b)"):
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


def kernel_text(k: Kernel, smem: int | Expr | None = None) -> str:
    """The kernel's text after the file's preamble (as tilekit.tile.cuda.kernel_text);
    `smem` as `entry_function` takes it."""
    parts = ["".join(f"// {comment_text(c)}\n" for c in k.comments)]
    seen: set[str] = set()
    for callee in k.calls:
        if callee.name not in seen:
            seen.add(callee.name)
            parts.append(body_function(callee) + "\n")
    if k.tables:
        parts.append("\n".join(table_lines(k)) + "\n")
    parts.append(body_function(k) + "\n" + entry_function(k, smem))
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


def unit_text(bodies, sizes: tuple[int, int] | None = None) -> str:
    """One translation unit of kernel texts; with `sizes` (how many integers and floats),
    the size tables the kernels read and their setter first."""
    return preamble([]) + (size_tables(*sizes) if sizes else "") + "\n".join(bodies)


def size_tables(ints: int, floats: int) -> str:
    """The size tables of a unit whose sizes are parameters, and `tk_set_sizes`, which fills
    them (the caller's arrays of `ints` and `floats` values) before a run."""
    (iname, itype), (fname, ftype) = SIZE_TABLES
    p = _sizes_printer()
    return (f"static {p.ctype(itype)} {iname}[{max(ints, 1)}];\n"
            f"static {p.ctype(ftype)} {fname}[{max(floats, 1)}];\n"
            f'extern "C" void tk_set_sizes(const {p.ctype(itype)}* i, const {p.ctype(ftype)}* f) {{\n'
            f"  for (int k = 0; k < {ints}; ++k) {iname}[k] = i[k];\n"
            f"  for (int k = 0; k < {floats}; ++k) {fname}[k] = f[k];\n"
            "}\n\n")


def size_expr(e: Expr | int) -> str:
    """A size of the program entries (a grid, the block memory): a constant, or an
    expression of the size tables."""
    return _sizes_printer().expr(as_expr(e, "int32"))


@functools.cache
def _sizes_printer() -> CppPrinter:
    """A printer of no kernel: what it prints outside kernels reads only the size tables
    (every printer knows them) and constants."""
    return CppPrinter(Kernel("tk_sizes", (), (), Seq(()), 1, 1))


# -- the CPU unit's program entries (tilekit.codegen.cpu_program decides them) ----------

#: Templates of the program entry: a body called with its pointers from the argument table.
CALL_TEMPLATES = """
#include <cstddef>
#include <tuple>
#include <utility>

template <typename... P> constexpr std::size_t tk_arity(void (*)(P...)) { return sizeof...(P); }

template <auto F, typename... P, std::size_t... I>
static inline void tk_call_at(void (*)(P...), void* const* a, int b, int n, unsigned char* s,
                              std::index_sequence<I...>) {
  F(static_cast<std::tuple_element_t<I, std::tuple<P...>>>(a[I])..., b, n, s);
}

// One block of a kernel: its body with the table's pointers cast to its parameter types.
template <auto F>
static inline void tk_call(void* const* a, int b, int n, unsigned char* s) {
  tk_call_at<F>(F, a, b, n, s, std::make_index_sequence<tk_arity(F) - 3>{});
}
"""



#: One persistent segment of a plan: thread v walks vEU v's items.
RUN_PLAN = """
extern "C" int tk_run_plan(void* const* tk_a, int tk_segment) {
  const int tk_veus = tk_plan_veus[tk_segment];
  const int* tk_items = tk_plan_items[tk_segment];
  const int* tk_start = tk_plan_start[tk_segment];
  if (omp_get_max_threads() < tk_veus) return 1;   // fewer threads than vEUs: op by op
  int tk_short = 0;
  for (int i = tk_start[0]; i < tk_start[tk_veus]; ++i)
    tk_counters_at(tk_items[3 * i]).done.store(0, std::memory_order_relaxed);
#pragma omp parallel num_threads(tk_veus)
  {
    if (omp_get_num_threads() < tk_veus) {
#pragma omp master
      tk_short = 1;
    } else {
      unsigned char* tk_smem = tk_block_memory(SMEM_BYTES);
      const int v = omp_get_thread_num();
      for (int i = tk_start[v]; i < tk_start[v + 1]; ++i) {
        const int k = tk_items[3 * i], first = tk_items[3 * i + 1], count = tk_items[3 * i + 2];
        if (first < 0) {             // a wait: acquire the whole operator
          tk_wait_for(tk_counters_at(k), (unsigned)count);
          continue;
        }
        tk_blocks(k, tk_a, first, count, tk_smem);
        tk_signal(tk_counters_at(k), (unsigned)count);
      }
    }
  }
  return tk_short;
}
"""


def _body_call(entry: str, at: int, grid: int | Expr, block: str) -> str:
    return f"tk_call<{entry}_body>(tk_a + {at}, {block}, {size_expr(grid)}, tk_smem)"


#: A thread's run of a kernel's blocks, as OpenMP's static schedule shares them (outside a
#: parallel region, all of them).
SHARE = """
static inline void tk_share(int n, int& lo, int& hi) {
  const int threads = omp_get_num_threads(), me = omp_get_thread_num();
  const int q = n / threads, r = n % threads;
  lo = me * q + (me < r ? me : r);
  hi = lo + q + (me < r ? 1 : 0);
}
"""


def program_entries(calls: Sequence[tuple[str, int, int | Expr, str, bool]],
                    smem: int | Expr,
                    plan: tuple | None = None) -> str:
    """The CPU unit's program entries (`tk_run`, and `tk_run_plan` for a plan): `calls` are
    each kernel's (entry, offset of its pointers in the argument table, blocks, who runs
    them: `share` shared out over the team, `first` the team's first thread, `team` one per
    thread (a persistent kernel, whose grid barriers are the team's), whether each thread
    walks its run of them backwards), `smem` the block memory a body needs, `plan` tk-ram's
    (operators, segments) or None. A grid and `smem` may be expressions of the size tables
    (tilekit.codegen.parametric).
    tilekit.codegen.cpu_program decides all of it; this prints it."""
    lines = [CALL_TEMPLATES, SHARE]
    lines.append("// A kernel inside the team: its blocks run as `mode` says, no barrier after.")
    lines.append("static inline void tk_team_kernel(int tk_k, void* const* tk_a, "
                 "unsigned char* tk_smem) {")
    lines.append("  switch (tk_k) {")
    for i, (entry, at, grid, mode, backward) in enumerate(calls):
        lines.append(f"  case {i}: {{")
        if mode == "team":
            # a persistent kernel: each thread one block, its grid barriers the team's
            lines.append("    tk_call<" + entry + "_body>(tk_a + " + str(at)
                         + ", omp_get_thread_num(), omp_get_num_threads(), tk_smem);")
        elif mode == "share":
            lines.append("    int tk_lo, tk_hi;  // this thread's run of blocks")
            lines.append(f"    tk_share({size_expr(grid)}, tk_lo, tk_hi);")
            loop = "int tk_b = tk_hi - 1; tk_b >= tk_lo; --tk_b" if backward \
                else "int tk_b = tk_lo; tk_b < tk_hi; ++tk_b"
            lines.append(f"    for ({loop}) {_body_call(entry, at, grid, 'tk_b')};")
        elif not isinstance(grid, int) or grid > 1:
            # the first thread: such kernels in a row need no barrier
            lines.append(f"    if (omp_get_thread_num() == 0) for (int tk_b = 0; tk_b < "
                         f"{size_expr(grid)}; ++tk_b) {_body_call(entry, at, grid, 'tk_b')};")
        else:
            lines.append(f"    if (omp_get_thread_num() == 0) {_body_call(entry, at, grid, '0')};")
        lines.append("  } break;")
    lines.append("  }")
    lines.append("}")
    lines.append("")
    lines.append("// Blocks first .. first + count - 1 of a kernel on the calling thread.")
    lines.append("static inline void tk_blocks(int tk_k, void* const* tk_a, int tk_first, "
                 "int tk_count, unsigned char* tk_smem) {")
    lines.append("  switch (tk_k) {")
    for i, (entry, at, grid, *_) in enumerate(calls):
        lines.append(f"  case {i}: for (int tk_b = tk_first; tk_b < tk_first + tk_count; "
                     f"++tk_b) {_body_call(entry, at, grid, 'tk_b')}; break;")
    lines.append("  }")
    lines.append("}")
    lines.append(f"""
extern "C" void tk_run(void* const* tk_a, const int* tk_seq, const unsigned char* tk_wait,
                       int tk_n, int tk_parallel, double* tk_times) {{
  tk_barrier tk_bar;
#pragma omp parallel if (tk_parallel)
  {{
    unsigned char* tk_smem = tk_block_memory({size_expr(smem)});
    tk_team_enter(tk_bar, omp_get_num_threads());
    if (tk_times) {{
      tk_grid_sync();
#pragma omp master
      tk_times[0] = omp_get_wtime();
    }}
    for (int tk_i = 0; tk_i < tk_n; ++tk_i) {{
      tk_team_kernel(tk_seq[tk_i], tk_a, tk_smem);
      if (tk_wait[tk_i] || tk_times) {{
        tk_grid_sync();
        if (tk_times) {{
#pragma omp master
          tk_times[tk_i + 1] = omp_get_wtime();
        }}
      }}
    }}
    tk_team_leave();
  }}
}}
""")
    if plan is not None:
        lines.append(_plan_source(plan[0], plan[1], smem))
    return "\n".join(lines)


def _plan_source(operators, segments, smem: int) -> str:
    """The items of every segment as tables, a progress counter per packed operator, and
    `tk_run_plan` walking them."""
    index = {k: i for i, k in enumerate(operators)}
    out = [f"static tk_progress tk_counters[{max(1, len(operators))}];",
           "// the counter of each kernel (kernels of no persistent segment have none)",
           "static const int tk_counter_of[] = {"
           + ", ".join(str(index.get(k, 0)) for k in range(max(operators, default=0) + 1))
           + "};",
           "static inline tk_progress& tk_counters_at(int k) "
           "{ return tk_counters[tk_counter_of[k]]; }"]
    for s, seg in enumerate(segments):
        flat, starts = [], [0]
        for items in seg:
            for k, first, count in items:
                flat += [k, first, count]
            starts.append(len(flat) // 3)
        out.append(f"static const int tk_plan_{s}_items[] = {{{_ints(flat or [0])}}};")
        out.append(f"static const int tk_plan_{s}_start[] = {{{_ints(starts)}}};")
    names = range(len(segments))
    out.append("static const int* const tk_plan_items[] = {"
               + ", ".join(f"tk_plan_{s}_items" for s in names) + "};")
    out.append("static const int* const tk_plan_start[] = {"
               + ", ".join(f"tk_plan_{s}_start" for s in names) + "};")
    out.append(f"static const int tk_plan_veus[] = {{{_ints(len(seg) for seg in segments)}}};")
    out.append(RUN_PLAN.replace("SMEM_BYTES", str(smem)))
    return "\n".join(out)


def _ints(values) -> str:
    """Integers for a C array initialiser, a line break every 24 (check_line's limit)."""
    values = [str(v) for v in values]
    return ",\n  ".join(", ".join(values[i:i + 24]) for i in range(0, len(values), 24))


__all__ = ["CppPrinter", "HELPERS", "body_function", "entry_function",
           "file_preamble", "kernel_text", "preamble", "program_entries", "size_expr",
           "size_tables", "unit_text"]
