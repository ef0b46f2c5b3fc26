"""From measurements to a hardware profile: the part of `tk-hw probe` that needs no GPU.

(A CPU's measurements become a profile in `tilekit.hw.probe_cpu_profile`; `measurement_rows`
and the tables of what each probe measures, `RESULTS` and `CPU_RESULTS`, serve both.)

    text = probed_profile(measurements, base_text, "hwprofiles/h100.yaml")

`measurements` is what `tilekit.runtime.probe.measure` returns (plain data, base units):

    {"device": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "date": "2025-06-01",
     "attributes": {"MultiProcessorCount": 132, "ClockRate": 1980000, ...},  # cudaDevAttr*
     "memory_bytes": 85045149696,                                            # cudaMemGetInfo
     "results": {"dram_copy": {"value": 3.0e12, "what": "device-to-device copy ..."}, ...},
     "notes": [...], "plan": "full"}                                       # or "quick"

The result names and their dimensions are `RESULTS`; a result that is absent (tensor cores
before sm_80) leaves the figures it would have set as the base has them.

The result is the base profile's text with these changes, and no others (comments and layout
stay, so `diff` shows what the device changed):

- identity: `name` is `<base>-probed`, `description` names the device and date, `aliases` are
  dropped (they name the base), `arch` is the device's when its compute capability differs;
- limits and sizes read from device attributes replace the base's, `measured:`;
- peaks are the base's (datasheets), scaled by SM count x clock when those differ from the
  base's; DRAM's peak is derived from the memory clock and bus width when the device reports
  them;
- rates the profile keeps as fractions of a peak (DRAM, shared memory, SIMT and tensor-core
  compute) become `derived:` fractions, measured / peak (the tensor-core one only where
  mma.sync is the device's fastest matrix instruction); the L2 bandwidth and the launch
  overhead, which have no fraction, are written as measured.

Which figure comes from which measurement is documented in docs/hwprofiles.md, "Probing a
device". The output is validated before it is returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from tilekit.errors import ProfileError
from tilekit.hw.edit import ProfileText, figure_text, number_text
from tilekit.hw.profile import (FEATURE_MIN_CC, FEATURES, REGISTER_BYTES, Profile,
                                compute_capability)
from tilekit.hw.registry import builtin_dir, read_profile_file, read_profile_text
from tilekit.hw.schema import dimension_of
from tilekit.hw.units import UNITS, format_quantity

#: What `tk-hw probe` measures: result name -> (label for people, dimension). Base units.
RESULTS = {
    "dram_copy": ("DRAM copy", "bandwidth"),
    "dram_read": ("DRAM read", "bandwidth"),
    "l2_read": ("L2 read", "bandwidth"),
    "smem_read": ("shared memory read, per SM", "bandwidth"),
    "fp32_fma": ("FP32 FMA", "rate"),
    "mma_fp16": ("tensor cores, fp16", "rate"),
    "mma_bf16": ("tensor cores, bf16", "rate"),
    "mma_tf32": ("tensor cores, tf32", "rate"),
    "launch_events": ("kernel launch, CUDA events", "time"),
    "launch_wall": ("kernel launch, wall clock", "time"),
}
#: What `tk-hw probe --cpu` measures (tilekit.runtime.probe_cpu; the profile is written by
#: tilekit.hw.probe_cpu_profile): result name -> (label for people, dimension). Base units.
CPU_RESULTS = {
    "clock": ("clock (dependent adds)", "frequency"),
    "fma_core": ("FP32 FMA, one core", "rate"),
    "fma_all": ("FP32 FMA, all cores", "rate"),
    "fma_per_clock": ("FP32 FLOP per clock, one core", "count"),
    "fork_join": ("OpenMP fork/join", "time"),
    **{f"read_{level}_{scope}": (f"{level.upper() if level != 'dram' else 'DRAM'} read, "
                                 f"{'one core' if scope == 'core' else 'all cores'}",
                                 "bandwidth")
       for level in ("l1", "l2", "l3", "dram") for scope in ("core", "all")},
}
#: Profile figures read from one device attribute (the cudaDevAttr name without its prefix).
ATTRIBUTE_FIGURES = {
    "parallelism.sm_count": "MultiProcessorCount",
    "parallelism.warp_size": "WarpSize",
    "parallelism.max_threads_per_block": "MaxThreadsPerBlock",
    "parallelism.max_threads_per_sm": "MaxThreadsPerMultiProcessor",
    "parallelism.max_blocks_per_sm": "MaxBlocksPerMultiprocessor",
    "registers.per_sm": "MaxRegistersPerMultiprocessor",
    "registers.max_per_block": "MaxRegistersPerBlock",
    "memory[shared].capacity": "MaxSharedMemoryPerMultiprocessor",
    "memory[shared].per_block_static": "MaxSharedMemoryPerBlock",
    "memory[shared].per_block_optin": "MaxSharedMemoryPerBlockOptin",
    "memory[l2].capacity": "L2CacheSize",
}
#: Tensor-core rates measured with mma.sync: result name -> dtype key of `compute.tensor_core`.
MMA_RESULTS = {"mma_fp16": "fp16", "mma_bf16": "bf16", "mma_tf32": "tf32"}
#: The unit of a figure the base does not have (a figure the base has keeps its unit).
_NEW_UNIT = {"bandwidth": "TB/s", "rate": "TFLOP/s", "time": "us", "frequency": "GHz",
             "bytes": "KiB"}
_BINARY_UNITS = ("TiB", "GiB", "MiB", "KiB", "B")
#: Digits after the point of an achievable fraction.
_FRACTION_DIGITS = 3
SUFFIX = "-probed"


class _Measurements:
    """Read access to a measurements mapping (see the module docstring)."""

    def __init__(self, data: Mapping[str, Any]):
        for key in ("device", "arch", "date"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ProfileError(f"measurements lack '{key}'", "tk-hw probe")
        self.device, self.arch, self.date = data["device"], data["arch"], data["date"]
        self.attributes: Mapping[str, int] = data.get("attributes") or {}
        self.results: Mapping[str, Mapping[str, Any]] = data.get("results") or {}
        self.memory_bytes: int | None = data.get("memory_bytes")

    def by(self, what: str) -> str:
        return f"tk-hw probe ({what}) on {self.device}, {self.date}"

    def attribute(self, name: str) -> int | None:
        """A device attribute, None when the device does not report it (or reports 0)."""
        value = self.attributes.get(name)
        return int(value) if value else None

    def result(self, name: str) -> float | None:
        entry = self.results.get(name)
        return float(entry["value"]) if entry else None

    def what(self, name: str) -> str:
        return self.results[name]["what"]

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        return compute_capability(self.arch)


class _Changes:
    """The figures to write, by profile path, in base units; `value` reads a figure as it will
    be after them."""

    def __init__(self, base: Profile, doc: ProfileText):
        self.base = base
        self.doc = doc
        self.figures: dict[str, tuple[float | int, str, str | None]] = {}

    def unit(self, path: str) -> str | None:
        dim = dimension_of(path)
        if not UNITS.get(dim):
            return None
        return self.doc.unit(path) or _NEW_UNIT[dim]

    def set(self, path: str, value: float | int, source: str, note: str | None = None) -> None:
        unit = self.unit(path)
        if unit and dimension_of(path) != "bytes":  # rounded as it will be written
            factor = UNITS[dimension_of(path)][unit]
            value = float(number_text(value / factor)) * factor
        self.figures[path] = (value, source, note)

    def value(self, path: str) -> Any:
        return self.figures[path][0] if path in self.figures else self.base.figure(path)

    def quantity(self, path: str, value: float) -> str:
        """`value` (base units) in the unit of the figure at `path`: `3.35 TB/s`."""
        unit = self.unit(path)
        if not unit:
            return number_text(value)
        return f"{number_text(value / UNITS[dimension_of(path)][unit])} {unit}"

    def text(self, path: str) -> str:
        value, source, note = self.figures[path]
        unit = self.unit(path)
        if dimension_of(path) == "bytes":
            value, unit = whole_bytes(int(value), unit)
        elif unit:
            value = value / UNITS[dimension_of(path)][unit]
        return figure_text(value, unit, source, note)


def whole_bytes(nbytes: int, unit: str) -> tuple[int, str]:
    """`nbytes` in `unit` when that is a whole number, else in the largest binary unit that is."""
    for candidate in (unit, *_BINARY_UNITS):
        factor = int(UNITS["bytes"][candidate])
        if nbytes % factor == 0:
            return nbytes // factor, candidate
    return nbytes, "B"


# -- what changes -----------------------------------------------------------------------------

def _limits(c: _Changes, m: _Measurements) -> None:
    """Counts and sizes from device attributes; the clock; the device memory's size."""
    for path, name in ATTRIBUTE_FIGURES.items():
        value = m.attribute(name)
        if value is not None:
            c.set(path, value, "measured: " + m.by(f"device attribute {name}"))
    threads, warp = m.attribute("MaxThreadsPerMultiProcessor"), m.attribute("WarpSize")
    if threads and warp:
        c.set("parallelism.max_warps_per_sm", threads // warp,
              f"derived: max_threads_per_sm {threads} / warp_size {warp}; "
              + m.by("device attributes"))
    regs = m.attribute("MaxRegistersPerMultiprocessor")
    if regs:
        c.set("memory[registers].capacity", regs * REGISTER_BYTES,
              f"derived: registers.per_sm {regs} x {REGISTER_BYTES} B; "
              + m.by("device attributes"))
    if m.memory_bytes:
        c.set("memory[dram].capacity", int(m.memory_bytes),
              "measured: " + m.by("cudaMemGetInfo, total"))
    clock_khz = m.attribute("ClockRate")
    if clock_khz:
        c.set("compute.clock", clock_khz * 1e3,
              "measured: " + m.by("device attribute ClockRate, the maximum SM clock"))


