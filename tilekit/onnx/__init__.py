"""ONNX import: an ONNX model becomes a tile-IR module plus a weights sidecar.

- `load_model(path)`: read and check an `.onnx` file (clear errors for a missing, truncated,
  corrupt or non-ONNX file);
- `import_model(model, name=, shapes=)`: the conversion itself (`tilekit.onnx.importer`);
- `attach_files(imported, ...)`: write the deterministic weights `.npz` and record `weights`,
  `source` and the `import` stage in the module (what `tk-import` does around the conversion);
- `reference_source(model, options)`: the source model as the import saw it, for a check
  against onnxruntime: its weights randomised as `--random-weights` did, and the values of
  the inputs that `--value` fixed.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tilekit import limits
from tilekit.errors import TilekitError
from tilekit.fileio import read_bytes
from tilekit.onnx.importer import Imported, import_model
from tilekit.outputs import OutputSet, write_npz

__all__ = ["Imported", "import_model", "load_model", "load_model_bytes", "write_weights",
           "stage_weights", "attach_files", "reference_source"]


def load_model(path: str):
    """Read an ONNX model from `path` (a TilekitError naming the file if it cannot be), at most
    `limits.MODEL_BYTES` bytes."""
    data, name = read_bytes(path, limits.MODEL_BYTES, "ONNX model")
    return load_model_bytes(data, name, folder=str(Path(path).parent) if path != "-" else None)


def load_model_bytes(data: bytes, name: str, folder: str | None = None):
    """Parse ONNX protobuf bytes; `name` is used in messages, `folder` for external data."""
    import onnx
    from google.protobuf.message import DecodeError

    if not data:
        raise TilekitError("empty file, expected an ONNX model", name)
    if data.lstrip()[:1] in (b"{", b"<") or data[:4] == b"PK\x03\x04" or data.lstrip()[:8] in (
            b"tilekit:",):
        raise TilekitError("not an ONNX model (looks like a text or archive file)", name,
                           "pass the .onnx file exported from your framework")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise TilekitError(f"cannot parse as an ONNX model (truncated or corrupt file?): "
                           f"{_first_line(exc)}", name,
                           "re-export or re-download the model") from None
    if not model.ir_version or not model.HasField("graph"):
        raise TilekitError("not an ONNX model (no IR version or no graph)", name,
                           "pass the .onnx file exported from your framework")
    _check_text(model, name)
    if not model.graph.output:
        raise TilekitError("the ONNX graph has no outputs", name,
                           "a model must declare its outputs")
    if folder is not None and _has_external_data(model):
        from onnx.external_data_helper import load_external_data_for_model
        _check_external_sizes(model, folder, name)
        try:
            load_external_data_for_model(model, folder)
        except Exception as exc:  # noqa: BLE001 - missing or unreadable external file
            raise TilekitError(f"cannot load external data: {_first_line(exc)}", name,
                               "keep the external data files next to the model") from None
    return model


def _check_text(model, name: str) -> None:
    """Every text field of the model (names, op types, domains, doc strings, in subgraphs
    too) is valid UTF-8: protobuf hands an invalid one back as bytes, which no later step
    expects. Refused with the field's place (`graph.initializer[3].name`)."""
    from google.protobuf.descriptor import FieldDescriptor

    stack = [(model, "model")]
    while stack:
        msg, where = stack.pop()
        # A tensor's fields without its data (ListFields would copy raw_data: 575 MB in VGG-19)
        fields = [(msg.DESCRIPTOR.fields_by_name[f], getattr(msg, f))
                  for f in ("name", "doc_string", "external_data")] \
            if msg.DESCRIPTOR.name == "TensorProto" else msg.ListFields()
        for field, value in fields:
            if field.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
                continue        # numbers and bytes (tensor data): nothing to decode
            at = f"{where}.{field.name}" if where != "model" else field.name
            repeated = field.is_repeated if hasattr(field, "is_repeated") else \
                field.label == FieldDescriptor.LABEL_REPEATED
            for i, v in enumerate(value if repeated else [value]):
                here = f"{at}[{i}]" if repeated else at
                if field.type == FieldDescriptor.TYPE_STRING and isinstance(v, bytes):
                    raise TilekitError(f"{here} is not valid UTF-8 text", name,
                                       "re-export the model (names must be UTF-8)")
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    stack.append((v, here))


def _check_external_sizes(model, folder: str, name: str) -> None:
    """External tensor data is read whole: what it would read (each tensor's `length`, else
    the rest of its file) must be within `limits.TOTAL_BYTES` before anything is loaded.
    (onnx itself refuses absolute paths, paths leaving the folder, links and non-files.)"""
    from onnx import TensorProto

    total = 0
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        path = os.path.join(folder, info.get("location", ""))
        try:
            size = os.stat(path).st_size if os.path.isfile(path) else 0
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else size - offset
        except (OSError, ValueError):
            continue  # onnx reports the file or the field
        total += max(0, min(length, size - offset))
        limits.TOTAL_BYTES.check(total, name, "the model's external data")


