"""The `simt` kernel shape: a float32 contraction on CUDA cores as a CUTLASS-SIMT-class block
GEMM, per the shared plan (tilekit.schedule.simt.simt_plan).

A position of the block GEMM is flat over its axis group (M, N or K, row-major over the
block's sizes, or the step's): a matmul's groups are one axis each; a convolution's are the
output pixels and the window, each position decomposed into its axes and read through the
operand's index maps (an implicit GEMM; a window's padding and halo read as zero).

For a block tile of `BM x BN` outputs, `TM x TN` per thread, `BK` reduction points per step:

1. **Global loads, a step ahead.** Per step each operand's `BM x BK` (`BN x BK`) tile is
   `BM x BK / 4` chunks of four elements along the tensor's contiguous dimension; thread `t`
   loads chunks `t, t + T, ...` into registers, one 16-byte load each, where the plan proves
   the rows whole 16-byte units (`vector`); a K-contiguous operand's chunks go two to a row,
   then the next row, so a warp request reads whole 32-byte sectors. Otherwise thread `t`
   loads elements `t, t + T, ...`, each guarded, consecutive lanes along the contiguous
   dimension (8 k of a row at a time for a K-contiguous operand, 9 for a step of whole 3 x 3
   windows). Whatever lies outside the tensor (ragged M, N, K, a window's padding) loads as
   zero.
2. **Shared memory, two buffers per operand**, both K-major (`[k][m]`, `[k][n]`): an
   M/N-contiguous chunk is one 16-byte store; a K-contiguous one is transposed, four scalar
   stores into rows padded by 4 floats (conflict-free: tilekit.schedule.simt).
3. **The step loop**: load step `s + 1` into registers, compute step `s` from buffer `s % 2`,
   store the registers into buffer `(s + 1) % 2`, one barrier. Before the loop, step 0 is
   loaded, stored and waited for.
4. **Compute**: per reduction point, the thread's A fragment (`TM` values: one 16-byte load
   per sub-tile of 4, sub-tiles `BM / (TM / 4)` apart) and its B fragment, then `TM x TN`
   multiply-adds into the register tile.
5. **Epilogue**: each output point through the stage's chain (bias, activation ...); when
   every stored tensor is float32 with N's innermost axis as its contiguous dimension, that
   axis' block a multiple of 4 and its extent too, four consecutive points go out as one
   16-byte store per tensor, else point by point, guarded.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, avar, block_origins,
                                    c_name, finish, flat_offset, global_resolver,
                                    group_signature, group_values, index_type, step_origins,
                                    store_sink, strides, tile_range_checks, tile_text, tvar)
from tilekit.codegen.mma import _unrolled
from tilekit.codegen.plan import GroupPlan, Read
from tilekit.codegen.staged import read_key
from tilekit.codegen.values import literal, store_value
from tilekit.schedule.mma import Operand
from tilekit.schedule.shape import KernelShape, Target
from tilekit.schedule.simt import SimtPlan
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import Const, Expr, Load, Var
from tilekit.tile.nodes import Alloc, Buffer, Layout


def simt_kernel(module, plan: GroupPlan, entry: str, decision: KernelShape, target: Target
                ) -> GeneratedKernel:
    p = plan.stages[0].main
    sp: SimtPlan = decision.simt
    tile = decision.tile
    c = sp.contraction
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    reads = list({read_key(r): r for r in p.read_list()}.values())
    ops = {"a": (c.a, reads[c.a.index]), "b": (c.b, reads[c.b.index])}
    smem = SharedMemory()
    bufs = {}
    for which, (op, read) in ops.items():
        layout = f"[k][{'m' if which == 'a' else 'n'}]" + (", transposed" if op.k_inner else "")
        bufs[which] = smem.carve(
            f"s_{which}", "float32", (2, sp.bk, sp.extent(op)),
            f"{read.tensor}: 2 buffers of {sp.bk}x{sp.extent(op)} ({layout})",
            Layout(pad=sp.pad(op)))
    b = Builder()
    origins = dict(zip(axes, block_origins(
        b, axes, extents, tile.block, idx_t,
        named=target.any_varying(p.op.name, axes))))
    ctx = _Context(module, p, sp, tile, origins, idx_t, bufs, ops, target)
    nsteps = math.prod(ctx.step_counts)
    acc = b.alloc("acc", "float32", (sp.tm, sp.tn), "the thread's register tile")
    regs = {w: _alloc(b, f"r_{w}", (sp.loads_per_thread(op), 4),
                      f"{read.tensor}: the next step's chunks")
            for w, (op, read) in ops.items()}
    with b.threads(sp.threads):
        with _unrolled(b, [("i", sp.tm), ("j", sp.tn)]) as (i, j):
            b.store(acc, (i, j), tx.const(0.0))
    b.comment("step 0: global -> registers -> buffer 0")
    with b.threads(sp.threads) as tid:
        first = _step_origins(b, ctx, tx.const(0))
        for w in ("a", "b"):
            _load_chunks(b, ctx, w, tid, tx.const(0), first, regs[w])
        for w in ("a", "b"):
            _store_chunks(b, ctx, w, tid, tx.const(0), regs[w])
    b.barrier()
    # (a K that varies keeps the next step's loads whatever this size's step count)
    several = nsteps > 1 or any((p.op.name, a) in target.varying for a, _ in p.reduction)
    with b.loop("s", 0, nsteps) as s:
        with b.threads(sp.threads) as tid:
            more = tx.lt(s + 1, nsteps)
            if several:
                with b.if_(more):
                    b.comment("the next step's chunks, while this step computes")
                    following = _step_origins(b, ctx, s + 1)
                    for w in ("a", "b"):
                        _load_chunks(b, ctx, w, tid, s + 1, following, regs[w])
            _compute(b, ctx, tid, tx.binary("&", s, 1), acc)
            if several:
                with b.if_(more):
                    for w in ("a", "b"):
                        _store_chunks(b, ctx, w, tid, tx.binary("&", s + 1, 1), regs[w])
        b.barrier()
    with b.threads(sp.threads) as tid:
        _epilogue(b, ctx, plan, tid, acc)
    sched = tile.describe(tuple(axes), tuple(a for a, _ in p.reduction))
    sched["simt"] = sp.record()
    vector = sched["simt"]["vector"]
    kernel = finish(plan, entry, sig, b.build(), shape="simt", schedule=sched,
                    threads=sp.threads, grid=math.prod(tile.grid(tuple(extents))),
                    shared=smem.all(), register_tile=True, target=target,
                    comments=[f"simt: a {sp.bm}x{sp.bn}x{sp.bk} block GEMM on CUDA cores, "
                              f"{sp.tm}x{sp.tn} per thread, double-buffered shared memory"
                              + (f", 16-byte loads of {', '.join(vector)}" if vector else ""),
                              f"shared memory: {sp.smem_bytes} bytes",
                              f"tile: {tile_text(tile, p)}"])
    assert kernel.smem_planned == sp.smem_bytes, "the program and the simt plan disagree"
    return kernel


class _Context:
    """What the pieces of one simt kernel share."""

    def __init__(self, module, p, sp: SimtPlan, tile, origins, idx_t, bufs, ops,
                 target: Target):
        self.module, self.p, self.sp, self.origins, self.idx_t = module, p, sp, origins, idx_t
        self.bufs, self.ops = bufs, ops
        self.extent = dict(p.spatial) | dict(p.reduction)
        self.size = {a: s for (a, _), s in zip(p.spatial, tile.block)}
        self.size.update({a: s for (a, _), s in zip(p.reduction, tile.step)})
        self.k_axes = [a for a, _ in p.reduction]
        self.step_counts = [-(-n // self.size[a]) for a, n in p.reduction]
        self.target = target

    def ragged(self, axis: str) -> bool:
        """Tiles or steps overhang `axis` (`Target.ragged`)."""
        return self.target.ragged(self.p.op.name, axis, self.extent[axis], self.size[axis])


def _alloc(b: Builder, name: str, shape: tuple[int, ...], comment: str) -> Buffer:
    """A local float32 buffer whose rows of 4 are read and written as 16-byte vectors."""
    buf = Buffer(b.name(name), "local", "float32", shape, comment=comment, align=16)
    b.emit(Alloc(buf))
    return buf


def _chunk(b: Builder, ctx: _Context, which: str, f: Expr) -> tuple[Expr, Expr]:
    """Chunk `f`'s (mn, k) position in the operand's step tile: four elements along the
    tensor's contiguous dimension from there. K-contiguous: two chunks per row (one 32-byte
    sector), then the next row, then the next pair of chunks; else along MN, then K."""
    op, _ = ctx.ops[which]
    sp = ctx.sp
    mn = sp.extent(op)
    if op.k_inner:
        pair = min(2, sp.bk // 4)
        row = b.let(f"{which}_mn_", tx.mod(tx.div(f, pair), mn))
        kq = b.let(f"{which}_k_", (tx.div(f, pair * mn) * pair + tx.mod(f, pair)) * 4)
        return row, kq
    quads = mn // 4
    return b.let(f"{which}_mn_", tx.mod(f, quads) * 4), b.let(f"{which}_k_", tx.div(f, quads))


def _each_chunk(b: Builder, ctx: _Context, which: str, tid: Var):
    """The thread's chunks of an operand: (slot, guard) pairs in an unrolled loop."""
    op, _ = ctx.ops[which]
    sp = ctx.sp
    count, total = sp.loads_per_thread(op), sp.chunks(op)
    stack = ExitStack()
    it = stack.enter_context(b.loop(f"{which}_it", 0, count, kind="unroll"))
    f = b.let(f"{which}_f_", tid + it * sp.threads)
    if total % sp.threads:
        stack.enter_context(b.if_(tx.lt(f, total)))
    return stack, it, f


