"""Lowering passes over tile programs: each a function kernel -> kernel, checked by comparing
its result with an expected program built by hand (structurally, never by text)."""

from __future__ import annotations

import pytest

from tilekit.errors import InternalError
from tilekit.tile import expr as tx
from tilekit.tile.expr import BLOCK, Addr, Const, Load, Var
from tilekit.tile.nodes import (Alloc, Barrier, Buffer, Comment, Copy, Evaluate, For, If,
                                Kernel, Layout, Let, Seq, Store, Threads, seq)
from tilekit.tile.passes import lower_for_cpu, lower_for_cuda
from tilekit.tile.passes.barriers import drop_redundant_barriers
from tilekit.tile.passes.copies import Divisibility, affine, lower_copies, vectorize
from tilekit.tile.passes.guards import split_guards
from tilekit.tile.passes.layout import conflict_free_pad, pad_shared_rows
from tilekit.tile.passes.pipeline import pipeline
from tilekit.tile.passes.threads import serialize_threads
from tilekit.tile.verify import verify

I = "int32"
X = Buffer("t_x", "global", "float32", (64 * 48,))
Y = Buffer("t_y", "global", "float32", (64 * 48,), access="write")


def kernel(body, shared=(), threads=128, params=(X, Y)) -> Kernel:
    return Kernel("k", params, tuple(shared), body, threads, 4)


def box_copy(row: int, origin_col, cols: int = 16, dst="s_x") -> Copy:
    """A [8, cols] box of a row-major [64, row] float tensor at (o_r, origin_col)."""
    r, c = Var("l_0", I), Var("l_1", I)
    o = Var("o_r", I)
    g_r, g_c = tx.add(o, r), tx.add(origin_col, c)
    return Copy(dst, (), (r, c), "t_x", tx.add(tx.mul(row, g_r), g_c),
                tx.call("in_range", g_c, tx.const(row)), tx.const(0.0))


# -- vector width ------------------------------------------------------------------------------

def _vectorized(row: int, origin_col, cols: int = 16) -> int:
    s = Buffer("s_x", "shared", "float32", (8, cols))
    body = seq(Let(Var("b0", I), tx.div(BLOCK, 4)), Let(Var("o_r", I), tx.mul(Var("b0", I), 8)),
               Let(Var("o_c", I), tx.mul(tx.mod(BLOCK, 4), 16)), box_copy(row, origin_col, cols))
    out = vectorize(kernel(body, [s]))
    (c,) = [x for x in out.body.body if isinstance(x, Copy)]
    return c.vector


def test_vectorize_proves_aligned_contiguous_chunks():
    o_c = Var("o_c", I)
    assert _vectorized(48, o_c) == 4                  # rows of 48 floats, origin 16 * b
    assert _vectorized(48, tx.add(o_c, 2)) == 1       # origin off by two elements
    assert _vectorized(37, o_c) == 1                  # rows of 37: chunks straddle rows
    assert _vectorized(48, o_c, cols=6) == 1          # a box row of 6 is not whole chunks


def test_divisibility_follows_lets_and_loops():
    q = Var("q", I)
    body = seq(Let(Var("o", I), tx.mul(BLOCK, 64)),
               For(q, tx.const(0), tx.const(96), Comment("x"), tx.const(32)))
    div = Divisibility(kernel(body))
    assert div.of(Var("o", I)) == 64 and div.of(q) == 32
    assert div.of(tx.add(Var("o", I), q)) == 32
    assert affine(tx.add(tx.mul(3, q), 5)) == ({"q": 3}, {"q": q}, 5)


# -- thread binding -----------------------------------------------------------------------------

def test_lower_copies_binds_chunks_to_threads():
    s = Buffer("s_x", "shared", "float32", (8, 16))
    c = box_copy(48, tx.const(0))
    out = lower_copies(kernel(c, [s], threads=128))
    t, i = Var("l_1_t", I), Var("l_1_i", I)
    r, col = Var("l_0", I), Var("l_1", I)
    expected = Threads(t, 128, seq(
        Let(i, t),                                  # 128 elements, one per thread
        Let(r, tx.div(i, 16)), Let(col, tx.mod(i, 16)),
        Store("s_x", (r, col), tx.select(c.valid, Load("t_x", (c.offset,), "float32"),
                                          tx.const(0.0)))))
    assert out.body == expected


