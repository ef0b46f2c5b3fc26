"""The `mma` kernel shape: a contraction on tensor cores (`mma.sync`), per the shared plan.

`tilekit.schedule.mma.mma_plan` decided the block GEMM (`BM x BN` outputs, `BK` reduction
points per step), the warps (`wm x wn`, each `MT x NT` instructions of 16x8), each operand's
shared-memory layout and whether it is copied with `cp.async`; this module builds its tile
program:

1. **Copies.** `stages` buffers per operand (`[stages][rows][length]`). A step's tile of an
   operand is, per element, the read at the tile's axes (an implicit GEMM: a convolution's
   input tile is gathered through its index maps, halo and padding included), stored in the
   tensor's own type. Operands whose rows are contiguous 16-byte chunks of the tensor are
   copied with `cp.async` (zero-filled outside it); the others element by element.
2. **Pipeline.** The step loop is `pipelined` with the plan's stages: the pipelining pass
   (tilekit.tile.passes.pipeline) issues the copies `stages - 1` steps ahead; the layout pass
   pads the rows so that `ldmatrix` reads them without bank conflicts.
3. **Fragments.** fp16/bf16 operands come into registers with `ldmatrix` (`.trans` for a
   tile stored `[k][mn]`), tf32 operands by scalar loads in the fragment layout, rounded with
   `cvt.rna.tf32`; then `MT x NT` instructions per k-slice, the slices of a step unrolled
   (`UNROLLED_SLICES` at a time in a long step).
4. **Epilogue.** Each accumulator element, at its row and column of the block GEMM, is mapped
   back to the output's axes, scaled, and goes through the stage's elementwise chain to memory.

Fragment layouts and instructions are runtime.cuh's helpers (emulated on the CPU by
host_emul.h and by the tile interpreter from the same documented layouts).
"""

from __future__ import annotations

import math
from contextlib import ExitStack

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, avar, block_origins,
                                    finish, flat_offset, global_resolver, group_signature,
                                    group_values, index_type, step_origins, store_sink,
                                    tile_range_checks, tile_text, tvar)
from tilekit.codegen.plan import GroupPlan, OpPlan
from tilekit.codegen.staged import read_key
from tilekit.codegen.values import literal
from tilekit.schedule.mma import MmaPlan, Operand
from tilekit.schedule.shape import KernelShape, Target
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import Addr, Const, Expr, Load, Var
from tilekit.tile.nodes import Buffer, Copy

#: A step's k-slices unrolled at once: all of them up to this many, else this many at a time.
#: Wholly unrolled, a step of many slices has nvcc load every slice's fragments up front: an
#: Inception v1 5 x 5 convolution in fp16 (16 channels x 25 window points, one step of 25
#: slices) took 255 registers and spilled 48 bytes a thread for sm_90; by 8 slices, 87
#: registers and no spill (by 4 or 5, 79).
UNROLLED_SLICES = 8

#: mma.sync instruction of each compute type (tilekit.tile.functions).
INSTRUCTION = {"m16n8k16.f16": "mma_m16n8k16_f16", "m16n8k16.bf16": "mma_m16n8k16_bf16",
               "m16n8k8.tf32": "mma_m16n8k8_tf32"}