def _load_chunks(b: Builder, ctx: _Context, which: str, tid: Var, step: Expr,
                 k_origin: dict[str, Expr] | None, regs: Buffer) -> None:
    """The thread's chunks (or elements) of step `step` of an operand into its registers
    (`k_origin`: the step's origin on each K axis, `_step_origins`)."""
    op, read = ctx.ops[which]
    sp = ctx.sp

    def at(mn: Expr, k: Expr) -> dict[str, Expr]:
        code = _group_at(ctx, op.mn_axes, mn, ctx.origins)
        if k_origin is None:        # one K axis: the step's origin and the position
            code[ctx.k_axes[0]] = tx.cast(ctx.idx_t, step * sp.bk + k)
        else:
            code.update(_group_at(ctx, ctx.k_axes, k, k_origin))
        code.update({a: ctx.origins[a] for a in sp.contraction.batch_axes})
        return code

    if not _vector(sp, which):
        for stack, slot, g in _each_element(b, ctx, which, tid):
            with stack:
                code = at(*_element(b, ctx, which, g))
                ok = tx.and_(*_bounds(ctx, code, op), *_window_checks(ctx, op, read, code))
                b.store(regs, slot, tx.select(
                    ok, Load(tvar(read.tensor), (flat_offset(read, code, {}),), "float32"),
                    tx.const(0.0)))
        return
    stack, it, f = _each_chunk(b, ctx, which, tid)
    with stack:
        code = at(*_chunk(b, ctx, which, f))
        ok = tx.and_(*_bounds(ctx, code, op))
        value = tx.select(ok, Load(tvar(read.tensor), (flat_offset(read, code, {}),),
                                   "float4", 4), Const(0.0, "float4"))
        b.store(regs, (it, 0), value, lanes=4)


