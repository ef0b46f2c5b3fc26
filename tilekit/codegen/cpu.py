"""CPU kernels as tile programs: loop nests in vector lanes, and contractions by packed panels.

Two kernel shapes for `tk-codegen --target cpu` (tiles from `tilekit.schedule.cpu`); every
block of the grid is a unit of parallel work (the C++ printer runs the blocks over the cores
with OpenMP), and a block is one thread of the CPU, so neither shape has thread regions.

`cpu_loops` (any one-stage group that is not a contraction below): the output's rows (every
spatial axis but the vector axis) in blocks of about `block_work` operations; per row,

- no reduction: one `simd` loop over the vector axis (the last spatial axis) computing each
  point and its epilogue;
- a reduction whose innermost axis walks a read's contiguous dimension for at least `nr`
  points (softmax's sums, layer norm's means, a matrix-vector product with rows of weights):
  per point, `nr` partial accumulators filled by a `simd` loop over that axis, folded at the
  end in halves (`fold_lanes`); without a vector axis, `ROW_GROUP` rows at a time (one loop
  fills their partials);
- any other reduction (over channels of NCHW, a depthwise convolution's window, a
  matrix-vector product with columns of weights): an accumulator row of up to
  `vector_chunk` points of the vector axis, the reduction loops outside and a `simd` loop over
  the row inside, then the epilogue in a `simd` loop. A small window (the trailing reduction
  axes, up to `UNROLLED_WINDOW` points) is unrolled, so each of its points is a `simd` loop
  with constant bounds; a read of it that crosses the padding is staged once per row
  (`_StagedRow`; a strided window's in phases, so each point reads contiguous values), so
  those loops have no guard either, and output rows whose windows read overlapping input
  rows run side by side on rows staged once for them all (`_side_by_side`).

`cpu_gemm` (a float32 contraction, `tilekit.schedule.mma.contraction`: matmul, batched matmul,
Gemm, convolution as an implicit GEMM), the BLIS algorithm: a block owns `mc x nc` outputs of
the GEMM view (`M` the axes of one read, `N` the other's, with the output's contiguous axis in
`N`); per `kc` step it packs its A panel (`mc x kc`, micro-panels of `mr` rows) and B panel
(`kc x nc`, micro-panels of `nr` columns) into block memory, reading each element through
the operand's index maps (a convolution's window and padding included), and runs the
register-tile micro-kernel (`gemm_micro`, runtime_cpu.h) on every `mr x nr` tile: into an
`mc x nc` output tile that holds the sums between steps, or with one step over K into one
micro-tile's buffer. B's panel is packed by the micro-tiles of the block's first row as they
compute (`gemm_micro_fill`, `_Fill`: each step of K loads the row from the operand, stores it
into the panel and multiplies it), so the operand's loads overlap the FMAs; a B whose rows
are neither masked copies nor gathers of float32 values (`_fills`), and a packed A, are packed
by a loop before the micro-tiles. Right after a micro-tile's last step, while its outputs are in L1, the
epilogue maps each back to the op's axes, scales it and runs the stage's elementwise chain
(bias, activation, residual) before the store (`_tile_epilogue`); the last step walks the
micro-tiles along the output's rows, so the stores (and a residual's reads) go in order, and
where the output's N is one run of addresses each row of the strip is one vector loop.
Because the maps are affine, an element's offset is a part over the M (or N) axes plus
a part over the K axes: the block tabulates the first once per block and the second once per
step, so packing costs a load and an add per element. A B that is a model's weight read as a
matrix (a linear layer's) is not packed per run: the micro-kernel reads panels of the whole
weight packed once per loaded program (`_weight_panels`, runtime_cpu.h `tk_packed_panels`); an
A that is one (a convolution's filters) is read from such panels too, one run of addresses
per micro-tile.
"""

from __future__ import annotations

import itertools
import math
from contextlib import ExitStack
from typing import Callable, NamedTuple

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, avar, c_name,
                                    decompose, finish, flat_offset, full_ranges, global_read,
                                    global_resolver, group_signature, index_type, needs_check,
                                    store_sink, strides, tvar)
from tilekit.codegen.cpu_rows import fold_lanes
from tilekit.codegen.plan import GroupPlan, OpPlan, Read
from tilekit.codegen.staged import op_facts, read_key
from tilekit.codegen.values import (accumulator_kind, combine, identity, literal, pad_literal)
from tilekit.expr.ast import Access, Binary as ExprBinary, Num
from tilekit.expr.intervals import affine_form
from tilekit.ir.graph import graph
from tilekit.schedule.cpu import (CpuShape, CpuTiles, cpu_shape, gemm_roles, one_thread,
                                  window_rows)
from tilekit.schedule.mma import Contraction
from tilekit.schedule.shape import Target, body_uses_axis_values
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import BLOCK, ITEMSIZE, KIND_DTYPE, Addr, Expr, Load, Var


def cpu_kernel(module, plan: GroupPlan, entry: str, shape: CpuShape | CpuTiles,
               target: Target) -> GeneratedKernel:
    """The CPU kernel of a one-stage group: `shape` is the decision and blocks of its main op
    (`tilekit.schedule.cpu.cpu_shape`: tk-roll's recorded ones, or fresh from tiles), a
    `CpuTiles` to decide here: `cpu_gemm` for a float32 contraction whose output is contiguous
    along an M or N axis and whose operands are each reused at least `GEMM_MIN_REUSE` times,
    else `cpu_loops`."""
    if isinstance(shape, CpuTiles):
        main = plan.stages[0].main
        shape = cpu_shape(op_facts(main), shape, free=shape.free(main.op.name))
    if shape.shape == "cpu_gemm":
        c = op_facts(plan.stages[0].main).contraction
        return gemm_kernel(module, plan, entry, shape, target, c)
    return loops_kernel(module, plan, entry, shape, target)


# -- loop nests --------------------------------------------------------------------------

def loops_kernel(module, plan: GroupPlan, entry: str, shape: CpuShape, target: Target
                 ) -> GeneratedKernel:
    stage = plan.stages[0]
    p = stage.main
    tiles, lp = shape.tiles, shape.loops
    free = tiles.free(p.op.name)    # axes whose extents vary (a symbolic module's sizes)
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    axes = [a for a, _ in p.spatial]
    extents = [n for _, n in p.spatial]
    lanes_red = lp.lane_partials
    vec = axes.index(lp.vector_axis) if lp.vector_axis is not None else None
    row_axes = [a for k, a in enumerate(axes) if k != vec]
    row_extents = [n for k, n in enumerate(extents) if k != vec]
    rows = lp.rows
    vlen = extents[vec] if vec is not None else 1
    per = lp.rows_per_block
    grid = lp.grid
    mode = lp.mode
    b = Builder()
    # where extents vary, the rows per block are a named constant: a block of one row keeps
    # the form of a block of many (one code structure for every size)
    per_ = b.let("per", tx.const(per, idx_t), idx_t) if free else per
    cols = lp.columns_per_block
    row_block: Expr = tx.cast(idx_t, BLOCK)
    span = None         # this block's points of the vector axis (all of them: None)
    if cols is not None:
        # a block is (row block, column block): a run of `cols` points of the vector axis
        nc = lp.column_blocks
        row_block = b.let("rb", tx.div(tx.cast(idx_t, BLOCK), tx.const(nc, idx_t)), idx_t)
        j_lo = b.let("c0", tx.mul(tx.mod(tx.cast(idx_t, BLOCK), tx.const(nc, idx_t)),
                                  tx.const(cols, idx_t)), idx_t)
        span = _Span(j_lo, b.let("c1", tx.call("min", tx.add(j_lo, tx.const(cols, idx_t)),
                                               tx.const(vlen, idx_t)), idx_t),
                     cols if vlen % cols == 0 else None)
    first = b.let("r0", tx.mul(row_block, per_), idx_t)
    stop = b.let("r1", tx.call("min", tx.add(first, per_), tx.const(rows, idx_t)), idx_t)
    j_start, j_stop = (span.lo, span.hi) if span is not None else (0, vlen)
    if (vec is None and lanes_red and row_axes and row_axes[-1] not in free
            and row_extents[-1] % ROW_GROUP == 0 and per % ROW_GROUP == 0):
        # rows in groups along the innermost row axis (a group never crosses an outer
        # row): their lane partials filled by one loop over the reduction, so a read the
        # rows share (a matrix-vector product's vector) is the same expression, loaded once,
        # and the group's rows stream side by side
        with b.loop("r", first, stop, ROW_GROUP, dtype=idx_t) as r:
            vars_ = decompose(b, r, row_extents, [avar(a) for a in row_axes], idx_t)
            at = dict(zip(row_axes, vars_))
            points = [[at[a] for a in axes]]
            for u in range(1, ROW_GROUP):
                at[row_axes[-1]] = b.let(f"{avar(row_axes[-1])}_", tx.add(vars_[-1], u),
                                         idx_t)
                points.append([at[a] for a in axes])
            _lane_points(b, module, plan, points, tiles, free)
    else:
        across = _across_rows(plan, axes, row_axes, row_extents, vec, per, free) \
            if vec is not None and not p.reduces else 1
        side = (_side_by_side(p, axes, row_axes, row_extents, vec, vlen, per, tiles, free)
                if vec is not None and p.reduces else across)
        with b.loop("r", first, stop, side, dtype=idx_t) as r:
            row_vars = decompose(b, r, row_extents, [avar(a) for a in row_axes], idx_t,
                                 named=bool(free))
            at = dict(zip(row_axes, row_vars))
            if vec is None:
                _point(b, module, plan, [at[a] for a in axes], tiles, lanes_red, free)
            elif not p.reduces and across > 1:
                # a transposed read: `across` rows at a time, each point of the vector axis
                # one vector loop across them (the read's contiguous axis)
                u = row_axes[-1]
                with b.loop(avar(axes[vec]), j_start, j_stop, dtype=idx_t) as v, \
                        b.loop(f"{avar(u)}_", 0, across, kind="simd", dtype=idx_t) as uu:
                    point = {**at, axes[vec]: v,
                             u: b.let(f"{avar(u)}_at", tx.add(row_vars[-1], uu), idx_t)}
                    _point(b, module, plan, [point[a] for a in axes], tiles, False, free)
            elif not p.reduces:
                with b.loop(avar(axes[vec]), j_start, j_stop, kind="simd", dtype=idx_t) as v:
                    at[axes[vec]] = v
                    _point(b, module, plan, [at[a] for a in axes], tiles, False, free)
            else:
                ats = [at] + [{**at, row_axes[-1]: b.let(
                    f"{avar(row_axes[-1])}_{u}", tx.add(at[row_axes[-1]], u), idx_t)}
                    for u in range(1, side)]
                _accumulator_row(b, module, plan, axes, ats, vec, vlen, tiles, idx_t, free,
                                 span)
    sched = {"source": "cpu", "rows": rows, "rows_per_block": per, "reduction": mode,
             "vector_axis": axes[vec] if vec is not None else None}
    if cols is not None:
        sched["columns_per_block"] = cols
    view = _view_of(plan, free)
    if view is not None:
        sched["view"] = view
    if grid > 1 and one_thread(rows * lp.work_per_row, tiles):
        sched["one_thread"] = True
    return finish(plan, entry, sig, b.build(), shape="cpu_loops", schedule=sched, threads=1,
                  grid=grid, target=target,
                  comments=[f"cpu loops: {rows} rows in blocks of {per}, "
                            + (f"vector axis {axes[vec]} ({vlen})" if vec is not None
                               else "no vector axis")
                            + (f" in blocks of {cols}" if cols is not None else "")
                            + f", reduction: {mode}"])


