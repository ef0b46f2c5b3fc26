"""Stage records: the one place that records a stage in the IR and drops what it invalidates.

Every stage that changes a module runs through `run_stage(module, name, work, options)`:

1. the sections that depend on what the stage is about to change are dropped (a re-rolled
   module loses its kernels' launch figures and its generated code, which were computed from
   the old tiles), and their names are recorded as the stage option `dropped`;
2. `work(module)` does the stage's work (a pure function);
3. `{name, options}` is appended to `stages`.

`INVALIDATES` is the table of what each stage's output makes stale. Sections that define what
a module computes (tensors, ops, `control`) are never dropped; only derived schedules and code.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

from tilekit.ir.control import control_section, read_control, walk
from tilekit.ir.model import Module

#: Derived sections, by the name recorded in `dropped`.
SECTIONS: dict[str, Callable[[Module], bool]] = {
    "kernels[*].tile": lambda m: any(k.tile for k in m.kernels),
    "kernels[*].launch": lambda m: any(k.launch for k in m.kernels),
    "program": lambda m: m.program is not None,
    "codegen": lambda m: m.codegen is not None,
    "control[*].grind": lambda m: any(rec.grind is not None for _, rec, _ in walk(m)),
}

#: stage -> the derived sections its output makes stale.
INVALIDATES: dict[str, tuple[str, ...]] = {
    "import": (),
    # New tiles: a group's tile (tk-weld's, chosen from the old ones), the launch figures,
    # the rTask program and the generated code are all computed from them.
    "roll": ("kernels[*].tile", "control[*].grind", "program", "codegen",
             "kernels[*].launch"),
    # New kernel groups: the program packs kernels, the code implements them.
    "weld": ("control[*].grind", "program", "codegen", "kernels[*].launch"),
    # Loops on the device change what the program and the code run.
    "grind": ("program", "codegen", "kernels[*].launch"),
    "ram": ("codegen", "kernels[*].launch"),
    "codegen": (),
}


def drop(module: Module, sections) -> tuple[Module, list[str]]:
    """`module` without the derived `sections` that it has; the names of those dropped."""
    dropped = [s for s in sections if SECTIONS[s](module)]
    if not dropped:
        return module, []
    kernels = module.kernels
    if "kernels[*].tile" in dropped or "kernels[*].launch" in dropped:
        kernels = tuple(replace(k, tile=None if "kernels[*].tile" in dropped else k.tile,
                                launch=None if "kernels[*].launch" in dropped else k.launch)
                        for k in kernels)
    control = _ungrind(module.control) if "control[*].grind" in dropped else module.control
    return replace(module, kernels=kernels, control=control,
                   program=None if "program" in dropped else module.program,
                   codegen=None if "codegen" in dropped else module.codegen), dropped


def _ungrind(control):
    """A `control` section without tk-grind's placements, nested scopes too."""
    records = read_control(control)
    if not records:
        return control
    return control_section({
        name: replace(rec.with_regions(tuple(replace(r, control=_ungrind(r.control))
                                             for r in rec.regions)), grind=None)
        for name, rec in records.items()})


def run_stage(module: Module, name: str, work: Callable[[Module], Module],
              options: Mapping[str, Any] | None = None, symbolic: bool = False) -> Module:
    """Drop what stage `name` invalidates, run `work`, record the stage (see the module
    docstring). `options` are JSON-like values; `dropped` is added when something went.
    `symbolic`: the stage takes a symbolic module (else it refuses one: the stages after
    import schedule static sizes, but for tk-roll on a CPU profile)."""
    from tilekit.ir.dims import require_static

    if not symbolic:
        require_static(module, f"tk-{name}")
    clean, dropped = drop(module, INVALIDATES.get(name, ()))
    out = work(clean)
    recorded = dict(options or {})
    if dropped:
        recorded["dropped"] = dropped
    return out.with_stage(name, **recorded)
