"""The parts of a tile IR document, one at a time: tensors, ops and kernels to and from
plain data, and the written form's building blocks (one-line lists and mappings, sorted
payloads, omitted defaults).

`tilekit.ir.codec` writes and reads whole documents with these; `tilekit.ir.control` writes and
reads the tensors, ops and kernels of a region (inside the `control` payload) with the same
functions, so a region's op reads and writes exactly like a module's.
"""

from __future__ import annotations

from typing import Any, Mapping

from tilekit.errors import IRError
from tilekit.ir.keys import (KERNEL_KEYS, OP_KEYS, OPAQUE_KEYS, TENSOR_KEYS, TENSOR_REQUIRED,
                             key_problem, type_name, where)
from tilekit.ir.model import Kernel, Op, Tensor


class _FlowList(list):
    """A list written on one line: `[1, 3, 224, 224]`."""


class _FlowDict(dict):
    """A mapping written on one line: `{shape: [4, 8], dtype: float32}`."""


# -- parts -> data -------------------------------------------------------------------------

def _payload(value: Any) -> Any:
    """Free-form data: mapping keys sorted, lists of scalars on one line."""
    if isinstance(value, Mapping):
        return {k: _payload(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        items = [_payload(v) for v in value]
        if all(not isinstance(v, (dict, list)) for v in items):
            return _FlowList(items)
        return items
    return value


def _put(out: dict[str, Any], key: str, value: Any, default: Any = None) -> None:
    """Set `key` unless `value` is the field's default (omitted fields read back as it)."""
    if value is None or value == default:
        return
    out[key] = value


def _known_first(value: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """A typed mapping's keys in their documented order, any others after, sorted."""
    keys = [k for k in known if k in value] + sorted(k for k in value if k not in known)
    return {k: value[k] for k in keys}


def _tensor_doc(tensor: Tensor) -> dict[str, Any]:
    out = _FlowDict(shape=_FlowList(tensor.shape), dtype=tensor.dtype)
    _put(out, "role", tensor.role, default="intermediate")
    return out


def _op_doc(op: Op) -> dict[str, Any]:
    out: dict[str, Any] = {"name": op.name}
    _put(out, "expr", op.expr)
    _put(out, "kind", op.kind, default="expr")
    _put(out, "pad", op.pad)
    _put(out, "axes", _FlowDict((k, op.axes[k]) for k in sorted(op.axes)), default={})
    if op.opaque is not None:
        out["opaque"] = {k: _payload(v) for k, v in _known_first(op.opaque, OPAQUE_KEYS).items()}
    _put(out, "origin", op.origin)
    _put(out, "tile", None if op.tile is None else _payload(op.tile))
    return out


def _kernel_doc(kernel: Kernel) -> dict[str, Any]:
    out: dict[str, Any] = {"name": kernel.name, "ops": _FlowList(kernel.ops)}
    for key in ("tile", "estimate", "launch"):
        value = getattr(kernel, key)
        _put(out, key, None if value is None else _payload(value))
    return out


def _plain(value: Any) -> Any:
    """A written part as JSON data (plain dicts and lists): how a region inside a payload
    holds its tensors, ops and kernels (tilekit.ir.control)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def op_document(op: Op) -> dict[str, Any]:
    """An op as JSON data, as the document writes it."""
    return _plain(_op_doc(op))


def tensor_document(tensor: Tensor) -> dict[str, Any]:
    return _plain(_tensor_doc(tensor))


def kernel_document(kernel: Kernel) -> dict[str, Any]:
    return _plain(_kernel_doc(kernel))


#: A control record's keys in written order (tilekit.ir.control), then a region's.
CONTROL_KEYS = ("kind", "trip_count", "cond", "max_trips", "count", "carried", "scan_inputs",
                "input_axes", "input_reverse", "outputs", "scans", "output_axes",
                "output_reverse", "grind", "body", "then", "else")
REGION_KEYS = ("inputs", "outputs", "tensors", "ops", "kernels", "control")


def _control_doc(control: Any) -> Any:
    """A `control` section as the document writes it: records and regions in their keys'
    order, region tensors and ops as the module's are written (tensors on one line), payloads
    (`grind`) sorted. Anything malformed is written as plain sorted data (the verifier
    reports it)."""
    if not isinstance(control, Mapping):
        return _payload(control)
    out = {}
    for name, rec in control.items():
        if not isinstance(rec, Mapping):
            out[name] = _payload(rec)
            continue
        doc = {}
        for key, value in _known_first(rec, CONTROL_KEYS).items():
            doc[key] = (_region_doc(value) if key in ("body", "then", "else")
                        else _payload(value))
        out[name] = doc
    return out


def _region_doc(region: Any) -> Any:
    if not isinstance(region, Mapping):
        return _payload(region)
    doc = {}
    for key, value in _known_first(region, REGION_KEYS).items():
        if key == "tensors" and isinstance(value, Mapping):
            doc[key] = {n: _FlowDict(_known_first(t, ("shape", "dtype", "role")),
                                     **({"shape": _FlowList(t["shape"])}
                                        if isinstance(t.get("shape"), list) else {}))
                        if isinstance(t, Mapping) else _payload(t) for n, t in value.items()}
        elif key in ("ops", "kernels") and isinstance(value, list):
            order = OP_KEYS if key == "ops" else KERNEL_KEYS
            doc[key] = [{k: (v if k == "name" else _payload(v)) for k, v in
                         _known_first(item, order).items()} if isinstance(item, Mapping)
                        else _payload(item) for item in value]
        elif key == "control":
            doc[key] = _control_doc(value)
        else:
            doc[key] = _payload(value)
    return doc


# -- data -> parts -------------------------------------------------------------------------

class _Reader:
    def __init__(self, origin: str | None):
        self.origin = origin

    def fail(self, path: str, what: str, hint: str | None = None) -> IRError:
        return IRError(what, where(self.origin, path), hint)

    def mapping(self, value: Any, path: str, what: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"{what} must be a mapping, got {type_name(value)}")
        return value

    def list_(self, value: Any, path: str, what: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, f"{what} must be a list, got {type_name(value)}")
        return value

    def keys(self, value: Mapping[str, Any], path: str, known: tuple[str, ...],
             required: tuple[str, ...]) -> None:
        problem = key_problem(value, path, known, required)
        if problem:
            raise self.fail(*problem)

    def tensor(self, value: Any, path: str) -> Tensor:
        self.mapping(value, path, "a tensor")
        self.keys(value, path, TENSOR_KEYS, TENSOR_REQUIRED)
        shape = self.list_(value["shape"], f"{path}.shape", "a shape")
        return Tensor(shape=tuple(shape), dtype=value["dtype"],
                      role=value.get("role", "intermediate"))

    def op(self, value: Any, path: str) -> Op:
        self.mapping(value, path, "an op")
        self.keys(value, path, OP_KEYS, ("name",))
        axes = value.get("axes")
        if axes is not None:
            self.mapping(axes, f"{path}.axes", "'axes'")
        opaque = value.get("opaque")
        if opaque is not None:
            self.mapping(opaque, f"{path}.opaque", "'opaque'")
            self.keys(opaque, f"{path}.opaque", OPAQUE_KEYS, ("type", "inputs", "outputs"))
        pad = value.get("pad")
        if pad == 0 and not isinstance(pad, bool):
            pad = "0"  # `pad: 0` unquoted reads as an integer; it means the same
        return Op(name=value["name"], expr=value.get("expr"), kind=value.get("kind", "expr"),
                  pad=pad, axes=dict(axes or {}), opaque=opaque, origin=value.get("origin"),
                  tile=value.get("tile"))

    def kernel(self, value: Any, path: str) -> Kernel:
        self.mapping(value, path, "a kernel")
        self.keys(value, path, KERNEL_KEYS, ("name", "ops"))
        ops = self.list_(value["ops"], f"{path}.ops", "a kernel's 'ops'")
        return Kernel(name=value["name"], ops=tuple(ops), tile=value.get("tile"),
                      estimate=value.get("estimate"), launch=value.get("launch"))



def decode_tensor(value: Any, path: str, origin: str | None = None) -> Tensor:
    """A tensor declaration read from plain data at IR path `path` (structure only)."""
    return _Reader(origin).tensor(value, path)


def decode_op(value: Any, path: str, origin: str | None = None) -> Op:
    return _Reader(origin).op(value, path)


def decode_kernel(value: Any, path: str, origin: str | None = None) -> Kernel:
    return _Reader(origin).kernel(value, path)
