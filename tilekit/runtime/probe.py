"""Measuring the GPU in hand: the micro-benchmarks behind `tk-hw probe` (the CPU's are in
`tilekit.runtime.probe_cpu`; `measure` runs either, and `Plan` is their common recipe).

    device = open_device()                 # CuPy and a visible GPU, or a TilekitError
    measurements = measure(device, quick=False, progress=print)

`measure` runs the kernels of probe_kernels.cu on the current CUDA device through CuPy and
returns plain data in base units (B/s, FLOP/s, s; the format is in
`tilekit.hw.probe_profile`, which turns it into a profile). What each benchmark measures, how
long it takes and what it cannot see are in docs/hwprofiles.md, "Probing a device".

Every benchmark follows one recipe (`_rate`): grow the work of one launch until it runs for
`Plan.rep_seconds` (a few ms, far above the launch overhead), run it `Plan.warmup` times
untimed, then take the median of `Plan.reps` CUDA-event timings. The throughput kernels run
one full wave (SMs x the blocks the occupancy calculator lets reside on one), so every SM has
the same work.

Run on an H100 (2026-11-22: tests/bench/results/h100-probed.yaml); the kernels compile with
nvcc for sm_80 and sm_90 in the unit tests, and tests/gpu/test_probe.py runs the whole probe
where a GPU is present.
"""

from __future__ import annotations

import datetime
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tilekit.errors import TilekitError
from tilekit.hw.units import format_quantity

KERNELS = Path(__file__).with_name("probe_kernels.cu")
#: What the kernels compare their folded result with before storing it (see the .cu file):
#: every value they compute is >= 0, so the store never happens.
SENTINEL = np.float32(-1.0)
#: The device attributes a probe records (the cudaDevAttr names without the prefix).
ATTRIBUTES = (
    "MultiProcessorCount", "WarpSize", "MaxThreadsPerBlock", "MaxThreadsPerMultiProcessor",
    "MaxBlocksPerMultiprocessor", "MaxRegistersPerMultiprocessor", "MaxRegistersPerBlock",
    "MaxSharedMemoryPerMultiprocessor", "MaxSharedMemoryPerBlock",
    "MaxSharedMemoryPerBlockOptin", "L2CacheSize", "ClockRate", "MemoryClockRate",
    "GlobalMemoryBusWidth", "CooperativeLaunch", "ComputeCapabilityMajor",
    "ComputeCapabilityMinor",
)
MiB, GiB = 2**20, 2**30
#: Each of the two arrays of the DRAM copy: 40x the 50 MiB L2 of an H100.
COPY_BYTES = 2 * GiB
#: Threads per block of the throughput kernels.
BLOCK = 256
#: Largest iteration count a kernel takes (an int32 argument).
MAX_ITERS = 2**31 - 1
#: The operands of the mma.sync loops: 1.0 in every element (f16 pairs, bf16 pairs, tf32).
MMA_OPERANDS = {"fp16": 0x3C003C00, "bf16": 0x3F803F80, "tf32": 0x3F800000}
#: mma.sync shape (m, n, k) per dtype: the instructions in probe_kernels.cu.
MMA_SHAPES = {"fp16": (16, 8, 16), "bf16": (16, 8, 16), "tf32": (16, 8, 8)}


@dataclass(frozen=True)
class Plan:
    """How long to measure: each timed repetition about `rep_seconds`, after `warmup` untimed
    ones; the median of `reps`. `launches` empty kernels per launch-overhead repetition.
    `rounds`: the CPU probe runs its whole list of benchmarks that many times and pools the
    repetitions (a shared machine's other work comes and goes)."""

    rep_seconds: float
    reps: int
    warmup: int
    launches: int
    rounds: int = 1


FULL = Plan(rep_seconds=0.1, reps=11, warmup=2, launches=2000)
QUICK = Plan(rep_seconds=0.01, reps=5, warmup=1, launches=500)


def kernel_constant(name: str) -> int:
    """A `#define NAME <int>` of probe_kernels.cu: the host computes work from the same numbers
    the kernels use."""
    m = re.search(rf"^#define {name} (\d+)", KERNELS.read_text(encoding="utf-8"), re.M)
    if m is None:
        raise KeyError(f"{KERNELS.name} defines no {name}")
    return int(m.group(1))


