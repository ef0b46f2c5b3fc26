"""One symbolic module's compiled CPU code across its sizes: builds shared by the sizes whose
code has the same structure (tilekit.codegen.parametric).

`CompiledFamily(module, weights)` holds the templates made so far for a symbolic module.
`program(instance, values)` gives the compiled program of one size (`instance`: the module
at `values`, folded by `tilekit.runtime.fold`, as tk-run makes it):

1. its CPU code is generated (a fraction of a second; nothing is built);
2. a template it matches runs it: its build (one per template, cached by its source as any
   unit is) with this size's tables;
3. a template of its structure whose constants it does not share is **widened**: those
   leaves become holes too (a new build, which serves both);
4. else a new template is made from this size and **samples**: the same module at other
   sizes (each symbol in turn moved to values of its range spread from the size: a
   neighbour, twice and half the size, its likely values, its ends), those whose structure
   is this size's. Their leaves that differ are the template's holes, so that later sizes
   of the same structure match without a new build.

A size whose structure none of the samples shares gets a template without holes: its own
build, as before sizes were parameters. `builds` counts the templates made.

The templates are kept in the build cache too (`$TILEKIT_CACHE/families/<key>.json`, the
key covering the symbolic module's document and the profile): a later process (one
`tk-run` per size) matches them first, so its sizes print the units built before and find
them built, instead of sampling again and perhaps choosing other holes.
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

    def __init__(self, module: Any, weights: Mapping[str, np.ndarray], profile=None) -> None:
        self.module = module
        self.weights = weights
        self.profile = profile
        self.templates: list = []
        self.builds = 0         # templates made or widened: the units built for the sizes
        self._stored: list | None = None   # the cache's records, read on first need

    def _store(self) -> Path:
        from tilekit.codegen.nvcc import cache_dir
        from tilekit.ir.codec import dumps

        text = dumps(self.module, "json") + (self.profile.content_hash if self.profile
                                             else "")
        return cache_dir() / "families" / f"{hashlib.sha256(text.encode()).hexdigest()}.json"

    def _stored_templates(self) -> list:
        """The templates an earlier process kept for this module: (structure digest, holes,
        constants, slots)."""
        if self._stored is None:
            try:
                records = json.loads(self._store().read_text())
            except (OSError, ValueError):
                records = []
            # a cache file is not trusted: a record of another form is left out
            self._stored = [r for r in records if _well_formed(r)] \
                if isinstance(records, list) else []
        return self._stored

    def _keep(self, t) -> None:
        """Add template `t` to the cache's records (best effort: a cache that cannot be
        written costs samples later, nothing else)."""
        records = [r for r in self._stored_templates() if r[0] != _digest(t.structure)]
        records.append([_digest(t.structure), list(t.holes), list(t.constants),
                        list(t.slots)])
        self._stored = records
        path = self._store()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(records))
            os.replace(tmp, path)
        except OSError:
            pass

    def _generated(self, instance):
        from tilekit.codegen import generate

        return generate(instance, self.profile, target="cpu", generic=True)

    def _sample(self, values: Mapping[str, int], budget: int):
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
        return self._generated(instance)

    def sample_sizes(self, values: Mapping[str, int]) -> list[list[dict[str, int]]]:
        """Per symbol, the other sizes a template for `values` may be made from: values of
        its range spread from the given one (neighbours, twice and half, its likely values,
        its ends), the other symbols as given."""
        out = []
        for name in sorted(values):
            dim = self.module.dims[name]
            v = values[name]
            near = [v + 1, v + 7, v + v // 2 + 1, 2 * v + 1, v // 2 + 1, v - 1, v + 3,
                    *dim.likely, (v + dim.max) // 2, dim.max, dim.min]
            seen, picked = {v}, []
            for c in near:
                if dim.min <= c <= dim.max and c not in seen:
                    seen.add(c)
                    picked.append({**values, name: c})
            out.append(picked[:TRIES])
        return out

    def unit(self, kernels, records, values: Mapping[str, int]):
        """The unit (tilekit.codegen.parametric.Unit) that runs the size whose generated
        `kernels` and codegen `records` are given."""
        from tilekit.codegen.parametric import abstract, template, unit
        from tilekit.ir.dims import instantiate
        from tilekit.runtime.io import run_bytes

        from tilekit.codegen.parametric import Template

        mine = abstract(kernels)
        for t in self.templates:
            if t.match(mine):
                return unit(t, kernels, records)
        digest = _digest(mine.structure)
        for key, holes, constants, slots in self._stored_templates():
            t = Template(mine.structure, tuple(constants), tuple(holes), tuple(slots))
            if key == digest and len(constants) == len(mine.leaves) and t.match(mine):
                self.templates.append(t)
                return unit(t, kernels, records)
        for n, t in enumerate(self.templates):
            if t.structure == mine.structure:
                self.templates[n] = wider = t.widened(mine)
                self.builds += 1
                self._keep(wider)
                return unit(wider, kernels, records)
        budget = SAMPLE_BYTES * run_bytes(instantiate(self.module, values)) + SAMPLE_SLACK
        samples = [mine]
        for candidates in self.sample_sizes(values):
            found = missed = 0
            for other in candidates:
                # a sample only finds holes: a size the model refuses (its tables' bounds,
                # symbols it ties together) is left out, whatever the refusal raised
                try:
                    generated = self._sample(other, budget)
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
        self._keep(t)
        return unit(t, kernels, records)

    def program(self, instance, values: Mapping[str, int], threads: int | None = None):
        """The compiled program of `instance` (the module at `values`, folded)."""
        from tilekit.ir.payloads import CodegenSection
        from tilekit.runtime.compiled import CpuProgram

        generated = self._generated(instance)
        records = CodegenSection.read(generated.module.codegen).kernels
        return CpuProgram(generated.module, threads,
                          unit=self.unit(generated.kernels, records, values))


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


__all__ = ["CompiledFamily", "MISSES", "SAMPLES", "SAMPLE_BYTES", "SAMPLE_SLACK", "TRIES"]
