"""The weld pass: `weld_module(module, profile, ...) -> Module` with kernel groups.

Graph level, Welder's connect-then-fuse: ops are walked in module (topological) order; the
open group takes the next op when that op reads something the group writes (connect), is an
expression op (opaque ops run alone), is not named in `no_fuse`, the group stays within
`max_group` ops, the grown group is one kernel (`tilekit.weld.structure`: stages, levels;
`tilekit.weld.search`: a valid tile) and the grown group's estimate beats the open group
and the op run apart (the gain, from the shared cost model). Otherwise the open group is
closed and the op opens the next one. Groups are runs of consecutive ops, so the kernels
keep the module's order and every kernel reads only what earlier kernels wrote.

A control op (Loop, If, Scan) is a group of its own, and no group crosses a region's boundary:
each region is welded as a module of its own (its captures as inputs), nested regions too,
and its groups are written to the region's `kernels`, which tk-grind prices and codegen
composes into a device loop.

Each group of several ops gets `kernels[i].tile` (`tilekit.ir.payloads.GroupTile`: the
shared output tile, members' regions, edges' levels and bytes, footprint, gain, runners-up)
and `kernels[i].estimate`; an op that fuses nowhere stays a kernel of its own with its
rolled tile and estimate. An unrolled module is rolled first (the stage `roll` is recorded
as tk-roll would).

On a `kind: cpu` profile the groups are the CPU's (`tilekit.weld.cpu`: an op with its
elementwise chain, one CPU kernel; no multi-stage fusion, no group tile).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from tilekit.errors import IRError, TilekitError
from tilekit.ir.control import region_module, walk, with_control
from tilekit.ir.graph import control_records, graph
from tilekit.ir.model import Kernel, Module
from tilekit.ir.payloads import (Candidate, Estimate, GroupEdge, GroupMember, GroupTile, count,
                                 round_sig)
from tilekit.ir.stages import run_stage
from tilekit.roll.problem import ITEMSIZE
from tilekit.weld.attention import FLASH_STEP, match
from tilekit.weld.model import op_estimate, tensor_bytes, unwelded
from tilekit.weld.search import TileChoice, choose
from tilekit.weld.structure import (NotFusible, Structure, shared_buffers, smem_limit,
                                    structure)

STAGE = "weld"
#: Ops a look-ahead for the attention pattern may take beyond the open group.
LOOKAHEAD = 5
#: Ops per group, at most, unless --max-group says otherwise.
DEFAULT_MAX_GROUP = 16


@dataclass(frozen=True)
class Group:
    """A priced group: its structure and its tiles (the chosen one first)."""

    structure: Structure
    choices: tuple[TileChoice, ...]

    @property
    def members(self) -> tuple[int, ...]:
        return self.structure.members

    @property
    def estimate(self) -> Estimate:
        return self.choices[0].estimate


def price(module: Module, members: Sequence[int], profile, top_k: int, limit: int
          ) -> Group | None:
    """The group of `members` priced, or None when it cannot be one kernel."""
    try:
        s = structure(module, members)
        return Group(s, tuple(choose(module, s, profile, top_k, limit)))
    except NotFusible:
        return None


def connect_then_fuse(module: Module, profile, top_k: int = 1,
                      max_group: int = DEFAULT_MAX_GROUP,
                      no_fuse: Sequence[str] = ()) -> list[list[int]]:
    """The groups (op indices), in module order (see the module docstring)."""
    return [members for members, _ in _connect(module, profile, top_k, max_group, no_fuse)]


def _connect(module: Module, profile, top_k: int, max_group: int, no_fuse: Sequence[str]
             ) -> list[tuple[list[int], Group | None]]:
    """The groups with their prices (None for an op alone). A join is priced with `top_k`
    choices: the first, which decides the join, does not depend on `top_k`, and the
    runners-up are the group's payload, so the groups are priced once."""
    g = graph(module)
    limit = smem_limit(profile)
    blocked = set(no_fuse)
    groups: list[tuple[list[int], Group | None]] = []
    open_: list[int] = []
    open_group: Group | None = None
    skip_until = -1       # ops already taken by a look-ahead
    for i, node in enumerate(g.nodes):
        joins = False
        if i <= skip_until:
            continue
        if open_ and node.analysis is not None and len(open_) < max_group \
                and node.name not in blocked \
                and not any(module.ops[k].name in blocked for k in open_) \
                and any(t in node.reads for k in open_ for t in g.nodes[k].writes):
            grown = price(module, open_ + [i], profile, top_k, limit)
            if grown is not None:
                before = (open_group.estimate.time_us if open_group is not None
                          else op_estimate(module, open_[0]).time_us)
                if grown.estimate.time_us < before + op_estimate(module, i).time_us:
                    open_.append(i)
                    open_group = grown
                    joins = True
        if not joins and open_:
            before = (open_group.estimate.time_us if open_group is not None
                      else op_estimate(module, open_[0]).time_us)
            ahead = _attention_ahead(module, open_, i, before, profile, top_k, limit,
                                     max_group, blocked)
            if ahead is not None:
                open_, open_group = ahead.members_list, ahead.group
                skip_until = open_[-1]
                continue
        if not joins:
            if open_:
                groups.append((open_, open_group))
            open_, open_group = [i], None
    if open_:
        groups.append((open_, open_group))
    return groups


