"""The tensor-expression language: parser, axes, index maps, boxes, NumPy evaluation."""

import numpy as np
import pytest

from tilekit.errors import ExprError
from tilekit.expr import (analyze, evaluate, format_statement, input_box, parse, parse_index)
from tilekit.expr.analysis import interval

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(stmt, env, shapes, axes=None, pad=None):
    """Evaluate one statement, declaring the output's shape in `shapes`."""
    an = analyze(parse(stmt), {**{k: v.shape for k, v in env.items()}, **shapes}, axes, pad)
    return evaluate(an, env)


def run_sequence(stmts, env, shapes):
    """Evaluate statements in order; each writes a new tensor into `env`."""
    env = dict(env)
    for item in stmts:
        text, extra = (item, {}) if isinstance(item, str) else item
        an = analyze(parse(text), {**{k: v.shape for k, v in env.items()}, **shapes}, **extra)
        env[an.output] = evaluate(an, env)
    return env


# -- parser ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "t1[n, f, h, w] += x[n, c, h * 2 + kh - 3, w * 2 + kw - 3] * w1[f, c, kh, kw]",
    "m[i] max= x[i, j]",
    "y[i, j] = exp(x[i, j] - m[i])",
    "y[i, j] = select(j <= i, s[i, j], -inf)",
    "r[n, c, h] = x[n, c * 4 + h // 8, h % 8]",
    "s[] += x[i]",
    "y[i] = float32(int64(x[i]) % 3) * 0.5",
    "y[i] = a[i] - (b[i] - c[i])",
    "y[i] = -a[i] * 2",
    "y[i] = !(a[i] > 0 && b[i] < 1 || c[i] == 2)",
])
def test_parse_print_roundtrip(text):
    stmt = parse(text)
    assert format_statement(stmt) == text
    assert parse(format_statement(stmt)) == stmt


def test_precedence():
    assert parse("y[i] = a[i] + b[i] * c[i]").body.op == "+"
    assert parse("y[i] = (a[i] + b[i]) * c[i]").body.op == "*"
    assert parse("y[i] = a[i] - b[i] - c[i]").body.lhs.op == "-"  # left associative


@pytest.mark.parametrize("text, fragment", [
    ("", "empty expression"),
    ("y[i] == x[i]", "expected an assignment"),
    ("y[i] = x[i", "expected ']'"),
    ("y[i] = foo(x[i])", "unknown function 'foo'"),
    ("y[i] = max(x[i])", "takes 2 argument"),
    ("y[i] = x[i] $ 2", "unexpected character"),
    ("y[i] = x[i] 2", "unexpected text after"),
    ("y[i] = x[a[i]]", "tensor access inside an index"),
    ("y[i] = X", "not an axis name"),
    ("y[i] = x[i < 2]", "operator not allowed in an index"),
])
def test_parse_errors_are_located(text, fragment):
    with pytest.raises(ExprError) as err:
        parse(text)
    assert fragment in err.value.message()
    if text:
        assert err.value.where.startswith("col ")


# -- axes and index maps -----------------------------------------------------------------

def test_conv_axes_and_maps():
    an = analyze(parse("y[n,f,h,w] += x[n,c,h*2+kh-3,w*2+kw-3] * k[f,c,kh,kw]"),
                 {"x": (1, 3, 224, 224), "k": (64, 3, 7, 7), "y": (1, 64, 112, 112)}, pad="0")
    assert an.spatial == (("n", 1), ("f", 64), ("h", 112), ("w", 112))
    assert an.reduction == (("c", 3), ("kh", 7), ("kw", 7))
    hmap = an.accesses[0].maps[2]
    assert hmap.affine and dict(hmap.terms) == {"h": 2, "kh": 1} and hmap.const == -3
    assert an.inputs == ("x", "k")
    assert an.flops_per_point == 2


def test_reduction_extent_from_explicit_axes():
    an = analyze(parse("p[h] max= x[h*2+kh]"), {"x": (9,), "p": (4,)}, axes={"kh": 3})
    assert an.reduction == (("kh", 3),)