def mma_kernel(module, plan: GroupPlan, entry: str, decision: KernelShape, target: Target
               ) -> GeneratedKernel:
    p = plan.stages[0].main
    mp = decision.mma
    tile = decision.tile
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    name, _, _, ik, _, _ = mp.instruction
    reads = {read_key(r): r for r in p.read_list()}
    facts_reads = list(reads.values())
    ops = {"a": (mp.contraction.a, facts_reads[mp.contraction.a.index]),
           "b": (mp.contraction.b, facts_reads[mp.contraction.b.index])}
    smem = SharedMemory()
    bufs: dict[str, Buffer] = {}
    for which, (op, read) in ops.items():
        rows, length = mp.tile_shape(op)
        bufs[which] = smem.carve(f"s_{which}", read.dtype, (mp.stages, rows, length),
                                 f"{read.tensor}: {mp.stages} stages of {rows}x{length} "
                                 f"({'[mn][k]' if op.k_inner else '[k][mn]'})")
    b = Builder()
    origins = dict(zip(axes, block_origins(
        b, axes, extents, tile.block, idx_t,
        named=target.any_varying(p.op.name, axes))))
    acc = b.alloc("acc", "float32", (mp.mt, mp.nt, 4), "the warp tile's accumulators")
    with b.threads(tile.threads):
        with _unrolled(b, [("i", mp.mt), ("j", mp.nt), ("r", 4)]) as (i, j, r):
            b.store(acc, (i, j, r), tx.const(0.0))
    steps = [(a, n, s) for (a, n), s in zip(p.reduction, tile.step)]
    nsteps = math.prod(-(-n // s) for _, n, s in steps)
    ctx = _Context(module, p, mp, tile, origins, steps, idx_t, bufs, ops, target)
    with b.loop("s", 0, nsteps, kind="pipelined", stages=mp.stages) as s:
        step_origin = step_origins(b, s, ctx.steps)
        for which in ("a", "b"):
            b.emit(_operand_copy(b, ctx, which, s, step_origin))
        with b.threads(tile.threads) as tid:
            buf = b.let("buf", tx.mod(s, mp.stages))
            warp = _warp_coords(b, ctx, tid)
            slices = mp.bk // ik
            with b.loop("kk", 0, mp.bk, ik, kind="unroll",
                        unroll=UNROLLED_SLICES if slices > UNROLLED_SLICES else 0) as kk:
                _fragments_and_mma(b, ctx, buf, kk, warp, acc)
    with b.threads(tile.threads) as tid:
        _epilogue(b, ctx, plan, module, _warp_coords(b, ctx, tid), acc)
    sched = tile.describe(tuple(axes), tuple(a for a, _ in p.reduction))
    sched["mma"] = mp.record()
    asyncs = [n for n, on in (("a", mp.a_async), ("b", mp.b_async)) if on]
    kernel = finish(plan, entry, sig, b.build(), shape="mma", schedule=sched,
                    threads=tile.threads, grid=math.prod(tile.grid(tuple(extents))),
                    shared=smem.all(), register_tile=True, target=target,
                    comments=[f"mma: mma.sync.{name} on a {mp.bm}x{mp.bn}x{mp.bk} block GEMM, "
                              f"{mp.wm}x{mp.wn} warps of {mp.mt}x{mp.nt} instructions, "
                              f"{mp.stages} stages"
                              + (f", cp.async for {', '.join(asyncs)}" if asyncs else ""),
                              f"shared memory: {mp.smem_bytes} bytes",
                              f"tile: {tile_text(tile, p)}"])
    assert kernel.smem_planned == mp.smem_bytes, "the program and the mma plan disagree"
    return kernel


class _Context:
    """What the pieces of one mma kernel share."""

    def __init__(self, module, p: OpPlan, mp: MmaPlan, tile, origins, steps, idx_t, bufs, ops,
                 target: Target):
        self.module, self.p, self.mp, self.tile = module, p, mp, tile
        self.origins, self.steps, self.idx_t = origins, steps, idx_t
        self.bufs, self.ops = bufs, ops
        self.size = {a: s for (a, _), s in zip(p.spatial, tile.block)}
        self.size.update({a: s for a, _, s in steps})
        self.extent = dict(p.spatial) | dict(p.reduction)
        self.target = target

    def ragged(self, axis: str) -> bool:
        """The tiles or steps overhang `axis` (`Target.ragged`)."""
        return self.target.ragged(self.p.op.name, axis, self.extent[axis],
                                  self.size.get(axis, 1))

    def group_sizes(self, axes) -> list[int]:
        return [self.size[a] for a in axes]


class _unrolled:
    """Nested unrolled loops over (name, extent) pairs; yields their variables."""

    def __init__(self, b: Builder, loops) -> None:
        self.b, self.loops = b, loops
        self.stack = ExitStack()

    def __enter__(self):
        return tuple(self.stack.enter_context(self.b.loop(n, 0, e, kind="unroll"))
                     for n, e in self.loops)

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


def _warp_coords(b: Builder, ctx: _Context, tid: Var) -> dict[str, Var]:
    mp = ctx.mp
    warp = b.let("warp", tx.div(tid, 32))
    lane = b.let("lane", tx.mod(tid, 32))
    return {"lane": lane, "g": b.let("g", tx.div(lane, 4)), "q": b.let("q", tx.mod(lane, 4)),
            "wm0": b.let("wm0", tx.mul(tx.div(warp, mp.wn), mp.warp_m)),
            "wn0": b.let("wn0", tx.mul(tx.mod(warp, mp.wn), mp.warp_n))}


def _operand_copy(b: Builder, ctx: _Context, which: str, s: Var,
                  step_origin: dict[str, Expr]) -> Copy:
    """One operand's tile of step `s` into stage buffer `s % stages`."""
    op, read = ctx.ops[which]
    mp = ctx.mp
    c = mp.contraction
    b.comment(f"operand {which}: {read.tensor}[{', '.join(str(m) for m in read.maps)}], "
              f"{'cp.async 16-byte chunks' if _async(mp, which) else 'element by element'}")
    row, col = b.var(f"{which}r_"), b.var(f"{which}c_")
    mn_local, k_local = (row, col) if op.k_inner else (col, row)
    code = group_values(op.mn_axes, mn_local, ctx.group_sizes(op.mn_axes),
                        lambda a: ctx.origins[a])
    code.update(group_values(c.k_axes, k_local, ctx.group_sizes(c.k_axes),
                             lambda a: step_origin[a]))
    code.update({a: ctx.origins[a] for a in c.batch_axes})
    code = {a: tx.cast(ctx.idx_t, v) for a, v in code.items()}
    checks = [tx.lt(code[a], ctx.extent[a]) for a in code if ctx.ragged(a)]
    checks += tile_range_checks(read, code, ctx.extent, ctx.size, ctx.idx_t)
    zero = tx.cast(read.dtype, tx.const(0.0)) if read.dtype in ("float16", "bfloat16") \
        else tx.as_expr(0.0 if read.dtype.startswith("float") else 0, read.dtype)
    return Copy(ctx.bufs[which].name, (tx.mod(s, mp.stages),), (row, col), tvar(read.tensor),
                flat_offset(read, code, {}), tx.and_(*checks), zero,
                asynchronous=_async(mp, which))


def _async(mp: MmaPlan, which: str) -> bool:
    return mp.a_async if which == "a" else mp.b_async


def _tile_at(ctx: _Context, which: str, op: Operand, buf: Expr, mn: Expr, k: Expr) -> Addr:
    """The address of an operand tile's element (mn, k) in stage buffer `buf`."""
    r, c = (mn, k) if op.k_inner else (k, mn)
    return Addr(ctx.bufs[which].name, (buf, r, c))


def _fragments_and_mma(b: Builder, ctx: _Context, buf: Var, kk: Var, w: dict[str, Var],
                       acc: Buffer) -> None:
    """One k-slice: every warp's A and B fragments, then its MT x NT instructions."""
    mp = ctx.mp
    a_op, _ = ctx.ops["a"]
    b_op, _ = ctx.ops["b"]
    af = b.alloc("af", "uint32", (mp.mt, 4))
    bfr = b.alloc("bf", "uint32", (mp.nt, 2))
    if mp.compute == "tf32":
        _tf32_fragments(b, ctx, "a", a_op, mp.mt, buf, kk, w, af)
        _tf32_fragments(b, ctx, "b", b_op, mp.nt, buf, kk, w, bfr)
    else:
        _ldmatrix_a(b, ctx, a_op, buf, kk, w, af)
        _ldmatrix_b(b, ctx, b_op, buf, kk, w, bfr)
    fn = INSTRUCTION[mp.instruction[0]]
    with _unrolled(b, [("i", mp.mt), ("j", mp.nt)]) as (i, j):
        b.evaluate(tx.call(fn, Addr(acc.name, (i, j)), Addr(af.name, (i,)),
                           Addr(bfr.name, (j,))))


def _ldmatrix_a(b: Builder, ctx, op: Operand, buf, kk, w, af: Buffer) -> None:
    """A 16x16 fragments: lane L addresses row L % 16 (columns 8 x L / 16) of [m][k], or
    with .trans, k-row (L / 16) * 8 + L % 8, m-column 8 x ((L / 8) % 2) of [k][m]."""
    lane = w["lane"]
    with b.loop("i", 0, ctx.mp.mt, kind="unroll") as i:
        if op.k_inner:
            at = _tile_at(ctx, "a", op, buf, w["wm0"] + i * 16 + tx.mod(lane, 16),
                          kk + tx.div(lane, 16) * 8)
            b.evaluate(tx.call("ldmatrix_x4", Addr(af.name, (i,)), at))
        else:
            at = _tile_at(ctx, "a", op, buf,
                          w["wm0"] + i * 16 + tx.mod(tx.div(lane, 8), 2) * 8,
                          kk + tx.div(lane, 16) * 8 + tx.mod(lane, 8))
            b.evaluate(tx.call("ldmatrix_x4_trans", Addr(af.name, (i,)), at))


def _ldmatrix_b(b: Builder, ctx, op: Operand, buf, kk, w, bfr: Buffer) -> None:
    """B fragments two 8-column tiles at a time: lane L addresses n-row L % 8 + 8 x (L / 16),
    k-column 8 x ((L / 8) % 2) of [n][k], or with .trans k-row L % 8 + 8 x ((L / 8) % 2),
    n-column 8 x (L / 16) of [k][n]."""
    lane = w["lane"]
    with b.loop("j", 0, ctx.mp.nt, 2, kind="unroll") as j:
        r4 = b.alloc("r4_", "uint32", (4,))
        if op.k_inner:
            at = _tile_at(ctx, "b", op, buf,
                          w["wn0"] + j * 8 + tx.mod(lane, 8) + tx.div(lane, 16) * 8,
                          kk + tx.mod(tx.div(lane, 8), 2) * 8)
            b.evaluate(tx.call("ldmatrix_x4", Addr(r4.name, ()), at))
        else:
            at = _tile_at(ctx, "b", op, buf, w["wn0"] + j * 8 + tx.div(lane, 16) * 8,
                          kk + tx.mod(lane, 8) + tx.mod(tx.div(lane, 8), 2) * 8)
            b.evaluate(tx.call("ldmatrix_x4_trans", Addr(r4.name, ()), at))
        for n, (jj, h) in enumerate(((j, 0), (j, 1), (j + 1, 0), (j + 1, 1))):
            b.store(bfr, (jj, h), Load(r4.name, (tx.const(n),), "uint32"))


def _tf32_fragments(b: Builder, ctx, which: str, op: Operand, count: int, buf, kk, w,
                    frag: Buffer) -> None:
    """tf32 fragments by scalar loads: A (16x8) a0 = A[g][q], a1 = A[g+8][q], a2 = A[g][q+4],
    a3 = A[g+8][q+4]; B (8x8) b0 = B[q][g], b1 = B[q+4][g]."""
    g, q = w["g"], w["q"]
    with b.loop("i", 0, count, kind="unroll") as i:
        base = w["wm0"] + i * 16 if which == "a" else w["wn0"] + i * 8
        if which == "a":
            places = [(g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4)]
        else:
            places = [(g, q), (g, q + 4)]
        for n, (mn, k) in enumerate(places):
            at = _tile_at(ctx, which, op, buf, base + mn, kk + k)
            value = Load(at.buffer, at.index, ctx.bufs[which].dtype)
            b.store(frag, (i, n), tx.call("to_tf32", value))


def _epilogue(b: Builder, ctx: _Context, plan: GroupPlan, module, w: dict[str, Var],
              acc: Buffer) -> None:
    """Each accumulator element back to the output's axes, scaled, through the chain."""
    mp, p = ctx.mp, ctx.p
    c = mp.contraction
    axes = [a for a, _ in p.spatial]
    b.comment("epilogue: accumulators to the output's axes, through the chain")
    with _unrolled(b, [("i", mp.mt), ("j", mp.nt), ("r", 4)]) as (i, j, r):
        row = b.let("row", w["wm0"] + i * 16 + w["g"] + tx.binary(">>", r, 1) * 8)
        col = b.let("col", w["wn0"] + j * 8 + w["q"] * 2 + tx.binary("&", r, 1))
        code = group_values(c.m_axes, row, ctx.group_sizes(c.m_axes), lambda a: ctx.origins[a])
        code.update(group_values(c.n_axes, col, ctx.group_sizes(c.n_axes),
                                 lambda a: ctx.origins[a]))
        code.update({a: ctx.origins[a] for a in c.batch_axes})
        vars_ = [b.let(avar(a), code[a], ctx.idx_t) for a in axes]
        pb = PointBuilder(module, b, plan.stages[0], vars_, global_resolver)
        bounds = tx.and_(*(tx.lt(v, n) for v, (a, n) in zip(vars_, p.spatial)
                           if ctx.ragged(a)))
        value = Load(acc.name, (i, j, r), "float32")
        if c.scale != 1.0:
            value = tx.mul(value, literal(c.scale, "f"))
        with b.if_(bounds):
            pb.epilogue(pb.main_value(p, (value, "f")),
                        store_sink(module, b, plan.stored, vars_))


__all__ = ["mma_kernel"]
