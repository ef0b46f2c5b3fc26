"""The tile IR data model: one immutable document passed between every tilekit command.

Core structure (tensors, ops, kernels) is typed. Stage payloads that later tools add (an op's
`tile`, a kernel's `estimate`, the module's `program`, `control`, `codegen`) are JSON-like data
(`dict`/`list`/scalars) owned and checked by the stage that writes them; they are never mutated
in place: a pass builds a new `Module` with `dataclasses.replace`.

Field order here is the key order in the written document (see `tilekit.ir.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from tilekit.expr.ops import DTYPES, PAD_VALUES as _PADS

__all__ = ["DTYPES", "OP_KINDS", "PAD_VALUES", "ROLES", "Kernel", "Module", "Op", "Tensor",
           "default_kernels"]

ROLES = ("input", "output", "weight", "intermediate")
#: Values an op may read where an index falls outside its tensor (see `Op.pad`).
PAD_VALUES = tuple(_PADS)
#: `control`: a loop, branch or scan whose record is in the scope's `control` section
#: (tilekit.ir.control).
OP_KINDS = ("expr", "opaque", "control")


@dataclass(frozen=True)
class Tensor:
    """A named tensor: shape, element type and role in the module. A shape entry is an
    integer, or in a symbolic module a dimension expression's text (`tilekit.ir.dims`)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    role: str = "intermediate"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Op:
    """One computation. `kind == "expr"`: a tensor-expression statement in `expr`.

    `kind == "opaque"`: a non-affine op (Gather, Resize, TopK, ...) implemented by a registry
    entry named `opaque["type"]` with `opaque["inputs"]`, `opaque["outputs"]`, `opaque["attrs"]`.

    `pad`: value read where an index map leaves its tensor ("0", "-inf", "inf"); `None` means
    an out-of-range read is an error (the verifier proves none can happen).
    `axes`: explicit extents for reduction axes that no plain index determines (pool windows).
    `origin`: the source-model node this op came from, for messages and provenance.
    `tile`: added by tk-roll.
    """

    name: str
    expr: str | None = None
    kind: str = "expr"
    pad: str | None = None
    axes: Mapping[str, int] = field(default_factory=dict)
    opaque: Mapping[str, Any] | None = None
    origin: str | None = None
    tile: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Kernel:
    """A group of ops that run as one kernel. Import makes one singleton kernel per op."""

    name: str
    ops: tuple[str, ...]
    tile: Mapping[str, Any] | None = None
    estimate: Mapping[str, Any] | None = None
    launch: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Module:
    """A whole tile-IR document."""

    model: str
    tensors: Mapping[str, Tensor]
    ops: tuple[Op, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kernels: tuple[Kernel, ...] = ()
    source: Mapping[str, Any] | None = None
    weights: Mapping[str, Any] | None = None
    hardware: str | None = None
    stages: tuple[Mapping[str, Any], ...] = ()
    program: Mapping[str, Any] | None = None
    control: Mapping[str, Any] | None = None
    codegen: Mapping[str, Any] | None = None
    #: The content hash (`Profile.content_hash`) of the profile `hardware` names, as the
    #: stage that recorded it loaded it; written as `hardware: {name, sha256}`.
    hardware_sha256: str | None = None
    #: Symbolic dimensions by name (`tilekit.ir.dims.Dim`: range, likely values); empty for
    #: a static module. Tensor shapes of a symbolic module may hold dimension expressions.
    dims: Mapping[str, Any] = field(default_factory=dict)

    # -- lookups (derived, never stored) -------------------------------------------------
    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def op_index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    def stage_names(self) -> tuple[str, ...]:
        return tuple(s["name"] for s in self.stages)

    def with_stage(self, name: str, **options: Any) -> "Module":
        """Record that stage `name` ran with `options` (sorted, JSON-like values only)."""
        entry = {"name": name}
        if options:
            entry["options"] = dict(sorted(options.items()))
        return replace(self, stages=self.stages + (entry,))


def default_kernels(ops: tuple[Op, ...]) -> tuple[Kernel, ...]:
    """The explicit default schedule: one kernel per op, named after it (`k_<op>`; an op name
    too long for the prefix is cut and numbered, so kernel names stay identifiers)."""
    from tilekit.ir.names import MAX_NAME_LENGTH

    kernels, used = [], set()
    for index, op in enumerate(ops):
        name = f"k_{op.name}"
        if len(name) > MAX_NAME_LENGTH or name in used:
            name = f"k_{op.name[:MAX_NAME_LENGTH - 12]}_{index}"
        used.add(name)
        kernels.append(Kernel(name=name, ops=(op.name,)))
    return tuple(kernels)
