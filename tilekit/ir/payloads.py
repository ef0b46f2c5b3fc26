"""Typed stage payloads: the one reader and the one writer of each section a stage adds.

The IR document keeps stage payloads as JSON data (`op.tile`, `kernel.estimate`,
`kernel.launch`, `codegen`), so the codec and the verifier stay generic and a document reads
back byte for byte. Library code never picks those mappings apart by hand: it reads them here,
into small frozen types checked against the op or kernel they belong to (errors located by IR
path, exit 2), and writes them from those types (`record()`), with one rounding rule for every
float (`SIG_DIGITS` significant digits, so that bytes are stable across machines).

| payload | type | written by | read by |
| --- | --- | --- | --- |
| `ops[i].tile` | `OpTile` (a `Tile`, its launch figures, `Estimate`, candidates) | tk-roll | codegen, tiled executor, tk-weld, reports |
| `ops[i].tile` with `target: cpu` | `CpuOpTile` (a CPU kernel, its register and cache tiles, blocks, `Estimate`) | tk-roll with a `kind: cpu` profile | CPU codegen, tk-weld, reports |
| `kernels[i].tile` | `GroupTile`: a `Tile` over the group's last op, members' regions, edges' levels, footprint, runner-ups | tk-weld | codegen (levels, fused shape), tiled executor, reports |
| `kernels[i].estimate`, `ops[i].tile.estimate` | `Estimate` | tk-roll, tk-weld | reports, tk-ram |
| `kernels[i].launch` | `Launch` | tk-codegen | reports |
| `codegen` | `CodegenSection` of `KernelRecord`s | tk-codegen | the CUDA runtime, the emulator |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from tilekit.errors import IRError
from tilekit.ir.keys import (read_choice, read_int, read_list, read_mapping, read_number,
                             read_text)

#: Significant digits of every float written to the IR.
SIG_DIGITS = 4
#: CUDA's limit on threads per block (every NVIDIA architecture since sm_20).
MAX_THREADS = 1024
#: What an estimate may say bounds the time ("cache": a CPU's L2 or L3, tilekit.roll.cpu_cost).
BOUNDS = ("compute", "smem", "dram", "launch", "latency", "cache")
#: The marker of an op tile rolled for a CPU profile (`target: cpu`): a `CpuOpTile`, which
#: no GPU reader takes (`read_tile` refuses it).
CPU_TARGET = "cpu"
#: The kernels a CPU op tile names (tilekit.schedule.cpu; opaque ops: their implementation;
#: `by size`: decided at each size of a symbolic module, tilekit.roll.dynamic).
CPU_BY_SIZE = "by size"
CPU_KERNELS = ("cpu_gemm", "cpu_loops", "opaque", CPU_BY_SIZE)

Axes = Sequence[tuple[str, int]]    # (axis name, extent), in order

#: The hint of a malformed group tile (tk-weld's payload).
_WELD = "re-run tk-weld"


def _str(value: Any, where: str) -> str:
    return read_text(value, where, _WELD)


def _float(value: Any, where: str) -> float:
    return read_number(value, where, hint=_WELD)


def _choice(value: Any, choices: Sequence[str], where: str) -> str:
    return read_choice(value, choices, where, _WELD)


def round_sig(x: float, digits: int = SIG_DIGITS) -> float:
    """`x` rounded to `digits` significant digits (0 stays 0)."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return 0.0 if x == 0 else x
    return float(f"{x:.{digits}g}")


def count(x: float) -> int | float:
    """Counts stay exact integers while they are small enough to be stable, else 4 digits."""
    x = float(x)
    if x.is_integer() and abs(x) < 2**53:
        return int(round_sig(x)) if abs(x) >= 1e4 else int(x)
    return round_sig(x)


