"""One symbolic module's compiled code across its sizes: builds shared by the sizes whose
code has the same structure (tilekit.codegen.parametric), on the CPU or on CUDA.

`CompiledFamily(module, weights, target)` holds the templates made so far for a symbolic
module. `program(instance, values)` gives the compiled program of one size (`instance`: the
module at `values`, folded by `tilekit.runtime.fold`, as tk-run makes it; a `CpuProgram`,
or a `CudaProgram` for target "cuda"), `code(instance, values)` its generated module and
unit without loading them:

1. its code is generated (a fraction of a second; nothing is built), knowing which
   ops' axes vary with the symbols (`varying_axes`): no decision that shapes the code reads
   their extents (tilekit.schedule.shape `Target.varying`, `CpuTiles.varying` on CPUs),
   so sizes share structures;
2. a template it matches runs it: its build (one per template, cached by its source as any
   unit is) with this size's tables;
3. a template of its structure whose constants it does not share is **widened**: those
   leaves become holes too (a new build, which serves both);
4. else a new template is made from this size and **samples**: the same module at other
   sizes (each symbol in turn moved to values of its range spread from the size: twice
   and four times the size, half-way to the range's end, 1.5x, a neighbour, half, its
   likely values, its ends), those whose structure is this size's. Their leaves that
   differ are the template's holes, so that later sizes of the same structure match
   without a new build.

A size whose structure none of the samples shares gets a template without holes: its own
build, as before sizes were parameters. Kernels that compose others (a tk-ram program, a
device loop) are no template: each such size is its own build. `builds` counts the
templates made (and those sizes).

The templates are kept in the build cache too (`$TILEKIT_CACHE/families/<key>.json`, the
key covering the symbolic module's document, the profile and the target): a later process
(one `tk-run` per size) matches them first, so its sizes print the units built before and
find them built, instead of sampling again and perhaps choosing other holes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

#: Samples per symbol a template is made from, and the sizes per symbol tried to find them
#: (each one generated, never built).
SAMPLES = 3
TRIES = 6
#: Other structures in a row after which a symbol's tries stop.
MISSES = 3
#: A sample's tensors may take this many times the bytes of the size asked for, and this
#: much more.
SAMPLE_BYTES = 4
SAMPLE_SLACK = 64 << 20


class CompiledFamily:
    """The templates of one symbolic module (see the module docstring)."""

    def __init__(self, module: Any, weights: Mapping[str, np.ndarray],
                 target: str = "cpu") -> None:
        self.module = module
        self.weights = weights
        self.target = target    # cpu | cuda: the code generated, printed and built
        self.templates: list = []
        self.builds = 0         # templates made or widened: the units built for the sizes
        self._stored: dict[str, list] = {}   # per store file, its records (read once)
        self._sources: dict[int, str] = {}   # per template (its id), its unit's source
        self._varying: frozenset[tuple[str, str]] | None = None
        self._arch: str | None = None        # the CUDA arch the last size was generated for

    def _store(self, profile) -> Path:
        from tilekit.codegen.nvcc import cache_dir
        from tilekit.ir.codec import dumps

        text = dumps(self.module, "json") + (profile.content_hash if profile else "") + \
            self.target
        return cache_dir() / "families" / f"{hashlib.sha256(text.encode()).hexdigest()}.json"

    def _stored_templates(self, profile) -> list:
        """The templates an earlier process kept for this module and profile: (structure
        digest, holes, constants, slots)."""
        path = self._store(profile)
        if str(path) not in self._stored:
            try:
                records = json.loads(path.read_text())
            except (OSError, ValueError):
                records = []
            # a cache file is not trusted: a record of another form is left out
            self._stored[str(path)] = [r for r in records if _well_formed(r)] \
                if isinstance(records, list) else []
        return self._stored[str(path)]

    def _keep(self, t, profile) -> None:
        """Add template `t` to the cache's records (best effort: a cache that cannot be
        written costs samples later, nothing else)."""
        digest = _digest(t.structure)
        path = self._store(profile)
        records = [r for r in self._stored_templates(profile) if r[0] != digest]
        records.append([digest, list(t.holes), list(t.constants), list(t.slots)])
        self._stored[str(path)] = records
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(records))
            os.replace(tmp, path)
        except OSError:
            pass

    def _sample(self, values: Mapping[str, int], budget: int, profile):
        """The generated code at `values`; None for a size whose tensors take more than
        `budget` bytes (a sample is never much larger than the size asked for: the range's
        end of a sequence may be a mask of gigabytes)."""
        from tilekit.ir.dims import instantiate
        from tilekit.runtime.fold import fold_constants
        from tilekit.runtime.io import run_bytes

        instance = instantiate(self.module, values)
        if run_bytes(instance) > budget:
            return None
        instance, _ = fold_constants(instance, self.weights)
        return self._generated(instance, values, profile, self._arch)

    def sample_sizes(self, values: Mapping[str, int]) -> list[list[dict[str, int]]]:
        """Per symbol, the other sizes a template for `values` may be made from: values of
        its range spread from the given one (twice and four times, half-way to the range's
        end, 1.5x, neighbours, half, its likely values, its ends), the other symbols as
        given."""
        out = []
        for name in sorted(values):
            dim = self.module.dims[name]
            v = values[name]
            # twice and four times the size first: sizes rounded up to a block (16 rows, a
            # micro-panel) move only every few sizes, and neighbours would leave them
            # constants that a later size widens
            near = [2 * v + 1, 4 * v + 3, (v + dim.max) // 2, v + v // 2 + 1, v + 1, v + 7,
                    v // 2 + 1, v - 1, v + 3, *dim.likely, dim.max, dim.min]
            seen, picked = {v}, []
            for c in near:
                if dim.min <= c <= dim.max and c not in seen:
                    seen.add(c)
                    picked.append({**values, name: c})
            out.append(picked[:TRIES])
        return out

    def unit(self, kernels, records, instance, values: Mapping[str, int], profile=None):
        """The unit (tilekit.codegen.parametric.Unit) that runs `instance` (the module at
        `values`), whose generated `kernels` and codegen `records` are given (`profile`: the
        profile they were generated for); None for kernels that compose others (a tk-ram
        program, a device loop: their sizes are not parameters, each size is its own
        build)."""
        from tilekit.codegen.parametric import abstract, cuda_unit, unit

        if any(g.program.calls for g in kernels):
            self.builds += 1
            return None
        mine = abstract(kernels)
        t = self._matching(mine, profile) or self._made(mine, instance, values, profile)
        if self.target == "cuda":
            made = cuda_unit(t, mine, kernels, self._sources.get(id(t)))
        else:
            made = unit(t, mine, records, self._sources.get(id(t)))
        self._sources[id(t)] = made.source      # one printing per template, not per size
        return made

    def _matching(self, mine, profile):
        """A template `mine` (a size's abstract) matches: one of this process's, else one an
        earlier process kept, else one of its structure widened; None when none has its
        structure."""
        from tilekit.codegen.parametric import Template

        for t in self.templates:
            if t.match(mine):
                return t
        digest = _digest(mine.structure)
        for key, holes, constants, slots in self._stored_templates(profile):
            if key != digest or len(constants) != len(mine.leaves):
                continue
            t = Template(mine.structure, tuple(constants), tuple(holes), tuple(slots))
            if t.match(mine):
                self.templates.append(t)
                return t
        for n, t in enumerate(self.templates):
            if t.structure == mine.structure:
                self.templates[n] = wider = t.widened(mine)
                self._sources.pop(id(t), None)
                self.builds += 1
                self._keep(wider, profile)
                return wider
        return None

    def _made(self, mine, instance, values: Mapping[str, int], profile):
        """A new template from `mine` and the samples of its structure (the module
        docstring)."""
        from tilekit.codegen.parametric import abstract, template
        from tilekit.runtime.io import run_bytes

        budget = SAMPLE_BYTES * run_bytes(instance) + SAMPLE_SLACK
        samples = [mine]
        for candidates in self.sample_sizes(values):
            found = missed = 0
            for other in candidates:
                # a sample only finds holes: a size the model refuses (its tables' bounds,
                # symbols it ties together) is left out, whatever the refusal raised
                try:
                    generated = self._sample(other, budget, profile)
                except Exception:  # noqa: BLE001 - see above
                    continue
                if generated is None:
                    continue
                a = abstract(generated.kernels)
                if a.structure == mine.structure:
                    samples.append(a)
                    found, missed = found + 1, 0
                    if found == SAMPLES:
                        break
                else:
                    missed += 1
                    if missed == MISSES:    # a size its neighbours do not share (batch 1)
                        break
        t = template(samples)
        self.templates.append(t)
        self.builds += 1
        self._keep(t, profile)
        return t

    def program(self, instance, values: Mapping[str, int], threads: int | None = None,
                profile=None):
        """The compiled program of `instance` (the module at `values`, folded): a CPU
        program (`threads`), its code generated for `profile` (the CPU profile a rolled
        module records) or the host; or the kernels loaded on the GPU, generated as
        `tk-run --device cuda` generates a module without kernels (for the GPU `profile` it
        was rolled for, if any, and the device's arch)."""
        if self.target == "cuda":
            from tilekit.runtime.cuda import CudaProgram, device_arch
            module, made = self.code(instance, values, profile,
                                     device_arch() if profile is not None else None)
            return CudaProgram(module, unit=made)
        module, made = self.code(instance, values, profile)
        from tilekit.runtime.compiled import CpuProgram
        return CpuProgram(module, threads, unit=made)

    def code(self, instance, values: Mapping[str, int], profile=None, arch: str | None = None):
        """(module, unit): `instance`'s generated module (its codegen section gives the
        launches; CUDA code for `arch`, else the profile's) and the unit that runs it, a
        template's build with this size's tables (`unit`). CPU kernels that compose others
        run their own unit (None); CUDA ones their own unit's source, with no tables."""
        from tilekit.ir.payloads import CodegenSection

        self._arch = arch          # the samples of a new template are generated for it too
        generated = self._generated(instance, values, profile, arch)
        records = CodegenSection.read(generated.module.codegen).kernels
        made = self.unit(generated.kernels, records, instance, values, profile)
        if made is None and self.target == "cuda":
            from tilekit.codegen.parametric import Unit
            from tilekit.runtime.cuda import unit_source
            made = Unit(unit_source(records), (), ())
        return generated.module, made

    def _generated(self, instance, values: Mapping[str, int], profile, arch=None):
        """A size's code, generated knowing which extents vary (`varying_axes`, found once,
        from the first size)."""
        from tilekit.codegen import generate

        if self._varying is None:
            self._varying = varying_axes(self.module, values)
        return generate(instance, profile, arch, target=self.target, varying=self._varying)


def varying_axes(module: Any, values: Mapping[str, int]) -> frozenset[tuple[str, str]]:
    """The (op, axis) pairs of symbolic `module` whose extents change with its symbols: every
    op's axes at `values` against the module at the ends of its ranges and one past `values`
    (sizes the module refuses are left out). Only shapes are evaluated: no data."""
    from tilekit.ir.dims import instantiate
    from tilekit.ir.graph import graph

    def extents(sizes: Mapping[str, int]) -> dict[tuple[str, str], int]:
        out = {}
        for node in graph(instantiate(module, sizes)).nodes:
            if node.analysis is not None:
                for axis, n in (*node.analysis.spatial, *node.analysis.reduction):
                    out[(node.op.name, axis)] = n
        return out

    here = extents(values)
    found: set[tuple[str, str]] = set()
    dims = module.dims
    for other in ({n: dims[n].min for n in values}, {n: dims[n].max for n in values},
                  {n: v + 1 if v < dims[n].max else v - 1 for n, v in values.items()}):
        try:
            there = extents(other)
        except Exception:  # noqa: BLE001 - a size the model refuses tells nothing
            continue
        found |= {key for key, n in here.items() if there.get(key, n) != n}
    return frozenset(found)


def _well_formed(record) -> bool:
    """[digest, holes, constants, slots]: holes ascending positions of the constants, a slot
    per hole numbered in order of first appearance."""
    if not (isinstance(record, list) and len(record) == 4 and isinstance(record[0], str)
            and all(isinstance(r, list) for r in record[1:])):
        return False
    holes, constants, slots = record[1], record[2], record[3]
    return (all(type(h) is int and 0 <= h < len(constants) for h in holes)
            and holes == sorted(set(holes))
            and all(type(c) in (int, float) for c in constants)
            and len(slots) == len(holes) and all(type(x) is int for x in slots)
            and all(x <= max(slots[:n], default=-1) + 1 for n, x in enumerate(slots)))


def _digest(structure) -> str:
    """A structure's digest (its nodes' reprs are deterministic: frozen dataclasses)."""
    return hashlib.sha256(repr(structure).encode()).hexdigest()


__all__ = ["CompiledFamily", "MISSES", "SAMPLES", "SAMPLE_BYTES", "SAMPLE_SLACK", "TRIES",
           "varying_axes"]