#: Rows of a pointwise loop nest that run side by side when a read is transposed
#: (`_across_rows`): a vector's float32 lanes on AVX-512, a cache line.
ACROSS_ROWS = 16


def _across_rows(plan: GroupPlan, axes, row_axes, row_extents, vec: int, per: int,
                 free: frozenset[str] = frozenset()) -> int:
    """`ACROSS_ROWS` when a pointwise kernel reads a tensor transposed: contiguous along the
    innermost row axis and apart along the vector axis (a Transpose's `y[j, i] = x[i, j]`).
    Then each point of the vector axis runs one vector loop across that many rows: the read
    is a line at a time and the stores fill as many output lines over as many steps, where a
    vector loop along the vector axis reads a line per value, lines a row stride apart that
    share a few L1 sets (MLP-Mixer's 196 x 512 token transpose, 2 KiB apart: every read from
    L2). 1 otherwise, or when the rows do not come in whole groups (the innermost row
    axis's extent and the block's rows multiples of it, no extent that varies)."""
    if not row_axes or free & {row_axes[-1], axes[vec]} \
            or row_extents[-1] % ACROSS_ROWS or per % ACROSS_ROWS:
        return 1
    main = plan.ops[0]
    u, v = row_axes[-1], axes[vec]
    for r in main.read_list():
        form = _flat_form(r, dict(main.spatial))
        if form is not None and form[0].get(u) == 1 and abs(form[0].get(v, 0)) >= ACROSS_ROWS:
            return ACROSS_ROWS
    return 1


def _view_of(plan: GroupPlan, free: frozenset[str] = frozenset()) -> str | None:
    """The tensor a group of one op copies unchanged: its body one read of a tensor of the
    output's dtype and size, at the output's own row-major offset for every point (a Reshape,
    a Flatten, a Squeeze: the same bytes in the same order), with no index that can leave
    the tensor and no extent that varies. The compiled runtime may then give the output the
    input's memory and skip the kernel (tilekit.runtime.compiled, `views`); None otherwise."""
    if len(plan.ops) != 1 or free:
        return None
    p = plan.ops[0]
    if p.reduces or p.assign != "=" or not isinstance(p.body, Access):
        return None
    r = p.read(p.body)
    if r.dtype != p.out_dtype or r.pad is not None \
            or math.prod(r.shape) != math.prod(p.out_shape):
        return None
    extent = dict(p.spatial)
    form = _flat_form(r, extent)
    if form is None or _checked_dims(r, extent):
        return None
    flat, const = form
    want = dict(zip(extent, strides(p.out_shape)))
    if const != 0 or any(flat.get(a, 0) != want[a] for a in extent if extent[a] > 1):
        return None
    return r.tensor


def _flat_form(read: Read, extent: dict) -> tuple[dict[str, int], int] | None:
    """The read's row-major offset as an affine form of the axes (coefficients, constant),
    where every index is affine or a digit of an affine `L`, as the importer writes a
    Reshape: consecutive dimensions indexed `L // q`, `(L // q) % e`, ..., `L % e`, each `q`
    the product of the later extents of the run and `e` its own, are `L` in mixed radix, so
    together they add `L` times the run's last stride (`L` within the run's extents when its
    first digit wraps). None otherwise."""
    st = strides(read.shape)
    flat: dict[str, int] = {}
    const = 0

    def add(terms, c: int, scale: int) -> None:
        nonlocal const
        for a, cf in terms:
            flat[a] = flat.get(a, 0) + cf * scale
        const += c * scale

    runs: list[list] = []          # [L, [(dim, q, e)]] in order
    for d, m in enumerate(read.maps):
        if m.affine:
            add(m.terms, m.const, st[d])
            continue
        digit = _digit(m.node)
        if digit is None:
            return None
        line, q, mod = digit
        if runs and runs[-1][0] == line and runs[-1][1][-1][0] == d - 1:
            runs[-1][1].append((d, q, mod))
        else:
            runs.append([line, [(d, q, mod)]])
    for line, digits in runs:
        form = affine_form(line)
        if form is None:
            return None
        terms, c = form
        radix = 1
        for i, (d, q, mod) in enumerate(reversed(digits)):
            first = i == len(digits) - 1
            if q != radix or (mod is None and not first) or (mod is not None and
                                                              mod != read.shape[d]):
                return None
            radix *= read.shape[d]
        low = c + sum(min(0, cf * (extent[a] - 1)) for a, cf in terms.items())
        high = c + sum(max(0, cf * (extent[a] - 1)) for a, cf in terms.items())
        if low < 0 or (digits[0][2] is not None and high >= radix):
            return None
        add(terms.items(), c, st[digits[-1][0]])
    return flat, const


def _digit(node) -> tuple[object, int, int | None] | None:
    """(L, q, e) of an index `(L // q) % e`, (L, q, None) of `L // q`, (L, 1, e) of `L % e`."""
    mod = None
    if isinstance(node, ExprBinary) and node.op == "%" and isinstance(node.rhs, Num):
        mod, node = int(node.rhs.value), node.lhs
        if not (isinstance(node, ExprBinary) and node.op == "//"):
            return node, 1, mod
    if isinstance(node, ExprBinary) and node.op == "//" and isinstance(node.rhs, Num):
        return node.lhs, int(node.rhs.value), mod
    return None


#: Rows of a loop nest without a vector axis whose lane-partial reductions run side by side
#: (`_lane_points`): a matrix-vector product with rows of weights (the LSTM's recurrent
#: product, 2048 rows of 512) loads its vector once per 4 rows and streams 4 rows at a time,
#: 67 us a step against 78 us row by row on one Zen 3 core (a harness, the least of 300).
ROW_GROUP = 4


def _point(b: Builder, module, plan: GroupPlan, vars_: list[Expr], tiles: CpuTiles,
           lane_partials: bool, free: frozenset[str]) -> None:
    """One output point: its reduction (scalar or in lane partials), epilogue and stores."""
    stage = plan.stages[0]
    p = stage.main
    if p.reduces and lane_partials:
        _lane_points(b, module, plan, [vars_], tiles, free)
        return
    pb = PointBuilder(module, b, stage, vars_, global_resolver)
    sink = store_sink(module, b, plan.stored, vars_)
    if not p.reduces:
        pb.epilogue(None, sink)
        return
    kind = pb.acc_kind(p)
    dtype = KIND_DTYPE[kind]
    acc = b.decl("acc_", dtype, identity(p.assign, kind))
    pb.reduction_loops(p, acc, kind)
    pb.epilogue(pb.main_value(p, (acc, kind)), sink)


def _lane_points(b: Builder, module, plan: GroupPlan, points: list[list[Expr]],
                 tiles: CpuTiles, free: frozenset[str]) -> None:
    """Output points whose reductions keep `nr` partial accumulators each, filled in vector
    lanes by one loop over the innermost reduction axis (all the points' values per lane),
    then each folded, its epilogue run and stored. Each point's sum is the same as alone.
    The tail loop (the points after the last whole `nr`) is there whenever the axis is
    `free` (its extent varies), empty at some sizes."""
    stage = plan.stages[0]
    p = stage.main
    pbs, sinks = [], []
    for vars_ in points:
        pbs.append(PointBuilder(module, b, stage, vars_, global_resolver))
        sinks.append(store_sink(module, b, plan.stored, vars_))
    kind = pbs[0].acc_kind(p)
    dtype = KIND_DTYPE[kind]
    lanes = tiles.nr
    parts = [b.alloc("part" if len(points) == 1 else f"part{u}", dtype, (lanes,),
                     "partial accumulators, one per vector lane") for u in range(len(points))]
    with b.loop("l", 0, lanes, kind="simd") as l_:
        for part in parts:
            b.store(part, (l_,), identity(p.assign, kind))
    codes = [pb.axis_code(p) for pb in pbs]
    comps = [pb.compiler(p, code) for pb, code in zip(pbs, codes)]
    *outer, (inner, n) = p.reduction

    def fold(at: Expr, lane: Expr) -> None:
        for code, comp, part in zip(codes, comps, parts):
            code[inner] = at
            value = comp.emit(p.body, kind)
            b.store(part, (lane,), combine(p.assign, Load(part.name, (lane,), dtype),
                                           tx.cast(dtype, value)))

    with ExitStack() as loops:
        for a, extent in outer:
            v = loops.enter_context(b.loop(avar(a), 0, extent))
            for code in codes:
                code[a] = v
        whole = n // lanes * lanes
        if inner in free:   # named: no tail of 0 points folds away (one structure)
            whole = b.let("whole", tx.const(whole))
        with b.loop("kb", 0, whole, lanes) as kb:
            with b.loop("l", 0, lanes, kind="simd") as l_:
                fold(b.let(avar(inner), tx.add(kb, l_)), l_)
        if inner in free or whole < n:
            with b.loop(avar(inner), whole, n) as k:
                fold(k, tx.sub(k, whole))
    for pb, sink, part in zip(pbs, sinks, parts):
        acc = fold_lanes(b, part, lanes, p.assign, "acc_")
        pb.epilogue(pb.main_value(p, (acc, kind)), sink)


#: Reduction points an accumulator row runs as straight code rather than loops: the
#: trailing reduction axes whose extents multiply to at most this (a 3x3 or 5x5 window). Each
#: point is then a vector loop with constant bounds (the guard split's bounds fold to
#: constants), so the compiler emits it without a runtime prologue and tail per point.
UNROLLED_WINDOW = 32