# -- tiles ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tile:
    """Block and thread sizes per spatial axis and a step per reduction axis, in axis order.

    `source` says who chose it: "roll" (an op's tile), "weld" (a kernel group's tile),
    "default" (codegen's default schedule)."""

    block: tuple[int, ...]
    thread: tuple[int, ...]
    step: tuple[int, ...]
    source: str = "roll"

    @property
    def threads(self) -> int:
        return math.prod(b // t for b, t in zip(self.block, self.thread))

    def grid(self, extents: Sequence[int]) -> tuple[int, ...]:
        return tuple(-(-n // b) for n, b in zip(extents, self.block))

    def describe(self, spatial: Sequence[str], reduction: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source,
                               "block": dict(zip(spatial, self.block)),
                               "thread": dict(zip(spatial, self.thread))}
        if reduction:
            out["step"] = dict(zip(reduction, self.step))
        return out

    def sizes(self, spatial: Sequence[str], reduction: Sequence[str]) -> dict[str, Any]:
        """The `block`/`thread`/`step` mappings of the IR."""
        return {"block": dict(zip(spatial, self.block)),
                "thread": dict(zip(spatial, self.thread)),
                "step": dict(zip(reduction, self.step))}


def _axis_sizes(payload: Mapping[str, Any], key: str, axes: Sequence[str], where: str,
                default: int | None) -> tuple[int, ...]:
    table = payload.get(key)
    if table is None:
        table = {}
    if not isinstance(table, Mapping):
        raise IRError(f"'{key}' must be a mapping of axis to size", f"{where}.{key}",
                      "re-run the stage that wrote it")
    unknown = sorted(set(table) - set(axes))
    if unknown:
        kind = "reduction" if key == "step" else "spatial"
        raise IRError(f"names axes {unknown} which are not {kind} axes of the op "
                      f"(have: {', '.join(axes) or 'none'})", f"{where}.{key}",
                      "re-run the stage that wrote it")
    out = []
    for a in axes:
        value = table.get(a, default)
        if value is None:
            raise IRError(f"axis '{a}' has no size", f"{where}.{key}",
                          "a tile lists every spatial axis in block and every reduction axis "
                          "in step")
        if type(value) is not int or value < 1:
            raise IRError(f"size of axis '{a}' must be a positive integer, got {value!r}",
                          f"{where}.{key}.{a}")
        out.append(value)
    return tuple(out)


def read_tile(payload: Any, spatial: Axes, reduction: Axes, where: str,
              source: str = "roll", rename: Sequence[str] | None = None,
              require_step: bool = True, unclamped: Collection[str] = ()) -> Tile | None:
    """The one tile checker: `payload` as a `Tile` of an op with these axes, or None.

    Rules (each broken one is an IRError located at the field to fix): `block` lists every
    spatial axis and `step` every reduction axis, sizes positive integers; `thread` (default
    1) divides `block`; `grid`, when given, is `ceil(extent / block)` on every axis (so the
    blocks compute every output point once), `blocks` and `threads` when given are the
    products of the grid and of block/thread; a block has at most `MAX_THREADS` threads.
    Steps larger than their extent are clamped (one step covers the axis), but on the
    reduction axes `unclamped` (whose extents vary with a symbol: the code of every size
    keeps the tile's step, guarded).

    `rename` gives the payload's spatial axis names by position (a kernel tile is written
    over the group's last op, whose axes may be named differently from the stage reading
    it). Without `require_step`, a missing step means the whole extent.
    """
    if payload is None:
        return None
    refuse_cpu_tile(payload, where)
    payload = dict(read_mapping(payload, where, "a tile"))
    names = tuple(a for a, _ in spatial)
    if rename:
        to_stage = dict(zip(rename, names))
        for key in ("block", "thread", "grid"):
            if isinstance(payload.get(key), Mapping):
                payload[key] = {to_stage.get(k, k): v for k, v in payload[key].items()}
    block = _axis_sizes(payload, "block", names, where, None)
    thread = _axis_sizes(payload, "thread", names, where, 1)
    rnames = tuple(a for a, _ in reduction)
    step = _axis_sizes(payload, "step", rnames, where,
                       None if require_step else 1 << 30) if rnames else ()
    for a, b, t in zip(names, block, thread):
        if b % t:
            raise IRError(f"block size {b} of axis '{a}' is not a multiple of its thread "
                          f"size {t}", f"{where}.thread.{a}", "re-run the stage that wrote it")
    tile = Tile(block, thread, tuple(s if a in unclamped else min(s, e)
                                     for s, (a, e) in zip(step, reduction)), source)
    _check_grid(payload, tile, spatial, where)
    if tile.threads > MAX_THREADS:
        raise IRError(f"the tile needs {tile.threads} threads per block, more than "
                      f"{MAX_THREADS}", f"{where}.block", "re-run the stage that wrote it")
    return tile


def _check_grid(payload: Mapping[str, Any], tile: Tile, spatial: Axes, where: str) -> None:
    grid = payload.get("grid")
    extents = [e for _, e in spatial]
    want = tile.grid(extents)
    if grid is not None:
        grid = read_mapping(grid, f"{where}.grid", "'grid'")
        for (a, extent), b, g in zip(spatial, tile.block, want):
            if a not in grid:
                raise IRError(f"axis '{a}' has no grid size", f"{where}.grid",
                              "re-run the stage that wrote it")
            if grid[a] != g:
                raise IRError(f"grid {grid[a]!r} of axis '{a}' does not match "
                              f"ceil({extent} / block {b}) = {g}", f"{where}.grid.{a}",
                              "the blocks must compute every output point exactly once; "
                              "re-run the stage that wrote it")
    if "blocks" in payload and payload["blocks"] != math.prod(want):
        raise IRError(f"'blocks' is {payload['blocks']!r}, the grid has {math.prod(want)}",
                      f"{where}.blocks", "re-run the stage that wrote it")
    if "threads" in payload and payload["threads"] != tile.threads:
        raise IRError(f"'threads' is {payload['threads']!r}, block / thread gives "
                      f"{tile.threads}", f"{where}.threads", "re-run the stage that wrote it")


# -- CPU tiles -------------------------------------------------------------------------------

def is_cpu_tile(payload: Any) -> bool:
    """An op tile tk-roll wrote for a `kind: cpu` profile (`target: cpu`)."""
    return isinstance(payload, Mapping) and payload.get("target") == CPU_TARGET


def cpu_rolled(module) -> bool:
    """Some op of `module` (in a control op's region too) carries a CPU tile: the module
    was rolled for a `kind: cpu` profile."""
    from tilekit.ir.control import walk

    return any(is_cpu_tile(op.tile) for op in module.ops) or any(
        is_cpu_tile(op.tile) for _, rec, _ in walk(module) for region in rec.regions
        for op in region.ops)


def refuse_cpu_tile(payload: Any, where: str) -> None:
    """A GPU reader's check: a CPU op tile has no GPU block, thread or step to read."""
    if is_cpu_tile(payload):
        raise IRError("is a CPU schedule (target: cpu, rolled for a CPU profile), not a GPU "
                      "tile", where, "re-run tk-roll with a GPU profile (--hw), or generate "
                      "for the CPU: tk-codegen --target cpu")


@dataclass(frozen=True)
class CpuOpTile:
    """`ops[i].tile` as tk-roll writes it for a `kind: cpu` profile (docs/roll.md, "CPU
    profiles"): the CPU kernel (`kernel`: its shape and blocks, as
    `tilekit.schedule.cpu.CpuShape.record` writes it), the register micro-tile and cache
    tiles it was derived from (expression ops), its parallel blocks and its estimate."""

    machine: str
    kernel: Mapping[str, Any]
    blocks: int
    estimate: Estimate
    micro: tuple[int, int] | None = None
    cache: Mapping[str, int] | None = None

    @property
    def shape(self) -> str:
        return self.kernel["shape"]

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": CPU_TARGET, "machine": self.machine}
        if self.micro is not None:
            out["micro"] = list(self.micro)
            out["cache"] = {k: int(self.cache[k]) for k in ("mc", "nc", "kc")}
        out.update({"kernel": dict(self.kernel), "blocks": int(self.blocks), "threads": 1,
                    "estimate": self.estimate.record()})
        return out

    @staticmethod
    def read(payload: Any, where: str, expression: bool = True) -> "CpuOpTile":
        """The form (the sizes against the op: tilekit.schedule.cpu.cpu_shape); an
        expression op's tile has `micro` and `cache`."""
        p = read_mapping(payload, where, "a CPU tile")
        hint = "re-run tk-roll with a CPU profile"
        kernel = read_mapping(p.get("kernel"), f"{where}.kernel", "'kernel'")
        shape = read_choice(kernel.get("shape"), CPU_KERNELS, f"{where}.kernel.shape", hint)
        if (shape == "opaque") == expression:
            raise IRError(f"an {'expression' if expression else 'opaque'} op's CPU kernel "
                          f"cannot be '{shape}'", f"{where}.kernel.shape", hint)
        micro = cache = None
        if expression:
            m = read_list(p.get("micro"), f"{where}.micro", "'micro'", hint)
            if len(m) != 2:
                raise IRError(f"'micro' is [mr, nr], got {m!r}", f"{where}.micro", hint)
            micro = (read_int(m[0], f"{where}.micro[0]", 1, hint=hint),
                     read_int(m[1], f"{where}.micro[1]", 1, hint=hint))
            c = read_mapping(p.get("cache"), f"{where}.cache", "'cache'")
            cache = {k: read_int(c.get(k), f"{where}.cache.{k}", 1, hint=hint)
                     for k in ("mc", "nc", "kc")}
        return CpuOpTile(read_text(p.get("machine"), f"{where}.machine", hint), dict(kernel),
                         read_int(p.get("blocks"), f"{where}.blocks", 1, hint=hint),
                         Estimate.read(p.get("estimate"), f"{where}.estimate"), micro, cache)


# -- estimates -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """What the cost model says of one kernel (or op, or candidate tile)."""

    time_us: float
    flops: float
    dram_bytes: float
    smem_bytes: float
    bound: str
    waves: int
    wave_efficiency: float
    #: Of `time_us`, the staging loads' round trips that nothing overlaps (staged kernels:
    #: tilekit.roll.cost's latency term); added on top of the other terms, so a kernel that
    #: fuses more work keeps it.
    latency_us: float = 0.0

    def record(self) -> dict[str, Any]:
        """JSON-like, floats to `SIG_DIGITS` significant digits, counts as ints."""
        out = {"time_us": round_sig(self.time_us), "flops": count(self.flops),
               "dram_bytes": count(self.dram_bytes), "smem_bytes": count(self.smem_bytes),
               "bound": self.bound, "waves": int(self.waves),
               "wave_efficiency": round_sig(self.wave_efficiency)}
        if self.latency_us:
            out["latency_us"] = round_sig(self.latency_us)
        return out

    # The cost model's historical name for record().
    as_dict = record

    @staticmethod
    def read(payload: Any, where: str) -> "Estimate":
        p = read_mapping(payload, where, "an estimate")
        hint = "re-run tk-roll (or the stage that wrote the estimate)"

        def number(key: str, default: float | None = None) -> float:
            value = p.get(key, default)
            if value is None:
                if default is None:
                    raise IRError(f"an estimate needs the number '{key}'", f"{where}.{key}",
                                  hint)
                value = default
            return read_number(value, f"{where}.{key}", 0, hint)

        waves = p.get("waves")
        return Estimate(time_us=number("time_us"), flops=number("flops"),
                        dram_bytes=number("dram_bytes"), smem_bytes=number("smem_bytes", 0.0),
                        bound=read_choice(p.get("bound", "compute"), BOUNDS, f"{where}.bound",
                                          hint),
                        waves=(read_int(waves, f"{where}.waves", hint=hint) or 1)
                        if waves is not None else 1,
                        wave_efficiency=number("wave_efficiency", 1.0) or 1.0,
                        latency_us=number("latency_us", 0.0))


# -- an op's rolled tile ------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    tile: Tile
    estimate: Estimate


@dataclass(frozen=True)
class OpTile:
    """`ops[i].tile` as tk-roll writes it (docs/roll.md): the chosen tile with its launch
    figures and estimate, and the runners-up."""

    tile: Tile
    spatial: tuple[str, ...]
    reduction: tuple[str, ...]
    grid: tuple[int, ...]
    smem_bytes: int
    regs: int
    estimate: Estimate
    candidates: tuple[Candidate, ...] = ()
    #: The kernel this tile becomes (tilekit.schedule.shape.KernelShape.record()): what the
    #: cost model priced and what codegen generates.
    kernel: Mapping[str, Any] | None = None
    #: When tk-roll kept the default schedule (its estimate, `estimate`, beat every tile's):
    #: the best tile's estimate; `kernel` is then the default shape and `tile` the best tile.
    rolled_estimate: Estimate | None = None
    #: split-K slices of a contraction's reduction (1: none; tilekit.schedule.mma.split_steps)
    split_k: int = 1

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    def record(self) -> dict[str, Any]:
        out = self.tile.sizes(self.spatial, self.reduction)
        out.update({"grid": dict(zip(self.spatial, self.grid)), "blocks": self.blocks,
                    "threads": self.tile.threads, "smem_bytes": int(self.smem_bytes),
                    "regs": int(self.regs)})
        if self.split_k > 1:
            out["split_k"] = int(self.split_k)
        if self.kernel is not None:
            out["kernel"] = dict(self.kernel)
        out["estimate"] = self.estimate.record()
        if self.rolled_estimate is not None:
            out["rolled_estimate"] = self.rolled_estimate.record()
        out.update({"candidates": [{**c.tile.sizes(self.spatial, self.reduction),
                                    "estimate": c.estimate.record()}
                                   for c in self.candidates]})
        return out

    @staticmethod
    def read(payload: Any, spatial: Axes, reduction: Axes, where: str) -> "OpTile":
        p = read_mapping(payload, where, "a tile")
        tile = read_tile(p, spatial, reduction, where)
        cands = p.get("candidates") or []
        if not isinstance(cands, list):
            raise IRError("'candidates' must be a list", f"{where}.candidates")
        candidates = tuple(
            Candidate(read_tile(c, spatial, reduction, f"{where}.candidates[{k}]"),
                      Estimate.read(read_mapping(c, f"{where}.candidates[{k}]", "a candidate")
                                    .get("estimate"), f"{where}.candidates[{k}].estimate"))
            for k, c in enumerate(cands))
        return OpTile(tile, tuple(a for a, _ in spatial), tuple(a for a, _ in reduction),
                      tile.grid([e for _, e in spatial]),
                      read_int(p.get("smem_bytes", 0), f"{where}.smem_bytes"),
                      read_int(p.get("regs", 0), f"{where}.regs"),
                      Estimate.read(p.get("estimate"), f"{where}.estimate"), candidates,
                      dict(p["kernel"]) if isinstance(p.get("kernel"), Mapping) else None,
                      Estimate.read(p["rolled_estimate"], f"{where}.rolled_estimate")
                      if p.get("rolled_estimate") is not None else None,
                      read_split_k(p, where))


def is_split(tile: Any) -> bool:
    """An op's tile payload splits its reduction (`split_k` above 1): its partial sums and
    per-tile counters are a kernel's own, so it does not compose into a persistent kernel."""
    return isinstance(tile, Mapping) and tile.get("split_k", 1) != 1


def read_split_k(payload: Mapping[str, Any], where: str) -> int:
    """An op tile's `split_k` (1 when absent): a positive integer."""
    value = read_int(payload.get("split_k", 1), f"{where}.split_k")
    if value < 1:
        raise IRError(f"split_k must be at least 1, got {value}", f"{where}.split_k",
                      "re-run tk-roll")
    return value


# -- a weld group's tile ------------------------------------------------------------------

#: Memory levels of a group's edges, nearest first.
EDGE_LEVELS = ("register", "shared", "global")
#: How a member runs in its group's kernel.
MEMBER_ROLES = ("stage", "chain", "inline")


@dataclass(frozen=True)
class GroupMember:
    """One op of a welded group: its role, stage and propagated region (lengths per output
    dimension for one block) and the work the blocks do over its own (recompute)."""

    op: str
    role: str
    stage: int
    region: tuple[int, ...]
    recompute: float

    def record(self) -> dict[str, Any]:
        return {"op": self.op, "role": self.role, "stage": self.stage,
                "region": list(self.region), "recompute": round_sig(self.recompute)}


@dataclass(frozen=True)
class GroupEdge:
    """A tensor one member writes and others read: its level, the bytes a block holds of it
    there, the DRAM bytes the level saves, and whether it is also stored to global memory."""

    tensor: str
    producer: str
    consumers: tuple[str, ...]
    level: str
    bytes: int
    dram_saved: int
    stored: bool

    def record(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "from": self.producer, "to": list(self.consumers),
                "level": self.level, "bytes": count(self.bytes),
                "dram_saved": count(self.dram_saved), "stored": self.stored}


@dataclass(frozen=True)
class GroupTile:
    """`kernels[i].tile` as tk-weld writes it (docs/weld.md): the shared output tile over the
    group's last op (`block`/`thread`, `step` over the last stage's reduction axes), its grid,
    every member, every edge with its level, the shared-memory footprint with liveness
    (`buffers`: offsets), the results stored to global memory, the gain over the unwelded
    kernels and the runners-up."""

    tile: Tile
    spatial: tuple[str, ...]
    reduction: tuple[str, ...]
    grid: tuple[int, ...]
    members: tuple[GroupMember, ...]
    edges: tuple[GroupEdge, ...]
    buffers: tuple[tuple[str, int, int], ...]     # (tensor, offset, bytes)
    smem_bytes: int
    stored: tuple[str, ...]
    recompute: float
    gain_us: float
    unwelded: Mapping[str, Any]
    candidates: tuple[Candidate, ...] = ()
    #: The flash form of an attention group: {"key": axis, "step": keys per step}.
    flash: Mapping[str, Any] | None = None

    @property
    def levels(self) -> dict[str, str]:
        return {e.tensor: e.level for e in self.edges}

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": "weld"}
        out.update(self.tile.sizes(self.spatial, self.reduction))
        if not self.reduction:
            out.pop("step")
        out.update({
            "grid": dict(zip(self.spatial, self.grid)), "blocks": math.prod(self.grid),
            "threads": self.tile.threads, "stages": 1 + max(m.stage for m in self.members),
            "members": [m.record() for m in self.members],
            "edges": [e.record() for e in self.edges],
            "buffers": [{"tensor": t, "offset": o, "bytes": b} for t, o, b in self.buffers],
            "smem_bytes": int(self.smem_bytes), "stored": list(self.stored),
            "recompute": round_sig(self.recompute), "gain_us": round_sig(self.gain_us),
            "unwelded": dict(self.unwelded),
            "candidates": [{**c.tile.sizes(self.spatial, self.reduction),
                            "estimate": c.estimate.record()} for c in self.candidates]})
        for c in out["candidates"]:
            if not self.reduction:
                c.pop("step")
        if self.flash is not None:
            out["flash"] = dict(self.flash)
        return out

    @staticmethod
    def read(payload: Any, spatial: Axes, reduction: Axes, where: str) -> "GroupTile":
        """Read and check the form (the weld verifier, tilekit.weld.verify, checks it against
        the module: members, regions, levels, footprint)."""
        p = read_mapping(payload, where, "a group tile")
        if p.get("source") != "weld":
            raise IRError(f"a group tile has source 'weld', got {p.get('source')!r}",
                          f"{where}.source", "re-run tk-weld")
        tile = read_tile(p, spatial, reduction, where, "weld", require_step=False)
        members = tuple(_member(m, f"{where}.members[{k}]")
                        for k, m in enumerate(_list(p, "members", where)))
        edges = tuple(_edge(e, f"{where}.edges[{k}]")
                      for k, e in enumerate(_list(p, "edges", where)))
        buffers = []
        for k, b in enumerate(_list(p, "buffers", where, required=False)):
            w = f"{where}.buffers[{k}]"
            b = read_mapping(b, w, "a buffer")
            buffers.append((_str(b.get("tensor"), f"{w}.tensor"), read_int(b.get("offset"), f"{w}.offset"),
                            read_int(b.get("bytes"), f"{w}.bytes")))
        cands = tuple(
            Candidate(read_tile(c, spatial, reduction, f"{where}.candidates[{k}]", "weld",
                                require_step=False),
                      Estimate.read(read_mapping(c, f"{where}.candidates[{k}]", "a candidate")
                                    .get("estimate"), f"{where}.candidates[{k}].estimate"))
            for k, c in enumerate(_list(p, "candidates", where, required=False)))
        stored = tuple(_str(t, f"{where}.stored[{k}]")
                       for k, t in enumerate(_list(p, "stored", where, required=False)))
        return GroupTile(tile, tuple(a for a, _ in spatial), tuple(a for a, _ in reduction),
                         tile.grid([e for _, e in spatial]), members, edges, tuple(buffers),
                         read_int(p.get("smem_bytes", 0), f"{where}.smem_bytes"), stored,
                         _float(p.get("recompute", 1.0), f"{where}.recompute"),
                         _float(p.get("gain_us", 0.0), f"{where}.gain_us"),
                         dict(read_mapping(p.get("unwelded", {}), f"{where}.unwelded",
                                       "'unwelded'")), cands, _flash(p.get("flash"), where))


def _flash(value: Any, where: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    f = read_mapping(value, f"{where}.flash", "'flash'")
    return {"key": _str(f.get("key"), f"{where}.flash.key"),
            "step": read_int(f.get("step"), f"{where}.flash.step", 1)}


def _list(p: Mapping[str, Any], key: str, where: str, required: bool = True) -> list:
    value = p.get(key)
    if value is None and not required:
        return []
    return read_list(value, f"{where}.{key}", f"'{key}'", _WELD)


def _member(m: Any, where: str) -> GroupMember:
    m = read_mapping(m, where, "a member")
    region = m.get("region")
    if not isinstance(region, list) or any(type(x) is not int or x < 1 for x in region):
        raise IRError(f"'region' must be a list of positive integers, got {region!r}",
                      f"{where}.region", "re-run tk-weld")
    return GroupMember(_str(m.get("op"), f"{where}.op"),
                       _choice(m.get("role"), MEMBER_ROLES, f"{where}.role"),
                       read_int(m.get("stage"), f"{where}.stage"), tuple(region),
                       _float(m.get("recompute", 1.0), f"{where}.recompute"))


def _edge(e: Any, where: str) -> GroupEdge:
    e = read_mapping(e, where, "an edge")
    to = e.get("to")
    if not isinstance(to, list) or not to:
        raise IRError("'to' must list the ops reading the edge", f"{where}.to",
                      "re-run tk-weld")
    return GroupEdge(_str(e.get("tensor"), f"{where}.tensor"), _str(e.get("from"), f"{where}.from"),
                     tuple(_str(t, f"{where}.to[{k}]") for k, t in enumerate(to)),
                     _choice(e.get("level"), EDGE_LEVELS, f"{where}.level"),
                     read_int(e.get("bytes", 0), f"{where}.bytes"),
                     read_int(e.get("dram_saved", 0), f"{where}.dram_saved"),
                     bool(e.get("stored", False)))


# -- codegen ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    """`kernels[i].launch`: how a kernel group runs (one kernel, or several when split)."""

    entries: tuple[str, ...]
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    smem_bytes: int | None = None
    shape: str | None = None
    split: str | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entries": list(self.entries)}
        if self.grid is not None:
            out.update(grid=list(self.grid), block=list(self.block),
                       smem_bytes=int(self.smem_bytes or 0), shape=self.shape)
        if self.split:
            out["split"] = self.split
        return out


@dataclass(frozen=True)
class KernelRecord:
    """One entry of `codegen.kernels`: a generated kernel and how to launch it."""

    name: str
    group: str
    entry: str
    ops: tuple[str, ...]
    shape: str
    schedule: Mapping[str, Any]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int                 # dynamic shared memory at launch
    args: tuple[str, ...]           # tensors in parameter order
    writes: tuple[str, ...]
    source: str                     # the whole file: preamble, then body
    uses_half: bool = False         # the preamble defines TK_USE_HALF
    resources: Mapping[str, int] | None = None   # ptxas, with --compile
    # Every block of the grid must be resident at once (its blocks wait on each other: a
    # persistent program, a device loop): the launcher checks the driver's occupancy first
    # and launches cooperatively; the emulation runs the blocks concurrently.
    coresident: bool = False
    # Words (uint32) of a workspace passed after `args`, zeroed before every launch: the
    # per-operator progress counters of a tk-ram program (docs/ram.md).
    counters: int = 0
    # TMA descriptors passed by value after those (sm_90): per descriptor its tensor, dtype,
    # dimensions innermost first, byte strides of the outer ones, box and swizzle; the host
    # encodes them before the launch (docs/codegen.md, "The Hopper kernel").
    tensor_maps: tuple[Mapping[str, Any], ...] = ()
    # Buffers among `args` that are no tensor of the module: name -> float32 elements (a
    # split-K group's partial sums, written by its first kernel and read by its second).
    scratch: Mapping[str, int] = field(default_factory=dict)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def record(self) -> dict[str, Any]:
        out = {"name": self.name, "group": self.group, "entry": self.entry,
               "ops": list(self.ops), "shape": self.shape, "schedule": dict(self.schedule),
               "grid": list(self.grid), "block": list(self.block),
               "smem_bytes": int(self.smem_bytes), "args": list(self.args),
               "writes": list(self.writes), "uses_half": bool(self.uses_half),
               "source": self.source}
        if self.resources is not None:
            out["resources"] = dict(self.resources)
        if self.coresident:
            out["coresident"] = True
        if self.counters:
            out["workspace"] = {"counters": int(self.counters)}
        if self.tensor_maps:
            out["tensor_maps"] = [dict(m) for m in self.tensor_maps]
        if self.scratch:
            out["scratch"] = {k: int(v) for k, v in self.scratch.items()}
        return out

    @staticmethod
    def read(payload: Any, where: str) -> "KernelRecord":
        p = read_mapping(payload, where, "a codegen kernel")
        try:
            return KernelRecord(
                name=str(p["name"]), group=str(p.get("group", p["name"])),
                entry=str(p["entry"]), ops=tuple(p.get("ops", ())), shape=str(p["shape"]),
                schedule=dict(p.get("schedule") or {}), grid=_dim3(p["grid"]),
                block=_dim3(p["block"]), smem_bytes=read_int(p["smem_bytes"],
                                                         f"{where}.smem_bytes"),
                args=tuple(p["args"]), writes=tuple(p.get("writes", ())),
                source=str(p["source"]), uses_half=bool(p.get("uses_half", False)),
                resources=dict(p["resources"]) if p.get("resources") else None,
                coresident=bool(p.get("coresident", False)),
                counters=read_int((p.get("workspace") or {}).get("counters", 0),
                              f"{where}.workspace.counters"),
                tensor_maps=_tensor_maps(p.get("tensor_maps") or (), where),
                scratch={str(k): read_int(v, f"{where}.scratch.{k}")
                         for k, v in (p.get("scratch") or {}).items()})
        except KeyError as exc:
            raise IRError(f"a codegen kernel needs '{exc.args[0]}'", where,
                          "re-run tk-codegen") from None
        except (TypeError, ValueError) as exc:
            raise IRError(f"malformed codegen kernel ({exc})", where,
                          "re-run tk-codegen") from None


def _tensor_maps(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    """A kernel's `tensor_maps`: each names a tensor of its `args` (checked by the caller
    against a fresh generation, tilekit.codegen.recorded) with integer lists."""
    out = []
    for k, m in enumerate(value):
        m = read_mapping(m, f"{where}.tensor_maps[{k}]", "a tensor map")
        out.append({"name": str(m["name"]), "tensor": str(m["tensor"]),
                    "dtype": str(m["dtype"]), "dims": [int(x) for x in m["dims"]],
                    "strides": [int(x) for x in m["strides"]],
                    "box": [int(x) for x in m["box"]], "swizzle": int(m["swizzle"])})
    return tuple(out)


def _dim3(value: Any) -> tuple[int, int, int]:
    dims = tuple(int(v) for v in value)
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"a launch dimension is 3 positive integers, got {list(value)}")
    return dims  # type: ignore[return-value]


@dataclass(frozen=True)
class CodegenSection:
    """The module's `codegen` section."""

    arch: str
    helpers: Mapping[str, str]                # {file, sha256} of runtime.cuh
    kernels: tuple[KernelRecord, ...]
    notes: tuple[str, ...] = ()
    compiled: Mapping[str, str] | None = None  # {arch, nvcc, flags}, with --compile
    extra: Mapping[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"arch": self.arch, "helpers": dict(self.helpers),
                               "kernels": [k.record() for k in self.kernels]}
        if self.notes:
            out["notes"] = list(self.notes)
        if self.compiled is not None:
            out["compiled"] = dict(self.compiled)
        out.update(self.extra)
        return out

    @staticmethod
    def read(payload: Any, where: str = "codegen") -> "CodegenSection":
        p = read_mapping(payload, where, "the codegen section")
        kernels = p.get("kernels")
        if not isinstance(kernels, list) or not kernels:
            raise IRError("the codegen section lists no kernels", f"{where}.kernels",
                          "re-run tk-codegen")
        known = {"arch", "helpers", "kernels", "notes", "compiled"}
        return CodegenSection(
            arch=str(p.get("arch", "")), helpers=dict(p.get("helpers") or {}),
            kernels=tuple(KernelRecord.read(k, f"{where}.kernels[{i}]")
                          for i, k in enumerate(kernels)),
            notes=tuple(p.get("notes") or ()), compiled=p.get("compiled"),
            extra={k: v for k, v in p.items() if k not in known})


# -- every payload's form, on reading a document ---------------------------------------------

def welded(kernel) -> bool:
    """The kernel group carries tk-weld's tile (`kernels[i].tile` with source "weld")."""
    return isinstance(kernel.tile, Mapping) and kernel.tile.get("source") == "weld"


def read_group_tile(payload: Any, analyses: Sequence[Any], where: str) -> GroupTile:
    """A group's `kernels[].tile` over its members' analyses (module order): the tile over
    the last member's spatial axes, its step over the last reducing member's reduction."""
    mains = [a for a in analyses if a.reduction]
    reduction = mains[-1].reduction if mains and isinstance(payload, Mapping) and \
        "step" in payload else ()
    return GroupTile.read(payload, analyses[-1].spatial, reduction, where)
