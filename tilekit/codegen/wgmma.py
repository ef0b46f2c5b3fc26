"""The `wgmma` kernel shape: a contraction on Hopper's tensor cores, per the shared plan.

`tilekit.schedule.mma.wgmma_plan` decided the block GEMM (`BM x BN` outputs, 64 reduction
points per step), the consumer warpgroups, the pipeline depth, the grid and the epilogue;
this module builds its tile program, blocks of `128 x (consumers + 1)` threads:

0. **Pieces of work.** A piece is an output tile (with split-K, a tile and a slice of the
   reduction). Block `b` runs pieces `b, b + gridDim, ...`: one when the grid has a block per
   piece, several when the plan made the grid persistent (more pieces than resident blocks).
   Piece `u`'s tile is the `u`-th of a grouped order (`RASTER_GROUP` tiles down M, then
   across N) so that the blocks running at once share operand panels in L2.
1. **Barriers.** Thread 0 initialises two mbarriers per stage, once per block: `full[s]` (one
   arrival: the producer's `expect_tx` of the stage's bytes; the TMA copies complete the
   rest) and `empty[s]` (one arrival per consumer warpgroup), then fences them for the
   asynchronous proxy; a block barrier publishes them.
2. **Producer** (warpgroup 0, `setmaxnreg` down to 40 registers with two consumers; one
   thread issues): for every step of every piece, wait until the consumers released the
   stage buffer (`empty`, the parity trick: the first round passes at once), announce the
   stage's bytes on `full` and issue the TMA box copies of the A and B tiles. A tensor map
   per operand (`TensorMap`: the tensor's dimensions innermost first, a box of one 128-byte
   row of contiguous elements by the tile, 128-byte swizzle) is a kernel parameter
   (`__grid_constant__`), built by the host at launch from the kernel record
   (`tensor_maps`); the copies zero-fill outside the tensor, so boundary tiles and a partial
   last step need no other code.
3. **Consumers** (warpgroups 1.., `setmaxnreg` up to 232 with two): per piece, zero the
   accumulators; per step wait for `full`, then per k-slice (16 elements; tf32 8) one
   `wgmma.mma_async.m64nBNk16` (`k8` for tf32) per 64 rows they own, both operands read from
   shared memory through matrix descriptors (K-major tiles: rows of 128 bytes, 8-row groups
   1024 bytes apart; M/N-major tiles: 64-element strips, `trans` set), commit, wait until
   only that batch is in flight and release the previous step's stage (`empty`; after a
   piece's last step, wait for all and release its stage). Both roles count the steps they ran over all their pieces: step `g`
   uses stage `g % stages` and parity `(g / stages) & 1`, so the barriers' phases carry
   over from one tile to the next, and the producer runs into the next piece's loads while
   the consumers finish the last one's epilogue.
4. **Epilogue.** Each accumulator (the PTX ISA's layout of wgmma's D: warp `w` of the
   warpgroup holds rows `16w..16w+15`, value `i` of lane `l` is row `16w + l/4 + 8((i/2)%2)`,
   column `8(i/4) + 2(l%4) + i%2`) is mapped back to the output's axes, scaled, and goes
   through the stage's chain; then either to shared memory in 128-byte swizzled column
   strips that the warpgroup's first thread stores with TMA (`store_epilogue`), or straight
   to memory (`epilogue`, boundary tiles guarded).

The intrinsics are runtime.cuh's helpers (inline PTX for sm_90a), emulated on the CPU by
host_emul.h and by the tile interpreter from the same documented layouts.
"""

from __future__ import annotations

import math

from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, Signature, avar,
                                    c_name, decompose, generated, global_resolver,
                                    grid_stride_end, group_signature, index_type, store_sink,
                                    tvar, tile_text)
from tilekit.schedule.defaults import DEFAULT_THREADS, default_grid
from tilekit.codegen.plan import GroupPlan, Read
from tilekit.codegen.staged import read_key
from tilekit.codegen.values import literal, store_value
from tilekit.schedule.mma import (RASTER_GROUP, STORE_STRIP, SWIZZLE_ALIGN, WARPGROUP, WGMMA,
                                  WGMMA_M, Operand, WgmmaPlan)
from tilekit.schedule.shape import KernelShape, Target
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import BLOCK, ITEMSIZE, NBLOCKS, Addr, Expr, Load, Var
from tilekit.tile.nodes import Buffer, Kernel, Layout, TensorMap

#: Bytes of one swizzle row (a K-major tile row, an M/N-major strip row) and of the 8-row
#: group the swizzle repeats over: the descriptors' offsets.
SWIZZLE_ROW = 128
SWIZZLE_GROUP = 1024
#: A K-major descriptor's leading byte offset is unused with a swizzle (PTX: "assumed 1").
UNUSED_LBO = 16