def test_lower_copies_unrolls_whole_rounds_and_strides_the_rest():
    s = Buffer("s_x", "shared", "float32", (8, 16))
    out = lower_copies(kernel(box_copy(48, tx.const(0)), [s], threads=32))
    loop = out.body.body
    assert isinstance(loop, For) and loop.kind == "unroll" and loop.stop == Const(4, I)
    s3 = Buffer("s_x", "shared", "float32", (3, 16))
    c = box_copy(48, tx.const(0))
    out = lower_copies(kernel(c, [s3], threads=32))    # 48 elements over 32 threads
    loop = out.body.body
    assert isinstance(loop, For) and loop.kind == "serial" and loop.step == Const(32, I)


def test_asynchronous_copy_moves_16_bytes_zero_filled():
    s = Buffer("s_a", "shared", "float16", (2, 16, 32))
    a = Buffer("t_a", "global", "float16", (4096,))
    r, c = Var("ar_0", I), Var("ac_0", I)
    copy = Copy("s_a", (Const(1, I),), (r, c), "t_a", tx.add(tx.mul(64, r), c),
                tx.lt(r, 10), tx.cast("float16", tx.const(0.0)), asynchronous=True)
    out = lower_copies(kernel(copy, [s], params=(a,)))
    # 16 rows x 4 chunks of 8 halves: 64 chunks, one per thread of the first 64
    first, guard = out.body.body.body
    assert first == Let(Var("ac_0_i", I), Var("ac_0_t", I))
    assert isinstance(guard, If) and guard.cond == tx.lt(Var("ac_0_i", I), 64)
    assert guard.then.body[-1] == Evaluate(tx.call(
        "cp_async16", Addr("s_a", (Const(1, I), r, c)),
        Addr("t_a", (tx.select(Var("ac_0_ok", "bool"), copy.offset, tx.const(0)),)),
        Var("ac_0_ok", "bool")))


# -- pipelining ---------------------------------------------------------------------------------

def test_pipeline_issues_copies_stages_minus_one_ahead():
    s = Buffer("s_a", "shared", "float16", (3, 16, 32))
    a = Buffer("t_a", "global", "float16", (4096,))
    step = Var("s", I)
    r, c = Var("ar_0", I), Var("ac_0", I)
    q = Var("q_k", I)
    copy = Copy("s_a", (tx.mod(step, 3),), (r, c), "t_a", tx.add(tx.mul(64, r), tx.add(q, c)),
                tx.const(True), tx.cast("float16", tx.const(0.0)), asynchronous=True)
    compute = Threads(Var("tid", I), 128, Evaluate(tx.call("ldmatrix_x4", Addr("r4", ()),
                                                          Addr("s_a", (tx.mod(step, 3),
                                                                       Const(0, I), Const(0, I))))))
    loop = For(step, tx.const(0), tx.const(10), seq(Let(q, tx.mul(step, 32)), copy, compute),
               kind="pipelined", stages=3)
    out = pipeline(kernel(loop, [s], params=(a,)))
    prologue, steady = out.body.body
    first = Var("s_0", I)
    tid = Var("s_t", I)

    def issue(at):
        return seq(Let(q, tx.mul(at, 32)),
                   Copy("s_a", (tx.mod(at, 3),), (r, c), "t_a",
                        tx.add(tx.mul(64, r), tx.add(q, c)), tx.const(True),
                        tx.cast("float16", tx.const(0.0)), asynchronous=True))
    commit = Threads(tid, 128, Evaluate(tx.call("cp_async_commit")))
    assert prologue == For(first, tx.const(0), tx.const(2),
                           seq(If(tx.lt(first, 10), issue(first)), commit))
    ahead = tx.add(step, 2)
    assert steady == For(step, tx.const(0), tx.const(10), seq(
        Threads(tid, 128, Evaluate(tx.call("cp_async_wait", tx.const(1)))),
        Barrier(), If(tx.lt(ahead, 10), issue(ahead)), commit, compute))


