"""Roller's tile construction: scale-up from the smallest aligned tile, then scale-out.

Tiles are constructed, not searched (Roller, OSDI'22; docs/roll.md):

1. **Register level** (ops with a reduction): start from a 1-element thread tile; repeatedly
   grow the spatial axis with the best reuse gain (shared-memory bytes read per output per
   reduction point saved, per register added) until the thread tile is compute-bound against
   shared memory (`flops / peak >= bytes / smem bandwidth`) or the next step would break the
   per-thread register limit. Ops without a reduction have nothing to reuse: one element per
   thread.
2. **Block level**, for each of the last `THREAD_CHOICES` thread tiles of step 1: start from
   `START_WARPS` warps laid over the innermost axes, sizes aligned (tilekit.roll.rtile);
   repeatedly grow the block axis or reduction step with the best gain (global traffic saved
   per byte of block footprint added) until the block is compute-bound against the memory
   level that serves it, no move saves traffic, or a capacity limit (threads, registers per
   block, shared memory per block) would break.
3. **Scale-out**: while the grid has fewer blocks than SMs or gives them fewer warps than
   latency hiding needs, shrink the block along the axis whose shrinking costs the least
   traffic (the lowest-reuse axis); then grow its reduction step for coalescing as in
   step 2.
4. **Split-K** (`best_split_k`, `best_staged_split`): where the output tiles alone leave the
   SMs idle, the reduction split across blocks is priced too.

Every tile visited on the way is a candidate; all are costed at once by the micro performance
model (tilekit.roll.cost) and the `top_k` fastest valid ones are returned, best first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilekit.errors import TilekitError
from tilekit.ir.payloads import round_sig
from tilekit.roll.cost import (Estimate, Machine, TileCosts, cost_tiles, hiding_warps,
                               machine, registers_per_thread, split_k_estimates,
                               tensor_compute)
from tilekit.roll.problem import Problem
from tilekit.roll.rtile import RTile, block_sizes, thread_sizes

#: Thread tiles from the end of the register-level trajectory that each get a block level.
THREAD_CHOICES = 3
#: Warps a block starts with (before growth), where the problem has that much work.
START_WARPS = 4
#: Contiguous bytes per staged row that reduction steps are grown to (Welder's 128 B runs).
COALESCE_BYTES = 128
#: Safety stop for the greedy loops (a trajectory is never this long in practice).
MAX_MOVES = 64


@dataclass(frozen=True)
class Candidate:
    """One costed rTile: its sizes, the model's estimate and the resources it uses."""

    tile: RTile
    estimate: Estimate
    smem_bytes: int
    regs: int
    threads: int
    blocks: int
    split: int = 1          # split-K slices (a wgmma tile's; tilekit.roll.cost.split_k_estimate)


def roll_problem(problem: Problem, profile, top_k: int = 1, precision: str = "fp32"
                 ) -> list[Candidate]:
    """The `top_k` best valid tiles for `problem` on `profile`, best first (at least one).
    A contraction with a tensor-core instruction on the profile (fp32 only at precision
    "tf32") also gets the block GEMM tiles of `tensor_core_tiles`."""
    m = machine(profile, problem.dtype, precision)
    tiles = construct_tiles(problem, profile, m)
    if tensor_compute(problem, m) is not None:
        tiles += [t for t in tensor_core_tiles(problem, m) if t not in set(tiles)]
    else:
        tiles += [t for t in simt_tiles(problem, m) if t not in set(tiles)]
    ranked = rank(problem, m, tiles, max(top_k, THREAD_CHOICES))
    # The front runners get the coalescing step growth too (some come from mid-trajectory).
    bsizes = [block_sizes(problem, m.transaction_bytes, a) for a in range(len(problem.axes))]
    seen = dict.fromkeys(tiles)
    for c in ranked:
        for tile in grow_steps(problem, m, bsizes, c.tile):
            seen.setdefault(tile, None)
    grown = list(seen)
    costs = cost_candidates(problem, m, grown)     # ranked, and read by the staged split
    ranked = rank(problem, m, grown, top_k, costs)
    split = best_split_k(problem, m, tiles)
    if split is None and tensor_compute(problem, m) is None and problem.has_reduction:
        split = best_staged_split(problem, m, grown, costs, grown.index(ranked[0].tile))
    if split is not None and round_sig(split.estimate.time_us, 6) < round_sig(
            ranked[0].estimate.time_us, 6):
        ranked = [split] + ranked[:max(1, top_k) - 1]   # only the pick is split
    return ranked


