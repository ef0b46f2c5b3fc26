"""Dynamic shapes on the CPU: one symbolic import run at several sizes, against a module
imported for each size (`tk-import --dim NAME=SIZE`), both as compiled C++.

Run with `make bench` (not part of `make test`; needs g++ with OpenMP). For each model of the
corpus exported with a dynamic batch and sequence and each sequence length in `SIZES`
(batch 1):

- **compile cost**: the symbolic path imports once and, per size, instantiates the module,
  computes what the sizes alone decide (`tilekit.runtime.fold`, as `tk-run` does), generates
  its C++ and runs it through the module's `CompiledFamily` (tilekit.runtime.family: the
  sizes whose code has one structure share one build, their sizes read at run time); the
  specialised path imports, generates and builds per size. Each path starts from an empty
  compile cache; wall time, CPU time (this process and its compilers) and the builds made;
- **run time** of each size's two programs, alternating run by run (median of `RUNS`, one
  thread), and their ratio; the outputs must agree.

Results: tests/bench/results/dynamic-cpu.json.
"""

from __future__ import annotations

import resource
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from test_cpu_bench import record

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "corpus"
RESULTS = ROOT / "tests" / "bench" / "results" / "dynamic-cpu.json"
MODELS = ("gpt2.ts17.dynamic", "bert.ts17.dynamic")
#: A decode step's length and prompt lengths (the corpus models have 64 positions)
SIZES = (1, 17, 23, 31, 40, 50, 63)
RUNS = 200
THREADS = 1


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the compilers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class _Clock:
    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "_Clock":
        self._w, self._c = time.perf_counter(), _cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += _cpu_seconds() - self._c


def _program(module, weights):
    from tilekit.codegen import generate
    from tilekit.runtime.compiled import CpuProgram

    generated = generate(module, None, target="cpu").module
    return CpuProgram(generated, THREADS), {k: np.ascontiguousarray(v)
                                            for k, v in weights.items()}


def _alternate(feeds, sym, sym_w, spec, spec_w) -> dict:
    """The two programs run alternately `RUNS` times each: their medians and ratio."""
    times: dict[str, list[float]] = {"symbolic": [], "specialised": []}
    for _ in range(RUNS):
        for key, (prog, w) in (("symbolic", (sym, sym_w)), ("specialised", (spec, spec_w))):
            t0 = time.perf_counter()
            prog.run(feeds, w)
            times[key].append(time.perf_counter() - t0)
    ms = {k: round(statistics.median(v) * 1e3, 4) for k, v in times.items()}
    return {"symbolic_ms": ms["symbolic"], "specialised_ms": ms["specialised"],
            "ratio": round(ms["symbolic"] / ms["specialised"], 3)}


def _compile_cost(symbolic: _Clock, symbolic_builds: int, specialised: _Clock,
                  specialised_builds: int) -> dict:
    return {"symbolic": {"wall_s": round(symbolic.wall, 2), "cpu_s": round(symbolic.cpu, 2),
                         "builds": symbolic_builds},
            "specialised": {"wall_s": round(specialised.wall, 2),
                            "cpu_s": round(specialised.cpu, 2), "builds": specialised_builds}}


def _record(row: dict) -> None:
    record(row, RESULTS, "make bench (tests/bench/test_dynamic_bench.py)",
           method="in one process; compile: import + generate + g++ from an empty cache "
                  "(symbolic: builds shared by sizes of one structure); "
                  f"run: the two programs alternating, {RUNS} runs each, median",
           threads=THREADS)


def _feeds(module, values, seed: int = 0) -> dict[str, np.ndarray]:
    from tilekit.ir.dims import evaluate_shape

    rng = np.random.default_rng(seed)
    out = {}
    for name in module.inputs:
        t = module.tensors[name]
        shape = evaluate_shape(t.shape, values) if values else list(t.shape)
        if t.dtype == "int64":
            out[name] = (rng.integers(0, 30, shape) if "ids" in name
                         else np.ones(shape)).astype(np.int64)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def agreeing(pair, feeds) -> tuple:
    """A size's (symbolic, specialised) programs with their weights, flattened, after both
    ran on `feeds` and agreed."""
    (sym, sym_w), (spec, spec_w) = pair
    a, b = sym.run(feeds, sym_w), spec.run(feeds, spec_w)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5)
    return sym, sym_w, spec, spec_w


def symbolic_programs(path: Path, target: str, sizes, clock: _Clock, program,
                      hw: str | None = None):
    """Import the dynamic export `path` once, its dimensions symbolic (rolled once for
    profile `hw` when given), and make each sequence length's program (batch 1) through one
    `CompiledFamily` for `target` (`program(family, instance, values)`), all under `clock`:
    (module, (batch, seq symbols), family, {size: [(program, weights)]})."""
    import tilekit
    from tilekit.ir.dims import instantiate
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants

    with clock:
        symbolic = tilekit.compile(path, ["roll"] if hw else [], hw=hw)
    module = symbolic.module
    seq = next(s for s in module.dims if "seq" in s)
    batch = next(s for s in module.dims if s != seq)
    family = CompiledFamily(module, symbolic.weights, target)
    programs = {}
    for size in sizes:
        values = {batch: 1, seq: size}
        with clock:
            instance, weights = fold_constants(instantiate(module, values), symbolic.weights)
            programs[size] = [(program(family, instance, values),
                               {k: np.ascontiguousarray(v) for k, v in weights.items()})]
    return module, (batch, seq), family, programs