def test_pipeline_needs_a_copy_to_overlap():
    loop = For(Var("s", I), tx.const(0), tx.const(4), Comment("nothing"), kind="pipelined",
               stages=2)
    with pytest.raises(InternalError, match="starts with no copy"):
        pipeline(kernel(loop))


# -- shared-memory layout -----------------------------------------------------------------------

def test_conflict_free_pad_makes_an_odd_number_of_16_byte_chunks():
    assert conflict_free_pad(32, 2) == 8      # 64 bytes -> 80 (5 chunks)
    assert conflict_free_pad(64, 2) == 8      # 128 -> 144 (9)
    assert conflict_free_pad(24, 2) == 0      # 48 bytes: 3 chunks already
    assert conflict_free_pad(32, 4) == 4      # tf32 rows of 128 bytes -> 144
    assert conflict_free_pad(20, 2) == 4      # 40 bytes -> 48 (3 chunks)


def test_pad_shared_rows_pads_fragment_operands_and_lays_buffers_out_again():
    a = Buffer("s_a", "shared", "float16", (2, 64, 32), offset=0)
    other = Buffer("s_o", "shared", "float32", (16,), offset=a.aligned_bytes)
    body = Threads(Var("tid", I), 128, seq(
        Alloc(Buffer("r4", "local", "uint32", (4,))),
        Evaluate(tx.call("ldmatrix_x4", Addr("r4", ()), Addr("s_a", (Const(0, I),) * 3)))))
    out = pad_shared_rows(kernel(body, [a, other]))
    pa, po = out.shared
    assert pa.layout == Layout(pad=8) and pa.nbytes == 2 * 64 * 40 * 2
    assert po.offset == pa.nbytes                 # moved after the grown buffer
    assert pad_shared_rows(out) == out            # idempotent


# -- barriers and serial threads -----------------------------------------------------------------

def test_drop_redundant_barriers():
    region = Threads(Var("tid", I), 128, Comment("work"))
    loop = For(Var("p", I), tx.const(0), tx.const(2), seq(region, Barrier()))
    body = seq(region, Barrier(), Comment("between"), Barrier(), loop, Barrier(), region)
    out = drop_redundant_barriers(kernel(body))
    assert out.body == seq(region, Barrier(), Comment("between"), loop, region)
    # a loop that may run no time keeps the barrier after it
    maybe = For(Var("p", I), tx.const(0), Var("n", I), seq(region, Barrier()))
    kept = drop_redundant_barriers(kernel(seq(Let(Var("n", I), BLOCK), maybe, Barrier())))
    assert kept.body.body[-1] == Barrier()


def test_serialize_threads_gives_per_thread_state_one_copy_per_thread():
    acc = Buffer("acc", "local", "float32", (4,))
    tid = Var("tid", I)
    k0 = Var("k", I)
    body = seq(
        Alloc(acc),
        Threads(tid, 64, Store("acc", (Const(0, I),), tx.const(1.0))),
        Barrier(),
        Threads(tid, 64, Store("t_y", (tid,), Load("acc", (Const(0, I),), "float32"))),
        For(k0, tx.const(0), tx.const(2), Comment("block-level")))
    out = serialize_threads(kernel(body, threads=64))
    expanded = Buffer("acc", "local", "float32", (64, 4))
    assert out.body == seq(
        Alloc(expanded),
        For(tid, tx.const(0), tx.const(64), Store("acc", (tid, Const(0, I)), tx.const(1.0))),
        For(tid, tx.const(0), tx.const(64),
            Store("t_y", (tid,), Load("acc", (tid, Const(0, I)), "float32"))),
        For(k0, tx.const(0), tx.const(2), Comment("block-level")))
    assert serialize_threads(out) == out          # idempotent: nothing left to serialize


def test_serialize_threads_refuses_warp_collectives():
    body = Threads(Var("tid", I), 64, Store("t_y", (Var("tid", I),), tx.call(
        "warp_sum", tx.const(1.0), tx.const(32))))
    with pytest.raises(InternalError, match="no serial form"):
        serialize_threads(kernel(body, threads=64))