# -- the device ------------------------------------------------------------------------------

@dataclass
class Device:
    """The current CUDA device, its attributes, and the probe's kernels loaded on it."""

    cupy: Any
    name: str
    arch: str
    attributes: dict[str, int]
    memory_bytes: int
    module: Any = None
    sink: Any = None

    @property
    def sm_count(self) -> int:
        return self.attributes["MultiProcessorCount"]

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (self.attributes["ComputeCapabilityMajor"],
                self.attributes["ComputeCapabilityMinor"])

    def kernel(self, name: str):
        if self.module is None:
            self.module = _load_kernels(self.cupy, self.arch)
            self.sink = self.cupy.zeros(1, dtype=np.float32)
        return self.module.get_function(name)

    def full_wave(self, kernel, block: int) -> int:
        """Blocks in one full wave of `kernel`: SMs x the blocks of `block` threads that can
        reside on one SM at once (the CUDA occupancy calculator)."""
        per_sm = self.cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernel.kernel.ptr, block, 0)
        return self.sm_count * max(1, per_sm)

    def describe(self) -> str:
        return f"{self.name} ({self.arch}, {self.sm_count} SMs)"


def open_device() -> Device:
    """The current CUDA device through CuPy; a TilekitError (exit 2) when CuPy or a GPU is
    missing."""
    from tilekit.runtime.cuda import require_cupy, device_arch

    try:
        cupy = require_cupy()
    except TilekitError as exc:
        raise TilekitError(exc.what, "probe",
                           "tk-hw probe measures the GPU it runs on: run it on a machine with "
                           "an NVIDIA GPU, its driver and CuPy (pip install 'tilekit[cuda]'); "
                           "tk-hw probe --cpu measures the CPU"
                           ) from None
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    reported = dev.attributes
    attributes = {key: int(reported[key]) for key in ATTRIBUTES if key in reported}
    attributes.setdefault("ComputeCapabilityMajor", int(dev.compute_capability[:-1]))
    attributes.setdefault("ComputeCapabilityMinor", int(dev.compute_capability[-1]))
    _, total = cupy.cuda.runtime.memGetInfo()
    return Device(cupy, name.strip(), device_arch(), attributes, int(total))


def _load_kernels(cupy, arch: str):
    """probe_kernels.cu as a CuPy module: compiled by nvcc (through tilekit's compile cache)
    when nvcc is usable with this driver, else by NVRTC; the choice tilekit.runtime.cuda makes
    for generated kernels."""
    from tilekit.codegen.nvcc import compile_unit
    from tilekit.runtime.cuda import usable_nvcc

    source = KERNELS.read_text(encoding="utf-8")
    if usable_nvcc(cupy) is not None:
        return cupy.RawModule(path=str(compile_unit(source, arch).cubin))
    return cupy.RawModule(code=source, backend="nvrtc", options=("-std=c++17",))


# -- timing --------------------------------------------------------------------------------------

def _median_seconds(cupy, launch: Callable[[], None], reps: int, warmup: int) -> float:
    """The median CUDA-event time of `launch()` (everything it enqueues), after `warmup` runs."""
    for _ in range(warmup):
        launch()
    times = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
    return statistics.median(times)


def _rate(dev: Device, run: Callable[[int], None], work: float, plan: Plan, start: int,
          limit: int = MAX_ITERS) -> float:
    """`work` per second, where `run(n)` enqueues n times `work` (n iterations of a kernel's
    loop, or n launches): n grows from `start` by 8x until one run takes a quarter of
    `plan.rep_seconds`, is then scaled to take all of it, and the median time of `plan.reps`
    runs is what counts."""
    n = start
    while True:
        seconds = _median_seconds(dev.cupy, lambda: run(n), reps=1, warmup=1)
        if seconds >= plan.rep_seconds / 4 or n * 8 > limit:
            break
        n *= 8
    n = max(1, min(limit, round(n * plan.rep_seconds / seconds)))
    return n * work / _median_seconds(dev.cupy, lambda: run(n), plan.reps, plan.warmup)


# -- the benchmarks -------------------------------------------------------------------------------