def wgmma_kernels(module, plan: GroupPlan, entry: str, decision: KernelShape, target: Target,
                  reduce_entry=None) -> list[GeneratedKernel]:
    """The group's kernels: one, or with split-K (`WgmmaPlan.split` > 1) the partial-sum
    kernel and the kernel that adds the slices in order and runs the chain (`reduce_entry()`
    names its entry)."""
    wp = decision.wgmma
    if wp.split == 1:
        return [wgmma_kernel(module, plan, entry, decision, target)]
    scratch = f"{plan.name}__partials"
    first = wgmma_kernel(module, plan, entry, decision, target, scratch)
    return [first, split_reduce_kernel(module, plan, reduce_entry(), wp, scratch, target)]


def wgmma_kernel(module, plan: GroupPlan, entry: str, decision: KernelShape, target: Target,
                 scratch: str | None = None) -> GeneratedKernel:
    """The wgmma kernel (module docstring); with `scratch` (split-K) each block owns a tile
    and a slice of the reduction and stores its fp32 partial sums there, slice-major."""
    p = plan.stages[0].main
    wp = decision.wgmma
    c = wp.contraction
    tile = decision.tile
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    reads = list({read_key(r): r for r in p.read_list()}.values())
    ops = {"a": (c.a, reads[c.a.index]), "b": (c.b, reads[c.b.index])}
    if scratch is None:
        sig = group_signature(module, plan)
        params, args, writes = sig.params(), sig.args, tuple(sig.writes)
    else:
        sig = Signature(module)
        for _, read in ops.values():
            sig.read(read.tensor)
        points = math.prod(extents)
        params = sig.params() + (Buffer(tvar(scratch), "global", "float32",
                                        (wp.split * points,), access="write",
                                        comment=f"{wp.split} slices of partial sums"),)
        args, writes = sig.args + (scratch,), (scratch,)
    idx_t = index_type(module, sig.args)
    smem = SharedMemory()
    bufs = {w: _stage_buffer(smem, wp, w, op, read) for w, (op, read) in ops.items()}
    store = None if scratch is None else "split-K stores partial sums"
    store = store or _store_reason(module, plan, wp, extents)
    out = None
    if wp.tma_store:          # the strip buffer the plan reserved (unused when `store`)
        out = next(t for t in plan.stages[0].outputs if t in plan.stored) if store is None \
            else None
        dtype = module.tensors[out].dtype if out else "float32"
        strips = smem.carve("s_c", dtype, (wp.store_buffers, wp.bm,
                                           STORE_STRIP // ITEMSIZE[dtype]),
                            f"the TMA store's strips: {wp.store_buffers} x {wp.bm} rows of "
                            f"{STORE_STRIP} bytes, 128-byte swizzle"
                            + ("" if out else f" (unused: {store})"),
                            Layout(swizzle=SWIZZLE_ROW))
    bars = smem.carve("s_bar", "int64", (2 * wp.stages,),
                      f"mbarriers: full[{wp.stages}] then empty[{wp.stages}]")
    maps = {w: _tensor_map(w, op, read, wp, c) for w, (op, read) in ops.items()}
    if out is not None:
        maps["c"] = _store_map(module, out, wp)
    b = Builder()
    tiles = math.prod(tile.grid(tuple(extents)))
    assert tiles == wp.tiles, "the program and the wgmma plan disagree on the tiles"
    total = -(-dict(p.reduction)[c.k_axes[0]] // wp.bk)
    b.comment(f"{wp.units} pieces of work ({tiles} output tiles"
              + (f" x {wp.split} reduction slices" if scratch is not None else "")
              + f") on {wp.grid} blocks: block b runs pieces b, b + blocks, ..."
              + (" (persistent)" if wp.persistent else ""))
    g = _Gen(b, module, plan, wp, ops, bufs, bars, maps, axes, extents, total, idx_t)
    g.scratch = scratch
    if out is not None:
        g.store = (out, strips)
    g.init_barriers()
    with b.threads(wp.threads) as tid:
        wg = b.let("wg", tx.div(tid, WARPGROUP))
        with b.if_(tx.eq(wg, 0)):
            g.producer(tid)
        with b.else_():
            g.consumer(tid, wg)
    sched = tile.describe(tuple(axes), tuple(a for a, _ in p.reduction))
    sched["wgmma"] = wp.record()
    if wp.tma_store and out is None:
        sched["wgmma"]["epilogue"] = f"direct ({store})"
    name = WGMMA[wp.compute][0]
    program = Kernel(entry, params, smem.all(), b.build(), wp.threads, wp.grid, 1, (
                         f"wgmma: wgmma.mma_async.m64n{wp.bn}k{wp.ik}.f32.{name} on a "
                         f"{wp.bm}x{wp.bn}x{wp.bk} block GEMM, a producer warpgroup (TMA) and "
                         f"{wp.consumers} consumer warpgroup(s) of {wp.mt} instruction(s) "
                         f"each, {wp.stages} stages on mbarriers",
                         f"schedule: {wp.units} tiles on {wp.grid} blocks"
                         + (", persistent" if wp.persistent else "")
                         + f", in groups of {RASTER_GROUP} along M",
                         f"shared memory: {wp.smem_bytes} bytes (128-byte swizzled tiles)",
                         f"tile: {tile_text(tile, p)}"),
                     tensor_maps=tuple(maps.values()), smem_align=SWIZZLE_ALIGN)
    kernel = generated(program, name=plan.name, group=plan.kernel.name,
                       ops=tuple(plan.kernel.ops), shape="wgmma", schedule=sched,
                       args=args, writes=writes, target=target.kind)
    assert kernel.smem_planned == wp.smem_bytes, "the program and the wgmma plan disagree"
    if scratch is not None:
        kernel = replace(kernel, scratch={scratch: wp.split * math.prod(extents)})
    return kernel


def split_reduce_kernel(module, plan: GroupPlan, entry: str, wp: WgmmaPlan, scratch: str,
                        target: Target) -> GeneratedKernel:
    """Split-K's second kernel: per output point (grid-stride, `DEFAULT_THREADS` threads) the
    slices' partial sums added in slice order (the same result on every run), scaled, then
    the stage's chain to memory."""
    stage = plan.stages[0]
    p = stage.main
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    points = math.prod(extents)
    sig = Signature(module)
    produced = set(stage.outputs)
    for q in stage.chain:
        for r in q.read_list():
            if r.tensor not in produced:
                sig.read(r.tensor)
    for t in stage.outputs:
        if t in plan.stored:
            sig.write(t)
    part = Buffer(tvar(scratch), "global", "float32", (wp.split * points,),
                  comment=f"{wp.split} slices of partial sums")
    threads = DEFAULT_THREADS
    grid = default_grid(points, threads)
    idx_t = index_type(module, sig.args, grid_stride_end(points, grid, threads))
    b = Builder()
    with b.threads(threads) as tid:
        start = tx.cast(idx_t, BLOCK) * threads + tid
        with b.loop("p", start, points, tx.cast(idx_t, NBLOCKS) * threads, dtype=idx_t) as pt:
            vars_ = decompose(b, pt, extents, [avar(a) for a in axes], idx_t)
            total = b.decl("sum_", "float32", tx.const(0.0))
            with b.loop("sl", 0, wp.split) as sl:
                b.assign(total, tx.add(total, Load(part.name, (
                    tx.add(tx.mul(tx.cast(idx_t, sl), points), pt),), "float32")))
            value = total if wp.contraction.scale == 1.0 else \
                tx.mul(total, literal(wp.contraction.scale, "f"))
            pb = PointBuilder(module, b, stage, vars_, global_resolver)
            pb.epilogue(pb.main_value(p, (value, "f")),
                        store_sink(module, b, plan.stored, vars_))
    program = Kernel(entry, (part,) + sig.params(), (), b.build(), threads, grid, None, (
        f"split-K reduction: {wp.split} slices of partial sums added in order, then the "
        "chain",))
    kernel = generated(program, name=f"{plan.name}__splitk", group=plan.kernel.name,
                       ops=tuple(plan.kernel.ops), shape="splitk_reduce",
                       schedule={"split_k": wp.split, "threads": threads},
                       args=(scratch,) + sig.args, writes=tuple(sig.writes), target=target.kind)
    return replace(kernel, scratch={scratch: wp.split * points})


def _store_reason(module, plan: GroupPlan, wp: WgmmaPlan, extents: list[int]) -> str | None:
    """Why this group's epilogue cannot use the TMA store the plan allows (None: it can):
    the stage must store exactly one tensor, over the op's output points, of fp32, fp16 or
    bf16."""
    stage = plan.stages[0]
    stored = [t for t in stage.outputs if t in plan.stored]
    if len(stored) != 1:
        return f"the group stores {len(stored)} tensors of this stage"
    t = module.tensors[stored[0]]
    if tuple(t.shape) != tuple(extents):
        return f"{stored[0]} is not over the op's output points"
    if t.dtype not in ("float32", "float16", "bfloat16"):
        return f"{stored[0]} is {t.dtype}"
    if (t.shape[-1] * ITEMSIZE[t.dtype]) % 16:
        return f"rows of {stored[0]} are not whole 16-byte units"
    return None


def _store_map(module, tensor: str, wp: WgmmaPlan) -> TensorMap:
    """The output's TMA descriptor: boxes of one 128-byte strip (32 fp32 or 64 16-bit
    columns) by a consumer warpgroup's rows (1 along batch axes)."""
    t = module.tensors[tensor]
    shape = tuple(t.shape)
    item = ITEMSIZE[t.dtype]
    box = [1] * (len(shape) - 2) + [wp.mt * WGMMA_M, STORE_STRIP // item]
    strides = [item * math.prod(shape[d + 1:]) for d in range(len(shape))]
    return TensorMap("tm_c", tvar(tensor), t.dtype, tuple(reversed(shape)),
                     tuple(reversed(strides[:-1])), tuple(reversed(box)), SWIZZLE_ROW)


def _stage_buffer(smem: SharedMemory, wp: WgmmaPlan, which: str, op: Operand, read: Read
                  ) -> Buffer:
    """`stages` tiles of an operand: K-major `[stage][atom][mn][128 bytes of k]` (rows of 128
    bytes; a step's 64 k are one atom of 16-bit elements, two of tf32), M/N-major
    `[stage][strip][64 k][64 mn]` (strips of 64 16-bit elements along M or N)."""
    mn = wp.bm if which == "a" else wp.bn
    if op.k_inner:
        shape, how = (wp.stages, wp.atoms, mn, wp.row), f"[atom {wp.atoms}][mn {mn}][k {wp.row}]"
    else:
        shape, how = (wp.stages, mn // 64, wp.bk, 64), f"[strip {mn // 64}][k {wp.bk}][mn 64]"
    return smem.carve(f"s_{which}", read.dtype, shape,
                      f"{read.tensor}: {wp.stages} stages of {how}, 128-byte swizzle",
                      Layout(swizzle=SWIZZLE_ROW))


def _tensor_map(which: str, op: Operand, read: Read, wp: WgmmaPlan, c) -> TensorMap:
    """The operand's TMA descriptor: its tensor, innermost dimension first, a box of one
    128-byte row of contiguous elements (64 16-bit, 32 tf32) by the tile's rows (the MN tile
    for K-major, 64 k for M/N-major; 1 along batch axes)."""
    shape = tuple(read.shape)
    item = ITEMSIZE[read.dtype]
    mn = wp.bm if which == "a" else wp.bn
    box = []
    for d, a in enumerate(op.dim_axes):
        if d == len(shape) - 1:
            box.append(SWIZZLE_ROW // item)
        elif a == c.k_axes[0]:
            box.append(wp.bk)
        elif a == op.mn_axes[0]:
            box.append(mn)
        else:
            box.append(1)
    strides = [item * math.prod(shape[d + 1:]) for d in range(len(shape))]
    return TensorMap(f"tm_{which}", tvar(read.tensor), read.dtype, tuple(reversed(shape)),
                     tuple(reversed(strides[:-1])), tuple(reversed(box)), SWIZZLE_ROW)


class _Gen:
    """The pieces of one wgmma program (module docstring)."""

    def __init__(self, b: Builder, module, plan: GroupPlan, wp: WgmmaPlan, ops, bufs, bars,
                 maps, axes: list[str], extents: list[int], total: int, idx_t: str) -> None:
        self.b, self.module, self.plan, self.wp = b, module, plan, wp
        self.ops, self.bufs, self.bars, self.maps = ops, bufs, bars, maps
        self.axes, self.extents, self.total, self.idx_t = axes, extents, total, idx_t
        self.scratch: str | None = None      # split-K: the partial sums' buffer
        #: the TMA store epilogue: (the stored tensor, the strip buffer), or None
        self.store: tuple[str, Buffer] | None = None
        # the piece of work in progress (`work`): its tile's origins, its reduction slice,
        # its first step and its steps
        self.origins: dict[str, Expr] = {}
        self.slice: Expr | None = None
        self.k_first: Expr = tx.const(0)
        self.nsteps: Expr = tx.const(total)

    def full(self, stage: Expr) -> Addr:
        return Addr(self.bars.name, (stage,))

    def empty(self, stage: Expr) -> Addr:
        return Addr(self.bars.name, (tx.add(stage, self.wp.stages),))

    def init_barriers(self) -> None:
        b, wp = self.b, self.wp
        b.comment("mbarriers: full (the producer's expect_tx, then the copies' bytes), empty "
                  "(one arrival per consumer warpgroup)")
        with b.threads(wp.threads) as tid:
            with b.if_(tx.eq(tid, 0)):
                with b.loop("st", 0, wp.stages, kind="unroll") as st:
                    b.evaluate(tx.call("mbar_init", self.full(st), 1))
                    b.evaluate(tx.call("mbar_init", self.empty(st), wp.consumers))
                b.evaluate(tx.call("mbar_fence_init"))
        b.barrier()

    @contextmanager
    def pieces(self, prefix: str) -> Iterator[None]:
        """This block's pieces of work `u = blockIdx + i x gridDim` (one when the grid has a
        block per piece), each with its tile's origins, slice and steps set (`work`)."""
        with self.b.loop(f"{prefix}u", BLOCK, self.wp.units, NBLOCKS) as u:
            self.work(u, prefix)
            yield

    def work(self, u: Var, prefix: str) -> None:
        """Piece `u`: slice `u / tiles` of the reduction (split-K) of tile `u % tiles`, the
        tile in the grouped order (`tile_origins`)."""
        b, wp = self.b, self.wp
        if wp.split == 1:
            t = u
        else:
            self.slice = b.let(f"{prefix}sk", tx.div(u, wp.tiles))
            t = b.let(f"{prefix}t", tx.mod(u, wp.tiles))
            self.k_first = b.let(f"{prefix}kf", tx.mul(self.slice, wp.steps_per_split))
            self.nsteps = b.let(f"{prefix}nk", tx.call("min", wp.steps_per_split,
                                                        tx.sub(self.total, self.k_first)))
        self.origins = self.tile_origins(t, prefix)

    def tile_origins(self, t: Expr, prefix: str) -> dict[str, Expr]:
        """The origins of tile `t` in the grouped order (`RASTER_GROUP`): batch tiles
        outermost; within a batch, groups of `RASTER_GROUP` M tiles (fewer in the last
        group), walked down M first, then across N."""
        b, c, wp = self.b, self.wp.contraction, self.wp
        grid = {a: -(-n // s) for a, n, s in zip(self.axes, self.extents,
                                                 self.plan_tile_block())}
        m_axis, n_axis = c.m_axes[0], c.n_axes[0]
        gm, gn = grid[m_axis], grid[n_axis]
        per_batch = gm * gn
        group = min(RASTER_GROUP, gm)
        width = group * gn
        r = b.let(f"{prefix}r", tx.mod(t, per_batch)) if per_batch < wp.tiles else t
        first = b.let(f"{prefix}m0", tx.mul(tx.div(r, width), group))
        rows = b.let(f"{prefix}gm", tx.call("min", tx.sub(gm, first), group))
        within = b.let(f"{prefix}in", tx.mod(r, width))
        tm = tx.add(first, tx.mod(within, rows))
        tn = tx.div(within, rows)
        origins = {m_axis: b.let(f"{prefix}o_m", tx.mul(tx.cast(self.idx_t, tm), wp.bm),
                                 self.idx_t),
                   n_axis: b.let(f"{prefix}o_n", tx.mul(tx.cast(self.idx_t, tn), wp.bn),
                                 self.idx_t)}
        batch = [a for a in self.axes if a in c.batch_axes]
        if batch:
            bt = b.let(f"{prefix}bt", tx.div(t, per_batch))
            coords = decompose(b, bt, [grid[a] for a in batch],
                               [f"{prefix}o_{c_name(a)}" for a in batch], self.idx_t)
            origins.update(zip(batch, coords))
        return origins

    def _step(self, g: Var, prefix: str) -> tuple[Var, Var]:
        """The stage and parity of the block's `g`-th step: `g` counts every step the block
        ran, across its pieces of work, so the barriers' phases continue from one tile to the
        next (they are initialised once)."""
        stage = self.b.let(f"{prefix}st", tx.mod(g, self.wp.stages))
        parity = self.b.let(f"{prefix}ph", tx.binary("&", tx.div(g, self.wp.stages), 1))
        return stage, parity

    # -- producer -------------------------------------------------------------------------
    def producer(self, tid: Var) -> None:
        b, wp = self.b, self.wp
        b.comment("producer warpgroup: one thread issues the TMA copies of every step of "
                  "every piece of work; it runs ahead into the next tile while the consumers "
                  "finish the last one")
        if wp.setmaxnreg:
            b.evaluate(tx.call("setmaxnreg_dec", wp.setmaxnreg[0]))
        with b.if_(tx.eq(tid, 0)):
            g = b.decl("pg", "int32", tx.const(0))
            with self.pieces("p"):
                with b.loop("ps", 0, self.nsteps) as s:
                    stage, parity = self._step(g, "p")
                    b.evaluate(tx.call("mbar_wait", self.empty(stage),
                                       tx.binary("^", parity, 1)))
                    b.evaluate(tx.call("mbar_expect_tx", self.full(stage), wp.stage_bytes))
                    k0 = b.let("pk0", tx.mul(tx.add(self.k_first, s), wp.bk))
                    for which in ("a", "b"):
                        self._copies(which, stage, k0)
                    b.assign(g, tx.add(g, 1))

    def _copies(self, which: str, stage: Var, k0: Var) -> None:
        """The TMA copies of one operand's tile of a step: one box per swizzle atom (K-major:
        one, tf32 two) or per 64-element strip (M/N-major)."""
        op, read = self.ops[which]
        m = self.maps[which]
        wp = self.wp
        c = wp.contraction
        strips = wp.atoms if op.k_inner else (wp.bm if which == "a" else wp.bn) // 64
        for j in range(strips):
            coords = []
            for a in reversed(op.dim_axes):          # innermost first
                if a == c.k_axes[0]:
                    at = tx.add(k0, wp.row * j) if op.k_inner and j else k0
                else:
                    at = self.origins[a]
                    if a == op.mn_axes[0] and j and not op.k_inner:
                        at = tx.add(at, 64 * j)
                coords.append(tx.cast("int32", at))
            dst = tuple(tx.as_expr(x) for x in (stage, j, 0, 0))
            self.b.evaluate(tx.call(f"tma_load_{len(coords)}d", Addr(self.bufs[which].name, dst),
                                    Var(m.name, "ptr"), self.full(stage), *coords))

    # -- consumers ------------------------------------------------------------------------
    def consumer(self, tid: Var, wg: Var) -> None:
        b, wp = self.b, self.wp
        b.comment("consumer warpgroups: per piece of work, wgmma on each stage, release it, "
                  "then the epilogue (overlapping the producer's loads of the next piece)")
        if wp.setmaxnreg:
            b.evaluate(tx.call("setmaxnreg_inc", wp.setmaxnreg[1]))
        acc = b.alloc("acc", "float32", (wp.mt, wp.bn // 2),
                      "this thread's accumulators (wgmma's D fragment)")
        cw = b.let("cw", tx.sub(wg, 1))
        whole = Addr(acc.name, ())
        g = b.decl("cg", "int32", tx.const(0))
        with self.pieces("c"):
            with b.loop("i", 0, wp.mt, kind="unroll") as i:
                with b.loop("v", 0, wp.bn // 2, kind="unroll") as v:
                    b.store(acc, (i, v), tx.const(0.0))
            with b.loop("cs", 0, self.nsteps) as cs:
                stage, parity = self._step(g, "c")
                b.evaluate(tx.call("mbar_wait", self.full(stage), parity))
                b.evaluate(tx.call("wgmma_fence", whole))
                with b.loop("kk", 0, wp.bk // wp.ik, kind="unroll") as kk:
                    db = b.let("db", self._descriptor("b", stage, kk, None), "int64")
                    with b.loop("i", 0, wp.mt, kind="unroll") as i:
                        da = b.let("da", self._descriptor(
                            "a", stage, kk, tx.add(tx.mul(cw, wp.mt), i)), "int64")
                        fn = f"wgmma_{WGMMA[wp.compute][0]}"
                        b.evaluate(tx.call(fn, Addr(acc.name, (i,)), da, db, wp.bn,
                                           int(not self.ops["a"][0].k_inner),
                                           int(not self.ops["b"][0].k_inner)))
                b.evaluate(tx.call("wgmma_commit"))
                # one batch in flight: wait for the previous step's, then release its stage
                b.evaluate(tx.call("wgmma_wait", whole, 1))
                with b.if_(tx.and_(tx.gt(cs, 0), tx.eq(tx.mod(tid, WARPGROUP), 0))):
                    b.evaluate(tx.call("mbar_arrive", self.empty(
                        tx.mod(tx.add(g, wp.stages - 1), wp.stages))))
                b.assign(g, tx.add(g, 1))
            b.evaluate(tx.call("wgmma_wait", whole, 0))
            with b.if_(tx.eq(tx.mod(tid, WARPGROUP), 0)):      # the piece's last stage
                b.evaluate(tx.call("mbar_arrive", self.empty(
                    tx.mod(tx.add(g, wp.stages - 1), wp.stages))))
            if self.store is None:
                self.epilogue(tid, cw, acc)
            else:
                self.store_epilogue(tid, cw, acc)
        if self.store is not None:
            with b.if_(tx.eq(tx.mod(tid, WARPGROUP), 0)):
                b.evaluate(tx.call("bulk_wait", 0))      # the last stores done before exit

    def _descriptor(self, which: str, stage: Expr, kk: Expr, block64: Expr | None) -> Expr:
        """The descriptor of k-slice `kk` (one instruction's K: 32 bytes, 16 16-bit or 8 tf32
        elements) of an operand's stage tile, from its 64-row block `block64` (A; B: the whole
        N). K-major: rows of 128 bytes, 8-row groups 1024 apart, the slice 32 bytes along the
        row of its atom; M/N-major: 64-element strips (the leading offset), 8 k-rows per 1024
        bytes, the slice 16 rows down."""
        op, _ = self.ops[which]
        buf = self.bufs[which]
        wp = self.wp
        first = tx.const(0) if block64 is None else block64
        if op.k_inner:
            per_atom = wp.row // wp.ik                        # slices per swizzle row: 4
            atom, at = (tx.const(0), kk) if wp.atoms == 1 else \
                (tx.div(kk, per_atom), tx.mod(kk, per_atom))
            index = (stage, atom, tx.mul(first, WGMMA_M), tx.mul(at, wp.ik))
            lbo = UNUSED_LBO
        else:
            index = (stage, first, tx.mul(kk, 16), tx.const(0))
            lbo = self.wp.bk * 64 * ITEMSIZE[buf.dtype]        # one strip
        return tx.call("wgmma_desc", Addr(buf.name, index), lbo, SWIZZLE_GROUP)

    def epilogue(self, tid: Var, cw: Var, acc: Buffer) -> None:
        """Each accumulator at its row and column of the block GEMM, back to the output's
        axes, scaled, through the chain (module docstring, 4)."""
        b, wp, module = self.b, self.wp, self.module
        c = wp.contraction
        p = self.plan.stages[0].main
        b.comment("epilogue: accumulators to the output's axes, through the chain")
        t = b.let("t", tx.mod(tid, WARPGROUP))
        lane = b.let("lane", tx.mod(t, 32))
        row0 = b.let("row0", tx.add(tx.mul(cw, wp.mt * WGMMA_M), tx.mul(tx.div(t, 32), 16)
                                    ) + tx.div(lane, 4))
        col0 = b.let("col0", tx.mul(tx.mod(lane, 4), 2))
        size = {a: s for (a, _), s in zip(p.spatial, self.plan_tile_block())}
        with b.loop("i", 0, wp.mt, kind="unroll") as i:
            with b.loop("v", 0, wp.bn // 2, kind="unroll") as v:
                row = b.let("row", row0 + i * WGMMA_M + tx.mod(tx.div(v, 2), 2) * 8)
                col = b.let("col", col0 + tx.div(v, 4) * 8 + tx.mod(v, 2))
                code = {c.m_axes[0]: tx.add(self.origins[c.m_axes[0]], row),
                        c.n_axes[0]: tx.add(self.origins[c.n_axes[0]], col)}
                code.update({a: self.origins[a] for a in c.batch_axes})
                vars_ = [b.let(avar(a), code[a], self.idx_t) for a, _ in p.spatial]
                pb = PointBuilder(module, b, self.plan.stages[0], vars_, global_resolver)
                bounds = tx.and_(*(tx.lt(x, n) for x, (a, n) in zip(vars_, p.spatial)
                                   if n % size[a]))
                value = Load(acc.name, (i, v), "float32")
                if self.scratch is not None:     # split-K: the slice's partial sum
                    strides = [math.prod(n for _, n in p.spatial[k + 1:])
                               for k in range(len(vars_))]
                    at = tx.add(tx.mul(tx.cast(self.idx_t, self.slice),
                                       math.prod(n for _, n in p.spatial)),
                                tx.linear(zip(strides, vars_), 0, self.idx_t))
                    with b.if_(bounds):
                        b.store(tvar(self.scratch), (at,), value)
                else:
                    if c.scale != 1.0:
                        value = tx.mul(value, literal(c.scale, "f"))
                    with b.if_(bounds):
                        pb.epilogue(pb.main_value(p, (value, "f")),
                                    store_sink(module, b, self.plan.stored, vars_))

    def store_epilogue(self, tid: Var, cw: Var, acc: Buffer) -> None:
        """The epilogue through shared memory: per column strip of 128 bytes, the warpgroup's
        first thread waits until its previous TMA store has read the strip buffer, the
        warpgroup (a named barrier of its 128 threads) writes its values there (after the
        chain; swizzled), fences them for the async proxy, meets again, and the first thread
        stores the strip with TMA (outside the tensor nothing is written)."""
        b, wp, module = self.b, self.wp, self.module
        c = wp.contraction
        p = self.plan.stages[0].main
        out, buf = self.store
        nbuf = wp.store_buffers           # 2: strip s fills buffer s % 2 (even strips/tile)
        item = ITEMSIZE[buf.dtype]
        per = STORE_STRIP // item                     # columns per strip
        rows = wp.mt * WGMMA_M                        # a warpgroup's rows
        m_axis, n_axis = c.m_axes[0], c.n_axes[0]
        b.comment(f"epilogue: {wp.bn // per} strip(s) of {per} columns through shared memory, "
                  "stored with TMA")
        t = b.let("t", tx.mod(tid, WARPGROUP))
        lane = b.let("lane", tx.mod(t, 32))
        row0 = b.let("row0", tx.add(tx.mul(tx.div(t, 32), 16), tx.div(lane, 4)))
        col0 = b.let("col0", tx.mul(tx.mod(lane, 4), 2))
        first_row = b.let("srow", tx.mul(cw, rows))
        # fp32: a store writes one word per lane, 8 rows x 4 column pairs; lanes 2 and 3 of
        # each row take the other value of their pair, so that the warp's words fall in 4
        # distinct word slots of 8 distinct swizzled chunks: 32 banks, no conflict
        flip = b.let("flip", tx.div(tx.mod(lane, 4), 2)) if item == 4 else None
        size = {a: s for (a, _), s in zip(p.spatial, self.plan_tile_block())}
        leader = tx.eq(t, 0)
        for strip in range(wp.bn // per):
            with b.if_(leader):       # the store that last read this strip's buffer is done
                b.evaluate(tx.call("bulk_wait_read", nbuf - 1))
            b.evaluate(tx.call("named_barrier", tx.add(cw, 1), WARPGROUP))
            with b.loop("i", 0, wp.mt, kind="unroll") as i:
                with b.loop("v", strip * per // 2, (strip + 1) * per // 2, kind="unroll") as v:
                    row = b.let("row", row0 + i * WGMMA_M + tx.mod(tx.div(v, 2), 2) * 8)
                    pair = tx.mod(v, 2) if flip is None else tx.binary("^", tx.mod(v, 2), flip)
                    col = b.let("col", col0 + tx.div(v, 4) * 8 + pair)
                    code = {m_axis: tx.add(self.origins[m_axis], tx.add(first_row, row)),
                            n_axis: tx.add(self.origins[n_axis], col)}
                    code.update({a: self.origins[a] for a in c.batch_axes})
                    # expressions, not variables: the TMA store needs them only for the
                    # bounds and the chain's reads, which a whole tile without a chain has not
                    vars_ = [tx.cast(self.idx_t, code[a]) for a, _ in p.spatial]
                    pb = PointBuilder(module, b, self.plan.stages[0], vars_, global_resolver)
                    bounds = tx.and_(*(tx.lt(x, n) for x, (a, n) in zip(vars_, p.spatial)
                                       if n % size[a]))
                    # the strip's 128-byte row `row`, its 16-byte chunks swizzled by row % 8
                    at = tx.div(tx.binary("^", tx.mul(tx.sub(col, strip * per), item),
                                          tx.mul(tx.mod(row, 8), 16)), item)
                    value = Load(acc.name, (i, v), "float32")
                    if flip is not None:        # both indices constant once unrolled
                        value = tx.select(tx.eq(flip, 1), Load(acc.name, (i, tx.binary(
                            "^", v, 1)), "float32"), value)
                    if c.scale != 1.0:
                        value = tx.mul(value, literal(c.scale, "f"))

                    def sink(tensor, x, kind, row=row, at=at):
                        if tensor == out:
                            b.store(buf, (strip % nbuf, tx.add(first_row, row), at),
                                    store_value(x, buf.dtype))
                    with b.if_(bounds):
                        pb.epilogue(pb.main_value(p, (value, "f")), sink)
            b.evaluate(tx.call("fence_proxy_async"))
            b.evaluate(tx.call("named_barrier", tx.add(cw, 1), WARPGROUP))
            with b.if_(leader):
                coords = []
                for a, _ in reversed(p.spatial):            # innermost first
                    at = self.origins[a]
                    if a == n_axis and strip:
                        at = tx.add(at, strip * per)
                    elif a == m_axis:
                        at = tx.add(at, first_row)
                    coords.append(tx.cast("int32", at))
                b.evaluate(tx.call(f"tma_store_{len(coords)}d", Var(self.maps["c"].name, "ptr"),
                                   Addr(buf.name, (tx.const(strip % nbuf), first_row,
                                                   tx.const(0))), *coords))
                b.evaluate(tx.call("bulk_commit"))

    def plan_tile_block(self) -> tuple[int, ...]:
        c, wp = self.wp.contraction, self.wp
        p = self.plan.stages[0].main
        return tuple(wp.bm if a == c.m_axes[0] else wp.bn if a == c.n_axes[0] else 1
                     for a, _ in p.spatial)


__all__ = ["split_reduce_kernel", "wgmma_kernel", "wgmma_kernels"]