@dataclass(frozen=True)
class _Ahead:
    members_list: list[int]
    group: Group


def _attention_ahead(module: Module, open_: list[int], i: int, before: float, profile,
                     top_k: int, limit: int, max_group: int, blocked: set[str]
                     ) -> _Ahead | None:
    """Look-ahead for attention: an op-by-op walk cannot reach it, since the scores with
    only their row max (a fused stage of a plain-loop contraction) do not pay on their own.
    The open group and the next `LOOKAHEAD` ops or fewer are priced as a whole when they
    are the attention pattern (tilekit.weld.attention), and taken when that pays."""
    g = graph(module)
    for n in range(2, LOOKAHEAD + 1):
        members = open_ + list(range(i, i + n))
        if members[-1] >= len(g.nodes) or len(members) > max_group:
            return None
        if any(g.nodes[k].analysis is None or g.nodes[k].name in blocked for k in members):
            return None
        apart = before + sum(op_estimate(module, k).time_us for k in members[len(open_):])
        try:
            s = structure(module, members)
        except NotFusible:
            continue
        if match(module, s) is None:
            continue
        grown = price(module, members, profile, top_k, limit)
        if grown is not None and grown.estimate.time_us < apart:
            return _Ahead(members, grown)
    return None


def weld_module(module: Module, profile, top_k: int = 1, max_group: int = DEFAULT_MAX_GROUP,
                no_fuse: Sequence[str] = (), hardware: str | None = None) -> Module:
    """Group the ops of `module` for `profile` (module docstring); records the stage `weld`
    with its options (and `roll` first when the module had none)."""
    if "import" not in module.stage_names():
        raise IRError("the input has no 'import' stage", "stages",
                      "produce it with tk-import")
    if top_k < 1:
        raise TilekitError(f"top_k must be at least 1, got {top_k}", "--top-k")
    if max_group < 1:
        raise TilekitError(f"max_group must be at least 1, got {max_group}", "--max-group")
    names = {op.name for op in module.ops} | {op.name for _, rec, _ in walk(module)
                                               for region in rec.regions for op in region.ops}
    unknown = sorted(set(no_fuse) - names)
    if unknown:
        raise TilekitError(f"names ops the module does not have: "
                           f"{', '.join(unknown)}", "--no-fuse",
                           "give op names from the IR's ops[].name, separated by commas")
    smem_limit(profile)
    # Tiles rolled for another profile (or none) are rolled again for this one.
    if "roll" not in module.stage_names() \
            or any(op.tile is None for op in module.ops if op.kind != "control") \
            or (hardware is not None and module.hardware != hardware) \
            or module.hardware_sha256 not in (None, profile.content_hash):
        from tilekit.roll.schedule import roll_module
        module = roll_module(module, profile, top_k, hardware=hardware)
    options: dict[str, Any] = {"top_k": top_k, "max_group": max_group}
    if no_fuse:
        options["no_fuse"] = sorted(set(no_fuse))
    if profile.is_cpu:      # an op with its elementwise chain, one CPU kernel (weld.cpu)
        from tilekit.weld.cpu import weld_cpu
        return run_stage(module, STAGE, lambda m: weld_cpu(m, profile, max_group, no_fuse),
                         options)
    out = run_stage(module, STAGE,
                    lambda m: _weld(m, profile, top_k, max_group, no_fuse), options)
    from tilekit.weld.verify import check_groups
    check_groups(out, profile)      # a stage checks what it writes
    return out


