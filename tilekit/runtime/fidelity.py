"""Cost-model fidelity: the roll's top-k tiles per op, built, timed on a GPU and compared.

tk-roll ranks tiles by the micro performance model alone: `op.tile` is its pick and
`op.tile.candidates` the runners-up, best first. Roller profiles its top 10 on the device; this
module measures how well our ranking holds there (docs/roll.md, "Fidelity"):

1. `build_op(module, op, profile)`: one single-op module per candidate (the candidate in place
   of `op.tile`, as the full record tk-roll would have written had it picked it), each through
   `tilekit.codegen.generate`. Codegen does not always run a tile as written: it picks the
   kernel shape (staged, tiled, or default with the tile set aside) and may shrink a step to
   fit shared memory. What it used is kept beside each candidate, since that is part of what
   the model gets wrong. A candidate that fails to generate keeps its error; candidates whose
   kernels are the same code are compiled and timed once (`same_as`).
2. `compile_candidates(ops, arch)`: every kernel of every op in one nvcc translation unit (one
   nvcc call costs seconds); when it fails, one unit per op, then one per kernel, so that a bad
   kernel costs only itself.
3. A timer: `CudaTimer` (CuPy; per candidate one launch checked against the CPU reference
   executor, `warmup` launches, then `runs` launches each between two CUDA events with L2
   flushed before it; the median), or any callable `timer(op_build) -> {index: Timed}`: the
   tests inject one.
4. `measure` gives one row per op with `op_stats`; `summarize` the whole sample.

This module sits above codegen and the runtime; the roll pass never imports it.
Run on an H100 (2026-11-22, and 2026-11-28 on the model of that day: tests/bench/results/
fidelity-nvidia_h100_80gb_hbm3.json; docs/roll.md, "Fidelity"); the
rest is tested on the CPU (tests/unit/test_runtime_fidelity.py) and the kernels compile in
tests/bench/test_gpu_fidelity.py.
"""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilekit.codegen.kernel import GeneratedKernel
from tilekit.codegen.module import canonical_body, generate, unit_source
from tilekit.errors import IRError, TilekitError
from tilekit.ir.model import Kernel, Module, Op, default_kernels
from tilekit.roll.construct import Candidate, priced_splits
from tilekit.roll.cost import cost_tiles, machine
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.rtile import RTile
from tilekit.ir.graph import graph, op_analysis, op_tensors
from tilekit.roll.schedule import dtypes_of, roll_module, tile_record
from tilekit.schedule.shape import Target, analysis_facts
from tilekit.roll.workloads import Workload, load_workloads

#: The sample of the workload suite the benchmark measures: every SAMPLE_EVERY-th op.
SAMPLE_EVERY = 4
#: A pick within this factor of the best measured candidate counts as a good pick.
NEAR_BEST = 1.10
#: Largest relative difference from the CPU reference accepted, per output dtype.
TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}
DEFAULT_TOLERANCE = 1e-3


# -- building ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Built:
    """One candidate of one op, as codegen made it."""

    index: int                          # 0: the model's pick; then the runners-up, in order
    tile: Mapping[str, Any]             # the full tile record given to codegen
    kernel: GeneratedKernel | None = None
    notes: tuple[str, ...] = ()         # codegen's notes (a shrunk step, a shape fallback)
    error: str | None = None            # why it has no kernel
    same_as: int | None = None          # an earlier candidate whose kernel is the same code


@dataclass(frozen=True)
class OpBuild:
    """An op alone in a module (its pick's tile), and its candidates built."""

    name: str
    module: Module
    candidates: tuple[Built, ...]

    def kernels(self) -> list[GeneratedKernel]:
        """The kernels to compile and time: one per distinct code."""
        return [c.kernel for c in self.candidates if c.kernel is not None and c.same_as is None]


