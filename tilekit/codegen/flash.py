"""The `flash` kernel shape: a welded attention group with its key axis split (online softmax).

tk-weld recognises attention (`tilekit.weld.attention`: scores S with their chained scale and
mask, row max M, exp-sum L, probabilities P, output O = P x V, with O's chained ops) and, for
a key axis longer than one step, records `flash: {key, step}` in the group's tile. The block
owns `rows` (the block tile of O's axes that index the probabilities) times every output
column; walking the key axis in steps of `step`:

1. every thread computes scores of the step (S's contraction and its chain, from global
   memory) into a shared `[rows, step]` buffer (keys past the end are -inf); barrier;
2. one thread per row folds the step into the row's running max `m` and sum `l`, keeping the
   rescale factor `exp(m_old - m_new)` in shared memory; barrier;
3. every thread rescales its register accumulators (a fixed set of output points per thread)
   and adds `sum_j exp(s - m_new) * V` over the step (O's body with the probability replaced
   by that exponential); barrier (the scores buffer is rewritten next step).

At the end each output point is `acc / l`, run through O's chain and stored. This computes
`sum_j exp(s_j - max) v_j / sum_j exp(s_j - max)`, what S..O compute, without a whole row of
scores on chip. The probabilities P and the statistics M and L are never stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilekit.codegen.kernel import (GeneratedKernel, PointBuilder, block_origins, c_name,
                                    decompose, finish, global_resolver, group_signature,
                                    index_type, store_sink)
from tilekit.codegen.plan import GroupPlan
from tilekit.codegen.values import identity
from tilekit.ir.payloads import Tile
from tilekit.schedule.shape import Target
from tilekit.tile import expr as tx
from tilekit.tile.build import Builder, SharedMemory
from tilekit.tile.expr import KIND_DTYPE, Expr, Load, Var
from tilekit.weld.attention import FLASH_POINTS_PER_THREAD, FLASH_THREADS, Attention


class FlashError(Exception):
    """The group does not fit the flash shape (the caller splits it, with this reason)."""


@dataclass(frozen=True)
class _Shape:
    """The block of a flash kernel over O's spatial axes: `rows` and `cols` are positions."""

    axes: list
    extents: list
    block: list
    rows: list
    cols: list
    n_rows: int
    n_cols: int
    per_thread: int


