"""From a CPU's measurements to a `kind: cpu` profile: the part of `tk-hw probe --cpu` that needs
no measuring.

    text = probed_cpu_profile(measurements)

`measurements` is what `tilekit.runtime.probe_cpu.measure_cpu` returns (plain data, base units):

    {"kind": "cpu", "device": "AMD EPYC 7B13", "vendor": "amd", "arch": "znver3",
     "date": "2026-01-05", "plan": "full", "notes": [...],
     "topology": {"cores": 2, "threads": 2, "isa": "avx2", "vector_bytes": 32,
                  "memory_bytes": 25276063744, "how": "sysfs topology of ...",
                  "caches": [{"level": "l1", "capacity": 32768, "line": 64, "shared_by": 1,
                              "how": "sysfs cpu0/cache/index0"}, ...]},
     "results": {"clock": {"value": 3.0e9, "what": "...", "samples": 12, "low": ..,
                           "high": ..}, "read_l2_core": {...}, ...}}     # CPU_RESULTS

Unlike a GPU probe, nothing comes from a base profile: every figure is measured here or derived
from what was (its source says which), so the profile describes the machine in hand alone.
Which figure comes from which measurement is documented in docs/hwprofiles.md, "Probing a CPU".
The text is in a fixed order and validated before it is returned; the same measurements give the
same bytes.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from tilekit.errors import ProfileError
from tilekit.hw.cpu import ISA_REGISTERS, PEAK_DTYPE_BYTES
from tilekit.hw.edit import number_text
from tilekit.hw.probe_profile import CPU_RESULTS, whole_bytes
from tilekit.hw.registry import read_profile_text
from tilekit.hw.units import UNITS, format_quantity

SUFFIX = "-probed"
#: The unit each dimension is written in.
_UNIT = {"bandwidth": "GB/s", "frequency": "GHz", "time": "us"}
#: How each ISA's registers are named, for the source of `simd.registers`.
_REGISTER_NAMES = {"avx2": "ymm0-ymm15", "avx512": "zmm0-zmm31", "neon": "v0-v31",
                   "sve": "z0-z31"}
_FRACTION_DIGITS = 3
#: How far from a whole number the FMA rate over the clock may be before the figure gets a note.
UNITS_TOLERANCE = 0.1


def _quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid double-quoted YAML scalar


class _Writer:
    """The profile's lines, and the measurements' provenance."""

    def __init__(self, m: Mapping[str, Any]):
        for key in ("device", "arch", "date"):
            if not isinstance(m.get(key), str) or not m[key]:
                raise ProfileError(f"measurements lack '{key}'", "tk-hw probe --cpu")
        self.m = m
        self.topology: Mapping[str, Any] = m.get("topology") or {}
        self.results: Mapping[str, Mapping[str, Any]] = m.get("results") or {}
        self.lines: list[str] = []

    def by(self, what: str) -> str:
        return f"tk-hw probe --cpu ({what}) on {self.m['device']}, {self.m['date']}"

    def result(self, name: str) -> float:
        if name not in self.results:
            raise ProfileError(f"measurements lack '{name}' ({CPU_RESULTS[name][0]})",
                               "tk-hw probe --cpu", "run the whole probe")
        return float(self.results[name]["value"])

    def spread(self, name: str) -> str | None:
        """The note of a measured figure: how many repetitions, their range."""
        entry = self.results[name]
        if "samples" not in entry:
            return None
        dim = CPU_RESULTS[name][1]
        return (f"{entry['samples']} repetitions from {self.m.get('plan', 'full')} plan, "
                f"{format_quantity(entry['low'], dim)} to {format_quantity(entry['high'], dim)}")

    @staticmethod
    def rounded(value: float, dim: str) -> float:
        """`value` as it will be written (4 significant digits in the dimension's unit)."""
        factor = UNITS[dim][_UNIT[dim]]
        return float(number_text(value / factor)) * factor

    def figure(self, indent: int, key: str, value: float | int, dim: str | None, source: str,
               note: str | None = None) -> None:
        parts = []
        if dim == "bytes":
            number, unit = whole_bytes(int(value), "TiB")
            parts += [f"value: {number}", f"unit: {unit}"]
        elif dim in _UNIT:
            parts += [f"value: {number_text(value / UNITS[dim][_UNIT[dim]])}",
                      f"unit: {_UNIT[dim]}"]
        else:
            parts.append(f"value: {number_text(value)}")
        parts.append(f"source: {_quote(source)}")
        if note:
            parts.append(f"note: {_quote(note)}")
        self.lines.append(" " * indent + f"{key}: {{" + ", ".join(parts) + "}")

    def measured(self, indent: int, key: str, name: str, value: float | None = None,
                 note: str | None = None) -> None:
        """A figure that is one measurement (`value` when it was adjusted; `note` on top)."""
        dim = CPU_RESULTS[name][1]
        shown = self.result(name) if value is None else value
        notes = [n for n in (note, self.spread(name)) if n]
        self.figure(indent, key, shown, dim,
                    "measured: " + self.by(self.results[name]["what"]), "; ".join(notes) or None)


def _cores_and_simd(w: _Writer) -> tuple[int, str, int, int, float]:
    t = w.topology
    cores, threads, isa, width = (int(t["cores"]), int(t["threads"]), str(t["isa"]),
                                  int(t["vector_bytes"]))
    how = t.get("how", "sysfs topology")
    w.lines += ["cores:"]
    w.figure(2, "physical", cores, None, "measured: " + w.by(f"{how}: distinct physical cores"))
    w.figure(2, "threads", threads, None, "measured: " + w.by(f"{how}: hardware threads"))
    if isa not in ISA_REGISTERS:
        raise ProfileError(f"unknown SIMD ISA '{isa}' in the measurements", "tk-hw probe --cpu")
    clock = w.rounded(w.result("clock"), "frequency")
    lanes = width // PEAK_DTYPE_BYTES["fp32"]
    flop_per_clock = w.result("fma_per_clock")
    per_clock = flop_per_clock / (lanes * 2)
    units = max(1, round(per_clock))
    w.lines += ["", "simd:"]
    w.lines.append(f"  isa: {{value: {isa}, source: "
                   + _quote("measured: " + w.by("the compiler's predefined macros under "
                                                "-march=native")) + "}")
    w.figure(2, "width", width, "bytes",
             "measured: " + w.by("the vector width the compiled kernels use"
                                 + (" (svcntb)" if isa == "sve" else "")))
    w.figure(2, "registers", ISA_REGISTERS[isa], None,
             f"derived: {isa} has {ISA_REGISTERS[isa]} architectural vector registers "
             f"({_REGISTER_NAMES[isa]})")
    off = abs(per_clock - round(per_clock)) > UNITS_TOLERANCE
    w.figure(2, "fma_units", units, None,
             f"derived: {number_text(flop_per_clock)} FP32 FLOP per clock on one core / "
             f"({lanes} lanes x 2 FLOP) = {per_clock:.2f}, rounded"
             + (" up to 1" if per_clock < 0.5 else "") + "; FLOP per clock measured: "
             + w.by(w.results["fma_per_clock"]["what"]),
             note=("not near a whole number: the clock or the FMA rate was disturbed by other "
                   "work on the machine; probe again" if off else None))
    return cores, isa, width, units, clock


def _memory(w: _Writer, cores: int, width: int) -> None:
    registers = ISA_REGISTERS[w.topology["isa"]]
    w.lines += ["", "memory:                 # innermost first; capacity is one instance, "
                    "shared_by the cores sharing it",
                "  - level: registers",
                "    label: vector registers"]
    w.figure(4, "capacity", registers * width, "bytes",
             f"derived: {registers} registers x {width} B, one hardware thread")
    caches = sorted(w.topology.get("caches") or [], key=lambda c: c["level"])
    if [c["level"] for c in caches][:2] != ["l1", "l2"]:
        raise ProfileError("measurements lack the l1 and l2 caches", "tk-hw probe --cpu")
    labels = {"l1": "L1 data cache", "l2": "L2 cache", "l3": "L3 cache"}
    for cache in caches:
        level = cache["level"]
        how = cache.get("how", "sysfs")
        w.lines += [f"  - level: {level}", f"    label: {labels[level]}"]
        w.figure(4, "capacity", int(cache["capacity"]), "bytes",
                 "measured: " + w.by(f"{how}/size"))
        w.figure(4, "shared_by", int(cache["shared_by"]), None,
                 "measured: " + w.by(f"{how}/shared_cpu_list, in cores"))
        w.figure(4, "line", int(cache["line"]), "bytes",
                 "measured: " + w.by(f"{how}/coherency_line_size"))
        _bandwidths(w, level)
    w.lines += ["  - level: dram", "    label: main memory"]
    w.figure(4, "capacity", int(w.topology["memory_bytes"]), "bytes",
             "measured: " + w.by("os.sysconf: SC_PHYS_PAGES x SC_PAGE_SIZE"))
    outer = caches[-1]
    w.figure(4, "line", int(outer["line"]), "bytes",
             f"derived: the line of the last cache, memory[{outer['level']}].line")
    _bandwidths(w, "dram")


def _bandwidths(w: _Writer, level: str) -> None:
    """`bandwidth` (one core) and `bandwidth_all` (all cores) of a level, as measured; an
    all-core rate measured below the one-core rate (a busy machine) is written as the latter."""
    one = w.rounded(w.result(f"read_{level}_core"), "bandwidth")
    every = w.rounded(w.result(f"read_{level}_all"), "bandwidth")
    w.measured(4, "bandwidth", f"read_{level}_core", one)
    if every < one:
        w.measured(4, "bandwidth_all", f"read_{level}_all", one,
                   note=f"all cores measured {format_quantity(every, 'bandwidth')}, less than one "
                        f"core: written as one core's (other work on the machine, or a bus one "
                        f"core saturates)")
    else:
        w.measured(4, "bandwidth_all", f"read_{level}_all", every)


def _achievable(w: _Writer, cores: int, width: int, units: int, clock: float) -> None:
    lanes = width // PEAK_DTYPE_BYTES["fp32"]
    peak = cores * units * lanes * 2 * clock
    measured = w.result("fma_all")
    ratio = measured / peak
    fraction = min(1.0, max(10.0 ** -_FRACTION_DIGITS, round(ratio, _FRACTION_DIGITS)))
    source = (f"derived: FP32 FMA on all cores {format_quantity(measured, 'rate')} / the derived "
              f"peak {format_quantity(peak, 'rate')} ({cores} cores x {units} FMA units x "
              f"{lanes} lanes x 2 FLOP x {format_quantity(clock, 'frequency')}); the rate "
              "measured: " + w.by(w.results["fma_all"]["what"]))
    if ratio > 1:
        source += "; capped at 1: the measurement exceeds the derived peak"
    streamed = ("derived: the bandwidths above are streaming-read rates measured on this machine, "
                "already what a kernel reaches")
    w.lines += ["", "achievable:             # fractions of the figures above that kernels reach"]
    w.figure(2, "dram", 1, "fraction", streamed)
    w.figure(2, "compute", fraction, "fraction", source)
    w.figure(2, "cache", 1, "fraction", streamed)


def probed_cpu_profile(measurements: Mapping[str, Any]) -> str:
    """The `kind: cpu` profile YAML of a measured CPU (module docstring). Pure: the same
    measurements give the same bytes. Raises ProfileError when the result does not validate."""
    w = _Writer(measurements)
    arch = measurements["arch"]
    name = (arch if arch != "native" else "cpu") + SUFFIX
    w.lines += [
        f"# Probed by tk-hw probe --cpu on {measurements['device']}, {measurements['date']}.",
        "# Every figure is measured on this machine or derived from what was (each source says",
        "# which); docs/hwprofiles.md, \"Probing a CPU\", says how.",
        "schema: 1",
        f"name: {name}",
        f"vendor: {_quote(str(measurements.get('vendor') or 'unknown'))}",
        f"arch: {_quote(arch)}              # g++ -march value of this CPU",
        "kind: cpu",
        "description: " + _quote(f"{measurements['device']}, probed by tk-hw probe --cpu on "
                                 f"{measurements['date']}"),
        "",
    ]
    cores, _, width, units, clock = _cores_and_simd(w)
    _memory(w, cores, width)
    w.lines += ["", "compute:"]
    w.measured(2, "clock", "clock", clock)
    w.lines += ["", "parallel:"]
    w.measured(2, "fork_join", "fork_join")
    _achievable(w, cores, width, units, clock)
    text = "\n".join(w.lines) + "\n"
    try:
        read_profile_text(text, "<probed>")
    except ProfileError as exc:
        raise ProfileError(f"the probed profile does not validate: {exc.message()}",
                           "tk-hw probe --cpu", "check the measurements") from None
    return text
