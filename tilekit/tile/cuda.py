"""The CUDA printer: a tile program as CUDA C++ for the sm_80 and sm_90 families.

Every kernel prints as a `__device__ __forceinline__` body function of its parameters, its
block index, its grid size and its shared-memory base, and an `extern "C" __global__` entry
that calls it with `blockIdx.x`, `gridDim.x` and its own shared memory:

    __device__ __forceinline__ void tk_k0_body(const float* __restrict__ t_x, ...,
        const int tk_block, const int tk_nblocks, unsigned char* tk_smem) {
      float* s_x = reinterpret_cast<float*>(tk_smem + 0);      // shared buffers
      ...                                                       // block-level code
      {                                                         // a thread region
        const int tid = threadIdx.x;
        ...
      }
      __syncthreads();                                          // a barrier between regions
    }
    extern "C" __global__ void __launch_bounds__(128, 1) tk_k0(...) {
      TK_STATIC_SMEM(tk_smem, 2048);                            // TK_DYNAMIC_SMEM above 48 KB
      tk_k0_body(t_x, ..., (int)blockIdx.x, (int)gridDim.x, tk_smem);
    }

A kernel that composes others (`CallBody`: tk-ram's programs, tk-grind's device loops) prints
its callees' body functions first; a callee with more threads than the composing block runs
thread-strided, from a variant of its body function (`<name>_body_t`) whose thread regions
take their index from a parameter `tk_tx` instead of `threadIdx.x`; one with fewer threads
runs on the first of them (`if (threadIdx.x < n)`). Which bodies may do either is the shared
rule of `tilekit.schedule.block`.

The file around the kernels (`preamble`, `unit_text`) includes runtime.cuh, the device
helpers every kernel uses.
"""

from __future__ import annotations

from tilekit import __version__
from tilekit.errors import InternalError
from tilekit.tile.cstyle import SIZE_TABLES, CStyle
from tilekit.tile.emit import INDENT, Emitter, check_line, comment_text
from tilekit.tile.expr import BLOCK, NBLOCKS, HALF, Call, Const, as_expr
from tilekit.tile.nodes import STATIC_SMEM_LIMIT, Barrier, Buffer, CallBody, Kernel, Threads

SMEM = "tk_smem"
#: The define that compiles runtime.cuh's grid barrier (cooperative groups) into a file.
GRID_SYNC_DEFINE = "#define TK_USE_GRID_SYNC 1"


