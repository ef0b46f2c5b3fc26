"""The `mma` kernel shape: a contraction on tensor cores (`mma.sync`), per the shared plan.

`tilekit.schedule.mma.mma_plan` decided the block GEMM (`BM x BN` outputs, `BK` reduction
points per step), the warps (`wm x wn`, each `MT x NT` instructions of 16x8), each operand's
shared-memory layout and whether it is copied with `cp.async`; this module prints it:

1. **Stages.** `stages` buffers per operand. A step's tile of an operand is, per element, the
   read at the tile's axes (an implicit GEMM: a convolution's input tile is gathered through
   its index maps, halo and padding included), stored in the tensor's own type, rows padded by
   16 bytes. Operands whose rows are contiguous 16-byte chunks of the tensor are copied with
   `cp.async` (zero-filled outside it); the others are loaded and stored by the threads.
2. **Pipeline.** `stages - 1` steps are in flight before the first is used; each iteration
   waits for the oldest (`cp.async.wait_group`), meets at a barrier (which also frees the
   buffer the next load overwrites), issues the load of step `s + stages - 1`, then computes
   step `s`.
3. **Fragments.** fp16/bf16 operands come into registers with `ldmatrix` (`.trans` for a
   tile stored `[k][mn]`), tf32 operands by scalar loads in the fragment layout, converted with
   `cvt.rna.tf32`; then `MT x NT` instructions per k-slice.
4. **Epilogue.** Each accumulator element, at its row and column of the block GEMM, is mapped
   back to the output's axes, scaled, and goes through the stage's elementwise chain to memory.

Fragment layouts and instructions are runtime.cuh's helpers (emulated on the CPU by
host_emul.h from the same documented layouts).
"""

from __future__ import annotations

import math
from contextlib import ExitStack

from tilekit.codegen.cexpr import linear, literal, storage
from tilekit.codegen.emitter import Emitter
from tilekit.codegen.kernel import (GeneratedKernel, PointEmitter, avar, block_origins, c_name,
                                    decompose, finish, flat_offset, global_resolver,
                                    group_signature, index_type, needs_check, new_kernel,
                                    store_sink, tvar)
from tilekit.codegen.plan import GroupPlan, OpPlan, Read
from tilekit.codegen.staged import read_key
from tilekit.schedule.mma import MmaPlan, Operand
from tilekit.schedule.shape import ITEMSIZE, KernelShape