def _dram(dev: Device, plan: Plan, notes: list[str]) -> dict[str, dict]:
    """Device-to-device copy (cudaMemcpyAsync) and a read-only streaming kernel over arrays far
    larger than L2."""
    cupy = dev.cupy
    free, _ = cupy.cuda.runtime.memGetInfo()
    nbytes = min(COPY_BYTES, free // 4) // MiB * MiB
    l2 = dev.attributes.get("L2CacheSize", 0)
    if nbytes < 4 * l2:
        notes.append(f"DRAM arrays of {format_quantity(nbytes, 'bytes')} (all the free memory "
                     f"allows) are less than 4x the L2 ({format_quantity(l2, 'bytes')}): the "
                     "DRAM figures may be partly L2's")
    src = cupy.zeros(nbytes // 4, dtype=np.float32)
    dst = cupy.empty_like(src)
    size = format_quantity(nbytes, "bytes")

    def copy(n: int) -> None:
        for _ in range(n):
            dst.data.copy_from_device_async(src.data, nbytes)

    read_kernel = dev.kernel("tk_probe_dram_read")
    grid = dev.full_wave(read_kernel, BLOCK)

    def read(n: int) -> None:
        for _ in range(n):
            read_kernel((grid,), (BLOCK,), (src, np.int64(nbytes // 16), dev.sink, SENTINEL))

    try:
        return {
            "dram_copy": {"value": _rate(dev, copy, 2 * nbytes, plan, start=1, limit=10_000),
                          "what": f"device-to-device copy of {size} with cudaMemcpyAsync, "
                                  "bytes read + written"},
            "dram_read": {"value": _rate(dev, read, nbytes, plan, start=1, limit=10_000),
                          "what": f"read-only streaming kernel over {size}, float4 loads"},
        }
    finally:
        del src, dst
        cupy.get_default_memory_pool().free_all_blocks()


def _kernel_rate(dev: Device, plan: Plan, name: str, block: int,
                 args: Callable[[int], tuple], work: Callable[[int], float],
                 start: int) -> tuple[float, int]:
    """(work per second, grid) of kernel `name` run as one full wave of `block`-thread blocks:
    `args(n)` are its arguments for n iterations of its loop, `work(grid)` one iteration's
    work."""
    kernel = dev.kernel(name)
    grid = dev.full_wave(kernel, block)

    def run(n: int) -> None:
        kernel((grid,), (block,), args(n))

    return _rate(dev, run, work(grid), plan, start), grid


def _l2(dev: Device, plan: Plan) -> dict[str, dict]:
    """Repeated ld.global.cg reads of a buffer of at most a quarter of L2 (a power of two)."""
    quarter = max(dev.attributes.get("L2CacheSize", 0) // 4, MiB)
    nbytes = 1 << (quarter.bit_length() - 1)
    buf = dev.cupy.zeros(nbytes // 4, dtype=np.float32)
    value, grid = _kernel_rate(
        dev, plan, "tk_probe_l2_read", BLOCK,
        lambda passes: (buf, np.int32(nbytes // 16), np.int32(passes), dev.sink, SENTINEL),
        lambda grid: nbytes, start=16)
    return {"l2_read": {"value": value,
                        "what": f"repeated ld.global.cg reads of {format_quantity(nbytes, 'bytes')}"
                                f" by {grid} blocks on all SMs"}}


def _smem(dev: Device, plan: Plan) -> dict[str, dict]:
    """Conflict-free 16-byte shared-memory loads; reported per SM."""
    threads = kernel_constant("TK_PROBE_SMEM_THREADS")
    loads = kernel_constant("TK_PROBE_SMEM_LOADS")
    total, grid = _kernel_rate(
        dev, plan, "tk_probe_smem_read", threads,
        lambda iters: (dev.sink, np.int32(iters), np.int32(1), SENTINEL),
        lambda grid: grid * threads * loads * 16, start=64)
    return {"smem_read": {"value": total / dev.sm_count,
                          "what": f"conflict-free 16-byte shared-memory loads, {grid} blocks of "
                                  f"{threads} threads, total / {dev.sm_count} SMs"}}


def _fma(dev: Device, plan: Plan) -> dict[str, dict]:
    """Independent FP32 FMA chains on the CUDA cores."""
    chains = kernel_constant("TK_PROBE_FMA_CHAINS")
    unroll = kernel_constant("TK_PROBE_FMA_UNROLL")
    value, grid = _kernel_rate(
        dev, plan, "tk_probe_fma", BLOCK,
        lambda iters: (dev.sink, np.int32(iters), np.float32(0.999), np.float32(1e-3), SENTINEL),
        lambda grid: grid * BLOCK * chains * unroll * 2, start=64)
    return {"fp32_fma": {"value": value,
                         "what": f"{chains} independent FMA chains per thread, "
                                 f"{grid} blocks of {BLOCK}"}}


def _tensor_cores(dev: Device, plan: Plan, notes: list[str]) -> dict[str, dict]:
    """Independent mma.sync accumulators per warp, one kernel per dtype (sm_80 and later)."""
    if dev.compute_capability < (8, 0):
        notes.append(f"tensor cores not measured: the probe's mma.sync shapes need sm_80, "
                     f"the device is {dev.arch}")
        return {}
    chains = kernel_constant("TK_PROBE_MMA_CHAINS")
    results = {}
    for dtype, bits in MMA_OPERANDS.items():
        m, n, k = MMA_SHAPES[dtype]
        operand = np.uint32(bits)
        value, grid = _kernel_rate(
            dev, plan, f"tk_probe_mma_{dtype}", BLOCK,
            lambda iters: (dev.sink, np.int32(iters), operand, operand, SENTINEL),
            lambda grid: grid * (BLOCK // 32) * chains * 2 * m * n * k, start=16)
        results[f"mma_{dtype}"] = {
            "value": value,
            "what": f"mma.sync m{m}n{n}k{k} {dtype} with f32 accumulators, {chains} independent "
                    f"per warp, {grid} blocks of {BLOCK}"}
    return results


def _launch(dev: Device, plan: Plan) -> dict[str, dict]:
    """Back-to-back launches of an empty kernel from Python (CuPy), as tk-run launches."""
    cupy = dev.cupy
    kernel = dev.kernel("tk_probe_empty")
    count = plan.launches

    def launch_all() -> None:
        for _ in range(count):
            kernel((1,), (32,), ())

    launch_all()  # warm-up: module load, CuPy's argument caches
    on_device, on_host = [], []
    for _ in range(plan.reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        cupy.cuda.get_current_stream().synchronize()
        began = time.perf_counter()
        start.record()
        launch_all()
        stop.record()
        stop.synchronize()
        on_host.append((time.perf_counter() - began) / count)
        on_device.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3 / count)
    what = f"{count} back-to-back launches of an empty kernel from Python through CuPy"
    return {"launch_events": {"value": statistics.median(on_device),
                              "what": what + ", CUDA events, per launch"},
            "launch_wall": {"value": statistics.median(on_host),
                            "what": what + ", wall clock until synchronized, per launch"}}


def measure(dev: Device, quick: bool = False,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every benchmark on `dev`; the measurements as plain data (base units). A CPU
    (`tilekit.runtime.probe_cpu.open_cpu`) runs the CPU's benchmarks."""
    if getattr(dev, "kind", None) == "cpu":  # a probe_cpu.CpuDevice measures itself
        return dev.measure(quick=quick, progress=progress)
    plan = QUICK if quick else FULL
    notes: list[str] = []
    steps: list[tuple[str, Callable[[], dict]]] = [
        ("DRAM copy and read", lambda: _dram(dev, plan, notes)),
        ("L2 read", lambda: _l2(dev, plan)),
        ("shared-memory read", lambda: _smem(dev, plan)),
        ("FP32 FMA", lambda: _fma(dev, plan)),
        ("tensor cores", lambda: _tensor_cores(dev, plan, notes)),
        ("kernel launch", lambda: _launch(dev, plan)),
    ]
    results: dict[str, dict] = {}
    for label, step in steps:
        if progress is not None:
            progress(label)
        results.update(step())
    return {
        "device": dev.name,
        "arch": dev.arch,
        "date": datetime.date.today().isoformat(),
        "attributes": dict(dev.attributes),
        "memory_bytes": dev.memory_bytes,
        "results": results,
        "notes": notes,
        "plan": "quick" if quick else "full",
    }