class CudaPrinter(CStyle):
    TYPES = {**CStyle.TYPES, "float16": "__half", "bfloat16": "__nv_bfloat16"}
    INTRINSICS = {
        "ldmatrix_x4": "tk_ldmatrix_x4", "ldmatrix_x4_trans": "tk_ldmatrix_x4_trans",
        "mma_m16n8k16_f16": "tk_mma_16816_f16", "mma_m16n8k16_bf16": "tk_mma_16816_bf16",
        "mma_m16n8k8_tf32": "tk_mma_1688_tf32", "to_tf32": "tk_to_tf32",
        "pack16": "tk_pack16", "cp_async16": "tk_cp_async16",
        "cp_async_commit": "tk_cp_async_commit", "ld_acquire": "tk_ld_acquire",
        "spin": "tk_spin", "atomic_add": "atomicAdd", "threadfence": "__threadfence",
        "grid_sync": "tk_grid_sync", "mbar_init": "tk_mbar_init",
        "mbar_fence_init": "tk_mbar_fence_init", "mbar_expect_tx": "tk_mbar_expect_tx",
        "mbar_arrive": "tk_mbar_arrive", "mbar_wait": "tk_mbar_wait",
        **{f"tma_load_{r}d": f"tk_tma_load_{r}d" for r in range(1, 6)},
        **{f"tma_store_{r}d": f"tk_tma_store_{r}d" for r in range(1, 6)},
        "bulk_commit": "tk_bulk_commit", "fence_proxy_async": "tk_fence_proxy_async",
        "named_barrier": "tk_named_barrier",
        "wgmma_desc": "tk_wgmma_desc", "wgmma_fence": "tk_wgmma_fence",
        "wgmma_commit": "tk_wgmma_commit"}
    #: wgmma's element type: runtime.cuh's `tk_wgmma<N, KIND, TRANS_A, TRANS_B>`.
    WGMMA_KIND = {"wgmma_f16": 0, "wgmma_bf16": 1, "wgmma_tf32": 2}
    WARP = {"warp_sum": "tk_warp_sum", "warp_prod": "tk_warp_prod", "warp_max": "tk_warp_max",
            "warp_min": "tk_warp_min"}

    def __init__(self, kernel: Kernel, thread_index: str = "threadIdx.x") -> None:
        super().__init__(kernel)
        self.thread_index = thread_index
        for t in kernel.tables:
            self.buffers[t.name] = Buffer(t.name, "global", "int32", (len(t.values),))

    def intrinsic(self, e: Call, args: list[str]) -> str:
        if e.fn in self.WARP:
            lanes = e.args[1]
            assert isinstance(lanes, Const)
            return f"{self.WARP[e.fn]}<{lanes.value}>({args[0]})"
        if e.fn == "cp_async_wait":
            return f"tk_cp_async_wait<{args[0]}>()"
        if e.fn in ("bulk_wait", "bulk_wait_read"):
            return f"tk_{e.fn}<{_constant(e.args[0], e.fn)}>()"
        if e.fn in self.WGMMA_KIND:     # the shape and the majorness are template arguments
            n, ta, tb = (_constant(a, e.fn) for a in e.args[3:])
            return (f"tk_wgmma<{n}, {self.WGMMA_KIND[e.fn]}, {ta}, {tb}>"
                    f"({args[0]}, {args[1]}, {args[2]})")
        if e.fn == "wgmma_wait":
            return f"tk_wgmma_wait<{_constant(e.args[1], e.fn)}>({args[0]})"
        if e.fn in ("setmaxnreg_inc", "setmaxnreg_dec"):
            return f"tk_{e.fn}<{_constant(e.args[0], e.fn)}>()"
        return super().intrinsic(e, args)

    def s_Threads(self, s: Threads, e: Emitter) -> None:
        with e.block():
            e.line(f"const int {s.var.name} = {self.thread_index};")
            self.stmts(s.body, e)

    def s_Barrier(self, s: Barrier, e: Emitter) -> None:
        e.line("__syncthreads();")

    def s_CallBody(self, s: CallBody, e: Emitter) -> None:
        callee = self.kernel.callee(s.kernel)
        threads = self.kernel.threads
        args = ", ".join([*s.args, self.expr(s.block), self.expr(s.nblocks), SMEM])
        if callee.threads > threads:
            e.line(f"for (int tk_s = 0; tk_s < {callee.threads // threads}; ++tk_s) "
                   f"{callee.name}_body_t({args}, (int)threadIdx.x + tk_s * {threads});")
        elif callee.threads < threads:
            e.line(f"if (threadIdx.x < {callee.threads}) {callee.name}_body({args});")
        else:
            e.line(f"{callee.name}_body({args});")


def _constant(x, fn: str) -> int:
    if not isinstance(x, Const):
        raise InternalError(f"{fn}: a template argument that is not a constant ({x!r})")
    return int(x.value)


# -- kernels -------------------------------------------------------------------------------

def param_declarations(k: Kernel, printer: CStyle, entry: bool = False) -> list[str]:
    """The pointers, then the TMA descriptors: by value into the entry (`__grid_constant__`:
    the copies read the parameter itself), by reference into the body."""
    out = []
    for b in k.params:
        const = "" if b.access == "write" else "const "
        out.append(f"{const}{printer.ctype(b.dtype)}* __restrict__ {b.name}")
    for m in k.tensor_maps:
        out.append(f"const __grid_constant__ tk_tensor_map {m.name}" if entry
                   else f"const tk_tensor_map& {m.name}")
    return out


def body_signature(k: Kernel, printer: CStyle, strided: bool = False) -> str:
    # Shared memory is the one buffer the block's threads write for each other, so it is not
    # __restrict__: under it nvcc moved a thread's load of a flag that only thread 0 writes
    # (split-K's "last block") above the barrier that publishes it (ptxas 13.0; every other
    # thread read the flag unset), as a restrict pointer promises no other writer
    extra = [f"const int {BLOCK.name}", f"const int {NBLOCKS.name}",
             f"unsigned char* {SMEM}"]
    if strided:
        extra.append("const int tk_tx")
    return ", ".join(param_declarations(k, printer) + extra)


def body_function(k: Kernel, strided: bool = False) -> str:
    """`__device__ __forceinline__ void <name>_body(...)` (`_body_t` thread-strided)."""
    p = CudaPrinter(k, "tk_tx" if strided else "threadIdx.x")
    e = Emitter()
    name = f"{k.name}_body_t" if strided else f"{k.name}_body"
    with e.block(f"__device__ __forceinline__ void {name}({body_signature(k, p, strided)})"):
        for b in k.shared:
            note = f"  // {comment_text(b.comment)}" if b.comment else ""
            e.line(f"{p.ctype(b.dtype)}* {b.name} = reinterpret_cast<{p.ctype(b.dtype)}*>"
                   f"({SMEM} + {p.expr(as_expr(b.offset, 'int32'))});{note}")
        p.stmts(k.body, e)
    return e.text()


