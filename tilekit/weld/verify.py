"""The weld verifier: every group a module records (`kernels[i].tile` with source "weld")
checked against the module, so that codegen, the tiled executor and tk-weld itself act only
on groups that are one kernel as recorded.

Rules (each broken one is an IRError located at the field to fix, exit 2):

- the payload's form (`tilekit.ir.payloads.GroupTile.read`: the tile over the last op's
  axes, members, edges, levels, numbers);
- its members are the kernel's ops, in order, a run of consecutive ops, expression ops only;
- the stages, roles, edge levels and stored tensors are the ones the group's structure gives
  (`tilekit.weld.structure`): a register edge must be produced and consumed by the same
  thread, a shared edge must not be read by the op that writes it;
- every member's region covers what its readers need (the propagation from the block tile);
- every result stored for readers outside the group is computed everywhere by the blocks;
- the shared buffers fit the profile's shared memory per block, and the profile has some.
"""

from __future__ import annotations

import math

from tilekit.errors import IRError
from tilekit.ir.graph import graph
from tilekit.ir.model import Module
from tilekit.ir.payloads import GroupTile, read_group_tile, welded
from tilekit.weld.structure import (NotFusible, covers, footprint, propagate, shared_buffers,
                                    smem_limit, structure)


def check_groups(module: Module, profile=None) -> None:
    """Check every welded group of `module` (see the module docstring); `profile` adds the
    shared-memory limit."""
    limit = None
    if profile is not None and any(welded(k) for k in module.kernels):
        limit = smem_limit(profile)
    index = module.op_index()
    for n, kernel in enumerate(module.kernels):
        if welded(kernel):
            check_group(module, n, index, limit)


def check_group(module: Module, n: int, index, limit: int | None) -> GroupTile:
    kernel = module.kernels[n]
    where = f"kernels[{n}] ({kernel.name}).tile"
    members = [index[o] for o in kernel.ops]
    g = graph(module)
    for i in members:
        if g.nodes[i].analysis is None:
            raise IRError(f"op '{module.ops[i].name}' is opaque and cannot share a kernel",
                          f"kernels[{n}].ops", "re-run tk-weld (opaque ops run alone)")
    if members != list(range(members[0], members[0] + len(members))):
        raise IRError("a welded group is a run of consecutive ops", f"kernels[{n}].ops",
                      "re-run tk-weld")
    last = g.nodes[members[-1]].analysis
    group = read_group_tile(kernel.tile, [g.nodes[i].analysis for i in members], where)
    recorded = [m.op for m in group.members]
    if recorded != list(kernel.ops):
        raise IRError(f"members {recorded} are not the kernel's ops {list(kernel.ops)}",
                      f"{where}.members", "re-run tk-weld")
    try:
        s = structure(module, members, group.levels)
    except NotFusible as exc:
        raise IRError(f"the group is not one kernel: {exc}", where, "re-run tk-weld") from None
    _check_levels(group, s, where)
    if sorted(group.stored) != sorted(s.stored):
        raise IRError(f"stored {sorted(group.stored)} are not the tensors the group writes to "
                      f"global memory ({sorted(s.stored)}: read outside it, or outputs)",
                      f"{where}.stored", "re-run tk-weld")
    try:
        prop = propagate(module, members, group.tile.block)
    except NotFusible as exc:
        raise IRError(str(exc), f"{where}.block", "re-run tk-weld") from None
    if group.flash is not None:
        _check_flash(module, group, s, limit, where)
    elif s.stages > 1:
        _check_regions(module, group, prop, where)
        extents = [e for _, e in last.spatial]
        for k, i in enumerate(members[:-1]):
            out = g.nodes[i].writes[0]
            if out in s.stored and not covers(prop.regions[k], module.tensors[out].shape,
                                              prop.block, extents):
                raise IRError(f"'{out}' is read outside the group but the blocks' regions "
                              "do not cover it", f"{where}.block",
                              "re-run tk-weld (or keep the reader inside the group)")
        smem = footprint(shared_buffers(module, s, prop))
        if limit is not None and smem > limit:
            raise IRError(f"the shared edges need {smem} bytes per block, more than the "
                          f"profile's {limit}", f"{where}.edges",
                          "re-run tk-weld for this profile (a smaller tile)")
    return group


