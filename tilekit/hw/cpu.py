"""The CPU part of a `kind: cpu` profile: cores, SIMD, the cache levels, fork/join, and how a CPU
is seen through the GPU-shaped fields of `Profile`.

A CPU is described by what its own cost model needs (`CpuSpec`): physical cores and hardware
threads, the SIMD ISA (its vector width in bytes, its architectural vector registers), the FMA
units per core, the memory levels l1, l2, l3 (optional) and dram as `CpuLevel`s, and the cost
of one OpenMP fork/join. Peaks are derived, never written: cores x FMA units x lanes x 2 FLOP x
clock (`peak`).

The tools that predate CPUs read SMs, warps and shared memory. A cpu profile fills those fields
from its CPU figures (`gpu_view`), one documented mapping (docs/hwprofiles.md, "CPU profiles"):
a core is an SM, its hardware threads one block of one-thread warps (as a tile's workers on a
distributed machine), the L1 data cache is the shared memory, the outermost cache (all of its
instances) is the device-wide L2, the fork/join cost is the launch overhead. `Profile` checks
that the two agree, so a variant is made with `Profile.with_cpu`, which recomputes them.
"""

from __future__ import annotations

import functools
import math

from dataclasses import dataclass, replace
from typing import Any

from tilekit.errors import ProfileError
from tilekit.hw.units import format_quantity

#: SIMD instruction sets a cpu profile may name, and their vector width in bytes (SVE's is the
#: implementation's: a multiple of 16 from 16 to 256).
ISA_WIDTH = {"avx2": 32, "avx512": 64, "neon": 16, "sve": None}
ISAS = tuple(ISA_WIDTH)
#: Architectural vector registers of each ISA: AVX2's ymm0-15 (Intel SDM vol. 1, 14.1), AVX-512's
#: zmm0-31 (vol. 1, 15.1), the 32 NEON V and SVE Z registers of AArch64 (Arm ARM, B1.2).
ISA_REGISTERS = {"avx2": 16, "avx512": 32, "neon": 32, "sve": 32}
#: General-purpose (integer) registers beside them: x86-64's 16 (Intel SDM vol. 1, 3.4.1;
#: the stack pointer among them), AArch64's 31 (X0-X30, Arm ARM, B1.2).
ISA_INTEGER_REGISTERS = {"avx2": 16, "avx512": 16, "neon": 31, "sve": 31}


def isa_of_flags(flags: set[str] | frozenset[str], machine: str) -> str | None:
    """The widest SIMD ISA of `ISAS` a CPU with these feature `flags` (/proc/cpuinfo's
    `flags`, or `Features` on AArch64) and `machine` (`platform.machine()`) runs, which is
    what `g++ -march=native` targets there; None when it has none of them."""
    if machine in ("x86_64", "AMD64", "i686", "i386"):
        return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else None
    if machine in ("aarch64", "arm64"):
        return "sve" if "sve" in flags else "neon"
    return None


def cpuinfo_field(*keys: str) -> str | None:
    """The first value of one of `keys` in /proc/cpuinfo (None without one, or off Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in keys and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


@functools.cache
def host_isa() -> str | None:
    """`isa_of_flags` of this machine (Linux: /proc/cpuinfo's flags; None elsewhere)."""
    import platform

    flags = cpuinfo_field("flags", "Features")
    return None if flags is None else isa_of_flags(set(flags.split()), platform.machine())


#: Memory levels of a cpu profile, innermost first; `registers`, `l1`, `l2` and `dram` are required.
CPU_LEVELS = ("registers", "l1", "l2", "l3", "dram")
CACHE_LEVELS = ("l1", "l2", "l3")
#: Bytes of one element of each profile dtype (`Profile.simd_lanes`).
DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int32": 4,
               "int8": 1}
#: The dtypes a cpu profile has peaks for (FMA on vector lanes), and their bytes.
PEAK_DTYPE_BYTES = {dtype: DTYPE_BYTES[dtype] for dtype in ("fp64", "fp32")}
#: One FMA is two floating-point operations.
FLOP_PER_FMA = 2