def _has_external_data(model) -> bool:
    from onnx import TensorProto
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def write_weights(path: str, weights: Mapping[str, np.ndarray]) -> str:
    """Write the weights sidecar atomically and return its sha256 (see `stage_weights`)."""
    with OutputSet() as out:
        digest = stage_weights(out, path, weights)
        out.commit()
    return digest


def stage_weights(out: OutputSet, path: str, weights: Mapping[str, np.ndarray],
                  follow_links: bool = True) -> str:
    """Stage the weights sidecar in `out` and return its sha256.

    An `.npz` readable by `numpy.load`: members `<name>.npy` in sorted name order (bfloat16
    arrays as their bit patterns in uint16: the format has no bfloat16), stored
    uncompressed with a fixed timestamp (numpy.savez stamps the current time), so the same
    weights always give the same bytes. Arrays are streamed, never copied whole; their total
    size is checked against `limits.TOTAL_BYTES` first.
    """
    where = f"--weights {path}"
    limits.TOTAL_BYTES.check(sum(int(np.asarray(w).nbytes) for w in weights.values()), where,
                             "the weights")
    digest = hashlib.sha256()
    with out.open(path, where, follow_links) as fh:
        _write_npz(fh, weights)
        fh.flush()
        fh.seek(0)
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(weights: Mapping[str, np.ndarray]) -> str:
    """The sha256 `write_weights` would record, computed in memory (nothing written)."""
    buffer = io.BytesIO()
    _write_npz(buffer, weights)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def _write_npz(fh, weights: Mapping[str, np.ndarray]) -> None:
    def stored(array) -> np.ndarray:
        array = np.asanyarray(array)
        # .npy has no bfloat16: its 16-bit patterns
        return array.view(np.uint16) if array.dtype.name == "bfloat16" else array
    write_npz(fh, {name: stored(weights[name]) for name in sorted(weights)})


def _relative(path: str, folder: str) -> str:
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(folder))).as_posix()


def attach_files(imported: Imported, *, ir_folder: str, weights_path: str,
                 onnx_path: str | None, onnx_sha256: str,
                 options: Mapping[str, Any], outputs: OutputSet | None = None,
                 follow_links: bool = True, write: bool = True) -> Imported:
    """Write the weights sidecar (when there are weights; staged in `outputs` when given, for
    the caller to commit with the IR; with `write=False` only its checksum is computed) and
    record in the module `source` and `weights` (paths relative to `ir_folder`, checksums) and
    the `import` stage."""
    module = imported.module
    source = {"onnx": _relative(onnx_path, ir_folder)} if onnx_path else {}
    source["sha256"] = onnx_sha256
    source.update(module.source or {})
    weights_ref = None
    if imported.weights:
        if not write:
            digest = weights_sha256(imported.weights)
        elif outputs is None:
            digest = write_weights(weights_path, imported.weights)
        else:
            digest = stage_weights(outputs, weights_path, imported.weights, follow_links)
        weights_ref = {"file": _relative(weights_path, ir_folder), "sha256": digest}
    module = replace(module, source=source, weights=weights_ref)
    module = module.with_stage("import", **dict(options))
    return Imported(module, imported.weights, imported.warnings)


def reference_source(model, options: Mapping[str, Any]):
    """(the ONNX model as the import converted it, {input name: fixed value}) from the
    import stage's `options`: `random_weights` gives the model the same random weights,
    `values` the arrays `--value` fixed (the inputs onnxruntime must be fed besides the
    IR's own). Raises TilekitError when a recorded value no longer fits the model."""
    from tilekit.onnx.fold import type_of
    from tilekit.onnx.dtypes import ONNX_DTYPES
    from tilekit.onnx.importer import fixed_array
    from tilekit.onnx.names import sanitize

    seed = options.get("random_weights")
    if seed is not None:
        from tilekit.onnx.random_weights import randomize

        model = randomize(model, int(seed))
    feeds: dict[str, np.ndarray] = {}
    inputs = {vi.name: vi for vi in model.graph.input}
    by_sanitized = {sanitize(n): n for n in inputs}
    for key, raw in sorted((options.get("values") or {}).items()):
        name = key if key in inputs else by_sanitized.get(key)
        typ = type_of(inputs[name]) if name is not None else None
        if typ is None or typ[1] not in ONNX_DTYPES:
            raise TilekitError(f"the import fixed input '{key}', which the source model does "
                               "not have", "source", "re-run tk-import")
        feeds[name] = fixed_array(raw, typ[0], ONNX_DTYPES[typ[1]], name,
                                  f"--value {key}")
    return model, feeds