def op_module(module: Module, op: Op) -> Module:
    """`op` alone: the tensors it reads are inputs, the ones it writes outputs."""
    reads, writes = op_tensors(op)
    names = list(dict.fromkeys(reads + writes))
    tensors = {n: replace(module.tensors[n], role="output" if n in writes else "input")
               for n in names}
    return Module(model=f"{module.model}.{op.name}", tensors=tensors, ops=(op,),
                  inputs=tuple(n for n in names if n not in writes), outputs=tuple(writes),
                  kernels=default_kernels((op,)), hardware=module.hardware,
                  stages=module.stages)


def candidate_tiles(module: Module, op: Op, profile, where: str) -> list[dict[str, Any]]:
    """The pick and every runner-up of `op.tile` as full tile records (grid, blocks, threads,
    smem_bytes, regs re-costed by the model for `profile`; the estimate as tk-roll wrote it),
    so that each is a valid `tile` by itself; then, where the pick splits its reduction, the
    pick's tile at each other split the roll priced (`split_alternatives`): tk-roll splits
    only its pick, so without them the choice of slices would never be measured."""
    tile = op.tile
    if op.kind != "expr" or not isinstance(tile, Mapping) or "block" not in tile:
        raise IRError("the op has no tile from tk-roll", f"{where}.tile",
                      "run tk-roll --top-k 10 on this IR first")
    analysis = op_analysis(module, graph(module).index(op.name), f"{where}.expr")
    problem = problem_from_analysis(analysis, dtypes_of(module))
    facts = analysis_facts(analysis, dtypes_of(module))
    entries = [tile, *(tile.get("candidates") or ())]
    spatial = [a for a, _ in problem.spatial]
    reduction = [a for a, _ in problem.reduction]

    def columns(key: str, axes: list[str]) -> np.ndarray:
        try:
            rows = [[int(e[key][a]) for e in entries] for a in axes]
        except (KeyError, TypeError, ValueError) as exc:
            raise IRError(f"a candidate has no usable '{key}' size for axis {exc}",
                          f"{where}.tile.candidates", "re-run tk-roll on this IR") from None
        return np.array(rows, dtype=np.int64).reshape(len(axes), len(entries))

    block, thread, step = (columns("block", spatial), columns("thread", spatial),
                           columns("step", reduction))
    costs = cost_tiles(problem, machine(profile, problem.dtype), block, thread, step)
    out, cands = [], []
    for k, entry in enumerate(entries):
        rtile = RTile(tuple(int(b) for b in block[:, k]), tuple(int(t) for t in thread[:, k]),
                      tuple(int(s) for s in step[:, k]))
        cand = Candidate(rtile, costs.estimate(k), int(costs.smem_tile[k]), int(costs.regs[k]),
                         int(costs.threads[k]), int(costs.blocks[k]),
                         int(entry.get("split_k", 1)))      # (only the pick is split)
        record = tile_record(problem, [cand], facts, Target.of(profile)).tile
        # the tile's own estimate (tk-roll may have kept the default over its pick)
        own = entry.get("rolled_estimate") or entry.get("estimate") or record["estimate"]
        out.append({**record, "estimate": dict(own)})
        cands.append(cand)
    if cands[0].split > 1:       # the pick, its blocks unsplit
        out += [tile_record(problem, [c], facts, Target.of(profile)).tile
                for c in split_alternatives(problem, profile, cands[0], bool(costs.staged[0]))]
    return out


def split_alternatives(problem, profile, pick: Candidate, staged: bool) -> list[Candidate]:
    """`pick`'s tile (its `blocks` unsplit) split into each other number of slices the roll
    prices (`priced_splits`: a factor of `SPLIT_K` each; a staged tile's slices as
    tilekit.schedule.shape.staged_split cuts them), fewest slices first, each with the
    model's estimate."""
    priced = priced_splits(problem, machine(profile, problem.dtype), [pick.tile], staged)
    seen = {pick.split}
    out = []
    for of_the_tile in priced.values():
        est, slices = of_the_tile[0]
        if slices < 2 or slices in seen or not est.time_us < np.inf:
            continue
        seen.add(slices)
        out.append(replace(pick, estimate=est, blocks=pick.blocks * slices, split=slices))
    return sorted(out, key=lambda c: c.split)


