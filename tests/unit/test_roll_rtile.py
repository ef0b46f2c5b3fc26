"""rTiles: the padding-waste rule, alignment, and footprints against tilekit.expr.input_box."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilekit.expr import analyze, input_box, parse
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.rtile import (RTile, aligned, align_elements, axis_sizes, block_sizes,
                                padded, thread_sizes, waste_ok)


def problem(expr, shapes, axes=None, pad=None, dtypes=None):
    an = analyze(parse(expr), shapes, axes=axes, pad=pad, dtypes=dtypes)
    return an, problem_from_analysis(an, dtypes)


MATMUL = ("y[i,j] += a[i,k] * b[k,j]", {"a": (1000, 999), "b": (999, 1001), "y": (1000, 1001)})
CONV = ("y[n,f,h,w] += x[n,c,h*2+kh-1,w*2+kw-1] * w[f,c,kh,kw]",
        {"x": (1, 8, 15, 15), "w": (16, 8, 3, 3), "y": (1, 16, 8, 8)})


def test_padding_waste_rule():
    assert padded(7, 4) == 8
    assert waste_ok(56, 8, 0.0)            # 56 = 7 * 8: no waste
    assert not waste_ok(56, 16, 0.1)       # 64 > 1.1 * 56
    assert waste_ok(56, 16, 0.25)


def test_sizes_sweep_waste_until_enough():
    # 1000 has zero-waste sizes 1, 2, 4, 5, 8, 10, ... : e = 0 already gives 6.
    assert all(padded(1000, s) == 1000 for s in axis_sizes(1000))
    # 7: only 1 and 7 divide it; the sweep admits 2 and 4 (8 <= 1.25 * 7) and 8.
    sizes = axis_sizes(7)
    assert {1, 2, 4, 7, 8} <= set(sizes)
    assert all(padded(7, s) <= 2 * 7 for s in sizes)


def test_alignment_of_innermost_axes():
    _, p = problem(*MATMUL)
    # j is the innermost dimension of y and b, k of a; i of nothing.
    assert p.innermost == {1, 2}
    assert align_elements(p, 32, 0) == 1
    assert align_elements(p, 32, 1) == 8     # 32 B / 4 B
    for axis in (1, 2):
        assert all(s % 8 == 0 or s == p.extents[axis] for s in block_sizes(p, 32, axis))
    assert 1 in block_sizes(p, 32, 0)


def test_small_innermost_extent_is_taken_whole():
    _, p = problem(*CONV, pad="0")
    kw = p.axes.index("kw")
    assert p.extents[kw] == 3 and kw in p.innermost
    assert block_sizes(p, 32, kw) == (3,)
    assert aligned(3, 3, 8) and not aligned(2, 3, 8)


def test_float16_aligns_to_16_elements():
    an, p = problem("y[i,j] += a[i,k] * b[k,j]", {"a": (64, 64), "b": (64, 64), "y": (64, 64)},
                    dtypes={"a": "float16", "b": "float16", "y": "float16"})
    assert align_elements(p, 32, 1) == 16


def test_thread_sizes_are_small_and_inside_the_extent():
    _, p = problem(*MATMUL)
    for axis in range(p.n_spatial):
        sizes = thread_sizes(p, axis)
        assert max(sizes) <= 16 and all(s <= p.extents[axis] for s in sizes)


def test_rtile_grid_and_threads():
    _, p = problem(*MATMUL)
    t = RTile(block=(64, 128), thread=(8, 8), step=(32,))
    assert t.grid(p) == (16, 8)
    assert t.threads() == 8 * 16


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 4))
def test_footprint_matches_input_box(bh, bw, skh, skw, sc):
    """A tile at the origin reads what input_box says (capped by the tensor's size)."""
    an, p = problem(*CONV, pad="0")
    sizes = {"n": 1, "f": 4, "h": bh, "w": bw, "c": sc, "kh": skh, "kw": skw}
    columns = np.array([[sizes[a]] for a in p.axes], dtype=np.int64)
    for op in p.operands:
        info = next(i for i in an.accesses if i.tensor == op.tensor)
        box = input_box(an, info, {a: (0, s) for a, s in sizes.items()})
        want = [min(hi - lo, d) for (lo, hi), d in zip(box, info.shape)]
        assert list(op.spans(columns)[:, 0]) == want


def test_quasi_affine_footprint_is_a_cover():
    an, p = problem("y[n,k] = x[n,k // 49,(k % 49) // 7,k % 7]",
                    {"x": (1, 8, 7, 7), "y": (1, 392)})
    (op,) = p.operands
    spans = op.spans(np.array([[1], [49]], dtype=np.int64))[:, 0]
    assert list(spans) == [1, 1, 7, 7]    # 49 consecutive k: one channel, a whole 7x7 plane


@pytest.mark.parametrize("expr, shapes", [MATMUL, ("y[i] = a[i] + b[i]",
                                                   {"a": (8,), "b": (8,), "y": (8,)})])
def test_distinct_tensors_stay_distinct_operands(expr, shapes):
    _, p = problem(expr, shapes)
    assert len(p.operands) == 2
    _, q = problem("y[i] = a[i] * a[i]", {"a": (8,), "y": (8,)})
    assert len(q.operands) == 1            # the same read twice is one operand


def test_problem_ignores_tensor_names():
    _, p = problem("y[i,j] += a[i,k] * b[k,j]", {"a": (4, 8), "b": (8, 5), "y": (4, 5)})
    _, q = problem("z[i,j] += u[i,k] * v[k,j]", {"u": (4, 8), "v": (8, 5), "z": (4, 5)})
    assert p == q and hash(p) == hash(q)
