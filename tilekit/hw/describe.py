"""Profiles as rows of text for people: the `tk-hw list` summary and the `tk-hw show` table.

Only presentation: values come from `Profile.figure`, units from `tilekit.hw.schema`.
"""

from __future__ import annotations

from tilekit.hw.profile import Features, MmaShape, Profile
from tilekit.hw.schema import dimension_of
from tilekit.hw.units import format_quantity

#: SMS/CORES: SMs on a GPU, tiles on a distributed machine, physical cores on a CPU.
SUMMARY_COLUMNS = ("NAME", "ARCH", "KIND", "SMS/CORES", "DRAM BW", "FP32 PEAK", "ALIASES")


def summary_row(p: Profile) -> tuple[str, ...]:
    """One line of `tk-hw list`."""
    return (p.name, p.arch, p.kind, str(p.sm_count),
            format_quantity(p.dram_bandwidth, "bandwidth"),
            format_quantity(p.peak_flops("fp32"), "rate"), ", ".join(p.aliases))


def _text(value, dimension: str | None) -> str:
    if isinstance(value, MmaShape):
        return f"{value.instruction} {value.dtype} m{value.m}n{value.n}k{value.k}"
    if isinstance(value, Features):
        return ", ".join(f"{name} {'yes' if flag else 'no'}" for name, flag in vars(value).items())
    if dimension in (None, "count"):
        return str(value)
    return format_quantity(value, dimension)


def identity_rows(p: Profile) -> list[tuple[str, str]]:
    """The descriptive fields, which carry no source."""
    return [("name", p.name), ("description", p.description or "-"), ("vendor", p.vendor),
            ("arch", p.arch), ("kind", p.kind), ("aliases", ", ".join(p.aliases) or "-"),
            ("identity", p.identity())]


def figure_rows(p: Profile) -> list[tuple[str, str, str]]:
    """(file path, value with unit, source as written) for every figure, in file order."""
    rows = []
    for path, ref in p.sources.items():
        dimension = dimension_of(path)
        value = _text(p.figure(path), dimension)
        if dimension == "rate" and path.endswith((".int8", ".int32")):
            value = value.replace("FLOP/s", "OP/s")
        rows.append((path, value, ref))
    return rows
