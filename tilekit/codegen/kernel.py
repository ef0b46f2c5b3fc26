"""One tile program per kernel group: the pieces every kernel shape shares, and the two
simplest shapes (`default`, `tiled`).

Kernel shapes (docs/codegen.md has the pictures); each builds a `tilekit.tile.nodes.Kernel`,
which `tilekit.tile.cuda` prints:

- `default`: no tile in the IR. A grid-stride loop over the output, one point per thread, or
  one lane group (up to 32 threads, combined by warp shuffles) per point for a reduction over a
  contiguous axis. Any expression.
- `tiled` (tk-roll's tile, no reuse worth staging): each block owns a `block` tile of the
  output, each thread a `thread` register tile (strided by the thread count per axis so that a
  warp's loads stay coalesced); reduction loops inside; boundary tiles guarded.
- `staged` (`tilekit.codegen.staged`): a reuse-heavy reduction such as matmul or convolution;
  each input's tile per reduction step is copied to shared memory (a `Copy`).
- `mma` (`tilekit.codegen.mma`): a contraction on tensor cores, a pipelined step loop.
- `fused` (`tilekit.codegen.fused`) and `flash` (`tilekit.codegen.flash`): a group of several
  stages sharing one output tile, with intermediates in shared memory.
- `opaque:<type>` (`tilekit.codegen.opaque`): a registered implementation of an opaque op.
- `cpu_gemm` and `cpu_loops` (`tilekit.codegen.cpu`): the CPU target's one-stage groups,
  packed panels and a register-tile micro-kernel, or loop nests in vector lanes.

Every shape applies its stage's elementwise chain in the epilogue (values in registers) and
stores only what leaves the group. Names in the programs: tensors `t_<name>`, axes
`a_<name>`, shared buffers `s_<name>`, block origins `o_<axis>`.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from tilekit.codegen.plan import GroupPlan, OpPlan, Read, Stage
from tilekit.errors import InternalError
from tilekit.codegen.values import (HALF_DTYPES, ValueCompiler, accumulator_kind, combine,
                                    convert, identity, index_expr, load_value, pad_literal,
                                    storage_kind, store_value)
from tilekit.expr.ast import Access
from tilekit.expr.intervals import interval
from tilekit.ir.model import Module
from tilekit.ir.payloads import KernelRecord, Tile
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid, lane_count
from tilekit.schedule.shape import Target, walks_contiguously
from tilekit.tile import cpp, cuda
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, Names
from tilekit.tile.expr import BLOCK, KIND_DTYPE, NBLOCKS, Expr, Load, Var
from tilekit.tile.functions import WARP_REDUCERS
from tilekit.tile.nodes import Buffer, Kernel, Stmt

INT32_LIMIT = 2 ** 31 - 1


@dataclass(frozen=True)
class GeneratedKernel:
    """One kernel: its tile program, its printed text and how to launch it."""

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
    body: str                     # the printed kernel (after the file's preamble)
    program: Kernel               # the tile program it was printed from (lowered)
    built: Kernel | None = None   # the same program as its builder made it (before lowering)
    target: str = "cuda"          # cuda | cpu: which printer wrote `body`
    uses_half: bool = False
    notes: tuple[str, ...] = ()
    #: Its blocks wait on each other (a tk-ram program, a device loop): launched
    #: cooperatively or checked co-resident, never more blocks than fit.
    coresident: bool = False
    counters: int = 0             # words of the progress-counter workspace it takes last
    #: TMA descriptors the host builds before the launch (after the other arguments): one
    #: mapping per `tilekit.tile.nodes.TensorMap`, naming its tensor
    tensor_maps: tuple[Mapping, ...] = ()
    #: scratch buffers among `args` that are no tensor of the module (split-K's partial
    #: sums): name -> float32 elements, allocated by the launcher for the group's kernels
    scratch: Mapping[str, int] = field(default_factory=dict)

    @property
    def defines(self) -> tuple[str, ...]:
        """Preprocessor lines its file needs before runtime.cuh."""
        return shape_defines(self.shape) if self.target == "cuda" else ()

    @property
    def source(self) -> str:
        if self.target == "cpu":
            return cpp.file_preamble(self.name, self.ops, self.shape) + self.body
        return cuda.file_preamble(self.name, self.ops, self.shape, self.uses_half,
                                  self.defines) + self.body

    def record(self) -> KernelRecord:
        """The kernel's entry of the `codegen` section (tilekit.ir.payloads)."""
        return KernelRecord(self.name, self.group, self.entry, self.ops, self.shape,
                            dict(self.schedule), self.grid, self.block, self.smem_bytes,
                            self.args, self.writes, self.source, self.uses_half,
                            coresident=self.coresident, counters=self.counters,
                            tensor_maps=self.tensor_maps, scratch=dict(self.scratch))


