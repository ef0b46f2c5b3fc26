"""One CUDA kernel per kernel group: the pieces every kernel shape shares, and the two simplest
shapes (`default`, `tiled`).

Kernel shapes (docs/codegen.md has the pictures):

- `default`: no tile in the IR. A grid-stride loop over the output, one point per thread, or
  one lane group (up to 32 threads, combined by warp shuffles) per point for a reduction over a
  contiguous axis. Any expression.
- `tiled` (tk-roll's tile, no reuse worth staging): each block owns a `block` tile of the
  output, each thread a `thread` register tile (strided by the thread count per axis so that a
  warp's loads stay coalesced); reduction loops inside; boundary tiles guarded.
- `staged` (`tilekit.codegen.staged`): a reuse-heavy reduction such as matmul or convolution;
  each input's tile per reduction step is staged in shared memory.
- `fused` (`tilekit.codegen.fused`): a group of several stages sharing one output tile, with
  intermediates in shared memory.
- `opaque:<type>` (`tilekit.codegen.opaque`): a registered CUDA implementation of an opaque op.

Every shape applies its stage's elementwise chain in the epilogue (values in registers) and
stores only what leaves the group. Names in generated C: tensors `t_<name>`, axes `a_<name>`,
shared buffers `s_<name>`, block origins `o_<axis>`.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from tilekit import __version__
from tilekit.codegen.cexpr import (HALF_DTYPES, IDENTITY, KIND_CTYPE, WARP_REDUCE, ValueCompiler,
                                   accumulator_kind, combine, convert, index_code, linear,
                                   load_value, pad_literal, storage, store_value)
from tilekit.codegen.builder import BLOCK, NBLOCKS, KernelBuilder, KernelSpec
from tilekit.codegen.emitter import Emitter, comment_text
from tilekit.codegen.plan import GroupPlan, OpPlan, Read, Stage
from tilekit.ir.payloads import KernelRecord, Tile
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid, lane_count
from tilekit.schedule.shape import walks_contiguously
from tilekit.expr.intervals import interval
from tilekit.expr.ast import Access
from tilekit.ir.model import Module

INT32_LIMIT = 2 ** 31 - 1


#: The define that compiles runtime.cuh's grid barrier (cooperative groups) into a file.
GRID_SYNC_DEFINE = "#define TK_USE_GRID_SYNC 1"


def shape_defines(shape: str) -> tuple[str, ...]:
    """The preprocessor lines a kernel of `shape` has before runtime.cuh: device loops and
    branches use the grid barrier. A function of the shape alone, so a recorded kernel's
    file is rebuilt from its record."""
    return (GRID_SYNC_DEFINE,) if shape in ("device_loop", "device_branch") else ()


@dataclass(frozen=True)
class GeneratedKernel:
    """One `__global__` function and how to launch it."""

    name: str                     # unique among the module's generated kernels
    group: str                    # the module kernel (group) it implements
    entry: str                    # the extern "C" function name
    ops: tuple[str, ...]
    shape: str
    schedule: Mapping
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int               # dynamic shared memory at launch
    smem_planned: int             # shared memory the kernel declares (static + dynamic)
    args: tuple[str, ...]         # tensors, in parameter order
    writes: tuple[str, ...]
    body: str                     # the function text (after the preamble)
    uses_half: bool = False
    notes: tuple[str, ...] = ()
    spec: KernelSpec | None = None  # the structured form (tilekit.codegen.builder)
    #: Its blocks wait on each other (a tk-ram program, a device loop): launched
    #: cooperatively or checked co-resident, never more blocks than fit.
    coresident: bool = False
    counters: int = 0             # words of the progress-counter workspace it takes last
    @property
    def defines(self) -> tuple[str, ...]:
        """Preprocessor lines its file needs before runtime.cuh (`shape_defines`)."""
        return shape_defines(self.shape)

    @property
    def source(self) -> str:
        return kernel_preamble(self.name, self.ops, self.shape, self.uses_half,
                               self.defines) + self.body

    def record(self) -> KernelRecord:
        """The kernel's entry of the `codegen` section (tilekit.ir.payloads)."""
        return KernelRecord(self.name, self.group, self.entry, self.ops, self.shape,
                            dict(self.schedule), self.grid, self.block, self.smem_bytes,
                            self.args, self.writes, self.source, self.uses_half,
                            coresident=self.coresident, counters=self.counters)