def _side_by_side(p: OpPlan, axes, row_axes, row_extents, vec: int, vlen: int, per: int,
                  tiles: CpuTiles, free: frozenset[str]) -> int:
    """How many output rows an accumulator row computes side by side (`window_rows`, 1:
    row by row): more than one where its window reads input rows that the next output rows
    read too (a 3 x 3 window's rows: 8 output rows stage 10 input rows, not 24), so some
    staged read's rows are shared (`_staged_layout`) and every staged read can be shared. The
    row must fit one accumulator row with its window unrolled and no loop outside it (the
    side-by-side rows then run one after another on the staged rows), the innermost row
    axis must not vary, and a block holds whole groups (`window_rows` of its rows)."""
    va, ra = axes[vec], row_axes[-1] if row_axes else None
    if ra is None or ra in free or va in free or vlen > tiles.vector_chunk:
        return 1
    looped, unrolled = _window_split(p.reduction, free)
    if looped:
        return 1
    side = window_rows(row_extents[-1], per)
    if side == 1:
        return 1
    layouts = [_staged_layout(spec, ra, side)
               for spec in _staged_reads(p, va, vlen, unrolled)]
    if None in layouts or not any(x.shared for x in layouts):
        return 1
    return side


class _Layout(NamedTuple):
    """The rows of a staged read's buffer for output rows side by side (`_staged_layout`):
    `fills` each buffer row's (offset of the row axis, the group's values), `row(u, point)`
    the buffer row of output row u's window point, `shared` whether output rows share
    buffer rows."""

    fills: list[tuple[int, dict]]
    row: Callable[[int, dict], int]
    shared: bool


def _staged_layout(spec: _Staging, ra: str | None, side: int) -> _Layout | None:
    """The buffer rows of a staged read (`_staged_reads`'s `spec`) for `side` output rows
    along the row axis `ra`, or None when they cannot share its buffer. Row by row (or a
    read without `ra`): a row per value of the group axes (a 3 x 3 window's 3). Where the
    read's dimension of `ra` is `ch * ra + cg * g + c` for its one group axis `g` (the
    window's rows): with `cg` 1 the buffer holds `ch * (side - 1) + extent(g)` rows, row `t`
    read at `ra`'s first value and `g = t`, and row u's point `g` is row `ch * u + g`; with
    `ch` 1 (a dilated window), `side - 1 + cg * (extent(g) - 1) + 1` rows read at `ra + t`
    and `g = 0`. Either way the same index values as row by row, so the same bounds checks
    hold."""
    r, window, group = spec.read, spec.window, spec.group
    dims = [dict(m.terms) for m in r.maps]
    with_ra = [d for d, t in enumerate(dims) if ra in t]
    if side == 1 or not with_ra:
        names = [a for a, _ in group]

        def row(u: int, point: dict) -> int:
            k = 0
            for a, n in group:
                k = k * n + point[a]
            return k
        return _Layout([(0, dict(zip(names, v)))
                        for v in itertools.product(*(range(n) for _, n in group))],
                       row, False)
    if len(with_ra) != 1 or len(group) > 1 or not r.maps[with_ra[0]].affine:
        return None
    terms = dims[with_ra[0]]
    if any(a in window for a in terms) or any(
            a in t for a, _ in group for d, t in enumerate(dims) if d != with_ra[0]):
        return None
    ch = terms[ra]
    if not group:
        return _Layout([(u, {}) for u in range(side)], lambda u, point: u, False)
    (g, n), = group
    cg = terms.get(g, 0)
    if ch < 1 or cg < 1:
        return None
    if cg == 1:
        return _Layout([(0, {g: t}) for t in range(ch * (side - 1) + n)],
                       lambda u, point: ch * u + point[g], True)
    if ch == 1:
        return _Layout([(t, {g: 0}) for t in range(side - 1 + cg * (n - 1) + 1)],
                       lambda u, point: u + cg * point[g], True)
    return None


def _accumulator_row(b: Builder, module, plan: GroupPlan, axes, ats: list[dict], vec: int,
                     vlen: int, tiles: CpuTiles, idx_t: str, free: frozenset[str],
                     span: "_Span | None" = None) -> None:
    """A reduction vectorised over the output's vector axis: an accumulator row of up to
    `vector_chunk` points, the reduction loops outside the lanes (its trailing axes up to
    `UNROLLED_WINDOW` points unrolled, none that is `free`); a row that fits one chunk has
    no chunk loop, so its bounds are constants. A `free` vector axis (its extent varies)
    always has the chunk loop and a row of `vector_chunk` points. `ats`: the output rows
    (each its row axes' values) computed side by side on staged rows staged once for all
    (`_side_by_side`; one row unless it said so), one after another. `span`: the block's
    points of the vector axis (a column block), in chunks, nothing staged."""
    stage = plan.stages[0]
    p = stage.main
    at = ats[0]
    chunk = min(vlen, tiles.vector_chunk)
    probe = PointBuilder(module, b, stage, [at.get(a, tx.const(0)) for a in axes],
                         global_resolver)
    kind = probe.acc_kind(p)
    dtype = KIND_DTYPE[kind]
    # storage rounded up to a power of two: rows of nearby lengths have the same code
    # (tilekit.codegen.parametric shares one build between their sizes)
    va = axes[vec]
    room = tiles.vector_chunk if va in free else chunk
    row = b.alloc("accrow", dtype, (1 << (room - 1).bit_length(),),
                  "accumulators of a row of the vector axis")
    looped, unrolled = _window_split(p.reduction, free)

    def accumulate(at: dict, j0: Expr, count: Expr, code: dict, rows: dict | None = None
                   ) -> None:
        """Fold one window point into the accumulator row; `rows` maps a staged read's key
        to its row buffer and this point's offset in it."""
        with b.loop("jj", 0, count, kind="simd", dtype=idx_t) as jj:
            v = b.let(avar(va), tx.add(j0, jj), idx_t)
            vars_ = [v if a == va else at[a] for a in axes]
            resolver = global_resolver
            if rows:
                def resolver(plan_, node, axis, jj=jj):
                    hit = rows.get(read_key(plan_.read(node)))
                    if hit is None:
                        return global_resolver(plan_, node, axis)
                    buf, row_, offset = hit
                    return Load(buf.name, (tx.const(row_), tx.add(jj, offset)), buf.dtype)
            pb = PointBuilder(module, b, stage, vars_, resolver)
            comp = pb.compiler(p, pb.axis_code(p, code))
            value = comp.emit(p.body, kind)
            b.store(row, (jj,), combine(p.assign, Load(row.name, (jj,), dtype),
                                        tx.cast(dtype, value)))

    single = len(ats) == 1

    def run_chunk(j0: Expr, count: Expr) -> None:
        if single:
            start(count)
        code: dict = {}
        with ExitStack() as loops:
            for a, extent in looped:
                code[a] = loops.enter_context(b.loop(avar(a), 0, extent))
            for st in staged:
                st.fill(b, p, at, code, va, idx_t)
            for u, at_u in enumerate(ats):   # side by side: one after another
                if not single:
                    start(count)
                for point in itertools.product(*(range(n) for _, n in unrolled)):
                    at_point = {a: i for (a, _), i in zip(unrolled, point)}
                    code.update({a: tx.const(i) for a, i in at_point.items()})
                    accumulate(at_u, j0, count, code,
                               {st.key: st.at(u, at_point) for st in staged})
                if not single:
                    epilogue(at_u, j0, count)
        if single:
            epilogue(at, j0, count)

    def start(count: Expr) -> None:
        with b.loop("jj", 0, count, kind="simd", dtype=idx_t) as jj:
            b.store(row, (jj,), identity(p.assign, kind))

    def epilogue(at: dict, j0: Expr, count: Expr) -> None:
        with b.loop("jj", 0, count, kind="simd", dtype=idx_t) as jj:
            v = b.let(avar(va), tx.add(j0, jj), idx_t)
            vars_ = [v if a == va else at[a] for a in axes]
            pb = PointBuilder(module, b, stage, vars_, global_resolver)
            sink = store_sink(module, b, plan.stored, vars_)
            pb.epilogue(pb.main_value(p, (Load(row.name, (jj,), dtype), kind)), sink)

    if span is None and chunk >= vlen and va not in free:
        ra = next((a for a in reversed(axes) if a != va), None)   # the innermost row axis
        staged = [_StagedRow(spec, k, b, ra, _staged_layout(spec, ra, len(ats)))
                  for k, spec in enumerate(_staged_reads(p, va, vlen, unrolled))]
        run_chunk(tx.const(0, idx_t), tx.const(vlen, idx_t))
        return
    staged = []
    lo, hi = (span.lo, span.hi) if span is not None else (0, vlen)
    if span is not None and span.width is not None and span.width <= chunk:
        run_chunk(lo, tx.const(span.width, idx_t))    # constant bounds: the row in registers
        return
    with b.loop("j0", lo, hi, chunk, dtype=idx_t) as j0:
        run_chunk(j0, b.let("jn", tx.call("min", tx.const(chunk, idx_t), tx.sub(hi, j0)),
                            idx_t))


class _Span(NamedTuple):
    """A column block's points of the vector axis (`loops_kernel`): from `lo` to `hi`;
    `width` their number when every block spans the same (the axis a whole number of
    blocks), else None."""

    lo: Expr
    hi: Expr
    width: int | None


