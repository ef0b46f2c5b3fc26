"""The hardware profile as the tools read it: one frozen record of limits and rates, in base units.

A `Profile` is built from a validated `hwprofiles/*.yaml` file (`tilekit.hw.schema`), never
written by hand in code: hardware is data. Every attribute is in a base unit (bytes, B/s, Hz,
FLOP/s or OP/s, plain counts) and every figure's provenance is kept in `sources`.

Scope of per-level figures: registers and shared memory are *per SM* (per tile on a distributed
machine); L2 and DRAM are *device-wide*. `smem_bandwidth` is the device-wide sum
(per-SM bandwidth x SM count), so that a cost model can compare whole-kernel traffic over
each level's bandwidth directly: time = max(flops / peak, smem_bytes / smem_bandwidth,
dram_bytes / dram_bandwidth).

The consistency rules (shared memory per block <= per SM, warp size divides the block limit,
...) live in `__post_init__`, so a variant made with `dataclasses.replace` (twice the SMs, more
bandwidth) is checked by the same rules as a file.

A `kind: cpu` profile carries its CPU figures in `cpu` (`tilekit.hw.cpu.CpuSpec`: cores, SIMD,
caches, fork/join) and fills the GPU-shaped fields from them (`tilekit.hw.cpu.gpu_view`); its
accessors (`cores`, `simd_bytes`, `cache("l2")`, `fork_join_s`, ...) raise a ProfileError on
the other kinds, and a variant is made with `with_cpu`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from tilekit.errors import ProfileError
from tilekit.hw import cpu as cpu_model
from tilekit.hw.cpu import CpuLevel, CpuSpec
from tilekit.hw.units import format_quantity

KINDS = ("simt", "distributed", "cpu")
#: Keys of the per-dtype peak tables (`compute.simt`, `compute.tensor_core`).
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int32", "int8")
#: IR dtype names (tilekit.ir.model.DTYPES) accepted by `Profile.peak_flops` as well.
DTYPE_ALIASES = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                 "float8": "fp8", "tfloat32": "tf32"}
FEATURES = ("async_copy", "tma", "clusters", "cooperative_launch")
#: Lowest NVIDIA compute capability (x10) that has each feature (CUDA C++ Programming Guide).
FEATURE_MIN_CC = {"async_copy": 80, "tma": 90, "clusters": 90, "cooperative_launch": 60}
#: Registers are 32-bit on every machine we describe.
REGISTER_BYTES = 4
#: The PTX ISA encodes a register number in 8 bits; ptxas caps a thread at 255.
NVIDIA_MAX_REGS_PER_THREAD = 255
#: A cost model divides by these, and a fraction above 1 would claim more than the peak.
_FRACTIONS = ("dram", "compute", "smem", "compute_tensor")


def compute_capability(arch: str) -> tuple[int, int] | None:
    """(9, 0) for sm_90 and sm_90a; None for an arch that is not an NVIDIA `sm_XY`."""
    m = re.fullmatch(r"sm_(\d+)(\d)a?", arch)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class MmaShape:
    """One matrix-multiply instruction shape: D[m, n] += A[m, k] * B[k, n] per warp (group).

    For `wgmma.mma_async` (Hopper), `n` is the largest N; any multiple of 8 up to it is valid.
    """

    instruction: str
    dtype: str
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Features:
    """What the code generator may use."""

    async_copy: bool = False          # cp.async global -> shared without registers (sm_80+)
    tma: bool = False                 # tensor memory accelerator, cp.async.bulk.tensor (sm_90+)
    clusters: bool = False            # thread-block clusters and distributed shared memory (sm_90+)
    cooperative_launch: bool = False  # grid-wide barriers in one persistent kernel


@dataclass(frozen=True)
class Achievable:
    """Fractions of the peaks that real kernels reach; the cost model multiplies peaks by these.

    `compute` is the fraction of the SIMT (CUDA-core) peak, which is what tk-roll's tiles run
    on; `compute_tensor` the fraction of the tensor-core peak (a GEMM library's), `compute`
    when the profile does not state one. The two differ: a measured bf16 tensor-core matmul
    says nothing about an fp32 FMA loop."""

    dram: float
    compute: float
    smem: float
    compute_tensor: float | None = None

    @property
    def tensor(self) -> float:
        return self.compute if self.compute_tensor is None else self.compute_tensor


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy, innermost first (see `Profile.memory_levels`).

    `scope` says what `capacity_bytes` and `bandwidth` count: "sm" (per SM or tile) or
    "device". `bandwidth` is None where the profile does not model it (the register file).
    """

    name: str
    label: str
    scope: str
    capacity_bytes: int
    bandwidth: float | None
    transaction_bytes: int
    banks: int | None = None
    bank_bytes: int | None = None


#: Where each numeric attribute lives in a profile file: messages name the file's path.
FIELD_PATHS = {
    "sm_count": "parallelism.sm_count",
    "warp_size": "parallelism.warp_size",
    "max_threads_per_block": "parallelism.max_threads_per_block",
    "max_threads_per_sm": "parallelism.max_threads_per_sm",
    "max_blocks_per_sm": "parallelism.max_blocks_per_sm",
    "max_warps_per_sm": "parallelism.max_warps_per_sm",
    "regs_per_sm": "registers.per_sm",
    "regs_per_block": "registers.max_per_block",
    "max_regs_per_thread": "registers.max_per_thread",
    "smem_per_sm": "memory[shared].capacity",
    "smem_per_block": "memory[shared].per_block_optin",
    "smem_per_block_static": "memory[shared].per_block_static",
    "smem_banks": "memory[shared].banks",
    "smem_bank_bytes": "memory[shared].bank_width",
    "smem_bandwidth_per_sm": "memory[shared].bandwidth",
    "smem_transaction_bytes": "memory[shared].transaction",
    "l2_bytes": "memory[l2].capacity",
    "l2_bandwidth": "memory[l2].bandwidth",
    "l2_transaction_bytes": "memory[l2].transaction",
    "dram_bytes": "memory[dram].capacity",
    "dram_bandwidth": "memory[dram].bandwidth",
    "transaction_bytes": "memory[dram].transaction",
    "dram_latency": "memory[dram].latency",
    "exchange_bandwidth": "exchange.bandwidth",
    "clock_hz": "compute.clock",
    "launch_overhead": "launch.overhead",
}

_ATTR_OF_PATH = {path: attr for attr, path in FIELD_PATHS.items()}
#: Fields that do not change what a tool computes (see `Profile.content_hash`).
_NOT_HASHED = ("name", "aliases", "description", "labels", "sources", "references")


@dataclass(frozen=True)
class Profile:
    """A validated hardware profile. Units: bytes, B/s, Hz, FLOP/s (OP/s for integers)."""

    name: str
    vendor: str
    arch: str                      # nvcc target for NVIDIA (sm_90); a free name otherwise
    kind: str                      # "simt" or "distributed"
    # parallelism (a "block" is a thread block; on a distributed machine, a tile's workers)
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_warps_per_sm: int
    # 32-bit registers
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    # shared memory: per SM; a block gets `smem_per_block_static` without opting in,
    # `smem_per_block` (the opt-in maximum) with cudaFuncAttributeMaxDynamicSharedMemorySize
    smem_per_sm: int
    smem_per_block: int
    smem_per_block_static: int
    smem_bandwidth_per_sm: float
    smem_transaction_bytes: int
    # DRAM (device-wide); `transaction_bytes` is the DRAM/L2 sector a coalesced access moves
    dram_bytes: int
    dram_bandwidth: float
    transaction_bytes: int
    clock_hz: float
    peaks: Mapping[str, float]            # SIMT (CUDA-core) dense peaks, by dtype
    tensor_peaks: Mapping[str, float]     # tensor-core dense peaks, FP32 (int: INT32) accumulate
    achievable: Achievable
    features: Features = Features()
    mma_shapes: tuple[MmaShape, ...] = ()
    smem_banks: int | None = None
    smem_bank_bytes: int | None = None
    # L2 (device-wide): absent on a distributed machine (l2_bytes 0, the rest None)
    l2_bytes: int = 0
    l2_bandwidth: float | None = None
    l2_transaction_bytes: int | None = None
    # all-to-all tile interconnect of a distributed machine (aggregate B/s)
    exchange_bandwidth: float | None = None
    # seconds from one kernel's launch to the next one starting (None: not modelled)
    launch_overhead: float | None = None
    # seconds of a global load's round trip under load (None: not modelled)
    dram_latency: float | None = None
    aliases: tuple[str, ...] = ()
    description: str = ""
    #: memory level name -> what the vendor calls it ("HBM3", "In-Processor-Memory")
    labels: Mapping[str, str] = field(default_factory=dict)
    #: figure path ("parallelism.sm_count") -> source as written ("datasheet", "measured: ...")
    sources: Mapping[str, str] = field(default_factory=dict)
    #: source key -> the document it names (the file's `sources:` map)
    references: Mapping[str, str] = field(default_factory=dict)
    #: a `kind: cpu` profile's CPU figures (None on the other kinds)
    cpu: CpuSpec | None = None
    #: the file this came from, for messages only: not part of equality or the content hash
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check_profile(self)

    def __hash__(self) -> int:
        return hash(self.content_hash)

    # -- derived figures ---------------------------------------------------------------------

    @property
    def smem_bandwidth(self) -> float:
        """Shared-memory bandwidth of the whole device, B/s (per-SM bandwidth x SM count)."""
        return self.smem_bandwidth_per_sm * self.sm_count

    @property
    def reg_file_bytes(self) -> int:
        """Register file per SM, bytes."""
        return self.regs_per_sm * REGISTER_BYTES

    @property
    def has_l2(self) -> bool:
        return self.l2_bytes > 0

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(9, 0) for sm_90; None for an arch that is not an NVIDIA `sm_XY`."""
        return compute_capability(self.arch)

    @property
    def memory_levels(self) -> tuple[MemoryLevel, ...]:
        """The hierarchy, innermost first: registers, shared, l2 (if any), dram; on a cpu
        profile registers, l1, l2, l3 (if any), dram (`cpu_memory_levels`)."""
        if self.cpu is not None:
            return self._cpu_memory_levels()
        levels = [
            MemoryLevel("registers", self.labels.get("registers", "registers"), "sm",
                        self.reg_file_bytes, None, REGISTER_BYTES),
            MemoryLevel("shared", self.labels.get("shared", "shared memory"), "sm",
                        self.smem_per_sm, self.smem_bandwidth_per_sm, self.smem_transaction_bytes,
                        self.smem_banks, self.smem_bank_bytes),
        ]
        if self.has_l2:
            levels.append(MemoryLevel("l2", self.labels.get("l2", "L2"), "device", self.l2_bytes,
                                      self.l2_bandwidth, self.l2_transaction_bytes or 0))
        levels.append(MemoryLevel("dram", self.labels.get("dram", "DRAM"), "device",
                                  self.dram_bytes, self.dram_bandwidth, self.transaction_bytes))
        return tuple(levels)

    def _cpu_memory_levels(self) -> tuple[MemoryLevel, ...]:
        cpu = self._need_cpu("memory")
        levels = [MemoryLevel("registers", self.labels.get("registers", "vector registers"),
                              "thread", cpu.vector_registers * cpu.simd_bytes, None,
                              cpu.simd_bytes)]
        for lv in cpu.levels:
            scope = ("device" if lv.name == "dram" or lv.shared_by == cpu.cores
                     else "core" if lv.private else "cluster")
            levels.append(MemoryLevel(lv.name, lv.label, scope, lv.capacity_bytes, lv.bandwidth,
                                      lv.line_bytes))
        return tuple(levels)

    def level(self, name: str) -> MemoryLevel:
        """The memory level called `name` (registers, shared, l2, dram; on a cpu profile
        registers, l1, l2, l3, dram)."""
        for lv in self.memory_levels:
            if lv.name == name:
                return lv
        known = ", ".join(lv.name for lv in self.memory_levels)
        raise ProfileError(f"no memory level '{name}'", f"{self.name}: memory",
                           f"this profile has: {known}")

    def peak_flops(self, dtype: str, tensor_core: bool = False) -> float:
        """Dense peak rate for `dtype` (profile key `fp16` or IR name `float16`), FLOP/s or OP/s.

        `tensor_core=True` reads the tensor-core (matrix unit) table, otherwise the SIMT one.
        A dtype the table lacks is an error listing what it has: callers choose the fallback.
        """
        key = DTYPE_ALIASES.get(dtype, dtype)
        table = self.tensor_peaks if tensor_core else self.peaks
        if key not in table:
            section = "compute.tensor_core" if tensor_core else "compute.simt"
            raise ProfileError(f"no peak for dtype '{dtype}'", f"{self.name}: {section}",
                               f"this profile has: {', '.join(table) or 'none'}")
        return table[key]

    def has_peak(self, dtype: str, tensor_core: bool = False) -> bool:
        table = self.tensor_peaks if tensor_core else self.peaks
        return DTYPE_ALIASES.get(dtype, dtype) in table

    def achievable_flops(self, dtype: str, tensor_core: bool = False) -> float:
        """`peak_flops` x the achievable compute fraction."""
        a = self.achievable
        return self.peak_flops(dtype, tensor_core) * (a.tensor if tensor_core else a.compute)

    def figure(self, path: str) -> Any:
        """The value of the figure at a file path (`memory[dram].bandwidth`), in base units.

        Every path in `sources` resolves: an MMA entry gives its `MmaShape`, `features` the
        `Features` record.
        """
        if self.cpu is not None:
            found = self._cpu_figure(path)
            if found is not None:
                return found
        if path in _ATTR_OF_PATH:
            return getattr(self, _ATTR_OF_PATH[path])
        section, _, key = path.partition(".")
        if path == "memory[registers].capacity":
            return self.reg_file_bytes
        if path == "features":
            return self.features
        if section == "achievable" and key in _FRACTIONS:
            return getattr(self.achievable, key)
        m = re.fullmatch(r"compute\.(simt|tensor_core)\.(\w+)", path)
        if m and m.group(2) in (self.peaks if m.group(1) == "simt" else self.tensor_peaks):
            return self.peak_flops(m.group(2), tensor_core=m.group(1) == "tensor_core")
        m = re.fullmatch(r"compute\.mma\[(\d+)\]", path)
        if m and int(m.group(1)) < len(self.mma_shapes):
            return self.mma_shapes[int(m.group(1))]
        raise ProfileError(f"no figure '{path}'", self.name,
                           f"figures: {', '.join(self.sources)}")

    def _cpu_figure(self, path: str) -> Any:
        """A cpu profile's figure at `path`, None when `path` is not one of the CPU paths."""
        cpu = self.cpu
        simple = {"cores.physical": cpu.cores, "cores.threads": cpu.threads,
                  "simd.isa": cpu.isa, "simd.width": cpu.simd_bytes,
                  "simd.registers": cpu.vector_registers, "simd.fma_units": cpu.fma_units,
                  "parallel.fork_join": cpu.fork_join_s,
                  "memory[registers].capacity": cpu.vector_registers * cpu.simd_bytes,
                  "achievable.cache": self.achievable.smem}
        if path in simple:
            return simple[path]
        m = re.fullmatch(r"compute\.(peak|peak_per_core)\.(\w+)", path)
        if m and m.group(2) in cpu_model.PEAK_DTYPE_BYTES:
            return (self.peak_flops(m.group(2)) if m.group(1) == "peak"
                    else self.peak_flops_per_core(m.group(2)))
        m = re.fullmatch(r"memory\[(\w+)\]\.(\w+)", path)
        level = cpu.level(m.group(1)) if m else None
        if level is not None:
            attr = {"capacity": "capacity_bytes", "shared_by": "shared_by", "line": "line_bytes",
                    "bandwidth": "bandwidth", "bandwidth_all": "bandwidth_all",
                    "latency": "latency"}.get(m.group(2))
            if attr is not None:
                return getattr(level, attr)
        return None

    # -- a cpu profile's figures ----------------------------------------------------------------

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def _need_cpu(self, what: str) -> CpuSpec:
        if self.cpu is None:
            raise ProfileError(f"a {self.kind} profile has no {what}", self.name,
                               "it is a figure of kind: cpu profiles (docs/hwprofiles.md)")
        return self.cpu

    @property
    def cores(self) -> int:
        """Physical cores of the chip."""
        return self._need_cpu("cores").cores

    @property
    def hardware_threads(self) -> int:
        """Hardware threads of the chip (cores x threads per core)."""
        return self._need_cpu("hardware threads").threads

    @property
    def threads_per_core(self) -> int:
        return self._need_cpu("hardware threads").threads_per_core

    @property
    def isa(self) -> str:
        """The SIMD instruction set: avx2, avx512, neon or sve."""
        return self._need_cpu("SIMD ISA").isa

    @property
    def simd_bytes(self) -> int:
        """Bytes of one vector register."""
        return self._need_cpu("SIMD width").simd_bytes

    def simd_lanes(self, dtype: str) -> int:
        """Elements of `dtype` (profile key or IR name: fp32, float64, ...) in one vector."""
        width = cpu_model.DTYPE_BYTES.get(DTYPE_ALIASES.get(dtype, dtype))
        if width is None:
            raise ProfileError(f"unknown dtype '{dtype}'", f"{self.name}: simd",
                               f"use one of: {', '.join(DTYPES)}")
        return self.simd_bytes // width

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers of one hardware thread."""
        return self._need_cpu("vector registers").vector_registers

    @property
    def fma_units(self) -> int:
        """Vector FMA instructions one core issues per clock."""
        return self._need_cpu("FMA units").fma_units

    @property
    def fork_join_s(self) -> float:
        """Seconds of one empty OpenMP parallel region on all cores (fork, barrier, join)."""
        return self._need_cpu("fork/join cost").fork_join_s

    @property
    def march(self) -> str:
        """The g++ `-march=` value to generate code for this CPU (the profile's `arch`)."""
        self._need_cpu("-march value")
        return self.arch

    @property
    def caches(self) -> tuple[CpuLevel, ...]:
        """The cache levels, innermost first: l1, l2, l3 (when the CPU has one)."""
        return self._need_cpu("caches").caches

    def cache(self, name: str) -> CpuLevel:
        """The CPU memory level `name` (l1, l2, l3 or dram): capacity of one instance, the
        cores sharing it, line size, bandwidth of one core and of all cores."""
        level = self._need_cpu(f"memory level '{name}'").level(name)
        if level is None:
            known = ", ".join(lv.name for lv in self.cpu.levels)
            raise ProfileError(f"no memory level '{name}'", f"{self.name}: memory",
                               f"this profile has: {known}")
        return level

    def peak_flops_per_core(self, dtype: str) -> float:
        """One core's dense peak for `dtype` (fp32/fp64 or IR names), FLOP/s."""
        cpu = self._need_cpu("per-core peaks")
        key = DTYPE_ALIASES.get(dtype, dtype)
        if key not in cpu_model.PEAK_DTYPE_BYTES:
            self.peak_flops(dtype)  # the error listing the dtypes there are
        return cpu_model.peak_per_core(cpu, self.clock_hz, key)

    def with_cpu(self, clock_hz: float | None = None, **changes: Any) -> "Profile":
        """A variant with other CPU figures (`CpuSpec` fields: cores=128, levels=...) and/or
        another clock; the GPU-shaped fields and the derived peaks follow, and so do the
        threads when only the cores change (as many per core)."""
        old = self._need_cpu("CPU figures")
        if "cores" in changes and "threads" not in changes:     # as many threads per core
            changes = {**changes, "threads": changes["cores"] * old.threads_per_core}
        cpu = dataclasses.replace(old, **changes)
        if "levels" not in changes and cpu.cores != old.cores:
            cpu = dataclasses.replace(cpu, levels=cpu_model.rescale_levels(old, cpu.cores))
        clock = self.clock_hz if clock_hz is None else clock_hz
        cpu_model.check_cpu(cpu)
        derived = {**cpu_model.peak_sources(cpu, clock), **cpu_model.level_sources(cpu)}
        sources = {**self.sources, **{k: v for k, v in derived.items() if k in self.sources}}
        return dataclasses.replace(self, cpu=cpu, clock_hz=clock, sources=sources,
                                   **cpu_model.gpu_view(cpu, clock))

    def source(self, path: str) -> str:
        """Where the figure at `path` (e.g. `memory[dram].bandwidth`) came from, spelled out."""
        ref = self.sources.get(path)
        if ref is None:
            raise ProfileError(f"no figure '{path}'", self.name,
                               f"figures with sources: {', '.join(sorted(self.sources))}")
        return self.references.get(ref, ref)

    # -- identity ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The whole profile as plain data in base units (stable key order), `origin` aside."""
        data = dataclasses.asdict(self)
        data.pop("origin")
        if data["cpu"] is None:  # GPU profiles read (and hash) as before CPUs had a kind
            data.pop("cpu")
        return json.loads(json.dumps(data))  # tuples -> lists, mappings -> dicts

    @property
    def content_hash(self) -> str:
        """sha256 of the figures the tools compute from, for cache keys.

        Names, prose and provenance are left out: fixing a source's URL or adding an alias
        does not invalidate a tuning cache, while any changed number does.
        """
        data = {k: v for k, v in self.to_dict().items() if k not in _NOT_HASHED}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def identity(self) -> str:
        """`name:hash12`, for cache keys and reports."""
        return f"{self.name}:{self.content_hash[:12]}"


# -- consistency ----------------------------------------------------------------------------

def _fail(attr: str, what: str, hint: str | None = None) -> None:
    raise ProfileError(what, FIELD_PATHS.get(attr, attr), hint)


def _bytes(n: int) -> str:
    return format_quantity(n, "bytes")


def _check_profile(p: Profile) -> None:
    """The rules a profile must keep; each error names the file path of the field to fix."""
    if p.kind not in KINDS:
        raise ProfileError(f"unknown kind '{p.kind}'", "kind", f"use one of: {', '.join(KINDS)}")
    if (p.kind == "cpu") != (p.cpu is not None):
        raise ProfileError("a cpu profile has CPU figures, and only a cpu profile has them",
                           "kind", "build cpu profiles from their files (tk-hw validate)")
    if p.cpu is not None:
        _check_cpu_view(p)
    for attr in FIELD_PATHS:
        value = getattr(p, attr)
        if value is None or (attr == "l2_bytes" and value == 0):  # absent, or "no L2"
            continue
        if not value > 0:  # `not >` also catches NaN
            _fail(attr, f"must be positive, got {value}")
    for name in _FRACTIONS:
        value = getattr(p.achievable, name)
        if value is None and name == "compute_tensor":
            continue
        if not 0 < value <= 1:
            raise ProfileError(f"must be in (0, 1], got {value}", f"achievable.{name}")

    if p.max_threads_per_block > p.max_threads_per_sm:
        _fail("max_threads_per_block", f"{p.max_threads_per_block} exceeds max_threads_per_sm "
              f"{p.max_threads_per_sm}", "a block runs on one SM")
    if p.max_threads_per_block % p.warp_size:
        _fail("max_threads_per_block", f"{p.max_threads_per_block} is not a multiple of "
              f"warp_size {p.warp_size}")
    if p.max_warps_per_sm * p.warp_size != p.max_threads_per_sm:
        _fail("max_warps_per_sm", f"{p.max_warps_per_sm} warps x warp_size {p.warp_size} != "
              f"max_threads_per_sm {p.max_threads_per_sm}")
    if p.regs_per_block > p.regs_per_sm:
        _fail("regs_per_block", f"{p.regs_per_block} exceeds registers.per_sm {p.regs_per_sm}")
    if p.max_regs_per_thread > p.regs_per_block:
        _fail("max_regs_per_thread", f"{p.max_regs_per_thread} exceeds registers.max_per_block "
              f"{p.regs_per_block}")
    if p.smem_per_block_static > p.smem_per_block:
        _fail("smem_per_block_static", f"{_bytes(p.smem_per_block_static)} exceeds "
              f"per_block_optin {_bytes(p.smem_per_block)}",
              "the opt-in maximum is at least the static limit")
    if p.smem_per_block > p.smem_per_sm:
        _fail("smem_per_block", f"{_bytes(p.smem_per_block)} exceeds the per-SM capacity "
              f"{_bytes(p.smem_per_sm)}", "a block's shared memory lives on one SM")

    if p.kind == "cpu":
        pass  # the CPU's rules ran first (_check_cpu_view)
    elif p.kind == "simt":
        if not p.has_l2 or p.l2_bandwidth is None or p.l2_transaction_bytes is None:
            raise ProfileError("a simt profile needs an l2 level", "memory",
                               "add {level: l2, capacity, bandwidth, transaction}")
        if p.smem_banks is None or p.smem_bank_bytes is None:
            _fail("smem_banks", "a simt profile needs shared-memory banks and bank_width")
    else:
        if p.exchange_bandwidth is None:
            raise ProfileError("a distributed profile needs the tile interconnect", "exchange",
                               "add exchange: {bandwidth: {value, unit, source}}")

    if p.vendor == "nvidia":
        cc = p.compute_capability
        if cc is None:
            raise ProfileError(f"'{p.arch}' is not an NVIDIA arch", "arch",
                               "write sm_XY, e.g. sm_90 (the nvcc -arch target)")
        if p.max_regs_per_thread > NVIDIA_MAX_REGS_PER_THREAD:
            _fail("max_regs_per_thread", f"{p.max_regs_per_thread} exceeds "
                  f"{NVIDIA_MAX_REGS_PER_THREAD}", "NVIDIA GPUs cap a thread at 255 registers")
        if p.warp_size != 32:
            _fail("warp_size", f"{p.warp_size} on an NVIDIA GPU", "NVIDIA warps are 32 threads")
        for feature, min_cc in FEATURE_MIN_CC.items():
            if getattr(p.features, feature) and cc[0] * 10 + cc[1] < min_cc:
                raise ProfileError(f"{feature} needs sm_{min_cc} or later, arch is {p.arch}",
                                   f"features.{feature}")

    for table, section in ((p.peaks, "compute.simt"), (p.tensor_peaks, "compute.tensor_core")):
        for dtype, value in table.items():
            if dtype not in DTYPES:
                raise ProfileError(f"unknown dtype '{dtype}'", f"{section}.{dtype}",
                                   f"use one of: {', '.join(DTYPES)}")
            if not value > 0:
                raise ProfileError(f"must be positive, got {value}", f"{section}.{dtype}")
    if "fp32" not in p.peaks:
        raise ProfileError("missing", "compute.simt.fp32", "every profile states its FP32 peak")
    for i, shape in enumerate(p.mma_shapes):
        if shape.dtype not in p.tensor_peaks:
            raise ProfileError(f"dtype '{shape.dtype}' has no tensor-core peak",
                               f"compute.mma[{i}].dtype",
                               "add it under compute.tensor_core or drop the shape")


def _check_cpu_view(p: Profile) -> None:
    """A cpu profile: its CPU figures keep their rules, and the GPU-shaped fields are the ones
    they give (`tilekit.hw.cpu.gpu_view`)."""
    cpu_model.check_cpu(p.cpu)
    if not p.clock_hz > 0:
        _fail("clock_hz", f"must be positive, got {p.clock_hz}")
    for attr, value in cpu_model.gpu_view(p.cpu, p.clock_hz).items():
        if getattr(p, attr) != value:
            raise ProfileError(
                f"{attr} is {getattr(p, attr)!r}, but a cpu profile's {attr} follows "
                f"{cpu_model.VIEW_ORIGIN.get(attr, 'its CPU figures')} ({value!r})", p.name,
                "make variants of a cpu profile with Profile.with_cpu(...), which keeps them "
                "in step")
    if p.features != Features():
        raise ProfileError("a cpu profile has no GPU features", "features")