def unit_text(bodies, shapes, uses_half: bool) -> str:
    """Kernel bodies (their text after their own preambles) as one translation unit: one
    preamble with the defines of every kernel shape among `shapes`, then the bodies."""
    defines = tuple(dict.fromkeys(d for shape in shapes for d in shape_defines(shape)))
    return _preamble(list(defines), uses_half) + "\n".join(bodies)


def kernel_preamble(name: str, ops, shape: str, uses_half: bool,
                    defines: tuple[str, ...] = ()) -> str:
    """The head of one kernel's source file: a function of its record alone."""
    return _preamble(["// " + comment_text(f"kernel {name}: ops {', '.join(ops)}; "
                                           f"shape {shape}"), *defines], uses_half)


def _preamble(extra: list[str], uses_half: bool) -> str:
    lines = [f"// Generated by tk-codegen (tilekit {__version__}). Do not edit.", *extra]
    if uses_half:
        lines.append("#define TK_USE_HALF 1")
    lines.append('#include "runtime.cuh"')
    return "\n".join(lines) + "\n\n"


def c_name(name: str) -> str:
    """`name` as (part of) a C identifier: ASCII letters, digits and `_` only."""
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in name)


def tvar(tensor: str) -> str:
    return f"t_{c_name(tensor)}"


def avar(axis: str) -> str:
    return f"a_{c_name(axis)}"


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


Ranges = Mapping[str, tuple[int, int]]


def full_ranges(p: OpPlan) -> dict[str, tuple[int, int]]:
    return {a: (0, e - 1) for a, e in p.spatial + p.reduction}


def needs_check(r: Read, ranges: Ranges) -> list[bool]:
    """Per dimension: can the index leave [0, dim) when axes range over `ranges`?"""
    out = []
    for m, dim in zip(r.maps, r.shape):
        try:
            lo, hi = interval(m.node, ranges)
        except KeyError:
            lo, hi = -1, dim
        out.append(lo < 0 or hi >= dim)
    return out


def dim_codes(r: Read, axis_code: Mapping[str, str], ranges: Ranges) -> list[str]:
    return [index_code(m.node, axis_code, ranges) for m in r.maps]


def flat_offset(r: Read, axis_code: Mapping[str, str], ranges: Ranges,
                codes: list[str] | None = None) -> str:
    """The element offset of a read: one linear form when every map is affine."""
    st = strides(r.shape)
    if r.affine:
        coefs: dict[str, int] = {}
        const = 0
        for m, s in zip(r.maps, st):
            const += m.const * s
            for a, c in m.terms:
                coefs[a] = coefs.get(a, 0) + c * s
        return linear(((c, axis_code[a]) for a, c in sorted(coefs.items(),
                                                             key=lambda ac: -ac[1])), const)
    codes = codes or dim_codes(r, axis_code, ranges)
    return linear((s, f"({c})" if not c.replace("_", "").isalnum() else c)
                  for s, c in zip(st, codes)) if codes else "0"


def guarded(checks: list[str], value: str, pad: str) -> str:
    if not checks:
        return value
    return f"({' && '.join(checks)} ? {value} : {pad})"


def global_read(r: Read, axis_code: Mapping[str, str], ranges: Ranges) -> str:
    """A bounds-checked, padded global load of one read, as its compute kind."""
    need = needs_check(r, ranges)
    codes = dim_codes(r, axis_code, ranges) if any(need) or not r.affine else None
    offset = flat_offset(r, axis_code, ranges, codes)
    value = load_value(f"{tvar(r.tensor)}[{offset}]", r.dtype)
    checks = [f"tk_in({codes[d]}, {dim})" for d, (n, dim) in enumerate(zip(need, r.shape)) if n]
    return guarded(checks, value, pad_literal(r.pad, r.dtype))