def _weld(module: Module, profile, top_k: int, max_group: int, no_fuse) -> Module:
    module = _weld_regions(module, profile, top_k, max_group, no_fuse)
    kernels = []
    for members, group in _connect(module, profile, top_k, max_group, no_fuse):
        first = module.ops[members[0]].name
        names = tuple(module.ops[i].name for i in members)
        if group is None:
            kernels.append(Kernel(f"k_{first}", names,
                                  estimate=op_estimate(module, members[0]).record()))
            continue
        payload = group_tile(module, group)
        kernels.append(Kernel(f"k_{first}", names, tile=payload.record(),
                              estimate=group.estimate.record()))
    return replace(module, kernels=tuple(kernels))


def _weld_regions(module: Module, profile, top_k: int, max_group: int, no_fuse) -> Module:
    """`module` with every control op's regions welded as modules of their own."""
    records = control_records(module)
    if not records:
        return module
    from tilekit.weld.verify import check_groups

    welded = {}
    for name, rec in records.items():
        regions = []
        for region in rec.regions:
            sub = _weld(region_module(module.tensors, region, name), profile, top_k,
                        max_group, no_fuse)
            check_groups(sub, profile)
            regions.append(replace(region, kernels=sub.kernels, control=sub.control))
        welded[name] = rec.with_regions(tuple(regions))
    return with_control(module, welded)


def group_tile(module: Module, group: Group) -> GroupTile:
    """The `kernels[i].tile` payload of a priced group."""
    s = group.structure
    best = group.choices[0]
    g = graph(module)
    last = g.nodes[s.members[-1]].analysis
    main = g.nodes[[i for i, r in zip(s.members, s.roles) if r == "stage"][-1]].analysis
    prop = best.prop
    members = []
    for k, (i, role, stage) in enumerate(zip(s.members, s.roles, s.stage_of)):
        region = prop.lengths(k) if prop is not None else tuple(
            module.tensors[g.nodes[i].writes[0]].shape)
        factor = prop.work[k] / max(1.0, prop.own[k]) if prop is not None else 1.0
        members.append(GroupMember(module.ops[i].name, role, stage, region, factor))
    pos = {name: k for k, name in enumerate(s.names)}
    edges = []
    for e in s.edges:
        region = members[pos[e.producer]].region
        nbytes = ITEMSIZE.get(module.tensors[e.tensor].dtype, 4)
        for x in region:
            nbytes *= x
        full = tensor_bytes(module, e.tensor)
        saved = full * len(e.consumers) + (0 if e.stored else full)
        edges.append(GroupEdge(e.tensor, e.producer, e.consumers, e.level, nbytes, saved,
                               e.stored))
    buffers = best.buffers or (shared_buffers(module, s, prop)
                               if prop is not None and best.flash is None else ())
    before = unwelded(module, s.members)
    step = best.tile.step if s.stages == 1 else ()
    reduction = main.reduction if s.stages == 1 else ()
    tile = replace(best.tile, step=step)
    return GroupTile(
        tile, tuple(a for a, _ in last.spatial), tuple(a for a, _ in reduction),
        tile.grid([e for _, e in last.spatial]), tuple(members), tuple(edges),
        tuple((b.tensor, b.offset, b.nbytes) for b in buffers), best.smem, s.stored,
        prop.recompute if prop is not None else 1.0,
        before.time_us - best.estimate.time_us,
        {"kernels": before.kernels, "time_us": round_sig(before.time_us),
         "dram_bytes": count(before.dram_bytes)},
        tuple(Candidate(replace(c.tile, step=c.tile.step if s.stages == 1 else ()),
                        c.estimate) for c in group.choices[1:]),
        {"key": best.flash.key, "step": FLASH_STEP} if best.flash is not None else None)


__all__ = ["DEFAULT_MAX_GROUP", "Group", "STAGE", "connect_then_fuse", "group_tile", "price",
           "weld_module"]
