"""The `staged` kernel shape: reductions with input reuse (matmul, batched matmul, convolution,
depthwise convolution), with each input's tile per reduction step staged in shared memory.

For a block tile (`block` per spatial axis) and a reduction step (`step` per reduction axis),
every read `X[map(axes)]` touches a box of X whose size is fixed (affine maps): per dimension
`sum(|coef| * (len - 1)) + 1`, halo included. Per step the block

1. loads each read's box into a shared buffer (all threads, coalesced along the innermost
   dimension; `float4` loads where the box rows are provably 16-byte aligned and whole, see
   `vector_width`), out-of-range elements replaced by the op's pad value;
2. `__syncthreads()`;
3. for every reduction point of the step: loads each read's values for the thread's register
   tile into a small fragment array (one shared load per distinct value), then folds the body
   into every accumulator of the register tile;
4. `__syncthreads()` before the next step overwrites the buffers.

Boundary tiles: a partial last step runs a shorter loop (only when the step does not divide the
extent), output points outside the tensor are computed on padding and never stored.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass

from tilekit.codegen.cexpr import (IDENTITY, KIND_CTYPE, ValueCompiler, combine, linear,
                                   load_value, pad_literal, storage)
from tilekit.codegen.emitter import Emitter, comment_text
from tilekit.codegen.kernel import (GeneratedKernel, PointEmitter, _ll_if, _tile_text, avar,
                                    block_origins, c_name, decompose, global_resolver,
                                    group_signature, index_type, needs_check, open_kernel,
                                    has_guarded_reads, register_loops, store_sink, strides,
                                    thread_coords, tvar, uses_axis_values)
from tilekit.codegen.plan import GroupPlan, OpPlan, Read
from tilekit.codegen.schedule import STATIC_SMEM_LIMIT, Tile, shared_bytes

#: A read is worth staging when each element of its box is used this many times per step.
MIN_REUSE = 2


@dataclass(frozen=True)
class Box:
    """The per-step box of one read, in shared memory."""

    read: Read
    buffer: str
    extents: tuple[int, ...]           # per tensor dimension
    adjust: tuple[int, ...]            # local index of the tile's first point, per dimension

    @property
    def volume(self) -> int:
        return math.prod(self.extents)

    def local_terms(self) -> tuple[dict[str, int], int]:
        """Shared-memory offset as {axis: coefficient} over local axis coordinates + const."""
        st = strides(self.extents)
        coefs: dict[str, int] = {}
        const = 0
        for m, s, adj in zip(self.read.maps, st, self.adjust):
            const += adj * s
            for a, c in m.terms:
                coefs[a] = coefs.get(a, 0) + c * s
        return coefs, const


def tile_lengths(p: OpPlan, tile: Tile) -> dict[str, int]:
    out = {a: b for (a, _), b in zip(p.spatial, tile.block)}
    out.update({a: s for (a, _), s in zip(p.reduction, tile.step)})
    return out


def make_box(r: Read, lengths: dict[str, int], buffer: str) -> Box:
    extents, adjust = [], []
    for m in r.maps:
        extents.append(sum(abs(c) * (lengths[a] - 1) for a, c in m.terms) + 1)
        adjust.append(sum(-c * (lengths[a] - 1) for a, c in m.terms if c < 0))
    return Box(r, buffer, tuple(extents), tuple(adjust))


def distinct_reads(p: OpPlan) -> list[Read]:
    """Reads with different (tensor, maps); repeated reads share one buffer."""
    seen: dict[tuple, Read] = {}
    for r in p.read_list():
        key = (r.tensor, tuple(str(m) for m in r.maps))
        seen.setdefault(key, r)
    return list(seen.values())


def read_key(r: Read) -> tuple:
    return (r.tensor, tuple(str(m) for m in r.maps))


def eligible(p: OpPlan, tile: Tile | None) -> str | None:
    """Why `p` cannot use the staged shape with `tile`, or None when it can."""
    if tile is None:
        return "no tile"
    if not p.reduces:
        return "not a reduction"
    reads = p.read_list()
    if not reads:
        return "no reads"
    if not all(r.affine for r in reads):
        return "a read is not affine"
    if uses_axis_values(p):
        return "the body uses an axis value"
    if has_guarded_reads(p):
        return "the body has guarded reads (select)"
    lengths = tile_lengths(p, tile)
    points = math.prod(tile.block) * math.prod(tile.step)
    boxes = [make_box(r, lengths, "") for r in distinct_reads(p)]
    if not any(points >= MIN_REUSE * b.volume for b in boxes):
        return "no read is reused within a block tile"
    return None


def smem_bytes(p: OpPlan, tile: Tile) -> int:
    lengths = tile_lengths(p, tile)
    total = 0
    for r in distinct_reads(p):
        kind = storage(r.dtype).kind
        total += shared_bytes(make_box(r, lengths, "").volume, kind)
    return total


def fit_steps(p: OpPlan, tile: Tile, limit: int) -> Tile | None:
    """`tile` with reduction steps halved (largest first) until the buffers fit `limit`."""
    step = list(tile.step)
    while True:
        t = Tile(tile.block, tile.thread, tuple(step), tile.source)
        if smem_bytes(p, t) <= limit:
            return t
        k = max(range(len(step)), key=lambda i: step[i]) if step else None
        if k is None or step[k] == 1:
            return None
        step[k] = max(1, step[k] // 2)


def vector_width(box: Box, lengths: dict[str, int]) -> int:
    """4 when the box can be loaded with float4: float32, innermost box extent a multiple of
    4, the box's first column at a multiple of 4 for every block and step position, and the
    tensor's rows a multiple of 4 long (so a 4-wide chunk is wholly in or out of range and
    16-byte aligned, given 16-byte-aligned tensor bases)."""
    r = box.read
    if r.dtype != "float32" or not r.shape:
        return 1
    m = r.maps[-1]
    if box.extents[-1] % 4 or r.shape[-1] % 4:
        return 1
    first = m.const - box.adjust[-1]
    if first % 4:
        return 1
    if any((c * lengths[a]) % 4 for a, c in m.terms):
        return 1
    return 4


def staged_kernel(module, plan: GroupPlan, entry: str, tile: Tile) -> GeneratedKernel:
    stage = plan.stages[0]
    p = stage.main
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    raxes = [a for a, _ in p.reduction]
    threads_per_axis = [b // t for b, t in zip(tile.block, tile.thread)]
    threads = tile.threads
    grid = math.prod(tile.grid(tuple(extents)))
    lengths = tile_lengths(p, tile)
    boxes: dict[tuple, Box] = {}
    for r in distinct_reads(p):
        boxes[read_key(r)] = make_box(r, lengths, f"s_{c_name(r.tensor)}_{len(boxes)}")
    total = sum(shared_bytes(b.volume, storage(b.read.dtype).kind)
                for b in boxes.values())
    dynamic = total > STATIC_SMEM_LIMIT
    e = Emitter()
    open_kernel(e, entry, sig, threads,
                [f"staged: {_tile_text(tile, p)}",
                 f"shared memory: {total} bytes ({'dynamic' if dynamic else 'static'})"],
                register_tile=True)
    vars_ = [avar(a) for a in axes]
    with e.block():
        if dynamic:
            e.line("TK_DYNAMIC_SMEM(tk_smem);")
        offset = 0
        for b in boxes.values():
            ctype = KIND_CTYPE[storage(b.read.dtype).kind]
            if dynamic:
                e.line(f"{ctype}* {b.buffer} = reinterpret_cast<{ctype}*>(tk_smem + {offset});"
                       f"  // {comment_text(b.read.tensor)} box {list(b.extents)}")
            else:
                e.line(f"__shared__ __align__(16) {ctype} {b.buffer}[{b.volume}];"
                       f"  // {comment_text(b.read.tensor)} box {list(b.extents)}")
            offset += shared_bytes(b.volume, storage(b.read.dtype).kind)
        e.line("const int tid = threadIdx.x;")
        origins = block_origins(e, axes, extents, tile.block, idx_t)
        thread_vars = thread_coords(e, axes, threads_per_axis)
        pe = PointEmitter(module, e, stage, vars_, global_resolver)
        kind = pe.acc_kind(p)
        npoints = math.prod(tile.thread)
        e.line(f"{KIND_CTYPE[kind]} acc[{npoints}];")
        e.line("#pragma unroll")
        e.line(f"for (int k = 0; k < {npoints}; ++k) acc[k] = {IDENTITY[p.assign][kind]};")
        # Step loops over the reduction axes (chunk origins q_<axis>).
        with ExitStack() as steps:
            for (a, n), s in zip(p.reduction, tile.step):
                q = f"q_{c_name(a)}"
                if s >= n:  # one step covers the axis
                    e.line(f"const int {q} = 0;")
                    continue
                steps.enter_context(e.block(f"for (int {q} = 0; {q} < {n}; {q} += {s})"))
            e.line("__syncthreads();  // the previous step's buffers are no longer read")
            base = {a: o for a, o in zip(axes, origins)}
            base.update({a: f"q_{c_name(a)}" for a in raxes})
            ranges = _padded_ranges(p, tile)
            for b in boxes.values():
                _emit_load(e, b, base, ranges, threads, idx_t, lengths)
            e.line("__syncthreads();")
            _emit_compute(e, p, tile, boxes, thread_vars, threads_per_axis, kind, module)
        # Epilogue: every point of the register tile, in range, through the chain to memory.
        bounds = " && ".join(f"{v} < {n}" for v, n, bl in zip(vars_, extents, tile.block)
                             if n % bl)
        with register_loops(e, axes, tile.thread):
            for v, o, w, a, t, across in zip(vars_, origins, thread_vars, axes, tile.thread,
                                                  threads_per_axis):
                j = f" + j_{c_name(a)} * {across}" if t > 1 else ""
                e.line(f"const {idx_t} {v} = {o} + {w}{j};")
            slot = _slot(axes, tile.thread, axes)
            with e.blocks([f"if ({bounds})"] if bounds else []):
                pe.epilogue(pe.main_value(p, (f"acc[{slot}]", kind)),
                            store_sink(module, e, plan.stored, vars_))
    sched = tile.describe(tuple(axes), tuple(raxes))
    sched["smem_buffers"] = [{"tensor": b.read.tensor, "box": list(b.extents)}
                             for b in boxes.values()]
    sched["vectorized"] = sorted(b.read.tensor for b in boxes.values()
                                 if vector_width(b, lengths) == 4)
    return GeneratedKernel(
        name=plan.name, group=plan.kernel.name, entry=entry,
        ops=tuple(plan.kernel.ops), shape="staged", schedule=sched,
        grid=(grid, 1, 1), block=(threads, 1, 1), smem_bytes=total if dynamic else 0,
        smem_planned=total, args=sig.args, writes=tuple(sig.writes), body=e.text(),
        uses_half=sig.uses_half())


def _padded_ranges(p: OpPlan, tile: Tile) -> dict[str, tuple[int, int]]:
    """Axis ranges covered by whole tiles and steps (boxes of boundary tiles overhang)."""
    out = {}
    for (a, n), b in zip(p.spatial, tile.block):
        out[a] = (0, -(-n // b) * b - 1)
    for (a, n), s in zip(p.reduction, tile.step):
        out[a] = (0, -(-n // s) * s - 1)
    return out


def _emit_load(e: Emitter, b: Box, base: dict[str, str], ranges, threads: int, idx_t: str,
               lengths: dict[str, int]) -> None:
    """All threads copy one box from global to shared memory."""
    r = b.read
    nd = len(b.extents)
    width = vector_width(b, lengths)
    e.comment(f"stage {r.tensor}[{', '.join(str(m) for m in r.maps)}]: box {list(b.extents)}"
              + (" (float4 loads)" if width == 4 else ""))
    with e.block():
        los = []
        for d, (m, adj) in enumerate(zip(r.maps, b.adjust)):
            lo = e.tmp("lo")
            terms = [(c, base[a]) for a, c in m.terms]
            e.line(f"const {idx_t} {lo} = {linear(terms, m.const - adj)};")
            los.append(lo)
        need = needs_check(r, ranges)
        st = strides(r.shape)
        pad = pad_literal(r.pad, r.dtype)
        ext = list(b.extents)
        if width == 4:
            ext[-1] //= 4
        count = math.prod(ext)
        with e.block(f"for (int i = threadIdx.x; i < {count}; i += {threads})"):
            locs = [e.tmp("l") for _ in range(nd)]
            decompose(e, "i", ext, locs, "int")
            gs = []
            for d in range(nd):
                g = e.tmp("g")
                scale = 4 if (width == 4 and d == nd - 1) else 1
                loc = f"{scale} * {locs[d]}" if scale != 1 else locs[d]
                e.line(f"const {idx_t} {g} = {los[d]} + {loc};")
                gs.append(g)
            checks = [f"tk_in({g}, {dim})" for g, dim, n in zip(gs, r.shape, need) if n]
            offset = linear(zip(st, gs)) if gs else "0"
            if width == 4:
                value = f"*reinterpret_cast<const float4*>(&{tvar(r.tensor)}[{offset}])"
                fill = f"make_float4({pad}, {pad}, {pad}, {pad})"
                load = f"({' && '.join(checks)} ? {value} : {fill})" if checks else value
                e.line(f"*reinterpret_cast<float4*>(&{b.buffer}[4 * i]) = {load};")
            else:
                value = load_value(f"{tvar(r.tensor)}[{offset}]", r.dtype)
                load = f"({' && '.join(checks)} ? {value} : {pad})" if checks else value
                e.line(f"{b.buffer}[i] = {load};")


def _slot(axes: list[str], thread: tuple[int, ...], over: list[str]) -> str:
    """Flat index over the register-tile loop variables of the axes in `over`."""
    sizes = [t for a, t in zip(axes, thread) if a in over]
    names = [a for a in axes if a in over]
    terms = []
    for k, (a, t) in enumerate(zip(names, sizes)):
        if t > 1:
            terms.append((math.prod(sizes[k + 1:]), f"j_{c_name(a)}"))
    return linear(terms)


def _emit_compute(e: Emitter, p: OpPlan, tile: Tile, boxes: dict[tuple, Box],
                  thread_vars: list[str], threads_per_axis: list[int], kind: str, module) -> None:
    axes = [a for a, _ in p.spatial]
    thread = dict(zip(axes, tile.thread))
    thread_var = dict(zip(axes, thread_vars))
    threads_along = dict(zip(axes, threads_per_axis))
    with ExitStack() as reduction_loops:
        last = len(p.reduction) - 1
        for k, ((a, n), s) in enumerate(zip(p.reduction, tile.step)):
            r = avar(a)
            q = f"q_{c_name(a)}"
            if n % s:
                bound = f"({n} - {q} < {s} ? {n} - {q} : {s})"
            else:
                bound = str(s)
                if s <= 32 and k == last:  # unroll the innermost loop only: code size
                    e.line("#pragma unroll")
            reduction_loops.enter_context(e.block(f"for (int {r} = 0; {r} < {bound}; ++{r})"))
        # Fragments: each buffer's values for the thread's register tile at this point.
        fragments: dict[tuple, tuple[str, list[str]]] = {}
        for key, b in boxes.items():
            coefs, const = b.local_terms()
            dep = [a for a in axes if coefs.get(a)]
            size = math.prod(thread[a] for a in dep)
            name = f"f_{c_name(b.read.tensor)}_{len(fragments)}"
            ctype = KIND_CTYPE[storage(b.read.dtype).kind]
            e.line(f"{ctype} {name}[{size}];")
            with register_loops(e, dep, [thread[a] for a in dep]):
                terms: list[tuple[int, str]] = []
                for a, c in sorted(coefs.items(), key=lambda ac: (ac[0] not in axes, ac[0])):
                    if a in axes:
                        terms.append((c, thread_var[a]))
                        if thread[a] > 1:
                            terms.append((c * threads_along[a], f"j_{c_name(a)}"))
                    else:
                        terms.append((c, avar(a)))
                e.line(f"{name}[{_slot(axes, tile.thread, dep)}] = "
                       f"{b.buffer}[{linear(terms, const)}];")
            fragments[key] = (name, dep)

        def read(node) -> str:
            r = p.read(node)
            name, dep = fragments[read_key(r)]
            return f"{name}[{_slot(axes, tile.thread, dep)}]"

        # Fold the body into every accumulator of the register tile.
        with register_loops(e, axes, tile.thread):
            comp = ValueCompiler({}, lambda t: storage(module.tensors[t].dtype).kind, read)
            e.line(combine(p.assign, f"acc[{_slot(axes, tile.thread, axes)}]",
                           _ll_if(comp.emit(p.body, kind), kind)))
