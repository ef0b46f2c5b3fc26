"""Class 6: `tk-run --mode tiled` on a schedule with a huge number of reduction steps.

A one-point reduction step over 4M points ran 4M evaluations, one by one (minutes). The tiled
executor now runs steps vectorised where that changes no result: one-point steps as one
evaluation of the body and a sequential `ufunc.accumulate` (the same combines in the same
order), `max=`/`min=` in one evaluation. The vectorised forms are compared bit for bit with
the step loop they replace. Steps that still run one by one are bounded by
`TILEKIT_MAX_TILE_STEPS` (evaluations per op), checked before the first one runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from hostile_support import assert_refused, env_limit, run, write_doc
from tilekit.expr import analyze, parse
from tilekit.runtime import tiled
from tilekit.runtime.tiled import reduce_steps, run_op_tiled


def _analysis(expr: str, shapes: dict, dtypes: dict, pad=None, axes=None):
    return analyze(parse(expr), shapes, axes=axes, dtypes=dtypes, pad=pad)


CASES = {
    # name: (expr, shapes, dtypes, step, pad)
    "sum": ("y[i] += x[i, k]", {"x": (5, 77), "y": (5,)}, "float32", {"k": 1}, None),
    "matmul": ("y[i, j] += a[i, k] * b[k, j] * 0.3", {"a": (4, 33), "b": (33, 6), "y": (4, 6)},
               "float32", {"k": 1}, None),
    "two_axes": ("y[i] += x[i, k, l]", {"x": (3, 9, 7), "y": (3,)}, "float32",
                 {"k": 1, "l": 1}, None),
    "padded": ("y[i] += x[i + k - 2]", {"x": (20,), "y": (20,)}, "float32", {"k": 1}, "0",
               {"k": 5}),
    "product": ("y[i] *= x[i, k]", {"x": (4, 40), "y": (4,)}, "float32", {"k": 1}, None),
    "int_wraps": ("y[i] += x[i, k]", {"x": (3, 50), "y": (3,)}, "int32", {"k": 1}, None),
    "max_any_step": ("y[i] max= x[i, k]", {"x": (6, 50), "y": (6,)}, "float32", {"k": 7}, None),
    "min_nan": ("y[i] min= x[i, k]", {"x": (6, 50), "y": (6,)}, "float32", {"k": 3}, None),
    "exp_body": ("y[i] += exp(x[i, k]) - 1.0", {"x": (3, 64), "y": (3,)}, "float32",
                 {"k": 1}, None),
}


def _inputs(shapes: dict, dtype: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    env = {}
    for name, shape in shapes.items():
        if name == "y":
            continue
        if dtype == "int32":
            env[name] = rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int32)
        else:  # large values, so that the order of the additions shows in the result
            env[name] = (rng.standard_normal(shape) * 1e3).astype(np.float32)
    return env


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunk", [None, 16], ids=["one_chunk", "many_chunks"])
def test_vectorised_steps_equal_the_step_loop(case, chunk, monkeypatch):
    expr, shapes, dtype, step, pad, *axes = CASES[case]
    if chunk is not None:  # the carried accumulator from chunk to chunk
        monkeypatch.setattr(tiled, "CHUNK_ELEMENTS", chunk)
    analysis = _analysis(expr, shapes, {n: dtype for n in shapes}, pad, *axes)
    env = _inputs(shapes, dtype, seed=len(case))
    if case == "min_nan":
        env["x"][2, 17] = np.nan
    order = [step[a] for a, _ in analysis.reduction]
    spatial = dict(analysis.spatial)
    first = next(iter(spatial))
    for lo, hi in ((0, spatial[first]), (1, max(2, spatial[first] - 1))):
        box = {a: ((lo, hi) if a == first else (0, e)) for a, e in spatial.items()}
        fast = reduce_steps(analysis, env, pad, box, order)
        slow = reduce_steps(analysis, env, pad, box, order, vectorise=False)
        assert fast.dtype == slow.dtype
        assert np.array_equal(fast, slow, equal_nan=True), case


def test_half_outputs_accumulate_in_float32_in_either_form():
    analysis = _analysis("y[i] += x[i, k]", {"x": (8, 300), "y": (8,)},
                         {"x": "float16", "y": "float16"})
    x = (np.random.default_rng(5).standard_normal((8, 300)) / 3).astype(np.float16)
    tile = {"block": {"i": 4}, "thread": {"i": 1}, "step": {"k": 1}, "grid": {"i": 2},
            "blocks": 2, "threads": 4}
    got = run_op_tiled(analysis, {"x": x}, tile, out_dtype=np.float16)
    expected = np.add.accumulate(x.astype(np.float32), axis=1)[:, -1].astype(np.float16)
    assert np.array_equal(got, expected)


def test_a_million_one_point_steps_run_as_the_sequential_sum():
    """The issue's schedule (one point per step, 2 rows), at 1M points: vectorised, the
    result is exactly the row-by-row sequential float32 sum."""
    n = 2**20
    analysis = _analysis("y[i] += x[i, k]", {"x": (2, n), "y": (2,)},
                         {"x": "float32", "y": "float32"})
    x = np.random.default_rng(0).standard_normal((2, n)).astype(np.float32)
    tile = {"block": {"i": 2}, "thread": {"i": 1}, "step": {"k": 1}, "grid": {"i": 1},
            "blocks": 1, "threads": 2}
    got = run_op_tiled(analysis, {"x": x}, tile, max_boxes=tiled.RUNTIME_BOX_BUDGET)
    assert np.array_equal(got, np.add.accumulate(x, axis=1)[:, -1])


def _steps_doc(extent: int, step: int) -> dict:
    return {"tilekit": 1, "model": "s", "stages": [{"name": "import"}], "inputs": ["x"],
            "outputs": ["y"],
            "tensors": {"x": {"shape": [2, extent], "dtype": "float32", "role": "input"},
                        "y": {"shape": [2], "dtype": "float32", "role": "output"}},
            "ops": [{"name": "r", "expr": "y[i] += x[i, k]", "tile": {
                "block": {"i": 2}, "thread": {"i": 1}, "step": {"k": step}, "grid": {"i": 1},
                "blocks": 1, "threads": 2, "smem_bytes": 8, "regs": 8,
                "estimate": {"time_us": 1.0, "flops": 2 * extent, "dram_bytes": 1,
                             "smem_bytes": 1, "bound": "dram", "waves": 1,
                             "wave_efficiency": 1}, "candidates": []}}]}


def test_steps_run_one_by_one_are_bounded(tmp_path, monkeypatch):
    """Steps of two points (not vectorised) over 1,000 points: 500 evaluations, over a
    budget of 100: refused before the first, naming the op, the count and the variable."""
    ir = write_doc(tmp_path / "s.json", _steps_doc(1000, 2))
    with env_limit(monkeypatch, "TILEKIT_MAX_TILE_STEPS", "100"):
        assert_refused(run("tk-run", ir, "--mode", "tiled", "--seed", "0"), "tk-run",
                       "ops[0] (r).tile", "500 evaluations", "TILEKIT_MAX_TILE_STEPS")
        # one-point steps over the same points are vectorised: not counted, they run
        ir1 = write_doc(tmp_path / "s1.json", _steps_doc(1000, 1))
        result = run("tk-run", ir1, "--mode", "tiled", "--seed", "0", "--check")
        assert result.exit_code == 0, result.stderr
    assert run("tk-run", ir, "--mode", "tiled", "--seed", "0", "--check").exit_code == 0


def test_the_issue_schedule_runs(tmp_path):
    """4M one-point steps through the command: it finishes. (Its --check against the whole-op
    sum fails, rightly: 4M float32 additions in sequence drift by ~1e-5 from numpy's
    pairwise sum; the exact sequential result is tested above.)"""
    ir = write_doc(tmp_path / "s.json", _steps_doc(4 * 2**20, 1))
    result = run("tk-run", ir, "--mode", "tiled", "--seed", "0", "-o", tmp_path / "y.npz")
    assert result.exit_code == 0, result.stderr
    assert np.load(tmp_path / "y.npz")["y"].shape == (2,)