def test_split_guards_takes_the_padding_checks_out_of_the_interior():
    j, j0, kw = Var("j", I), Var("j0", I), Var("kw", I)
    w = Var("w", I)

    def body(guard: bool):
        x = tx.add(tx.add(w, kw), -1)                          # w + kw - 1, w = j0 + j
        value = Load("t_x", (x,), "float32")
        if guard:
            value = tx.select(tx.call("in_range", x, tx.const(56)), value, tx.const(0.0))
        return seq(Let(w, tx.add(j0, j)), Store("t_y", (j,), value))

    loop = For(j, tx.const(0), tx.const(64), body(True), kind="simd")
    prog = seq(Let(j0, BLOCK), For(kw, tx.const(0), tx.const(3), loop))
    out = split_guards(kernel(prog))
    lo, hi = Var("j_lo0", I), Var("j_hi0", I)
    rest = tx.linear([(1, j0), (1, kw)], -1)
    lo_e = tx.call("min", tx.call("max", tx.neg(rest), tx.const(0)), tx.const(64))
    hi_e = tx.call("max", tx.call("min", tx.sub(tx.const(56), rest), tx.const(64)), lo)
    assert out.body == seq(Let(j0, BLOCK), For(kw, tx.const(0), tx.const(3), Seq((
        Let(lo, lo_e), Let(hi, hi_e),
        For(j, tx.const(0), lo, body(True)),
        For(j, lo, hi, body(False), kind="simd"),
        For(j, hi, tx.const(64), body(True))))))
    assert split_guards(out) == out                 # idempotent: the interior has no guard
    # a guard on a value the body computes otherwise (a negative coefficient) stays
    other = For(j, tx.const(0), tx.const(64), seq(
        Store("t_y", (j,), tx.select(tx.call("in_range", tx.sub(tx.const(63), j),
                                             tx.const(56)),
                                     tx.const(1.0), tx.const(0.0)))), kind="simd")
    assert split_guards(kernel(other)).body == other


def test_split_guards_splits_a_strided_window():
    """`0 <= 2 * j + kw - 1 < 56` holds for ceil((1 - kw) / 2) <= j < ceil((57 - kw) / 2):
    the interior found for each kw is exactly the guard's set of j."""
    from tilekit.tile.expr import Binary, Cast, Unary

    def value(e, env):
        if isinstance(e, Const):
            return e.value
        if isinstance(e, Var):
            return env[e.name]
        if isinstance(e, Cast):
            return value(e.arg, env)
        if isinstance(e, Unary) and e.op == "-":
            return -value(e.arg, env)
        if isinstance(e, Binary):
            a, b = value(e.lhs, env), value(e.rhs, env)
            return {"+": a + b, "-": a - b, "*": a * b}[e.op]
        args = [value(a, env) for a in e.args]
        return {"min": min, "max": max, "floordiv": lambda a, b: a // b}[e.fn](*args)

    j, kw = Var("j", I), Var("kw", I)
    x = tx.add(tx.add(tx.mul(j, 2), kw), -1)
    guarded = tx.select(tx.call("in_range", x, tx.const(56)), Load("t_x", (x,), "float32"),
                        tx.const(0.0))
    loop = For(j, tx.const(0), tx.const(28), Store("t_y", (j,), guarded), kind="simd")
    out = split_guards(kernel(For(kw, tx.const(0), tx.const(3), loop)))
    steps = out.body.body.body
    (lo, hi), loops = steps[:2], steps[2:]
    assert [f.kind for f in loops] == ["serial", "simd", "serial"]
    assert "in_range" not in repr(loops[1].body)
    for k in range(3):
        env = {"kw": k}
        env[lo.var.name] = value(lo.value, env)
        inside = range(env[lo.var.name], value(hi.value, env))
        assert [q for q in range(28) if 0 <= 2 * q + k - 1 < 56] == list(inside), k


def test_pipelines_verify_and_are_idempotent():
    s = Buffer("s_x", "shared", "float32", (8, 16))
    body = seq(Let(Var("o_r", I), tx.mul(BLOCK, 8)), box_copy(48, tx.const(0)), Barrier(),
               Threads(Var("tid", I), 128, Store("t_y", (Var("tid", I),),
                                                 Load("s_x", (Const(0, I), Const(0, I)),
                                                      "float32"))))
    k = kernel(body, [s])
    for lower in (lower_for_cuda, lower_for_cpu):
        once = lower(k)
        verify(once)
        assert lower(once) == once