def best_split_k(problem: Problem, m: Machine, tiles: list[RTile]) -> Candidate | None:
    """The fastest split-K candidate of a contraction on wgmma (Hopper), or None: each wgmma
    tile among `tiles` whose output tiles leave SMs idle, with each factor of `SPLIT_K`
    (slices of the reduction in blocks of their own, partial sums added by a second kernel in
    slice order: deterministic)."""
    from tilekit.schedule.mma import wgmma_plan

    compute = tensor_compute(problem, m)
    if compute is None or compute not in m.wgmma_offered:
        return None
    shapes = [tuple(d.size for d in op.dims) for op in problem.operands]
    eligible = []
    for tile in tiles:
        plan = wgmma_plan(problem.contraction, problem.spatial, problem.reduction, tile.block,
                          tile.step, tile.threads(), compute, m.hw.smem_per_block,
                          lambda i: shapes[i])
        blocks = math.prod(tile.grid(problem))
        if not isinstance(plan, str) and blocks < m.hw.sm_count:
            eligible.append((tile, plan, blocks))
    found = _fastest_split(problem, m, [tile for tile, _, _ in eligible], staged=False)
    if found is None:
        return None
    i, est, slices = found
    tile, plan, blocks = eligible[i]
    return Candidate(tile, est, plan.smem_bytes, 0, plan.threads, blocks * slices, slices)


def priced_splits(problem: Problem, m: Machine, tiles: list[RTile], staged: bool
                  ) -> dict[int, list[tuple[Estimate, int]]]:
    """Each factor of `SPLIT_K` (in order) to the split of every tile of `tiles` by it, as
    (estimate, slices); each factor's splits of all the tiles priced together
    (`cost.split_k_estimates`). `staged`: staged tiles' splits, else wgmma tiles'."""
    from tilekit.schedule.mma import SPLIT_K

    shapes = [(t.block, t.thread, t.step) for t in tiles]
    return {factor: split_k_estimates(problem, m, shapes, factor, staged=staged)
            for factor in SPLIT_K}


def _fastest_split(problem: Problem, m: Machine, tiles: list[RTile], staged: bool
                   ) -> tuple[int, Estimate, int] | None:
    """The fastest split of `tiles` (`priced_splits`) as (the tile's index, its estimate, its
    slices), or None where none makes two slices with a finite time; the first of equal times
    (to 6 significant digits) kept."""
    priced = priced_splits(problem, m, tiles, staged)
    best = None
    for i in range(len(tiles)):
        for factor in priced:
            est, slices = priced[factor][i]
            if slices < 2 or not est.time_us < np.inf:
                continue
            if best is None or round_sig(est.time_us, 6) < round_sig(best[1].time_us, 6):
                best = (i, est, slices)
    return best


#: The fastest unsplit staged tiles worth splitting (short of warps) of a CUDA-core reduction
#: whose split-K is priced (at 8, VGG-19's 28 x 28 layers' best split was the ninth once
#: convolutions ran as SIMT GEMMs; at 12, ResNet-50's 56 x 56 3 x 3 layers' was the
#: thirteenth once gathered SIMT GEMMs were priced at the warps that hide their loads; the
#: splits of all of them are priced together, `cost.split_k_estimates`).
SPLIT_TILES = 16
#: Output dtypes whose staged kernels accumulate in float32, the split-K scratch's type.
SPLIT_DTYPES = ("float32", "float16", "bfloat16")