@pytest.mark.parametrize("text, shapes, kw, fragment", [
    ("c[i,j] += a[i,k] * b[k,j]", {"a": (4, 8), "b": (9, 5), "c": (4, 5)}, {},
     "extent 8 from a dimension 1 but 9 from b"),
    ("p[h] max= x[h*2+kh]", {"x": (9,), "p": (4,)}, {}, "axis 'kh' has no extent"),
    ("y[i] = x[i, j]", {"x": (3, 4), "y": (3,)}, {}, "assigns with '='"),
    ("y[i] = x[i + 1]", {"x": (4,), "y": (4,)}, {}, "reads index 1..4"),
    ("y[i] = x[i]", {"y": (4,)}, {}, "tensor 'x' is not declared"),
    ("y[i] = x[i]", {"x": (4, 4), "y": (4,)}, {}, "rank 2 but is indexed with 1"),
    ("y[i, i] = x[i]", {"x": (4,), "y": (4, 4)}, {}, "appears twice"),
    ("y[i + 1] = x[i]", {"x": (4,), "y": (4,)}, {}, "plain axis names"),
    ("y[i] = x[i * j]", {"x": (4,), "y": (4,)}, {"axes": {"j": 2}}, "multiplies two axes"),
    ("y[i] = x[i // 0]", {"x": (4,), "y": (4,)}, {}, "positive integer constant"),
    ("y[i] += x[i]", {"x": (4,), "y": (4,)}, {"axes": {"q": 3}}, "does not use"),
])
def test_analysis_errors(text, shapes, kw, fragment):
    with pytest.raises(ExprError) as err:
        analyze(parse(text), shapes, **kw)
    assert fragment in err.value.message()


def test_out_of_range_allowed_with_pad():
    analyze(parse("y[i] = x[i + 1]"), {"x": (4,), "y": (4,)}, pad="0")


# -- boxes -------------------------------------------------------------------------------

def test_input_box_conv_halo():
    an = analyze(parse("y[n,f,h,w] += x[n,c,h*2+kh-3,w*2+kw-3] * k[f,c,kh,kw]"),
                 {"x": (1, 3, 224, 224), "k": (64, 3, 7, 7), "y": (1, 64, 112, 112)}, pad="0")
    box = {"n": (0, 1), "f": (0, 16), "h": (8, 16), "w": (0, 8), "c": (0, 3)}
    # rows h*2+kh-3 for h in 8..15, kh in 0..6: 13 .. 33 inclusive
    assert input_box(an, 0, box) == [(0, 1), (0, 3), (13, 34), (-3, 18)]
    assert input_box(an, 0, box, clamp=True)[3] == (0, 18)
    assert input_box(an, 1, box) == [(0, 16), (0, 3), (0, 7), (0, 7)]


def test_input_box_quasi_affine_covers():
    an = analyze(parse("r[i] = x[i // 10, i % 10]"), {"x": (4, 10), "r": (40,)})
    assert input_box(an, 0, {"i": (12, 18)}) == [(1, 2), (2, 8)]
    assert input_box(an, 0, {"i": (15, 25)}) == [(1, 3), (0, 10)]


def test_interval_of_negative_coefficients():
    assert interval(parse_index("7 - i"), {"i": (0, 3)}) == (4, 7)


# -- evaluation against hand-written NumPy ----------------------------------------------

def test_matmul():
    a, b = rand(17, 33), rand(33, 9)
    np.testing.assert_allclose(run("c[i,j] += a[i,k] * b[k,j]", {"a": a, "b": b},
                                   {"c": (17, 9)}), a @ b, rtol=1e-5, atol=1e-5)


def test_batched_matmul_with_scale():
    a, b = rand(2, 5, 6), rand(2, 6, 3)
    got = run("c[z,i,j] += 0.5 * a[z,i,k] * b[z,k,j]", {"a": a, "b": b}, {"c": (2, 5, 3)})
    np.testing.assert_allclose(got, 0.5 * a @ b, rtol=1e-5, atol=1e-5)


def conv2d_reference(x, w, stride, pad, dilation, groups=1):
    n, c, hh, ww = x.shape
    f, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (hh + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (ww + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, f, oh, ow), np.float64)
    fg = f // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dilation:i * dilation + stride * oh:stride,
                           j * dilation:j * dilation + stride * ow:stride]
                y[:, g * fg:(g + 1) * fg] += np.einsum("nchw,fc->nfhw", patch,
                                                       w[g * fg:(g + 1) * fg, :, i, j])
    return y


