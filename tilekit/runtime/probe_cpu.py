"""Measuring the CPU in hand: the micro-benchmarks behind `tk-hw probe --cpu`.

    device = open_cpu()                       # topology, the compiled kernels, or a TilekitError
    measurements = probe.measure(device, quick=False, progress=print)   # -> measure_cpu

`open_cpu` reads what the system says about the CPU this process may run on: cores and hardware
threads (sysfs topology of the CPUs in the affinity mask), the caches (sysfs cache indexes, else
`os.sysconf`), the memory size (`os.sysconf`), the model name (/proc/cpuinfo), the `-march`
value g++ resolves `native` to, and the SIMD ISA the compiler targets there (the predefined
macros, read by the compiled kernels). It builds probe_cpu.cpp with `g++ -O3 -march=native
-fopenmp` into `$TILEKIT_CACHE/probe-cpu/<key>/` (the key covers the source, the compiler and
what `-march=native` means here).

`measure_cpu` runs the kernels one process per benchmark, with OpenMP pinning one thread per
core (OMP_PLACES=cores, OMP_PROC_BIND=close): a streaming read over a working set sized to each
cache level and to DRAM, on one core and on all cores; independent FMA chains on one core and
on all; a chain of dependent adds (the clock); the two in turn (FLOP per clock, whatever the
clock); empty parallel regions (fork/join). Each follows
the GPU probe's recipe (`tilekit.runtime.probe.Plan`, with the CPU's `FULL` and `QUICK`): the
work of one repetition grows until it takes `rep_seconds`, runs `warmup` times untimed, then
`reps` timed repetitions pooled over `rounds` passes over the list; the figure is `figure_of`
them, the median of the fastest quarter. The result is plain data in base units (B/s, FLOP/s, Hz, s) that
`tilekit.hw.probe_cpu_profile.probed_cpu_profile` turns into a `kind: cpu` profile. What each
benchmark measures and cannot see is in docs/hwprofiles.md, "Probing a CPU".
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import re
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.hw.cpu import ISA_REGISTERS, cpuinfo_field
from tilekit.hw.units import format_quantity
from tilekit.runtime.probe import Plan

SOURCE = Path(__file__).with_name("probe_cpu.cpp")
#: Many short repetitions (the GPU probe's recipe with another plan): a repetition that other
#: work on the machine slowed is one of many, and `figure_of` leaves it out. The full plan
#: pools 3 rounds of 50 repetitions of each benchmark (about 15 s in all); --quick one round
#: of 24 (about 1.5 s).
FULL = Plan(rep_seconds=0.004, reps=150, warmup=2, launches=0, rounds=3)
QUICK = Plan(rep_seconds=0.002, reps=24, warmup=1, launches=0, rounds=1)
#: How the kernels are built: for the CPU in hand, as tk-codegen --target cpu builds its code.
FLAGS = ("-O3", "-std=c++17", "-march=native", "-fopenmp")
SYSFS_CPU = Path("/sys/devices/system/cpu")
MiB = 2**20
#: Working sets are whole pages.
PAGE = 4096
#: The DRAM working set is this many times all the cache there is (and at least DRAM_MIN_BYTES):
#: a streaming read of it finds nothing left in the caches from its previous pass.
DRAM_OVER_CACHE = 4
DRAM_MIN_BYTES = 64 * MiB
#: ... and at most this fraction of the machine's memory.
DRAM_MAX_FRACTION = 0.25
#: Vendor of /proc/cpuinfo's vendor_id (x86) or "CPU implementer" (Arm).
VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon",
           "0x41": "arm", "0x61": "apple", "0xc0": "ampere", "0x48": "hisilicon",
           "0x46": "fujitsu", "0x4e": "nvidia", "0x51": "qualcomm"}


@dataclass(frozen=True)
class CacheInfo:
    """One cache level as the system reports it: `capacity` of one instance, the cores (of
    those this process may use) sharing one instance, the line size."""

    level: int
    capacity: int
    line: int
    shared_by: int
    how: str


@dataclass
class CpuDevice:
    """The CPU this process may run on, and the probe's compiled kernels."""

    name: str
    vendor: str
    arch: str                       # what g++ -march=native means here (znver3, ...)
    cores: int                      # physical cores among the CPUs of the affinity mask
    threads: int                    # those CPUs
    caches: tuple[CacheInfo, ...]
    memory_bytes: int
    isa: str
    vector_bytes: int
    binary: Path
    topology_how: str = ""
    notes: list[str] = field(default_factory=list)
    kind: str = "cpu"

    def describe(self) -> str:
        return f"{self.name} ({self.arch}, {self.cores} cores, {self.threads} threads)"

    def measure(self, quick: bool = False,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """`measure_cpu` of this CPU (what `tilekit.runtime.probe.measure` calls)."""
        return measure_cpu(self, quick=quick, progress=progress)


# -- what the system says ---------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """A sysfs cache size (`32K`, `512K`, `32768K`, `1M`) in bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if m is None:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]


def parse_cpu_list(text: str) -> set[int]:
    """`0-3,8,10-11` -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def core_of(cpus: set[int], root: Path = SYSFS_CPU) -> dict[int, tuple[int, int]]:
    """CPU -> (package, core id) from sysfs; a CPU without topology is a core of its own."""
    found = {}
    for cpu in sorted(cpus):
        topo = root / f"cpu{cpu}" / "topology"
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        found[cpu] = ((int(package), int(core)) if package is not None and core is not None
                      else (-1, cpu))
    return found


def read_caches(cpus: set[int], cores: dict[int, tuple[int, int]],
                root: Path = SYSFS_CPU) -> tuple[CacheInfo, ...]:
    """The data caches (level 1 data, unified 2 and 3) of the CPUs in `cpus`, from sysfs.

    `shared_by` counts the cores of `cpus` that share one instance: the greatest common divisor
    of the group sizes, so that it divides the cores even under an odd affinity mask."""
    first = min(cpus)
    found = []
    for index in sorted((root / f"cpu{first}" / "cache").glob("index*")):
        level, kind = _read(index / "level"), _read(index / "type")
        size, line = _read(index / "size"), _read(index / "coherency_line_size")
        if None in (level, kind, size, line) or kind == "Instruction" or int(level) > 3:
            continue
        groups = set()
        for cpu in cpus:
            shared = _read(root / f"cpu{cpu}" / "cache" / index.name / "shared_cpu_list")
            members = parse_cpu_list(shared) & cpus if shared else {cpu}
            groups.add(frozenset(cores[c] for c in members))
        shared_by = math.gcd(*(len(g) for g in groups)) if groups else 1
        found.append(CacheInfo(int(level), parse_size(size), int(line), shared_by,
                               f"sysfs {index.relative_to(root)}"))
    return tuple(sorted(found, key=lambda c: c.level))


def sysconf_caches(cores: int) -> tuple[CacheInfo, ...]:
    """The caches glibc reports (os.sysconf), where sysfs has none: L1 and L2 taken as private,
    L3 as shared by all cores."""
    found = []
    for level, name in ((1, "LEVEL1_DCACHE"), (2, "LEVEL2_CACHE"), (3, "LEVEL3_CACHE")):
        try:
            size = os.sysconf(f"SC_{name}_SIZE")
            line = os.sysconf(f"SC_{name}_LINESIZE")
        except (ValueError, OSError):
            continue
        if size and size > 0:
            found.append(CacheInfo(level, size, line if line and line > 0 else 64,
                                   cores if level == 3 else 1, f"os.sysconf(SC_{name}_SIZE)"))
    return tuple(found)


def allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


# -- the compiler ------------------------------------------------------------------------------------

def native_target(cxx: str) -> tuple[str, str]:
    """(the -march value `native` resolves to, g++'s whole target description for the cache key);
    `native` when the compiler does not say."""
    try:
        out = subprocess.run([cxx, "-march=native", "-Q", "--help=target"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "native", ""
    m = re.search(r"^\s*-march=\s+(\S+)\s*$", out.stdout, re.M)
    return (m.group(1) if m else "native"), out.stdout


def build(cxx: str, target_text: str) -> Path:
    """probe_cpu.cpp compiled for this machine, cached by source, compiler and target."""
    from tilekit.codegen.cxx import compiler_version
    from tilekit.codegen.nvcc import building, cache_dir

    source = SOURCE.read_text(encoding="utf-8")
    key = hashlib.sha256("\0".join([source, compiler_version(cxx), " ".join(FLAGS),
                                    target_text]).encode()).hexdigest()[:32]
    final = cache_dir() / "probe-cpu" / key
    binary = final / "probe_cpu"
    if binary.exists():
        return binary
    with building(final, key) as work:
        (work / "probe_cpu.cpp").write_text(source, encoding="utf-8")
        argv = [cxx, *FLAGS, "probe_cpu.cpp", "-o", "probe_cpu"]
        proc = subprocess.run(argv, cwd=work, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UnsupportedError(f"the C++ compiler refused the CPU probe's kernels: "
                                   f"{proc.stderr.strip()[:800]}", "probe",
                                   f"tk-hw probe --cpu needs g++ with OpenMP; tried: "
                                   f"{' '.join(argv)}")
    return binary


# -- the device ------------------------------------------------------------------------------------

def open_cpu() -> CpuDevice:
    """The CPU in hand: its topology, caches and memory, and the probe's kernels built for it.
    A TilekitError (exit 2) when there is no C++ compiler with OpenMP, or an ISA the probe does
    not know."""
    from tilekit.codegen.cxx import find_cxx
    from tilekit.runtime.bench import cpu_model

    cxx = find_cxx()
    if cxx is None:
        raise UnsupportedError("no C++ compiler (g++ or clang++) to build the CPU probe",
                               "probe", "install g++ (with OpenMP), or set CXX")
    arch, target_text = native_target(cxx)
    binary = build(cxx, target_text)
    info = _run(binary, ["info"], threads=1)
    isa, vector_bytes = info.get("isa", "none"), int(info.get("vector_bytes", "0"))
    if isa not in ISA_REGISTERS:
        raise UnsupportedError(f"the compiler targets no SIMD ISA the probe knows on this CPU "
                               f"(-march=native is {arch})", "probe",
                               "tk-hw probe --cpu measures x86 with AVX2 or AVX-512 and "
                               "AArch64 with NEON or SVE")
    notes: list[str] = []
    cpus = allowed_cpus()
    cores_of = core_of(cpus)
    cores = len(set(cores_of.values()))
    threads = len(cpus)
    if threads % cores:
        notes.append(f"{threads} CPUs on {cores} cores is not the same number of threads on "
                     f"every core (a hybrid CPU, or an affinity mask splitting a core): the "
                     f"profile counts {cores * (threads // cores)}")
        threads = cores * (threads // cores)
    caches = read_caches(cpus, cores_of)
    if not any(c.level == 1 for c in caches) or not any(c.level == 2 for c in caches):
        caches = sysconf_caches(cores)
    if not any(c.level == 1 for c in caches) or not any(c.level == 2 for c in caches):
        raise UnsupportedError("the system reports no L1 or L2 data cache (neither "
                               "/sys/devices/system/cpu/cpu*/cache nor sysconf)", "probe",
                               "tk-hw probe --cpu reads cache sizes from Linux's sysfs")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    vendor_id = cpuinfo_field("vendor_id", "CPU implementer") or ""
    name = cpu_model()
    if name in ("", "unknown CPU") or name == os.uname().machine:
        part = cpuinfo_field("CPU part")
        name = f"{os.uname().machine} CPU ({vendor_id or 'unknown implementer'}"
        name += f", part {part})" if part else ")"
    return CpuDevice(
        name=name, vendor=VENDORS.get(vendor_id, vendor_id.lower() or "unknown"), arch=arch,
        cores=cores, threads=threads, caches=caches, memory_bytes=int(memory), isa=isa,
        vector_bytes=vector_bytes, binary=binary,
        topology_how=f"sysfs topology of the {len(cpus)} CPUs this process may use",
        notes=notes)


# -- running the kernels -----------------------------------------------------------------------------

def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="close", OMP_PLACES="cores")
    env.pop("OMP_DYNAMIC", None)
    return env


def _run(binary: Path, args: list[str], threads: int) -> dict[str, Any]:
    """One run of the kernels' program: its `key value` lines, `rep` lines as a list."""
    try:
        proc = subprocess.run([str(binary), *args], capture_output=True, text=True,
                              env=_env(threads), timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TilekitError(f"the CPU probe's kernels did not run: {exc}", "probe") from None
    if proc.returncode != 0:
        raise TilekitError(f"the CPU probe's kernels failed ({' '.join(args[:2])}): "
                           f"{proc.stderr.strip()[:500]}", "probe")
    out: dict[str, Any] = {"reps": [], "pairs": []}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "rep":
            units, seconds = value.split()
            out["reps"].append((int(units), float(seconds)))
        elif key == "pair":
            work, seconds, other, other_seconds = value.split()
            out["pairs"].append((float(work), float(seconds), float(other), float(other_seconds)))
        else:
            out[key] = value
    return out


def _timed(dev: CpuDevice, plan: Plan, args: list[str], threads: int) -> dict[str, Any]:
    """One round of a benchmark: its output, with plan.reps / plan.rounds repetitions."""
    reps = -(-plan.reps // plan.rounds)
    return _run(dev.binary, [*args, f"{plan.rep_seconds}", str(reps), str(plan.warmup)], threads)


def _rates(dev: CpuDevice, plan: Plan, args: list[str], threads: int,
           per_unit: str) -> list[float]:
    """Work per second of each timed repetition: units x `per_unit` / seconds."""
    out = _timed(dev, plan, args, threads)
    work = float(out.get(per_unit, "1"))
    rates = [units * work / seconds for units, seconds in out["reps"] if seconds > 0]
    if not rates:
        raise TilekitError(f"the CPU probe's {args[0]} benchmark timed nothing", "probe")
    return rates


def figure_of(rates: list[float]) -> float:
    """The figure of a benchmark's repetitions: the median of the fastest quarter.

    A shared machine's other work only ever slows a repetition down (a time slice taken, a
    sibling thread busy), and takes many of them on a busy machine: the fastest repetitions are
    the machine's own rate. The median of a quarter of them, not the single fastest, keeps a
    lucky one (a timer step, a turbo burst) from setting the figure."""
    ordered = sorted(rates)
    return statistics.median(ordered[len(ordered) - max(1, len(ordered) // 4):])


# -- working sets ------------------------------------------------------------------------------------

def working_sets(dev: CpuDevice, threads: int) -> dict[str, int]:
    """Bytes each of `threads` threads (one per core) reads to measure each level.

    L1: half of it. An outer cache: the geometric mean of what the level inside holds for the
    thread and what this level holds for it (the whole instance for one thread, its share when
    all the cores sharing it read) -- far past the inner level, well inside this one. DRAM:
    `DRAM_OVER_CACHE` x all the cache there is, split over the threads."""
    sets: dict[str, int] = {}
    inner = None
    for cache in dev.caches:
        sharing = min(cache.shared_by, threads)
        holds = cache.capacity // sharing
        if inner is None:
            size = holds // 2
        else:
            size = int(math.sqrt(inner * holds))
        sets[f"l{cache.level}"] = size // PAGE * PAGE
        inner = holds
    total_cache = sum(c.capacity * max(1, dev.cores // c.shared_by) for c in dev.caches)
    dram = max(DRAM_OVER_CACHE * total_cache, DRAM_MIN_BYTES)
    dram = min(dram, int(dev.memory_bytes * DRAM_MAX_FRACTION))
    sets["dram"] = dram // threads // PAGE * PAGE
    return sets


# -- the benchmarks -------------------------------------------------------------------------------------

def _size(nbytes: int) -> str:
    return format_quantity(nbytes, "bytes")


@dataclass
class Series:
    """One result's repetitions, pooled over the rounds: rates (work per second); for a ratio,
    the rates of the denominator in `per` (FLOP per clock: FMA rates over add-chain rates)."""

    what: str
    rates: list[float] = field(default_factory=list)
    per: list[float] = field(default_factory=list)
    inverse: bool = False   # the figure is 1 / rate (seconds per fork/join)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, other: "Series") -> None:
        self.rates += other.rates
        self.per += other.per

    def result(self) -> dict[str, Any]:
        value, low, high = figure_of(self.rates), min(self.rates), max(self.rates)
        if self.per:
            value = value / figure_of(self.per)
            low, high = low / max(self.per), high / min(self.per)
        if self.inverse:
            value, low, high = 1.0 / value, 1.0 / high, 1.0 / low
        return {"value": value, "what": self.what, **self.extra, "samples": len(self.rates),
                "low": low, "high": high}


Samples = dict[str, Series]


def _scopes(dev: CpuDevice) -> tuple[tuple[str, int, str], ...]:
    return (("core", 1, "one thread"), ("all", dev.cores, f"{dev.cores} threads, one per core"))


def _read_level(dev: CpuDevice, plan: Plan, level: str) -> Samples:
    """Streaming reads of a working set sized to `level`, one core alone and all cores."""
    samples: Samples = {}
    for scope, threads, who in _scopes(dev):
        nbytes = working_sets(dev, threads)[level]
        samples[f"read_{level}_{scope}"] = Series(
            f"{dev.vector_bytes}-byte {dev.isa} loads streaming over {_size(nbytes)} per thread, "
            f"{who}", _rates(dev, plan, ["read", str(nbytes)], threads, "bytes_per_unit"),
            extra={"bytes": nbytes})
    return samples


def _fma(dev: CpuDevice, plan: Plan) -> Samples:
    return {f"fma_{scope}": Series(f"independent fp32 FMA chains in {dev.vector_bytes}-byte "
                                   f"{dev.isa} registers, {who}",
                                   _rates(dev, plan, ["fma"], threads, "flop_per_unit"))
            for scope, threads, who in _scopes(dev)}


def _fma_per_clock(dev: CpuDevice, plan: Plan) -> Samples:
    """FLOP per clock of one core: FMA repetitions and add-chain repetitions in turn, so that
    both see the same clock and the same other work; the ratio of their figures."""
    out = _timed(dev, plan, ["fmaclock"], 1)
    pairs = [(flop / sf, cycles / sc) for flop, sf, cycles, sc in out["pairs"]
             if sf > 0 and sc > 0]
    if not pairs:
        raise TilekitError("the CPU probe's fmaclock benchmark timed nothing", "probe")
    return {"fma_per_clock": Series("fp32 FMA chains and the add chain in turn on one thread: "
                                    "FLOP per clock", [f for f, _ in pairs],
                                    [c for _, c in pairs])}


def _clock(dev: CpuDevice, plan: Plan) -> Samples:
    return {"clock": Series("a chain of dependent register adds, one per clock, one thread",
                            _rates(dev, plan, ["clock"], 1, "cycles_per_unit"))}


def _fork_join(dev: CpuDevice, plan: Plan) -> Samples:
    return {"fork_join": Series(f"empty OpenMP parallel regions back to back on {dev.cores} "
                                f"threads, one per core, libgomp's default wait policy",
                                _rates(dev, plan, ["forkjoin"], dev.cores, "regions_per_unit"),
                                inverse=True)}


def _share_notes(dev: CpuDevice) -> list[str]:
    """Levels whose share per core is too close to the level inside it for a clean figure."""
    notes = []
    for inner, cache in zip(dev.caches, dev.caches[1:]):
        share = cache.capacity // min(cache.shared_by, dev.cores)
        if share < 4 * inner.capacity:
            notes.append(f"l{cache.level}: each core's share of it ({_size(share)}) is less than "
                         f"4x the {_size(inner.capacity)} l{inner.level} inside it, so the "
                         f"all-core figure mixes both levels")
    return notes


def measure_cpu(dev: CpuDevice, quick: bool = False,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every benchmark on `dev`, `plan.rounds` times over; the measurements as plain data
    (base units). Each figure is `figure_of` its pooled repetitions."""
    plan = QUICK if quick else FULL
    # FMA first: its calibration and warm-up wake the core up before the clock is timed, and
    # the two come back to back (the FMA units are the FMA rate over the clock).
    steps: list[tuple[str, Callable[[], Samples]]] = [
        ("FMA", lambda: _fma(dev, plan)),
        ("clock", lambda: _clock(dev, plan)),
        ("FMA per clock", lambda: _fma_per_clock(dev, plan)),
        ("fork/join", lambda: _fork_join(dev, plan)),
    ]
    for cache in dev.caches:
        level = f"l{cache.level}"
        steps.append((f"{level} read", lambda level=level: _read_level(dev, plan, level)))
    steps.append(("DRAM read", lambda: _read_level(dev, plan, "dram")))
    pooled: Samples = {}
    for round_ in range(plan.rounds):
        for label, step in steps:
            if progress is not None:
                progress(label if plan.rounds == 1 else f"{label} ({round_ + 1}/{plan.rounds})")
            for name, series in step().items():
                if name in pooled:
                    pooled[name].add(series)
                else:
                    pooled[name] = series
    results = {name: series.result() for name, series in pooled.items()}
    return {
        "kind": "cpu",
        "device": dev.name,
        "vendor": dev.vendor,
        "arch": dev.arch,
        "date": datetime.date.today().isoformat(),
        "topology": {
            "cores": dev.cores, "threads": dev.threads, "isa": dev.isa,
            "vector_bytes": dev.vector_bytes, "memory_bytes": dev.memory_bytes,
            "how": dev.topology_how,
            "caches": [{"level": f"l{c.level}", "capacity": c.capacity, "line": c.line,
                        "shared_by": c.shared_by, "how": c.how} for c in dev.caches],
        },
        "results": results,
        "notes": [*dev.notes, *_share_notes(dev)],
        "plan": "quick" if quick else "full",
    }