def best_staged_split(problem: Problem, m: Machine, tiles: list[RTile], costs: TileCosts,
                      pick: int) -> Candidate | None:
    """The fastest split-K of a staged tile on CUDA cores (tilekit.codegen.staged), or None;
    `costs` are the model's figures for `tiles` (`cost_candidates`), `pick` the index of the
    unsplit pick among them.

    Only where the unsplit pick leaves the SMs short of the warps that hide latency
    (`_warps_to_fill`) or holds its whole grid at once with room for more blocks: whether
    the output *could* fill the SMs with small tiles does not matter, the pick's tile is
    what runs (VGG-19's 28x28 layers: 401k outputs, but 112 blocks of 7 warps). Priced for
    each of the `SPLIT_TILES` fastest of `tiles` that run staged and leave the SMs short or
    with room that way, with each factor of
    `SPLIT_K`: slices of the outermost reduction axis with several steps
    (tilekit.schedule.shape.staged_split), in blocks of their own; the last block of each
    output tile adds the slices in slice order (deterministic)."""
    if m.distributed or not problem.has_reduction or tensor_compute(problem, m) is not None \
            or problem.dtype not in SPLIT_DTYPES:
        return None
    fill = m.hw.sm_count * _warps_to_fill(problem, m)
    if not _short_of_warps(m, costs, pick, fill):
        return None        # the pick gives the SMs their warps
    # the SPLIT_TILES fastest of the tiles that run staged (a SIMT GEMM's are not split) and
    # are worth splitting
    staged = sorted((k for k in range(len(tiles)) if costs.valid[k] and costs.staged[k]
                     and _short_of_warps(m, costs, k, fill)),
                    key=lambda k: (round_sig(costs.time_s[k], 6), k))[:SPLIT_TILES]
    found = _fastest_split(problem, m, [tiles[k] for k in staged], staged=True)
    if found is None:
        return None
    i, est, slices = found
    k = staged[i]
    return Candidate(tiles[k], est, int(costs.smem_tile[k]), int(costs.regs[k]),
                     int(costs.threads[k]), int(costs.blocks[k]) * slices, slices)