def _check_flash(module: Module, group: GroupTile, s, limit: int | None, where: str) -> None:
    """The flash form: an attention group, split on its key axis, every column whole."""
    from tilekit.weld.attention import FLASH_STEP, match
    from tilekit.weld.search import flash_footprint

    att = match(module, s)
    if att is None:
        raise IRError("the group is not attention (scores, row max, exp-sum, probabilities, "
                      "probabilities x values), so it has no flash form", f"{where}.flash",
                      "re-run tk-weld")
    if group.flash["key"] != att.key or group.flash["step"] != FLASH_STEP:
        raise IRError(f"the flash form splits key axis '{att.key}' in steps of {FLASH_STEP}, "
                      f"got {dict(group.flash)}", f"{where}.flash", "re-run tk-weld")
    last = graph(module).nodes[module.op_index()[group.members[-1].op]].analysis
    o_axes = [a for a, _ in graph(module).nodes[s.members[att.stages[4]]].analysis.spatial]
    for (a, extent), b, oa in zip(last.spatial, group.tile.block, o_axes):
        if oa not in att.rows and b != extent:
            raise IRError(f"the flash form needs every output column in the block: axis "
                          f"'{a}' has block {b} of {extent}", f"{where}.block.{a}",
                          "re-run tk-weld")
    rows = math.prod(b for b, oa in zip(group.tile.block, o_axes) if oa in att.rows)
    if limit is not None and flash_footprint(rows) > limit:
        raise IRError(f"the flash form needs {flash_footprint(rows)} bytes of shared memory "
                      f"per block, more than the profile's {limit}", f"{where}.block",
                      "re-run tk-weld for this profile")


def _check_levels(group: GroupTile, s, where: str) -> None:
    roles = dict(zip(s.names, s.roles))
    for k, m in enumerate(group.members):
        if m.role != roles[m.op]:
            raise IRError(f"op '{m.op}' is recorded as '{m.role}' but runs as '{roles[m.op]}'",
                          f"{where}.members[{k}].role", "re-run tk-weld")
    derived = {e.tensor: e for e in s.edges}
    seen = set()
    for k, e in enumerate(group.edges):
        d = derived.get(e.tensor)
        if d is None:
            raise IRError(f"'{e.tensor}' is not an edge of the group (no member reads what "
                          "another writes there)", f"{where}.edges[{k}].tensor",
                          "re-run tk-weld")
        if e.level != d.level:
            why = {"register": "its readers read it with reuse or from another stage, so other "
                               "threads need it",
                   "shared": "the block's shared memory holds it, not one thread",
                   "global": "it stays inside the group"}.get(e.level, "")
            raise IRError(f"edge '{e.tensor}' cannot be at level '{e.level}': {why}; "
                          f"it is '{d.level}'", f"{where}.edges[{k}].level", "re-run tk-weld")
        seen.add(e.tensor)
    missing = sorted(set(derived) - seen)
    if missing:
        raise IRError(f"edges {missing} are not recorded", f"{where}.edges", "re-run tk-weld")


def _check_regions(module: Module, group: GroupTile, prop, where: str) -> None:
    for k, m in enumerate(group.members):
        need = prop.lengths(k)
        if len(m.region) != len(need) or any(r < x for r, x in zip(m.region, need)):
            raise IRError(f"region {list(m.region)} of '{m.op}' does not cover the "
                          f"{list(need)} its readers need for block "
                          f"{list(group.tile.block)}", f"{where}.members[{k}].region",
                          "re-run tk-weld")


__all__ = ["check_group", "check_groups"]