@pytest.mark.parametrize("stride, pad, dilation", [(1, 1, 1), (2, 3, 1), (1, 2, 2), (2, 0, 3)])
def test_conv2d(stride, pad, dilation):
    x, w = rand(2, 3, 15, 13), rand(4, 3, 3, 3)
    oh = (15 + 2 * pad - dilation * 2 - 1) // stride + 1
    ow = (13 + 2 * pad - dilation * 2 - 1) // stride + 1
    s, p, d = stride, pad, dilation
    text = f"y[n,f,h,w] += x[n,c,h*{s}+kh*{d}-{p},w*{s}+kw*{d}-{p}] * k[f,c,kh,kw]"
    got = run(text, {"x": x, "k": w}, {"y": (2, 4, oh, ow)}, pad="0")
    np.testing.assert_allclose(got, conv2d_reference(x, w, s, p, d), rtol=1e-4, atol=1e-4)


def test_depthwise_conv():
    x, w = rand(1, 6, 10, 10), rand(6, 1, 3, 3)
    got = run("y[n,c,h,w] += x[n,c,h+kh-1,w+kw-1] * k[c,0,kh,kw]", {"x": x, "k": w},
              {"y": (1, 6, 10, 10)}, pad="0")
    np.testing.assert_allclose(got, conv2d_reference(x, w, 1, 1, 1, groups=6), rtol=1e-4,
                               atol=1e-4)


def test_grouped_conv_via_index_arithmetic():
    x, w = rand(1, 4, 6, 6), rand(6, 2, 3, 3)  # 2 groups, 3 filters each
    got = run("y[n,f,h,w] += x[n,f//3*2+c,h+kh,w+kw] * k[f,c,kh,kw]", {"x": x, "k": w},
              {"y": (1, 6, 4, 4)})
    np.testing.assert_allclose(got, conv2d_reference(x, w, 1, 0, 1, groups=2), rtol=1e-4,
                               atol=1e-4)


def test_max_and_average_pooling():
    x = rand(1, 2, 8, 8)
    mp = run("p[n,c,h,w] max= x[n,c,h*2+kh-1,w*2+kw-1]", {"x": x}, {"p": (1, 2, 4, 4)},
             axes={"kh": 3, "kw": 3}, pad="-inf")
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.stack([xp[:, :, i:i + 8:2, j:j + 8:2] for i in range(3) for j in range(3)]).max(0)
    np.testing.assert_array_equal(mp, ref)
    # Average pooling that excludes padding: the divisor counts valid taps from axis values.
    env = run_sequence([
        ("s[n,c,h,w] += x[n,c,h*2+kh-1,w*2+kw-1]", {"axes": {"kh": 3, "kw": 3}, "pad": "0"}),
        "a[n,c,h,w] = s[n,c,h,w] / float32((min(h*2+2, 8) - max(h*2-1, 0)) * "
        "(min(w*2+2, 8) - max(w*2-1, 0)))",
    ], {"x": x}, {"s": (1, 2, 4, 4), "a": (1, 2, 4, 4)})
    xz = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    num = sum(xz[:, :, i:i + 8:2, j:j + 8:2] for i in range(3) for j in range(3))
    den = sum(ones[:, :, i:i + 8:2, j:j + 8:2] for i in range(3) for j in range(3))
    np.testing.assert_allclose(env["a"], num / den, rtol=1e-5, atol=1e-6)


def test_softmax_as_sequence():
    x = rand(5, 11)
    env = run_sequence([
        "m[i] max= x[i,j]",
        "e[i,j] = exp(x[i,j] - m[i])",
        "s[i] += e[i,j]",
        "y[i,j] = e[i,j] / s[i]",
    ], {"x": x}, {"m": (5,), "e": (5, 11), "s": (5,), "y": (5, 11)})
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(env["y"], ref / ref.sum(1, keepdims=True), rtol=1e-5)


def test_layer_norm_as_sequence():
    x, g, b = rand(3, 16), rand(16), rand(16)
    env = run_sequence([
        "mu[i] += x[i,j] / 16.0",
        "d[i,j] = x[i,j] - mu[i]",
        "var[i] += d[i,j] * d[i,j] / 16.0",
        "y[i,j] = d[i,j] * rsqrt(var[i] + 1e-05) * g[j] + b[j]",
    ], {"x": x, "g": g, "b": b}, {"mu": (3,), "d": (3, 16), "var": (3,), "y": (3, 16)})
    mu = x.mean(1, keepdims=True)
    ref = (x - mu) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(env["y"], ref, rtol=1e-5, atol=1e-5)


