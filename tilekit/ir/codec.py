"""Reading and writing tile IR documents: the one place that knows YAML and JSON.

`loads` turns text into a `Module` and checks the document's *structure*: the version key,
which keys a mapping may hold, and whether each field is a mapping, a list or a scalar. It
does not judge values (a dtype's spelling, a shape's sign, an expression): that is
`tilekit.ir.verify`, which also runs on modules built in code. `read_module` and
`write_module` do both, so a tool never reads or writes a document that breaks the rules.

Determinism (see docs/ir.md): keys in the order of the `tilekit.ir.model` dataclass fields, fields that
hold their default omitted, free-form stage payloads with sorted keys, tensors in declaration
order, floats written with `repr` so they read back exactly. The same module gives the same
bytes.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

import yaml

from tilekit import IR_VERSION, textdoc
from tilekit.fileio import read_input_text
from tilekit.outputs import write_output
from tilekit.errors import IRError
from tilekit.ir.keys import (HARDWARE_KEYS, MODULE_KEYS, MODULE_REQUIRED, STAGE_KEYS,
                             WEIGHTS_KEYS, key_path, type_name, where)
from tilekit.limits import LimitError
from tilekit.ir.model import Module
from tilekit.ir.parts import (_FlowDict, _FlowList, _kernel_doc, _known_first, _op_doc,
                              _payload, _put, _Reader, _tensor_doc, _control_doc)

FORMATS = ("yaml", "json")


# -- YAML dialect ------------------------------------------------------------------------
# We read YAML 1.2 core scalars through `tilekit.textdoc` (no `yes`/`no` booleans, no
# timestamps, no octal `010`, `1e-5` is a float; no aliases, no tags, bounded nesting) and
# write strings quoted wherever a YAML 1.1 *or* 1.2 reader could take them for something
# else, so what we write reads the same in any YAML library.

_FLOAT_12 = textdoc.FLOAT_12


class _Dumper(yaml.SafeDumper):
    """Block style, sequences indented under their key, no anchors or aliases."""

    def ignore_aliases(self, data):
        return True

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


# YAML 1.1 resolvers stay (so `yes`, `2020-01-01`, `010` are quoted); add 1.2 floats such as
# `1e5`, which 1.1 reads as a string but 1.2 as a number.
_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def _represent_str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    # PyYAML writes NEL and the Unicode line/paragraph separators raw inside single quotes,
    # where its own reader folds them into spaces: double quotes escape them (\N, \L, \P).
    # Multi-line text (kernel sources) reads best as a literal block; PyYAML falls back to a
    # quoted style by itself where a block cannot hold the text exactly.
    if any(c in value for c in "\x85\u2028\u2029"):
        style = '"'
    elif "\n" in value.rstrip("\n"):
        style = "|"
    else:
        style = None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(
    _FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
_Dumper.add_representer(
    _FlowDict, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(),
                                                flow_style=True))
_Dumper.add_representer(
    dict, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=False))
_Dumper.add_representer(
    list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=False))


# -- parsing text ------------------------------------------------------------------------

def detect_format(text: str) -> str:
    """`json` when the first non-blank character is `{`, else `yaml`."""
    return "json" if text.lstrip().startswith("{") else "yaml"


def _parse_json(text: str, origin: str) -> Any:
    return textdoc.load_json(text, origin, IRError,
                             "the document starts with '{' so it is read as JSON")


def _parse_yaml(text: str, origin: str) -> Any:
    docs = textdoc.load_yaml(text, origin, IRError)
    if len(docs) > 1:
        raise IRError(f"{len(docs)} YAML documents in one input, expected one", origin,
                      "a pipe carries one tile IR document; remove the '---' separators")
    return docs[0] if docs else None


# -- document -> Module (structure only) --------------------------------------------------

class _Decoder(_Reader):
    """Builds the dataclasses from a parsed document, checking containers and keys (the
    parts, tensors, ops and kernels, as `tilekit.ir.parts` reads them)."""

    def module(self, doc: Any) -> Module:
        if doc is None:
            raise self.fail("", "empty document, expected a tile IR mapping",
                            "did the command before this one in the pipe fail?")
        self.mapping(doc, "", "the document")
        check_version(doc, self.origin)
        self.keys(doc, "", MODULE_KEYS, MODULE_REQUIRED)
        tensors = self.mapping(doc["tensors"], "tensors", "'tensors'")
        ops = self.list_(doc["ops"], "ops", "'ops'")
        kernels = doc.get("kernels")
        stages = doc.get("stages")
        return Module(
            model=doc["model"],
            tensors={name: self.tensor(t, key_path("tensors", name))
                     for name, t in tensors.items()},
            ops=tuple(self.op(o, f"ops[{i}]") for i, o in enumerate(ops)),
            inputs=tuple(self.list_(doc["inputs"], "inputs", "'inputs'")),
            outputs=tuple(self.list_(doc["outputs"], "outputs", "'outputs'")),
            kernels=() if kernels is None else tuple(
                self.kernel(k, f"kernels[{i}]")
                for i, k in enumerate(self.list_(kernels, "kernels", "'kernels'"))),
            source=doc.get("source"),
            weights=self.weights(doc.get("weights")),
            hardware=self.hardware(doc.get("hardware"))[0],
            hardware_sha256=self.hardware(doc.get("hardware"))[1],
            stages=() if stages is None else tuple(
                self.stage(s, f"stages[{i}]")
                for i, s in enumerate(self.list_(stages, "stages", "'stages'"))),
            program=doc.get("program"),
            control=doc.get("control"),
            codegen=doc.get("codegen"),
            dims=self.dims(doc),
        )

    def dims(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """The `dims` section (format 2): symbols with their ranges."""
        if "dims" not in doc:
            return {}
        if doc["tilekit"] < 2:
            raise self.fail("dims", "'dims' (symbolic dimensions) needs tile IR format 2",
                            "write 'tilekit: 2'")
        from tilekit.ir.dims import read_dims
        return read_dims(doc["dims"], "dims", self.origin)

    def stage(self, value: Any, path: str) -> Mapping[str, Any]:
        self.mapping(value, path, "a stage entry")
        self.keys(value, path, STAGE_KEYS, ("name",))
        return value

    def hardware(self, value: Any) -> tuple[Any, Any]:
        """(name, sha256) of `hardware`: a profile name or path, or `{name, sha256}` (the
        profile's content hash, checked by the stages that load it)."""
        if not isinstance(value, Mapping):
            return value, None
        self.keys(value, "hardware", HARDWARE_KEYS, HARDWARE_KEYS)
        return value["name"], value["sha256"]

    def weights(self, value: Any) -> Mapping[str, Any] | None:
        if value is None:
            return None
        self.mapping(value, "weights", "'weights'")
        self.keys(value, "weights", WEIGHTS_KEYS, WEIGHTS_KEYS)
        return value


def check_version(doc: Mapping[str, Any], origin: str | None) -> None:
    """Refuse a document without `tilekit: <int>` or of another major version."""
    loc = where(origin, "tilekit")
    if "tilekit" not in doc:
        raise IRError("missing the 'tilekit' format version key", loc,
                      f"a tile IR document starts with 'tilekit: {IR_VERSION}'; "
                      "is this a tile IR document?")
    version = doc["tilekit"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise IRError(f"format version must be an integer, got {type_name(version)} "
                      f"{version!r}", loc, f"write 'tilekit: {IR_VERSION}'")
    if version > IR_VERSION:
        raise IRError(f"tile IR format {version} is newer than this tilekit "
                      f"(reads 1..{IR_VERSION})", loc, "upgrade tilekit")
    if version < 1:
        raise IRError(f"tile IR format {version} is not one this tilekit reads "
                      f"(reads 1..{IR_VERSION})", loc,
                      "re-create the document with this tilekit's tk-import")


def loads(text: str, origin: str = "<stdin>") -> Module:
    """Parse a YAML or JSON tile IR document into a `Module`.

    Checks the version and the document's structure (mappings, lists, known keys); call
    `verify` (or use `read_module`) for the values and invariants. Raises `IRError` located
    as `<origin>:<line>:<col>` for syntax errors and `<origin>: <ir.path>` otherwise.
    """
    return _Decoder(origin).module(parse_document(text, origin))


def parse_document(text: str, origin: str = "<stdin>") -> Any:
    """The plain data (dicts, lists, scalars) of a YAML or JSON text, before any IR check.

    Syntax errors, duplicate keys and several YAML documents raise `IRError`.
    """
    return _parse_json(text, origin) if detect_format(text) == "json" else _parse_yaml(text, origin)


# -- Module -> document ------------------------------------------------------------------

def to_document(module: Module) -> dict[str, Any]:
    """The plain (dict/list/scalar) document for `module`, keys in written order."""
    # Format 2 adds symbolic dimensions; a static module is written as format 1, which
    # every tilekit since the first reads.
    doc: dict[str, Any] = {"tilekit": written_version(module), "model": module.model}
    _put(doc, "source", None if module.source is None else _payload(module.source))
    _put(doc, "weights", None if module.weights is None else
         _known_first(module.weights, WEIGHTS_KEYS))
    _put(doc, "hardware", {"name": module.hardware, "sha256": module.hardware_sha256}
         if module.hardware is not None and module.hardware_sha256 is not None
         else module.hardware)
    _put(doc, "stages", [_stage_doc(s) for s in module.stages], default=[])
    if module.dims:
        from tilekit.ir.dims import dims_document
        doc["dims"] = {n: _FlowDict(v) for n, v in dims_document(module.dims).items()}
    doc["inputs"] = _FlowList(module.inputs)
    doc["outputs"] = _FlowList(module.outputs)
    doc["tensors"] = {name: _tensor_doc(t) for name, t in module.tensors.items()}
    doc["ops"] = [_op_doc(op) for op in module.ops]
    _put(doc, "kernels", [_kernel_doc(k) for k in module.kernels], default=[])
    for key in ("program", "control", "codegen"):
        value = getattr(module, key)
        writer = _control_doc if key == "control" else _payload
        _put(doc, key, None if value is None else writer(value))
    return doc


def written_version(module: Module) -> int:
    """The lowest format that holds `module`: 2 with symbolic dimensions, else 1."""
    return 2 if module.dims else 1


def _stage_doc(stage: Mapping[str, Any]) -> dict[str, Any]:
    out = _known_first(stage, STAGE_KEYS)
    if "options" in out:
        out["options"] = _payload(out["options"])
    return out


def _json_text(value: Any, indent: str = "") -> str:
    """Indented JSON with the same one-line parts as the YAML form."""
    inner = indent + "  "
    if isinstance(value, _FlowDict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_json_text(v, inner)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, _FlowList):
        return "[" + ", ".join(_json_text(v, inner) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_json_text(v, inner)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + _json_text(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def dumps(module: Module, fmt: str = "yaml") -> str:
    """Write `module` as YAML (default) or JSON text. Deterministic: same module, same bytes.

    Does not verify; `write_module` does. Non-finite floats cannot be written as JSON.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown IR format {fmt!r}; choose from {', '.join(FORMATS)}")
    doc = to_document(module)
    if fmt == "json":
        return _json_text(doc) + "\n"
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                     default_flow_style=False, width=1 << 30, indent=2)


# -- files -------------------------------------------------------------------------------

def read_module(path: str = "-") -> Module:
    """Read, parse and verify a tile IR document from a file or `-` (stdin).

    The document and the files it names (`referenced_files`) are noted as inputs of the
    running command, which never writes over them."""
    from tilekit.fileio import note_input
    from tilekit.ir.verify import verify

    text, name = read_input_text(path, "IR")
    module = loads(text, origin=name)
    verify(module, origin=name)
    for ref in referenced_files(module, path):
        note_input(ref)
    return module


def document_folder(ir_path: str | None) -> str:
    """The folder relative paths in an IR document are relative to: the document's own, or
    the working directory when it came through stdin (or goes to stdout)."""
    if not ir_path or ir_path in ("-", "<stdin>", "<output>"):
        return os.getcwd()
    return os.path.dirname(os.path.abspath(ir_path))


def referenced_files(module: Module, ir_path: str | None) -> list[str]:
    """The files `module` names (weights sidecar, source model, a profile given by path),
    resolved as the tools resolve them (see `document_folder`)."""
    from tilekit.ir.names import is_profile_path

    folder = document_folder(ir_path)
    refs = [(module.weights or {}).get("file"), (module.source or {}).get("onnx")]
    if isinstance(module.hardware, str) and is_profile_path(module.hardware):
        refs.append(module.hardware)
    return [os.path.join(folder, r) for r in refs if isinstance(r, str) and r
            and "\x00" not in r]


def rebase_files(module: Module, source: Module, from_ir: str | None,
                 to_ir: str | None) -> Module:
    """`module`, made from `source` (read from the document `from_ir`), with the relative
    paths of the files it carries over from `source` unchanged (weights sidecar, source
    model, a profile given by path) rewritten for a document written to `to_ir` (`-`:
    stdout, relative to the working directory): a stage writing into another folder keeps
    its output runnable. A path the stage wrote itself is already relative to `to_ir`."""
    from dataclasses import replace

    from tilekit.ir.names import is_profile_path

    src, dst = document_folder(from_ir), document_folder(to_ir)
    if src == dst:
        return module

    def moved(rel):
        if not isinstance(rel, str) or not rel or "\x00" in rel or os.path.isabs(rel):
            return rel
        return os.path.relpath(os.path.join(src, rel), dst)

    changes: dict[str, Any] = {}
    for key, field in (("weights", "file"), ("source", "onnx")):
        ref = getattr(module, key)
        if isinstance(ref, Mapping) and isinstance(ref.get(field), str) and \
                ref == getattr(source, key):
            changes[key] = {**ref, field: moved(ref[field])}
    if isinstance(module.hardware, str) and is_profile_path(module.hardware) and \
            module.hardware == source.hardware:
        changes["hardware"] = moved(module.hardware)
    return replace(module, **changes)


class InvalidOutputError(RuntimeError):
    """A tool built a module that fails verification: a bug in the tool, not bad input."""


def write_module(module: Module, output: str = "-", fmt: str | None = None,
                 input_path: str | Iterable[str | None] | None = None,
                 outputs: Any = None) -> None:
    """Verify `module`, then write it to `output` (`-` is stdout; files atomically), or stage
    it in `outputs` (a `tilekit.outputs.OutputSet` the caller commits with its other files).

    `fmt` is `yaml` (the default) or `json`. An invalid module is never written: that raises
    `InvalidOutputError`, which commands report as an internal error (exit 1).
    """
    from tilekit.ir.verify import verify

    try:
        verify(module, origin="<output>")
    except LimitError:
        raise  # the input asked for more than a budget allows: bad input, not a bug
    except IRError as exc:
        raise InvalidOutputError(
            f"refusing to write an invalid tile IR document: {exc.message()}") from exc
    text = dumps(module, fmt or "yaml")
    if outputs is not None:
        outputs.put(output, text, f"-o {output}" if output != "-" else "-o")
    else:
        write_output(output, text, input_path=input_path)