def _short_of_warps(m: Machine, costs, k: int, fill: int) -> bool:
    """Whether tile `k` of `costs` is worth splitting: its grid leaves the SMs short of
    `fill` warps, or the SMs hold the whole grid at once with room for more blocks (then the
    steps each block waits for, t_latency, shrink by the split)."""
    warps = -(-int(costs.threads[k]) // m.hw.warp_size)
    blocks = int(costs.blocks[k])
    return blocks * warps < fill or blocks < m.hw.sm_count * int(costs.blocks_per_sm[k])


def construct_tiles(problem: Problem, profile, m: Machine | None = None) -> list[RTile]:
    """Every tile visited by scale-up and scale-out (unranked, no duplicates, in order)."""
    m = m or machine(profile, problem.dtype)
    ns = problem.n_spatial
    bsizes = [block_sizes(problem, m.transaction_bytes, a) for a in range(len(problem.axes))]
    seen: dict[RTile, None] = {}
    for thread in thread_choices(problem, m, register_trajectory(problem, m, bsizes)):
        trajectory = block_trajectory(problem, m, bsizes, thread)
        if not trajectory:
            continue
        for tile in trajectory:
            seen.setdefault(tile, None)
        shrunk = scale_out(problem, m, bsizes, trajectory[-1])
        if shrunk:
            shrunk += grow_steps(problem, m, bsizes, shrunk[-1])
        for tile in shrunk:
            seen.setdefault(tile, None)
    # The smallest tile (one element per thread, smallest aligned block and step) always
    # takes part: it is the fallback when every larger tile breaks a limit.
    seen.setdefault(start_tile(problem, bsizes, tuple(1 for _ in range(ns))), None)
    return list(seen)


def rank(problem: Problem, m: Machine, tiles: list[RTile], top_k: int,
         costs: TileCosts | None = None) -> list[Candidate]:
    """Cost `tiles` in one vectorised call (or read their `costs`, when the caller has them);
    the `top_k` fastest valid ones, best first.

    Ties (equal time to 6 significant digits; the model is flat for memory-bound ops) go to
    fewer reduction steps (fewer synchronisations, which the model does not cost), then to
    whole warps, then to blocks of up to `START_WARPS` warps (latency hiding the model does not
    see), then to the tile order, so that the choice never depends on float noise."""
    costs = costs if costs is not None else cost_candidates(problem, m, tiles)
    ns = problem.n_spatial
    steps = [math.prod(-(-n // s) for n, s in zip(problem.extents[ns:], t.step)) for t in tiles]
    full = START_WARPS * m.hw.warp_size

    def key(k):
        threads = int(costs.threads[k])
        return (round_sig(costs.time_s[k], 6), steps[k], threads % m.hw.warp_size != 0,
                -min(threads, full), tiles[k])

    order = sorted((k for k in range(len(tiles)) if costs.valid[k]), key=key)
    if not order:  # a valid but tiny profile: even the smallest tile breaks a limit
        raise no_tile_fits(m, costs, tiles)
    return [candidate(tiles[k], costs, k) for k in order[:max(1, top_k)]]


def no_tile_fits(m: Machine, costs: TileCosts, tiles: list[RTile]) -> TilekitError:
    """The error for a profile whose limits no tile meets, naming the limits that the
    smallest tile (fewest shared-memory bytes, then threads, then registers) breaks."""
    k = min(range(len(tiles)), key=lambda i: (int(costs.smem_tile[i]), int(costs.threads[i]),
                                              int(costs.regs[i])))
    threads, regs, smem = int(costs.threads[k]), int(costs.regs[k]), int(costs.smem_tile[k])
    broken = []
    if threads > m.hw.max_threads_per_block:
        broken.append(f"{threads} threads > parallelism.max_threads_per_block "
                      f"{m.hw.max_threads_per_block}")
    if regs > m.hw.max_regs_per_thread:
        broken.append(f"{regs} registers per thread > registers.max_per_thread "
                      f"{m.hw.max_regs_per_thread}")
    if regs * threads > m.hw.regs_per_block:
        broken.append(f"{regs * threads} registers per block > registers.max_per_block "
                      f"{m.hw.regs_per_block}")
    if smem > m.hw.smem_per_block:
        broken.append(f"{smem} B of shared memory > memory[shared].per_block_optin "
                      f"{m.hw.smem_per_block} B")
    if int(costs.blocks_per_sm[k]) < 1:
        broken.append("not one block fits an SM (parallelism.max_threads_per_sm, "
                      "registers.per_sm, memory[shared].capacity)")
    return TilekitError(f"no tile fits hardware profile '{m.hw.name}': the smallest tile "
                        f"({tiles[k].block} block, {tiles[k].step} step) needs "
                        + ("; ".join(broken) or "more than the profile allows"), "--hw",
                        "use a profile with larger limits, or fix the profile's figures")


def candidate(tile: RTile, costs: TileCosts, k: int) -> Candidate:
    """Candidate `k` of `costs` (the model's figures for a list of tiles), its tile `tile`."""
    return Candidate(tile, costs.estimate(k), int(costs.smem_tile[k]), int(costs.regs[k]),
                     int(costs.threads[k]), int(costs.blocks[k]))


def thread_choices(problem: Problem, m: Machine, trajectory: list[tuple[int, ...]]
                   ) -> list[tuple[int, ...]]:
    """The thread tiles that get a block level: the last `THREAD_CHOICES` of the register
    trajectory and, when those leave too few threads to fill the device (a small problem),
    also the largest one that still does (or the 1-element tile)."""
    chosen = trajectory[-THREAD_CHOICES:]
    target = m.hw.sm_count * _warps_to_fill(problem, m) * m.hw.warp_size

    def usable(t):
        return math.prod(-(-n // s) for n, s in zip(problem.extents, t))

    if usable(chosen[0]) < target:
        filling = [t for t in trajectory if usable(t) >= target]
        extra = filling[-1] if filling else trajectory[0]
        if extra not in chosen:
            chosen = [extra] + chosen
    return chosen


# -- register level -------------------------------------------------------------------------

def register_trajectory(problem: Problem, m: Machine, bsizes) -> list[tuple[int, ...]]:
    """Thread tiles visited by register-level scale-up, smallest first."""
    ns = problem.n_spatial
    thread = tuple(1 for _ in range(ns))
    path = [thread]
    if not problem.has_reduction or ns == 0:
        return path
    tsizes = [tuple(s for s in thread_sizes(problem, a)
                    if any(b % s == 0 for b in bsizes[a])) for a in range(ns)]
    reduced = [op for op, r in zip(problem.operands, problem.reduced) if r]
    nr = len(problem.axes) - ns
    threshold = m.peak / m.smem_bw  # FLOP per byte of shared memory that keeps ALUs busy

    def measure(cands: list[tuple[int, ...]]):
        sizes = np.array(cands, dtype=np.int64).T.reshape(ns, len(cands))
        unit = np.vstack([sizes, np.ones((nr, len(cands)), dtype=np.int64)])
        per_point = sum(op.footprint(unit) * op.itemsize for op in reduced)
        outputs = sizes.prod(axis=0)
        regs = registers_per_thread(problem, sizes, problem.stageable,
                                    ptxas=not m.distributed)
        return per_point / outputs, regs, outputs, per_point

    (q,), (regs,), (outs,), (bytes_,) = measure([thread])
    for _ in range(MAX_MOVES):
        if problem.flops_per_point * outs / max(bytes_, 1) >= threshold:
            break  # compute-bound at the register level
        moves = []
        for a in reversed(range(ns)):  # innermost first: ties favour contiguous rows
            bigger = [s for s in tsizes[a] if s > thread[a]]
            if bigger:
                moves.append(thread[:a] + (bigger[0],) + thread[a + 1:])
        if not moves:
            break
        mq, mregs, mouts, mbytes = measure(moves)
        threads_left = [math.prod(-(-n // t) for n, t in zip(problem.extents, mv))
                        for mv in moves]
        ok = (mregs <= m.hw.max_regs_per_thread) & (mregs * m.hw.warp_size <= m.hw.regs_per_block) & \
            (np.array(threads_left) >= min(m.hw.warp_size, problem.output_points))
        gain = np.where(ok, (q - mq) / np.maximum(mregs - regs, 1), -np.inf)
        best = int(np.argmax(gain))
        if not gain[best] > 0:
            break
        thread = moves[best]
        q, regs, outs, bytes_ = mq[best], mregs[best], mouts[best], mbytes[best]
        path.append(thread)
    return path


# -- block level ----------------------------------------------------------------------------

def _fits(thread: int, sizes) -> list[int]:
    """Block sizes that hold a whole number of thread tiles."""
    return [s for s in sizes if s % thread == 0]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def start_tile(problem: Problem, bsizes, thread: tuple[int, ...]) -> RTile:
    """The smallest aligned block for `thread`: on each spatial axis the smallest allowed
    block size that holds whole thread tiles; the smallest allowed step on every reduction
    axis."""
    ns = problem.n_spatial
    block = []
    for a in range(ns):
        allowed = _fits(thread[a], bsizes[a])
        block.append(allowed[0] if allowed else thread[a])
    step = tuple(bsizes[ns + r][0] for r in range(len(problem.axes) - ns))
    return RTile(tuple(block), thread, step)


def _moves(problem: Problem, bsizes, tile: RTile, grow: bool) -> list[RTile]:
    """Tiles one size step bigger (or smaller) on one axis; reduction steps only grow."""
    ns = problem.n_spatial
    out = []
    for a in reversed(range(ns)):
        allowed = _fits(tile.thread[a], bsizes[a])
        nxt = [s for s in allowed if s > tile.block[a]] if grow else \
            [s for s in allowed if s < tile.block[a]]
        if nxt:
            size = nxt[0] if grow else nxt[-1]
            out.append(RTile(tile.block[:a] + (size,) + tile.block[a + 1:], tile.thread,
                             tile.step))
    if grow:
        for r in range(len(problem.axes) - ns):
            nxt = [s for s in bsizes[ns + r] if s > tile.step[r]]
            if nxt:
                out.append(RTile(tile.block, tile.thread,
                                 tile.step[:r] + (nxt[0],) + tile.step[r + 1:]))
    return out


def cost_candidates(problem: Problem, m: Machine, tiles: list[RTile]) -> TileCosts:
    """The model's figures for `tiles` on `problem` (one vectorised call)."""
    ns, nr, n = problem.n_spatial, len(problem.axes) - problem.n_spatial, len(tiles)
    return cost_tiles(problem, m,
                      np.array([t.block for t in tiles], dtype=np.int64).T.reshape(ns, n),
                      np.array([t.thread for t in tiles], dtype=np.int64).T.reshape(ns, n),
                      np.array([t.step for t in tiles], dtype=np.int64).T.reshape(nr, n))


def _footprint(problem: Problem, costs: TileCosts) -> np.ndarray:
    """Bytes a block holds: its tile's input boxes per step, or (no reduction) its loads
    and its output."""
    if problem.has_reduction:
        return costs.box_bytes.astype(np.float64)
    return costs.dram_bytes / np.maximum(costs.blocks, 1)


def block_trajectory(problem: Problem, m: Machine, bsizes, thread: tuple[int, ...]
                     ) -> list[RTile]:
    """Block tiles visited by block-level scale-up for one thread tile, smallest first.

    Until the block has `START_WARPS` warps (or all the threads the problem can use), a move
    that saves nothing is still taken (innermost axis first): a block of a few threads cannot
    hide memory latency, whatever its reuse. After that, a move must save traffic."""
    tile = start_tile(problem, bsizes, thread)
    costs = cost_candidates(problem, m, [tile])
    k = 0
    path = [tile] if costs.valid[0] else []
    usable = math.prod(-(-n // t) for n, t in zip(problem.extents, thread))
    min_threads = min(START_WARPS * m.hw.warp_size, m.hw.max_threads_per_block, usable)
    for _ in range(MAX_MOVES):
        filling = costs.threads[k] < min_threads
        if not filling and costs.valid[k] and costs.t_compute[k] >= costs.t_traffic[k]:
            break  # compute-bound at the block level
        moves = _moves(problem, bsizes, tile, grow=True)
        if filling:
            moves = [mv for mv in moves if mv.block != tile.block]
        if not moves:
            break
        cur_traffic, cur_footprint = costs.dram_bytes[k], _footprint(problem, costs)[k]
        costs = cost_candidates(problem, m, moves)
        saved = cur_traffic - costs.dram_bytes
        added = _footprint(problem, costs) - cur_footprint
        ok = costs.valid & ((saved >= 0) if filling else (saved > 0))
        gain = np.where(ok, saved / np.maximum(added, 1.0), -np.inf)
        k = int(np.argmax(gain))
        if not np.isfinite(gain[k]):
            break
        tile = moves[k]
        path.append(tile)
    return path + grow_steps(problem, m, bsizes, tile)


def grow_steps(problem: Problem, m: Machine, bsizes, tile: RTile) -> list[RTile]:
    """Longer reduction steps for coalescing: grow the step along the reduction axis that
    extends a staged input's contiguous run until every run is `COALESCE_BYTES` long (or the
    axis is whole), while the tile stays within the capacity limits."""
    ns = problem.n_spatial
    if not problem.has_reduction:
        return []
    path = []
    for _ in range(MAX_MOVES):
        sizes = np.array(tile.block + tile.step, dtype=np.int64).reshape(-1, 1)
        short = set()
        for op, reduced in zip(problem.operands, problem.reduced):
            if not reduced:
                continue
            _, run = op.contiguous_run(sizes)
            if int(run[0]) * op.itemsize >= COALESCE_BYTES:
                continue
            # The innermost dimension not yet read whole, and the reduction axes indexing it.
            spans = op.spans(sizes)
            for d in reversed(range(len(op.dims))):
                if int(spans[d, 0]) < op.dims[d].size:
                    short.update(a - ns for a, c in enumerate(op.dims[d].coefs)
                                 if c and a >= ns)
                    break
        moves = [mv for mv in _moves(problem, bsizes, tile, grow=True)
                 if mv.block == tile.block and any(mv.step[r] != tile.step[r] for r in short)]
        if not moves:
            break
        costs = cost_candidates(problem, m, moves)
        ok = np.flatnonzero(costs.valid)
        if not len(ok):
            break
        tile = moves[int(ok[0])]
        path.append(tile)
    return path


def _warps_to_fill(problem: Problem, m: Machine) -> int:
    """Warps per SM that construction aims for: what the model needs for latency hiding
    (`HIDING_WARPS` for a reduction on CUDA cores, tilekit.roll.cost.hiding_warps), at least
    `START_WARPS`."""
    need = hiding_warps(problem, m, np.ones(1, dtype=bool))
    return max(START_WARPS, min(int(np.max(need)), m.hw.max_warps_per_sm))


def scale_out(problem: Problem, m: Machine, bsizes, tile: RTile) -> list[RTile]:
    """Tiles visited while shrinking a block whose grid leaves SMs idle or short of the warps
    that hide latency (fewer than `_warps_to_fill` per SM), along the axis whose shrinking
    adds the least global traffic."""
    path = []
    blocks = math.prod(tile.grid(problem))
    warps = -(-tile.threads() // m.hw.warp_size)
    fill = _warps_to_fill(problem, m)
    for _ in range(MAX_MOVES):
        if blocks >= m.hw.sm_count and blocks * warps >= m.hw.sm_count * fill:
            break
        moves = _moves(problem, bsizes, tile, grow=False)
        if not moves:
            break
        costs = cost_candidates(problem, m, moves)
        traffic = np.where(costs.valid, costs.dram_bytes, np.inf)
        best = int(np.argmin(traffic))
        if not np.isfinite(traffic[best]):
            break
        tile, blocks = moves[best], int(costs.blocks[best])
        warps = -(-int(costs.threads[best]) // m.hw.warp_size)
        path.append(tile)
    return path


# -- tensor cores -----------------------------------------------------------------------------

#: Block GEMMs offered to a contraction on tensor cores: (BM, BN, warps) and reduction steps
#: (multiples of the instruction's k). Roller's scale-up/scale-out constructs CUDA-core tiles
#: from the register tile outwards; a tensor-core tile is instead a whole number of warp tiles
#: of whole instructions, so these are enumerated (a few dozen) and costed with the rest.
TENSOR_BLOCKS = ((64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 4), (128, 128, 8),
                 (128, 256, 8), (256, 128, 8), (32, 64, 2), (64, 32, 2))
TENSOR_STEPS = (1, 2, 4)          # x 2 instruction k: 32, 64, 128 for fp16


#: Hopper block GEMMs (BM, BN, consumer warpgroups): wgmma.m64nBNk16 per 64 rows of a
#: consumer, steps of 64 (tilekit.schedule.mma.wgmma_plan decides whether each runs so).
WGMMA_BLOCKS = ((128, 256, 2), (256, 128, 2), (128, 128, 2), (128, 128, 1), (64, 256, 1),
                (64, 128, 1), (128, 64, 1), (64, 64, 1))


def wgmma_tiles(problem: Problem) -> list[RTile]:
    """The Hopper block GEMMs of a contraction with one M, one N and one K axis: the block
    `BM x BN` (batch axes 1), the tile's threads its consumer warpgroups, steps of 64 (the
    whole K when shorter)."""
    from tilekit.schedule.mma import WARPGROUP, WGMMA_BK
    c = problem.contraction
    if len(c.m_axes) != 1 or len(c.n_axes) != 1 or len(c.k_axes) != 1:
        return []
    ext = dict(zip(problem.axes, problem.extents))
    names = problem.axes[:problem.n_spatial]
    out = []
    for bm, bn, consumers in WGMMA_BLOCKS:
        if bm > 2 * ext[c.m_axes[0]] and bm > 64 or bn > 2 * ext[c.n_axes[0]] and bn > 64:
            continue           # more than half the block would be padding
        sizes = {c.m_axes[0]: bm, c.n_axes[0]: bn, **{a: 1 for a in c.batch_axes}}
        block = tuple(sizes[a] for a in names)
        thread = _threads_over(block, WARPGROUP * consumers)
        if thread is None:
            continue
        out.append(RTile(block, thread, (min(WGMMA_BK, ext[c.k_axes[0]]),)))
    return out


#: Block GEMMs offered to a float32 contraction on CUDA cores (tilekit.schedule.simt):
#: (BM, BN, TM, TN), each 64-256 threads with 8 or 16 thread columns, and steps. Scale-up
#: finds register tiles by reuse alone; these are the ones the SIMT GEMM's 16-byte fragments
#: and conflict-free lanes need, offered on every machine so that the pick does not depend on
#: the search path (costed with the rest; the plan decides whether each runs so).
SIMT_BLOCKS = ((128, 128, 8, 8), (64, 128, 8, 8), (128, 64, 8, 4), (64, 64, 4, 4),
               (32, 64, 4, 4), (32, 32, 4, 4))
SIMT_STEPS = (8, 16, 32)


def simt_tiles(problem: Problem, m: Machine) -> list[RTile]:
    """The SIMT block GEMMs of a float32 contraction (batch axes 1) for a CUDA machine; none
    otherwise. One axis per group: the blocks of `SIMT_BLOCKS` and the steps of
    `SIMT_STEPS`. Several (a convolution's pixels and window, a MatMul of 3-D activations):
    each block shared among a group's axes innermost first (`_spread`), the register tile on
    the innermost axes; steps of `SIMT_STEPS` on the first K axis with the others 1, and of
    whole windows (the K axes after the first whole, each at most 7) with the first at 1, 2
    or 4 (`tilekit.schedule.simt.MAX_WINDOW_STEP`)."""
    from tilekit.schedule.simt import MAX_WINDOW_STEP
    c = problem.contraction
    if c is None or c.dtype != "float32" or m.distributed:
        return []
    ext = dict(zip(problem.axes, problem.extents))
    names = problem.axes[:problem.n_spatial]
    k_names = problem.axes[problem.n_spatial:]
    steps = [{c.k_axes[0]: s, **{a: 1 for a in c.k_axes[1:]}} for s in SIMT_STEPS]
    if len(c.k_axes) > 1 and all(ext[a] <= 7 for a in c.k_axes[1:]):
        window = math.prod(ext[a] for a in c.k_axes[1:])
        steps += [{c.k_axes[0]: s, **{a: ext[a] for a in c.k_axes[1:]}} for s in (1, 2, 4)
                  if 4 <= s * window <= MAX_WINDOW_STEP]
    out = []
    for bm, bn, tm, tn in SIMT_BLOCKS:
        block = {a: 1 for a in c.batch_axes}
        thread = {a: 1 for a in names}
        if not (_simt_spread(c.m_axes, bm, ext, block)
                and _simt_spread(c.n_axes, bn, ext, block)):
            continue
        if not (_register_tile(c.m_axes, tm, block, thread)
                and _register_tile(c.n_axes, tn, block, thread)):
            continue
        for step in steps:
            rt = RTile(tuple(block[a] for a in names), tuple(thread[a] for a in names),
                       tuple(step[a] for a in k_names))
            if rt not in out:
                out.append(rt)
    return out


def _simt_spread(axes, total: int, ext, sizes: dict) -> bool:
    """A SIMT block's extent over a group: one axis takes it unless more than half of it
    would be padding (and it is over 32); several share it innermost first (`_spread`)."""
    if len(axes) == 1:
        sizes[axes[0]] = total
        return not (total > 2 * ext[axes[0]] and total > 32)
    return _spread(axes, total, ext, sizes)


def _register_tile(axes, t: int, block: dict, thread: dict) -> bool:
    """A register tile of `t` positions on a group's innermost axes: each axis takes what
    divides its block, innermost first, and is whole before the next takes any."""
    left = t
    for a in reversed(axes):
        take = math.gcd(block[a], left)
        thread[a] = take
        left //= take
        if left == 1:
            return True
        if take != block[a]:
            return False
    return left == 1


def tensor_core_tiles(problem: Problem, m: Machine) -> list[RTile]:
    """Block GEMM tiles of a contraction: BM over its M axes and BN over its N axes (innermost
    axis first, powers of two, at most twice an axis' extent), batch axes 1, the reduction's
    innermost axes whole when short (a convolution window) and its first axis stepped so that
    the step is a multiple of the instruction's k; threads `32 x warps` laid over the axes."""
    from tilekit.schedule.mma import MMA
    c = problem.contraction
    ik = MMA[tensor_compute(problem, m)][3]
    ext = dict(zip(problem.axes, problem.extents))
    names = problem.axes[:problem.n_spatial]
    out = []
    for bm, bn, warps in TENSOR_BLOCKS:
        sizes = {a: 1 for a in c.batch_axes}
        if not (_spread(c.m_axes, bm, ext, sizes) and _spread(c.n_axes, bn, ext, sizes)):
            continue
        block = tuple(sizes[a] for a in names)
        thread = _threads_over(block, 32 * warps)
        if thread is None:
            continue
        for step in _tensor_steps(c.k_axes, ext, ik):
            out.append(RTile(block, thread, tuple(min(step[a], ext[a]) for a in problem.axes[
                problem.n_spatial:])))
    if tensor_compute(problem, m) in m.wgmma_offered:
        out += wgmma_tiles(problem)
    return list(dict.fromkeys(out))


def _spread(axes, total: int, ext, sizes: dict) -> bool:
    """Share `total` (a power of two) among `axes`, innermost first, each at most the next
    power of two of its extent; the outermost takes what is left (at most twice its
    extent). False when that would waste more than half the block."""
    left = total
    for a in reversed(axes[1:]):
        s = min(left, _pow2_at_least(ext[a]))
        sizes[a] = s
        left //= s
    if not axes:
        return total == 1
    sizes[axes[0]] = left
    return left <= 2 * ext[axes[0]] or left == 1


def _threads_over(block, threads: int) -> tuple[int, ...] | None:
    """A register tile per axis with `prod(block / thread) == threads` (innermost axes take
    threads first), or None."""
    left = threads
    per_axis = [1] * len(block)
    for i in reversed(range(len(block))):
        t = math.gcd(block[i], left)
        per_axis[i] = t
        left //= t
    if left != 1:
        return None
    return tuple(b // t for b, t in zip(block, per_axis))


def _tensor_steps(k_axes, ext, ik: int) -> list[dict]:
    """Reduction steps: the axes after the first whole when each is at most 7 (a window),
    else stepped like the first; the first (outermost) a power of two making the step a
    multiple of `ik`, at 1, 2 and 4 times the smallest such."""
    inner = {a: ext[a] for a in k_axes[1:] if ext[a] <= 7}
    rest = [a for a in k_axes[1:] if a not in inner]
    out = []
    for scale in TENSOR_STEPS:
        step = dict(inner)
        for a in rest:
            step[a] = min(_pow2_at_least(ext[a]), 2 * ik)
        fixed = math.prod(step.values()) if step else 1
        first = 1
        while (first * fixed) % ik:
            first *= 2
            if first > 4096:
                break
        first *= scale
        step[k_axes[0]] = first
        if (first * fixed) % ik == 0:
            out.append(step)
    return out
