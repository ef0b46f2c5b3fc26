"""Values a module computes from its weights alone, computed once before its runs.

An import for one size folds every value that does not depend on the inputs (position
ranges, causal masks, shapes) into weights. A symbolic module cannot: those values depend
on the sizes, so it keeps them as ops (`tilekit.onnx.symbolic`), and an instance at some
sizes (`tilekit.ir.dims.instantiate`) would compute them again at every run.
`fold_constants(module, weights)` computes them once, with the reference executor: every op
whose reads are all weights or results of such ops is run, and the results that the rest of
the module reads become weights; those ops are dropped. What is left computes what the
module computed, as the module imported for those sizes does.
A general Gather whose indices were folded and form an index map (a constant, a progression,
a grid: `tilekit.onnx.text.affine_index`) becomes that expression op, as the importer writes
it for constant indices.

Ops that write a module output stay (a run produces its outputs), as does a module that
already has generated code (`codegen`: its kernels were made for the ops as they are).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from tilekit.ir.graph import op_tensors
from tilekit.ir.model import Module, Op, Tensor


def foldable_ops(module: Module) -> list[int]:
    """Indices of the ops whose reads are all weights or written by foldable ops."""
    return _foldable(module, _tensors_of(module))


def _tensors_of(module: Module) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(reads, writes) of every op, in order (a control op's: none; it never folds)."""
    return [((), ()) if op.kind == "control" else op_tensors(op, module.control)
            for op in module.ops]


def _foldable(module: Module, rw) -> list[int]:
    constant = {n for n, t in module.tensors.items() if t.role == "weight"}
    outputs = set(module.outputs)
    out = []
    for index, op in enumerate(module.ops):
        reads, writes = rw[index]
        if op.kind != "control" and set(reads) <= constant and not set(writes) & outputs:
            constant.update(writes)
            out.append(index)
    return out


def fold_constants(module: Module, weights: Mapping[str, np.ndarray]
                   ) -> tuple[Module, dict[str, np.ndarray]]:
    """(`module` without its foldable ops, `weights` with the values they computed that the
    rest reads); the module and weights unchanged when nothing folds."""
    from tilekit.runtime.cpu import prepare

    if module.codegen is not None:
        return module, dict(weights)
    rw = _tensors_of(module)
    folded = set(_foldable(module, rw))
    if not folded:
        return module, dict(weights)
    made = {n for i in folded for n in rw[i][1]}
    kept = [i for i in range(len(module.ops)) if i not in folded]
    needed = tuple(dict.fromkeys(n for i in kept for n in rw[i][0] if n in made))
    touched = {n for i in folded for part in rw[i] for n in part}
    sub = Module(model=module.model, ops=tuple(module.ops[i] for i in sorted(folded)),
                 inputs=(), outputs=needed,
                 tensors={n: t for n, t in module.tensors.items() if n in touched})
    values = dict(prepare(sub).run({}, weights, mode="whole")) if needed else {}
    kept_ops, unread = _gathers_as_maps(module, tuple(module.ops[i] for i in kept), values)
    for name in unread:
        del values[name]
    tensors = {name: Tensor(t.shape, t.dtype, "weight") if name in values else t
               for name, t in module.tensors.items() if name not in made or name in values}
    dropped = {module.ops[i].name for i in folded}
    kernels = tuple(replace(k, ops=tuple(o for o in k.ops if o not in dropped))
                    for k in module.kernels if set(k.ops) - dropped)
    out = dict(weights)
    # (np.ascontiguousarray alone makes a 0-d value 1-d)
    out.update({n: np.ascontiguousarray(v).reshape(np.shape(v)) for n, v in values.items()})
    return replace(module, ops=kept_ops, tensors=tensors, kernels=kernels), out


def _gathers_as_maps(module: Module, ops: tuple[Op, ...], values: Mapping[str, np.ndarray]
                     ) -> tuple[tuple[Op, ...], list[str]]:
    """`ops` with every opaque Gather whose indices are now folded values that an index map
    can read (`tilekit.onnx.text.affine_index`: a constant, a progression, a grid) as that
    expression op, as an import for one size writes it; the folded values no op reads any
    more."""
    from tilekit.onnx import text

    out = []
    for op in ops:
        spec = op.opaque or {}
        inputs = list(spec.get("inputs", ()))
        if op.kind == "opaque" and spec.get("type") == "Gather" and len(inputs) == 2 \
                and inputs[1] in values and len(spec.get("outputs", ())) == 1:
            x, y = inputs[0], spec["outputs"][0]
            axis = int((spec.get("attrs") or {}).get("axis", 0))
            shape = module.tensors[x].shape
            ax = text.axes(len(module.tensors[y].shape))
            read = text.gather_access(x, shape[axis], axis, values[inputs[1]], ax) \
                if 0 <= axis < len(shape) else None
            if read is not None:
                op = Op(op.name, f"{text.access(y, ax)} = {read}", origin=op.origin)
        out.append(op)
    read = {n for op in out for n in op_tensors(op, module.control)[0]}
    return tuple(out), [n for n in values if n not in read]