def _step_origins(b: Builder, ctx: _Context, step: Expr) -> dict[str, Expr] | None:
    """Step `step`'s origin on each K axis when K has several (None for one: `step * BK`)."""
    if len(ctx.k_axes) == 1:
        return None
    return step_origins(b, step, [(a, n, ctx.size[a]) for a, n in ctx.p.reduction])


def _group_at(ctx: _Context, axes, local: Expr, origin) -> dict[str, Expr]:
    """Each axis of a group at flat position `local` (row-major over the block's or the
    step's sizes) from `origin[axis]`, in the index type."""
    return group_values(axes, local, [ctx.size[a] for a in axes], origin.__getitem__,
                        ctx.idx_t)


def _window_checks(ctx: _Context, op: Operand, read: Read, code: dict[str, Expr]
                   ) -> list[Expr]:
    """The range checks of a read that is not plain (a convolution's window: padding and
    halo); a plain read stays inside where its axes do (`_bounds`)."""
    if op.dim_axes is not None:
        return []
    return tile_range_checks(read, code, ctx.extent, ctx.size, ctx.idx_t)


def _vector(sp: SimtPlan, which: str) -> bool:
    return sp.a_vector if which == "a" else sp.b_vector


def _each_element(b: Builder, ctx: _Context, which: str, tid: Var):
    """Without 16-byte loads: the thread's elements `tid + n * threads` (n < 4 x loads), each
    with its register slot and a guard past the tile's end."""
    op, _ = ctx.ops[which]
    sp = ctx.sp
    total = 4 * sp.chunks(op)
    for n in range(4 * sp.loads_per_thread(op)):
        stack = ExitStack()
        g = b.let(f"{which}_g_", tid + n * sp.threads)
        if (n + 1) * sp.threads > total:
            stack.enter_context(b.if_(tx.lt(g, total)))
        yield stack, (tx.const(n // 4), tx.const(n % 4)), g


def _element(b: Builder, ctx: _Context, which: str, g: Expr) -> tuple[Expr, Expr]:
    """Element `g`'s (mn, k) in the operand's step tile, consecutive lanes along the tensor's
    contiguous dimension: for a K-contiguous operand 8 k of a row (one sector's worth; a
    warp's transposing stores then take 32 banks: 8 k apart by 4 banks, 4 rows), then the
    next row, then the next 8 k; else along MN, then K."""
    op, _ = ctx.ops[which]
    sp = ctx.sp
    mn = sp.extent(op)
    if op.k_inner:
        w = _k_run(sp.bk)
        return (b.let(f"{which}_mn_", tx.mod(tx.div(g, w), mn)),
                b.let(f"{which}_k_", tx.div(g, w * mn) * w + tx.mod(g, w)))
    return b.let(f"{which}_mn_", tx.mod(g, mn)), b.let(f"{which}_k_", tx.div(g, mn))


def _k_run(bk: int) -> int:
    """Consecutive lanes along K of a K-contiguous operand's scalar loads: the largest run
    of at most 9 that divides the step (8 for a power of two, 9 for whole 3 x 3 windows)."""
    return max(w for w in range(1, 10) if bk % w == 0)


def _bounds(ctx: _Context, code: dict[str, Expr], op: Operand) -> list[Expr]:
    """`axis < extent` on the axes whose tiles or steps overhang the tensor (for a chunk: at
    its first element, the chunk being wholly in or out)."""
    return [tx.lt(code[a], ctx.extent[a]) for a in (*op.mn_axes, *ctx.k_axes) if ctx.ragged(a)]


def _store_chunks(b: Builder, ctx: _Context, which: str, tid: Var, buf: Expr, regs: Buffer
                  ) -> None:
    """The thread's registers into buffer `buf` of an operand (transposed when
    K-contiguous)."""
    op, _ = ctx.ops[which]
    s_buf = ctx.bufs[which]
    if not _vector(ctx.sp, which):
        for stack, slot, g in _each_element(b, ctx, which, tid):
            with stack:
                mn, k = _element(b, ctx, which, g)
                b.store(s_buf, (buf, k, mn), Load(regs.name, slot, "float32"))
        return
    stack, it, f = _each_chunk(b, ctx, which, tid)
    with stack:
        mn, k = _chunk(b, ctx, which, f)
        if op.k_inner:
            for e in range(4):
                b.store(s_buf, (buf, k + e, mn), Load(regs.name, (it, tx.const(e)), "float32"))
        else:
            b.store(s_buf, (buf, k, mn), Load(regs.name, (it, tx.const(0)), "float4", 4),
                    lanes=4)


def _thread_coords(b: Builder, ctx: _Context, tid: Var) -> tuple[Var, Var]:
    """The thread's (row, column) among the block's threads: columns fastest, so that a
    warp's 8-lane quarters share a row of A and take 8 consecutive chunks of B."""
    n = ctx.sp.threads_n
    return b.let("t_m", tx.div(tid, n)), b.let("t_n", tx.mod(tid, n))


def _compute(b: Builder, ctx: _Context, tid: Var, buf: Expr, acc: Buffer) -> None:
    sp = ctx.sp
    t_m, t_n = _thread_coords(b, ctx, tid)
    fa = _alloc(b, "f_a", (sp.tm,), "A fragment")
    fb = _alloc(b, "f_b", (sp.tn,), "B fragment")
    with b.loop("kk", 0, sp.bk, kind="unroll") as kk:
        for frag, which, t, size, block in ((fa, "a", t_m, sp.tm, sp.bm),
                                            (fb, "b", t_n, sp.tn, sp.bn)):
            subs = size // 4
            for sub in range(subs):
                col = t * 4 + sub * (block // subs)
                b.store(frag, (tx.const(4 * sub),),
                        Load(ctx.bufs[which].name, (buf, kk, col), "float4", 4), lanes=4)
        with _unrolled(b, [("i", sp.tm), ("j", sp.tn)]) as (i, j):
            b.store(acc, (i, j), Load(acc.name, (i, j), "float32")
                    + Load(fa.name, (i,), "float32") * Load(fb.name, (j,), "float32"))


def _epilogue(b: Builder, ctx: _Context, plan: GroupPlan, tid: Var, acc: Buffer) -> None:
    """Every point of the register tile through the chain to memory (module docstring)."""
    sp, p, module = ctx.sp, ctx.p, ctx.module
    c = sp.contraction
    axes = [a for a, _ in p.spatial]
    t_m, t_n = _thread_coords(b, ctx, tid)
    stage = plan.stages[0]
    stored = [t for t in [stage.main.output] + [q.output for q in stage.chain]
              if t in plan.stored]
    inner = c.n_axes[-1]
    vector = (axes[-1] == inner and ctx.size[inner] % 4 == 0
              and not ctx.target.ragged(p.op.name, inner, ctx.extent[inner], 4) and all(
                  module.tensors[t].dtype == "float32"
                  and tuple(module.tensors[t].shape)[-1] == ctx.extent[inner] for t in stored))
    outs = {t: _alloc(b, "o_", (4,), f"four points of {t}") for t in stored} if vector else {}
    b.comment("epilogue: the register tile through the chain"
              + (", 16-byte stores" if vector else ""))
    subs_m, subs_n = sp.tm // 4, sp.tn // 4
    with _unrolled(b, [("si", subs_m), ("i", 4), ("sj", subs_n)]) as (si, i, sj):
        m_code = _group_lets(b, ctx, c.m_axes, t_m * 4 + si * (sp.bm // subs_m) + i,
                             lambda a: avar(a))
        n0_local = t_n * 4 + sj * (sp.bn // subs_n)
        row = si * 4 + i

        def point(e: Expr, n_code: dict[str, Expr], sink_of) -> None:
            code = m_code | n_code
            code.update({a: ctx.origins[a] for a in c.batch_axes})
            vars_ = [code[a] for a in axes]
            pb = PointBuilder(module, b, stage, vars_, global_resolver)
            value = Load(acc.name, (row, sj * 4 + e), "float32")
            if c.scale != 1.0:
                value = tx.mul(value, literal(c.scale, "f"))
            pb.epilogue(pb.main_value(p, (value, "f")), sink_of(vars_))

        m_ok = [tx.lt(m_code[a], ctx.extent[a]) for a in c.m_axes if ctx.ragged(a)]
        if vector:
            n0 = _group_lets(b, ctx, c.n_axes, n0_local,
                             lambda a: "n0" if len(c.n_axes) == 1 else f"n0_{c_name(a)}")
            n_ok = [tx.lt(n0[a], ctx.extent[a]) for a in c.n_axes if ctx.ragged(a)]
            with b.if_(tx.and_(*m_ok, *n_ok)):
                with b.loop("e", 0, 4, kind="unroll") as e:
                    n_code = dict(n0)
                    n_code[inner] = b.let(avar(inner), n0[inner] + tx.cast(ctx.idx_t, e),
                                          ctx.idx_t)

                    def to_registers(vars_):
                        def sink(tensor: str, value: Expr, kind: str) -> None:
                            if tensor in outs:
                                b.store(outs[tensor], (e,), store_value(value, "float32"))
                        return sink
                    point(e, n_code, to_registers)
                for t, o in outs.items():
                    code = m_code | n0
                    code.update({a: ctx.origins[a] for a in c.batch_axes})
                    offset = tx.linear(zip(strides(tuple(module.tensors[t].shape)),
                                           [code[a] for a in axes]), 0, ctx.idx_t)
                    b.store(tvar(t), (offset,), Load(o.name, (tx.const(0),), "float4", 4),
                            lanes=4)
        else:
            with b.loop("e", 0, 4, kind="unroll") as e:
                n_code = _group_lets(b, ctx, c.n_axes, n0_local + e, lambda a: avar(a))
                n_ok = [tx.lt(n_code[a], ctx.extent[a]) for a in c.n_axes if ctx.ragged(a)]
                with b.if_(tx.and_(*m_ok, *n_ok)):
                    point(e, n_code, lambda vars_: store_sink(module, b, plan.stored, vars_))


def _group_lets(b: Builder, ctx: _Context, axes, local: Expr, name_of) -> dict[str, Var]:
    """Each axis of a group at flat position `local` of the block, declared (`name_of`)."""
    return {a: b.let(name_of(a), v, ctx.idx_t)
            for a, v in _group_at(ctx, axes, local, ctx.origins).items()}


__all__ = ["simt_kernel"]
