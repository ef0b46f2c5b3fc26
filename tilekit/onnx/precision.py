"""`tk-import --dtype float16|bfloat16`: a float32 model imported in half precision.

The conversion is a pure function of an imported module and its weights:

- every float32 tensor (inputs, outputs, weights, intermediates) becomes `dtype`; integer,
  bool and float64 tensors keep their types;
- the weights are cast once, here (round to nearest even), so the sidecar holds half values
  and no later stage casts them again;
- explicit casts to float32 in expressions (ONNX `Cast(to=FLOAT)`) become casts to `dtype`, so
  the model computes in one precision throughout;
- opaque ops keep their records: their outputs' types follow their inputs'.

What stays float32 is the arithmetic: the expression language computes every half-typed
value in float32 and rounds once, on store (specs/expressions.md, "Precision"). The import
stage records `dtype` and `accumulate: float32` so the IR says so.

`tk-run --check` compares a half module with onnxruntime running the float32 source model,
with the tolerances of `tilekit.runtime.check.SOURCE_TOLERANCES` (the error of storing every
intermediate in half, not of one rounding); docs/run.md gives the figures behind them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from tilekit.errors import TilekitError, excerpt
from tilekit.expr.ast import Access, Binary, Call, Node, Unary, format_statement
from tilekit.expr.ops import HALF_DTYPES, numpy_dtype
from tilekit.expr.parser import parse
from tilekit.ir.control import control_section, read_control
from tilekit.ir.model import Op
from tilekit.onnx.importer import Imported

#: What `--dtype` accepts; float32 is the identity.
IMPORT_DTYPES = ("float32",) + HALF_DTYPES
#: Other spellings `--dtype` accepts (tk-roll's `--precision` and the hardware profiles
#: say fp16 / bf16 / fp32), each meaning one of IMPORT_DTYPES.
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32",
                 "fp16": "float16", "f16": "float16", "half": "float16",
                 "bf16": "bfloat16"}


def canonical_dtype(dtype: str) -> str:
    """`dtype` as one of IMPORT_DTYPES (aliases resolved, case ignored); refused otherwise."""
    key = str(dtype).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in IMPORT_DTYPES:
        shown = ", ".join(IMPORT_DTYPES + tuple(DTYPE_ALIASES))
        raise TilekitError(f"unknown dtype '{excerpt(str(dtype), 40, quote=False)}'",
                           "--dtype", f"choose one of {shown}")
    return key


def to_precision(imported: Imported, dtype: str) -> Imported:
    """`imported` with its float32 tensors, weights and casts in `dtype` (module docstring;
    the aliases of `canonical_dtype` accepted)."""
    dtype = canonical_dtype(dtype)
    if dtype == "float32":
        return imported
    module = imported.module
    weights = {name: _cast_array(array, dtype) if module.tensors[name].dtype == "float32"
               else array for name, array in imported.weights.items()}
    return replace(imported, module=_scope_in(module, dtype), weights=weights)


def _scope_in(scope, dtype: str):
    """A module or a control op's region with its float32 tensors and its ops in `dtype`,
    nested regions too (a loop body computes in the precision of the model around it)."""
    tensors = {name: replace(t, dtype=dtype) if t.dtype == "float32" else t
               for name, t in scope.tensors.items()}
    ops = tuple(_op_in(op, dtype) for op in scope.ops)
    records = read_control(scope.control)
    control = control_section({
        name: rec.with_regions(tuple(_scope_in(r, dtype) for r in rec.regions))
        for name, rec in records.items()}) if records else scope.control
    return replace(scope, tensors=tensors, ops=ops, control=control)


def _op_in(op: Op, dtype: str) -> Op:
    if op.kind != "expr" or not op.expr or "float32(" not in op.expr:
        return op
    stmt = parse(op.expr)
    body = _recast(stmt.body, dtype)
    return replace(op, expr=format_statement(replace(stmt, body=body)))


def _recast(node: Node, dtype: str) -> Node:
    """`node` with every `float32(...)` cast turned into `dtype(...)`."""
    if isinstance(node, Call):
        args = tuple(_recast(a, dtype) for a in node.args)
        return replace(node, fn=dtype if node.fn == "float32" else node.fn, args=args)
    if isinstance(node, Binary):
        return replace(node, lhs=_recast(node.lhs, dtype), rhs=_recast(node.rhs, dtype))
    if isinstance(node, Unary):
        return replace(node, arg=_recast(node.arg, dtype))
    if isinstance(node, Access):
        return replace(node, indices=tuple(_recast(i, dtype) for i in node.indices))
    return node


def _cast_array(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 weight as `dtype` (round to nearest even; bfloat16 through ml_dtypes)."""
    return np.asarray(array, dtype=np.float32).astype(numpy_dtype(dtype))


def import_options(dtype: str) -> Mapping[str, str]:
    """What the import stage records for `--dtype` (nothing for float32)."""
    dtype = canonical_dtype(dtype)
    return {} if dtype == "float32" else {"dtype": dtype, "accumulate": "float32"}