@dataclass(frozen=True)
class CpuLevel:
    """One level of a CPU's memory: a cache (l1, l2, l3) or the DRAM.

    `capacity_bytes` is one instance of the level; `shared_by` the cores that share that instance
    (1: private to a core; for dram, all cores). `bandwidth` is what one core reading alone gets
    from the level, `bandwidth_all` what all cores reading at once get together (B/s)."""

    name: str
    label: str
    capacity_bytes: int
    shared_by: int
    line_bytes: int
    bandwidth: float
    bandwidth_all: float
    latency: float | None = None

    @property
    def private(self) -> bool:
        """Whether each core has its own instance."""
        return self.shared_by == 1

    @property
    def per_core_bytes(self) -> int:
        """A core's share of one instance when all the cores sharing it use it."""
        return self.capacity_bytes // self.shared_by

    def instances(self, cores: int) -> int:
        return max(1, cores // self.shared_by)

    def total_bytes(self, cores: int) -> int:
        """The level's capacity over the whole chip."""
        return self.capacity_bytes * self.instances(cores)


@dataclass(frozen=True)
class CpuSpec:
    """The CPU figures of a `kind: cpu` profile (base units: bytes, B/s, s)."""

    cores: int                      # physical cores
    threads: int                    # hardware threads, all cores (SMT: a multiple of cores)
    isa: str                        # avx2, avx512, neon, sve
    simd_bytes: int                 # one vector register
    vector_registers: int           # architectural vector registers per hardware thread
    fma_units: int                  # vector FMA instructions a core issues per clock
    levels: tuple[CpuLevel, ...]    # l1, l2, [l3,] dram: innermost first
    fork_join_s: float              # one empty OpenMP parallel region on all cores

    @property
    def threads_per_core(self) -> int:
        return self.threads // self.cores

    def level(self, name: str) -> CpuLevel | None:
        return next((lv for lv in self.levels if lv.name == name), None)

    @property
    def caches(self) -> tuple[CpuLevel, ...]:
        return tuple(lv for lv in self.levels if lv.name in CACHE_LEVELS)


def lanes(cpu: CpuSpec, dtype: str) -> int:
    """Elements of `dtype` (fp32, fp64) in one vector register."""
    return cpu.simd_bytes // PEAK_DTYPE_BYTES[dtype]


def peak_per_core(cpu: CpuSpec, clock_hz: float, dtype: str) -> float:
    """FMA units x lanes x 2 FLOP x clock: one core's dense peak for `dtype`, FLOP/s."""
    return cpu.fma_units * lanes(cpu, dtype) * FLOP_PER_FMA * clock_hz


def peaks(cpu: CpuSpec, clock_hz: float) -> dict[str, float]:
    """The chip's dense peaks: cores x the per-core peak, for every dtype with FMA lanes."""
    return {dtype: cpu.cores * peak_per_core(cpu, clock_hz, dtype) for dtype in PEAK_DTYPE_BYTES}


def peak_sources(cpu: CpuSpec, clock_hz: float) -> dict[str, str]:
    """The `derived:` source of each peak, chip and per core (shown by `tk-hw show`)."""
    ghz = format_quantity(clock_hz, "frequency")
    out = {}
    for dtype in PEAK_DTYPE_BYTES:
        core = (f"{cpu.fma_units} FMA units x {lanes(cpu, dtype)} {dtype} lanes "
                f"({cpu.simd_bytes} B {cpu.isa}) x {FLOP_PER_FMA} FLOP x {ghz}")
        out[f"compute.peak.{dtype}"] = f"derived: {cpu.cores} cores x {core}"
        out[f"compute.peak_per_core.{dtype}"] = f"derived: {core}"
    return out


def private_all_source(level: CpuLevel, cores: int) -> str:
    """The source of a private level's derived all-core bandwidth."""
    return f"derived: memory[{level.name}].bandwidth x {cores} cores (a private level)"


def level_sources(cpu: CpuSpec) -> dict[str, str]:
    """The `derived:` sources of the private levels' all-core bandwidths that are one core's x
    the cores (a file that does not state them gets these)."""
    return {f"memory[{lv.name}].bandwidth_all": private_all_source(lv, cpu.cores)
            for lv in cpu.caches if lv.private and lv.bandwidth_all == lv.bandwidth * cpu.cores}


def rescale_levels(old: CpuSpec, cores: int) -> tuple[CpuLevel, ...]:
    """`old`'s levels on a chip of `cores` cores: DRAM is shared by all of them, and a private
    level whose all-core bandwidth was one core's x the cores stays so; a shared cache with
    more sharers than the new chip has cores is shared by all of them (a few cores of a
    cluster: a VM's vCPUs); stated figures stay."""
    out = []
    for lv in old.levels:
        if lv.name == "dram":
            lv = replace(lv, shared_by=cores)
        elif cores % lv.shared_by:
            lv = replace(lv, shared_by=math.gcd(lv.shared_by, cores))
        elif lv.private and lv.bandwidth_all == lv.bandwidth * old.cores:
            lv = replace(lv, bandwidth_all=lv.bandwidth * cores)
        out.append(lv)
    return tuple(out)


# -- the GPU-shaped view ------------------------------------------------------------------------

def outer_cache(cpu: CpuSpec) -> CpuLevel:
    """The last cache before DRAM (l3, else l2)."""
    return cpu.caches[-1]


def gpu_view(cpu: CpuSpec, clock_hz: float) -> dict[str, Any]:
    """The values of `Profile`'s GPU-shaped fields for this CPU (module docstring)."""
    per_core = cpu.threads_per_core
    regs_thread = cpu.vector_registers * cpu.simd_bytes // 4  # 32-bit registers
    l1 = cpu.level("l1")
    outer = outer_cache(cpu)
    dram = cpu.level("dram")
    return {
        "sm_count": cpu.cores, "warp_size": 1,
        "max_threads_per_block": per_core, "max_threads_per_sm": per_core,
        "max_blocks_per_sm": 1, "max_warps_per_sm": per_core,
        "regs_per_sm": regs_thread * per_core, "regs_per_block": regs_thread * per_core,
        "max_regs_per_thread": regs_thread,
        "smem_per_sm": l1.capacity_bytes, "smem_per_block": l1.capacity_bytes,
        "smem_per_block_static": l1.capacity_bytes,
        "smem_bandwidth_per_sm": l1.bandwidth, "smem_transaction_bytes": l1.line_bytes,
        "smem_banks": None, "smem_bank_bytes": None,
        "l2_bytes": outer.total_bytes(cpu.cores), "l2_bandwidth": outer.bandwidth_all,
        "l2_transaction_bytes": outer.line_bytes,
        "dram_bytes": dram.capacity_bytes, "dram_bandwidth": dram.bandwidth_all,
        "transaction_bytes": dram.line_bytes, "dram_latency": dram.latency,
        "launch_overhead": cpu.fork_join_s, "exchange_bandwidth": None,
        "peaks": peaks(cpu, clock_hz), "tensor_peaks": {}, "mma_shapes": (),
    }


#: Where each `gpu_view` field comes from, for the message when they disagree.
VIEW_ORIGIN = {
    "sm_count": "cores.physical", "max_threads_per_block": "cores.threads / cores.physical",
    "max_threads_per_sm": "cores.threads / cores.physical",
    "max_warps_per_sm": "cores.threads / cores.physical",
    "regs_per_sm": "simd", "regs_per_block": "simd", "max_regs_per_thread": "simd",
    "smem_per_sm": "memory[l1].capacity", "smem_per_block": "memory[l1].capacity",
    "smem_per_block_static": "memory[l1].capacity", "smem_bandwidth_per_sm":
    "memory[l1].bandwidth", "smem_transaction_bytes": "memory[l1].line",
    "l2_bytes": "the outermost cache", "l2_bandwidth": "the outermost cache",
    "l2_transaction_bytes": "the outermost cache", "dram_bytes": "memory[dram].capacity",
    "dram_bandwidth": "memory[dram].bandwidth_all", "transaction_bytes": "memory[dram].line",
    "dram_latency": "memory[dram].latency", "launch_overhead": "parallel.fork_join",
    "peaks": "the derived peaks", "clock_hz": "compute.clock",
}


# -- rules ----------------------------------------------------------------------------------------

def _bytes(n: int) -> str:
    return format_quantity(n, "bytes")


def check_cpu(cpu: CpuSpec) -> None:
    """The rules a CPU's figures keep; each error names the file path of the field to fix."""
    if cpu.threads < cpu.cores or cpu.threads % cpu.cores:
        raise ProfileError(f"{cpu.threads} hardware threads is not a multiple of "
                           f"cores.physical {cpu.cores}", "cores.threads",
                           "count every hardware thread of the chip: cores x threads per core")
    if cpu.isa not in ISA_WIDTH:
        raise ProfileError(f"unknown SIMD ISA '{cpu.isa}'", "simd.isa",
                           f"use one of: {', '.join(ISAS)}")
    width = ISA_WIDTH[cpu.isa]
    if width is None:
        if cpu.simd_bytes % 16 or not 16 <= cpu.simd_bytes <= 256:
            raise ProfileError(f"{_bytes(cpu.simd_bytes)} is not an SVE vector length",
                               "simd.width", "SVE vectors are 16 to 256 B, a multiple of 16 B")
    elif cpu.simd_bytes != width:
        raise ProfileError(f"{_bytes(cpu.simd_bytes)} is not the {cpu.isa} vector width",
                           "simd.width", f"{cpu.isa} vectors are {width} B")
    if cpu.vector_registers != ISA_REGISTERS[cpu.isa]:
        raise ProfileError(f"{cpu.vector_registers} is not the number of {cpu.isa} vector "
                           f"registers", "simd.registers",
                           f"{cpu.isa} has {ISA_REGISTERS[cpu.isa]}")
    names = [lv.name for lv in cpu.levels]
    if names[:2] != ["l1", "l2"] or names[-1] != "dram" or not set(names) <= set(CPU_LEVELS):
        raise ProfileError(f"levels {', '.join(names)}", "memory",
                           "a cpu profile lists registers, l1, l2, l3 (optional), dram")
    inner = None
    for lv in cpu.levels:
        where = f"memory[{lv.name}]"
        if lv.line_bytes & (lv.line_bytes - 1):
            raise ProfileError(f"{_bytes(lv.line_bytes)} is not a power of two", f"{where}.line")
        if lv.bandwidth_all < lv.bandwidth:
            raise ProfileError(
                f"all cores together ({format_quantity(lv.bandwidth_all, 'bandwidth')}) are "
                f"slower than one core ({format_quantity(lv.bandwidth, 'bandwidth')})",
                f"{where}.bandwidth_all", "bandwidth is one core's, bandwidth_all the chip's")
        if lv.name == "dram":
            if lv.shared_by != cpu.cores:
                raise ProfileError(f"dram is shared by all {cpu.cores} cores, not "
                                   f"{lv.shared_by}", f"{where}.shared_by")
            continue
        if lv.shared_by > cpu.cores or cpu.cores % lv.shared_by:
            raise ProfileError(f"{lv.shared_by} cores per instance does not divide "
                               f"cores.physical {cpu.cores}", f"{where}.shared_by",
                               "1 for a cache private to each core; the cores of one cluster "
                               "or of the chip for a shared one")
        if inner is not None:
            if lv.capacity_bytes < inner.capacity_bytes:
                raise ProfileError(f"{_bytes(lv.capacity_bytes)} is less than "
                                   f"memory[{inner.name}].capacity "
                                   f"{_bytes(inner.capacity_bytes)}", f"{where}.capacity",
                                   "each cache level holds at least as much as the one inside "
                                   "it (L1 <= L2 <= L3, one instance each)")
            if lv.shared_by < inner.shared_by:
                raise ProfileError(f"shared by {lv.shared_by} cores, fewer than "
                                   f"memory[{inner.name}] ({inner.shared_by})",
                                   f"{where}.shared_by",
                                   "an outer level is shared by at least the cores of an "
                                   "inner one")
        inner = lv
    if cpu.fma_units < 1:
        raise ProfileError(f"must be positive, got {cpu.fma_units}", "simd.fma_units")
    if not cpu.fork_join_s > 0:
        raise ProfileError(f"must be positive, got {cpu.fork_join_s}", "parallel.fork_join")