@pytest.mark.parametrize("model", MODELS)
def test_one_symbolic_import_against_an_import_per_size(model, tmp_path, monkeypatch):
    import tilekit

    path = CORPUS / f"{model}.onnx"
    symbolic_clock, specialised_clock = _Clock(), _Clock()
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "symbolic"))
    module, (batch, seq), family, programs = symbolic_programs(
        path, "cpu", SIZES, symbolic_clock, lambda family, instance, values: family.program(
            instance, values, THREADS))
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "specialised"))
    for size in SIZES:
        values = {batch: 1, seq: size}
        with specialised_clock:
            one = tilekit.compile(path, [], dims=values)
            programs[size].append(_program(one.module, one.weights))
    rows = {}
    for size in SIZES:
        feeds = _feeds(module, {batch: 1, seq: size})
        rows[str(size)] = _alternate(feeds, *agreeing(programs[size], feeds))
    row = {
        "model": model, "sizes": {"batch": 1, "sequence": list(SIZES)},
        "compile": _compile_cost(symbolic_clock, family.builds, specialised_clock, len(SIZES)),
        "run": rows,
    }
    print(f"\n{model}: compile for {len(SIZES)} sizes: symbolic "
          f"{row['compile']['symbolic']['wall_s']} s ({family.builds} builds), specialised "
          f"{row['compile']['specialised']['wall_s']} s; run symbolic/specialised "
          + ", ".join(f"seq {s}: {r['ratio']}" for s, r in rows.items()))
    _record(row)



#: The cache lengths of the decode bench: one new token per step.
DECODE_STEPS = tuple(range(33, 65))


def test_decode_steps_against_a_build_per_step(tmp_path, monkeypatch):
    """Token-by-token decoding over a growing key/value cache (tests/models' `kv_cache_step`,
    hidden 64): the symbolic module run through its `CompiledFamily` (builds shared by the
    steps of one structure) against a module imported and built for each step; the compile
    cost of all the steps on both paths, and the run time of every eighth step."""
    import onnx

    import tilekit
    from models.onnx_models import kv_cache_step
    from tilekit.ir.dims import instantiate
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants

    path = tmp_path / "kv.onnx"
    onnx.save(kv_cache_step(hidden=64), str(path))
    symbolic_clock, specialised_clock = _Clock(), _Clock()
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "symbolic"))
    with symbolic_clock:
        symbolic = tilekit.compile(path, [])
        family = CompiledFamily(symbolic.module, symbolic.weights)
    programs = {}
    for past in DECODE_STEPS:
        values = {"seq": 1, "past": past}
        with symbolic_clock:
            instance, weights = fold_constants(instantiate(symbolic.module, values),
                                               symbolic.weights)
            programs[past] = [(family.program(instance, values, THREADS), weights)]
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "specialised"))
    for past in DECODE_STEPS:
        with specialised_clock:
            one = tilekit.compile(path, [], dims={"seq": 1, "past": past})
            programs[past].append(_program(one.module, one.weights))
    rows = {}
    for past in DECODE_STEPS[::8]:
        rng = np.random.default_rng(past)
        feeds = {"x": rng.standard_normal((1, 1, 64)).astype(np.float32),
                 "past_k": rng.standard_normal((1, past, 64)).astype(np.float32),
                 "past_v": rng.standard_normal((1, past, 64)).astype(np.float32)}
        (sym, sym_w), (spec, spec_w) = programs[past]
        a, b = sym.run(feeds, sym_w), spec.run(feeds, spec_w)
        np.testing.assert_allclose(a["y"], b["y"], rtol=1e-5, atol=1e-6)
        rows[str(past)] = _alternate(feeds, sym, sym_w, spec, spec_w)
    row = {
        "model": "kv_cache_step (hidden 64), decode", "sizes": {
            "seq": 1, "past": [DECODE_STEPS[0], DECODE_STEPS[-1]]},
        "compile": _compile_cost(symbolic_clock, family.builds, specialised_clock,
                                 len(DECODE_STEPS)),
        "run": rows,
    }
    print(f"\ndecode, {len(DECODE_STEPS)} steps: compile symbolic "
          f"{row['compile']['symbolic']['wall_s']} s ({family.builds} builds), specialised "
          f"{row['compile']['specialised']['wall_s']} s; run symbolic/specialised "
          + ", ".join(f"past {s}: {r['ratio']}" for s, r in rows.items()))
    _record(row)
