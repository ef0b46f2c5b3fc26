"""The document's keys and how places in it are named in messages.

Key tables in the order the codec writes them (the `Module` field order), and the helpers that
name an IR path (`tensors.x`, `ops[3].expr`, `tensors['conv1/out']`) and report an unknown or
missing key with a suggestion. The codec and the verifier both read them.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Mapping

#: Document keys, in the order they are written (the `Module` field order).
MODULE_KEYS = ("tilekit", "model", "source", "weights", "hardware", "stages", "inputs",
               "outputs", "tensors", "ops", "kernels", "program", "control", "codegen")
MODULE_REQUIRED = ("tilekit", "model", "inputs", "outputs", "tensors", "ops")
TENSOR_KEYS = ("shape", "dtype", "role")
TENSOR_REQUIRED = ("shape", "dtype")
OP_KEYS = ("name", "expr", "kind", "pad", "axes", "opaque", "origin", "tile")
KERNEL_KEYS = ("name", "ops", "tile", "estimate", "launch")
STAGE_KEYS = ("name", "options")
WEIGHTS_KEYS = ("file", "sha256")
OPAQUE_KEYS = ("type", "inputs", "outputs", "attrs")



def where(origin: str | None, path: str) -> str:
    """`<file>: <ir.path>` (either part may be missing)."""
    if origin and path:
        return f"{origin}: {path}"
    return origin or path


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def key_path(parent: str, key: str) -> str:
    """IR path of a mapping entry: `tensors.x`, or `tensors['conv1/out']` for odd names."""
    step = f".{key}" if _PLAIN_KEY.match(str(key)) else f"[{str(key)!r}]"
    return f"{parent}{step}" if parent else step.lstrip(".")


def type_name(value: Any) -> str:
    """The YAML/JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def key_problem(value: Mapping[str, Any], path: str, known: tuple[str, ...],
                required: tuple[str, ...]) -> tuple[str, str, str | None] | None:
    """(IR path, what, hint) for the first unknown or missing key of a mapping, else None."""
    for key in value:
        if key not in known:
            return key_path(path, str(key)), f"unknown key '{key}'", did_you_mean(str(key), known)
    for key in required:
        if key not in value:
            return key_path(path, key), f"missing required key '{key}'", None
    return None


def did_you_mean(word: str, known: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"known keys: {', '.join(known)}"
