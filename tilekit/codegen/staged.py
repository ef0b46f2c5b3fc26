"""The `staged` kernel shape: reductions with input reuse (matmul, batched matmul, convolution,
depthwise convolution), with each input's tile per reduction step staged in shared memory.

For a block tile (`block` per spatial axis) and a reduction step (`step` per reduction axis),
every read `X[map(axes)]` touches a box of X whose size is fixed (affine maps): per dimension
`sum(|coef| * (len - 1)) + 1`, halo included. Per step the block

1. copies each read's box into a shared buffer (a `Copy` tile operation: all threads,
   coalesced along the innermost dimension; 16-byte vector accesses where the vector-width
   pass proves them, tilekit.tile.passes.copies), out-of-range elements replaced by the op's
   pad value;
2. meets at a barrier;
3. for every reduction point of the step: loads each read's values for the thread's register
   tile into a small fragment array (one shared load per distinct value), then folds the body
   into every accumulator of the register tile;
4. meets at a barrier before the next step overwrites the buffers.

Boundary tiles: a partial last step runs a shorter loop (only when the step does not divide the
extent), output points outside the tensor are computed on padding and never stored.

Split-K (`decision.split`, tilekit.schedule.shape.StagedSplit; tk-roll chooses it when the
output tiles alone leave the SMs short of warps): block `s x tiles + t` computes tile `t` over
slice `s` of one reduction axis, writes its register tile's partial sums to a scratch buffer
(`<entry>__splitk`, `[slice][tile][point][thread]`: a warp's stores and loads of one point
are consecutive words; float32 accumulators only), fences, and
its thread 0 counts the slice done on the tile's counter (a workspace of one word per tile, zeroed before
every launch). The block that brings the counter to `slices` (the last of its tile, whatever
the order blocks run in) fences again, adds the slices' partials in slice order and runs the
epilogue. The combination is in the same kernel rather than a second pass: the output is
written once, through the chain (bias, activation) like an unsplit tile, with one launch, and
the sum's order is fixed, so every run gives the same bits; float atomics on the output would
need it zeroed first, could not run a non-linear epilogue and would add in a varying order.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, replace

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, avar, block_origins, c_name,
                                    finish, fold_into, generated, global_resolver,
                                    group_signature,
                                    index_type, needs_check, register_loops, slot, store_sink,
                                    strides, thread_coords, tile_text, tvar)
from tilekit.codegen.plan import GroupPlan, OpPlan, Read
from tilekit.codegen.values import (ValueCompiler, identity, load_value, storage_kind,
                                    stored_pad)
from tilekit.errors import UnsupportedError
from tilekit.ir.payloads import Tile
from tilekit.schedule.defaults import STATIC_SMEM_LIMIT
from tilekit.schedule.shape import KernelShape, OpFacts, Target, facts_of
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import BLOCK, KIND_DTYPE, NBLOCKS, Addr, Expr, Load, Var
from tilekit.tile.nodes import Buffer, Copy, Kernel


@dataclass(frozen=True)
class Box:
    """One staged read's per-step box (tilekit.schedule.shape.StagedBox) with its buffer
    and the Read that loads it (its padding)."""

    read: Read
    buffer: Buffer
    extents: tuple[int, ...]           # per tensor dimension
    adjust: tuple[int, ...]            # local index of the tile's first point, per dimension


def op_facts(p: OpPlan, target: Target | None = None) -> OpFacts:
    """What the shared shape decision needs of a (possibly inlined) op plan (`target`: for
    the extents that vary, `Target.varying`)."""
    return facts_of(p.spatial, p.reduction, p.body, p.read_list(), p.assign,
                    target.axes_varying(p.op.name) if target is not None else frozenset())


def read_key(r) -> tuple:
    return (r.tensor, tuple(str(m) for m in r.maps))


def staged_kernel(module, plan: GroupPlan, entry: str, decision: KernelShape,
                  target: Target) -> GeneratedKernel:
    stage = plan.stages[0]
    p = stage.main
    tile = decision.tile
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    raxes = [a for a, _ in p.reduction]
    threads_per_axis = [s // t for s, t in zip(tile.block, tile.thread)]
    threads = tile.threads
    tiles = math.prod(tile.grid(tuple(extents)))
    split = decision.split
    grid = tiles * (split.slices if split is not None else 1)
    first_read = {}
    for r in p.read_list():
        first_read.setdefault(read_key(r), r)
    smem = SharedMemory()
    boxes: dict[tuple, Box] = {}
    for sb in decision.staged:
        key = sb.read.key
        r = first_read[key]
        # Staged in the tensor's own storage type (half stays 2 bytes), converted to the
        # compute kind when a thread reads it into its fragment.
        buf = smem.carve(f"s_{c_name(sb.read.tensor)}_{len(boxes)}", r.dtype, sb.extents,
                         f"{r.tensor} box {list(sb.extents)}")
        boxes[key] = Box(r, buf, sb.extents, sb.adjust)
    total = decision.smem_bytes
    if split is not None:
        smem.carve(_LAST, "int32", (1,), "1: this block adds the slices")
    b = Builder()
    tile_of = slice_of = None
    if split is not None:
        tile_of = b.let("tile_", tx.mod(BLOCK, tiles), "int32")
        slice_of = b.let("slice_", tx.div(BLOCK, tiles), "int32")
    origins = block_origins(b, axes, extents, tile.block, idx_t, tile_of,
                            named=target.any_varying(p.op.name, axes))
    pb_kind = PointBuilder(module, b, stage, [Var(avar(a), idx_t) for a in axes],
                           global_resolver)
    kind = pb_kind.acc_kind(p)
    npoints = math.prod(tile.thread)
    acc = b.alloc("acc", KIND_DTYPE[kind], (npoints,), "the thread's register tile")
    if split is not None and acc.dtype != "float32":   # scratch buffers are float32
        raise UnsupportedError(f"split-K needs float32 partial sums; this op accumulates "
                               f"{acc.dtype}", f"{p.where}.tile.split_k",
                               "remove split_k, or re-run tk-roll (it splits float ops only)")
    with b.threads(threads) as tid:
        with b.loop("k", 0, npoints, kind="unroll") as k:
            b.store(acc, (k,), identity(p.assign, kind))
    copies: list[Copy] = []
    # Step loops over the reduction axes (chunk origins q_<axis>).
    with ExitStack() as steps:
        q: dict[str, Expr] = {}
        for r, ((a, n), s) in enumerate(zip(p.reduction, tile.step)):
            if s >= n and (p.op.name, a) not in target.varying:  # one step covers the axis
                q[a] = tx.const(0)
                continue
            start, stop = 0, n
            if split is not None and r == split.axis:   # this block's slice of the axis
                start = b.let("q0_", tx.mul(slice_of, split.span), "int32")
                stop = tx.select(tx.lt(n - split.span, start), tx.const(n),
                                 start + split.span)
            q[a] = steps.enter_context(b.loop(f"q_{c_name(a)}", start, stop, s))
        b.barrier()     # the previous step's buffers are no longer read
        base = dict(zip(axes, origins))
        base.update(q)
        ranges = _padded_ranges(p, tile, target)
        for box in boxes.values():
            copy = _copy(b, box, base, ranges, idx_t)
            copies.append(copy)
            b.emit(copy)
        b.barrier()
        with b.threads(threads) as tid:
            thread_vars = thread_coords(b, tid, axes, threads_per_axis)
            _compute(b, p, tile, boxes, thread_vars, threads_per_axis, kind, module, acc, q,
                     target)
    scratch: dict[str, int] = {}
    params_extra: tuple[Buffer, ...] = ()
    if split is not None:
        part, counters = _combine_slices(b, entry, split, tiles, threads, npoints, tile_of,
                                         slice_of, acc)
        scratch = {_scratch_name(entry): part.elements}
        params_extra = (part,)
        with b.if_(tx.eq(Load(_LAST, (tx.const(0),), "int32"), 1)):
            with b.threads(threads) as tid:
                _epilogue(b, module, plan, tile, origins, tid, idx_t, kind, acc, target)
    else:
        with b.threads(threads) as tid:
            _epilogue(b, module, plan, tile, origins, tid, idx_t, kind, acc, target)
    sched = tile.describe(tuple(axes), tuple(raxes))
    if split is not None:
        sched["split_k"] = split.record()
    sched["smem_buffers"] = [{"tensor": box.read.tensor, "box": list(box.extents)}
                             for box in boxes.values()]
    kernel_body = b.build()
    sched["vectorized"] = _vectorized(copies, smem, sig, kernel_body, threads, grid)
    comments = [f"staged: {tile_text(tile, p)}",
                f"shared memory: {total} bytes "
                f"({'dynamic' if total > STATIC_SMEM_LIMIT else 'static'})"]
    if split is None:
        kernel = finish(plan, entry, sig, kernel_body, shape="staged", schedule=sched,
                        threads=threads, grid=grid, shared=smem.all(), register_tile=True,
                        target=target, comments=comments)
        assert kernel.smem_planned == total, "the program and the shape decision disagree"
        return kernel
    # split-K: the partial sums' scratch first (as the split wgmma's reduction kernel takes
    # it), the tensors, then the counters' workspace; a flag in shared memory says "last"
    comments.append(f"split-K: {split.slices} slices of {split.steps} steps of axis "
                    f"{split.name}, the last block of a tile adds them in slice order")
    program = Kernel(entry, params_extra + sig.params() + (counters,),
                     smem.all(), kernel_body, threads, grid, 1, tuple(comments),
                     counters=tiles)
    kernel = generated(program, name=plan.name, group=plan.kernel.name,
                       ops=tuple(plan.kernel.ops), shape="staged", schedule=sched,
                       args=tuple(scratch) + sig.args,
                       writes=tuple(scratch) + tuple(sig.writes),
                       target=target.kind)
    return replace(kernel, scratch=scratch)


def _scratch_name(entry: str) -> str:
    """The partial sums' buffer: named after the kernel's entry (unique in a module)."""
    return f"{entry}__splitk"


#: The shared flag of a split-K block: 1 when it is the last of its tile to finish.
_LAST = "s_last_slice"


def _combine_slices(b: Builder, entry: str, split, tiles: int, threads: int,
                    npoints: int, tile_of: Expr, slice_of: Expr, acc: Buffer
                    ) -> tuple[Buffer, Buffer]:
    """Split-K's combination (module docstring): this block's partials to the scratch
    buffer, a fence, the tile's counter; in the last block of the tile, `acc` becomes the sum
    of the slices' partials in slice order. Returns the scratch and counter buffers."""
    part = Buffer(tvar(_scratch_name(entry)), "global", acc.dtype,
                  (split.slices * tiles * threads * npoints,),
                  comment=f"{split.slices} slices of partial sums: [slice][tile][point][thread]",
                  access="write")
    counters = Buffer("tk_counters", "global", "uint32", (tiles,), access="write",
                      comment="slices done per tile")

    def at(sl: Expr, tid: Expr, k: Expr) -> Expr:
        # point-major: a warp's 32 threads store and load one point's partials as 32
        # consecutive words (thread-major, each of the 32 was a line of its own; ResNet-50's
        # 32-slice convolution took 0.19 ms on an H100, 2.8x its time without the adds)
        return ((sl * tiles + tile_of) * npoints + k) * threads + tid

    with b.threads(threads) as tid:
        with b.loop("k", 0, npoints, kind="unroll") as k:
            b.store(part, (at(slice_of, tid, k),), Load(acc.name, (k,), acc.dtype))
        b.evaluate(tx.call("threadfence"))   # release: every thread's partials
    b.barrier()
    with b.threads(threads) as tid:
        with b.if_(tx.eq(tid, 0)):
            b.evaluate(tx.call("threadfence"))
            old = b.let("done_", tx.call("atomic_add", Addr(counters.name, (tile_of,)),
                                         tx.cast("uint32", 1)), "uint32")
            b.store(_LAST, (tx.const(0),),
                    tx.select(tx.eq(old, tx.cast("uint32", split.slices - 1)), 1, 0))
    b.barrier()
    with b.if_(tx.eq(Load(_LAST, (tx.const(0),), "int32"), 1)):
        with b.threads(threads) as tid:
            b.evaluate(tx.call("threadfence"))   # acquire: the other slices' partials
            # slice by slice, the register tile inside: a point's loads per slice only
            # (per point over all slices, ptxas hoisted every load: 253 registers, not 127)
            with b.loop("k", 0, npoints, kind="unroll") as k:
                b.store(acc, (k,), Load(part.name, (at(tx.const(0), tid, k),), acc.dtype))
            # (the slice count read as grid / tiles, not a constant: unrolled, ptxas hoisted
            # every slice's loads, 144 registers against 96 on a 1x1 convolution in 8 slices)
            with b.loop("sl", 1, tx.div(NBLOCKS, tiles)) as sl:
                with b.loop("k", 0, npoints, kind="unroll") as k:
                    b.store(acc, (k,), tx.add(Load(acc.name, (k,), acc.dtype),
                                              Load(part.name, (at(sl, tid, k),), acc.dtype)))
    return part, counters