def shape_defines(shape: str) -> tuple[str, ...]:
    """The preprocessor lines a kernel of `shape` has before runtime.cuh: device loops and
    branches use the grid barrier. A function of the shape alone, so a recorded kernel's
    file is rebuilt from its record (`generated` checks the program agrees)."""
    return (cuda.GRID_SYNC_DEFINE,) if shape in ("device_loop", "device_branch") else ()


def generated(program: Kernel, *, name: str, group: str, ops: tuple[str, ...], shape: str,
              schedule: Mapping, args: tuple[str, ...], writes: tuple[str, ...],
              coresident: bool = False, target: str = "cuda") -> GeneratedKernel:
    """The generated kernel of a tile program: lowered for `target` (cuda | cpu), verified,
    printed, its launch recorded."""
    from tilekit.tile.passes import lower_for_cpu, lower_for_cuda
    from tilekit.tile.verify import verify

    built = program
    program = lower_for_cpu(program) if target == "cpu" else lower_for_cuda(program)
    verify(program)
    if target == "cuda" and cuda.defines(program) != shape_defines(shape):
        raise InternalError(f"kernel {program.name} of shape {shape}: its grid barriers and "
                            "its shape disagree")
    smem = program.smem_bytes
    if program.calls:
        smem = max(smem, 16)
    dynamic = target == "cuda" and smem > cuda.STATIC_SMEM_LIMIT
    text = cpp.kernel_text(program) if target == "cpu" else cuda.kernel_text(program)
    return GeneratedKernel(
        name=name, group=group, entry=program.name, ops=ops, shape=shape, schedule=schedule,
        grid=(program.grid, 1, 1), block=(program.threads, 1, 1),
        smem_bytes=smem if dynamic else 0, smem_planned=smem, args=args, writes=writes,
        body=text, program=program, built=built, target=target,
        uses_half=cuda.uses_half(program),
        coresident=coresident, counters=program.counters,
        tensor_maps=tensor_map_records(program, args))


def tensor_map_records(program: Kernel, args: tuple[str, ...]) -> tuple[dict, ...]:
    """The launch plan's entry of each TMA descriptor: the tensor (by its IR name, the
    argument of the same parameter position), element type, dimensions innermost first,
    byte strides of the outer ones, box and swizzle (what cuTensorMapEncodeTiled takes)."""
    tensor_of = {b.name: t for b, t in zip(program.params, args)}
    return tuple({"name": m.name, "tensor": tensor_of[m.buffer], "dtype": m.dtype,
                  "dims": list(m.dims), "strides": list(m.strides), "box": list(m.box),
                  "swizzle": m.swizzle} for m in program.tensor_maps)


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


