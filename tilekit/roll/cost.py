"""The micro performance model: how long one tiled op (or a group of them) takes on a profile.

This is tilekit's shared cost model: tk-roll ranks tiles with it, and later stages (tk-weld,
tk-ram) estimate groups and schedules with the same functions. Everything here is a pure
function of a `Problem` (tilekit.roll.problem), tile sizes and a `Profile`; the tile-size
arguments are NumPy arrays so that a whole set of candidates is costed in one call.

The model (docs/roll.md has the derivation and the distributed-machine mapping):

    time = max(compute / sm_busy, shared-memory traffic / sm_busy, global traffic)
           + staging latency + launch
    sm_busy = wave_efficiency x saturation x lanes

- compute: padded iteration points x flops per point, over the SIMT peak of the output dtype
  x the achievable SIMT compute fraction (`achievable.compute`, not `compute_tensor`: the
  tiles tk-roll makes run on CUDA cores);
- shared memory (ops with a reduction: their input tiles are staged per step): the staged
  bytes written, plus every thread's register-tile operands read once per reduction point,
  over the device's shared-memory bandwidth x achievable;
- waves: `r` blocks on `m = SMs x blocks-per-SM` slots (occupancy from threads, registers,
  shared memory and the per-SM block limit) run with efficiency `r / (m * ceil(r/m))`; a grid
  smaller than one full wave is spread over the SMs first (`blocks-per-SM` is then
  `ceil(r / SMs)`); an SM holding fewer than the warps that hide its kernel's latency
  (`SATURATING_WARPS`; `HIDING_WARPS` for CUDA-core reductions that wait on their loads,
  fitted on an H200 profile and H100 timings) issues at that fraction of its peak
  (saturation); a block that does not fill whole warps idles the rest of its last warp
  (lanes). A persistent wgmma kernel (`tilekit.schedule.mma.persistent_blocks`: `m`
  blocks, each looping over tiles `blockIdx + i x m`) has the same quantisation, its busiest
  block running `ceil(r/m)` tiles, so `r` counts its tiles and it is priced as these waves
  (the epilogue it overlaps with the next tile's loads is not priced either way);
- global: each block loads its input tiles once per reduction step and stores its output
  tile, every contiguous run rounded up to whole transactions. On a SIMT GPU, what is
  re-read is served by L2 when the op's tensors fit in it, by DRAM otherwise; the compulsory
  bytes (each tensor once) always come from DRAM. On a distributed machine every tile's loads
  cross the exchange (no shared cache, no reuse between tiles). The level is device-wide, so
  it is not divided by the wave efficiency; instead the busiest SM's bytes (`ceil(r/SMs)`
  blocks, over its lanes and saturation) must pass its port, its share of the L2 (exchange)
  bandwidth;
- staging latency (staged kernels only): every reduction step a block loads its boxes and
  waits at a barrier before computing, so the loads' round trip (`memory[dram].latency`) is
  paid once per step, hidden only by the other blocks resident on the SM:
  `ceil(blocks / (SMs x resident)) x steps x latency`. Fitted on the H100 fidelity run
  (docs/roll.md, "Fidelity"): without it the model ranked the top-10 candidates with a median
  Spearman of 0.10, with it 0.71;
- launch: the profile's `launch.overhead` (seconds, `Profile.launch_overhead`) when it states
  one, else 0. Every kernel pays it; it is why fusing kernels pays off for small ops (Rammer).

Monotone by construction: more bandwidth anywhere, or more SMs each as before (device peaks
and L2/exchange bandwidth growing with the count), never gives a longer time.

Public API (docs/roll.md): `Machine` / `machine(profile, dtype)`; `TileCosts` /
`cost_tiles(problem, machine, block, thread, step)` with sizes as (n_axes, n) arrays, one
column per candidate; `Estimate` (one candidate, `as_dict()` with 4 significant digits);
`estimate_bytes(...)` for ops known only by their bytes; `combine_estimates(...)`;
`wave_efficiency(blocks, slots)`; `registers_per_thread(...)`; `round_sig(x)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from tilekit.hw.profile import Profile
from tilekit.ir.payloads import BOUNDS, Estimate
from tilekit.roll.problem import Problem, walks_reduction
from tilekit.schedule.defaults import DEFAULT_REGS, DEFAULT_THREADS, WARP, default_grid
from tilekit.schedule.mma import (MMA, WGMMA, compute_type, mma_plan, offered, wgmma_offered,
                                  wgmma_plan)
from tilekit.schedule.residency import blocks_per_sm
from tilekit.schedule.shape import MIN_REUSE, SMEM_ALIGN, STREAM_RATIO
from tilekit.schedule.simt import simt_plan

#: Registers a thread spends beyond its tile (addresses, loop counters, predicates).
REG_OVERHEAD = 12
#: Warps an SM needs to issue at its peak (one per scheduler: 4 on every NVIDIA SM since
#: Maxwell); fewer leave issue slots idle. Capped by the profile's warps per SM.
SATURATING_WARPS = 4
#: Warps an SM needs to hide the latency of a CUDA-core reduction kernel that is not
#: software-pipelined (`staged`, `tiled`: each reduction point loads its fragments and then
#: folds them, each step waits at barriers). Fitted on Nsight Compute's profile of ResNet-50
#: at batch 1 on an H200 (docs/roll.md, "Occupancy and latency hiding"): with one block of
#: 3.5-4 warps per SM five such convolutions issued on 9-25% of cycles (no eligible warp on
#: 75-82%) and ran 2.0-2.6x the time this model gave them at `SATURATING_WARPS`; 12 warps
#: (3 per scheduler) reproduces 4 of the 5 within 25%. A SIMT GEMM whose operands are all
#: gathered element by element (no 16-byte loads: convolutions as implicit GEMMs) needs them
#: too: on an H100 (2026-11-27) such convolutions with one block of 4 warps per SM (VGG-19's
#: 56x56 3x3 layers, Inception v1's `n6_conv`) ran 2.2-2.5x the time this model gave them at
#: `SATURATING_WARPS`, one with 16 warps per SM (VGG-19's `n2_conv`) 1.4x. Capped by the
#: profile's warps per SM.
HIDING_WARPS = 12
#: Registers are allocated per warp in units of this many per thread (NVIDIA: 8).
REG_GRANULE = 8
#: Registers ptxas gives a staged kernel beyond its accumulators: the box loaders' 64-bit
#: addresses, block-origin decoding, loop counters and fragments loaded ahead of use. Fitted
#: with ptxas 13.0 for sm_90 on the 119-op suite (`STAGED_BASE + 1.5 x accumulators`, ptxas
#: within 0.6x-1.6x of it); tests/unit/test_shape_agreement.py prints the spread.
STAGED_BASE = 60
#: A tiled kernel's reduction loop of at least `LONG_LOOP` points is unrolled by ptxas with
#: its loads issued ahead of use: about this many registers more (88-93 against 16-24).
LOOP_PREFETCH = 64
LONG_LOOP = 64
#: On a machine with wgmma, the share of the achievable tensor-core rate that the mma.sync
#: kernel reaches. Measured: fp16 4096^3 through the mma.sync kernel ran at 272 TFLOP/s on
#: this project's H100 SXM (docs/codegen.md), 0.34 of 0.81 x 989.4 TFLOP/s (the profile's
#: achievable rate, measured with cuBLAS's wgmma kernels).
MMA_SYNC_SHARE = 0.34
#: Registers ptxas gives a SIMT GEMM kernel beyond its tile's (accumulators, fragments, the
#: next step's chunks): `SIMT_BASE + step` (addresses, the unrolled step's hoisted index
#: math). ptxas 13.0, sm_90: 124 for 128x128x8 (8x8 per thread), 197 for 64x128x32, 77 for
#: 64x64x8 (4x4), 94 for 128x64x16 (8x4); this gives 128, 196, 76, 108.
SIMT_BASE = 36


@dataclass(frozen=True, eq=False)
class Machine:
    """A profile as the model reads it: the profile itself (`hw`, for its limits) and the
    figures derived from it for one dtype, scaled by the achievable fractions (s, B, B/s,
    FLOP/s).

    `global_bw` is the bandwidth of the level that serves tile loads: DRAM, L2 (`l2_bw`, used
    when the op's tensors fit in `hw.l2_bytes`) or, on a distributed machine, the exchange.
    """

    hw: Profile  # limits (threads, registers, shared memory, SMs) are read from here
    smem_bw: float
    dram_bw: float
    l2_bw: float
    exchange_bw: float
    transaction_bytes: int
    peak: float
    launch_s: float
    #: A synchronous staging step's latency (the profile's `memory[dram].latency`; 0: none).
    step_latency: float = 0.0
    #: The tensor-core compute types the profile offers (tilekit.schedule.mma.offered) and
    #: the fp32 precision setting ("tf32" lets fp32 contractions use them).
    mma_offered: frozenset = frozenset()
    precision: str = "fp32"
    #: The compute types it runs on wgmma (Hopper; tilekit.schedule.mma.wgmma_offered).
    wgmma_offered: frozenset = frozenset()

    @property
    def distributed(self) -> bool:
        return self.hw.kind == "distributed"


#: (id(profile), dtype) -> (profile, Machine). The profile is kept so that its id stays unique;
#: hashing a Profile hashes its whole content, too slow for a per-op lookup.
_MACHINES: dict[tuple[int, str], tuple[object, Machine]] = {}


def machine(profile, dtype: str = "float32", precision: str = "fp32") -> Machine:
    """The model's view of `profile` for ops computing in `dtype` (SIMT peak; fp32 when the
    profile has no peak for `dtype`, e.g. integer or bool outputs); `precision` says whether
    fp32 contractions may use TF32 tensor cores."""
    hit = _MACHINES.get((id(profile), dtype, precision))
    if hit is not None and hit[0] is profile:
        return hit[1]
    if len(_MACHINES) > 256:
        _MACHINES.clear()
    m = _make_machine(profile, dtype, precision)
    _MACHINES[(id(profile), dtype, precision)] = (profile, m)
    return m


def _make_machine(profile, dtype: str, precision: str = "fp32") -> Machine:
    a = profile.achievable
    key = dtype if profile.has_peak(dtype) else "float32"
    l2_bw = (profile.l2_bandwidth or profile.dram_bandwidth) * a.dram
    return Machine(
        hw=profile,
        smem_bw=profile.smem_bandwidth * a.smem, dram_bw=profile.dram_bandwidth * a.dram,
        l2_bw=l2_bw,
        exchange_bw=(profile.exchange_bandwidth or 0.0) * a.dram,
        # A distributed machine has no DRAM sector between tiles: its loads are the tile
        # memory's aligned accesses.
        transaction_bytes=(profile.smem_transaction_bytes if profile.kind == "distributed"
                           else profile.transaction_bytes),
        peak=profile.peak_flops(key) * a.compute,
        launch_s=float(profile.launch_overhead or 0.0),
        step_latency=float(profile.dram_latency or 0.0),
        mma_offered=offered(profile), precision=precision,
        wgmma_offered=wgmma_offered(profile))


def wave_efficiency(blocks, slots):
    """Fraction of the device busy over the waves: `r / (m * ceil(r/m))`."""
    blocks = np.asarray(blocks, dtype=np.float64)
    slots = np.maximum(np.asarray(slots, dtype=np.float64), 1.0)
    waves = np.ceil(blocks / slots)
    return blocks / (slots * np.maximum(waves, 1.0)), waves


def _rounded_bytes(total: np.ndarray, run: np.ndarray, itemsize: int, txn: int) -> np.ndarray:
    """Bytes moved for `total` elements read in contiguous runs of `run` elements: each run
    rounded up to whole transactions."""
    runs = total // np.maximum(run, 1)
    return runs * (-(-(run * itemsize) // txn) * txn)


def registers_per_thread(problem: Problem, thread: np.ndarray,
                         staged: np.ndarray | bool = False, ptxas: bool = False) -> np.ndarray:
    """32-bit registers a thread needs for thread tiles `thread` (n_spatial, n): its
    accumulators, one reduction point's operands from each input, and `REG_OVERHEAD`; with
    `ptxas` (kernels tk-codegen generates for an NVIDIA GPU), at least what ptxas gives the
    kernel shape (`STAGED_BASE` for staged kernels, `LOOP_PREFETCH` more for a tiled kernel's
    long reduction loop); rounded up to the allocation granule."""
    n = thread.shape[1]
    sizes = np.vstack([thread, np.ones((len(problem.axes) - problem.n_spatial, n),
                                       dtype=np.int64)])
    regs = -(-(thread.prod(axis=0) * max(problem.out_itemsize, 4)) // 4)
    for op in problem.operands:
        regs = regs + -(-(op.footprint(sizes) * op.itemsize) // 4)
    regs = regs + REG_OVERHEAD
    if ptxas:
        acc = thread.prod(axis=0)
        regs = np.where(staged, np.maximum(regs, STAGED_BASE + (3 * acc) // 2), regs)
        if problem.reduction_points >= LONG_LOOP:
            regs = np.where(staged, regs, regs + LOOP_PREFETCH)
    return -(-regs // REG_GRANULE) * REG_GRANULE


@dataclass
class TileCosts:
    """The model's figures for a set of candidates (arrays of one shape).

    `staged` says which candidates the shared shape decision (tilekit.schedule.shape) makes
    `staged` kernels, `lanes_default` which become default kernels with a warp per point
    (their tile set aside); `box_bytes` is what a block would stage per step, `smem_tile`
    what it does (the tile contract's `smem_bytes`: `box_bytes` where staged, else 0);
    `smem_bytes` the shared-memory traffic of the whole op; `dram_bytes` its global-memory
    traffic (loads and stores as issued by the blocks). `valid` is False where a capacity
    limit is broken.
    """

    time_s: np.ndarray
    flops: float
    dram_bytes: np.ndarray
    smem_bytes: np.ndarray
    smem_tile: np.ndarray
    box_bytes: np.ndarray
    staged: np.ndarray
    lanes_default: np.ndarray
    regs: np.ndarray
    threads: np.ndarray
    blocks: np.ndarray
    blocks_per_sm: np.ndarray
    waves: np.ndarray
    wave_eff: np.ndarray
    bound: np.ndarray          # index into BOUNDS
    valid: np.ndarray
    t_compute: np.ndarray
    t_smem: np.ndarray
    t_global: np.ndarray
    t_traffic: np.ndarray      # the blocks' global traffic over the bandwidth serving it
                               # (no wave or port effects): the scale-up stop criterion
    t_latency: np.ndarray      # the staging round trips, part of time_s (0 where unstaged)

    def estimate(self, k: int) -> "Estimate":
        """Candidate `k`'s estimate."""
        return Estimate(time_us=float(self.time_s[k]) * 1e6, flops=self.flops,
                        dram_bytes=float(self.dram_bytes[k]),
                        smem_bytes=float(self.smem_bytes[k]),
                        bound=BOUNDS[int(self.bound[k])], waves=int(self.waves[k]),
                        wave_efficiency=float(self.wave_eff[k]),
                        latency_us=float(self.t_latency[k]) * 1e6)


def as_columns(rows, n: int) -> np.ndarray:
    """Tile sizes as a (len(rows), n) int64 array (one column per candidate); each row may be
    a scalar or a length-n sequence."""
    if not len(rows):
        return np.zeros((0, n), dtype=np.int64)
    return np.broadcast_to(np.asarray(rows, dtype=np.int64).reshape(len(rows), -1),
                           (len(rows), n)).copy()


def cost_tiles(problem: Problem, m: Machine, block: np.ndarray, thread: np.ndarray,
               step: np.ndarray, unique: float | None = None,
               gemms: bool = True) -> TileCosts:
    """Cost candidates given as columns: `block` and `thread` are (n_spatial, n) int arrays,
    `step` is (n_reduction, n). The phases, in order: the shared shape decision, the global
    traffic, the shared-memory traffic, occupancy, then the times. `unique`: the compulsory
    bytes when they are not the problem's own (a split-K slice problem's). `gemms`: whether
    the tensor-core and SIMT GEMMs are among the shapes (a staged tile's split-K slices run
    as the staged kernel that was split, whatever the slice problem would allow)."""
    ns = problem.n_spatial
    n = max(np.shape(block)[1] if ns else 1, np.shape(step)[1] if len(step) else 1)
    if not (np.shape(block) == np.shape(thread) == (ns, n) and np.shape(step)[0] == len(
            problem.axes) - ns and (not len(step) or np.shape(step)[1] == n)):
        block, thread, step = (as_columns(block, n), as_columns(thread, n),
                               as_columns(step, n))
    g = _Grid(problem, block, thread, step)
    staged, box_bytes = _decide_staging(problem, g)
    tc = _tensor_core_plans(problem, m, g) if gemms else _no_plans(g.n)
    simt = _simt_plans(problem, m, g, thread, tc.on) if gemms else _no_plans(g.n)
    staged = staged & ~tc.on & ~simt.on
    # (A CUDA code generator's decision: a distributed machine has no lanes to give.)
    lanes_default = (~staged & ~tc.on & ~simt.on & problem.has_reduction
                     & (problem.lanes >= WARP) & (not m.distributed))
    smem_tile = np.where(tc.on, tc.smem, np.where(simt.on, simt.smem,
                                                  np.where(staged, box_bytes, 0)))
    loads, stores = _global_traffic(problem, g, m.transaction_bytes)
    dram_bytes = (g.blocks * (loads + stores)).astype(np.float64)

    # Shared memory (staged kernels): staged bytes written, register-tile operands read per
    # reduction point.
    unit = np.vstack([thread, np.ones_like(step)])
    per_point = np.zeros(g.n, dtype=np.int64)
    for op in problem.operands:
        per_point = per_point + op.footprint(unit) * op.itemsize
    smem_traffic = np.where(staged, (g.blocks * g.threads * g.red_points * per_point).astype(
        np.float64) + (g.blocks * g.nsteps * smem_tile).astype(np.float64), 0.0)
    # (a SIMT GEMM writes each step's tiles once and reads the register tiles' operands)
    smem_traffic = np.where(simt.on, (g.blocks * g.threads * g.red_points * per_point).astype(
        np.float64) + g.blocks * g.nsteps * simt.step_traffic, smem_traffic)
    smem_traffic = np.where(tc.on, g.blocks * g.nsteps * tc.step_traffic, smem_traffic)

    regs = registers_per_thread(problem, thread, staged, ptxas=not m.distributed)
    regs = np.where(tc.on, tc.regs, np.where(simt.on, simt.regs, regs))
    # a wgmma kernel adds its producer warpgroup to the tile's (consumer) threads
    threads = np.where(tc.threads > 0, tc.threads, g.threads)
    # tensor-core kernels pipeline their steps (cp.async, TMA): no staging latency; a SIMT
    # GEMM loads each step while computing the one before: one round trip, its first step
    work = Work(flops=g.work, peak=np.where(tc.on, tc.peak, m.peak),
                smem_traffic=smem_traffic, block_bytes=(loads + stores).astype(np.float64),
                traffic=dram_bytes, blocks=g.blocks,
                unique=float(_unique_bytes(problem) if unique is None else unique),
                threads=threads, registers=regs, smem_bytes=smem_tile,
                latency_steps=np.where(staged, g.nsteps, np.where(simt.on, 1, 0)),
                hiding_warps=hiding_warps(problem, m, ~tc.on & ~(simt.on & ~simt.gathered)))
    p = predict(m, work)
    costs = TileCosts(time_s=p.time_s, flops=g.flops, dram_bytes=dram_bytes,
                      smem_bytes=smem_traffic, smem_tile=smem_tile, box_bytes=box_bytes,
                      staged=staged, lanes_default=lanes_default, regs=regs,
                      threads=threads, blocks=g.blocks, blocks_per_sm=p.per_sm,
                      waves=p.waves, wave_eff=p.eff, bound=p.bound, valid=p.valid,
                      t_compute=p.t_compute, t_smem=p.t_smem, t_global=p.t_global,
                      t_traffic=p.t_traffic, t_latency=p.t_latency)
    if lanes_default.any():
        _as_lane_kernels(problem, m, costs, lanes_default)
    return costs


def hiding_warps(problem: Problem, m: Machine, cuda_cores) -> np.ndarray | int:
    """Warps an SM needs to issue at its peak, per candidate: `HIDING_WARPS` for a
    reduction on CUDA cores that waits on its loads (`cuda_cores`: the staged and tiled
    kernels, which wait for each fragment and each step's barrier, and the SIMT GEMM whose
    operands are gathered element by element, a convolution's implicit GEMM),
    `SATURATING_WARPS` for the rest (the pipelined tensor-core GEMMs and the SIMT GEMM
    with 16-byte loads; ops without a reduction, whose time is the global level's) and on a
    distributed machine."""
    if m.distributed or not problem.has_reduction:
        return SATURATING_WARPS
    return np.where(cuda_cores, HIDING_WARPS, SATURATING_WARPS)


class _Grid:
    """The geometry of candidate tiles: grid, threads, reduction steps, padded work."""

    def __init__(self, problem: Problem, block, thread, step):
        ns = problem.n_spatial
        ext = np.array(problem.extents, dtype=np.int64).reshape(-1, 1)
        self.block, self.step = block, step
        self.s_ext, self.r_ext = ext[:ns], ext[ns:]
        self.n = block.shape[1] if ns else step.shape[1] if len(step) else 1
        grid = -(-self.s_ext // block)
        self.blocks = grid.prod(axis=0)
        self.threads = (block // thread).prod(axis=0)
        nsteps_axes = -(-self.r_ext // step)
        self.nsteps = nsteps_axes.prod(axis=0)
        self.red_points = (nsteps_axes * step).prod(axis=0)
        # Compute: the padded iteration space is what the blocks execute.
        self.work = (grid * block).prod(axis=0).astype(np.float64) * self.red_points * \
            problem.flops_per_point
        self.flops = float(problem.flops_per_point) * problem.output_points * \
            problem.reduction_points
        self.tile_sizes = np.vstack([block, step])


@dataclass
class _TensorCores:
    """Per candidate: runs on tensor cores (tilekit.schedule.mma), its shared memory, the
    shared-memory bytes a block moves per step (tiles written once, each warp reading its A
    rows and B columns), and its registers (accumulators, fragments, `STAGED_BASE`)."""

    on: np.ndarray
    smem: np.ndarray
    step_traffic: np.ndarray
    regs: np.ndarray
    peak: np.ndarray | float = 0.0
    threads: np.ndarray | int = 0     # a wgmma kernel's threads (0: the tile's)
    #: SIMT plans whose operands both load element by element (no 16-byte loads)
    gathered: np.ndarray | bool = False


def tensor_compute(problem: Problem, m: Machine) -> str | None:
    """The tensor-core compute type of a contraction on this machine, or None."""
    c = problem.contraction
    if c is None:
        return None
    compute = compute_type(c.dtype, m.precision)
    return compute if compute in m.mma_offered else None


def _no_plans(n: int) -> _TensorCores:
    """No candidate runs as this GEMM."""
    return _TensorCores(np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64),
                        np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64),
                        gathered=np.zeros(n, dtype=bool))


def _tensor_core_plans(problem: Problem, m: Machine, g: _Grid) -> _TensorCores:
    n = g.n
    out = _no_plans(n)
    compute = tensor_compute(problem, m)
    if compute is None:
        return out
    c = problem.contraction
    peak = m.hw.achievable_flops(MMA[compute][4], tensor_core=True)
    hopper = compute in m.wgmma_offered
    out.peak = np.full(n, peak * (MMA_SYNC_SHARE if hopper else 1.0))
    out.threads = np.zeros(n, dtype=np.int64)
    shapes = [tuple(d.size for d in op.dims) for op in problem.operands]
    item = MMA[compute][5]
    for k in range(n):
        if hopper:   # the shared decision (tilekit.schedule.shape.mma_shape): wgmma first
            plan = wgmma_plan(c, problem.spatial, problem.reduction, tuple(g.block[:, k]),
                              tuple(g.step[:, k]), int(g.threads[k]), compute,
                              m.hw.smem_per_block, lambda i: shapes[i])
            if not isinstance(plan, str):
                w = WGMMA[compute][2]
                out.on[k], out.smem[k], out.peak[k] = True, plan.smem_bytes, peak
                out.threads[k] = plan.threads
                # TMA writes each tile once; each consumer reads its A rows and all of B
                out.step_traffic[k] = float((2 * plan.bm + (1 + plan.consumers) * plan.bn)
                                            * plan.bk * w)
                out.regs[k] = plan.registers   # the persistent grid's occupancy too
                continue
        plan = mma_plan(c, problem.spatial, problem.reduction, tuple(g.block[:, k]),
                        tuple(g.step[:, k]), int(g.threads[k]), compute,
                        m.hw.smem_per_block, lambda i: shapes[i])
        if isinstance(plan, str):
            continue
        out.on[k] = True
        out.smem[k] = plan.smem_bytes
        written = (plan.bm + plan.bn) * plan.bk
        read = plan.warps * (plan.warp_m + plan.warp_n) * plan.bk
        out.step_traffic[k] = float((written + read) * item)
        acc = plan.mt * plan.nt * 4
        frags = 4 * plan.mt + 2 * plan.nt
        out.regs[k] = -(-(STAGED_BASE + acc + frags) // REG_GRANULE) * REG_GRANULE
    return out


def _simt_plans(problem: Problem, m: Machine, g: _Grid, thread: np.ndarray,
                tensor_cores: np.ndarray) -> _TensorCores:
    """Per candidate: runs as the SIMT GEMM (tilekit.schedule.simt: the shared decision
    after tensor cores), its shared memory, the bytes a block writes per step, registers."""
    n = g.n
    out = _no_plans(n)
    c = problem.contraction
    if c is None or m.distributed or c.dtype != "float32":
        return out
    shapes = [tuple(d.size for d in op.dims) for op in problem.operands]
    for k in range(n):
        if tensor_cores[k]:
            continue
        plan = simt_plan(c, problem.spatial, problem.reduction, tuple(g.block[:, k]),
                         tuple(thread[:, k]), tuple(g.step[:, k]), m.hw.smem_per_block,
                         lambda i: shapes[i])
        if isinstance(plan, str):
            continue
        out.on[k], out.smem[k] = True, plan.smem_bytes
        out.gathered[k] = not (plan.a_vector or plan.b_vector)
        out.step_traffic[k] = float((plan.bm + plan.bn) * plan.bk * 4)
        out.regs[k] = -(-(plan.registers + SIMT_BASE + plan.bk) // REG_GRANULE) * REG_GRANULE
    return out


def _decide_staging(problem: Problem, g: _Grid) -> tuple[np.ndarray, np.ndarray]:
    """The shared shape decision (tilekit.schedule.shape) over all candidates: a stageable
    reduction is staged where some read's box is reused MIN_REUSE times per step; every
    distinct read's box is then staged, in its storage type, each buffer 16-byte aligned.
    Returns (staged mask, bytes a block would stage per step)."""
    points = g.block.prod(axis=0) * g.step.prod(axis=0)
    box_bytes = np.zeros(g.n, dtype=np.int64)
    reused = np.zeros(g.n, dtype=bool)
    reused_bytes = np.zeros(g.n, dtype=np.int64)
    once_bytes = np.zeros(g.n, dtype=np.int64)
    once_walk = np.ones(g.n, dtype=bool)
    for op in problem.operands:
        volume = op.box_volume(g.tile_sizes)
        nbytes = -(-volume * op.itemsize // SMEM_ALIGN) * SMEM_ALIGN
        box_bytes = box_bytes + nbytes
        used = points >= MIN_REUSE * volume
        reused = reused | used
        reused_bytes = reused_bytes + np.where(used, nbytes, 0)
        once_bytes = once_bytes + np.where(used, 0, nbytes)
        once_walk = once_walk & (used | walks_reduction(problem, op))
    # The reads used once dominate and stream coalesced: lanes, not staging (STREAM_RATIO).
    streamed = ((once_bytes > 0) & once_walk & (problem.lanes >= WARP)
                & (STREAM_RATIO * reused_bytes <= once_bytes))
    return reused & ~streamed & problem.stageable, box_bytes


def _global_traffic(problem: Problem, g: _Grid, txn: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes one block loads (reduced inputs once per step, the rest once) and stores, every
    contiguous run rounded up to whole transactions."""
    whole_sizes = np.vstack([g.block, np.broadcast_to(g.r_ext, g.step.shape)])
    loads = np.zeros(g.n, dtype=np.int64)
    for op, reduced in zip(problem.operands, problem.reduced):
        if reduced:
            total, run = op.contiguous_run(g.tile_sizes)
            loads = loads + g.nsteps * _rounded_bytes(total, run, op.itemsize, txn)
        else:
            total, run = op.contiguous_run(whole_sizes)
            loads = loads + _rounded_bytes(total, run, op.itemsize, txn)
    out_run = np.ones(g.n, dtype=np.int64)
    whole = np.ones(g.n, dtype=bool)
    for a in reversed(range(problem.n_spatial)):  # the run continues while inner axes are whole
        out_run = np.where(whole, out_run * g.block[a], out_run)
        whole = whole & (g.block[a] >= problem.extents[a])
    stores = _rounded_bytes(g.block.prod(axis=0), out_run, problem.out_itemsize, txn)
    return loads, stores


@dataclass
class Work:
    """What a kernel does, the figures the time formula prices (arrays: one per candidate,
    or scalars). tk-roll derives them from a tile (`cost_tiles`), tk-weld from a fused
    group's regions (tilekit.weld.model), an opaque op from its bytes (`estimate_bytes`), a
    tile program from the interpreter's counters (tilekit.codegen.report): one formula
    (`predict`) prices them all."""

    flops: object              # floating-point work the blocks execute (padding included)
    peak: object               # FLOP/s of the unit that executes it (SIMT or tensor cores)
    smem_traffic: object       # shared-memory bytes moved
    block_bytes: object        # global bytes one block moves (the busiest SM's port)
    traffic: object            # global bytes all blocks move (re-reads included)
    unique: float              # compulsory bytes: every tensor once (from DRAM)
    blocks: object
    threads: object
    registers: object
    smem_bytes: object         # shared memory per block (occupancy)
    latency_steps: object      # round trips a block waits for in sequence (staged steps)
    #: warps an SM needs to issue at its peak (`SATURATING_WARPS`; `HIDING_WARPS` for
    #: CUDA-core reduction kernels that do not pipeline their loads)
    hiding_warps: object = SATURATING_WARPS


@dataclass
class Prediction:
    time_s: np.ndarray
    bound: np.ndarray          # index into BOUNDS
    t_compute: np.ndarray
    t_smem: np.ndarray
    t_global: np.ndarray
    t_traffic: np.ndarray
    t_latency: np.ndarray
    per_sm: np.ndarray         # blocks an SM holds (tilekit.schedule.residency)
    valid: np.ndarray
    eff: np.ndarray
    waves: np.ndarray
    resident: np.ndarray


def predict(m: Machine, w: Work) -> Prediction:
    """The micro performance model (module docstring): occupancy from the one occupancy
    function (tilekit.schedule.residency.blocks_per_sm), waves, saturation and idle lanes,
    then `max(compute, shared memory, global) + staging latency + launch`."""
    threads = np.asarray(w.threads, dtype=np.int64)
    blocks = np.asarray(w.blocks, dtype=np.int64)
    per_sm, _ = blocks_per_sm(m.hw, threads, w.registers, w.smem_bytes)
    valid = per_sm >= 1
    warps = -(-threads // m.hw.warp_size)
    # A block whose threads do not fill whole warps leaves lanes idle: every kind of work
    # is issued per warp, so each time is divided by the fraction of lanes used.
    lanes = threads / (warps * m.hw.warp_size)
    # A grid smaller than one full wave spreads over the SMs first, so only `resident`
    # blocks share an SM; the SM is saturated once it holds `SATURATING_WARPS`.
    resident = np.minimum(np.maximum(per_sm, 1), -(-blocks // m.hw.sm_count))
    eff, waves = wave_efficiency(blocks, m.hw.sm_count * resident)
    saturation = np.minimum(1.0, warps * resident / np.minimum(
        np.asarray(w.hiding_warps, dtype=np.float64), m.hw.max_warps_per_sm))
    # Compute and shared memory are per-SM resources: a partial wave or an SM short of
    # warps leaves them idle. The global level is device-wide, so it is not quantised by
    # waves: its traffic (L2 or exchange to the SMs) is bounded by what the busiest SM can
    # pull through its port (its share of that bandwidth), and the compulsory bytes by DRAM.
    sm_busy = eff * saturation
    t_compute = np.asarray(w.flops, dtype=np.float64) / w.peak / lanes / sm_busy
    t_smem = np.asarray(w.smem_traffic, dtype=np.float64) / m.smem_bw / lanes / sm_busy
    busiest = -(-blocks // m.hw.sm_count) * np.asarray(w.block_bytes, dtype=np.float64) / (
        lanes * saturation)
    traffic = np.asarray(w.traffic, dtype=np.float64)
    if m.distributed:
        t_traffic = traffic / m.exchange_bw
        t_global = np.maximum(t_traffic, busiest / (m.exchange_bw / m.hw.sm_count))
    else:
        reload_bw = m.l2_bw if w.unique <= m.hw.l2_bytes else m.dram_bw
        t_traffic = traffic / reload_bw
        t_global = np.maximum(np.maximum(w.unique / m.dram_bw, t_traffic),
                              busiest / (m.l2_bw / m.hw.sm_count))
    # A staged kernel loads a step's boxes, waits at a barrier, computes, waits again: within
    # a block the loads' round trip is not overlapped, only by the other blocks resident on
    # its SM. Each SM runs ceil(blocks / (SMs x resident)) rounds of such waits.
    t_latency = -(-blocks // (m.hw.sm_count * resident)) * np.asarray(
        w.latency_steps, dtype=np.float64) * m.step_latency
    terms = np.stack(np.broadcast_arrays(t_compute, t_smem, t_global))
    top = terms.max(axis=0)
    busy = top + t_latency
    bound = np.where(m.launch_s > busy, BOUNDS.index("launch"),
                     np.where(t_latency > top, BOUNDS.index("latency"), terms.argmax(axis=0)))
    return Prediction(busy + m.launch_s, bound, t_compute, t_smem, t_global, t_traffic,
                      t_latency, per_sm, valid, eff, waves, resident)


def _as_lane_kernels(problem: Problem, m: Machine, costs: TileCosts, where: np.ndarray
                     ) -> None:
    """Candidates that codegen runs as default kernels with a warp per output point (their
    tile set aside): priced as the default schedule is (`_default_work`), every point reading
    its whole row of each operand, coalesced along the lanes, re-reads served by the cache
    level that holds the tensors. (Pricing them at the compulsory bytes, as if each row were
    read once, made a batched product with reuse in both operands, BERT-large's attention
    scores, 29x optimistic on an H100: picked over SIMT GEMMs 21x as fast.)"""
    work = _default_work(problem, m)
    p = predict(m, work)
    costs.time_s[where] = float(p.time_s)
    costs.t_latency[where] = 0.0
    costs.t_compute[where] = float(p.t_compute)
    costs.t_smem[where] = 0.0
    costs.t_global[where] = float(p.t_global)
    costs.dram_bytes[where] = float(work.traffic)
    costs.smem_bytes[where] = 0.0
    costs.threads[where] = DEFAULT_THREADS
    costs.blocks[where] = work.blocks
    costs.waves[where] = float(p.waves)
    costs.wave_eff[where] = float(p.eff)
    costs.bound[where] = int(p.bound)


#: The slice axis of a split-K problem (outermost spatial axis, extent = slices).
SLICE_AXIS = "split_k_slice"


def split_problem(problem: Problem, split: int, step=None) -> tuple[Problem, int]:
    """A split-K partial-sum kernel as a problem of its own: an outer spatial axis of the
    slices (no operand reads it), the split reduction axis cut to one slice's steps, fp32
    outputs (the partial sums); and the number of slices (< 2: no split). Without `step`, a
    wgmma contraction's (its K axis in steps of WGMMA_BK); with `step` (the tile's step per
    reduction axis), a staged tile's (tilekit.schedule.shape.staged_split)."""
    from dataclasses import replace
    from tilekit.schedule.mma import WGMMA_BK, split_steps
    from tilekit.schedule.shape import staged_split

    extents = list(problem.extents)
    if step is None:
        k = problem.axes.index(problem.contraction.k_axes[0])
        slices, per = split_steps(problem.extents[k], split)
        extents[k] = min(per * WGMMA_BK, extents[k])
    else:
        cut = staged_split(problem.reduction, tuple(step), split)
        if cut is None:
            return problem, 1
        k, slices = problem.n_spatial + cut.axis, cut.slices
        extents[k] = cut.span
    operands = tuple(replace(op, dims=tuple(replace(d, coefs=(0,) + d.coefs) for d in op.dims),
                             axis_names=(SLICE_AXIS,) + op.axis_names)
                     for op in problem.operands)
    return replace(problem, axes=(SLICE_AXIS,) + problem.axes, extents=(slices, *extents),
                   n_spatial=problem.n_spatial + 1, operands=operands, out_itemsize=4), slices


def split_k_estimate(problem: Problem, m: Machine, block, thread, step, split: int,
                     staged: bool = False) -> tuple[Estimate, int]:
    """A split-K contraction's estimate: the partial-sum kernel (the tile over the slice
    problem, `split_problem`: a block per output tile and slice, each slice's share of the
    reduction; every operand still read once, the partials written) plus the reduction
    kernel (the slices' partials read, the output written, one thread per point); and its
    slices. `staged`: a staged tile's split (tilekit.codegen.staged), whose last block per
    tile adds the slices in the same kernel: instead of a second kernel, the partials
    written and read once more through L2 (they stay there), no second launch."""
    return split_k_estimates(problem, m, [(block, thread, step)], split, staged)[0]


def split_k_estimates(problem: Problem, m: Machine, tiles, split: int, staged: bool = False
                      ) -> list[tuple[Estimate, int]]:
    """`split_k_estimate` of each `(block, thread, step)` of `tiles`, those that share a
    slice problem (a staged tile's depends on its steps; a wgmma tile's does not) costed in
    one vectorised call."""
    groups: dict[tuple | None, list[int]] = {}
    for k, (_, _, step) in enumerate(tiles):
        groups.setdefault(tuple(step) if staged else None, []).append(k)
    out: list[tuple[Estimate, int] | None] = [None] * len(tiles)
    points = problem.output_points
    for step_key, members in groups.items():
        sp, slices = split_problem(problem, split, step_key)
        if slices < 2:
            for k in members:
                out[k] = (Estimate(time_us=np.inf, flops=0.0, dram_bytes=0.0, smem_bytes=0.0,
                                   bound="compute", waves=1, wave_efficiency=1.0), slices)
            continue
        partials = 4.0 * slices * points
        chosen = [tiles[k] for k in members]   # as columns; the slice axis leads, 1 a block
        block = np.array([(1, *b) for b, _, _ in chosen], dtype=np.int64).T
        thread = np.array([(1, *t) for _, t, _ in chosen], dtype=np.int64).T
        step = np.array([tuple(s) for _, _, s in chosen], dtype=np.int64).reshape(
            len(chosen), -1).T
        costs = cost_tiles(sp, m, block, thread, step,
                           unique=float(_unique_bytes(problem)) + partials, gemms=not staged)
        for j, k in enumerate(members):
            out[k] = (_split_estimate(problem, m, costs, j, partials, points, staged), slices)
    return out  # type: ignore[return-value]


def _split_estimate(problem: Problem, m: Machine, costs: TileCosts, j: int, partials: float,
                    points: int, staged: bool) -> Estimate:
    """Candidate `j` of a slice problem's `costs` as the whole split's estimate."""
    first = costs.estimate(j)
    if not costs.valid[j]:
        return Estimate(time_us=np.inf, flops=first.flops, dram_bytes=0.0, smem_bytes=0.0,
                        bound="compute", waves=1, wave_efficiency=1.0)
    if staged:
        # the slice problem stores the partials; the last block of each tile reads them back
        # (through L2, where they stay)
        moved = partials
        return Estimate(time_us=first.time_us + moved / m.l2_bw * 1e6, flops=first.flops,
                        dram_bytes=first.dram_bytes + moved, smem_bytes=first.smem_bytes,
                        bound=first.bound, waves=first.waves,
                        wave_efficiency=first.wave_efficiency,
                        latency_us=first.latency_us)
    second = estimate_bytes(m.hw, int(partials), points * problem.out_itemsize,
                            DEFAULT_THREADS, points)
    return Estimate(time_us=first.time_us + second.time_us, flops=first.flops,
                    dram_bytes=first.dram_bytes + second.dram_bytes,
                    smem_bytes=first.smem_bytes, bound=first.bound, waves=first.waves,
                    wave_efficiency=first.wave_efficiency, latency_us=first.latency_us)


def default_estimate(problem: Problem, m: Machine) -> Estimate:
    """The model's estimate of the op's default schedule (what codegen runs without a tile,
    tilekit.schedule.shape.default_shape), priced by `_default_work`."""
    work = _default_work(problem, m)
    return prediction_estimate(predict(m, work), work.flops, work.traffic, 0.0)


def _default_work(problem: Problem, m: Machine) -> Work:
    """The default schedule's work: `DEFAULT_THREADS` threads per block over a grid-stride
    loop, one output point per thread, or per lane group for a reduction over a long
    contiguous axis. Every point reads its whole reduction footprint of each operand
    (re-reads served by the cache level that holds the tensors), per element: with lanes,
    coalesced along the lanes' axis, a sector otherwise; without, coalesced when consecutive
    points (the innermost output axis) read consecutive elements, broadcast to the warp when
    they read the same one, a sector otherwise."""
    lanes = min(problem.lanes, WARP) if problem.has_reduction and not m.distributed else 1
    blocks = default_grid(problem.output_points, DEFAULT_THREADS // lanes)
    moved = float(_unique_bytes(problem))
    points = float(problem.output_points)
    ns = problem.n_spatial
    unit = np.array([1] * ns + list(problem.extents[ns:]), dtype=np.int64).reshape(-1, 1)
    txn = float(m.transaction_bytes)
    traffic = points * problem.out_itemsize
    for op, reduced in zip(problem.operands, problem.reduced):
        per_point = float(op.footprint(unit)[0])
        last = op.dims[-1] if op.dims else None
        if lanes > 1:
            coalesced = walks_reduction(problem, op) or not reduced
            per = op.itemsize if coalesced else max(op.itemsize, txn)
        elif ns == 0 or ns - 1 not in op.axes_used:
            per = op.itemsize / WARP              # the same element for the whole warp
        elif last is not None and last.affine and abs(last.coefs[ns - 1]) == 1:
            per = op.itemsize
        else:
            per = max(op.itemsize, txn)
        traffic += points * per_point * per
    traffic = max(traffic, moved)
    work = points * problem.reduction_points * problem.flops_per_point
    return Work(flops=work, peak=m.peak, smem_traffic=0.0, block_bytes=traffic / blocks,
                traffic=traffic, unique=moved, blocks=blocks, threads=DEFAULT_THREADS,
                registers=DEFAULT_REGS, smem_bytes=0, latency_steps=0)


@lru_cache(maxsize=1024)
def _unique_bytes(problem: Problem) -> int:
    """Compulsory bytes: every input box the op reads and its output, once."""
    full = np.array(problem.extents, dtype=np.int64).reshape(-1, 1)
    total = problem.output_points * problem.out_itemsize
    for op in problem.operands:
        total += int(op.footprint(full)[0]) * op.itemsize
    return total


def limit_broken(problem: Problem, m: Machine, costs: TileCosts, k: int) -> str:
    """The first capacity limit candidate `k` breaks, for messages ("" when none)."""
    if costs.threads[k] > m.hw.max_threads_per_block:
        return f"threads {costs.threads[k]} > max_threads_per_block {m.hw.max_threads_per_block}"
    if costs.regs[k] > m.hw.max_regs_per_thread:
        return f"registers {costs.regs[k]} > max_per_thread {m.hw.max_regs_per_thread}"
    if costs.regs[k] * costs.threads[k] > m.hw.regs_per_block:
        return f"registers per block > {m.hw.regs_per_block}"
    if costs.smem_tile[k] > m.hw.smem_per_block:
        return f"shared memory {costs.smem_tile[k]} B > per block {m.hw.smem_per_block} B"
    return ""


def estimate_bytes(profile, read_bytes: int, write_bytes: int, threads: int = 256,
                   elements: int = 1) -> Estimate:
    """Estimate of an op known only by the bytes it moves (opaque ops): one thread per output
    element in blocks of `threads`, bound by the global memory level (`predict`)."""
    m = machine(profile)
    blocks = max(1, -(-elements // threads))
    moved = float(read_bytes + write_bytes)
    p = predict(m, Work(flops=0.0, peak=m.peak, smem_traffic=0.0, block_bytes=moved / blocks,
                        traffic=moved, unique=moved, blocks=blocks, threads=threads,
                        registers=DEFAULT_REGS, smem_bytes=0, latency_steps=0))
    return prediction_estimate(p, 0.0, moved, 0.0)


def prediction_estimate(p: Prediction, flops: float, dram_bytes: float, smem_bytes: float
                        ) -> Estimate:
    """A one-kernel `Prediction` as the IR's `Estimate`."""
    return Estimate(time_us=float(p.time_s) * 1e6, flops=float(flops),
                    dram_bytes=float(dram_bytes), smem_bytes=float(smem_bytes),
                    bound=BOUNDS[int(p.bound)], waves=int(p.waves),
                    wave_efficiency=float(p.eff), latency_us=float(p.t_latency) * 1e6)


def combine_estimates(profile, parts: Sequence[Estimate], saved_dram_bytes: float = 0.0,
                      last: Estimate | None = None) -> Estimate:
    """A group of ops run as one kernel: flops and traffic add up, minus the DRAM bytes of
    intermediates that stay on chip (`saved_dram_bytes`); the time is the slower of the
    summed compute-or-smem times and the remaining DRAM time, plus the staging latency of
    `last` (the op whose tile and steps the kernel keeps: an epilogue adds no steps); waves
    are `last`'s."""
    if not parts:
        raise ValueError("combine_estimates needs at least one estimate")
    if len(parts) == 1 and not saved_dram_bytes:
        return parts[0]
    m = machine(profile)
    last = last or parts[-1]
    flops = sum(p.flops for p in parts)
    dram = max(0.0, sum(p.dram_bytes for p in parts) - saved_dram_bytes)
    smem = sum(p.smem_bytes for p in parts)
    eff = max(last.wave_efficiency, 1e-9)
    inner = sum(p.time_us * 1e-6 - m.launch_s - p.latency_us * 1e-6 for p in parts
                if p.bound in ("compute", "smem", "latency"))
    bw = m.exchange_bw if m.distributed else m.dram_bw
    t_dram = dram / bw
    t_latency = last.latency_us * 1e-6
    busy = max(inner, t_dram, 0.0) + t_latency
    bound = "dram" if t_dram >= inner else ("compute" if flops else "smem")
    if t_latency > max(inner, t_dram):
        bound = "latency"
    if m.launch_s > busy:
        bound = "launch"
    return Estimate(time_us=(busy + m.launch_s) * 1e6, flops=flops, dram_bytes=dram,
                    smem_bytes=smem, bound=bound, waves=last.waves, wave_efficiency=eff,
                    latency_us=last.latency_us)
