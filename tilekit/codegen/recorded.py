"""Kernel sources recorded in an IR are run only if this tilekit would have written them.

A `codegen` section carries CUDA sources and launch geometry that the CUDA runtime compiles
and launches. A document is input, and input may be hostile: before anything is compiled,
`check_recorded_kernels` generates the module's kernels again (for the arch recorded, and the
profile the `codegen` stage or `hardware` names, else for no profile or any known one) and
requires every recorded kernel to match one of those, field by field (name, entry,
arguments, grid, block, shared memory, source), and each group's launch entries and each
control op's placement (`codegen.control`) to be those generated. ptxas resources added by
`--compile` are not compared. Any difference is bad input: re-run tk-codegen.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator, Mapping

from tilekit.errors import TilekitError, excerpt
from tilekit.ir.model import Module

#: Fields of a `codegen.kernels` entry that the runtime uses and that must match.
COMPARED = ("name", "group", "entry", "ops", "shape", "grid", "block", "smem_bytes", "args",
            "writes", "source", "coresident", "workspace", "tensor_maps",
            "scratch")
_HINT = "the IR's kernels are not what tk-codegen generates for it: re-run tk-codegen"


def _stage_options(module: Module) -> Mapping[str, Any]:
    for stage in reversed(module.stages):
        if stage.get("name") == "codegen":
            return stage.get("options") or {}
    return {}


def _candidate_profiles(module: Module, ir_path: str | None, target: str,
                        given=None) -> Iterator[Any]:
    """The profiles the kernels may have been generated for: `given` (a library caller's
    own, such as a shipped profile scaled to other cores: `Profile.with_cpu`, which no file
    holds), the one the `codegen` stage or the IR's `hardware` names, no profile, then every
    known profile (a library caller of `generate` records none). Kernels depend on the
    profile only through its limits, so matching under any of them means the sources are
    tilekit's own. CUDA kernels are never generated for a CPU profile, so none is tried for
    them."""
    from tilekit.hw import list_profiles, load_profile, load_recorded_profile

    name = _stage_options(module).get("hw")
    for load in (lambda: given,
                 lambda: load_profile(name) if name else None,
                 lambda: load_recorded_profile(module.hardware, ir_path)
                 if module.hardware else None):
        try:
            profile = load()
        except TilekitError:
            continue
        if profile is not None:
            yield profile
    yield None
    try:
        yield from (p for p in list_profiles() if target == "cpu" or not p.is_cpu)
    except TilekitError:
        return


def check_recorded_kernels(module: Module, ir_path: str | None = None, profile=None) -> None:
    """Raise `TilekitError` unless `module.codegen` holds exactly the kernels that
    `tilekit.codegen.generate` makes for the module (see the module docstring); `profile`,
    the caller's, is tried first."""
    from tilekit.codegen.module import generate
    from tilekit.codegen.nvcc import check_arch

    codegen = module.codegen or {}
    recorded = codegen.get("kernels")
    if not isinstance(recorded, list) or not all(isinstance(k, Mapping) for k in recorded):
        raise TilekitError("has no list of kernel records", "codegen.kernels", _HINT)
    target = codegen.get("target", "cuda")
    if target not in ("cuda", "cpu"):
        raise TilekitError(f"unknown target {excerpt(target, 30)}", "codegen.target",
                           "re-run tk-codegen (--target cuda or cpu)")
    arch = codegen.get("arch")
    if not isinstance(arch, str):
        raise TilekitError("has no arch", "codegen.arch", _HINT)
    if target == "cuda":
        check_arch(arch, "codegen.arch")
    else:
        arch = None
    bare = replace(module, codegen=None,
                   kernels=tuple(replace(k, launch=None) for k in module.kernels))
    have = [_compared(k) for k in recorded]
    first_difference = None
    for profile in _candidate_profiles(module, ir_path, target, profile):
        made = generate(bare, profile, arch, target).module
        want = [_compared(k) for k in made.codegen["kernels"]]
        if have != want:
            first_difference = first_difference or _difference(have, want)
            continue
        # what the runtime launches by: each group's entries, each control op's placement
        # (grids aside: `--compile` may cap a device loop's to what ptxas' registers allow)
        for n, (k, w) in enumerate(zip(module.kernels, made.kernels)):
            if _entries(k.launch) != _entries(w.launch):
                raise TilekitError("entries differ from what tk-codegen generates",
                                   f"kernels[{n}] ({k.name}).launch.entries", _HINT)
        if _placements(codegen.get("control")) != _placements(made.codegen.get("control")):
            raise TilekitError("differs from what tk-codegen generates", "codegen.control",
                               _HINT)
        return
    raise TilekitError(*first_difference, _HINT)


def _compared(record: Mapping) -> dict:
    """The parts of a kernel record that must be what tk-codegen generates: `COMPARED`, and
    the schedule's `view` (the compiled CPU runtime gives a view's output its input's memory
    and skips the kernel: a `view` added to another kernel would alias two tensors)."""
    schedule = record.get("schedule")
    return {**{key: record.get(key) for key in COMPARED},
            "schedule.view": schedule.get("view") if isinstance(schedule, Mapping) else None}


def _entries(launch: Any) -> Any:
    return launch.get("entries") if isinstance(launch, Mapping) else launch


def _placements(control: Any) -> Any:
    """{op: its record without the grid} of a `codegen.control` section (anything else as
    it is, so that it differs)."""
    if not isinstance(control, Mapping):
        return control
    return {op: {k: v for k, v in rec.items() if k != "grid"} if isinstance(rec, Mapping)
            else rec for op, rec in control.items()}


def _difference(have: list[dict], want: list[dict]) -> tuple[str, str]:
    """(what, where) of the first difference between recorded and generated kernels."""
    if len(have) != len(want):
        return f"records {len(have)} kernels, tk-codegen makes {len(want)}", "codegen.kernels"
    for index, (h, w) in enumerate(zip(have, want)):
        for key in h:
            if h[key] != w[key]:
                return (f"'{key}' differs from what tk-codegen generates (kernel "
                        f"{excerpt(w.get('entry'), 60, quote=False)})",
                        f"codegen.kernels[{index}].{key}")
    return "differs from what tk-codegen generates", "codegen.kernels"  # pragma: no cover