def _shape(plan: GroupPlan, tile: Tile, att: Attention) -> _Shape:
    o_main = plan.stages[4].main
    axes = [a for a, _ in o_main.spatial]
    extents = [n for _, n in o_main.spatial]
    block = list(tile.block)
    rows = [axes.index(a) for a in att.rows]
    cols = [q for q in range(len(axes)) if q not in rows]
    if any(block[q] != extents[q] for q in cols):
        raise FlashError("the flash shape needs every output column in the block")
    n_rows = math.prod(block[q] for q in rows)
    n_cols = math.prod(extents[q] for q in cols)
    per_thread = -(-n_rows * n_cols // FLASH_THREADS)
    if per_thread > FLASH_POINTS_PER_THREAD:
        raise FlashError(f"{n_rows} rows x {n_cols} columns need {per_thread} accumulators "
                         f"per thread, more than {FLASH_POINTS_PER_THREAD}")
    return _Shape(axes, extents, block, rows, cols, n_rows, n_cols, per_thread)


def flash_kernel(module, plan: GroupPlan, entry: str, tile: Tile, step: int, att: Attention,
                 target: Target) -> GeneratedKernel:
    # Over 80 lines on purpose: it builds one kernel's sections in the order they run
    # (scores, running max, rescale, exp-sum, P x V, normalise); split, the online-softmax
    # protocol would be spread over helpers that each need the whole shape.
    s_stage, o_stage = plan.stages[0], plan.stages[4]
    o_main = o_stage.main
    sh = _shape(plan, tile, att)
    o_axes, extents, block, rows, cols = sh.axes, sh.extents, sh.block, sh.rows, sh.cols
    n_rows, n_cols, per_thread = sh.n_rows, sh.n_cols, sh.per_thread
    threads = FLASH_THREADS
    keys = att.key_extent
    sig = group_signature(module, plan)
    idx_t = index_type(module, sig.args)
    grid = math.prod(-(-n // s) for n, s in zip(extents, block))
    smem = SharedMemory()
    sc = smem.carve("s_scores", "float32", (n_rows * step,), f"scores [{n_rows}, {step}]")
    s_m = smem.carve("s_max", "float32", (n_rows,), "running max per row")
    s_l = smem.carve("s_sum", "float32", (n_rows,), "running sum per row")
    s_a = smem.carve("s_rescale", "float32", (n_rows,), "exp(old max - new max) per row")
    neg_inf = identity("max=", "f")
    b = Builder()
    origin = block_origins(b, o_axes, extents, tuple(block), idx_t)
    row_blocks = [block[q] for q in rows]

    def row_coords(r: Expr) -> tuple[list[Var], Expr]:
        """Declare the row axes' values of local row `r`; returns them and their range check."""
        local = decompose(b, r, row_blocks, ["rl_"] * len(rows), "int32")
        values = [b.let("rv_", tx.add(origin[q], loc), idx_t) for loc, q in zip(local, rows)]
        checks = [tx.lt(v, extents[q]) for v, q in zip(values, rows) if extents[q] % block[q]]
        return values, tx.and_(*checks)

    def each_point(tid: Var, body) -> None:
        """`body(k, pt, O's axis values, range check)` for each of this thread's output
        points (`pt = tid + k * threads`, the same points at every step: their
        accumulators)."""
        with b.loop("k", 0, per_thread) as k:
            pt = b.let("pt", tid + k * threads)
            with b.if_(tx.lt(pt, n_rows * n_cols)):
                body(k, pt, *_output_point(b, o_axes, rows, cols, extents, pt, row_coords,
                                           n_cols, idx_t))

    acc = b.alloc("acc", "float32", (per_thread,), "the thread's output points")
    with b.threads(threads) as tid:
        with b.loop("k", 0, per_thread) as k:
            b.store(acc, (k,), tx.const(0.0))
        with b.loop("r", tid, n_rows, threads) as r:
            b.store(s_m, (r,), neg_inf)
            b.store(s_l, (r,), tx.const(0.0))
    b.barrier()
    with b.loop("j0", 0, keys, step) as j0:
        rest = tx.sub(keys, j0)
        jn = b.let("jn", tx.select(tx.lt(rest, step), rest, tx.const(step)))
        with b.threads(threads) as tid:
            _scores(b, module, s_stage, att, sc, n_rows, step, threads, row_coords, neg_inf,
                    tid, j0, jn)
        b.barrier()
        with b.threads(threads) as tid:
            _statistics(b, sc, s_m, s_l, s_a, n_rows, step, threads, neg_inf, tid, jn)
        b.barrier()
        with b.threads(threads) as tid:
            def accumulate(k, pt, o_vars, ok) -> None:
                total = b.decl("sum_", "float32", tx.const(0.0))
                with b.if_(ok):
                    _step_sum(b, module, o_stage, att, o_vars, sc, s_m, step, pt, j0, jn,
                              total)
                b.store(acc, (k,), Load(acc.name, (k,), "float32")
                        * Load(s_a.name, (tx.div(pt, n_cols),), "float32") + total)
            each_point(tid, accumulate)
        b.barrier()     # the scores buffer is rewritten by the next step
    b.comment("every output point: acc / l through O's chain to memory")
    with b.threads(threads) as tid:
        def store(k, pt, o_vars, ok) -> None:
            with b.if_(ok):
                pb = PointBuilder(module, b, o_stage, o_vars, global_resolver)
                value = b.let("v_out_", tx.div(Load(acc.name, (k,), "float32"),
                                               Load(s_l.name, (tx.div(pt, n_cols),),
                                                    "float32")))
                pb.epilogue(pb.main_value(o_main, (value, "f")),
                            store_sink(module, b, plan.stored, o_vars))
        each_point(tid, store)
    sched = {"source": tile.source, "block": dict(zip(o_axes, block)), "threads": threads,
             "flash": {"key": att.key, "step": step, "rows": n_rows, "columns": n_cols,
                       "per_thread": per_thread}}
    return finish(plan, entry, sig, b.build(), shape="flash", schedule=sched, threads=threads,
                  grid=grid, shared=smem.all(), target=target, comments=[
                      f"flash: attention over rows {att.rows} x columns {att.cols}, key axis "
                      f"'{att.key}' ({keys}) in steps of {step}: online softmax",
                      f"a block: {n_rows} rows x {n_cols} columns, {per_thread} accumulators "
                      "per thread"])


def _output_point(b, o_axes, rows, cols, extents, pt, row_coords, n_cols, idx_t):
    """Declare O's axis values of flat point `pt` (row-major rows x columns)."""
    values, ok = row_coords(tx.div(pt, n_cols))
    col_vals = decompose(b, tx.mod(pt, n_cols), [extents[q] for q in cols],
                         ["cv_"] * len(cols), "int32")
    by_pos = dict(zip(rows, values))
    by_pos.update(zip(cols, col_vals))
    names = [b.let(f"ov_{c_name(a)}", by_pos[q], idx_t) for q, a in enumerate(o_axes)]
    return names, ok


def _scores(b, module, stage, att: Attention, sc, n_rows, step, threads, row_coords, neg_inf,
            tid, j0, jn) -> None:
    """Scores of this key step into the shared buffer: S's contraction and chain per point."""
    main = stage.main
    s_axes = [a for a, _ in main.spatial]
    with b.loop("pt", tid, n_rows * step, threads) as pt:
        jj = b.let("jj", tx.mod(pt, step))
        values, ok = row_coords(tx.div(pt, step))
        score = b.decl("score", "float32", neg_inf)
        with b.if_(tx.and_(tx.lt(jj, jn), ok)):
            names = [b.let(f"sv_{c_name(a)}", values[q] if q < len(values) else j0 + jj)
                     for q, a in enumerate(s_axes)]
            pb = PointBuilder(module, b, stage, names, global_resolver)
            kind = pb.acc_kind(main)
            acc = b.decl("acc_", KIND_DTYPE[kind], identity(main.assign, kind))
            pb.reduction_loops(main, acc, kind)

            def sink(tensor: str, value: Expr, vkind: str) -> None:
                if tensor == att.scores:
                    b.assign(score, tx.cast("float32", value))

            pb.epilogue(pb.main_value(main, (acc, kind)), sink)
        b.store(sc, (pt,), score)


def _statistics(b, sc, s_m, s_l, s_a, n_rows, step, threads, neg_inf, tid, jn) -> None:
    """One thread per row: the running max and sum, and the rescale factor of this step."""
    def score(r, jj):
        return Load(sc.name, (r * step + jj,), "float32")

    with b.loop("r", tid, n_rows, threads) as r:
        m_old = b.let("m_old", Load(s_m.name, (r,), "float32"))
        m_new = b.decl("m_new", "float32", m_old)
        with b.loop("jj", 0, jn) as jj:
            b.assign(m_new, tx.call("max", m_new, score(r, jj)))
        none = b.let("none", tx.eq(m_new, neg_inf))     # every key so far masked out
        rescale = b.let("rescale", tx.select(none, tx.const(1.0),
                                             tx.call("exp", m_old - m_new)))
        total = b.decl("l", "float32", Load(s_l.name, (r,), "float32") * rescale)
        with b.loop("jj", 0, jn) as jj:
            b.assign(total, total + tx.select(none, tx.const(0.0),
                                              tx.call("exp", score(r, jj) - m_new)))
        b.store(s_m, (r,), m_new)
        b.store(s_l, (r,), total)
        b.store(s_a, (r,), rescale)


def _step_sum(b, module, stage, att: Attention, o_vars, sc, s_m, step, pt, j0, jn,
              total) -> None:
    """`sum += exp(s - m) * V` over the step's keys: O's body with the probability read
    replaced by the exponential of the shared score."""
    main = stage.main
    cols = _cols(stage, att)
    prob_tensor = _prob_tensor(main, att)
    with b.loop("jj", 0, jn) as jj:
        key = b.let("kj", j0 + jj)
        prob = b.let("prob", tx.call("exp", Load(sc.name, (tx.div(pt, cols) * step + jj,),
                                                 "float32")
                                     - Load(s_m.name, (tx.div(pt, cols),), "float32")))

        def resolve(p, node, axis):
            r = p.read(node)
            if r.tensor == prob_tensor:
                return prob
            return global_resolver(p, node, axis)

        pb = PointBuilder(module, b, stage, o_vars, resolve)
        comp = pb.compiler(main, pb.axis_code(main, {att.key: key}))
        b.assign(total, total + tx.cast("float32", comp.emit(main.body, "f")))


def _prob_tensor(main, att: Attention) -> str:
    """The probabilities O reads (the read indexed by the key axis last)."""
    for r in main.read_list():
        if r.maps and r.maps[-1].plain_axis == att.key and \
                [m.plain_axis for m in r.maps[:-1]] == list(att.rows):
            return r.tensor
    raise FlashError("O reads no probabilities")  # pragma: no cover - weld matched it


def _cols(stage, att: Attention) -> int:
    main = stage.main
    return math.prod(n for a, n in main.spatial if a not in att.rows)