class _StagedRow:
    """A read staged once per row (`_staged_reads`), or once for output rows side by side:
    `buffer` the rows of values the window reads (padding included) as `layout`
    (`_staged_layout`) places them, a row per value of the other unrolled axes it reads by
    (a 3 x 3 window's 3 input rows, or those of 8 output rows, 10), each in the staging's
    phases (one unstrided, a stride-2 window's even and odd values)."""

    def __init__(self, spec: _Staging, k: int, b: Builder, row_axis: str | None,
                 layout: _Layout):
        self.spec, self.key, self.row_axis, self.layout = spec, read_key(spec.read), \
            row_axis, layout
        self.buffer = b.alloc(f"srow{k}", spec.read.dtype,
                              (len(layout.fills) * len(spec.phases), spec.length),
                              f"{spec.read.tensor}: the rows the window reads, padding "
                              "included" + (f", in {len(spec.phases)} phases"
                                            if spec.stride > 1 else ""))

    def at(self, u: int, point: dict) -> tuple:
        """(buffer, its row, the offset in the row) of a window point's values for output
        row `u` of those side by side."""
        s = self.spec
        offset = sum(cf * point[a] for a, cf in s.window.items())
        return (self.buffer, self.layout.row(u, point) * len(s.phases)
                + s.phases.index(offset % s.stride), offset // s.stride)

    def fill(self, b: Builder, p: OpPlan, at: dict, code: dict, va: str, idx_t: str) -> None:
        """The buffer's rows: the read with the vector axis at each position, the window
        axes in its dimension at 0 but the phase's carrier at the phase, the group's at
        each row's values and the row axis shifted by its offset (its bounds checks run
        here, once per row, and the guard split leaves them at the row's edges)."""
        s = self.spec
        ra = self.row_axis
        for k, (shift, group) in enumerate(self.layout.fills):
            for i, phase in enumerate(s.phases):
                with b.loop("q", 0, s.length, kind="simd", dtype=idx_t) as q:
                    axis = {**code, **at, va: q}
                    if shift:
                        axis[ra] = tx.add(at[ra], shift)
                    axis.update({a: tx.const(0) for a in s.window})
                    if s.carrier is not None:
                        axis[s.carrier] = tx.const(phase)
                    axis.update({a: tx.const(v) for a, v in group.items()})
                    b.store(self.buffer, (tx.const(k * len(s.phases) + i), q),
                            global_read(s.read, axis, full_ranges(p)))


class _Staging(NamedTuple):
    """A read an accumulator row stages (`_staged_reads`): `window` the unrolled window axes
    of its vector dimension with their coefficients, `group` the other unrolled axes it
    reads by (with extents), `stride` the vector axis's coefficient, `phases` the residues
    modulo `stride` of the window's offsets in that dimension (`(0,)` unstrided), `carrier`
    a window axis of coefficient 1 that sets a phase (None unstrided) and `length` the
    values of a staged row of one phase."""

    read: Read
    window: dict
    group: tuple
    stride: int
    phases: tuple[int, ...]
    carrier: str | None
    length: int


def _staged_reads(p: OpPlan, va: str, vlen: int, unrolled) -> list[_Staging]:
    """The reads an accumulator row stages (`_StagedRow`): float32, the vector axis `va` with
    a positive coefficient `s` in one affine dimension that can leave the tensor (a
    convolution's padding) and in no other, the unrolled window axes of that dimension with
    positive coefficients and in no other dimension. Each point of the window then reads the
    row at `jj + offset`: a vector loop with constant bounds and no guard, where reading the
    tensor takes a guard split per point (a scalar edge and an interior one lane short of
    whole vectors). A strided window (`s` 2: a pool or convolution of stride 2) is staged in
    `s` phases, phase `ph` holding the values at `s * q + ph`, so that window offset `o`
    reads phase `o % s` at `jj + o // s`, contiguous, where the tensor's values are `s`
    apart (a gather); it needs a window axis of coefficient 1 to set the phase."""
    names = {a for a, _ in unrolled}
    extent = dict(p.spatial) | dict(p.reduction)
    out, seen = [], set()
    for r in p.read_list():
        key = read_key(r)
        if key in seen or r.dtype != "float32":
            continue
        seen.add(key)
        dims = [set(m.axes) for m in r.maps]
        with_va = [d for d, t in enumerate(dims) if va in t]
        if len(with_va) != 1 or not r.maps[with_va[0]].affine:
            continue
        d = with_va[0]
        terms = dict(r.maps[d].terms)
        stride = terms.get(va)
        if not isinstance(stride, int) or stride < 1 or not needs_check(r, full_ranges(p))[d]:
            continue
        window = {a: cf for a, cf in terms.items() if a != va and cf}
        if any(a not in names or cf < 1 for a, cf in window.items()):
            continue
        if any(a in t for a in window for k, t in enumerate(dims) if k != d):
            continue
        group = tuple((a, n) for a, n in unrolled if a not in window
                      and any(a in t for t in dims))
        offsets = {sum(cf * i for (a, cf), i in zip(window.items(), point))
                   for point in itertools.product(*(range(extent[a]) for a in window))}
        carrier = next((a for a, cf in window.items() if cf == 1), None)
        if stride > 1 and carrier is None:
            continue
        out.append(_Staging(r, window, group, stride,
                            tuple(sorted({o % stride for o in offsets})),
                            carrier if stride > 1 else None,
                            vlen + max(o // stride for o in offsets)))
    return out


def _window_split(reduction, free: frozenset[str] = frozenset()) -> tuple[list, list]:
    """The reduction axes in loops and the trailing ones unrolled (`UNROLLED_WINDOW`; no
    `free` axis, whose extent varies)."""
    axes = list(reduction)
    points, cut = 1, len(axes)
    while (cut > 0 and axes[cut - 1][0] not in free
           and points * axes[cut - 1][1] <= UNROLLED_WINDOW):
        points *= axes[cut - 1][1]
        cut -= 1
    return axes[:cut], axes[cut:]


# -- contractions ------------------------------------------------------------------------

class _Operand:
    """One packed operand: its read, the axes of its M or N group and the panel buffer."""

    def __init__(self, read: Read, group: tuple[str, ...], k_axes: tuple[str, ...]):
        self.read = read
        self.group = group
        self.k_axes = k_axes


def gemm_kernel(module, plan: GroupPlan, entry: str, shape: CpuShape, target: Target,
                c: Contraction) -> GeneratedKernel:
    stage = plan.stages[0]
    p = stage.main
    tiles = shape.tiles
    free = tiles.free(p.op.name)    # axes whose extents vary (a symbolic module's sizes)
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    extent = dict(p.spatial) | dict(p.reduction)
    reads = {read_key(r): r for r in p.read_list()}
    facts_reads = list(reads.values())
    a_role, b_role = shape.gemm.roles
    ops = {"a": c.a, "b": c.b}
    opa, opb = ops[a_role], ops[b_role]
    m_axes = opa.mn_axes
    n_axes = opb.mn_axes
    A = _Operand(facts_reads[opa.index], m_axes, c.k_axes)
    B = _Operand(facts_reads[opb.index], n_axes, c.k_axes)
    M = math.prod(extent[a] for a in m_axes)
    N = math.prod(extent[a] for a in n_axes)
    K = math.prod(extent[a] for a in c.k_axes)
    batch = math.prod(extent[a] for a in c.batch_axes)
    g = shape.gemm.blocks
    mr, nr = tiles.mr, tiles.nr
    mc_p, nc_p = -(-g.mc // mr) * mr, -(-g.nc // nr) * nr
    smem = SharedMemory()
    a_weight = _weight_panels(module, A.read, m_axes, c.k_axes, c.batch_axes, extent,
                              g.m_blocks, g.mc, mr, "wpa", idx_t, free)
    direct = None if a_weight is not None else _direct_rows(A.read, m_axes, c.k_axes, extent,
                                                            free)
    ap = None if direct is not None or a_weight is not None else smem.carve(
        "s_a", "float32", (mc_p // mr, g.kc, mr),
        f"{A.read.tensor}: A panel, {mc_p // mr} micro-panels of {g.kc}x{mr}")
    weight = _weight_panels(module, B.read, n_axes, c.k_axes, c.batch_axes, extent,
                            g.n_blocks, g.nc, nr, "wpb", idx_t, free)
    bp = None if weight is not None else smem.carve(
        "s_b", "float32", (nc_p // nr, g.kc, nr),
        f"{B.read.tensor}: B panel, {nc_p // nr} micro-panels of {g.kc}x{nr}")
    # the output's rows are in N unless the roles are swapped: micro-tiles that walk them
    # store (and read a residual) in order
    rows_first = p.spatial[-1][0] not in m_axes
    # one step over K: a strip of micro-tiles (a row of them, or a column when the roles are
    # swapped) goes to the epilogue through a buffer that stays in L1; several steps: the
    # block's output tile holds the sums between steps
    one_step = g.k_steps == 1 and not free & set(c.k_axes)
    if not one_step:
        ct = smem.carve("s_c", "float32", (mc_p, nc_p), "the block's output tile")
    elif rows_first:
        ct = smem.carve("s_c", "float32", (mr, nc_p), "a row of micro-tiles' outputs")
    else:
        ct = smem.carve("s_c", "float32", (mc_p, nr), "a column of micro-tiles' outputs")
    linear, whole_rows = _linear_columns(plan, n_axes, extent, nr, g.nc, free)
    b = Builder()
    counts = [extent[a] for a in c.batch_axes] + [g.m_blocks, g.n_blocks]
    names = [f"{avar(a)}_" for a in c.batch_axes] + ["mb", "nb"]
    coords = decompose(b, BLOCK, counts, names, "int32", named=bool(free))
    batch_at = dict(zip(c.batch_axes, coords[:len(c.batch_axes)]))
    m0 = b.let("m0", tx.mul(coords[-2], g.mc), idx_t)
    n0 = b.let("n0", tx.mul(coords[-1], g.nc), idx_t)
    mcount = b.let("mc", tx.call("min", tx.const(g.mc, idx_t), tx.sub(M, m0)), idx_t)
    ncount = b.let("nc", tx.call("min", tx.const(g.nc, idx_t), tx.sub(N, n0)), idx_t)
    a_side = None if a_weight is not None else _side(b, "a", A.read, m_axes, m0, mcount, mc_p,
                                                     mc_p, extent, batch_at, idx_t, free)
    for packed in (a_weight, weight):
        if packed is not None:
            packed.start(b)
    b_side = None if weight is not None else _side(b, "b", B.read, n_axes, n0, ncount, nc_p,
                                                   nc_p, extent, batch_at, idx_t, free)
    def c_at(ir: Expr, jr: Expr) -> tuple[Expr, Expr]:
        """Where micro-tile (ir, jr) starts in `ct`."""
        if one_step and rows_first:
            return tx.const(0), tx.mul(jr, nr)
        if one_step:
            return tx.mul(ir, mr), tx.const(0)
        return tx.mul(ir, mr), tx.mul(jr, nr)

    def c_tile(ir: Expr, jr: Expr) -> tuple[Addr, int]:
        return Addr(ct.name, c_at(ir, jr)), ct.shape[1]

    def epilogue(ir: Var, jr: Var) -> None:
        row, col = c_at(ir, jr)
        _tile_epilogue(b, module, plan, c, m_axes, n_axes, batch_at, m0,
                       (tx.mul(ir, mr), mr, mcount), (tx.add(n0, tx.mul(jr, nr)), nr, ncount,
                                                      tx.mul(jr, nr)),
                       lambda i, j: Load(ct.name, (tx.add(row, i), tx.add(col, j)), "float32"),
                       extent, linear, idx_t)

    def block_rows(i0: Expr, rows: int) -> None:
        """Up to `rows` rows of `ct` from local row `i0`, each one vector loop over the
        block's columns (`whole_rows`: they are one run of addresses)."""
        _tile_epilogue(b, module, plan, c, m_axes, n_axes, batch_at, m0, (i0, rows, mcount),
                       (n0, g.nc, ncount, tx.const(0)),
                       lambda i, j: Load(ct.name, (i, j), "float32"), extent, True, idx_t)

    def strip_done(outer: Var, ir_lo: Expr, ir_hi: Expr) -> None:
        """The epilogue of the strip of micro-tiles just computed (one step over K): a row
        of them, or the rows `ir_lo` to `ir_hi` of a column. A row of micro-tiles whose
        outputs lie in one run of addresses (`whole_rows`) goes row by row, each row of the
        block one vector loop: long runs of stores and reads in order, where a micro-tile
        at a time hops between its rows every few cache lines (ResNet-50's 1 x 1
        convolutions with K = 64 and a residual waited on those reads)."""
        if rows_first and whole_rows:
            block_rows(tx.mul(outer, mr), mr)
        elif rows_first:
            with b.loop("jr", 0, tx.div(tx.add(ncount, nr - 1), nr)) as jr:
                epilogue(outer, jr)
        else:
            with b.loop("ir", ir_lo, ir_hi) as ir:
                epilogue(ir, outer)

    # one step: the epilogue streams a strip's rows after it, so each strip prefetches the
    # next one's
    streams = _epilogue_streams(plan, m_axes, n_axes) \
        if one_step and rows_first and whole_rows else []
    n_first = _axis_values(b, n_axes, n0, extent, idx_t, "pf") if streams else {}

    def ahead(ir: Var):
        """Prefetches of the epilogue's streams for the next strip of micro-tiles (rows
        `(ir + 1) * mr` on), a micro-tile's columns at a time: the row offsets at the
        block's first column now, then per micro-tile (`at(jr)`) a line of each row of the
        strip per cache line of its columns."""
        rows = []
        for i in range(mr):
            values = {**batch_at, **n_first, **_axis_values(
                b, m_axes, tx.add(tx.add(m0, tx.mul(tx.add(ir, 1), mr)), i), extent, idx_t,
                "pf")}
            rows.append([(tensor, step, b.let(f"pf{k}_{i}", offset(values), idx_t))
                         for k, (tensor, step, offset) in enumerate(streams)])

        def at(jr: Var) -> None:
            for row in rows:
                for tensor, step, base in row:
                    for col in range(0, nr, step):
                        b.evaluate(tx.call("prefetch", Addr(tvar(tensor), (tx.add(
                            base, tx.add(tx.mul(jr, nr), col)),))))
        return at

    with b.loop("ks", 0, g.k_steps) as ks:
        k0 = b.let("k0", tx.mul(ks, g.kc), idx_t)
        kcount = b.let("kc", tx.call("min", tx.const(g.kc, idx_t), tx.sub(K, k0)), idx_t)
        if ap is not None:
            a_k = _k_side(b, "a", A.read, c.k_axes, k0, kcount, g.kc, extent, idx_t, free)
            b.comment(f"pack A: {A.read.tensor} into micro-panels of {mr} rows")
            _pack(b, A.read, ap, mr, mc_p, mcount, kcount, a_side, a_k, idx_t)
        fill = None
        if weight is None:
            b_k = _k_side(b, "b", B.read, c.k_axes, k0, kcount, g.kc, extent, idx_t, free)
            if _fills(B.read, nr, b_side, b_k, idx_t):
                b.comment(f"B: {B.read.tensor} packed into micro-panels of {nr} columns by the "
                          "first micro-tile of each")
                fill = _Fill(b, B.read, nr, g.kc, ncount, kcount, b_side, b_k, idx_t)
            else:
                b.comment(f"pack B: {B.read.tensor} into micro-panels of {nr} columns")
                _pack(b, B.read, bp, nr, nc_p, ncount, kcount, b_side, b_k, idx_t)
        panels = tx.div(tx.add(mcount, mr - 1), mr)
        slice_ = max(1, tiles.mc // mr)      # A's micro-panels per slice kept in L2
        with ExitStack() as slices:
            if g.mc > slice_ * mr:
                ic = slices.enter_context(b.loop("ic", 0, tx.div(tx.add(panels, slice_ - 1),
                                                                   slice_)))
                ir_lo = b.let("ir0", tx.mul(ic, slice_))
                ir_hi = b.let("ir1", tx.call("min", tx.add(ir_lo, slice_), panels))
            else:
                ir_lo, ir_hi = tx.const(0), panels
            if weight is None:
                b_panel = lambda jr: Addr(bp.name, (jr, tx.const(0), tx.const(0)))  # noqa: E731
            else:
                b_panel = lambda jr: weight.panel(tx.add(tx.div(n0, nr), jr), k0)  # noqa: E731

            def a_panel(ir: Expr) -> Expr:
                if a_weight is not None:
                    return a_weight.panel(tx.add(tx.div(m0, mr), ir), k0)
                return Addr(ap.name, (ir, tx.const(0), tx.const(0)))

            def a_tile(ir: Expr) -> tuple[str, tuple]:
                """The micro-kernel and its A arguments for the micro-tiles of row `ir`."""
                if direct is None:
                    return "gemm_micro", (a_panel(ir),)
                # A's rows where they lie: row m0 + ir * mr at step k0
                first = tx.add(a_side.offset(tx.mul(ir, mr), idx_t), k0)
                return "gemm_micro_rows", (Addr(tvar(A.read.tensor), (first,)),
                                           tx.const(direct, idx_t),
                                           tx.cast("int32", tx.sub(mcount, tx.mul(ir, mr))))

            # a weight's panels come from memory, once per run: a micro-tile prefetches the
            # A panel of the next row of micro-tiles, or (the columns outside) the first
            # micro-tiles of a column the next column's B panel (`_micro_tiles`)
            a_ahead = b_ahead = None
            if a_weight is not None:
                a_ahead = lambda ir: a_panel(tx.add(ir, 1))  # noqa: E731
            elif weight is not None and not (one_step and rows_first):
                b_ahead = lambda jr, t: weight.panel(  # noqa: E731
                    tx.add(tx.div(n0, nr), tx.add(jr, 1)),
                    tx.add(k0, tx.div(tx.mul(tx.mul(t, LINE_FLOATS), kcount), nr)))
            _micro_tiles(b, a_tile, b_panel, c_tile, mr, nr, ir_lo, ir_hi, ks, ncount, kcount,
                         rows_first=one_step and rows_first,
                         strip_done=strip_done if one_step else None,
                         ahead=ahead if streams else None, a_ahead=a_ahead, b_ahead=b_ahead,
                         fill=fill, a_packed=direct is None)
    if not one_step and rows_first and whole_rows:
        block_rows(tx.const(0), g.mc)     # after the last step, the tile (from L2)
    elif not one_step:
        # after the last step, the tile's micro-tiles through the epilogue in the output's
        # order (the tile from L2; each step's micro-kernels kept B's micro-panel in L1)
        outer, inner = _tile_order(tx.const(0), tx.div(tx.add(mcount, mr - 1), mr),
                                   tx.div(tx.add(ncount, nr - 1), nr), rows_first)
        with b.loop(*outer) as o, b.loop(*inner) as n:
            epilogue(*((o, n) if rows_first else (n, o)))
    sched = {"source": "cpu", "gemm": {"m": list(m_axes), "n": list(n_axes),
                                       "batch": list(c.batch_axes), "k": list(c.k_axes),
                                       "blocks": [g.mc, g.nc, g.kc],
                                       "micro": [mr, nr],
                                       "a": "weight panels" if a_weight else
                                       "packed" if direct is None else "rows",
                                       "b": "packed" if weight is None else "weight panels"}}
    grid = batch * g.m_blocks * g.n_blocks
    return finish(plan, entry, sig, b.build(), shape="cpu_gemm", schedule=sched, threads=1,
                  grid=grid, shared=smem.all(), target=target,
                  comments=[f"cpu gemm: {M}x{N}x{K} (M {', '.join(m_axes)}; N "
                            f"{', '.join(n_axes)}; K {', '.join(c.k_axes)})"
                            + (f" x {batch} batch" if batch > 1 else "")
                            + f", blocks {g.mc}x{g.nc}, steps of {g.kc}, micro-tiles "
                            f"{mr}x{nr}" + (", A read in place" if direct else "")
                            + (", A packed once (a weight)" if a_weight else "")
                            + (", B packed once (a weight)" if weight else "")])


def _micro_tiles(b: Builder, a_tile, b_panel, c_tile, mr: int, nr: int, ir_lo: Expr,
                 ir_hi: Expr, ks: Var, ncount: Var, kcount: Var, rows_first: bool, strip_done,
                 ahead=None, a_ahead=None, b_ahead=None, fill=None, a_packed=False) -> None:
    """The micro-kernel on every `mr x nr` tile of the rows `ir_lo * mr` to `ir_hi * mr` of
    the block at this step, into `c_tile(ir, jr)` (address, row stride), with the
    micro-kernel and A's arguments of `a_tile(ir)` (a packed panel, or A's rows where they
    lie). Column panels outside (`rows_first` false): each B micro-panel (`b_panel(jr)`)
    stays in L1 while the rows' A comes from L2; rows outside: A's micro-panel stays in L1.
    After each run of the inner loop (a strip of micro-tiles), `strip_done(outer, ir_lo,
    ir_hi)` if given: the epilogue of a K of one step, on the strip while it is in L1. With
    rows outside, `ahead` if given: `ahead(ir)` at the start of a strip, a function of the
    micro-tile column it calls after each whole micro-tile (the next strip's epilogue
    streams, prefetched while this strip computes).

    A weight's packed panels, prefetched a line per step of K as the micro-kernel runs
    (`gemm_micro_ahead`, runtime_cpu.h): with `a_ahead`, `a_ahead(ir)`, the A panel of the
    next row of micro-tiles (`mr` floats a step: the whole panel), by each micro-tile with
    the columns outside and by the first of each strip with the rows outside (the others
    read the panel from L1); with `b_ahead`, the first `nr / LINE_FLOATS` micro-tiles `t` of
    column `jr` prefetch `b_ahead(jr, t)`, their share of the next column's B panel (a line
    a step).

    With `fill` (a `_Fill`), B's panel is packed by the micro-tiles of row 0 (the first each
    micro-panel meets), which read its rows from the operand as they compute
    (`gemm_micro_fill`); the others read the panel.

    The last micro-panel of a ragged N: with A packed (`a_packed`), `gemm_micro_ragged`
    (runtime_cpu.h) runs its whole vectors of columns in N as the register tile does and the
    rest, fewer than a vector, a vector of the tile's rows per column (a 7 x 7 image's 49
    pixels are a panel of 32 and one of 17 columns: 16 and 1, where a tile of 32 did 32); the
    micro-tile that packs B's panel (`fill`) and A read in place take `nr / 2` columns when
    no more of it are in N, else `nr` (196 pixels are 6 panels of 32 and 4 columns, which
    take 16 columns rather than 32; the micro-kernels read B's panel at its own stride)."""
    whole = b.let("jw", tx.div(ncount, nr))      # micro-panels with all their columns in N
    rest = b.let("jt", tx.sub(ncount, tx.mul(whole, nr)))
    half = nr // 2 if nr % 8 == 0 else None

    def call(ir: Expr, jr: Expr, width: int | None, prefetch: tuple[Expr, int] | None,
             filling: bool) -> None:
        """The micro-kernel on tile (ir, jr): on B's packed panel, or (`filling`) packing it
        as it reads it (`gemm_micro_fill`: always with a prefetch step, 0 for none);
        `prefetch`: (address, floats per step of K) to prefetch. `width` None: the ragged
        last panel (`last_panel`)."""
        if width is None and (filling or not a_packed):
            # a tile of nr / 2 columns where the rest fits in them, else of nr
            with b.if_(tx.le(rest, half)):
                call(ir, jr, half, prefetch, filling)
            with b.else_():
                call(ir, jr, nr, prefetch, filling)
            return
        fn, a_args = a_tile(ir)
        if width is None:
            at, ldc = c_tile(ir, jr)
            step, ahead_at = (0, tx.const(0)) if prefetch is None else (prefetch[1],
                                                                        prefetch[0])
            b.evaluate(tx.call("gemm_micro_ragged", tx.const(mr), tx.const(nr),
                               tx.const(step), *a_args, b_panel(jr),
                               tx.cast("int32", kcount), at, tx.const(ldc),
                               tx.cast("int32", tx.gt(ks, 0)), tx.cast("int32", rest),
                               ahead_at))
            return
        consts = [mr, width, nr]
        if filling:
            fn = f"{fn}_fill"
            step, ahead_at = (0, fill.src) if prefetch is None else (prefetch[1], prefetch[0])
            consts += [step, int(fill.gather)]
            a_args = (*a_args, *fill.args(jr))
        elif prefetch is not None:
            fn, ahead_at = f"{fn}_ahead", prefetch[0]
            consts.append(prefetch[1])
        at, ldc = c_tile(ir, jr)
        b.evaluate(tx.call(fn, *map(tx.const, consts), *a_args, b_panel(jr),
                           tx.cast("int32", kcount), at, tx.const(ldc),
                           tx.cast("int32", tx.gt(ks, 0)),
                           *((ahead_at,) if filling or prefetch is not None else ())))

    def micro(ir: Expr, jr: Expr, width: int, prefetch: tuple[Expr, int] | None = None
              ) -> None:
        """Micro-tile (ir, jr); in row 0 with `fill`, the one that packs B's micro-panel."""
        if fill is None:
            call(ir, jr, width, prefetch, False)
            return
        with b.if_(tx.eq(ir, 0)):
            fill.tables(jr)
            call(ir, jr, width, prefetch, True)
        with b.else_():
            call(ir, jr, width, prefetch, False)

    def micro_when(cond: Expr, ir: Expr, jr: Expr, width: int, prefetch: tuple[Expr, int]
                   ) -> None:
        """Micro-tile (ir, jr) prefetching `prefetch` where `cond` holds, else without."""
        with b.if_(cond):
            micro(ir, jr, width, prefetch)
        with b.else_():
            micro(ir, jr, width)

    def last_panel(tiles_of) -> None:
        """The ragged last micro-panel (`rest` > 0): `tiles_of(width)` emits its
        micro-tiles (width None: each as `call` decides)."""
        tiles_of(nr if half is None else None)

    if rows_first:
        with b.loop("ir", ir_lo, ir_hi) as ir:
            prefetch = ahead(ir) if ahead is not None else None
            with b.loop("jr", 0, whole) as jr:
                if a_ahead is not None:
                    micro_when(tx.eq(jr, 0), ir, jr, nr, (a_ahead(ir), mr))
                else:
                    micro(ir, jr, nr)
                if prefetch is not None:
                    prefetch(jr)
            with b.if_(tx.gt(rest, 0)):
                last_panel(lambda width: micro(ir, whole, width))
            if strip_done is not None:
                strip_done(ir, ir_lo, ir_hi)
        return

    def column(jr: Expr, width: int) -> None:
        with b.loop("ir", ir_lo, ir_hi) as ir:
            if a_ahead is not None:
                micro(ir, jr, width, (a_ahead(ir), mr))
            elif b_ahead is not None:
                t = b.let("t", tx.sub(ir, ir_lo))
                micro_when(tx.lt(t, max(1, nr // LINE_FLOATS)), ir, jr, width,
                           (b_ahead(jr, t), LINE_FLOATS))
            else:
                micro(ir, jr, width)

    with b.loop("jr", 0, whole) as jr:
        column(jr, nr)
        if strip_done is not None:
            strip_done(jr, ir_lo, ir_hi)
    with b.if_(tx.gt(rest, 0)):
        last_panel(lambda width: column(whole, width))
        if strip_done is not None:
            strip_done(whole, ir_lo, ir_hi)


def _tile_order(ir_lo: Expr, ir_hi: Expr, jr_hi: Expr, rows_first: bool
                ) -> tuple[tuple, tuple]:
    """The (outer, inner) loops over micro-tile rows `ir` (from `ir_lo` to `ir_hi`) and
    columns `jr` (from 0 to `jr_hi`) as `Builder.loop` arguments: rows outside when
    `rows_first`."""
    rows, columns = ("ir", ir_lo, ir_hi), ("jr", 0, jr_hi)
    return (rows, columns) if rows_first else (columns, rows)


class _WeightPanels:
    """An operand that is a weight, packed once (runtime_cpu.h tk_packed_panels) into
    micro-panels of `width` rows (A) or columns (B): element (p, k) of its side of the GEMM
    (`points` by `k`) at `base + p * ldp + k * ldk` of `tensor`; `slot` the block's cache of
    the pack's address (`start` allocates it, named `name`)."""

    def __init__(self, tensor: str, points: int, k: int, base: int, ldp: int, ldk: int,
                 width: int, name: str, idx_t: str):
        self.tensor, self.points, self.k, self.width = tensor, points, k, width
        self.base, self.ldp, self.ldk, self.name, self.idx_t = base, ldp, ldk, name, idx_t
        self.slot = None

    def start(self, b: Builder) -> None:
        self.slot = b.alloc(self.name, "int64", (1,),
                            "the packed weight's address, once looked up")
        b.store(self.slot, (tx.const(0),), tx.const(0, "int64"))

    def panel(self, panel: Expr, k0: Expr) -> Expr:
        """The address of micro-panel `panel` at step `k0`."""
        idx_t = self.idx_t
        return tx.call("packed_panels", tx.const(self.width),
                       Addr(self.slot.name, (tx.const(0),)),
                       Addr(tvar(self.tensor), (tx.const(self.base, idx_t),)),
                       tx.const(self.points, idx_t), tx.const(self.k, idx_t),
                       tx.const(self.ldp, idx_t), tx.const(self.ldk, idx_t), panel, k0)


def _weight_panels(module, read: Read, axes: tuple[str, ...], k_axes: tuple[str, ...],
                   batch_axes: tuple[str, ...], extent: dict, blocks: int, block: int,
                   width: int, name: str, idx_t: str, free: frozenset[str] = frozenset()
                   ) -> _WeightPanels | None:
    """An operand's panels packed once per loaded program rather than per run and block (B)
    or read in place (A), when it is a model's weight (its values fixed between runs) read as
    a matrix: float32, its M or N axes (`axes`) and its K axes each row-major in the tensor,
    none of them of varying extent, the same matrix for every batch point, no index that can
    leave the tensor, and `blocks` blocks of `block` points along `axes` that start on whole
    micro-panels of `width`. None otherwise."""
    t = module.tensors.get(read.tensor)
    if t is None or t.role != "weight" or read.dtype != "float32":
        return None
    if read.tensor in graph(module).producer:
        return None                     # written in the module: not fixed between runs
    if free & {*axes, *k_axes}:
        return None
    if _checked_dims(read, extent) or any(_parts(read, batch_axes)[0].values()):
        return None
    if blocks > 1 and block % width:
        return None
    ldp = _row_major(axes, _parts(read, axes)[0], extent)
    ldk = _row_major(k_axes, _parts(read, k_axes)[0], extent)
    if ldp is None or ldk is None:
        return None
    base = sum(m.const * s for m, s in zip(read.maps, strides(read.shape)))
    return _WeightPanels(read.tensor, math.prod(extent[a] for a in axes),
                         math.prod(extent[a] for a in k_axes), base, ldp, ldk, width, name,
                         idx_t)


class _Side:
    """One side of an operand's element offsets: its M or N group (points `origin + l`, the
    batch axes and the map constants folded in) or a step's K points (`k0 + kk`). The offset
    part is `coef * (origin + l) + base` when the side's axes are laid out row-major in the
    tensor (a matmul's rows, a 1x1 convolution's pixels, a convolution's weights over C, KH,
    KW), else a table filled once; each dimension that can leave the tensor has a table of
    its index part."""

    def __init__(self, origin: Expr, coef: int | None, base: Expr, offsets, dims: dict,
                 period: int | None = None):
        self.origin, self.coef, self.base = origin, coef, base
        self.offsets, self.dims = offsets, dims
        self.period = period

    def offset(self, local: Expr, idx_t: str) -> Expr:
        if self.coef is None:
            return Load(self.offsets.name, (local,), idx_t)
        return tx.add(tx.mul(tx.add(self.origin, local), self.coef), self.base)

    def dim(self, d: int, local: Expr, idx_t: str) -> Expr:
        return Load(self.dims[d].name, (local,), idx_t)


def _parts(read: Read, axes: tuple[str, ...]) -> tuple[dict[str, int], list[dict]]:
    """The read's flat-offset coefficients over `axes`, and per dimension its index map's
    coefficients over them."""
    st = strides(read.shape)
    flat: dict[str, int] = {}
    per_dim = []
    for m, s in zip(read.maps, st):
        terms = {a: cf for a, cf in m.terms if a in axes}
        per_dim.append(terms)
        for a, cf in terms.items():
            flat[a] = flat.get(a, 0) + cf * s
    return flat, per_dim


def _row_major(axes: tuple[str, ...], flat: dict[str, int], extent: dict,
               free: frozenset[str] = frozenset()) -> int | None:
    """c when the offset over `axes` is c x (their row-major flat index), else None (an axis
    of one point counts only when it is `free`: its extent varies)."""
    live = [a for a in axes if extent[a] > 1 or a in free]
    if not live:
        return 0
    c = flat.get(live[-1], 0)
    step = c
    for a in reversed(live):
        if flat.get(a, 0) != step:
            return None
        step *= extent[a]
    return c


def _direct_rows(read: Read, m_axes: tuple[str, ...], k_axes: tuple[str, ...], extent: dict,
                 free: frozenset[str] = frozenset()) -> int | None:
    """The row stride of A when the micro-kernel can read it unpacked (runtime_cpu.h's
    `tk_gemm_micro` with `lda`): the K axes contiguous and row-major in the tensor, the M
    axes row-major, no index that can leave the tensor. None otherwise (A is packed)."""
    k_flat, _ = _parts(read, k_axes)
    m_flat, _ = _parts(read, m_axes)
    if _row_major(k_axes, k_flat, extent, free) != 1 or _checked_dims(read, extent):
        return None
    lda = _row_major(m_axes, m_flat, extent, free)
    return lda if lda else None


def _checked_dims(read: Read, extent: dict) -> list[int]:
    ranges = {a: (0, n - 1) for a, n in extent.items()}
    return [d for d, need in enumerate(needs_check(read, ranges)) if need]


def _side(b: Builder, name: str, read: Read, axes: tuple[str, ...], origin: Var, count: Expr,
          size: int, fill: Expr, extent: dict, fixed: dict, idx_t: str,
          free: frozenset[str] = frozenset()) -> _Side:
    """The side's tables, filled for local indices below `fill` (points past `count` read
    point 0's, never used). `fixed` are block-level axis values (the batch axes)."""
    flat, per_dim = _parts(read, axes)
    fixed_flat, fixed_dims = _parts(read, tuple(fixed))
    st = strides(read.shape)
    checked = _checked_dims(read, extent)
    coef = _row_major(axes, flat, extent, free)
    const = tx.linear([(cf, fixed[a]) for a, cf in fixed_flat.items()],
                      sum(m.const * s for m, s in zip(read.maps, st)), idx_t)
    offsets = None if coef is not None else b.alloc(
        f"{name}_off", idx_t, (size,), f"{read.tensor}: offset part over {', '.join(axes)}")
    dims = {d: b.alloc(f"{name}_d{d}", idx_t, (size,),
                       f"{read.tensor}: dimension {d}'s index part over {', '.join(axes)}")
            for d in checked}
    if offsets is not None or dims:
        with b.loop("l", 0, fill, dtype=idx_t) as l_:
            point = b.let("g_", tx.select(tx.lt(l_, count), tx.add(origin, l_),
                                          tx.const(0, idx_t)), idx_t)
            values = _axis_values(b, axes, point, extent, idx_t)
            if offsets is not None:
                b.store(offsets, (l_,), tx.add(tx.linear(
                    [(cf, values[a]) for a, cf in flat.items()], 0, idx_t), const))
            for d in checked:
                m = read.maps[d]
                b.store(dims[d], (l_,), tx.linear(
                    [(cf, values[a]) for a, cf in per_dim[d].items()]
                    + [(cf, fixed[a]) for a, cf in fixed_dims[d].items()], m.const, idx_t))
    return _Side(origin, coef, const, offsets, dims)


def _k_side(b: Builder, name: str, read: Read, k_axes: tuple[str, ...], k0: Var, count: Var,
            size: int, extent: dict, idx_t: str, free: frozenset[str] = frozenset()) -> _Side:
    """A step's K side: no constant (the group side holds it), the dimension parts of the K
    axes alone."""
    flat, per_dim = _parts(read, k_axes)
    checked = _checked_dims(read, extent)
    coef = _row_major(k_axes, flat, extent, free)
    offsets = None if coef is not None else b.alloc(
        f"{name}_koff", idx_t, (size,), f"{read.tensor}: offset part over "
        f"{', '.join(k_axes)} in this step")
    dims = {d: b.alloc(f"{name}_kd{d}", idx_t, (size,)) for d in checked}
    if offsets is not None or dims:
        with b.loop("kk", 0, count, dtype=idx_t) as kk:
            values = _axis_values(b, k_axes, tx.add(k0, kk), extent, idx_t)
            if offsets is not None:
                b.store(offsets, (kk,), tx.linear([(cf, values[a]) for a, cf in flat.items()],
                                                  0, idx_t))
            for d in checked:
                b.store(dims[d], (kk,), tx.linear(
                    [(cf, values[a]) for a, cf in per_dim[d].items()], 0, idx_t))
    return _Side(k0, coef, tx.const(0, idx_t), offsets, dims,
                 _dims_period(k_axes, {a for d in checked for a in per_dim[d]}, extent, free))


def _dims_period(k_axes: tuple[str, ...], used: set[str], extent: dict,
                 free: frozenset[str]) -> int | None:
    """The steps of K after which the checked dimensions' K parts repeat: the points of the
    trailing K axes from the first that a checked dimension uses (a 3 x 3 window's 9 over C x
    KH x KW, 1 where no dimension is checked); None where that is all of K, or an extent
    varies."""
    first = next((i for i, a in enumerate(k_axes) if a in used), len(k_axes))
    if first == 0 or free & set(k_axes[first:]):
        return None
    return math.prod(extent[a] for a in k_axes[first:])


def _axis_values(b: Builder, axes: tuple[str, ...], flat: Expr, extent: dict, idx_t: str,
                 prefix: str = "") -> dict[str, Expr]:
    """The axes of a group at a flat row-major index (their names after `prefix`)."""
    vars_ = decompose(b, flat, [extent[a] for a in axes],
                      [f"{prefix}{avar(a)}_" for a in axes], idx_t)
    return dict(zip(axes, vars_))


#: Steps of K ahead whose rows a contiguous panel row prefetches (runtime_cpu.h tk_pack_row).
PACK_AHEAD = 4


def _pack(b: Builder, read: Read, panel, width: int, size: int, count: Var, kcount: Var,
          group: _Side, ks: _Side, idx_t: str) -> None:
    """panel[l / width][kk][l % width] = the operand at group point l and step point kk (its
    pad value outside the tensor, 0 past the GEMM). The innermost loop walks the side that
    is contiguous in the tensor (vector loads), K when only K is, and the loop around it
    walks the next-closest elements (a row of B in one sweep, not a column of slabs). When
    the group side is contiguous (a matmul's B, a 1x1 convolution's pixels, a stride-1
    convolution's window: its im2col rows are shifted image rows), each panel row is one
    masked vector copy (`pack_row`, runtime_cpu.h tk_pack_row) under a mask of the lanes
    inside the GEMM and the tensor: contiguous loads, twice as fast as a gather from L1 and
    1.7 times from memory (measured on Zen 3). When its values lie apart, by an offset table
    (a strided window), each panel row is one masked gather (`gather_row`, tk_gather_row)."""
    pad = pad_literal(read.pad, read.dtype)
    sweep = not (ks.coef == 1 and group.coef != 1)
    if _packs_rows(read, width, group, ks, idx_t):
        # each panel row one call under a mask of its lanes inside the GEMM and the tensor:
        # a masked vector copy of contiguous values (`pack_row`), or, values apart (a
        # strided window), a masked gather by the group's offset table (`gather_row`,
        # runtime_cpu.h tk_gather_row) from the step point's offset
        with b.loop("kk", 0, kcount, dtype=idx_t) as kk:
            with b.loop("pp", 0, size // width, dtype=idx_t) as pp:
                ok = _lane_mask(b, "okm", read, width, pp, kk, count, group, ks, idx_t)
                dst = Addr(panel.name, (pp, kk, tx.const(0)))
                mask = Addr(ok.name, (tx.const(0),))
                at = tvar(read.tensor)
                if group.coef != 1:
                    b.evaluate(tx.call("gather_row", tx.const(width), dst,
                                       Addr(at, (ks.offset(kk, idx_t),)),
                                       Addr(group.offsets.name, (tx.mul(pp, width),)), mask,
                                       pad))
                else:
                    row = group.offset(tx.mul(pp, width), idx_t)
                    later = tx.call("min", tx.add(kk, PACK_AHEAD), tx.sub(kcount, 1))
                    b.evaluate(tx.call("pack_row", tx.const(width), dst,
                                       Addr(at, (tx.add(row, ks.offset(kk, idx_t)),)), mask,
                                       pad, Addr(at, (tx.add(row, ks.offset(later, idx_t)),))))
        return
    if not sweep:                             # rows of K: each row read once, in order
        order = [("pp", size // width), ("i", width), ("kk", kcount)]
    else:   # a step's points of the group in one sweep, in the order they lie in memory
        order = [("kk", kcount), ("pp", size // width), ("i", width)]
    with ExitStack() as loops:
        at = {}
        for n, (name, stop) in enumerate(order):
            kind = "simd" if n == len(order) - 1 else "serial"
            at[name] = loops.enter_context(b.loop(name, 0, stop, kind=kind, dtype=idx_t))
            if sweep and name == "pp":
                # the panel row's first and last points `PACK_AHEAD` steps on: the rows of a
                # strided window are too short and far apart for the hardware prefetcher
                # (a 1x1 stride-2 convolution's packing waits on memory otherwise)
                later = tx.call("min", tx.add(at["kk"], PACK_AHEAD), tx.sub(kcount, 1))
                for lane in (0, width - 1):
                    ahead = tx.add(group.offset(tx.add(tx.mul(at["pp"], width), lane), idx_t),
                                   ks.offset(later, idx_t))
                    b.evaluate(tx.call("prefetch", Addr(tvar(read.tensor), (ahead,))))
        pp, i, kk = at["pp"], at["i"], at["kk"]
        lidx = tx.add(tx.mul(pp, width), i)
        valid = b.let("ok_", _valid(read, lidx, kk, count, group, ks, idx_t))
        # The load clamped into the tensor and then selected: an unconditional load from an
        # index that does not depend on `valid`, which GCC vectorises (a vector load or an
        # AVX2 gather); `valid ? t[...] : pad` becomes a masked load it does not vectorise.
        offset = tx.add(group.offset(lidx, idx_t), ks.offset(kk, idx_t))
        numel = math.prod(read.shape)
        safe = tx.call("min", tx.call("max", offset, tx.const(0, idx_t)),
                       tx.const(numel - 1, idx_t))
        loaded = b.let("v_", Load(tvar(read.tensor), (safe,), read.dtype), read.dtype)
        b.store(panel, (pp, kk, i), tx.select(valid, loaded, pad))


def _packs_rows(read: Read, width: int, group: _Side, ks: _Side, idx_t: str) -> bool:
    """Does `_pack` pack each panel row as one masked copy of contiguous values, or one masked
    gather by the group's offset table (int32 offsets; a strided window swept step by
    step)?"""
    sweep = not (ks.coef == 1 and group.coef != 1)
    return read.dtype == "float32" and width % 8 == 0 and (
        group.coef == 1 or (sweep and group.offsets is not None and idx_t == "int32"))


def _lane_mask(b: Builder, name: str, read: Read, width: int, pp: Expr, kk: Expr, count: Var,
               group: _Side, ks: _Side, idx_t: str):
    """An int32 row of `width` lanes (-1 or 0): which points of panel `pp`'s row `kk` are
    inside the GEMM and the tensor (`_valid`), in one vector loop."""
    ok = b.alloc(name, "int32", (width,), "the row's lanes inside the tensor")
    with b.loop("i", 0, width, kind="simd", dtype=idx_t) as i:
        valid = _valid(read, tx.add(tx.mul(pp, width), i), kk, count, group, ks, idx_t)
        b.store(ok, (i,), tx.select(valid, tx.const(-1), tx.const(0)))
    return ok


def _fills(read: Read, width: int, group: _Side, ks: _Side, idx_t: str) -> bool:
    """Can the micro-kernels pack this B operand's panels as they read them (`_Fill`)? Where
    `_pack` packs rows (`_packs_rows`) of at most 64 lanes with int32 offsets."""
    return _packs_rows(read, width, group, ks, idx_t) and width <= 64 and idx_t == "int32"


class _Fill:
    """B's panels packed by the micro-tiles that first read them (`gemm_micro_fill`,
    runtime_cpu.h tk_gemm_micro_fill): per micro-panel, the step's table of each row's offset
    in the operand and of its lanes inside the GEMM and the tensor (`lane_bits`), computed
    right before the micro-tile that packs it. The rows are `_pack`'s: contiguous values from
    the row's offset, or, values apart (a strided window), gathered by the group's offset
    table."""

    def __init__(self, b: Builder, read: Read, width: int, kc: int, count: Var, kcount: Var,
                 group: _Side, ks: _Side, idx_t: str) -> None:
        self.b, self.read, self.width, self.count, self.kcount = b, read, width, count, kcount
        self.group, self.ks, self.idx_t = group, ks, idx_t
        self.gather = group.coef != 1
        self.rows = b.alloc("b_rows", "int32", (kc,), "each row's offset in the operand")
        self.bits = b.alloc("b_bits", "int64", (kc,), "each row's lanes inside the tensor")
        self.src = Addr(tvar(read.tensor), (tx.const(0),))

    def tables(self, pp: Expr) -> None:
        """The tables of micro-panel `pp` at this step. Where the checked dimensions' K parts
        repeat every `ks.period` steps (a 3 x 3 window's 9 points over the channels), the
        lanes of the rows after the first period are copies."""
        b, width, group, ks, idx_t = self.b, self.width, self.group, self.ks, self.idx_t
        first = None if self.gather else group.offset(tx.mul(pp, width), idx_t)
        period = ks.period
        masked = self.kcount if period is None else tx.call(
            "min", self.kcount, tx.const(period, idx_t))
        with b.loop("kk", 0, masked, dtype=idx_t) as kk:
            ok = _lane_mask(b, "lanes_", self.read, width, pp, kk, self.count, group, ks,
                            idx_t)
            b.store(self.bits, (kk,), tx.call("lane_bits", tx.const(width),
                                              Addr(ok.name, (tx.const(0),))))
        if period is not None:
            with b.loop("kk", period, self.kcount, dtype=idx_t) as kk:
                b.store(self.bits, (kk,), Load(self.bits.name, (tx.sub(kk, period),), "int64"))
        with b.loop("kk", 0, self.kcount, dtype=idx_t) as kk:
            offset = ks.offset(kk, idx_t)
            b.store(self.rows, (kk,), offset if first is None else tx.add(first, offset))

    def args(self, pp: Expr) -> tuple:
        """The fill's operand arguments for micro-panel `pp`: &src, &rows, &bits, &lanes,
        pad."""
        rows = Addr(self.rows.name, (tx.const(0),))
        lanes = Addr(self.group.offsets.name, (tx.mul(pp, self.width),)) if self.gather \
            else rows       # not read
        return (self.src, rows, Addr(self.bits.name, (tx.const(0),)), lanes,
                pad_literal(self.read.pad, self.read.dtype))


def _valid(read: Read, lidx: Expr, kk: Expr, count: Var, group: _Side, ks: _Side,
           idx_t: str) -> Expr:
    """Whether group point `lidx` at step point `kk` is inside the GEMM and the tensor. The
    checks are combined with `&`, not `&&`: all computed, no branch, so that the loop stays
    one straight-line vector loop."""
    valid = tx.lt(lidx, count)
    for d in ks.dims:
        index = tx.add(group.dim(d, lidx, idx_t), ks.dim(d, kk, idx_t))
        valid = tx.binary("&", valid, tx.call("in_range", index,
                                              tx.as_expr(read.shape[d], idx_t)), "bool")
    return valid


def _linear_columns(plan: GroupPlan, n_axes: tuple[str, ...], extent: dict, nr: int, nc: int,
                    free: frozenset[str]) -> tuple[bool, bool]:
    """Are a micro-tile's `nr` columns (blocks of `nc` columns) one run of addresses for the
    epilogue, so that they are one vector loop from the coordinates of the first column, the
    innermost counting on past its extent? So when, over some trailing N axes, every output
    it stores and every read of its chain is `c x` their row-major flat index (c may be 0: a
    bias per channel), no read's bounds check involves them and no body uses them as values,
    and no micro-tile crosses from one run of those axes into the next: the axes before them
    are all of one point, or a run is whole micro-tiles and so is a block. And are all of N's
    columns one run (the axes before them all of one point), so that a row of the block is
    one vector loop too?"""
    stage = plan.stages[0]
    main_axes = [a for a, _ in stage.main.spatial]
    positions = [main_axes.index(a) for a in n_axes]

    def linear(p: OpPlan, at: list[int], reads: bool, produced: set[str]) -> bool:
        names = tuple(p.spatial[k][0] for k in at)
        ext = {p.spatial[k][0]: p.spatial[k][1] for k in at}
        varying = frozenset(p.spatial[k][0] for k in at if main_axes[k] in free)
        if p.output in plan.stored:
            st = strides(p.out_shape)
            if _row_major(names, {a: st[k] for a, k in zip(names, at)}, ext, varying) is None:
                return False
        if not reads:
            return True
        if body_uses_axis_values(p.body, names):
            return False
        ranges = full_ranges(p)
        for r in p.read_list():
            if r.tensor in produced:
                continue
            flat, per_dim = _parts(r, names)
            if not r.affine or _row_major(names, flat, ext, varying) is None:
                return False
            if any(need and per_dim[d] for d, need in enumerate(needs_check(r, ranges))):
                return False
        return True

    for t in range(len(positions), 0, -1):
        produced = {stage.main.output}
        ok = linear(stage.main, positions[-t:], False, produced)
        for p in stage.chain:
            ok = ok and linear(p, positions[-t:], True, produced)
            produced.add(p.output)
        if ok:
            head = n_axes[:len(n_axes) - t]
            run = math.prod(extent[a] for a in n_axes[len(n_axes) - t:])
            one_run = all(extent[a] == 1 and a not in free for a in head)
            return one_run or (not free & set(n_axes) and run % nr == 0 and nc % nr == 0), \
                one_run
    return False, False


#: Bytes of a cache line: an epilogue stream's prefetches step by one (`_epilogue_streams`),
#: a weight's B panel is prefetched a line per step of K (`_micro_tiles`).
CACHE_LINE = 64
LINE_FLOATS = CACHE_LINE // 4


def _epilogue_streams(plan: GroupPlan, m_axes: tuple[str, ...], n_axes: tuple[str, ...]
                      ) -> list[tuple]:
    """The tensors the epilogue streams along an output row where the output's N is one run
    of addresses (`_linear_columns`): each stored output, and each read of the chain from
    outside the group whose offset steps by one along the innermost N axis and moves with
    the rows (a residual; not a bias, the same along a row or for every row). As (tensor,
    elements per cache line, the offset as a function of the main op's axis values). A
    strip's rows are 1.5 pages of a 12.5 KB row in ResNet-50's 56 x 56 layers, and the
    hardware prefetcher restarts at every page: the epilogue waited on the residual's reads,
    a third of the 1 x 1 convolutions' time with K = 64, until the next strip's lines were
    prefetched while this strip computes (those layers 0.81-0.88x, the first convolution
    0.93x, on two cores of an AVX-512 Xeon)."""
    stage = plan.stages[0]
    main_axes = [a for a, _ in stage.main.spatial]
    last = main_axes.index(n_axes[-1])
    rows = [main_axes.index(a) for a in m_axes]
    out, seen, produced = [], set(), set()

    def add(tensor: str, dtype: str, offset) -> None:
        seen.add(tensor)
        out.append((tensor, max(1, CACHE_LINE // ITEMSIZE[dtype]), offset))

    for p in [stage.main, *stage.chain]:
        names = [a for a, _ in p.spatial]

        def axis_of(values: dict, names=names) -> dict:
            return {names[k]: values[a] for k, a in enumerate(main_axes)}

        if p is not stage.main:
            for r in p.read_list():
                along, _ = _parts(r, (names[last],))
                across, _ = _parts(r, tuple(names[k] for k in rows))
                if r.tensor not in produced and r.tensor not in seen and r.affine \
                        and along.get(names[last]) == 1 and any(across.values()):
                    add(r.tensor, r.dtype, lambda values, r=r, p=p, axis_of=axis_of:
                        flat_offset(r, axis_of(values), full_ranges(p)))
        produced.add(p.output)
        if p.output in plan.stored and p.output not in seen:
            st = strides(p.out_shape)
            add(p.output, p.out_dtype, lambda values, st=st: tx.linear(
                [(s_, values[a]) for s_, a in zip(st, main_axes)], 0))
    return out


def _tile_epilogue(b: Builder, module, plan: GroupPlan, c: Contraction, m_axes, n_axes,
                   batch_at: dict, m0: Var, row_span: tuple, col_span: tuple, value_at,
                   extent: dict, linear: bool, idx_t: str) -> None:
    """Outputs of the block right after their last step, while they are in L1: each back to
    the op's axes, scaled, through the chain and stored. `row_span` (first local row, at
    most how many, the block's rows) and `col_span` (first column of the GEMM, at most how
    many, the block's columns, first local column) bound them: a micro-tile, a row of
    micro-tiles or rows of the block's tile.
    `value_at(i, j)` is the output at row `i`, column `j` of them. `linear`
    (`_linear_columns`): the columns are one vector loop from the first column's
    coordinates; else each column finds its N axes."""
    stage = plan.stages[0]
    p = stage.main
    axes = [a for a, _ in p.spatial]
    i0, most_rows, mcount = row_span
    col0, most_cols, ncount, j0 = col_span
    rows = b.let("ti", tx.call("min", tx.const(most_rows, idx_t), tx.sub(mcount, i0)), idx_t)
    cols = b.let("tj", tx.call("min", tx.const(most_cols, idx_t), tx.sub(ncount, j0)), idx_t)
    col0 = b.let("j0", col0, idx_t)
    first = _axis_values(b, n_axes, col0, extent, idx_t) if linear else None
    with b.loop("i", 0, rows, dtype=idx_t) as i:
        mv = _axis_values(b, m_axes, tx.add(tx.add(m0, i0), i), extent, idx_t)
        with b.loop("j", 0, cols, kind="simd", dtype=idx_t) as j:
            if linear:
                nv = {**first, n_axes[-1]: tx.add(first[n_axes[-1]], j)}
            else:
                nv = _axis_values(b, n_axes, tx.add(col0, j), extent, idx_t)
            code = {**batch_at, **mv, **nv}
            vars_ = [b.let(avar(a), code[a], idx_t) for a in axes]
            pb = PointBuilder(module, b, stage, vars_, global_resolver)
            value = value_at(i, j)
            if c.scale != 1.0:
                value = tx.mul(value, literal(c.scale, "f"))
            pb.epilogue(pb.main_value(p, (value, "f")),
                        store_sink(module, b, plan.stored, vars_))


__all__ = ["cpu_kernel", "gemm_kernel", "gemm_roles", "loops_kernel"]