def _vectorized(copies: list[Copy], smem: SharedMemory, sig, body, threads: int,
                grid: int) -> list[str]:
    """Tensors whose box copies move 16 bytes per access (the vector-width pass's proof)."""
    from tilekit.tile.nodes import Kernel
    from tilekit.tile.passes.copies import Divisibility, vector_width

    k = Kernel("probe", sig.params(), smem.all(), body, threads, grid)
    div = Divisibility(k)
    by_buffer = {c.dst: c for c in copies}
    names = {b.name: b.comment.split(" box ")[0] for b in smem.all()}
    return sorted(names[c.dst] for c in by_buffer.values() if vector_width(c, k, div) == 4)


def _copy(b: Builder, box: Box, base: dict[str, Expr], ranges, idx_t: str) -> Copy:
    """The copy of one box of this step: its origin per dimension (block-level values),
    the source offset and validity per element."""
    r = box.read
    b.comment(f"stage {r.tensor}[{', '.join(str(m) for m in r.maps)}]: box "
              f"{list(box.extents)}")
    los = []
    for m, adj in zip(r.maps, box.adjust):
        terms = [(c, base[a]) for a, c in m.terms]
        los.append(b.let("lo_", tx.linear(terms, m.const - adj, idx_t), idx_t))
    local = tuple(b.var("l_") for _ in box.extents)
    g = [tx.add(lo, loc) for lo, loc in zip(los, local)]
    need = needs_check(r, ranges)
    valid = tx.and_(*(tx.call("in_range", x, tx.as_expr(dim, x.dtype))
                      for x, dim, n in zip(g, r.shape, need) if n))
    offset = tx.linear(zip(strides(r.shape), g), 0, idx_t) if g else tx.const(0, idx_t)
    return Copy(box.buffer.name, (), local, tvar(r.tensor), offset, valid,
                stored_pad(r.pad, r.dtype))