def _peaks(c: _Changes, m: _Measurements) -> None:
    """Peaks follow SM count x clock when the device differs from the base in either; the DRAM
    peak comes from the memory clock and bus width when the device reports them."""
    base = c.base
    sms, clock = c.value("parallelism.sm_count"), c.value("compute.clock")
    scale = sms * clock / (base.sm_count * base.clock_hz)
    if abs(scale - 1) > 1e-9:
        ghz = format_quantity(clock, "frequency")
        why = (f"x ({sms} SMs x {ghz}) / ({base.sm_count} SMs x "
               f"{format_quantity(base.clock_hz, 'frequency')}), the device's over {base.name}'s")
        for section, table in (("compute.simt", base.peaks),
                               ("compute.tensor_core", base.tensor_peaks)):
            for dtype, peak in table.items():
                path = f"{section}.{dtype}"
                c.set(path, peak * scale,
                      f"derived: {base.name}'s {c.quantity(path, peak)} {why}")
    if clock != base.clock_hz and base.smem_banks and base.smem_bank_bytes:
        c.set("memory[shared].bandwidth", base.smem_banks * base.smem_bank_bytes * clock,
              f"derived: {base.smem_banks} banks x {base.smem_bank_bytes} B per clock x "
              f"{format_quantity(clock, 'frequency')}, per SM")
    mem_khz, bus_bits = m.attribute("MemoryClockRate"), m.attribute("GlobalMemoryBusWidth")
    if mem_khz and bus_bits:
        c.set("memory[dram].bandwidth", 2 * mem_khz * 1e3 * bus_bits / 8,
              f"derived: 2 transfers per clock x {number_text(mem_khz / 1e3)} MHz x "
              f"{bus_bits}-bit bus / 8; "
              + m.by("device attributes MemoryClockRate, GlobalMemoryBusWidth"))