def build_op(module: Module, op_name: str, profile) -> OpBuild:
    """Every candidate of `op_name` generated as its own kernel (see the module docstring).

    Kernels are named `<op>__c<index>`, so the candidates of several ops can share one
    translation unit. Raises TilekitError when the op has no rolled tile."""
    index = module.op_index()[op_name]
    op = module.ops[index]
    where = f"ops[{index}] ({op.name})"
    tiles = candidate_tiles(module, op, profile, where)
    alone = op_module(module, op)
    built: list[Built] = []
    first_of: dict[str, int] = {}
    for i, tile in enumerate(tiles):
        candidate = replace(alone, ops=(replace(op, tile=tile),),
                            kernels=(Kernel(f"{op.name}__c{i}", (op.name,)),))
        try:
            result = generate(candidate, profile)
        except Exception as exc:  # noqa: BLE001 - one candidate's failure is a finding
            built.append(Built(i, tile, error=f"codegen: {type(exc).__name__}: {exc}"))
            continue
        kernel = result.kernels[0]
        same = first_of.setdefault(canonical_body(kernel), i)
        built.append(Built(i, tile, kernel, tuple(result.notes),
                           same_as=None if same == i else same))
    return OpBuild(op.name, replace(alone, ops=(replace(op, tile=tiles[0]),)), tuple(built))


def suite_sample(every: int = SAMPLE_EVERY) -> list[Workload]:
    """Every `every`-th workload of specs/workloads.yaml, in file order (deterministic)."""
    return load_workloads()[::every]


def tensor_core_sample() -> list[Workload]:
    """The shapes the tensor-core (`mma`) kernels are for: the suite's half-precision
    workloads and the square fp16 GEMM of the cuBLAS comparison (tests/bench/test_gpu_bench.py)."""
    half = [w for w in load_workloads() if w.dtype in ("float16", "bfloat16")]
    square = Workload("matmul_4096_fp16", "y[i,j] += a[i,k] * b[k,j]",
                      {"a": (4096, 4096), "b": (4096, 4096), "y": (4096, 4096)},
                      "the 4096^3 GEMM of the cuBLAS comparison", dtype="float16")
    return half + [square]


def build_sample(profile, workloads: Sequence[Workload], top_k: int = 10) -> list[OpBuild]:
    """`workloads` rolled for `profile` with `top_k`, each op's candidates built."""
    built = []
    for w in workloads:
        rolled = roll_module(w.module(), profile, top_k)
        built.append(build_op(rolled, rolled.ops[0].name, profile))
    return built


def build_suite_sample(profile, top_k: int = 10, every: int = SAMPLE_EVERY) -> list[OpBuild]:
    """The sample's workloads rolled for `profile` with `top_k`, each op's candidates built."""
    return build_sample(profile, suite_sample(every), top_k)


def build_tensor_core_sample(profile, top_k: int = 10) -> list[OpBuild]:
    """`tensor_core_sample` rolled for `profile` with `top_k`, each op's candidates built."""
    return build_sample(profile, tensor_core_sample(), top_k)


# -- compiling ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """One translation unit: its source, the cubin nvcc made of it, the entries it holds."""

    source: str
    cubin: Path
    entries: tuple[str, ...]


@dataclass(frozen=True)
class CompiledSet:
    arch: str
    units: tuple[Unit, ...]
    resources: Mapping[str, Any]        # entry -> tilekit.codegen.nvcc.Resources
    errors: Mapping[str, str]           # entry -> why it did not compile
    seconds: float

    def unit_of(self, entry: str) -> Unit | None:
        for unit in self.units:
            if entry in unit.entries:
                return unit
        return None


