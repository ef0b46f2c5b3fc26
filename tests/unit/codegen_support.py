"""Shared helpers of the codegen tests: fixtures, variants, random inputs, FileCheck."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from tilekit.ir.codec import read_module
from tilekit.ir.model import Module, Op, Tensor
from tilekit.runtime.io import load_weights

DATA = Path(__file__).resolve().parent.parent / "data" / "codegen"
FIXTURES = sorted(p.stem for p in DATA.glob("*.yaml"))


def _ensure_weights() -> None:
    """The fixtures' weight sidecars are git-ignored: make any missing ones (seeded)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("codegen_make_weights", DATA / "make_weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ensure()


_ensure_weights()


def fixture(name: str) -> Module:
    return read_module(str(DATA / f"{name}.yaml"))


def without_tiles(module: Module) -> Module:
    """The module as if tk-roll had not run: default schedules."""
    return replace(module, ops=tuple(replace(op, tile=None) for op in module.ops),
                   kernels=tuple(replace(k, tile=None) for k in module.kernels))


def without_groups(module: Module) -> Module:
    """One kernel per op (the import default), tiles kept."""
    return replace(module, kernels=())


VARIANTS = {"as_written": lambda m: m, "no_tiles": without_tiles, "one_kernel_per_op":
            without_groups}


def distinct_variants() -> list[tuple[str, str]]:
    """(fixture, variant) for every variant of every fixture that is not the same module as
    an earlier variant of it (sorted): a fixture without tiles or kernel groups is the same
    module as written, without tiles or with one kernel per op, and would run twice."""
    from tilekit.ir import dumps

    pairs = []
    for name in FIXTURES:
        seen = set()
        for variant in sorted(VARIANTS):
            text = dumps(VARIANTS[variant](fixture(name)))
            if text not in seen:
                seen.add(text)
                pairs.append((name, variant))
    return pairs


def random_values(module: Module, seed: int = 0) -> tuple[dict, dict]:
    """(inputs, weights): weights from the fixture's sidecar, inputs random by dtype."""
    rng = np.random.default_rng(seed)
    weights = load_weights(module, DATA)
    inputs = {}
    for name in module.inputs:
        t = module.tensors[name]
        if t.dtype.startswith("int"):
            # Gather ids: include negative indices (counted from the end).
            inputs[name] = rng.integers(-3, 8, size=t.shape).astype(t.dtype)
        elif t.dtype == "bool":
            inputs[name] = rng.random(t.shape) > 0.5
        else:
            inputs[name] = rng.standard_normal(t.shape).astype(t.dtype)
    return inputs, weights


def filecheck(text: str, *checks: str) -> None:
    """FileCheck-style: each `CHECK: regex` must match after the previous match;
    `CHECK-NOT: regex` must not match anywhere; `CHECK-COUNT-n: regex` matches n times."""
    pos = 0
    for check in checks:
        kind, _, pattern = check.partition(":")
        pattern = pattern.strip()
        if kind == "CHECK":
            m = re.compile(pattern, re.M).search(text, pos)
            assert m, f"CHECK failed: {pattern!r} not found after offset {pos} in:\n{text}"
            pos = m.end()
        elif kind == "CHECK-NOT":
            m = re.compile(pattern, re.M).search(text)
            assert not m, f"CHECK-NOT failed: {pattern!r} found: {m.group(0)!r} in:\n{text}"
        elif kind.startswith("CHECK-COUNT-"):
            n = int(kind.rsplit("-", 1)[1])
            found = len(re.findall(pattern, text, re.M))
            assert found == n, f"{kind} failed: {pattern!r} found {found} times in:\n{text}"
        else:
            raise ValueError(f"unknown check {check!r}")


def big_tile_matmul(m: int = 256, k: int = 256, n: int = 256, model: str = "big") -> Module:
    """`c = a @ b` with a 128x128 block tile, 8x8 thread tiles and 64-deep steps: its staged
    buffers need 64 KB, over the 48 KB a kernel gets without the dynamic shared memory opt-in."""
    return Module(
        model=model, inputs=("a", "b"), outputs=("c",),
        tensors={"a": Tensor((m, k), "float32", "input"),
                 "b": Tensor((k, n), "float32", "input"),
                 "c": Tensor((m, n), "float32", "output")},
        ops=(Op("mm", "c[i,j] += a[i,k] * b[k,j]",
                tile={"block": {"i": 128, "j": 128}, "thread": {"i": 8, "j": 8},
                      "step": {"k": 64}}),))


def unpadded(program):
    """Tile program `program` with its shared buffers in plain row-major layout, packed one
    after another: what its padding or swizzle keeps apart, without it."""
    from tilekit.tile.nodes import Layout

    offset, shared = 0, []
    for b in program.shared:
        b = replace(b, layout=Layout(), offset=offset)
        offset += b.aligned_bytes
        shared.append(b)
    return replace(program, shared=tuple(shared))
