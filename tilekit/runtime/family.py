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
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

#: Samples per symbol a template is made from, and the sizes per symbol tried to find them
#: (each one generated, never built).
SAMPLES = 5
TRIES = 10
#: Other structures in a row after which a symbol's tries stop.
MISSES = 3


class CompiledFamily:
    """The templates of one symbolic module (see the module docstring)."""

    def __init__(self, module: Any, weights: Mapping[str, np.ndarray], profile=None) -> None:
        self.module = module
        self.weights = weights
        self.profile = profile
        self.templates: list = []
        self.builds = 0         # templates made or widened: the units built for the sizes

    def _generated(self, instance):
        from tilekit.codegen import generate

        return generate(instance, self.profile, target="cpu")

    def _sample(self, values: Mapping[str, int]):
        from tilekit.ir.dims import instantiate
        from tilekit.runtime.fold import fold_constants

        instance, _ = fold_constants(instantiate(self.module, values), self.weights)
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
        from tilekit.errors import TilekitError

        mine = abstract(kernels)
        for t in self.templates:
            if t.match(mine):
                return unit(t, kernels, records)
        for n, t in enumerate(self.templates):
            if t.structure == mine.structure:
                self.templates[n] = wider = t.widened(mine)
                self.builds += 1
                return unit(wider, kernels, records)
        samples = [mine]
        for candidates in self.sample_sizes(values):
            found = missed = 0
            for other in candidates:
                try:
                    a = abstract(self._sample(other).kernels)
                except TilekitError:  # a size the model refuses (its tables' bounds): skip
                    continue
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
        return unit(t, kernels, records)

    def program(self, instance, values: Mapping[str, int], threads: int | None = None):
        """The compiled program of `instance` (the module at `values`, folded)."""
        from tilekit.runtime.compiled import CpuProgram

        generated = self._generated(instance)
        from tilekit.ir.payloads import CodegenSection
        records = CodegenSection.read(generated.module.codegen).kernels
        return CpuProgram(generated.module, threads,
                          unit=self.unit(generated.kernels, records, values))


__all__ = ["CompiledFamily", "MISSES", "SAMPLES", "TRIES"]
