"""The operator suite of specs/workloads.yaml: Roller-style single-op workloads as modules.

    from tilekit.roll.workloads import load_workloads
    for w in load_workloads():
        rolled = roll_module(w.module(), load_profile("h100"))

Each workload becomes a one-op module (its output `role: output`, every other tensor an
input) recorded as imported from the suite, so tk-roll, the tests and the benchmark treat it
like any imported model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from tilekit.errors import TilekitError
from tilekit.expr import parse
from tilekit.ir.model import Module, Op, Tensor, default_kernels
from tilekit.resources import shipped

SUITE = shipped("specs") / "workloads.yaml"
KEYS = ("name", "source", "expr", "tensors", "pad", "axes", "dtype")


@dataclass(frozen=True)
class Workload:
    name: str
    expr: str
    tensors: Mapping[str, tuple[int, ...]]
    source: str = ""
    pad: str | None = None
    axes: Mapping[str, int] = field(default_factory=dict)
    dtype: str = "float32"

    def module(self) -> Module:
        """A one-op module that tk-roll accepts (stage `import` from the suite)."""
        out = parse(self.expr).output.tensor
        tensors = {name: Tensor(tuple(shape), self.dtype,
                                "output" if name == out else "input")
                   for name, shape in self.tensors.items()}
        ops = (Op(self.name, self.expr, pad=self.pad, axes=dict(self.axes)),)
        return Module(model=self.name, tensors=tensors, ops=ops,
                      inputs=tuple(n for n in tensors if n != out), outputs=(out,),
                      kernels=default_kernels(ops),
                      stages=({"name": "import", "options": {"from": "workloads"}},))


def load_workloads(path: str | Path | None = None) -> list[Workload]:
    """Every workload of the suite file (default: specs/workloads.yaml), in file order."""
    path = Path(path) if path else SUITE
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TilekitError(f"cannot read the workload suite: {exc}", str(path)) from None
    entries = doc.get("workloads") if isinstance(doc, Mapping) else None
    if not isinstance(entries, list):
        raise TilekitError("expected a mapping with a 'workloads' list", str(path))
    out = []
    for i, entry in enumerate(entries):
        where = f"{path.name}: workloads[{i}]"
        if not isinstance(entry, Mapping) or not {"name", "expr", "tensors"} <= set(entry):
            raise TilekitError("each workload needs name, expr and tensors", where)
        unknown = set(entry) - set(KEYS)
        if unknown:
            raise TilekitError(f"unknown keys {sorted(unknown)}", where,
                               f"known: {', '.join(KEYS)}")
        out.append(_workload(entry))
    names = [w.name for w in out]
    if len(set(names)) != len(names):
        raise TilekitError("workload names must be unique", str(path))
    return out


def _workload(entry: Mapping[str, Any]) -> Workload:
    return Workload(name=entry["name"], expr=entry["expr"],
                    tensors={k: tuple(v) for k, v in entry["tensors"].items()},
                    source=entry.get("source", ""), pad=entry.get("pad"),
                    axes=dict(entry.get("axes") or {}), dtype=entry.get("dtype", "float32"))