def entry_function(k: Kernel) -> str:
    """The `extern "C" __global__` entry that runs the body as its own kernel."""
    p = CudaPrinter(k)
    bounds = f"{k.threads}" if k.min_blocks is None else f"{k.threads}, {k.min_blocks}"
    e = Emitter()
    e.line(f'extern "C" __global__ void __launch_bounds__({bounds})')
    with e.block(f"{k.name}({', '.join(param_declarations(k, p, entry=True))})"):
        smem = k.smem_bytes
        if k.calls:                       # composed bodies share one base, always declared
            smem = max(smem, 16)
        raw = f"{SMEM}_raw" if k.smem_slack else SMEM
        if smem > STATIC_SMEM_LIMIT:
            e.line(f"TK_DYNAMIC_SMEM({raw});")
            base = SMEM
        elif smem:
            e.line(f"TK_STATIC_SMEM({raw}, {smem});")
            base = SMEM
        else:
            base = "nullptr"
        if smem and k.smem_slack:         # the base rounded up to its alignment
            e.line(f"unsigned char* {SMEM} = tk_align_smem<{k.smem_align}>({raw});")
        args = ([b.name for b in k.params] + [m.name for m in k.tensor_maps]
                + ["(int)blockIdx.x", "(int)gridDim.x", base])
        e.line(f"{k.name}_body({', '.join(args)});")
    return e.text()


def table_lines(k: Kernel, per_line: int = 8) -> list[str]:
    lines = []
    for t in k.tables:
        lines.append(f"__device__ const int {t.name}[{len(t.values)}] = {{")
        for i in range(0, len(t.values), per_line):
            lines.append(INDENT + ", ".join(str(v) for v in t.values[i:i + per_line]) + ",")
        lines.append("};")
    return lines


def kernel_text(k: Kernel) -> str:
    """The kernel's text after the file's preamble: its comments, the body functions of the
    kernels it composes, its tables, its own body function and its entry."""
    parts = ["".join(f"// {comment_text(c)}\n" for c in k.comments)]
    seen: set[tuple[str, bool]] = set()
    for callee in k.calls:
        strided = callee.threads > k.threads
        if (callee.name, strided) not in seen:
            seen.add((callee.name, strided))
            parts.append(body_function(callee, strided) + "\n")
    if k.tables:
        parts.append("\n".join(table_lines(k)) + "\n")
    parts.append(body_function(k) + "\n" + entry_function(k))
    text = "".join(parts)
    for line in text.splitlines():
        check_line(line)
    return text


def uses_half(k: Kernel) -> bool:
    return any(b.dtype in HALF for b in k.params) or any(uses_half(c) for c in k.calls)


def defines(k: Kernel) -> tuple[str, ...]:
    """Preprocessor lines the kernel's file needs before runtime.cuh."""
    return (GRID_SYNC_DEFINE,) if k.grid_sync else ()


def preamble(extra: list[str], half: bool) -> str:
    lines = [f"// Generated by tk-codegen (tilekit {__version__}). Do not edit.", *extra]
    if half:
        lines.append("#define TK_USE_HALF 1")
    lines.append('#include "runtime.cuh"')
    return "\n".join(lines) + "\n\n"


def file_preamble(name: str, ops, shape: str, half: bool, defs: tuple[str, ...] = ()) -> str:
    """The head of one kernel's source file: a function of its record alone."""
    return preamble(["// " + comment_text(f"kernel {name}: ops {', '.join(ops)}; shape {shape}"),
                     *defs], half)


def unit_text(bodies, defines_of, half: bool, sizes: tuple[int, int] | None = None) -> str:
    """Kernel texts as one translation unit: one preamble with every define they need; with
    `sizes` (how many integers and floats), the size tables the kernels read first."""
    defs = tuple(dict.fromkeys(d for ds in defines_of for d in ds))
    return preamble(list(defs), half) + (size_tables(*sizes) if sizes else "") + \
        "\n".join(bodies)


def size_tables(ints: int, floats: int) -> str:
    """The size tables of a unit whose sizes are parameters (tilekit.codegen.parametric), in
    constant memory: every thread of a kernel reads the same entries, which the constant
    cache broadcasts. The runtime sets them after loading the unit (and the emulation's
    harness before its launches)."""
    return "".join(f"__constant__ {CudaPrinter.TYPES[dtype]} {name}[{max(n, 1)}];\n"
                   for (name, dtype), n in zip(SIZE_TABLES, (ints, floats))) + "\n"


__all__ = ["CudaPrinter", "GRID_SYNC_DEFINE", "SMEM", "body_function", "defines",
           "entry_function", "file_preamble", "kernel_text", "preamble", "size_tables",
           "unit_text", "uses_half"]
