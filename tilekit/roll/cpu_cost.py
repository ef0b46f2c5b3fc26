"""The CPU cost model: how long one CPU kernel takes on a `kind: cpu` profile (a roofline).

tk-roll prices every op of a module rolled for a CPU profile here, tk-weld its groups, and
the later readers (tk-ram, the module totals, reports) read the result as the same
`Estimate` the GPU model writes. One kernel is a parallel loop over its blocks (the unit of
work one core takes: a `cpu_gemm` block of `mc x nc` outputs, a block of rows of a
`cpu_loops` nest, a block of an opaque op's grid), so:

    cores used   = min(blocks, cores)          waves = ceil(blocks / cores)
    compute      = flops / blocks x waves / (peak_flops_per_core x achievable.compute)
    memory       = bytes / (bandwidth of the level the working set lives in, for the cores
                   used, x achievable)
    time         = max(compute, memory) + fork_join_s (a kernel of more than one block)

- `flops`: iteration points x reduction points x flops per point; for `cpu_gemm` the padded
  micro-tiles' (`mr x nr` tiles that overhang a block's M or N compute zeros); a `cpu_loops`
  kernel
  without a vector axis runs scalar code: its peak is one lane's.
- the **peak** is the profile's fp32 per-core peak (fp64 for float64 ops); half-precision and
  integer ops are priced at the fp32 rate (the CPU computes them in float32 or integer lanes
  of the same width).
- `bytes`: for `cpu_gemm` what the blocks read (each block reads its rows of A, M points x
  K, and packs its B panel, K x N points, once) plus the output; for everything else every tensor the
  kernel reads or writes, once (re-reads of a reduction's window are served by L1).
- the **level**: the innermost of L2 (the used cores' private L2s together), L3 (the
  instances the used cores share) and DRAM that holds the kernel's working set (every tensor
  it reads or writes). Its bandwidth is one core's times the cores used, at most the level's
  all-core figure; DRAM at `achievable.dram`, the caches at `achievable.cache`. L1 is left
  out: it holds the blocks' tiles, not the tensors passed between kernels.
- `bound`: compute, dram, cache (an L2 or L3), or launch (the fork/join dominates).

A group of ops run as one kernel (an op with its elementwise chain: tk-weld on a CPU) is
priced the same way from the members' flops and bytes, less the bytes of the intermediates
that never go to memory, with the main op's blocks (`group_estimate`).

Deliberately absent: cache conflicts, TLB misses, SMT, the boost clock (the profile's base
clock is used), memory-level parallelism below the bandwidth figures, NUMA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilekit.ir.payloads import Estimate
from tilekit.roll.cost import _unique_bytes
from tilekit.ir.graph import graph, op_analysis
from tilekit.roll.problem import Problem, problem_from_analysis, tensor_bytes
from tilekit.schedule.cpu import CpuShape
from tilekit.schedule.shape import OpFacts, analysis_facts

#: The cache levels a working set may live in, innermost first (see the module docstring).
SERVING_LEVELS = ("l2", "l3")


@dataclass(frozen=True)
class Level:
    """Where a kernel's working set lives, and its bandwidth for the cores used (B/s)."""

    name: str
    bandwidth: float