def _padded_ranges(p: OpPlan, tile: Tile, target: Target) -> dict[str, tuple[int, int]]:
    """Axis ranges covered by whole tiles and steps (boxes of boundary tiles overhang; an
    axis whose extent varies overhangs whatever this size's extent: `Target.ragged`)."""
    out = {}
    for (a, n), s in (*zip(p.spatial, tile.block), *zip(p.reduction, tile.step)):
        whole = -(-n // s) * s
        out[a] = (0, (whole if (p.op.name, a) not in target.varying else n + s) - 1)
    return out


def _compute(b: Builder, p: OpPlan, tile: Tile, boxes: dict[tuple, Box], thread_vars,
             threads_per_axis: list[int], kind: str, module, acc: Buffer, q,
             target: Target) -> None:
    axes = [a for a, _ in p.spatial]
    thread = dict(zip(axes, tile.thread))
    thread_var = dict(zip(axes, thread_vars))
    threads_along = dict(zip(axes, threads_per_axis))
    local: dict[str, Expr] = {}
    with ExitStack() as reduction_loops:
        last = len(p.reduction) - 1
        for k, ((a, n), s) in enumerate(zip(p.reduction, tile.step)):
            if target.ragged(p.op.name, a, n, s):
                rest = tx.sub(n, q[a])
                bound = tx.select(tx.lt(rest, s), rest, tx.const(s))
                loop_kind = "serial"
            else:
                bound = tx.const(s)
                loop_kind = "unroll" if s <= 32 and k == last else "serial"  # code size
            local[a] = reduction_loops.enter_context(b.loop(avar(a), 0, bound, kind=loop_kind))
        # Fragments: each buffer's values for the thread's register tile at this point.
        fragments: dict[tuple, tuple[Buffer, list[str]]] = {}
        for key, box in boxes.items():
            dep = [a for a in axes if any(a == x for m in box.read.maps for x, _ in m.terms)]
            dep = [a for a in dep if _coef_any(box, a)]
            size = math.prod(thread[a] for a in dep)
            frag = b.alloc(f"f_{c_name(box.read.tensor)}_{len(fragments)}",
                           KIND_DTYPE[storage_kind(box.read.dtype)], (size,))
            with register_loops(b, dep, [thread[a] for a in dep]) as j:
                coord = {a: thread_var[a] + j[a] * threads_along[a] if thread[a] > 1
                         else thread_var[a] for a in dep}
                coord.update(local)
                index = []
                for m, adj in zip(box.read.maps, box.adjust):
                    terms = [(c, coord[a]) for a, c in m.terms if a in coord]
                    index.append(tx.linear(terms, adj))
                value = load_value(Load(box.buffer.name, tuple(index), box.buffer.dtype),
                                   box.read.dtype)
                b.store(frag, (slot(dep, [thread[a] for a in dep], j),), value)
            fragments[key] = (frag, dep)

        def read(j):
            def reader(node) -> Expr:
                r = p.read(node)
                frag, dep = fragments[read_key(r)]
                return Load(frag.name, (slot(dep, [thread[a] for a in dep], j),), frag.dtype)
            return reader

        # Fold the body into every accumulator of the register tile.
        with register_loops(b, axes, tile.thread) as j:
            comp = ValueCompiler({}, lambda t: storage_kind(module.tensors[t].dtype), read(j))
            fold_into(b, (acc, (slot(axes, list(tile.thread), j),)), p.assign,
                      tx.cast(acc.dtype, comp.emit(p.body, kind)))


def _coef_any(box: Box, axis: str) -> bool:
    return any(c for m in box.read.maps for a, c in m.terms if a == axis)


def _epilogue(b: Builder, module, plan: GroupPlan, tile: Tile, origins, tid, idx_t: str,
              kind: str, acc: Buffer, target: Target) -> None:
    """Every point of the register tile, in range, through the chain to memory."""
    p = plan.stages[0].main
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    threads_per_axis = [s // t for s, t in zip(tile.block, tile.thread)]
    thread_vars = thread_coords(b, tid, axes, threads_per_axis)
    with register_loops(b, axes, tile.thread) as j:
        vars_ = [b.let(avar(a), o + w + j[a] * across if t > 1 else o + w, idx_t)
                 for a, o, w, t, across in zip(axes, origins, thread_vars, tile.thread,
                                               threads_per_axis)]
        pb = PointBuilder(module, b, plan.stages[0], vars_, global_resolver)
        bounds = tx.and_(*(tx.lt(v, n) for a, v, n, s in zip(axes, vars_, extents, tile.block)
                           if target.ragged(p.op.name, a, n, s)))
        with b.if_(bounds):
            value = Load(acc.name, (slot(axes, list(tile.thread), j),), acc.dtype)
            pb.epilogue(pb.main_value(p, (value, kind)),
                        store_sink(module, b, plan.stored, vars_))


__all__ = ["op_facts", "read_key", "staged_kernel"]
