"""The functions a tile program may call, as data: result types, NumPy semantics, properties.

One record per function, read by the verifier (arity), the interpreter (the NumPy
implementation and, for warp collectives and intrinsics, their own semantics in
`tilekit.tile.interp`) and the printers (each target has its own spelling table:
`tilekit.tile.cuda.SPELLING`, `tilekit.tile.cpp.SPELLING`). An unknown name is an error that
lists the known ones.

Families:

- `math`: float functions of float arguments (`exp`, `tanh`, ...), the result in the
  argument's float type (float32 or float64);
- `same`: the argument's type (`max`, `min`, `abs`, `sign`, `floordiv`, `floormod`);
- `predicate`: bool (`isnan`, `isinf`, `in_range`);
- `warp`: a reduction across the lanes of a lane group, by warp shuffles (every lane of the
  warp calls it); the second argument is the group's width, a constant;
- `intrinsic`: an instruction with effects (copies, barriers of its own, tensor-core
  instructions, atomics): a statement (`Evaluate`) or a value with effects, never moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilekit.errors import InternalError


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    family: str
    result: str | None = None       # a fixed result dtype (None: by family)
    gpu_only: bool = False          # no CPU spelling: a CPU program never calls it
    cpu_only: bool = False          # no GPU spelling: a CUDA program never calls it
    templated: int = 0              # leading arguments that are C++ template arguments


def _math(*names: str) -> tuple[Function, ...]:
    return tuple(Function(n, 1, "math") for n in names)


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    *_math("exp", "log", "tanh", "erf", "sqrt", "rsqrt", "sigmoid", "floor", "ceil", "rint",
           "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
           "atanh"),
    Function("pow", 2, "math"), Function("fmod", 2, "math"),
    Function("max", 2, "same"), Function("min", 2, "same"),
    Function("abs", 1, "same"), Function("sign", 1, "same"),
    Function("floordiv", 2, "same"), Function("floormod", 2, "same"),
    Function("isnan", 1, "predicate"), Function("isinf", 1, "predicate"),
    # 0 <= i < n (one unsigned compare)
    Function("in_range", 2, "predicate"),
    Function("warp_sum", 2, "warp", gpu_only=True), Function("warp_prod", 2, "warp", gpu_only=True),
    Function("warp_max", 2, "warp", gpu_only=True), Function("warp_min", 2, "warp", gpu_only=True),
    # tensor cores and asynchronous copies (sm_80+): runtime.cuh's helpers
    Function("ldmatrix_x4", 2, "intrinsic", "int32", True),
    Function("ldmatrix_x4_trans", 2, "intrinsic", "int32", True),
    Function("mma_m16n8k16_f16", 3, "intrinsic", "int32", True),
    Function("mma_m16n8k16_bf16", 3, "intrinsic", "int32", True),
    Function("mma_m16n8k8_tf32", 3, "intrinsic", "int32", True),
    Function("to_tf32", 1, "intrinsic", "uint32", True),
    Function("pack16", 2, "intrinsic", "uint32", True),
    Function("cp_async16", 3, "intrinsic", "int32", True),
    Function("cp_async_commit", 0, "intrinsic", "int32", True),
    Function("cp_async_wait", 1, "intrinsic", "int32", True),
    # Hopper (sm_90; wgmma and setmaxnreg sm_90a): mbarriers, TMA box copies into swizzled
    # shared memory, warpgroup MMA reading shared memory through matrix descriptors.
    # mbarrier objects are 8-byte shared words: init(bar, arrivals), expect_tx(bar, bytes)
    # (an arrival that also expects `bytes` of copies), arrive(bar), wait(bar, parity).
    Function("mbar_init", 2, "intrinsic", "int32", True),
    Function("mbar_fence_init", 0, "intrinsic", "int32", True),
    Function("mbar_expect_tx", 2, "intrinsic", "int32", True),
    Function("mbar_arrive", 1, "intrinsic", "int32", True),
    Function("mbar_wait", 2, "intrinsic", "int32", True),
    # tma_load_<r>d(dst, tensor map, bar, c0 .. c<r-1>): the box at coordinates c (innermost
    # first) of the map's tensor into shared memory at dst (zeros outside the tensor), in the
    # map's swizzled layout; its bytes complete on `bar`
    *(Function(f"tma_load_{r}d", 3 + r, "intrinsic", "int32", True) for r in range(1, 6)),
    # tma_store_<r>d(tensor map, src, c0 .. c<r-1>): the map's box at coordinates c of its
    # tensor from shared memory at src (in the map's swizzled layout; elements outside the
    # tensor are not written), asynchronously, in the issuing thread's open bulk group;
    # bulk_commit() closes the group; bulk_wait(n) / bulk_wait_read(n) (n a constant) wait
    # until at most n of the thread's groups are incomplete / still reading shared memory;
    # fence_proxy_async() orders the thread's shared-memory writes before the async proxy's
    # reads; named_barrier(id, threads): a barrier of `threads` threads on barrier `id` (1..15)
    *(Function(f"tma_store_{r}d", 2 + r, "intrinsic", "int32", True) for r in range(1, 6)),
    Function("bulk_commit", 0, "intrinsic", "int32", True),
    Function("bulk_wait", 1, "intrinsic", "int32", True),
    Function("bulk_wait_read", 1, "intrinsic", "int32", True),
    Function("fence_proxy_async", 0, "intrinsic", "int32", True),
    Function("named_barrier", 2, "intrinsic", "int32", True),
    # wgmma_desc(addr, leading byte offset, stride byte offset): the 64-bit shared-memory
    # matrix descriptor (128-byte swizzle) of the tile that starts at addr
    Function("wgmma_desc", 3, "intrinsic", "int64", True),
    # wgmma_<type>(accumulator row, desc a, desc b, N, trans a, trans b): D (64 x N, fp32)
    # += A (64 x K) B (K x N), K 16 (f16, bf16) or 8 (tf32: both operands K-major, trans 0);
    # N, trans a and trans b are constants
    Function("wgmma_f16", 6, "intrinsic", "int32", True),
    Function("wgmma_bf16", 6, "intrinsic", "int32", True),
    Function("wgmma_tf32", 6, "intrinsic", "int32", True),
    # wgmma_fence(acc) before the first wgmma that reads or writes `acc`, wgmma_commit() after
    # a batch, wgmma_wait(acc, n) until at most n batches are in flight (acc readable again)
    Function("wgmma_fence", 1, "intrinsic", "int32", True),
    Function("wgmma_commit", 0, "intrinsic", "int32", True),
    Function("wgmma_wait", 2, "intrinsic", "int32", True),
    # a warpgroup's register budget (setmaxnreg.inc / .dec; the count a constant)
    Function("setmaxnreg_inc", 1, "intrinsic", "int32", True),
    Function("setmaxnreg_dec", 1, "intrinsic", "int32", True),
    # blocks that wait on each other (progress counters, grid barriers)
    Function("ld_acquire", 1, "intrinsic", "uint32", True),
    Function("spin", 0, "intrinsic", "int32", True),
    Function("atomic_add", 2, "intrinsic", "uint32", True),
    Function("threadfence", 0, "intrinsic", "int32", True),
    Function("grid_sync", 0, "intrinsic", "int32", True),
    # the CPU's register-tile GEMM step (runtime_cpu.h tk_gemm_micro): gemm_micro(MR, NR, LDB,
    # &a_panel, &b_panel, kc, &c, ldc, accumulate) with MR, NR and LDB (B's row stride: NR, or
    # a wider panel's) constants
    Function("gemm_micro", 9, "intrinsic", "int32", cpu_only=True, templated=3),
    # the same with A read unpacked: gemm_micro_rows(MR, NR, LDB, &a_row0, lda, rows,
    # &b_panel, kc, &c, ldc, accumulate)
    Function("gemm_micro_rows", 11, "intrinsic", "int32", cpu_only=True, templated=3),
    # either, prefetching the line at &ahead + k * STEP on each step k (a weight's next
    # panel: runtime_cpu.h tk_gemm_micro_ahead): the arguments above with the constant STEP
    # fourth and &ahead last
    Function("gemm_micro_ahead", 11, "intrinsic", "int32", cpu_only=True, templated=4),
    Function("gemm_micro_rows_ahead", 13, "intrinsic", "int32", cpu_only=True, templated=4),
    # either, packing its B micro-panel as it reads it (runtime_cpu.h tk_gemm_micro_fill):
    # gemm_micro_fill(MR, NR, LDB, STEP, GATHER, &a_panel, &src, &rows, &bits, &lanes, pad,
    # &b_panel, kc, &c, ldc, accumulate, &ahead) with the first five constants; row k of the
    # panel is src[rows[k] + i] (GATHER: src[rows[k] + lanes[i]]) for the lanes i of bits[k],
    # pad elsewhere. gemm_micro_rows_fill takes &a_row0, lda, rows for &a_panel.
    Function("gemm_micro_fill", 17, "intrinsic", "int32", cpu_only=True, templated=5),
    Function("gemm_micro_rows_fill", 19, "intrinsic", "int32", cpu_only=True, templated=5),
    # the tile of a ragged last micro-panel, A packed (runtime_cpu.h tk_gemm_micro_ragged):
    # gemm_micro_ragged(MR, NR, STEP, &a_panel, &b_panel, kc, &c, ldc, accumulate, cols,
    # &ahead): the panel's first `cols` columns (< NR, B's row stride NR), its whole vectors
    # of them as gemm_micro does, the rest one FMA of MR rows a column per step
    Function("gemm_micro_ragged", 11, "intrinsic", "int32", cpu_only=True, templated=3),
    # the lanes of an int32 row of W (a constant, at most 64) that are not 0, as the bits of
    # an int64 (runtime_cpu.h tk_lane_bits): lane_bits(W, &ok)
    Function("lane_bits", 2, "intrinsic", "int64", cpu_only=True, templated=1),
    # a packed panel's row from contiguous values under a lane mask (runtime_cpu.h
    # tk_pack_row): pack_row(W, &dst, &src, &ok, pad, &ahead) with W a constant
    Function("pack_row", 6, "intrinsic", "int32", cpu_only=True, templated=1),
    # the same from values apart (runtime_cpu.h tk_gather_row): gather_row(W, &dst, &src,
    # &offsets, &ok, pad) with W a constant, offsets int32 from src
    Function("gather_row", 6, "intrinsic", "int32", cpu_only=True, templated=1),
    # a hint that an address will be read soon (__builtin_prefetch: never faults, wherever
    # it points): prefetch(&x)
    Function("prefetch", 1, "intrinsic", "int32", cpu_only=True),
    # a weight's micro-panel of W rows or columns, packed once (runtime_cpu.h
    # tk_packed_panels): packed_panels(W, &slot, &w, n, k, ldn, ldk, panel, k0) with W a
    # constant and slot the block's int64 cache of the pack's address; the address of the
    # panel's step k0
    Function("packed_panels", 9, "intrinsic", "ptr", cpu_only=True, templated=1),
)}

#: Calls every lane of a warp must make together (never in divergent code).
WARP_COLLECTIVES = frozenset(n for n, f in FUNCTIONS.items() if f.family == "warp") | {
    "ldmatrix_x4", "ldmatrix_x4_trans", "mma_m16n8k16_f16", "mma_m16n8k16_bf16",
    "mma_m16n8k8_tf32", "wgmma_f16", "wgmma_bf16", "wgmma_tf32", "wgmma_fence", "wgmma_commit", "wgmma_wait",
    "setmaxnreg_inc", "setmaxnreg_dec"}
#: Warpgroup-collective tensor-core instructions (wgmma): every thread of a warpgroup of four
#: consecutive warps, starting at a warp index divisible by 4, calls them together.
WGMMA = frozenset({"wgmma_f16", "wgmma_bf16", "wgmma_tf32"})
#: The tensor map argument's position in each TMA copy.
TMA_LOADS = {f"tma_load_{r}d": r for r in range(1, 6)}
#: TMA stores by name: their rank.
TMA_STORES = {f"tma_store_{r}d": r for r in range(1, 6)}

#: Reduction assignment -> its warp reducer.
WARP_REDUCERS = {"+=": "warp_sum", "*=": "warp_prod", "max=": "warp_max", "min=": "warp_min"}


def function(name: str) -> Function:
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise InternalError(f"tile program calls unknown function {name!r} "
                            f"(known: {', '.join(sorted(FUNCTIONS))})") from None


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _erf(x):
    from tilekit.expr.ops import FUNCTIONS as EXPR_FUNCTIONS
    return np.asarray(EXPR_FUNCTIONS["erf"].numpy(x)).astype(x.dtype)


def _nan_max(a, b):
    return np.where(np.isnan(a) | (a > b), a, b) if a.dtype.kind == "f" else np.maximum(a, b)


def _nan_min(a, b):
    return np.where(np.isnan(a) | (a < b), a, b) if a.dtype.kind == "f" else np.minimum(a, b)


def _floordiv(a, b):
    if a.dtype.kind in "iu":
        return np.floor_divide(a, np.where(b == 0, 1, b))
    return np.floor(a / b)


def _floormod(a, b):
    if a.dtype.kind in "iu":
        return np.mod(a, np.where(b == 0, 1, b))
    return np.mod(a, b)


def _sign(x):
    return np.sign(x).astype(x.dtype)


#: NumPy semantics of the pure functions (the interpreter's; float32 stays float32).
NUMPY = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": _erf, "sqrt": np.sqrt,
    "rsqrt": lambda x: (1 / np.sqrt(x)).astype(x.dtype), "sigmoid": _sigmoid,
    "floor": np.floor, "ceil": np.ceil, "rint": np.rint, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "pow": np.power, "fmod": np.fmod, "max": _nan_max, "min": _nan_min, "abs": np.abs,
    "sign": _sign, "floordiv": _floordiv, "floormod": _floormod, "isnan": np.isnan,
    "isinf": np.isinf,
    "in_range": lambda i, n: (i >= 0) & (i < n),
}