def serving_level(profile, working_set: float, cores_used: int) -> Level:
    """The innermost of L2, L3 and DRAM that holds `working_set` bytes for `cores_used`
    cores, with its bandwidth for them (scaled by the achievable fraction)."""
    ach = profile.achievable
    for name in SERVING_LEVELS:
        if not any(lv.name == name for lv in profile.caches):
            continue
        lv = profile.cache(name)
        instances = max(1, -(-cores_used // lv.shared_by))
        if working_set <= lv.capacity_bytes * instances:
            return Level(name, min(lv.bandwidth * cores_used, lv.bandwidth_all) * ach.smem)
    dram = profile.cache("dram")
    return Level("dram", min(dram.bandwidth * cores_used, dram.bandwidth_all) * ach.dram)


def peak_per_core(profile, dtype: str) -> float:
    """One core's achievable FLOP/s for ops computing in `dtype` (module docstring)."""
    key = "fp64" if dtype == "float64" else "fp32"
    return profile.peak_flops_per_core(key) * profile.achievable.compute


def kernel_estimate(profile, flops: float, traffic: float, working_set: float, blocks: int,
                    dtype: str = "float32", scalar: bool = False,
                    smem_bytes: float = 0.0) -> Estimate:
    """One CPU kernel of `blocks` parallel blocks (the module docstring's roofline)."""
    cores = profile.cores
    blocks = max(1, int(blocks))
    used = min(blocks, cores)
    waves = -(-blocks // cores)
    peak = peak_per_core(profile, dtype)
    if scalar:
        peak /= max(1, profile.simd_lanes("float64" if dtype == "float64" else "float32"))
    t_compute = flops / blocks * waves / peak
    level = serving_level(profile, working_set, used)
    t_memory = traffic / level.bandwidth
    fork = profile.fork_join_s if blocks > 1 else 0.0
    busy = max(t_compute, t_memory)
    bound = "compute" if t_compute >= t_memory and flops else \
        ("dram" if level.name == "dram" else "cache")
    if fork > busy:
        bound = "launch"
    return Estimate(time_us=(busy + fork) * 1e6, flops=float(flops), dram_bytes=float(traffic),
                    smem_bytes=float(smem_bytes), bound=bound, waves=waves,
                    wave_efficiency=blocks / (waves * cores))


def op_inputs(module, index: int, dtypes) -> tuple[OpFacts, Problem, int]:
    """What an expr op is priced from: its facts (what the CPU kernel decision reads), its
    problem, and the bytes of the tensors it reads or writes."""
    analysis = op_analysis(module, index)
    node = graph(module).nodes[index]
    return (analysis_facts(analysis, dtypes), problem_from_analysis(analysis, dtypes),
            tensor_bytes(module, dict.fromkeys(node.reads + node.writes)))


def op_estimate(profile, problem: Problem, shape: CpuShape, working_set: float) -> Estimate:
    """An expression op run as `shape` (its CPU kernel and blocks)."""
    flops = float(problem.output_points * problem.reduction_points * problem.flops_per_point)
    if shape.gemm is not None:
        g, t = shape.gemm, shape.tiles
        b = g.blocks
        padded = (-(-b.mc // t.mr) * t.mr * b.m_blocks) * (-(-b.nc // t.nr) * t.nr
                                                          * b.n_blocks) / max(1, g.m * g.n)
        item = 4
        traffic = g.batch * item * (g.m * g.k * b.n_blocks + g.k * g.n * b.m_blocks) \
            + problem.output_points * problem.out_itemsize
        panels = item * (b.mc * b.kc + b.kc * b.nc + b.mc * b.nc)
        return kernel_estimate(profile, flops * padded, traffic, working_set, shape.grid,
                               problem.dtype, smem_bytes=panels)
    return kernel_estimate(profile, flops, float(_unique_bytes(problem)), working_set,
                           shape.grid, problem.dtype, scalar=shape.loops.mode == "scalar")


def group_estimate(profile, parts: Sequence[Estimate], saved_bytes: float, blocks: int,
                   working_set: float, dtype: str = "float32") -> Estimate:
    """Several ops run as one kernel of `blocks` blocks (the main op's): their flops and
    bytes add up, less `saved_bytes` (intermediates kept in registers: their store and
    every in-group load)."""
    if len(parts) == 1 and not saved_bytes:
        return parts[0]
    flops = sum(p.flops for p in parts)
    traffic = max(0.0, sum(p.dram_bytes for p in parts) - saved_bytes)
    return kernel_estimate(profile, flops, traffic, working_set, blocks, dtype,
                           smem_bytes=max(p.smem_bytes for p in parts))


__all__ = ["Level", "group_estimate", "kernel_estimate", "op_estimate", "op_inputs", "peak_per_core",
           "serving_level"]
