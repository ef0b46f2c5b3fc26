"""Property: for any valid module, `loads(dumps(m)) == m` in YAML and JSON, byte-stably.

Modules are chains of elementwise, bias and matmul ops over random names, shapes and dtypes,
with random kernels (contiguous groups) and random JSON stage payloads: nested mappings,
lists, floats, arbitrary Unicode strings.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilekit.ir import Kernel, Module, Op, Tensor, dumps, loads, verify

FLOAT_DTYPES = ("float32", "float16", "float64", "bfloat16")
UNARY = ("exp", "tanh", "abs", "sigmoid", "neg")

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
payload_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
payloads = st.dictionaries(st.text(max_size=8), payload_values, max_size=4)
maybe_payload = st.none() | payloads
name_tails = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", max_size=6)
dims = st.integers(min_value=1, max_value=64)


@st.composite
def modules(draw: st.DrawFn) -> Module:
    prefix = draw(st.sampled_from(["t", "T", "_", "act", "layer"]))
    tail = draw(name_tails)
    counter = iter(range(10_000))

    def fresh() -> str:
        return f"{prefix}{tail}_{next(counter)}"

    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    rows, cols = draw(dims), draw(dims)
    x = fresh()
    tensors = {x: Tensor((rows, cols), dtype, "input")}
    ops: list[Op] = []
    current = x
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        kind = draw(st.sampled_from(["unary", "bias", "matmul"]))
        out = fresh()
        if kind == "unary":
            fn = draw(st.sampled_from(UNARY))
            expr = f"{out}[i,j] = {fn}({current}[i,j])"
        elif kind == "bias":
            b = fresh()
            tensors[b] = Tensor((cols,), dtype, "weight")
            expr = f"{out}[i,j] = {current}[i,j] + {b}[j]"
        else:
            w = fresh()
            new_cols = draw(dims)
            tensors[w] = Tensor((cols, new_cols), dtype, "weight")
            expr = f"{out}[i,j] += {current}[i,k] * {w}[k,j]"
            cols = new_cols
        tensors[out] = Tensor((rows, cols), dtype)
        ops.append(Op(name=f"op_{len(ops)}", expr=expr, origin=draw(st.none() | st.text(
            min_size=1, max_size=10)), tile=draw(maybe_payload)))
        current = out
    tensors[current] = replace(tensors[current], role="output")

    kernels: tuple[Kernel, ...] = ()
    if draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=len(ops) - 1)))
                      if len(ops) > 1 else set())
        bounds = [0, *cuts, len(ops)]
        kernels = tuple(
            Kernel(name=f"k{n}", ops=tuple(op.name for op in ops[a:b]),
                   tile=draw(maybe_payload), estimate=draw(maybe_payload),
                   launch=draw(maybe_payload))
            for n, (a, b) in enumerate(zip(bounds, bounds[1:])))
    stages = tuple({"name": name, **({"options": opts} if opts else {})}
                   for name, opts in draw(st.lists(st.tuples(
                       st.sampled_from(["import", "roll", "weld", "ram", "grind"]), payloads),
                       max_size=3)))
    has_weights = any(t.role == "weight" for t in tensors.values())
    return Module(
        model=draw(st.sampled_from(["m", "_", "Net"])) + draw(name_tails),
        tensors=tensors, ops=tuple(ops), inputs=(x,), outputs=(current,), kernels=kernels,
        source=draw(st.none() | st.just({"onnx": "m.onnx", "sha256": "0" * 64})),
        weights={"file": "m.weights.npz", "sha256": "f" * 64} if has_weights else None,
        hardware=draw(st.none() | st.sampled_from(["h100", "a100", "hwprofiles/x.yaml"])),
        # `program` is typed (tk-ram); tests/unit/test_ram.py round-trips real programs
        stages=stages, program=None, control=draw(st.none() | st.just({})),
        codegen=draw(maybe_payload))


SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(modules())
def test_generated_modules_are_valid(module: Module) -> None:
    verify(module)


@SETTINGS
@given(modules(), st.sampled_from(["yaml", "json"]))
def test_round_trip_is_identity_and_byte_stable(module: Module, fmt: str) -> None:
    text = dumps(module, fmt)
    assert dumps(module, fmt) == text
    back = loads(text, origin="<generated>")
    assert back == module
    assert dumps(back, fmt) == text


@SETTINGS
@given(modules())
def test_yaml_and_json_hold_the_same_module(module: Module) -> None:
    assert loads(dumps(module, "json")) == loads(dumps(module, "yaml"))