def mma_kernel(module, plan: GroupPlan, entry: str, decision: KernelShape) -> GeneratedKernel:
    p = plan.stages[0].main
    mp = decision.mma
    tile = decision.tile
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    name, _, _, ik, _, _ = mp.instruction
    kb = new_kernel(entry, sig, tile.threads,
                    [f"mma: mma.sync.{name} on a {mp.bm}x{mp.bn}x{mp.bk} block GEMM, "
                     f"{mp.wm}x{mp.wn} warps of {mp.mt}x{mp.nt} instructions, "
                     f"{mp.stages} stages" + (f", cp.async for {', '.join(_async_names(mp))}"
                                              if _async_names(mp) else ""),
                     f"shared memory: {mp.smem_bytes} bytes"], register_tile=True)
    e = kb.body
    reads = {read_key(r): r for r in p.read_list()}
    facts_reads = list(reads.values())
    ops = {"a": (mp.contraction.a, facts_reads[mp.contraction.a.index]),
           "b": (mp.contraction.b, facts_reads[mp.contraction.b.index])}
    bufs = {}
    for which, (op, read) in ops.items():
        rows, length = mp.tile_shape(op)
        ctype = storage(read.dtype).ctype
        bufs[which] = kb.shared(f"s_{which}", ctype, mp.stages * rows * (length + mp.row_pad()),
                                ITEMSIZE[read.dtype],
                                f"{read.tensor}: {mp.stages} stages of {rows}x{length} "
                                f"({'[mn][k]' if op.k_inner else '[k][mn]'}) + pad")
    e.line("const int tid = threadIdx.x;")
    origins = dict(zip(axes, block_origins(e, axes, extents, tile.block, idx_t)))
    e.line("const int warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;")
    e.line(f"const int wm0 = (warp / {mp.wn}) * {mp.warp_m}, wn0 = (warp % {mp.wn}) * "
           f"{mp.warp_n};")
    e.line(f"float acc[{mp.mt}][{mp.nt}][4];")
    _unrolled(e, [("i", mp.mt), ("j", mp.nt), ("r", 4)], "acc[i][j][r] = 0.0f;")
    steps = [(a, n, s) for (a, n), s in zip(p.reduction, tile.step)]
    nsteps = math.prod(-(-n // s) for _, n, s in steps)
    ctx = _Context(module, p, mp, tile, origins, steps, idx_t, bufs, ops, kb.threads)
    with e.block("auto load_stage = [&](const int buf, const int s)", ";"):
        for which in ("a", "b"):
            _emit_stage_load(e, ctx, which)
    e.line(f"const int nsteps = {nsteps};")
    with e.block(f"for (int s = 0; s < {mp.stages - 1}; ++s)"):
        e.line("if (s < nsteps) load_stage(s, s);")
        e.line("tk_cp_async_commit();")
    with e.block("for (int s = 0; s < nsteps; ++s)"):
        e.line(f"tk_cp_async_wait<{mp.stages - 2}>();")
        e.line("__syncthreads();  // step s has landed; the buffer of step s - 1 is free")
        e.line(f"if (s + {mp.stages - 1} < nsteps) load_stage((s + {mp.stages - 1}) % "
               f"{mp.stages}, s + {mp.stages - 1});")
        e.line("tk_cp_async_commit();")
        e.line(f"const int buf = s % {mp.stages};")
        e.line("#pragma unroll")
        with e.block(f"for (int kk = 0; kk < {mp.bk}; kk += {ik})"):
            _emit_fragments_and_mma(e, ctx)
    _emit_epilogue(e, ctx, plan, module)
    sched = tile.describe(tuple(axes), tuple(a for a, _ in p.reduction))
    sched["mma"] = mp.record()
    kernel = finish(kb, plan, "mma", sched, math.prod(tile.grid(tuple(extents))), sig)
    assert kernel.smem_planned == mp.smem_bytes, "the builder and the mma plan disagree"
    return kernel


def _async_names(mp: MmaPlan) -> list[str]:
    return [n for n, on in (("a", mp.a_async), ("b", mp.b_async)) if on]


class _Context:
    """What the pieces of one mma kernel share."""

    def __init__(self, module, p: OpPlan, mp: MmaPlan, tile, origins, steps, idx_t, bufs, ops,
                 threads: int):
        self.module, self.p, self.mp, self.tile = module, p, mp, tile
        self.origins, self.steps, self.idx_t = origins, steps, idx_t
        self.bufs, self.ops, self.threads = bufs, ops, threads
        self.size = {a: b for (a, _), b in zip(p.spatial, tile.block)}
        self.size.update({a: s for a, _, s in steps})
        self.extent = dict(p.spatial) | dict(p.reduction)
        self.pad = mp.row_pad()

    def group_sizes(self, axes) -> list[int]:
        return [self.size[a] for a in axes]


def _unrolled(e: Emitter, loops, statement: str) -> None:
    with ExitStack() as stack:
        for var, n in loops:
            e.line("#pragma unroll")
            stack.enter_context(e.block(f"for (int {var} = 0; {var} < {n}; ++{var})"))
        e.line(statement)


def _axis_code(e: Emitter, ctx: _Context, group_axes, local: str, prefix: str,
               base_of) -> dict[str, str]:
    """Declare each axis of a group at flat local index `local` (row-major over the group's
    sizes): `base_of(axis) + coordinate`; returns axis -> C variable."""
    if not group_axes:
        return {}
    names = [e.tmp(prefix) for _ in group_axes]
    decompose(e, local, ctx.group_sizes(group_axes), names, "int")
    out = {}
    for a, n in zip(group_axes, names):
        var = e.tmp(f"{prefix}_{c_name(a)}_")
        e.line(f"const {ctx.idx_t} {var} = {base_of(a)} + {n};")
        out[a] = var
    return out


def _emit_stage_load(e: Emitter, ctx: _Context, which: str) -> None:
    """One operand's tile of step `s` into stage buffer `buf` (inside load_stage)."""
    op, read = ctx.ops[which]
    mp = ctx.mp
    rows, length = mp.tile_shape(op)
    row_len = length + ctx.pad
    c = mp.contraction
    mn_axes = op.mn_axes
    k_axes = c.k_axes
    item = ITEMSIZE[read.dtype]
    use_async = mp.a_async if which == "a" else mp.b_async
    chunk = 16 // item if use_async else 1
    buffer = ctx.bufs[which]
    e.comment(f"operand {which}: {read.tensor}[{', '.join(str(m) for m in read.maps)}], "
              f"{'cp.async 16-byte chunks' if use_async else 'element by element'}")
    with e.block():
        # This step's origin on every reduction axis.
        step_counts = [-(-n // s) for _, n, s in ctx.steps]
        qs = [f"q_{c_name(a)}" for a, _, _ in ctx.steps]
        sidx = [e.tmp("si") for _ in ctx.steps]
        decompose(e, "s", step_counts, sidx, "int")
        for qv, si, (_, _, s) in zip(qs, sidx, ctx.steps):
            e.line(f"const int {qv} = {si} * {s};")
        step_origin = dict(zip(k_axes, [qs[[a for a, _, _ in ctx.steps].index(a)]
                                        for a in k_axes]))
        count = rows * length // chunk
        # A whole number of chunks per thread: a constant trip count, unrolled, so that the
        # copies issue back to back and their index math is hoisted out of the k loop.
        loop = (f"for (int i = tid; i < {count}; i += {ctx.threads})" if count % ctx.threads
                else f"for (int it = 0; it < {count // ctx.threads}; ++it)")
        if not count % ctx.threads:
            e.line("#pragma unroll")
        with e.block(loop):
            if not count % ctx.threads:
                e.line(f"const int i = tid + it * {ctx.threads};")
            e.line(f"const int r = i / {length // chunk}, c = (i % {length // chunk}) * "
                   f"{chunk};")
            mn_local, k_local = ("r", "c") if op.k_inner else ("c", "r")
            code = _axis_code(e, ctx, mn_axes, mn_local, "m", lambda a: ctx.origins[a])
            code.update(_axis_code(e, ctx, k_axes, k_local, "k", lambda a: step_origin[a]))
            code.update({a: ctx.origins[a] for a in c.batch_axes})
            checks = [f"{code[a]} < {ctx.extent[a]}" for a in code
                      if ctx.extent[a] % ctx.size.get(a, 1)]
            checks += _map_checks(read, code, ctx)
            ok = " && ".join(checks) or "true"
            offset = flat_offset(read, code, {})
            dst = f"{buffer}[buf * {rows * row_len} + r * {row_len} + c]"
            if use_async:
                e.line(f"const bool ok = {ok};")
                e.line(f"tk_cp_async16(&{dst}, {tvar(read.tensor)} + (ok ? {offset} : 0), ok);")
            else:
                zero = f"({storage(read.dtype).ctype})0" if item == 4 else \
                    ("__float2half_rn(0.0f)" if read.dtype == "float16"
                     else "__float2bfloat16_rn(0.0f)")
                e.line(f"{dst} = ({ok}) ? {tvar(read.tensor)}[{offset}] : {zero};")


def _map_checks(read: Read, code: dict[str, str], ctx: _Context) -> list[str]:
    """`tk_in(index, dim)` for each dimension whose index can leave the tensor while the axes
    range over whole tiles and steps (padding reads of a convolution)."""
    ranges = {a: (0, -(-ctx.extent[a] // ctx.size.get(a, 1)) * ctx.size.get(a, 1) - 1)
              for a in code}
    out = []
    for m, dim, need in zip(read.maps, read.shape, needs_check(read, ranges)):
        if need:
            out.append(f"tk_in({linear(((cf, code[a]) for a, cf in m.terms), m.const)}, {dim})")
    return out


def _emit_fragments_and_mma(e: Emitter, ctx: _Context) -> None:
    """One k-slice: every warp's A and B fragments, then its MT x NT instructions."""
    mp = ctx.mp
    name, _, _, ik, _, _ = mp.instruction
    fn = {"m16n8k16.f16": "tk_mma_16816_f16", "m16n8k16.bf16": "tk_mma_16816_bf16",
          "m16n8k8.tf32": "tk_mma_1688_tf32"}[name]
    a_op, _ = ctx.ops["a"]
    b_op, _ = ctx.ops["b"]
    e.line(f"unsigned af[{mp.mt}][4], bf[{mp.nt}][2];")
    if mp.compute == "tf32":
        _tf32_fragments(e, ctx, "a", a_op, mp.mt, 16)
        _tf32_fragments(e, ctx, "b", b_op, mp.nt, 8)
    else:
        _ldmatrix_a(e, ctx, a_op)
        _ldmatrix_b(e, ctx, b_op)
    _unrolled(e, [("i", mp.mt), ("j", mp.nt)], f"{fn}(acc[i][j], af[i], bf[j]);")


def _tile_at(ctx: _Context, which: str, op: Operand, mn: str, k: str) -> str:
    """The shared element of an operand tile at (mn, k) in the current buffer."""
    rows, length = ctx.mp.tile_shape(op)
    row_len = length + ctx.pad
    r, c = (mn, k) if op.k_inner else (k, mn)
    return f"{ctx.bufs[which]}[buf * {rows * row_len} + ({r}) * {row_len} + ({c})]"


def _ldmatrix_a(e: Emitter, ctx: _Context, op: Operand) -> None:
    """A 16x16 fragments: lane L addresses row L % 16 (columns 8 x L / 16) of [m][k], or
    with .trans, k-row (L / 16) * 8 + L % 8, m-column 8 x ((L / 8) % 2) of [k][m]."""
    with e.block():
        e.line("#pragma unroll")
        with e.block(f"for (int i = 0; i < {ctx.mp.mt}; ++i)"):
            if op.k_inner:
                at = _tile_at(ctx, "a", op, "wm0 + i * 16 + lane % 16", "kk + (lane / 16) * 8")
                e.line(f"tk_ldmatrix_x4(af[i], &{at});")
            else:
                at = _tile_at(ctx, "a", op, "wm0 + i * 16 + ((lane / 8) % 2) * 8",
                              "kk + (lane / 16) * 8 + lane % 8")
                e.line(f"tk_ldmatrix_x4_trans(af[i], &{at});")


def _ldmatrix_b(e: Emitter, ctx: _Context, op: Operand) -> None:
    """B fragments two 8-column tiles at a time: lane L addresses n-row L % 8 + 8 x (L / 16),
    k-column 8 x ((L / 8) % 2) of [n][k], or with .trans k-row L % 8 + 8 x ((L / 8) % 2),
    n-column 8 x (L / 16) of [k][n]."""
    with e.block():
        e.line("#pragma unroll")
        with e.block(f"for (int j = 0; j < {ctx.mp.nt}; j += 2)"):
            e.line("unsigned r4[4];")
            if op.k_inner:
                at = _tile_at(ctx, "b", op, "wn0 + j * 8 + lane % 8 + (lane / 16) * 8",
                              "kk + ((lane / 8) % 2) * 8")
                e.line(f"tk_ldmatrix_x4(r4, &{at});")
            else:
                at = _tile_at(ctx, "b", op, "wn0 + j * 8 + (lane / 16) * 8",
                              "kk + lane % 8 + ((lane / 8) % 2) * 8")
                e.line(f"tk_ldmatrix_x4_trans(r4, &{at});")
            e.line("bf[j][0] = r4[0]; bf[j][1] = r4[1]; bf[j + 1][0] = r4[2]; "
                   "bf[j + 1][1] = r4[3];")


def _tf32_fragments(e: Emitter, ctx: _Context, which: str, op: Operand, count: int,
                    rows: int) -> None:
    """tf32 fragments by scalar loads: A (16x8) a0 = A[g][q], a1 = A[g+8][q], a2 = A[g][q+4],
    a3 = A[g+8][q+4]; B (8x8) b0 = B[q][g], b1 = B[q+4][g]."""
    base = "wm0 + i * 16" if which == "a" else "wn0 + i * 8"
    target = "af" if which == "a" else "bf"
    with e.block():
        e.line("#pragma unroll")
        with e.block(f"for (int i = 0; i < {count}; ++i)"):
            if which == "a":
                places = [("g", "q"), ("g + 8", "q"), ("g", "q + 4"), ("g + 8", "q + 4")]
            else:
                places = [("g", "q"), ("g", "q + 4")]
            for n, (mn, k) in enumerate(places):
                at = _tile_at(ctx, which, op, f"{base} + {mn}", f"kk + {k}")
                e.line(f"{target}[i][{n}] = tk_to_tf32({at});")


def _emit_epilogue(e: Emitter, ctx: _Context, plan: GroupPlan, module) -> None:
    """Each accumulator element back to the output's axes, scaled, through the chain."""
    mp, p = ctx.mp, ctx.p
    c = mp.contraction
    axes = [a for a, _ in p.spatial]
    vars_ = [avar(a) for a in axes]
    pe = PointEmitter(module, e, plan.stages[0], vars_, global_resolver)
    e.comment("epilogue: accumulators to the output's axes, through the chain")
    with ExitStack() as loops:
        for var, n in (("i", mp.mt), ("j", mp.nt), ("r", 4)):
            e.line("#pragma unroll")
            loops.enter_context(e.block(f"for (int {var} = 0; {var} < {n}; ++{var})"))
        e.line("const int row = wm0 + i * 16 + g + 8 * (r >> 1);")
        e.line("const int col = wn0 + j * 8 + 2 * q + (r & 1);")
        code = _axis_code(e, ctx, c.m_axes, "row", "m", lambda a: ctx.origins[a])
        code.update(_axis_code(e, ctx, c.n_axes, "col", "n", lambda a: ctx.origins[a]))
        code.update({a: ctx.origins[a] for a in c.batch_axes})
        for a, v in zip(axes, vars_):
            e.line(f"const {ctx.idx_t} {v} = {code[a]};")
        bounds = [f"{avar(a)} < {n}" for a, n in p.spatial if n % ctx.size[a]]
        value = "acc[i][j][r]" if c.scale == 1.0 else \
            f"acc[i][j][r] * {literal(c.scale, 'f')}"
        with e.blocks([f"if ({' && '.join(bounds)})"] if bounds else []):
            pe.epilogue(pe.main_value(p, (value, "f")),
                        store_sink(module, e, plan.stored, vars_))