def tensor_kind(module: Module) -> Callable[[str], str]:
    return lambda name: storage(module.tensors[name].dtype).kind


def stored_value(code: str, kind: str, dtype: str) -> tuple[str, str]:
    """The value a reader sees after storing `code` as `dtype`: (code, kind)."""
    st = storage(dtype)
    if dtype in HALF_DTYPES:
        return load_value(store_value(code, kind, dtype), dtype), "f"
    if dtype in ("int32", "int16", "int8", "uint8"):
        return f"((long long)({st.ctype})({code}))", "i"
    return convert(code, kind, st.kind), st.kind


def contiguous_reduction(p: OpPlan) -> bool:
    """Does the innermost reduction axis walk a read's contiguous dimension (lanes)?"""
    return walks_contiguously(p.reduction, p.read_list())


def index_type(module: Module, tensors, loop_end: int = 0) -> str:
    """`int` when every tensor the kernel touches has fewer than 2^31 elements and a
    grid-stride loop's counter, which reaches `loop_end` (`grid_stride_end`), fits too."""
    big = loop_end > INT32_LIMIT or any(module.tensors[t].size > INT32_LIMIT for t in tensors)
    return "long long" if big else "int"


def grid_stride_end(points: int, grid: int, threads: int) -> int:
    """A bound on the counter of `for (p = ...; p < points; p += grid * threads)`: its last
    increment starts below `points` and adds one whole stride, so a loop over fewer than 2^31
    points can still overflow an `int` counter."""
    return points + grid * threads


# -- signatures --------------------------------------------------------------------------

@dataclass
class Signature:
    module: Module
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)

    def read(self, tensor: str) -> None:
        if tensor not in self.reads and tensor not in self.writes:
            self.reads.append(tensor)

    def write(self, tensor: str) -> None:
        if tensor in self.reads:
            self.reads.remove(tensor)
        if tensor not in self.writes:
            self.writes.append(tensor)

    @property
    def args(self) -> tuple[str, ...]:
        return tuple(self.reads) + tuple(self.writes)

    def params(self) -> str:
        out = []
        for t in self.reads:
            out.append(f"const {storage(self.module.tensors[t].dtype).ctype}* __restrict__ "
                       f"{tvar(t)}")
        for t in self.writes:
            out.append(f"{storage(self.module.tensors[t].dtype).ctype}* __restrict__ {tvar(t)}")
        return ", ".join(out)

    def uses_half(self) -> bool:
        return any(self.module.tensors[t].dtype in HALF_DTYPES for t in self.args)


def group_signature(module: Module, plan: GroupPlan, shared: frozenset[str] = frozenset()
                    ) -> Signature:
    sig = Signature(module)
    produced = {t for s in plan.stages for t in s.outputs}
    for s in plan.stages:
        for p in s.ops:
            for r in p.read_list():
                if r.tensor not in produced:
                    sig.read(r.tensor)
    for s in plan.stages:
        for t in s.outputs:
            if t in plan.stored:
                sig.write(t)
    return sig


def new_kernel(entry: str, sig: Signature, threads: int, comment: list[str],
               register_tile: bool = False) -> KernelBuilder:
    """A kernel builder for the group's signature. Kernels with a register tile (tiled,
    staged) get `__launch_bounds__(threads, 1)`: launchable with `threads` threads and no
    occupancy target of ptxas' own, since the tile chose the registers (with `(threads)`
    alone ptxas 13 capped registers below need and spilled on rolled convolutions). The
    others keep ptxas' default heuristic, which keeps simple loops at few registers and high
    occupancy (with `(threads, 1)` it unrolled them to 140+ registers). See docs/codegen.md."""
    return KernelBuilder(entry, sig.params(), ", ".join(tvar(t) for t in sig.args), threads,
                         register_tile, list(comment))


