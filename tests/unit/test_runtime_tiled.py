"""Tile-faithful execution: block by block and step by step gives the whole-op result."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tilekit.errors import IRError
from tilekit.expr import analyze, evaluate, parse
from tilekit.hw import load_profile
from tilekit.ir import Module, Op, Tensor
from tilekit.roll.schedule import roll_module
from tilekit.runtime.tiled import block_boxes, check_tile_cover, run_op_tiled, step_boxes
from tilekit.schedule.defaults import default_tile
from tilekit.runtime.cpu import OP_RUNNERS, run_module

RNG = np.random.default_rng(3)

#: (expression, shapes, axes, pad): boundary tiles, halos, strides, pads, every reduction
#: operator, rank 0, quasi-affine reads, broadcasts.
CASES = {
    "matmul_odd": ("y[i,j] += a[i,k] * b[k,j]", {"a": (37, 29), "b": (29, 23), "y": (37, 23)},
                   None, None),
    "conv_stride_pad": ("y[n,f,h,w] += x[n,c,h*2+kh-1,w*2+kw-1] * w[f,c,kh,kw]",
                        {"x": (2, 5, 13, 11), "w": (6, 5, 3, 3), "y": (2, 6, 7, 6)}, None, "0"),
    "depthwise": ("y[n,c,h,w] += x[n,c,h+kh-1,w+kw-1] * w[c,kh,kw]",
                  {"x": (1, 7, 10, 9), "w": (7, 3, 3), "y": (1, 7, 10, 9)}, None, "0"),
    "maxpool": ("y[n,c,h,w] max= x[n,c,h*2+kh-1,w*2+kw-1]",
                {"x": (1, 3, 11, 11), "y": (1, 3, 6, 6)}, {"kh": 3, "kw": 3}, "-inf"),
    "row_min": ("y[i] min= x[i,j]", {"x": (19, 41), "y": (19,)}, None, None),
    "row_prod": ("y[i] *= x[i,j]", {"x": (9, 6), "y": (9,)}, None, None),
    "scalar_sum": ("y[] += x[i] * x[i]", {"x": (1000,), "y": ()}, None, None),
    "softmax_exp": ("e[i,j] = exp(t[i,j] - m[i])", {"t": (13, 17), "m": (13,), "e": (13, 17)},
                    None, None),
    "flatten": ("y[n,k] = x[n,k // 12,(k % 12) // 4,k % 4]",
                {"x": (2, 3, 3, 4), "y": (2, 36)}, None, None),
    "masked": ("y[i,j] = select(j <= i, s[i,j] * 0.5, -inf)", {"s": (9, 9), "y": (9, 9)},
               None, None),
}


def setup(name):
    expr, shapes, axes, pad = CASES[name]
    an = analyze(parse(expr), shapes, axes=axes, pad=pad)
    env = {t: RNG.standard_normal(shapes[t]).astype(np.float32) for t in an.inputs}
    if name == "row_prod":
        env["x"] = (1 + 0.1 * env["x"]).astype(np.float32)
    return an, env, pad


def same(got, want):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)


def small_tile(an):
    """Blocks of 2 (3 on odd axes) and steps of 2: many boundary tiles, many steps."""
    block = {a: min(e, 2 if i % 2 else 3) for i, (a, e) in enumerate(an.spatial)}
    return {"block": block, "thread": {a: 1 for a in block},
            "step": {a: min(e, 2) for a, e in an.reduction},
            "grid": {a: -(-e // block[a]) for a, e in an.spatial}}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiled_equals_whole_with_small_tiles(name):
    an, env, pad = setup(name)
    same(run_op_tiled(an, env, small_tile(an), pad=pad), evaluate(an, env, pad=pad))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("hw", ["h100", "ipu"])
def test_tiled_equals_whole_with_rolled_tiles(name, hw):
    expr, shapes, axes, pad = CASES[name]
    m = Module(model=name, tensors={t: Tensor(s, "float32", "input") for t, s in shapes.items()},
               ops=(Op(name, expr, pad=pad, axes=axes or {}),), inputs=(), outputs=(),
               stages=({"name": "import"},))
    tile = roll_module(m, load_profile(hw), 3).ops[0].tile
    an, env, pad = setup(name)
    want = evaluate(an, env, pad=pad)
    for t in [tile, *tile["candidates"]]:
        same(run_op_tiled(an, env, {**t, "grid": {a: -(-e // t["block"][a])
                                                   for a, e in an.spatial}}, pad=pad), want)
    same(run_op_tiled(an, env, tile, pad=pad, max_boxes=4), want)    # merged blocks


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_default_tile_covers_and_computes(name):
    an, env, pad = setup(name)
    tile = default_tile(an.spatial, an.reduction)
    check_tile_cover(an, tile)
    same(run_op_tiled(an, env, tile, pad=pad), evaluate(an, env, pad=pad))


def test_every_output_point_is_covered_exactly_once():
    an, _, _ = setup("conv_stride_pad")
    tile = small_tile(an)
    count = np.zeros(tuple(e for _, e in an.spatial), dtype=np.int64)
    for box in block_boxes(an, tuple(tile["block"].values())):
        count[tuple(slice(lo, hi) for lo, hi in box.values())] += 1
    assert (count == 1).all()
    red = np.zeros(tuple(e for _, e in an.reduction), dtype=np.int64)
    for box in step_boxes(an, tuple(tile["step"].values())):
        red[tuple(slice(lo, hi) for lo, hi in box.values())] += 1
    assert (red == 1).all()
    # Merged boxes are unions of whole blocks: still exactly once, and fewer.
    merged = list(block_boxes(an, tuple(tile["block"].values()), max_boxes=5))
    assert len(merged) < len(list(block_boxes(an, tuple(tile["block"].values()))))
    count[:] = 0
    for box in merged:
        count[tuple(slice(lo, hi) for lo, hi in box.values())] += 1
    assert (count == 1).all()


@pytest.mark.parametrize("change, message", [
    (lambda t: t["block"].pop("w"), "axis 'w' has no size"),
    (lambda t: t["block"].update(zz=2), r"names axes \['zz'\]"),
    (lambda t: t["step"].update(c=0), "positive integer"),
    (lambda t: t["thread"].update(h=2), "not a multiple"),     # block h is 3
    (lambda t: t["grid"].update(h=1), r"grid 1 of axis 'h' does not match ceil\(7 / block 3\)"),
    (lambda t: t["grid"].update(h=5), "grid 5 of axis 'h' does not match"),  # 3 blocks cover 7
    (lambda t: t["grid"].update(h=0), "does not match"),
    (lambda t: t["grid"].pop("n"), "axis 'n' has no grid size"),
    (lambda t: t["step"].pop("kh"), "axis 'kh' has no size"),      # a reduction axis missing
    (lambda t: t.update(grid=7), "mapping"),                       # codegen once accepted this
    (lambda t: t.update(block=[1, 2]), "mapping"),
    (lambda t: t.update(blocks=t["blocks"] + 1), "'blocks' is"),
    (lambda t: t.update(threads=t["threads"] * 2), "'threads' is"),
])
def test_cover_check_refuses_broken_tiles(change, message):
    an, _, _ = setup("conv_stride_pad")
    tile = small_tile(an)
    tile["thread"]["h"] = 1
    tile["blocks"] = math.prod(tile["grid"].values())
    tile["threads"] = math.prod(b // tile["thread"][a] for a, b in tile["block"].items())
    check_tile_cover(an, tile)                                     # the unbroken tile passes
    change(tile)
    with pytest.raises(IRError, match=message) as info:
        check_tile_cover(an, tile, "ops[3].tile")
    assert info.value.where.startswith("ops[3].tile")


def test_default_threads_live_in_one_place():
    from tilekit.codegen import kernel
    from tilekit.schedule import defaults
    assert kernel.DEFAULT_THREADS is defaults.DEFAULT_THREADS == 256


def test_runtime_mode_tiled_runs_a_rolled_module():
    assert "tiled" in OP_RUNNERS      # registered on import of tilekit.runtime.tiled
    t = lambda shape, role="intermediate": Tensor(shape, "float32", role)  # noqa: E731
    m = Module(model="mlp",
               tensors={"x": t((33, 20), "input"), "w": t((20, 24), "input"),
                        "b": t((24,), "input"), "h": t((33, 24)), "m": t((33,)),
                        "y": t((33, 24), "output")},
               ops=(Op("fc", "h[i,j] += x[i,k] * w[k,j]"),
                    Op("bias_relu", "y[i,j] = max(h[i,j] + b[j], 0.0)")),
               inputs=("x", "w", "b"), outputs=("y",), stages=({"name": "import"},))
    inputs = {n: RNG.standard_normal(m.tensors[n].shape).astype(np.float32) for n in m.inputs}
    want = run_module(m, inputs, {}, mode="whole")["y"]
    same(run_module(m, inputs, {}, mode="tiled")["y"], want)                  # default tiles
    rolled = roll_module(m, load_profile("v100"))
    same(run_module(rolled, inputs, {}, mode="tiled")["y"], want)


# -- imported models (the importer's test builders) -----------------------------------------

MODELS = Path(__file__).resolve().parents[1] / "models"


def model_builders():
    if not (MODELS / "onnx_models.py").exists():
        return []
    sys.path.insert(0, str(MODELS))
    try:
        import onnx_models
    except ImportError:
        return []
    names = ("bert_encoder_layer", "gpt_block", "mobilenet_block", "mlp_mixer_block",
             "lstm_model")
    return [(n, getattr(onnx_models, n)) for n in names if hasattr(onnx_models, n)]


@pytest.mark.parametrize("name, build", model_builders(), ids=lambda v: v if isinstance(
    v, str) else "")
def test_imported_models_tiled_equal_whole(name, build):
    onnx_import = pytest.importorskip("tilekit.onnx")
    sys.path.insert(0, str(MODELS))
    from onnx_check import random_inputs

    model = build()
    imported = onnx_import.import_model(model, name=name)
    module = imported.module
    if "import" not in module.stage_names():   # tk-import records it; the library may not
        module = module.with_stage("import")
    module = roll_module(module, load_profile("h100"))
    feeds = random_inputs(model)
    renamed = dict((module.source or {}).get("inputs") or {})
    inputs = {ir: feeds[renamed.get(ir, ir)] for ir in module.inputs}
    weights = dict(imported.weights)
    whole = run_module(module, inputs, weights, mode="whole")
    tiled = run_module(module, inputs, weights, mode="tiled")
    for out in module.outputs:
        np.testing.assert_allclose(tiled[out], whole[out], rtol=1e-4, atol=1e-5)
