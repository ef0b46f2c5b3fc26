"""Units of hardware-profile figures: which spellings each dimension accepts, and how to print them.

A profile writes every dimensioned figure with an explicit unit (`{value: 3.35, unit: TB/s}`);
the loader converts it to the dimension's base unit (bytes, B/s, Hz, operations/s) so that
every `Profile` attribute is in base units. Decimal prefixes (KB, GB/s) are powers of 10 and
binary ones (KiB, GiB) powers of 2: datasheets use both, and mixing them up is a 5-7% error.
"""

from __future__ import annotations

import math
from decimal import Decimal

#: dimension -> {unit spelling: factor to the base unit}. Counts and fractions take no unit.
UNITS: dict[str, dict[str, float]] = {
    "bytes": {
        "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
        "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    },
    "bandwidth": {
        "B/s": 1, "KiB/s": 2**10, "MiB/s": 2**20, "GiB/s": 2**30, "TiB/s": 2**40,
        "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    },
    "frequency": {"Hz": 1, "kHz": 1e3, "MHz": 1e6, "GHz": 1e9},
    # FLOP/s for floating point, OP/s for integer: one dimension, the spelling is for readers.
    "rate": {
        "FLOP/s": 1, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15,
        "OP/s": 1, "GOP/s": 1e9, "TOP/s": 1e12, "POP/s": 1e15,
    },
    "time": {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    "count": {},
    "fraction": {},
}

#: The base unit each dimension is stored in (what `Profile` attributes hold).
BASE_UNIT = {"bytes": "B", "bandwidth": "B/s", "frequency": "Hz", "rate": "FLOP/s",
             "time": "s", "count": "", "fraction": ""}


def to_base(value: float | int, factor: float | int) -> float | int:
    """`value` in a unit of `factor` -> base units, without binary-float fuzz for decimal prefixes.

    66.9 x 1e12 in floating point is 66900000000000.01; shifting the decimal exponent of the
    written value instead gives the float nearest to what the author wrote.
    """
    if isinstance(value, (int, float)) and factor != 1 and math.isfinite(value):
        exponent = math.log10(factor)
        if exponent.is_integer():   # repr may be in exponent form itself: 1e-05
            return float(Decimal(repr(value)).scaleb(int(exponent)))
    return value * factor


def unit_list(dimension: str) -> str:
    """The accepted spellings of a dimension, for hints."""
    return ", ".join(UNITS[dimension])


def _scaled(value: float, steps: list[tuple[float, str]]) -> str:
    for factor, suffix in steps:
        if abs(value) >= factor:
            text = f"{value / factor:.4g}"
            return f"{text} {suffix}"
    return f"{value:.4g} {steps[-1][1]}"


def format_quantity(value: float | int | None, dimension: str) -> str:
    """A short rendering for people: 232448 bytes -> `227 KiB`, 3.35e12 B/s -> `3.35 TB/s`."""
    if value is None:
        return "-"
    if dimension == "bytes":
        # The unit that writes the value as the smallest whole number: 232448 is 227 KiB,
        # 112e9 is 112 GB (not 109375000 KiB), as the datasheet would write it.
        exact = [(value // factor, suffix) for suffix, factor in UNITS["bytes"].items()
                 if value >= factor and value % factor == 0]
        if exact:
            number, suffix = min(exact)
            return f"{int(number)} {suffix}"
        return _scaled(value, [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B")])
    if dimension == "bandwidth":
        return _scaled(value, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1, "B/s")])
    if dimension == "frequency":
        return _scaled(value, [(1e9, "GHz"), (1e6, "MHz"), (1, "Hz")])
    if dimension == "rate":
        return _scaled(value, [(1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"),
                               (1, "FLOP/s")])
    if dimension == "time":
        return _scaled(value, [(1, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")])
    if dimension == "fraction":
        return f"{value:g}"
    if isinstance(value, float) and not value.is_integer():  # a measured ratio
        return f"{value:.4g}"
    return f"{value}"