def _fraction(c: _Changes, m: _Measurements, path: str, result: str, peak_path: str,
              note: str | None = None) -> float | None:
    """achievable.<path> = the measured rate / the peak at `peak_path`, `derived:`."""
    measured = m.result(result)
    if measured is None:
        return None
    peak = c.value(peak_path)
    ratio = measured / peak
    source = (f"derived: {c.quantity(peak_path, measured)} / {c.quantity(peak_path, peak)} "
              f"({peak_path}); the rate measured: " + m.by(m.what(result)))
    if ratio > 1:
        source += "; capped at 1: the measurement exceeds the peak, check the peak"
    c.set(path, _as_fraction(ratio), source, note)
    return ratio


def _as_fraction(ratio: float) -> float:
    return min(1.0, max(10.0 ** -_FRACTION_DIGITS, round(ratio, _FRACTION_DIGITS)))


def _rates(c: _Changes, m: _Measurements) -> None:
    """Measured rates: as fractions of a peak where the profile keeps one, as they are
    otherwise (L2 bandwidth, launch overhead)."""
    read = m.result("dram_read")
    _fraction(c, m, "achievable.dram", "dram_copy", "memory[dram].bandwidth",
              note=(f"{RESULTS['dram_read'][0]}: {c.quantity('memory[dram].bandwidth', read)} "
                    f"({m.what('dram_read')})") if read else None)
    _fraction(c, m, "achievable.smem", "smem_read", "memory[shared].bandwidth")
    _fraction(c, m, "achievable.compute", "fp32_fma", "compute.simt.fp32")
    _tensor_fraction(c, m)
    l2 = m.result("l2_read")
    if l2 is not None:
        c.set("memory[l2].bandwidth", l2, "measured: " + m.by(m.what("l2_read")))
    launch, wall = m.result("launch_events"), m.result("launch_wall")
    if launch is not None:
        c.set("launch.overhead", launch, "measured: " + m.by(m.what("launch_events")),
              note=(f"wall clock per launch on the host: {c.quantity('launch.overhead', wall)}"
                    if wall is not None else None))


