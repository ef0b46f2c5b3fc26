"""The profile file format: reads one `hwprofiles/*.yaml` document into a checked `Profile`.

Owns everything about the *file*: YAML with line numbers, the field tables (dimension and
plausible range of every figure), units, sources, and located error messages
(`h100.yaml:23: parallelism.sm_count: missing; ...`). Cross-field rules live with `Profile`
(tilekit.hw.profile) and are reported here at the line of the field they name.

A `kind: cpu` profile has its own sections (`cores`, `simd`, `parallel`, cache levels l1-l3 in
`memory`; `read_cpu_profile`), read with the same figures, units, sources and errors.

A figure is always a mapping `{value: 3.35, unit: TB/s, source: datasheet}`: a bare number
has no provenance and is refused. `source` is a key of the file's `sources:` map (a document
name and URL) or a literal `measured: <command>`, `derived: <formula>` or `assumed: <why>`.
The format is described field by field in docs/hwprofiles.md.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

from tilekit import textdoc
from tilekit.errors import ProfileError, excerpt
from tilekit.hw import cpu as cpu_model
from tilekit.hw.cpu import CPU_LEVELS, ISAS, CpuLevel, CpuSpec
from tilekit.hw.profile import (DTYPES, FEATURES, KINDS, REGISTER_BYTES, Achievable, Features,
                                MmaShape, Profile)
from tilekit.hw.units import BASE_UNIT, UNITS, format_quantity, to_base, unit_list

SCHEMA_VERSION = 1
#: Memory levels in the order a file lists them, innermost first.
LEVELS = ("registers", "shared", "l2", "dram")
#: The prefixes of a source written in place instead of as a key of `sources:`.
SOURCE_KINDS = ("measured", "derived", "assumed")

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


@dataclass(frozen=True)
class Spec:
    """One figure: its dimension, plausible range in base units, and whether it is required.

    The ranges are wide (any GPU or tile processor in production fits with room to spare);
    they exist to catch a wrong prefix (GB/s for TB/s) or a lost exponent, not to judge
    hardware.
    """

    dim: str
    low: float
    high: float
    required: bool = True


def _count(high: float) -> Spec:
    return Spec("count", 1, high)


PARALLELISM = {
    "sm_count": _count(100_000),
    "warp_size": _count(128),
    "max_threads_per_block": _count(65_536),
    "max_threads_per_sm": _count(65_536),
    "max_blocks_per_sm": _count(1024),
    "max_warps_per_sm": _count(65_536),
}
REGISTERS = {
    "per_sm": _count(2**24),
    "max_per_block": _count(2**24),
    "max_per_thread": _count(65_536),
}
_TRANSACTION = Spec("bytes", 1, 4096)
LEVEL_FIELDS: dict[str, dict[str, Spec]] = {
    # per SM; the register file has no bandwidth or transaction worth modelling: a register
    # is 4 bytes and an instruction reads its operands at full rate
    "registers": {"capacity": Spec("bytes", 4, 64 * MiB)},
    "shared": {  # capacity and bandwidth per SM (per tile)
        "capacity": Spec("bytes", 1 * KiB, 64 * MiB),
        "per_block_static": Spec("bytes", 1 * KiB, 64 * MiB),
        "per_block_optin": Spec("bytes", 1 * KiB, 64 * MiB),
        "banks": Spec("count", 1, 1024, required=False),
        "bank_width": Spec("bytes", 1, 64, required=False),
        "bandwidth": Spec("bandwidth", 1e9, 1e14),
        "transaction": _TRANSACTION,
    },
    "l2": {  # device-wide
        "capacity": Spec("bytes", 64 * KiB, 16 * GiB),
        "bandwidth": Spec("bandwidth", 1e10, 1e16),
        "transaction": _TRANSACTION,
    },
    "dram": {  # device-wide
        "capacity": Spec("bytes", 16 * MiB, 16 * TiB),
        "bandwidth": Spec("bandwidth", 1e9, 1e14),
        "transaction": _TRANSACTION,
        # a global load's round trip under load (optional: without it, not modelled)
        "latency": Spec("time", 1e-8, 1e-4, required=False),
    },
}
CLOCK = Spec("frequency", 1e8, 1e10)
PEAK = Spec("rate", 1e9, 1e17)
MMA_DIM = (1, 1024)
ACHIEVABLE = {"dram": Spec("fraction", 0, 1), "compute": Spec("fraction", 0, 1),
              "smem": Spec("fraction", 0, 1),
              "compute_tensor": Spec("fraction", 0, 1, required=False)}
EXCHANGE = {"bandwidth": Spec("bandwidth", 1e9, 1e16)}
#: Kernel launch: the time from one kernel's launch to the next one's start on an idle device.
LAUNCH = {"overhead": Spec("time", 1e-8, 1e-3)}

# -- kind: cpu (tilekit.hw.cpu) -----------------------------------------------------------------
CORES = {"physical": _count(1_000_000), "threads": _count(8_000_000)}
SIMD = {"width": Spec("bytes", 8, 256), "registers": _count(256), "fma_units": _count(16)}


def _cpu_cache(capacity_high: float) -> dict[str, Spec]:
    # bandwidth: one core reading alone; bandwidth_all: all cores at once (required for a
    # shared level, one core's x cores when absent on a private one)
    return {
        "capacity": Spec("bytes", 1 * KiB, capacity_high),
        "shared_by": _count(1_000_000),
        "line": Spec("bytes", 16, 1024),
        "bandwidth": Spec("bandwidth", 1e8, 1e14),
        "bandwidth_all": Spec("bandwidth", 1e8, 1e17, required=False),
        "latency": Spec("time", 1e-10, 1e-5, required=False),
    }


CPU_LEVEL_FIELDS: dict[str, dict[str, Spec]] = {
    "registers": {"capacity": Spec("bytes", 64, 64 * KiB)},  # one hardware thread's
    "l1": _cpu_cache(16 * MiB),
    "l2": _cpu_cache(1 * GiB),
    "l3": _cpu_cache(16 * GiB),
    "dram": {  # the machine's memory, all cores
        "capacity": Spec("bytes", 16 * MiB, 64 * TiB),
        "line": Spec("bytes", 16, 1024),
        "bandwidth": Spec("bandwidth", 1e8, 1e13),
        "bandwidth_all": Spec("bandwidth", 1e8, 1e15),
        "latency": Spec("time", 1e-8, 1e-4, required=False),
    },
}
#: One empty OpenMP parallel region on all cores (fork, implicit barrier, join).
PARALLEL = {"fork_join": Spec("time", 1e-8, 1e-2)}
#: `cache` is the fraction of the cache levels' bandwidths (the GPU kinds' `smem`).
CPU_ACHIEVABLE = {"dram": Spec("fraction", 0, 1), "compute": Spec("fraction", 0, 1),
                  "cache": Spec("fraction", 0, 1)}

GPU_SECTIONS = ("parallelism", "registers", "features", "exchange", "launch")
CPU_SECTIONS = ("cores", "simd", "parallel")
TOP_LEVEL = ("schema", "name", "vendor", "arch", "aliases", "kind", "description", "sources",
             "parallelism", "registers", "memory", "compute", "features", "achievable",
             "exchange", "launch", "cores", "simd", "parallel")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def dimension_of(path: str) -> str | None:
    """The dimension of the figure at a document path (`memory[dram].bandwidth` -> bandwidth)."""
    m = re.fullmatch(r"memory\[(\w+)\]\.(\w+)", path)
    if m:
        spec = (LEVEL_FIELDS.get(m.group(1), {}).get(m.group(2))
                or CPU_LEVEL_FIELDS.get(m.group(1), {}).get(m.group(2)))
        return spec.dim if spec else None
    section, _, key = path.partition(".")
    if section == "compute":
        if key == "clock":
            return CLOCK.dim
        return (PEAK.dim if key.startswith(("simt.", "tensor_core.", "peak.", "peak_per_core."))
                else None)
    tables = {"parallelism": PARALLELISM, "registers": REGISTERS,
              "achievable": {**ACHIEVABLE, **CPU_ACHIEVABLE}, "exchange": EXCHANGE,
              "launch": LAUNCH, "cores": CORES, "simd": SIMD, "parallel": PARALLEL}
    spec = tables.get(section, {}).get(key)
    return spec.dim if spec else None


# -- YAML with line numbers -------------------------------------------------------------------

class _Map(dict):
    """A YAML mapping that remembers its line and the line of each key (1-based)."""

    line = 0
    key_lines: dict = {}


def _make_map(entries: list[tuple[Any, Any, int]], line: int) -> _Map:
    result = _Map((key, value) for key, value, _ in entries)
    result.line = line
    result.key_lines = {key: key_line for key, _, key_line in entries}
    return result


def parse_yaml(text: str, origin: str) -> Any:
    """YAML text -> data whose mappings know their lines; a syntax error names line and column.

    Read by `tilekit.textdoc` (no aliases or tags, bounded nesting, YAML 1.2 core scalars)."""
    docs = textdoc.load_yaml(text, origin, ProfileError, mapping=_make_map)
    if len(docs) > 1:
        raise ProfileError(f"{len(docs)} YAML documents in one profile, expected one", origin,
                           "remove the '---' separators")
    return docs[0] if docs else None


# -- the reader ----------------------------------------------------------------------------------

def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {excerpt(value)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Reader:
    """Walks one document; collects figures in base units and the source of each."""

    def __init__(self, origin: str):
        self.origin = origin
        self.references: dict[str, str] = {}
        self.sources: dict[str, str] = {}
        self.lines: dict[str, int] = {}

    # located errors

    def fail(self, what: str, node: _Map, key: Any, path: str, hint: str | None = None):
        """Raise a ProfileError at the line of `node[key]` (of `node` when the key is absent)."""
        line = node.key_lines.get(key, node.line)
        where = f"{self.origin}:{line}: {path}" if line else f"{self.origin}: {path}"
        raise ProfileError(what, where, hint)

    def mapping(self, parent: _Map, key: str, path: str, required: bool = True) -> _Map | None:
        if key not in parent:
            if required:
                self.fail("missing", parent, key, path, f"add a '{key}:' section")
            return None
        value = parent[key]
        if not isinstance(value, _Map):
            self.fail(f"expected a mapping, got {_describe(value)}", parent, key, path)
        self.lines[path] = parent.key_lines[key]
        return value

    def known_keys(self, node: _Map, allowed, path: str) -> None:
        for key in node:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1)
                hint = (f"did you mean '{close[0]}'?" if close
                        else f"known fields: {', '.join(map(str, allowed))}")
                shown = excerpt(key, quote=False)
                self.fail(f"unknown field '{shown}'", node, key, f"{path}.{shown}".lstrip("."),
                          hint)

    def string(self, parent: _Map, key: str, path: str, required: bool = True,
               choices: tuple[str, ...] | None = None) -> str | None:
        if key not in parent:
            if required:
                self.fail("missing", parent, key, path)
            return None
        value = parent[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(f"expected a non-empty string, got {_describe(value)}", parent, key, path)
        if choices and value not in choices:
            self.fail(f"'{excerpt(value, quote=False)}' is not one of: {', '.join(choices)}",
                      parent, key, path)
        self.lines[path] = parent.key_lines[key]
        return value

    def source(self, node: _Map, path: str) -> str:
        if "source" not in node:
            self.fail("missing source", node, "source", path,
                      "every figure says where it came from: a key of 'sources:', "
                      "or 'measured: <command>', 'derived: <how>', 'assumed: <why>'")
        ref = node["source"]
        if not isinstance(ref, str) or not ref.strip():
            self.fail(f"source must be a non-empty string, got {_describe(ref)}",
                      node, "source", path)
        kind, sep, rest = ref.partition(":")
        if ref in self.references or (sep and kind.strip() in SOURCE_KINDS and rest.strip()):
            return ref
        known = ", ".join(self.references) or "none defined"
        self.fail(f"unknown source '{excerpt(ref, quote=False)}'", node, "source", path,
                  f"use a key of 'sources:' ({known}) or write 'measured: <command>', "
                  "'derived: <how>' or 'assumed: <why>'")

    def figure(self, parent: _Map, key: str, path: str, spec: Spec) -> float | int | None:
        """Read `{value, unit, source}` at parent[key]; return the value in base units."""
        if key not in parent:
            if spec.required:
                unit = f"unit: {BASE_UNIT[spec.dim]}, " if UNITS[spec.dim] else ""
                self.fail("missing", parent, key, path,
                          f"add '{key}: {{value: ..., {unit}source: ...}}'")
            return None
        node = parent[key]
        if _is_number(node):
            self.fail(f"a bare number ({node}) has no source", parent, key, path,
                      f"write {{value: {node}, "
                      + (f"unit: {BASE_UNIT[spec.dim]}, " if UNITS[spec.dim] else "")
                      + "source: ...}")
        if not isinstance(node, _Map):
            self.fail(f"expected {{value, unit, source}}, got {_describe(node)}",
                      parent, key, path)
        self.known_keys(node, ("value", "unit", "source", "note"), path)
        self.lines[path] = parent.key_lines[key]
        if "value" not in node:
            self.fail("missing value", node, "value", path)
        value = node["value"]
        if not _is_number(value):
            self.fail(f"wrong type: expected a number, got {_describe(value)}",
                      node, "value", path)
        if not math.isfinite(value):
            self.fail(f"must be a finite number, got {value}", node, "value", path,
                      "write the figure itself (YAML's .inf and .nan are not figures)")
        scale = self.unit_scale(node, path, spec)
        ref = self.source(node, path)
        written = f"{value} {node.get('unit', '')}".strip()

        if spec.dim == "count" and not isinstance(value, int):
            self.fail(f"wrong type: expected a whole number, got {value}", node, "value", path)
        if spec.dim == "fraction":
            if not 0 < value <= 1:
                self.fail(f"must be a fraction in (0, 1], got {value}", node, "value", path)
        elif value <= 0:
            self.fail(f"must be positive, got {written}", node, "value", path)
        base = to_base(value, scale)
        if spec.dim != "fraction" and not spec.low <= base <= spec.high:   # inf too
            low, high = (format_quantity(v, spec.dim) for v in (spec.low, spec.high))
            self.fail(f"out of plausible range: {written} is outside [{low}, {high}]",
                      node, "value", path, "check the value and its unit prefix")
        if spec.dim == "bytes":
            if abs(base - round(base)) > 1e-6 * max(1.0, base):
                self.fail(f"{written} is not a whole number of bytes", node, "value", path)
            base = int(round(base))
        self.sources[path] = ref
        return base

    def unit_scale(self, node: _Map, path: str, spec: Spec) -> float:
        units = UNITS[spec.dim]
        if not units:
            if "unit" in node:
                self.fail(f"wrong unit {excerpt(node['unit'])}: a {spec.dim} takes no unit",
                          node, "unit", path, "drop 'unit:'")
            return 1
        if "unit" not in node:
            self.fail("missing unit", node, "value", path, f"one of: {unit_list(spec.dim)}")
        unit = node["unit"]
        if not isinstance(unit, str) or unit not in units:
            shown = excerpt(unit) if isinstance(unit, str) else f"({_describe(unit)})"
            self.fail(f"wrong unit {shown}: expected {spec.dim}", node, "unit", path,
                      f"one of: {unit_list(spec.dim)}")
        return units[unit]

    def figures(self, node: _Map, table: dict[str, Spec], path: str) -> dict[str, Any]:
        self.known_keys(node, tuple(table), path)
        return {key: self.figure(node, key, f"{path}.{key}", spec) for key, spec in table.items()}

    def count(self, item: _Map, key: str, path: str, low: int, high: int) -> int:
        """A plain whole number inside an entry that has one `source` (an MMA shape)."""
        if key not in item:
            self.fail("missing", item, key, path)
        value = item[key]
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(f"wrong type: expected a whole number, got {_describe(value)}",
                      item, key, path)
        if not low <= value <= high:
            self.fail(f"out of plausible range: {value} is outside [{low}, {high}]",
                      item, key, path)
        return value


# -- sections ----------------------------------------------------------------------------------

def _read_sources(r: _Reader, doc: _Map) -> None:
    node = r.mapping(doc, "sources", "sources", required=False)
    for key, text in (node or {}).items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            r.fail(f"bad source key {excerpt(key)}", node, key, f"sources.{excerpt(key)}",
                   "use letters, digits, '-', '_' and '.'")
        if key in SOURCE_KINDS:
            r.fail(f"'{key}' is reserved for in-place sources", node, key, f"sources.{key}")
        if not isinstance(text, str) or not text.strip():
            r.fail("expected the document's name and URL", node, key, f"sources.{key}")
        r.references[key] = text


def _read_memory(r: _Reader, doc: _Map, order: tuple[str, ...] = LEVELS,
                 fields_of: dict[str, dict[str, Spec]] | None = None,
                 required: tuple[str, ...] = ("registers", "shared", "dram"),
                 ) -> tuple[dict[str, dict], dict[str, str]]:
    """The `memory:` list: its levels (named from `order`, innermost first) with their figures
    in base units, and their labels. GPU levels by default; a cpu profile passes its own."""
    fields_of = LEVEL_FIELDS if fields_of is None else fields_of
    if "memory" not in doc:
        r.fail("missing", doc, "memory", "memory", f"list the levels: {', '.join(order)}")
    items = doc["memory"]
    r.lines["memory"] = doc.key_lines["memory"]
    if not isinstance(items, list) or not items:
        r.fail(f"expected a list of levels, got {_describe(items)}", doc, "memory", "memory")
    levels: dict[str, dict] = {}
    labels: dict[str, str] = {}
    for i, item in enumerate(items):
        if not isinstance(item, _Map):
            r.fail(f"expected a mapping, got {_describe(item)}", doc, "memory", f"memory[{i}]")
        name = r.string(item, "level", f"memory[{i}].level", choices=order)
        path = f"memory[{name}]"
        if name in levels:
            r.fail("listed twice", item, "level", path)
        if levels and order.index(name) < order.index(list(levels)[-1]):
            r.fail("out of order", item, "level", path,
                   f"list levels innermost first: {', '.join(order)}")
        fields = fields_of[name]
        r.known_keys(item, ("level", "label", *fields), path)
        if "label" in item:
            labels[name] = r.string(item, "label", f"{path}.label")
        r.lines[path] = item.line
        levels[name] = {k: r.figure(item, k, f"{path}.{k}", spec) for k, spec in fields.items()}
    for name in required:
        if name not in levels:
            r.fail(f"missing level '{name}'", doc, "memory", "memory",
                   f"list the levels innermost first: {', '.join(order)}")
    return levels, labels


def _read_peaks(r: _Reader, compute: _Map, key: str, required: bool) -> dict[str, float]:
    node = r.mapping(compute, key, f"compute.{key}", required=required)
    if node is None:
        return {}
    r.known_keys(node, DTYPES, f"compute.{key}")
    return {dtype: r.figure(node, dtype, f"compute.{key}.{dtype}", PEAK) for dtype in node}


def _read_mma(r: _Reader, compute: _Map) -> tuple[MmaShape, ...]:
    if "mma" not in compute:
        return ()
    items = compute["mma"]
    if not isinstance(items, list):
        r.fail(f"expected a list of shapes, got {_describe(items)}", compute, "mma",
               "compute.mma")
    shapes = []
    for i, item in enumerate(items):
        path = f"compute.mma[{i}]"
        if not isinstance(item, _Map):
            r.fail(f"expected {{instruction, dtype, m, n, k, source}}, got {_describe(item)}",
                   compute, "mma", path)
        r.known_keys(item, ("instruction", "dtype", "m", "n", "k", "source", "note"), path)
        instruction = r.string(item, "instruction", f"{path}.instruction")
        dtype = r.string(item, "dtype", f"{path}.dtype", choices=DTYPES)
        m, n, k = (r.count(item, d, f"{path}.{d}", *MMA_DIM) for d in "mnk")
        r.sources[path] = r.source(item, path)
        r.lines[path] = item.line
        shapes.append(MmaShape(instruction, dtype, m, n, k))
    return tuple(shapes)


def _read_features(r: _Reader, doc: _Map) -> Features:
    node = r.mapping(doc, "features", "features")
    r.known_keys(node, (*FEATURES, "source"), "features")
    flags = {}
    for name in FEATURES:
        if name not in node:
            r.fail("missing", node, name, f"features.{name}", "say true or false")
        if not isinstance(node[name], bool):
            r.fail(f"wrong type: expected true or false, got {_describe(node[name])}",
                   node, name, f"features.{name}")
        r.lines[f"features.{name}"] = node.key_lines[name]
        flags[name] = node[name]
    r.sources["features"] = r.source(node, "features")
    return Features(**flags)


def read_profile(data: Any, origin: str) -> Profile:
    """A parsed document (from `parse_yaml`) -> a checked `Profile`; `origin` names the file."""
    r = _Reader(origin)
    if not isinstance(data, _Map):
        raise ProfileError(f"expected a mapping of profile fields, got {_describe(data)}", origin,
                           "see docs/hwprofiles.md for the format")
    doc = data
    r.known_keys(doc, TOP_LEVEL, "")
    if "schema" not in doc:
        r.fail("missing", doc, "schema", "schema", f"add 'schema: {SCHEMA_VERSION}' at the top")
    if type(doc["schema"]) is not int or doc["schema"] != SCHEMA_VERSION:
        r.fail(f"unsupported schema version {excerpt(doc['schema'])}", doc, "schema", "schema",
               f"this tilekit reads schema {SCHEMA_VERSION}")
    name = r.string(doc, "name", "name")
    if not _NAME.fullmatch(name):
        r.fail(f"bad name {excerpt(name)}", doc, "name", "name",
               "use letters, digits, '-', '_', '.'")
    vendor = r.string(doc, "vendor", "vendor")
    arch = r.string(doc, "arch", "arch")
    kind = r.string(doc, "kind", "kind", choices=KINDS)
    description = r.string(doc, "description", "description", required=False) or ""
    aliases = doc.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _NAME.fullmatch(a)
                                                for a in aliases):
        r.fail("expected a list of names", doc, "aliases", "aliases",
               "e.g. aliases: [h100-sxm, H100]")
    _read_sources(r, doc)
    other = GPU_SECTIONS if kind == "cpu" else CPU_SECTIONS
    for key in other:
        if key in doc:
            r.fail(f"'{key}' is a section of {'GPU' if kind == 'cpu' else 'cpu'} profiles, "
                   f"this one is kind: {kind}", doc, key, key,
                   "see docs/hwprofiles.md for the sections of each kind")
    common = dict(name=name, vendor=vendor, arch=arch, kind=kind, aliases=tuple(aliases),
                  description=description)
    if kind == "cpu":
        return _read_cpu(r, doc, common)

    par = r.figures(r.mapping(doc, "parallelism", "parallelism"), PARALLELISM, "parallelism")
    regs = r.figures(r.mapping(doc, "registers", "registers"), REGISTERS, "registers")
    levels, labels = _read_memory(r, doc)
    if levels["registers"]["capacity"] != regs["per_sm"] * REGISTER_BYTES:
        raise _locate(ProfileError(
            f"{levels['registers']['capacity']} B is not registers.per_sm x {REGISTER_BYTES} B "
            f"= {regs['per_sm'] * REGISTER_BYTES} B", "memory[registers].capacity",
            "the two figures must agree"), r)

    compute = r.mapping(doc, "compute", "compute")
    r.known_keys(compute, ("clock", "simt", "tensor_core", "mma"), "compute")
    clock = r.figure(compute, "clock", "compute.clock", CLOCK)
    peaks = _read_peaks(r, compute, "simt", required=True)
    tensor_peaks = _read_peaks(r, compute, "tensor_core", required=False)
    mma = _read_mma(r, compute)
    features = _read_features(r, doc)
    ach = r.figures(r.mapping(doc, "achievable", "achievable"), ACHIEVABLE, "achievable")
    exchange = r.mapping(doc, "exchange", "exchange", required=False)
    exch = r.figures(exchange, EXCHANGE, "exchange") if exchange is not None else {}
    launch = r.mapping(doc, "launch", "launch", required=False)
    launch_figs = r.figures(launch, LAUNCH, "launch") if launch is not None else {}

    shared, dram = levels["shared"], levels["dram"]
    l2 = levels.get("l2", {})
    try:
        return Profile(
            name=name, vendor=vendor, arch=arch, kind=kind,
            sm_count=par["sm_count"], warp_size=par["warp_size"],
            max_threads_per_block=par["max_threads_per_block"],
            max_threads_per_sm=par["max_threads_per_sm"],
            max_blocks_per_sm=par["max_blocks_per_sm"],
            max_warps_per_sm=par["max_warps_per_sm"],
            regs_per_sm=regs["per_sm"], regs_per_block=regs["max_per_block"],
            max_regs_per_thread=regs["max_per_thread"],
            smem_per_sm=shared["capacity"], smem_per_block=shared["per_block_optin"],
            smem_per_block_static=shared["per_block_static"],
            smem_bandwidth_per_sm=shared["bandwidth"],
            smem_transaction_bytes=shared["transaction"],
            smem_banks=shared["banks"], smem_bank_bytes=shared["bank_width"],
            l2_bytes=l2.get("capacity") or 0, l2_bandwidth=l2.get("bandwidth"),
            l2_transaction_bytes=l2.get("transaction"),
            dram_bytes=dram["capacity"], dram_bandwidth=dram["bandwidth"],
            transaction_bytes=dram["transaction"], dram_latency=dram.get("latency"),
            exchange_bandwidth=exch.get("bandwidth"),
            launch_overhead=launch_figs.get("overhead"),
            clock_hz=clock, peaks=peaks, tensor_peaks=tensor_peaks, mma_shapes=mma,
            features=features, achievable=Achievable(**ach),
            aliases=tuple(aliases), description=description, labels=labels,
            sources=r.sources, references=r.references, origin=origin,
        )
    except ProfileError as exc:
        raise _locate(exc, r) from None


def _locate(exc: ProfileError, r: _Reader) -> ProfileError:
    """Prefix a consistency error from `Profile` with the file and the line of its field."""
    path = exc.where or ""
    line = r.lines.get(path)
    probe = path
    while line is None:  # fall back to the nearest enclosing section that has a line
        parent = re.sub(r"(\.[^.\[]*|\[[^\]]*\])$", "", probe)
        if parent == probe:
            break
        probe = parent
        line = r.lines.get(probe)
    where = f"{r.origin}:{line}: {path}" if line else f"{r.origin}: {path}"
    return ProfileError(exc.what, where, exc.hint)


# -- kind: cpu ------------------------------------------------------------------------------------

def _read_isa(r: _Reader, simd: _Map) -> str:
    """`simd.isa: {value: avx2, source: ...}`: a choice with a source."""
    path = "simd.isa"
    if "isa" not in simd:
        r.fail("missing", simd, "isa", path, f"add 'isa: {{value: one of {', '.join(ISAS)}, "
                                              "source: ...}}'")
    node = simd["isa"]
    if not isinstance(node, _Map):
        r.fail(f"expected {{value, source}}, got {_describe(node)}", simd, "isa", path,
               f"write isa: {{value: {node if isinstance(node, str) else 'avx2'}, source: ...}}")
    r.known_keys(node, ("value", "source", "note"), path)
    value = r.string(node, "value", path, choices=ISAS)
    r.lines[path] = simd.key_lines["isa"]
    r.sources[path] = r.source(node, path)
    return value


def _cpu_levels(r: _Reader, levels: dict[str, dict], labels: dict[str, str],
                cores: int) -> tuple[CpuLevel, ...]:
    out = []
    for name in CPU_LEVELS[1:]:
        if name not in levels:
            continue
        figs = levels[name]
        path = f"memory[{name}]"
        shared_by = cores if name == "dram" else figs["shared_by"]
        if figs["bandwidth_all"] is None:
            if shared_by > 1:  # located by _read_cpu
                raise ProfileError(
                    "missing: a level shared by several cores states what all cores get "
                    "together", f"{path}.bandwidth_all",
                    "add 'bandwidth_all: {value: ..., unit: GB/s, source: ...}'")
            figs["bandwidth_all"] = figs["bandwidth"] * cores
        level = CpuLevel(name=name, label=labels.get(name, name.upper()),
                         capacity_bytes=figs["capacity"], shared_by=shared_by,
                         line_bytes=figs["line"], bandwidth=figs["bandwidth"],
                         bandwidth_all=figs["bandwidth_all"], latency=figs.get("latency"))
        if f"{path}.bandwidth_all" not in r.sources:
            r.sources[f"{path}.bandwidth_all"] = cpu_model.private_all_source(level, cores)
        out.append(level)
    return tuple(out)


def _read_cpu(r: _Reader, doc: _Map, common: dict[str, Any]) -> Profile:
    """The sections of a `kind: cpu` profile -> a checked Profile (tilekit.hw.cpu)."""
    cores = r.figures(r.mapping(doc, "cores", "cores"), CORES, "cores")
    simd_node = r.mapping(doc, "simd", "simd")
    r.known_keys(simd_node, ("isa", *SIMD), "simd")
    isa = _read_isa(r, simd_node)
    simd = {key: r.figure(simd_node, key, f"simd.{key}", spec) for key, spec in SIMD.items()}
    levels, labels = _read_memory(r, doc, CPU_LEVELS, CPU_LEVEL_FIELDS,
                                  required=("registers", "l1", "l2", "dram"))
    registers = levels["registers"]["capacity"]
    if registers != simd["registers"] * simd["width"]:
        raise _locate(ProfileError(
            f"{registers} B is not simd.registers x simd.width = "
            f"{simd['registers'] * simd['width']} B", "memory[registers].capacity",
            "the two figures must agree (one hardware thread's vector registers)"), r)
    compute = r.mapping(doc, "compute", "compute")
    r.known_keys(compute, ("clock",), "compute")
    clock = r.figure(compute, "clock", "compute.clock", CLOCK)
    parallel = r.figures(r.mapping(doc, "parallel", "parallel"), PARALLEL, "parallel")
    ach = r.figures(r.mapping(doc, "achievable", "achievable"), CPU_ACHIEVABLE, "achievable")
    try:
        cpu = CpuSpec(cores=cores["physical"], threads=cores["threads"], isa=isa,
                      simd_bytes=simd["width"], vector_registers=simd["registers"],
                      fma_units=simd["fma_units"],
                      levels=_cpu_levels(r, levels, labels, cores["physical"]),
                      fork_join_s=parallel["fork_join"])
        cpu_model.check_cpu(cpu)
        sources = _file_order({**r.sources, **cpu_model.peak_sources(cpu, clock)})
        return Profile(**common, **cpu_model.gpu_view(cpu, clock), clock_hz=clock,
                       achievable=Achievable(dram=ach["dram"], compute=ach["compute"],
                                             smem=ach["cache"]),
                       labels=labels, sources=sources, references=r.references,
                       origin=r.origin, cpu=cpu)
    except ProfileError as exc:
        raise _locate(exc, r) from None


def _file_order(sources: dict[str, str]) -> dict[str, str]:
    """Derived figures next to what they come from: a private level's `bandwidth_all` after its
    `bandwidth`, the peaks after `compute.clock` (`tk-hw show` lists sources in this order)."""
    follows = {path: path.replace("bandwidth_all", "bandwidth")
               for path in sources if path.endswith(".bandwidth_all")}
    follows.update({path: "compute.clock" for path in sources
                    if path.startswith(("compute.peak.", "compute.peak_per_core."))})
    ordered: dict[str, str] = {}
    for path, ref in sources.items():
        if path in follows and follows[path] in sources:
            continue
        ordered[path] = ref
        for later, anchor in follows.items():
            if anchor == path:
                ordered[later] = sources[later]
    return ordered
