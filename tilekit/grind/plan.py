"""The grind pass: `grind_module(module, profile, place) -> Module` with every control op
placed on the device or the host.

Each control op's record gets `grind: {run, why, estimate}`:

- `run: device`: a loop or scan becomes one persistent cooperative kernel (tilekit.codegen.
  control), a branch one kernel that reads its predicate on the device and runs one side;
  on a CPU profile the same kernel runs inside the compiled library, its blocks the threads
  of one OpenMP team and its grid barriers the team's;
- `run: host`: the host drives it (launches the body per iteration, reads the condition).

The figures are `tilekit.grind.cost`'s: `control_costs` for a GPU, `cpu_control_costs` for a
CPU profile (the module must be rolled for the same kind of profile).

`place: auto` (the default) picks the cheaper placement by `tilekit.grind.cost`; `host` and
`device` force it (a device placement that cannot be made stays on the host with the reason:
on a GPU a body holding a nested control op, on any target a loop with no trip count,
condition or maximum). Nested control ops are placed first, inside out (on a GPU a device
body holds no control op, so a parent of one stays on the host; inside a CPU library a
nested op placed there is one of its parent's bodies). The pass needs tk-roll's tiles in the
regions to price them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from tilekit.errors import IRError, TilekitError, UnsupportedError
from tilekit.grind.cost import control_costs, cpu_control_costs
from tilekit.ir.control import (ControlOp, control_section, read_control, region_scope,
                                 walk)
from tilekit.ir.stages import run_stage
from tilekit.ir.model import Module, Tensor
from tilekit.ir.payloads import cpu_rolled

STAGE = "grind"
PLACES = ("auto", "host", "device")


def grind_module(module: Module, profile, place: str = "auto") -> Module:
    """Place every control op of `module` (see the module docstring)."""
    if place not in PLACES:
        raise TilekitError(f"unknown placement '{place}'", "--place",
                           f"one of: {', '.join(PLACES)}")
    if "import" not in module.stage_names():
        raise IRError("the input has no 'import' stage", "stages",
                      "produce it with tk-import")
    if module.hardware and profile.is_cpu != cpu_rolled(module):
        raise UnsupportedError(
            f"hardware profile '{profile.name}' is a {'CPU' if profile.is_cpu else 'GPU'}, "
            f"but the module is rolled for {'GPU' if profile.is_cpu else 'CPU'} profile "
            f"'{module.hardware}'", "--hw",
            f"place it for the profile it was rolled for (--hw {module.hardware}), or re-run "
            f"tk-roll --hw {profile.name} first")
    options: dict[str, Any] = {"hw": profile.name}
    if place != "auto":
        options["place"] = place
    return run_stage(module, STAGE, lambda m: _grind(m, profile, place), options)


def _grind(module: Module, profile, place: str) -> Module:
    control = _place_scope(module.control, dict(module.tensors), profile, place)
    return replace(module, control=control)


def _place_scope(control: Mapping[str, Any] | None, scope: Mapping[str, Tensor], profile,
                 place: str) -> Mapping[str, Any] | None:
    records = read_control(control)
    if not records:
        return control
    placed = {name: _place(rec, scope, profile, place) for name, rec in records.items()}
    return control_section(placed)


def _place(rec: ControlOp, scope: Mapping[str, Tensor], profile, place: str) -> ControlOp:
    regions = tuple(replace(r, control=_place_scope(r.control, region_scope(scope, r),
                                                    profile, place))
                    for r in rec.regions)
    rec = rec.with_regions(regions)
    costs = (cpu_control_costs if profile.is_cpu else control_costs)(rec, scope, profile)
    kind = "branch" if rec.kind == "if" else "loop"
    if profile.is_cpu:
        kind = f"{kind} (inside the compiled library)"
    unbounded = rec.kind == "loop" and not (rec.trip_count or rec.cond) \
        and rec.max_trips is None
    if unbounded:
        run, why = "host", ("host: the loop has no trip count, condition or maximum (the "
                            "host stops it at the iteration budget; a device loop would not "
                            "stop)")
    elif costs.device_us is None:
        run, why = "host", f"host: {costs.why}"
    elif place == "host":
        run, why = "host", "host: placed by --place host"
    elif place == "device":
        run, why = "device", f"device {kind}: placed by --place device"
    elif costs.device_us < costs.host_us:
        run, why = "device", (f"device {kind}: {costs.device_us:.1f} us against "
                              f"{costs.host_us:.1f} us host-driven")
    else:
        run, why = "host", (f"host: {costs.host_us:.1f} us against {costs.device_us:.1f} us "
                            "on the device")
    return replace(rec, grind={"run": run, "why": why, "estimate": costs.record()})


def report_rows(module: Module) -> list[tuple[str, ...]]:
    """One row per control op (nested ones too): path, kind, placement, figures."""
    rows = []
    for path, rec, _ in walk(module):
        g = rec.grind or {}
        est = g.get("estimate", {})
        rows.append((path, rec.kind, str(g.get("run", "-")), str(est.get("trips", "-")),
                     f"{est.get('host_us', '-')}", f"{est.get('host_launches', '-')}",
                     f"{est.get('host_syncs', '-')}", f"{est.get('device_us', '-')}",
                     f"{est.get('grid', '-')}", str(g.get("why", ""))))
    return rows


REPORT_COLUMNS = ("control op", "kind", "run", "trips", "host_us", "launches", "syncs",
                  "device_us", "grid", "why")