def compile_candidates(ops: Sequence[OpBuild], arch: str, jobs: int = 1) -> CompiledSet:
    """Compile every distinct kernel of `ops` for `arch` with nvcc (a unit holding a wgmma
    kernel for sm_90a on Hopper, as codegen builds modules): all of them as one unit
    (`jobs` > 1: that many units, compiled in parallel); a unit that fails is split into one
    unit per op, then one per kernel, and the kernels that still fail keep nvcc's message.
    Raises TilekitError only when nvcc is missing."""
    from tilekit.codegen.nvcc import CompileError, compile_unit, find_nvcc, unit_arch

    if find_nvcc() is None:
        raise TilekitError("nvcc was not found on PATH", "fidelity",
                           "install the CUDA toolkit or set TILEKIT_NVCC")
    groups = [op.kernels() for op in ops if op.kernels()]
    entries = [k.entry for g in groups for k in g]
    if len(set(entries)) != len(entries):
        raise TilekitError("two candidate kernels have the same entry name", "fidelity",
                           "give the ops distinct names")
    start = time.monotonic()
    units: list[Unit] = []
    resources: dict[str, Any] = {}
    errors: dict[str, str] = {}

    def attempt(kernels: list[GeneratedKernel], parts: list[list[GeneratedKernel]]) -> None:
        source = unit_source(kernels)
        try:
            done = compile_unit(source, unit_arch(arch, (k.shape for k in kernels)))
        except CompileError as exc:
            if len(kernels) == 1:
                errors[kernels[0].entry] = f"nvcc: {exc}"
                return
            for part in parts if len(parts) > 1 else [[k] for k in kernels]:
                attempt(part, [])
            return
        units.append(Unit(source, done.cubin, tuple(k.entry for k in kernels)))
        resources.update({k.entry: done.resources[k.entry] for k in kernels
                          if k.entry in done.resources})

    chunks = _chunks(groups, max(1, jobs))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(lambda chunk: attempt([k for g in chunk for k in g], chunk), chunks))
    return CompiledSet(arch, tuple(units), resources, errors,
                       round(time.monotonic() - start, 2))


def _chunks(groups: list[list[GeneratedKernel]], n: int) -> list[list[list[GeneratedKernel]]]:
    """`groups` (one per op, never split) dealt into at most `n` chunks of similar size."""
    chunks: list[list[list[GeneratedKernel]]] = [[] for _ in range(min(n, len(groups)))]
    sizes = [0] * len(chunks)
    for g in sorted(groups, key=len, reverse=True):
        k = sizes.index(min(sizes))
        chunks[k].append(g)
        sizes[k] += len(g)
    return [c for c in chunks if c]


# -- timing ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timed:
    """One candidate's measurement: the median time, or why there is none."""

    seconds: float | None = None
    error: str | None = None            # set also when timed but wrong (then not ranked)
    max_rel_err: float | None = None    # against the CPU reference executor
    resources: Mapping[str, int] | None = None  # ptxas: registers, spills, ...


Timer = Callable[[OpBuild], Mapping[int, Timed]]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| over the finite values of `want`; inf where the
    non-finite values (NaN, inf) of the two differ."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)) or \
            not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return math.inf
    if not finite.any():
        return 0.0
    scale = max(float(np.abs(want[finite]).max()), 1e-30)
    return float(np.abs(got[finite] - want[finite]).max()) / scale


