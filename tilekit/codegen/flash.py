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

from tilekit.codegen.cexpr import IDENTITY, KIND_CTYPE
from tilekit.codegen.kernel import (GeneratedKernel, PointEmitter, block_origins, c_name,
                                    decompose, finish, global_resolver, group_signature,
                                    index_type, new_kernel, store_sink)
from tilekit.codegen.plan import GroupPlan
from tilekit.ir.payloads import Tile
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


def flash_kernel(module, plan: GroupPlan, entry: str, tile: Tile, step: int, att: Attention
                 ) -> GeneratedKernel:
    # Over 80 lines on purpose: it prints one kernel's sections in the order they run
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
    grid = math.prod(-(-n // b) for n, b in zip(extents, block))
    kb = new_kernel(entry, sig, threads, [
        f"flash: attention over rows {att.rows} x columns {att.cols}, key axis "
        f"'{att.key}' ({keys}) in steps of {step}: online softmax",
        f"a block: {n_rows} rows x {n_cols} columns, {per_thread} accumulators per thread"])
    e = kb.body
    sc = kb.shared("s_scores", "float", n_rows * step, 4, f"scores [{n_rows}, {step}]")
    s_m = kb.shared("s_max", "float", n_rows, 4, "running max per row")
    s_l = kb.shared("s_sum", "float", n_rows, 4, "running sum per row")
    s_a = kb.shared("s_rescale", "float", n_rows, 4, "exp(old max - new max) per row")
    neg_inf = IDENTITY["max="]["f"]
    e.line("const int tid = threadIdx.x;")
    origin = block_origins(e, o_axes, extents, tuple(block), idx_t)
    row_blocks = [block[q] for q in rows]

    def row_coords(r: str) -> tuple[list[str], str]:
        """Declare the row axes' values of local row `r`; returns them and their range check."""
        local = [e.tmp("rl") for _ in rows]
        decompose(e, r, row_blocks, local, "int")
        values = [e.tmp("rv") for _ in rows]
        checks = []
        for v, loc, q in zip(values, local, rows):
            e.line(f"const {idx_t} {v} = {origin[q]} + {loc};")
            if extents[q] % block[q]:
                checks.append(f"{v} < {extents[q]}")
        return values, " && ".join(checks) or "true"

    def each_point(body) -> None:
        """`body(O's axis values, range check)` for each of this thread's output points
        (`pt = tid + k * threads`, the same points at every step: their accumulators)."""
        with e.block(f"for (int k = 0; k < {per_thread}; ++k)"):
            e.line(f"const int pt = tid + k * {threads};")
            with e.block(f"if (pt < {n_rows * n_cols})"):
                body(*_output_point(e, o_axes, rows, cols, extents, origin, row_coords,
                                    n_cols, idx_t))

    e.line(f"float acc[{per_thread}];")
    with e.block(f"for (int k = 0; k < {per_thread}; ++k)"):
        e.line("acc[k] = 0.0f;")
    with e.block(f"for (int r = tid; r < {n_rows}; r += {threads})"):
        e.line(f"{s_m}[r] = {neg_inf};")
        e.line(f"{s_l}[r] = 0.0f;")
    e.line("__syncthreads();")
    with e.block(f"for (int j0 = 0; j0 < {keys}; j0 += {step})"):
        e.line(f"const int jn = {keys} - j0 < {step} ? {keys} - j0 : {step};")
        _emit_scores(e, module, s_stage, att, sc, n_rows, step, threads, row_coords, neg_inf)
        e.line("__syncthreads();")
        _emit_statistics(e, sc, s_m, s_l, s_a, n_rows, step, threads, neg_inf)
        e.line("__syncthreads();")

        def accumulate(o_vars: list[str], ok: str) -> None:
            e.line("float sum = 0.0f;")
            with e.block(f"if ({ok})"):
                _emit_step_sum(e, module, o_stage, att, o_vars, sc, s_m, step)
            e.line(f"acc[k] = acc[k] * {s_a}[pt / {n_cols}] + sum;")

        each_point(accumulate)
        e.line("__syncthreads();  // the scores buffer is rewritten by the next step")
    e.comment("every output point: acc / l through O's chain to memory")

    def store(o_vars: list[str], ok: str) -> None:
        with e.block(f"if ({ok})"):
            pe = PointEmitter(module, e, o_stage, o_vars, global_resolver)
            value = e.let("float", "v_out_", f"acc[k] / {s_l}[pt / {n_cols}]")
            pe.epilogue(pe.main_value(o_main, (value, "f")),
                        store_sink(module, e, plan.stored, o_vars))

    each_point(store)
    sched = {"source": tile.source, "block": dict(zip(o_axes, block)), "threads": threads,
             "flash": {"key": att.key, "step": step, "rows": n_rows, "columns": n_cols,
                       "per_thread": per_thread}}
    return finish(kb, plan, "flash", sched, grid, sig)


def _output_point(e, o_axes, rows, cols, extents, origin, row_coords, n_cols, idx_t):
    """Declare O's axis values of flat point `pt` (row-major rows x columns)."""
    values, ok = row_coords(f"pt / {n_cols}")
    col_vals = [e.tmp("cv") for _ in cols]
    decompose(e, f"pt % {n_cols}", [extents[q] for q in cols], col_vals, "int")
    by_pos = dict(zip(rows, values))
    by_pos.update(zip(cols, col_vals))
    names = []
    for q, a in enumerate(o_axes):
        name = f"ov_{c_name(a)}"
        e.line(f"const {idx_t} {name} = {by_pos[q]};")
        names.append(name)
    return names, ok


def _emit_scores(e, module, stage, att: Attention, sc, n_rows, step, threads, row_coords,
                 neg_inf) -> None:
    """Scores of this key step into the shared buffer: S's contraction and chain per point."""
    main = stage.main
    s_axes = [a for a, _ in main.spatial]
    with e.block(f"for (int pt = tid; pt < {n_rows * step}; pt += {threads})"):
        e.line(f"const int jj = pt % {step};")
        values, ok = row_coords(f"pt / {step}")
        e.line(f"float score = {neg_inf};")
        with e.block(f"if (jj < jn && {ok})"):
            names = []
            for q, a in enumerate(s_axes):
                name = f"sv_{c_name(a)}"
                e.line(f"const int {name} = {values[q] if q < len(values) else 'j0 + jj'};")
                names.append(name)
            pe = PointEmitter(module, e, stage, names, global_resolver)
            kind = pe.acc_kind(main)
            acc = e.tmp("acc")
            e.line(f"{KIND_CTYPE[kind]} {acc} = {IDENTITY[main.assign][kind]};")
            pe.emit_reduction_loops(main, acc, kind)

            def sink(tensor: str, value: str, vkind: str) -> None:
                if tensor == att.scores:
                    e.line(f"score = (float)({value});")

            pe.epilogue(pe.main_value(main, (acc, kind)), sink)
        e.line(f"{sc}[pt] = score;")


def _emit_statistics(e, sc, s_m, s_l, s_a, n_rows, step, threads, neg_inf) -> None:
    """One thread per row: the running max and sum, and the rescale factor of this step."""
    with e.block(f"for (int r = tid; r < {n_rows}; r += {threads})"):
        e.line(f"const float m_old = {s_m}[r];")
        e.line("float m_new = m_old;")
        with e.block("for (int jj = 0; jj < jn; ++jj)"):
            e.line(f"m_new = tk_max(m_new, {sc}[r * {step} + jj]);")
        e.line(f"const bool none = m_new == {neg_inf};   // every key so far masked out")
        e.line("const float rescale = none ? 1.0f : expf(m_old - m_new);")
        e.line(f"float l = {s_l}[r] * rescale;")
        with e.block("for (int jj = 0; jj < jn; ++jj)"):
            e.line(f"l += none ? 0.0f : expf({sc}[r * {step} + jj] - m_new);")
        e.line(f"{s_m}[r] = m_new;")
        e.line(f"{s_l}[r] = l;")
        e.line(f"{s_a}[r] = rescale;")


def _emit_step_sum(e, module, stage, att: Attention, o_vars, sc, s_m, step) -> None:
    """`sum += exp(s - m) * V` over the step's keys: O's body with the probability read
    replaced by the exponential of the shared score."""
    main = stage.main
    key_var = "kj"

    def resolve(p, node, axis_code):
        r = p.read(node)
        if r.tensor == _prob_tensor(main, att):
            return "prob"
        return global_resolver(p, node, axis_code)

    pe = PointEmitter(module, e, stage, o_vars, resolve)
    comp = pe.compiler(main, pe.axis_code(main, {att.key: key_var}))
    with e.block("for (int jj = 0; jj < jn; ++jj)"):
        e.line(f"const int {key_var} = j0 + jj;")
        e.line(f"const float prob = expf({sc}[(pt / {_cols(stage, att)}) * {step} + jj] - "
               f"{s_m}[pt / {_cols(stage, att)}]);")
        e.line(f"sum += (float)({comp.emit(main.body, 'f')});")


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