def test_reshape_transpose_and_broadcast():
    x = rand(2, 3, 4)
    got = run("r[i,j] = x[i // 3, i % 3, j]", {"x": x}, {"r": (6, 4)})
    np.testing.assert_array_equal(got, x.reshape(6, 4))
    got = run("t[a,b,c] = x[c,a,b]", {"x": x}, {"t": (3, 4, 2)})
    np.testing.assert_array_equal(got, x.transpose(1, 2, 0))
    got = run("y[i,j,k] = x[i,j,k] + b[0,j,0]", {"x": x, "b": rand(1, 3, 1)}, {"y": x.shape})
    assert got.shape == x.shape


def test_boxed_evaluation_matches_whole():
    a, b = rand(16, 24), rand(24, 8)
    an = analyze(parse("c[i,j] += a[i,k] * b[k,j]"), {"a": a.shape, "b": b.shape, "c": (16, 8)})
    whole = evaluate(an, {"a": a, "b": b})
    part = sum(evaluate(an, {"a": a, "b": b}, box={"i": (4, 12), "j": (0, 8), "k": (k, k + 8)})
               for k in (0, 8, 16))
    np.testing.assert_allclose(part, whole[4:12], rtol=1e-5, atol=1e-5)


def test_chunked_evaluation(monkeypatch):
    import tilekit.expr.reference as ev
    x = rand(64, 64)
    an = analyze(parse("m[i] max= x[i,j]"), {"x": x.shape, "m": (64,)})
    monkeypatch.setattr(ev, "CHUNK_ELEMENTS", 100)
    np.testing.assert_array_equal(evaluate(an, {"x": x}), x.max(1))


def test_intrinsics():
    x = np.linspace(-3, 3, 13).astype(np.float32)
    got = run("y[i] = erf(x[i])", {"x": x}, {"y": x.shape})
    import math
    np.testing.assert_allclose(got, [math.erf(v) for v in x], atol=2e-7)
    got = run("y[i] = sigmoid(x[i]) + pow(abs(x[i]), 2.0) + max(x[i], 0)", {"x": x},
              {"y": x.shape})
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x)) + x ** 2 + np.maximum(x, 0), rtol=1e-6)


def test_evaluate_cast_to_declared_dtype():
    x = rand(4)
    an = analyze(parse("y[i] = x[i] * 2"), {"x": (4,), "y": (4,)}, dtypes={"y": "float16"})
    assert evaluate(an, {"x": x}).dtype == np.float16


@pytest.mark.parametrize("text, xs, ks, ys, pad", [
    ("y[n,f,h,w] += x[n,c,h+kh-1,w+kw-1] * k[f,c,kh,kw]", (2, 3, 9, 7), (2, 3, 3, 3),
     (2, 2, 9, 7), "0"),
    ("y[n,f,h,w] += x[n,c,h+2*kh-2,w+2*kw-2] * k[f,c,kh,kw]", (1, 5, 8, 11), (2, 5, 3, 3),
     (1, 2, 8, 11), "0"),
    ("y[n,f,h] += x[n,c,h+kh] * k[f,c,kh]", (2, 3, 10), (2, 3, 4), (2, 2, 7), None),
    ("y[n,f,d,h,w] += x[n,c,d+kd-1,h+kh-1,w+kw-1] * k[f,c,kd,kh,kw]", (1, 2, 5, 6, 7),
     (3, 2, 3, 3, 3), (1, 3, 5, 6, 7), "0"),
    ("y[n,f,h,w] += x[n,c,h+kh-3,w+kw-1] * k[f,c,kh,kw] * 0.5", (1, 4, 6, 6), (2, 4, 7, 3),
     (1, 2, 6, 6), "0"),
    ("y[f,n,h,w] += x[n,c,h+kh,w+kw] * k[f,c,kh,kw]", (2, 3, 6, 6), (2, 3, 3, 3),
     (2, 2, 4, 4), None),
])
def test_stride1_window_sum_matches_im2col(text, xs, ks, ys, pad, monkeypatch):
    """The shifted-matrix-product path for stride-1 windows equals the im2col path."""
    import tilekit.expr.contract as contract
    import tilekit.expr.reference as ref
    x, k = rand(*xs), rand(*ks)
    an = analyze(parse(text), {"x": xs, "k": ks, "y": ys}, pad=pad)
    taken = []

    def spy(*args, **kwargs):
        result = contract.shifted_window_sum(*args, **kwargs)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(ref, "shifted_window_sum", spy)
    got = evaluate(an, {"x": x, "k": k})
    assert taken == [True]
    monkeypatch.setattr(ref, "shifted_window_sum", lambda *a, **kw: None)
    np.testing.assert_allclose(got, evaluate(an, {"x": x, "k": k}), rtol=1e-5, atol=1e-5)