def _tensor_fraction(c: _Changes, m: _Measurements) -> None:
    """compute_tensor: the lowest of the measured mma.sync rates over their dtype's peak.

    Where the base lists another matrix instruction for a measured dtype (wgmma.mma_async on
    sm_90), mma.sync is not the one that reaches the tensor peak: the base's fraction (a GEMM
    library's, on h100) stays, and the mma.sync rates go into its note."""
    ratios = {}
    for result, dtype in MMA_RESULTS.items():
        rate = m.result(result)
        if rate is not None and dtype in c.base.tensor_peaks:
            ratios[result] = rate / c.value(f"compute.tensor_core.{dtype}")
    if not ratios:
        return
    rates = "mma.sync " + ", ".join(
        f"{MMA_RESULTS[r]} {c.quantity(f'compute.tensor_core.{MMA_RESULTS[r]}', m.result(r))} "
        f"= {ratios[r]:.{_FRACTION_DIGITS}f} of the peak" for r in MMA_RESULTS if r in ratios)
    dtypes = {MMA_RESULTS[r] for r in ratios}
    faster = sorted({s.instruction for s in c.base.mma_shapes
                     if s.instruction != "mma.sync" and s.dtype in dtypes})
    path = "achievable.compute_tensor"
    if faster:
        if c.base.achievable.compute_tensor is not None:
            c.set(path, c.base.achievable.compute_tensor, c.base.sources[path],
                  note=f"kept: {', '.join(faster)} reaches more than mma.sync here; "
                       + m.by(rates))
        return
    lowest = min(ratios, key=lambda r: (ratios[r], r))
    _fraction(c, m, path, lowest, f"compute.tensor_core.{MMA_RESULTS[lowest]}",
              note=f"the lowest of: {rates}")