def tile_range_checks(r: Read, code: Mapping[str, Expr], extent: Mapping[str, int],
                      size: Mapping[str, int], idx_t: str) -> list[Expr]:
    """`0 <= index < dim` for each dimension of `r` whose index can leave the tensor while
    the axes (`code`: each axis' value) range over whole tiles and steps (`size` per axis,
    1 where absent): a convolution's padding and halo reads in a block GEMM."""
    ranges = {a: (0, -(-extent[a] // size.get(a, 1)) * size.get(a, 1) - 1) for a in code}
    out = []
    for m, dim, need in zip(r.maps, r.shape, needs_check(r, ranges)):
        if need:
            x = tx.linear(((cf, code[a]) for a, cf in m.terms), m.const, idx_t)
            out.append(tx.call("in_range", x, tx.as_expr(dim, x.dtype)))
    return out


def dim_exprs(r: Read, axis: Mapping[str, Expr], ranges: Ranges) -> list[Expr]:
    return [index_expr(m.node, axis, ranges) for m in r.maps]


def flat_offset(r: Read, axis: Mapping[str, Expr], ranges: Ranges,
                dims: list[Expr] | None = None) -> Expr:
    """The element offset of a read: one linear form when every map is affine."""
    st = strides(r.shape)
    if r.affine:
        coefs: dict[str, int] = {}
        const = 0
        for m, s in zip(r.maps, st):
            const += m.const * s
            for a, c in m.terms:
                coefs[a] = coefs.get(a, 0) + c * s
        terms = [(c, axis[a]) for a, c in sorted(coefs.items(), key=lambda ac: -ac[1])]
        return tx.linear(terms, const, _dtype_of(v for _, v in terms))
    dims = dims or dim_exprs(r, axis, ranges)
    return tx.linear(zip(st, dims), 0, _dtype_of(dims)) if dims else tx.const(0)


def _dtype_of(xs) -> str:
    return "int64" if any(x.dtype == "int64" for x in xs) else "int32"


def in_range_checks(r: Read, dims: list[Expr], need: list[bool]) -> list[Expr]:
    return [tx.call("in_range", d, tx.as_expr(dim, d.dtype))
            for d, dim, n in zip(dims, r.shape, need) if n]


def guarded(checks: list[Expr], value: Expr, pad: Expr) -> Expr:
    return tx.select(tx.and_(*checks), value, pad) if checks else value


def tensor_buffer(module: Module, tensor: str, access: str = "read") -> Buffer:
    t = module.tensors[tensor]
    return Buffer(tvar(tensor), "global", t.dtype, (max(1, t.size),), access=access,
                  comment=tensor)


def global_read(r: Read, axis: Mapping[str, Expr], ranges: Ranges) -> Expr:
    """A bounds-checked, padded global load of one read, as its compute kind."""
    need = needs_check(r, ranges)
    dims = dim_exprs(r, axis, ranges) if any(need) or not r.affine else None
    offset = flat_offset(r, axis, ranges, dims)
    value = load_value(Load(tvar(r.tensor), (offset,), r.dtype), r.dtype)
    checks = in_range_checks(r, dims, need) if dims else []
    return guarded(checks, value, pad_literal(r.pad, r.dtype))


def tensor_kind(module: Module) -> Callable[[str], str]:
    return lambda name: storage_kind(module.tensors[name].dtype)


def stored_value(x: Expr, dtype: str) -> tuple[Expr, str]:
    """The value a reader sees after storing `x` as `dtype`: (value, kind)."""
    kind = storage_kind(dtype)
    if dtype in HALF_DTYPES:
        return load_value(store_value(x, dtype), dtype), "f"
    if dtype in ("int32", "int16", "int8", "uint8"):
        return tx.cast("int64", tx.cast(dtype, x)), "i"
    return convert(x, kind), kind


def contiguous_reduction(p: OpPlan) -> bool:
    """Does the innermost reduction axis walk a read's contiguous dimension (lanes)?"""
    return walks_contiguously(p.reduction, p.read_list())


def index_type(module: Module, tensors, loop_end: int = 0) -> str:
    """`int32` when every tensor the kernel touches has fewer than 2^31 elements and a
    grid-stride loop's counter, which reaches `loop_end` (`grid_stride_end`), fits too."""
    big = loop_end > INT32_LIMIT or any(module.tensors[t].size > INT32_LIMIT for t in tensors)
    return "int64" if big else "int32"


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

    def params(self) -> tuple[Buffer, ...]:
        return tuple(tensor_buffer(self.module, t, "read") for t in self.reads) + tuple(
            tensor_buffer(self.module, t, "write") for t in self.writes)


def group_signature(module: Module, plan: GroupPlan) -> Signature:
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


def finish(plan, entry: str, sig: Signature, body: Stmt, *, shape: str, schedule: Mapping,
           threads: int, grid: int, comments: list[str], shared: tuple[Buffer, ...] = (),
           register_tile: bool = False, ops: tuple[str, ...] | None = None,
           target: Target | None = None) -> GeneratedKernel:
    """The generated kernel of a group's tile program.

    Kernels with a register tile (tiled, staged, mma, fused with a contraction) get
    `__launch_bounds__(threads, 1)`: launchable with `threads` threads and no occupancy target
    of ptxas' own, since the tile chose the registers (with `(threads)` alone ptxas 13 capped
    registers below need and spilled on rolled convolutions). The others keep ptxas' default
    heuristic, which keeps simple loops at few registers and high occupancy (with
    `(threads, 1)` it unrolled them to 140+ registers). See docs/codegen.md."""
    program = Kernel(entry, sig.params(), shared, body, threads, grid,
                     1 if register_tile else None, tuple(comments))
    return generated(program, name=plan.name, group=plan.kernel.name,
                     ops=ops if ops is not None else tuple(plan.kernel.ops), shape=shape,
                     schedule=schedule, args=sig.args, writes=tuple(sig.writes),
                     target=target.kind if target is not None else "cuda")


# -- per-point evaluation of one stage ---------------------------------------------------

Accumulator = Var | tuple[Buffer, tuple[Expr, ...]]   # a mutable scalar, or an element


def fold_into(b: Builder, acc: Accumulator, assign: str, value: Expr) -> None:
    """Fold `value` into accumulator `acc` (a scalar or a local buffer element)."""
    if isinstance(acc, Var):
        b.assign(acc, combine(assign, acc, tx.cast(acc.dtype, value)))
        return
    buffer, index = acc
    current = Load(buffer.name, index, buffer.dtype)
    b.store(buffer, index, combine(assign, current, tx.cast(buffer.dtype, value)))


class PointBuilder:
    """Builds the value of a stage's ops at one output point, with its epilogue and stores.

    `axis_vars[k]` is the variable of the stage's k-th spatial position (chain ops are
    mapped by position). `resolve(plan, node, axis)` returns the read of anything that is not
    the stage's own registers (global or shared memory).
    """

    def __init__(self, module: Module, b: Builder, stage: Stage, axis_vars: list[Expr],
                 resolve: Callable[[OpPlan, Access, Mapping[str, Expr]], Expr]):
        self.module, self.b, self.stage, self.axis_vars = module, b, stage, axis_vars
        self.resolve = resolve
        self.registers: dict[str, tuple[Var, str]] = {}

    def axis_code(self, p: OpPlan, extra: Mapping[str, Expr] | None = None
                  ) -> dict[str, Expr]:
        code: dict[str, Expr] = {a: v for (a, _), v in zip(p.spatial, self.axis_vars)}
        code.update({a: Var(avar(a), "int32") for a, _ in p.reduction})
        if extra:
            code.update(extra)
        return code

    def compiler(self, p: OpPlan, axis: Mapping[str, Expr]) -> ValueCompiler:
        def read(node: Access) -> Expr:
            r = p.read(node)
            if r.tensor in self.registers:
                return self.registers[r.tensor][0]
            return self.resolve(p, node, axis)
        return ValueCompiler(axis, tensor_kind(self.module), read, full_ranges(p))

    def body_kind(self, p: OpPlan) -> str:
        return self.compiler(p, self.axis_code(p)).kind(p.body)[0]

    def acc_kind(self, p: OpPlan) -> str:
        return accumulator_kind(p.assign, self.body_kind(p))

    def reduction_loops(self, p: OpPlan, acc: Accumulator, kind: str, lanes: int = 1,
                        lane: Expr | None = None, axis: Mapping[str, Expr] | None = None
                        ) -> None:
        """`for` loops over the reduction axes folding the body into `acc`. The innermost axis
        starts at `lane` and strides by `lanes` when lanes > 1."""
        code = dict(axis or self.axis_code(p))
        comp = self.compiler(p, code)
        last = len(p.reduction) - 1
        with ExitStack() as loops:
            for k, (a, extent) in enumerate(p.reduction):
                if k == last and lanes > 1:
                    v = loops.enter_context(self.b.loop(avar(a), lane, extent, lanes))
                else:
                    v = loops.enter_context(self.b.loop(avar(a), 0, extent))
                code[a] = v
            fold_into(self.b, acc, p.assign, comp.emit(p.body, kind))

    def main_value(self, p: OpPlan, acc: tuple[Expr, str] | None) -> tuple[Var, str]:
        """Declare the main op's stored value at this point (from `acc` when it reduces)."""
        if acc is None:
            comp = self.compiler(p, self.axis_code(p))
            kind, _ = comp.kind(p.body)
            value = comp.emit(p.body, kind)
        else:
            value, kind = acc
        stored, vkind = stored_value(value, p.out_dtype)
        name = self.b.let(f"v_{c_name(p.output)}_", stored, KIND_DTYPE[vkind])
        self.registers[p.output] = (name, vkind)
        return name, vkind

    def epilogue(self, main: tuple[Var, str] | None,
                 sink: Callable[[str, Expr, str], None]) -> None:
        """Main value (if not declared yet by the caller), chain ops, then `sink(tensor,
        value, kind)` for every op of the stage, in order."""
        if main is None:
            main = self.main_value(self.stage.main, None)
        sink(self.stage.main.output, *main)
        for p in self.stage.chain:
            name, kind = self.main_value(p, None)
            sink(p.output, name, kind)


def global_store(module: Module, b: Builder, tensor: str, axis_vars: list[Expr],
                 value: Expr) -> None:
    shape = tuple(module.tensors[tensor].shape)
    offset = tx.linear(zip(strides(shape), axis_vars), 0, _dtype_of(axis_vars)) if shape \
        else tx.const(0)
    b.store(tvar(tensor), (offset,), store_value(value, module.tensors[tensor].dtype))


def store_sink(module: Module, b: Builder, stored: frozenset[str], axis_vars: list[Expr]
               ) -> Callable[[str, Expr, str], None]:
    def sink(tensor: str, value: Expr, kind: str) -> None:
        if tensor in stored:
            global_store(module, b, tensor, axis_vars, value)
    return sink


def global_resolver(p: OpPlan, node: Access, axis: Mapping[str, Expr]) -> Expr:
    return global_read(p.read(node), axis, full_ranges(p))


def decompose(b: Builder, index: Expr, extents: list[int], names: list[str], dtype: str,
              offsets: list[Expr] | None = None, named: bool = False) -> list[Var]:
    """Declare `names[k]` = coordinate k of flat row-major `index` over `extents` (+ offset).
    `named`: each extent a named constant, so that an extent of 1 keeps the division's form
    (code for the sizes of a symbolic module, whose sizes share one form:
    `tilekit.codegen.parametric`)."""
    n = len(extents)
    if n == 0:
        return []
    index = tx.cast(dtype, index)
    if n == 1:
        return [b.let(names[0], tx.add(offsets[0], index) if offsets else index, dtype)]
    out: list[Var | None] = [None] * n
    shared = len(set(names)) < n        # one name for every coordinate (fresh per let)
    rem = b.decl("rem_", dtype, index)
    for k in range(n - 1, 0, -1):
        base = offsets[k] if offsets else None
        if extents[k] == 1 and not named:  # a size-1 axis: coordinate 0, nothing to divide
            out[k] = b.let(names[k], base if base is not None else tx.const(0, dtype), dtype)
            continue
        extent = b.let(f"{names[k]}n{k if shared else ''}", tx.const(extents[k], dtype),
                       dtype) if named else extents[k]
        coord = tx.mod(rem, extent)
        out[k] = b.let(names[k], tx.add(base, coord) if base is not None else coord, dtype)
        b.assign(rem, tx.div(rem, extent))
    out[0] = b.let(names[0], tx.add(offsets[0], rem) if offsets else rem, dtype)
    return out  # type: ignore[return-value]


# -- shape: default ----------------------------------------------------------------------

def default_kernel(module: Module, plan: GroupPlan, entry: str, target: Target
                   ) -> GeneratedKernel:
    """Grid-stride loop, one point (or one lane group) per thread. See the module docstring."""
    stage = plan.stages[0]
    main = stage.main
    sig = group_signature(module, plan)
    points = main.points
    lanes = lane_count(main.reduction, contiguous_reduction(main),
                       target.varies(main.op.name, main.reduction)) if target.lanes else 1
    threads = DEFAULT_THREADS
    per_block = threads // lanes
    grid = default_grid(points, per_block)
    idx_t = index_type(module, sig.args, grid_stride_end(points, grid, threads))
    sched = {"source": "default", "threads": threads, "lanes": lanes,
             "points_per_block": per_block}
    b = Builder()
    axes = [a for a, _ in main.spatial]
    extents = [n for _, n in main.spatial]
    names = [avar(a) for a in axes]
    # a symbolic module's size: an extent of 1 keeps its division when the axes vary
    named = target.any_varying(main.op.name, axes)
    with b.threads(threads) as tid:
        if lanes == 1:
            start = tx.cast(idx_t, BLOCK) * threads + tid
            with b.loop("p", start, points, tx.cast(idx_t, NBLOCKS) * threads,
                        dtype=idx_t) as p:
                vars_ = decompose(b, p, extents, names, idx_t, named=named)
                pb = PointBuilder(module, b, stage, vars_, global_resolver)
                sink = store_sink(module, b, plan.stored, vars_)
                acc = None
                if main.reduces:
                    acc = _reduce_at_point(pb, main)
                pb.epilogue(pb.main_value(main, acc) if acc else None, sink)
        else:
            lane = b.let("lane", tx.mod(tid, lanes))
            with b.loop("base", tx.cast(idx_t, BLOCK) * per_block, points,
                        tx.cast(idx_t, NBLOCKS) * per_block, dtype=idx_t) as base:
                p = b.let("p", base + tx.div(tid, lanes), idx_t)
                active = b.let("active", tx.lt(p, points))
                vars_ = decompose(b, tx.select(active, p, tx.const(0, idx_t)), extents, names,
                                  idx_t, named=named)
                pb = PointBuilder(module, b, stage, vars_, global_resolver)
                sink = store_sink(module, b, plan.stored, vars_)
                kind = pb.acc_kind(main)
                acc = b.decl("acc_", KIND_DTYPE[kind], identity(main.assign, kind))
                with b.if_(active):
                    pb.reduction_loops(main, acc, kind, lanes, lane)
                b.assign(acc, tx.call(WARP_REDUCERS[main.assign], acc, tx.const(lanes)))
                with b.if_(tx.and_(active, tx.eq(lane, 0))):
                    pb.epilogue(pb.main_value(main, (acc, kind)), sink)
    return finish(plan, entry, sig, b.build(), shape="default", schedule=sched,
                  threads=threads, grid=grid, target=target,
                  comments=[f"default schedule: {threads} threads, {lanes} lane(s) per output "
                            "point, grid-stride loop"])


def _reduce_at_point(pb: PointBuilder, p: OpPlan) -> tuple[Expr, str]:
    kind = pb.acc_kind(p)
    acc = pb.b.decl("acc_", KIND_DTYPE[kind], identity(p.assign, kind))
    pb.reduction_loops(p, acc, kind)
    return acc, kind


# -- shape: tiled ------------------------------------------------------------------------

def step_origins(b: Builder, s: Expr, steps: list[tuple[str, int, int]]) -> dict[str, Expr]:
    """Flat step `s`'s origin on each reduction axis of `steps` ((axis, extent, step), the
    step counts row-major in that order), declared `q_<axis>` (a block GEMM's step loop)."""
    counts = [-(-n // st) for _, n, st in steps]
    idx = decompose(b, s, counts, ["si_"] * len(steps), "int32")
    return {a: b.let(f"q_{c_name(a)}", tx.mul(i, st)) for (a, _, st), i in zip(steps, idx)}


def group_values(group_axes, local: Expr, sizes: list[int], base_of,
                 dtype: str | None = None) -> dict[str, Expr]:
    """Each axis of a group (a block GEMM's M, N or K axes) at flat local index `local`
    (row-major over `sizes`), plus its base `base_of(axis)`: expressions of `local`, each
    coordinate cast to `dtype` when given (a copy's offset and validity are functions of its
    local index)."""
    out: dict[str, Expr] = {}
    rem = local
    for a, n in reversed(list(zip(group_axes, sizes))):
        coord = tx.mod(rem, n) if a != group_axes[0] else rem
        out[a] = tx.add(base_of(a), coord if dtype is None else tx.cast(dtype, coord))
        rem = tx.div(rem, n)
    return out


def block_origins(b: Builder, axes: list[str], extents: list[int], block: tuple[int, ...],
                  idx_t: str, index: Expr | None = None, named: bool = False) -> list[Var]:
    """Declare `o_<axis>` (this block's tile origin) from the block index (or `index`: the
    tile a block of a split grid owns), innermost axis fastest. `named`: the tile counts
    are named constants (`decompose`; a symbolic module's size whose extents vary)."""
    grid = [-(-n // s) for n, s in zip(extents, block)]
    if not axes:
        return []
    tiles = decompose(b, tx.cast(idx_t, BLOCK if index is None else index), grid,
                      ["b_"] * len(axes), idx_t, named=named)
    return [b.let(f"o_{c_name(a)}", tx.mul(t, s), idx_t) for a, t, s in zip(axes, tiles, block)]


def thread_coords(b: Builder, tid: Expr, axes: list[str], threads_per_axis: list[int]
                  ) -> list[Var]:
    """Declare `w_<axis>` (this thread's coordinate in the block) from its index."""
    return decompose(b, tid, threads_per_axis, [f"w_{c_name(a)}" for a in axes], "int32")


@contextmanager
def register_loops(b: Builder, axes, sizes) -> Iterator[dict[str, Expr]]:
    """An unrolled `for (j_<axis> ...)` loop over each axis whose register-tile size is more
    than one (a thread's points of its tile), nested in axis order; yields axis -> index
    (the constant 0 for an axis of size one)."""
    out: dict[str, Expr] = {}
    with ExitStack() as loops:
        for a, t in zip(axes, sizes):
            out[a] = loops.enter_context(b.loop(f"j_{c_name(a)}", 0, t, kind="unroll")) \
                if t > 1 else tx.const(0)
        yield out


def slot(axes, sizes, j: Mapping[str, Expr]) -> Expr:
    """The flat index over register-tile loop indices `j` of `axes` with `sizes`."""
    terms = [(math.prod(sizes[k + 1:]), j[a]) for k, (a, t) in enumerate(zip(axes, sizes))
             if t > 1]
    return tx.linear(terms)


def tiled_kernel(module: Module, plan: GroupPlan, entry: str, tile: Tile, target: Target
                 ) -> GeneratedKernel:
    """Block tile per block, register tile per thread, reduction loops inside."""
    stage = plan.stages[0]
    main = stage.main
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in main.spatial]
    extents = [n for _, n in main.spatial]
    threads_per_axis = [s // t for s, t in zip(tile.block, tile.thread)]
    threads = tile.threads
    grid = math.prod(tile.grid(tuple(extents)))
    ragged = [target.ragged(main.op.name, a, n, s) for a, n, s in zip(axes, extents, tile.block)]
    b = Builder()
    origins = block_origins(b, axes, extents, tile.block, idx_t,
                            named=target.any_varying(main.op.name, axes))
    npoints = math.prod(tile.thread)
    with b.threads(threads) as tid:
        wv = thread_coords(b, tid, axes, threads_per_axis)
        kind = None

        def point_loops(body: Callable[[list[Var], Expr, PointBuilder], None]) -> None:
            with register_loops(b, axes, tile.thread) as j:
                vars_ = [b.let(avar(a), o + w + j[a] * across if t > 1 else o + w, idx_t)
                         for a, o, w, t, across in zip(axes, origins, wv, tile.thread,
                                                       threads_per_axis)]
                pb = PointBuilder(module, b, stage, vars_, global_resolver)
                with b.if_(_bounds_check(vars_, extents, ragged)):
                    body(vars_, slot(axes, list(tile.thread), j), pb)

        if main.reduces:
            probe = PointBuilder(module, b, stage, [Var(avar(a), idx_t) for a in axes],
                                 global_resolver)
            kind = probe.acc_kind(main)
            acc = b.alloc("acc", KIND_DTYPE[kind], (npoints,))
            with b.loop("k", 0, npoints, kind="unroll") as k:
                b.store(acc, (k,), identity(main.assign, kind))
            # Reduction loops outside the register tile: each loaded reduction slice is used
            # by every point of the thread's tile while it is in registers or L1.
            with ExitStack() as loops:
                for a, n in main.reduction:
                    loops.enter_context(b.loop(avar(a), 0, n))

                def fold(vars_, s, pb: PointBuilder) -> None:
                    comp = pb.compiler(main, pb.axis_code(main))
                    fold_into(b, (acc, (s,)), main.assign,
                              _typed(comp.emit(main.body, kind), kind))
                point_loops(fold)

            def store(vars_, s, pb: PointBuilder) -> None:
                pb.epilogue(pb.main_value(main, (Load(acc.name, (s,), acc.dtype), kind)),
                            store_sink(module, b, plan.stored, vars_))
            point_loops(store)
        else:
            point_loops(lambda vars_, s, pb: pb.epilogue(
                None, store_sink(module, b, plan.stored, vars_)))
    return finish(plan, entry, sig, b.build(), shape="tiled",
                  schedule=tile.describe(tuple(axes), tuple(a for a, _ in main.reduction)),
                  threads=threads, grid=grid, register_tile=True, target=target,
                  comments=[f"tiled: {tile_text(tile, main)}"])


def _typed(value: Expr, kind: str) -> Expr:
    return tx.cast(KIND_DTYPE[kind], value)


def _bounds_check(vars_: list[Expr], extents: list[int], ragged: list[bool]) -> Expr:
    """`a < N` for the axes whose blocks overhang (`Target.ragged`)."""
    return tx.and_(*(tx.lt(v, n) for v, n, r in zip(vars_, extents, ragged) if r))


def tile_text(tile: Tile, p: OpPlan) -> str:
    axes = [a for a, _ in p.spatial]
    parts = ["block " + " x ".join(f"{a}:{s}" for a, s in zip(axes, tile.block)),
             "thread " + " x ".join(f"{a}:{t}" for a, t in zip(axes, tile.thread))]
    if p.reduction:
        parts.append("step " + " x ".join(f"{a}:{s}" for (a, _), s in
                                          zip(p.reduction, tile.step)))
    return f"{', '.join(parts)} (from {tile.source})"


__all__ = ["GeneratedKernel", "PointBuilder", "Signature", "c_name", "decompose",
           "default_kernel", "finish", "generated", "global_read", "global_resolver",
           "group_signature", "index_type", "tensor_buffer", "tiled_kernel", "tvar"]