def finish(kb: KernelBuilder, plan, shape: str, schedule: Mapping, grid: int,
           sig: Signature, ops: tuple[str, ...] | None = None) -> GeneratedKernel:
    """The generated kernel of a builder: its spec printed, its launch recorded."""
    spec = kb.build()
    return GeneratedKernel(
        name=plan.name, group=plan.kernel.name, entry=kb.entry,
        ops=ops if ops is not None else tuple(plan.kernel.ops), shape=shape,
        schedule=schedule, grid=(grid, 1, 1), block=(kb.threads, 1, 1),
        smem_bytes=spec.smem_bytes if spec.dynamic else 0, smem_planned=spec.smem_bytes,
        args=sig.args, writes=tuple(sig.writes), body=spec.source(),
        uses_half=sig.uses_half(), spec=spec)


# -- per-point evaluation of one stage ---------------------------------------------------

class PointEmitter:
    """Emits the value of a stage's ops at one output point, with its epilogue and stores.

    `axis_vars[k]` is the C variable of the stage's k-th spatial position (chain ops are
    mapped by position). `resolve(plan, node, axis_code)` returns read code for reads that are
    not the stage's own registers (global or shared memory).
    """

    def __init__(self, module: Module, e: Emitter, stage: Stage, axis_vars: list[str],
                 resolve: Callable[[OpPlan, Access, Mapping[str, str]], str]):
        self.module, self.e, self.stage, self.axis_vars = module, e, stage, axis_vars
        self.resolve = resolve
        self.registers: dict[str, tuple[str, str]] = {}

    def axis_code(self, p: OpPlan, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        code = {a: v for (a, _), v in zip(p.spatial, self.axis_vars)}
        code.update({a: avar(a) for a, _ in p.reduction})
        if extra:
            code.update(extra)
        return code

    def compiler(self, p: OpPlan, axis_code: Mapping[str, str]) -> ValueCompiler:
        def read(node: Access) -> str:
            r = p.read(node)
            if r.tensor in self.registers:
                return self.registers[r.tensor][0]
            return self.resolve(p, node, axis_code)
        return ValueCompiler(axis_code, tensor_kind(self.module), read, full_ranges(p))

    def body_kind(self, p: OpPlan) -> str:
        return self.compiler(p, self.axis_code(p)).kind(p.body)[0]

    def acc_kind(self, p: OpPlan) -> str:
        return accumulator_kind(p.assign, self.body_kind(p))

    def emit_reduction_loops(self, p: OpPlan, acc: str, kind: str, lanes: int = 1,
                             lane_var: str = "lane", axis_code: Mapping[str, str] | None = None,
                             steps: Mapping[str, tuple[str, str]] | None = None) -> None:
        """`for` loops over the reduction axes folding the body into `acc`. The innermost axis
        starts at `lane_var` and strides by `lanes` when lanes > 1."""
        code = axis_code or self.axis_code(p)
        comp = self.compiler(p, code)
        last = len(p.reduction) - 1
        heads = []
        for k, (a, extent) in enumerate(p.reduction):
            var = avar(a)
            if k == last and lanes > 1:
                heads.append(f"for (int {var} = {lane_var}; {var} < {extent}; {var} += {lanes})")
            else:
                heads.append(f"for (int {var} = 0; {var} < {extent}; ++{var})")
        with self.e.blocks(heads):
            value = comp.emit(p.body, kind)
            self.e.line(combine(p.assign, acc, _ll_if(value, kind)))

    def main_value(self, p: OpPlan, acc: tuple[str, str] | None) -> tuple[str, str]:
        """Declare the main op's stored value at this point (from `acc` when it reduces)."""
        if acc is None:
            comp = self.compiler(p, self.axis_code(p))
            kind, _ = comp.kind(p.body)
            code = comp.emit(p.body, kind)
        else:
            code, kind = acc
        value, vkind = stored_value(code, kind, p.out_dtype)
        name = self.e.let(KIND_CTYPE[vkind], f"v_{c_name(p.output)}_", value)
        self.registers[p.output] = (name, vkind)
        return name, vkind

    def epilogue(self, main: tuple[str, str] | None,
                 sink: Callable[[str, str, str], None]) -> None:
        """Main value (if not declared yet by the caller), chain ops, then `sink(tensor,
        value, kind)` for every op of the stage, in order."""
        if main is None:
            main = self.main_value(self.stage.main, None)
        sink(self.stage.main.output, *main)
        for p in self.stage.chain:
            name, kind = self.main_value(p, None)
            sink(p.output, name, kind)


def _ll_if(value: str, kind: str) -> str:
    return f"((long long)({value}))" if kind == "i" else value


def global_store(module: Module, tensor: str, axis_vars: list[str], value: str,
                 kind: str) -> str:
    shape = tuple(module.tensors[tensor].shape)
    offset = linear(zip(strides(shape), axis_vars)) if shape else "0"
    dtype = module.tensors[tensor].dtype
    return f"{tvar(tensor)}[{offset}] = {store_value(value, kind, dtype)};"


def store_sink(module: Module, e: Emitter, stored: frozenset[str], axis_vars: list[str]
               ) -> Callable[[str, str, str], None]:
    def sink(tensor: str, value: str, kind: str) -> None:
        if tensor in stored:
            e.line(global_store(module, tensor, axis_vars, value, kind))
    return sink


def global_resolver(p: OpPlan, node: Access, axis_code: Mapping[str, str]) -> str:
    return global_read(p.read(node), axis_code, full_ranges(p))


def decompose(e: Emitter, index: str, extents: list[int], names: list[str], ctype: str,
              offsets: list[str] | None = None) -> None:
    """Declare `names[k]` = coordinate k of flat row-major `index` over `extents` (+ offset)."""
    n = len(extents)
    if n == 0:
        return
    if n == 1:
        base = index
        e.line(f"const {ctype} {names[0]} = {_plus(offsets[0] if offsets else '', base)};")
        return
    rem = e.tmp("rem")
    e.line(f"{ctype} {rem} = {index};")
    for k in range(n - 1, 0, -1):
        base = offsets[k] if offsets else ""
        if extents[k] == 1:  # a size-1 axis: coordinate 0, nothing to divide
            e.line(f"const {ctype} {names[k]} = {base or '0'};")
            continue
        e.line(f"const {ctype} {names[k]} = {_plus(base, f'{rem} % {extents[k]}')};")
        e.line(f"{rem} /= {extents[k]};")
    e.line(f"const {ctype} {names[0]} = {_plus(offsets[0] if offsets else '', rem)};")


def _plus(base: str, term: str) -> str:
    if not base or base == "0":
        return term
    return f"{base} + {term}"


# -- shape: default ----------------------------------------------------------------------

def default_kernel(module: Module, plan: GroupPlan, entry: str) -> GeneratedKernel:
    """Grid-stride loop, one point (or one lane group) per thread. See the module docstring."""
    stage = plan.stages[0]
    main = stage.main
    sig = group_signature(module, plan)
    points = main.points
    lanes = lane_count(main.reduction, contiguous_reduction(main))
    threads = DEFAULT_THREADS
    per_block = threads // lanes
    grid = default_grid(points, per_block)
    idx_t = index_type(module, sig.args, grid_stride_end(points, grid, threads))
    sched = {"source": "default", "threads": threads, "lanes": lanes,
             "points_per_block": per_block}
    kb = new_kernel(entry, sig, threads,
                    [f"default schedule: {threads} threads, {lanes} lane(s) per output point, "
                     "grid-stride loop"])
    e = kb.body
    axes = [a for a, _ in main.spatial]
    vars_ = [avar(a) for a in axes]
    extents = [n for _, n in main.spatial]
    pe = PointEmitter(module, e, stage, vars_, global_resolver)
    sink = store_sink(module, e, plan.stored, vars_)
    if lanes == 1:
        head = (f"for ({idx_t} p = ({idx_t}){BLOCK} * {threads} + threadIdx.x; "
                f"p < {points}; p += ({idx_t}){NBLOCKS} * {threads})")
        with e.block(head):
            decompose(e, "p", extents, vars_, idx_t)
            acc = None
            if main.reduces:
                acc = _reduce_at_point(pe, main, 1)
            pe.epilogue(pe.main_value(main, acc) if acc else None, sink)
    else:
        e.line(f"const int lane = threadIdx.x % {lanes};")
        head = (f"for ({idx_t} base = ({idx_t}){BLOCK} * {per_block}; base < {points}; "
                f"base += ({idx_t}){NBLOCKS} * {per_block})")
        with e.block(head):
            e.line(f"const {idx_t} p = base + threadIdx.x / {lanes};")
            e.line(f"const bool active = p < {points};")
            decompose(e, "(active ? p : 0)", extents, vars_, idx_t)
            kind = pe.acc_kind(main)
            acc = e.tmp("acc")
            e.line(f"{KIND_CTYPE[kind]} {acc} = {IDENTITY[main.assign][kind]};")
            with e.block("if (active)"):
                pe.emit_reduction_loops(main, acc, kind, lanes)
            e.line(f"{acc} = {WARP_REDUCE[main.assign]}<{lanes}>({acc});")
            with e.block("if (active && lane == 0)"):
                pe.epilogue(pe.main_value(main, (acc, kind)), sink)
    return finish(kb, plan, "default", sched, grid, sig)


def _reduce_at_point(pe: PointEmitter, p: OpPlan, lanes: int) -> tuple[str, str]:
    kind = pe.acc_kind(p)
    acc = pe.e.tmp("acc")
    pe.e.line(f"{KIND_CTYPE[kind]} {acc} = {IDENTITY[p.assign][kind]};")
    pe.emit_reduction_loops(p, acc, kind, lanes)
    return acc, kind


# -- shape: tiled ------------------------------------------------------------------------

def block_origins(e: Emitter, axes: list[str], extents: list[int], block: tuple[int, ...],
                  idx_t: str) -> list[str]:
    """Declare `o_<axis>` (this block's tile origin) from the block index, innermost axis
    fastest."""
    grid = [-(-n // b) for n, b in zip(extents, block)]
    names = [f"o_{c_name(a)}" for a in axes]
    if not axes:
        return names
    tiles = [e.tmp("b") for _ in axes]
    decompose(e, f"({idx_t}){BLOCK}", grid, tiles, idx_t)
    for name, t, b in zip(names, tiles, block):
        e.line(f"const {idx_t} {name} = {t} * {b};" if b != 1 else f"const {idx_t} {name} = {t};")
    return names


def thread_coords(e: Emitter, axes: list[str], threads_per_axis: list[int]) -> list[str]:
    """Declare `w_<axis>` (this thread's coordinate in the block) from threadIdx.x."""
    names = [f"w_{c_name(a)}" for a in axes]
    decompose(e, "(int)threadIdx.x", threads_per_axis, names, "int")
    return names


def tiled_kernel(module: Module, plan: GroupPlan, entry: str, tile: Tile) -> GeneratedKernel:
    """Block tile per block, register tile per thread, reduction loops inside."""
    stage = plan.stages[0]
    main = stage.main
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in main.spatial]
    extents = [n for _, n in main.spatial]
    threads_per_axis = [b // t for b, t in zip(tile.block, tile.thread)]
    threads = tile.threads
    grid = math.prod(tile.grid(tuple(extents)))
    kb = new_kernel(entry, sig, threads, [f"tiled: {_tile_text(tile, main)}"],
                    register_tile=True)
    e = kb.body
    vars_ = [avar(a) for a in axes]
    origins = block_origins(e, axes, extents, tile.block, idx_t)
    thread_vars = thread_coords(e, axes, threads_per_axis)
    pe = PointEmitter(module, e, stage, vars_, global_resolver)
    npoints = math.prod(tile.thread)
    kind = pe.acc_kind(main) if main.reduces else None
    bounds = _bounds_check(vars_, extents, tile.block)

    def point_loops(body: Callable[[str], None]) -> None:
        with register_loops(e, axes, tile.thread):
            for v, o, w, a, t, across in zip(vars_, origins, thread_vars, axes,
                                                  tile.thread, threads_per_axis):
                j = f" + j_{c_name(a)} * {across}" if t > 1 else ""
                e.line(f"const {idx_t} {v} = {o} + {w}{j};")
            slot = linear(((math.prod(tile.thread[k + 1:]), f"j_{c_name(a)}")
                           for k, (a, t) in enumerate(zip(axes, tile.thread)) if t > 1))
            with e.blocks([f"if ({bounds})"] if bounds else []):
                body(slot)

    if main.reduces:
        acc = "acc"
        e.line(f"{KIND_CTYPE[kind]} {acc}[{npoints}];")
        e.line("#pragma unroll")
        e.line(f"for (int k = 0; k < {npoints}; ++k) {acc}[k] = {IDENTITY[main.assign][kind]};")
        # Reduction loops outside the register tile: each loaded reduction slice is
        # used by every point of the thread's tile while it is in registers or L1.
        def fold(slot: str) -> None:
            comp = pe.compiler(main, pe.axis_code(main))
            e.line(combine(main.assign, f"{acc}[{slot}]",
                           _ll_if(comp.emit(main.body, kind), kind)))
        with e.blocks(f"for (int {avar(a)} = 0; {avar(a)} < {n}; ++{avar(a)})"
                      for a, n in main.reduction):
            point_loops(fold)

        def store(slot: str) -> None:
            pe.registers.clear()
            pe.epilogue(pe.main_value(main, (f"{acc}[{slot}]", kind)),
                        store_sink(module, e, plan.stored, vars_))
        point_loops(store)
    else:
        def compute(slot: str) -> None:
            pe.registers.clear()
            pe.epilogue(None, store_sink(module, e, plan.stored, vars_))
        point_loops(compute)
    return finish(kb, plan, "tiled",
                  tile.describe(tuple(axes), tuple(a for a, _ in main.reduction)), grid, sig)


@contextmanager
def register_loops(e: Emitter, axes, sizes) -> Iterator[None]:
    """An unrolled `for (j_<axis> ...)` loop over each axis whose register-tile size is more
    than one (a thread's points of its tile), nested in axis order."""
    with ExitStack() as loops:
        for a, t in zip(axes, sizes):
            if t > 1:
                e.line("#pragma unroll")
                loops.enter_context(e.block(f"for (int j_{c_name(a)} = 0; j_{c_name(a)} < {t}; "
                                            f"++j_{c_name(a)})"))
        yield


def _bounds_check(vars_: list[str], extents: list[int], block: tuple[int, ...]) -> str:
    """`a < N` for the axes whose extent the block size does not divide."""
    return " && ".join(f"{v} < {n}" for v, n, b in zip(vars_, extents, block) if n % b)


def _tile_text(tile: Tile, p: OpPlan) -> str:
    axes = [a for a, _ in p.spatial]
    parts = ["block " + " x ".join(f"{a}:{b}" for a, b in zip(axes, tile.block)),
             "thread " + " x ".join(f"{a}:{t}" for a, t in zip(axes, tile.thread))]
    if p.reduction:
        parts.append("step " + " x ".join(f"{a}:{s}" for (a, _), s in
                                          zip(p.reduction, tile.step)))
    return f"{', '.join(parts)} (from {tile.source})"