def _identity(doc: ProfileText, base: Profile, m: _Measurements) -> None:
    name = base.name if base.name.endswith(SUFFIX) else base.name + SUFFIX
    doc.set("name", name)
    doc.set("description", json.dumps(f"{m.device}, probed by tk-hw probe on {m.date}; "
                                      f"figures it does not measure are {base.name}'s"))
    doc.delete("aliases")  # they name the base's device; the probed file must not claim them
    cc = m.compute_capability
    if cc is None or cc == base.compute_capability:
        return
    doc.set("arch", m.arch)
    # The base's features describe its own arch; the device's follow from its compute
    # capability (and its cooperative-launch attribute).
    level = cc[0] * 10 + cc[1]
    for feature in FEATURES:
        flag = level >= FEATURE_MIN_CC[feature]
        if feature == "cooperative_launch":
            flag = flag and bool(m.attribute("CooperativeLaunch"))
        doc.set(f"features.{feature}", "true" if flag else "false")
    doc.set("features.source", json.dumps(
        f"derived: compute capability {cc[0]}.{cc[1]} (async copy from 8.0, TMA and clusters "
        "from 9.0) and device attribute CooperativeLaunch; " + m.by("device attributes")))


# -- the function ---------------------------------------------------------------------------

def check_base(base: Profile) -> Profile:
    """`base` if a probe can start from it: an NVIDIA GPU's profile."""
    if base.vendor != "nvidia" or base.kind != "simt":
        raise ProfileError(f"'{base.name}' is a {base.vendor} {base.kind} profile",
                           base.origin or base.name,
                           "tk-hw probe measures NVIDIA GPUs: start from an NVIDIA profile "
                           "(--base h100)" + ("; tk-hw probe --cpu measures a CPU, without a "
                                              "base" if base.kind == "cpu" else ""))
    return base


def probed_profile(measurements: Mapping[str, Any], base_text: str, origin: str) -> str:
    """The profile YAML for a measured device: `base_text` (a profile, named `origin` in
    messages) with the figures the measurements give replaced; see the module docstring.

    Pure: the same measurements and base give the same bytes. Raises ProfileError when the
    base is not a valid NVIDIA profile or the result does not validate.
    """
    base = check_base(read_profile_text(base_text, origin))
    m = _Measurements(measurements)
    doc = ProfileText(base_text, origin)
    changes = _Changes(base, doc)
    _limits(changes, m)
    _peaks(changes, m)
    _rates(changes, m)
    for path in changes.figures:
        doc.set(path, changes.text(path))
    _identity(doc, base, m)
    doc.prepend([
        f"# Probed by tk-hw probe on {m.device}, {m.date}, from {base.name} "
        f"({Path(origin).name}).",
        "# Figures whose source is 'measured: tk-hw probe ...' or 'derived: ...; tk-hw probe ...'",
        f"# come from this device; every other figure, and the comments below, are {base.name}'s.",
    ])
    text = doc.text()
    try:
        read_profile_text(text, f"{origin} (probed)")
    except ProfileError as exc:
        raise ProfileError(f"the probed profile does not validate: {exc.message()}", origin,
                           "check the measurements against the base profile") from None
    return text


def measurement_rows(measurements: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(what was measured, value with unit, how) for each result, in a fixed order: a GPU's
    (`RESULTS`) or a CPU's (`CPU_RESULTS`, when `kind` is cpu)."""
    results = measurements.get("results") or {}
    table = CPU_RESULTS if measurements.get("kind") == "cpu" else RESULTS
    return [(label, format_quantity(results[name]["value"], dim), results[name]["what"])
            for name, (label, dim) in table.items() if name in results]


def default_base(arch: str) -> Path:
    """The shipped profile of `arch`'s compute capability (the first by name), else h100's."""
    cc = compute_capability(arch)
    for path in sorted(builtin_dir().glob("*.yaml")):
        if cc is not None and read_profile_file(path).compute_capability == cc:
            return path
    return builtin_dir() / "h100.yaml"