class CudaTimer:
    """Times candidate kernels on the current CUDA device (see the module docstring).

    Inputs are `tilekit.runtime.io.random_input` values (`seed`); every candidate of an op
    runs on the same buffers. Before each timed launch, a buffer twice the size of L2 is
    cleared so that inputs come from DRAM, as the model's compulsory traffic assumes
    (`flush_l2=False` keeps them warm instead). Raises TilekitError without CuPy or a GPU.
    """

    def __init__(self, compiled: CompiledSet, runs: int = 20, warmup: int = 3,
                 flush_l2: bool = True, check: bool = True, seed: int = 0):
        from tilekit.runtime import cuda

        cuda.device_arch()  # a TilekitError without CuPy or a device
        import cupy

        self.cupy = cupy
        self.compiled = compiled
        self.runs, self.warmup, self.check, self.seed = runs, warmup, check, seed
        attrs = cupy.cuda.Device().attributes
        self.smem_limit = int(attrs.get("MaxSharedMemoryPerBlockOptin") or 48 * 1024)
        self.regs_limit = int(attrs.get("MaxRegistersPerBlock") or 65536)
        l2 = int(attrs.get("L2CacheSize") or 0)
        self.flush = cupy.empty(max(2 * l2, 1 << 20), dtype=cupy.uint8) if flush_l2 else None
        # A cubin from a toolkit newer than the driver does not load: NVRTC then.
        self.nvrtc = cuda.usable_nvcc(cupy) is None
        self._loaded: dict[Path, Any] = {}

    def _function(self, entry: str):
        from tilekit.codegen.helpers import HELPERS

        unit = self.compiled.unit_of(entry)
        if unit.cubin not in self._loaded:
            if self.nvrtc:
                raw = self.cupy.RawModule(code=unit.source, backend="nvrtc",
                                          options=("-std=c++17", f"-I{HELPERS.parent}"))
            else:
                raw = self.cupy.RawModule(path=str(unit.cubin))
            self._loaded[unit.cubin] = raw
        return self._loaded[unit.cubin].get_function(entry)

    def __call__(self, op: OpBuild) -> dict[int, Timed]:
        from tilekit.runtime.cpu import run_module
        from tilekit.runtime.io import random_input

        module = op.module
        out = module.outputs[0]
        inputs = {n: random_input(module.tensors[n], self.seed, i)
                  for i, n in enumerate(module.inputs)}
        want = run_module(module, inputs, {})[out] if self.check else None
        tol = TOLERANCE.get(module.tensors[out].dtype, DEFAULT_TOLERANCE)
        buffers = {n: self.cupy.asarray(np.ascontiguousarray(v)) for n, v in inputs.items()}
        tensor = module.tensors[out]
        buffers[out] = self.cupy.empty(tensor.shape, dtype=np.dtype(tensor.dtype))
        return {c.index: self.time_kernel(c.kernel, buffers, out, want, tol)
                for c in op.candidates if c.kernel is not None and c.same_as is None}

    def time_kernel(self, k: GeneratedKernel, buffers, out: str, want, tol: float) -> Timed:
        cupy = self.cupy
        if k.entry in self.compiled.errors:
            return Timed(error=self.compiled.errors[k.entry])
        res = self.compiled.resources.get(k.entry)
        record = res.record() if res is not None else None
        threads = math.prod(k.block)
        if res is not None:
            # Registers are allocated per warp in units of 256 (as compile_module counts).
            regs_block = -(-res.registers * 32 // 256) * 256 * -(-threads // 32)
            if regs_block > self.regs_limit:
                return Timed(error=f"needs {regs_block} registers per block, the device has "
                             f"{self.regs_limit}", resources=record)
            if res.smem_static + k.smem_bytes > self.smem_limit:
                return Timed(error=f"needs {res.smem_static + k.smem_bytes} B of shared "
                             f"memory, the device allows {self.smem_limit}", resources=record)
        stream = cupy.cuda.get_current_stream()
        try:
            fn = self._function(k.entry)
            if k.smem_bytes > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = int(k.smem_bytes)
            # a split-K kernel's partial sums (scratch) and per-tile counters, zeroed before
            # every launch (as tilekit.runtime.cuda does), outside the timed interval
            scratch = {n: cupy.empty(int(size), dtype=np.float32)
                       for n, size in k.scratch.items()}
            args = tuple(scratch[t] if t in scratch else buffers[t] for t in k.args)
            counters = cupy.zeros(k.counters, dtype=np.uint32) if k.counters else None
            if counters is not None:
                args += (counters,)

            def reset():
                if counters is not None:
                    counters.fill(0)

            def launch():
                fn(k.grid, k.block, args, shared_mem=k.smem_bytes)

            err = None
            if want is not None:
                # NaN (all bits set) first: a point the kernel never writes shows up.
                target = buffers[out]
                cupy.cuda.runtime.memsetAsync(target.data.ptr, 0xFF, target.nbytes, stream.ptr)
                reset()
                launch()
                stream.synchronize()
                err = relative_error(target.get(), want)
            for _ in range(self.warmup):
                reset()
                launch()
            stream.synchronize()
            times = []
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            for _ in range(self.runs):
                if self.flush is not None:
                    cupy.cuda.runtime.memsetAsync(self.flush.data.ptr, 0, self.flush.nbytes,
                                                  stream.ptr)
                reset()
                start.record(stream)
                launch()
                stop.record(stream)
                stop.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
        except Exception as exc:  # noqa: BLE001 - a launch failure is this candidate's result
            return Timed(error=f"launch: {type(exc).__name__}: {exc}", resources=record)
        wrong = None if err is None or err <= tol else \
            f"result differs from the CPU reference by {err:.3g} (tolerance {tol:g})"
        return Timed(statistics.median(times), wrong, err, record)


# -- statistics --------------------------------------------------------------------------

def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the average ranks); None when it is not
    defined: fewer than 3 pairs, or all of one side tied."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = np.array(average_ranks(x)), np.array(average_ranks(y))
    dx, dy = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    return None if norm == 0 else float((dx * dy).sum()) / norm


def geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def op_stats(estimated: Sequence[float], measured: Sequence[float | None]) -> dict[str, Any]:
    """How the model ranked one op's candidates; index 0 is its pick, `None` not measured.

    `top1_over_best`: the pick's measured time over the best measured (>= 1; None when the
    pick was not measured); `pick_rank`: 1 + the candidates measured strictly faster;
    `spearman`: estimated vs measured over the measured candidates; `estimated_over_measured`:
    of the pick."""
    pairs = [(e, t) for e, t in zip(estimated, measured) if t is not None]
    out: dict[str, Any] = {"measured": len(pairs), "best_index": None, "best_us": None,
                           "top1_us": None, "top1_over_best": None, "pick_rank": None,
                           "spearman": None, "estimated_over_measured": None}
    if not pairs:
        return out
    times = [t for _, t in pairs]
    best = min(times)
    out["best_index"] = next(i for i, t in enumerate(measured) if t == best)
    out["best_us"] = best
    out["spearman"] = spearman([e for e, _ in pairs], times)
    pick = measured[0]
    if pick is not None:
        out.update(top1_us=pick, top1_over_best=pick / best,
                   pick_rank=1 + sum(t < pick for t in times),
                   estimated_over_measured=estimated[0] / pick)
    return out


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sample's figures from `measure`'s rows (docs/roll.md, "Fidelity")."""
    ratios = [r["top1_over_best"] for r in rows if r["top1_over_best"] is not None]
    rhos = [r["spearman"] for r in rows if r["spearman"] is not None]
    cands = [c for r in rows for c in r["candidates"]]
    shapes: dict[str, int] = {}
    for c in cands:
        shapes[c.get("shape") or "none"] = shapes.get(c.get("shape") or "none", 0) + 1
    return {
        "ops": len(rows),
        "ops_ranked": len(ratios),
        "geomean_top1_over_best": geomean(ratios),
        "top1_within_10pct": len([r for r in ratios if r <= NEAR_BEST]) / len(ratios)
        if ratios else None,
        "top1_is_best": len([r for r in ratios if r == 1.0]) / len(ratios) if ratios else None,
        "median_spearman": statistics.median(rhos) if rhos else None,
        "ops_with_spearman": len(rhos),
        "geomean_estimated_over_measured": geomean(
            [r["estimated_over_measured"] for r in rows]),
        "candidates": len(cands),
        "candidates_measured": len([c for c in cands if c["measured_us"] is not None
                                    and not c["error"]]),
        "candidates_failed": len([c for c in cands if c["error"]]),
        "shapes": dict(sorted(shapes.items())),
        "steps_shrunk": len([c for c in cands if any("shrunk" in n for n in c["notes"])]),
        "tiles_set_aside": len([c for c in cands if "tile_ignored" in (c["schedule"] or {})]),
    }


# -- rows --------------------------------------------------------------------------------

def candidate_row(c: Built, timed: Timed | None) -> dict[str, Any]:
    """One candidate as the report lists it: what the roll asked, what codegen made, what the
    device measured."""
    k = c.kernel
    est = c.tile["estimate"]
    timed = timed or Timed(error=None if c.error else "not timed")
    return {
        "index": c.index,
        "block": dict(c.tile["block"]), "thread": dict(c.tile["thread"]),
        "step": dict(c.tile["step"]),
        "estimated_us": est["time_us"], "bound": est.get("bound"),
        "regs_model": c.tile.get("regs"), "smem_model": c.tile.get("smem_bytes"),
        "shape": k.shape if k else None,
        "schedule": dict(k.schedule) if k else None,
        "launch": {"grid": list(k.grid), "block": list(k.block), "smem_bytes": k.smem_bytes}
        if k else None,
        "notes": list(c.notes),
        "same_kernel_as": c.same_as,
        "measured_us": None if timed.seconds is None else round(timed.seconds * 1e6, 3),
        "max_rel_err": timed.max_rel_err,
        "resources": dict(timed.resources) if timed.resources else None,
        "error": c.error or timed.error,
    }


def measure(ops: Sequence[OpBuild], timer: Timer) -> list[dict[str, Any]]:
    """One row per op: its candidates (`candidate_row`) and `op_stats` over the ones measured
    without error. A timer that raises marks every candidate of that op with the error."""
    rows = []
    for op in ops:
        try:
            timed = dict(timer(op))
        except Exception as exc:  # noqa: BLE001 - the op's failure is recorded, not fatal
            timed = {c.index: Timed(error=f"timer: {type(exc).__name__}: {exc}")
                     for c in op.candidates}
        cands = []
        for c in op.candidates:
            t = timed.get(c.index if c.same_as is None else c.same_as)
            cands.append(candidate_row(c, t))
        estimated = [c["estimated_us"] for c in cands]
        measured = [c["measured_us"] if c["error"] is None else None for c in cands]
        main = op.module.ops[0]
        rows.append({"op": op.name, "expr": main.expr,
                     "dtype": op.module.tensors[op.module.outputs[0]].dtype,
                     **op_stats(estimated, measured), "candidates": cands})
    return rows


def format_table(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    """The rows and the summary as aligned text (times in us)."""
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = ("op", "cands", "pick_us", "best_us", "pick/best", "rank", "spearman", "est_us",
            "est/meas", "shapes")
    lines = [head]
    for r in rows:
        shapes: dict[str, int] = {}
        for c in r["candidates"]:
            s = c["shape"] or "error"
            shapes[s] = shapes.get(s, 0) + 1
        lines.append((r["op"], f"{r['measured']}/{len(r['candidates'])}",
                      num(r["top1_us"], ".2f"), num(r["best_us"], ".2f"),
                      num(r["top1_over_best"], ".2f"), num(r["pick_rank"], "d"),
                      num(r["spearman"], ".2f"), num(r["candidates"][0]["estimated_us"], ".2f"),
                      num(r["estimated_over_measured"], ".2f"),
                      " ".join(f"{s}:{n}" for s, n in sorted(shapes.items()))))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    s = summary
    text.append(
        f"{s['ops_ranked']} of {s['ops']} ops ranked: pick/best geomean "
        f"{num(s['geomean_top1_over_best'], '.3f')}, pick within 10% of best "
        f"{num(s['top1_within_10pct'], '.0%')}, pick is best {num(s['top1_is_best'], '.0%')}, "
        f"median Spearman {num(s['median_spearman'], '.2f')} ({s['ops_with_spearman']} ops), "
        f"estimated/measured geomean {num(s['geomean_estimated_over_measured'], '.2f')}; "
        f"{s['candidates_measured']} of {s['candidates']} candidates measured, "
        f"{s['candidates_failed']} failed")
    return "\n".join(text)
