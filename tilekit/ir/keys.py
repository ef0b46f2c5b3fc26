"""The document's keys and how places in it are named in messages.

Key tables in the order the codec writes them (the `Module` field order), and the helpers that
name an IR path (`tensors.x`, `ops[3].expr`, `tensors['conv1/out']`) and report an unknown or
missing key with a suggestion. The codec and the verifier both read them.

The typed readers (`read_mapping`, `read_list`, `read_int`, `read_number`, `read_text`,
`read_choice`) are the one way a stage section's values are checked: each raises an `IRError`
at the value's IR path with the caller's hint (which stage to re-run).
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Mapping, Sequence

from tilekit.errors import IRError

#: Document keys, in the order they are written (the `Module` field order).
MODULE_KEYS = ("tilekit", "model", "source", "weights", "hardware", "stages", "dims", "inputs",
               "outputs", "tensors", "ops", "kernels", "program", "control", "codegen")
MODULE_REQUIRED = ("tilekit", "model", "inputs", "outputs", "tensors", "ops")
TENSOR_KEYS = ("shape", "dtype", "role")
TENSOR_REQUIRED = ("shape", "dtype")
OP_KEYS = ("name", "expr", "kind", "pad", "axes", "opaque", "origin", "tile")
KERNEL_KEYS = ("name", "ops", "tile", "estimate", "launch")
STAGE_KEYS = ("name", "options")
WEIGHTS_KEYS = ("file", "sha256")
#: `hardware: {name, sha256}`: the profile and its content hash (`hardware: NAME` also reads).
HARDWARE_KEYS = ("name", "sha256")
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


# -- typed readers of stage sections ------------------------------------------------------

def read_mapping(value: Any, where: str, what: str = "the value",
                 hint: str | None = None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise IRError(f"{what} must be a mapping, got {type_name(value)}", where, hint)
    return value


def read_list(value: Any, where: str, what: str = "the value", hint: str | None = None) -> list:
    if not isinstance(value, (list, tuple)):
        raise IRError(f"{what} must be a list, got {type_name(value)}", where, hint)
    return list(value)


def read_int(value: Any, where: str, minimum: int = 0, maximum: int | None = None,
             hint: str | None = None) -> int:
    if type(value) is not int or value < minimum:
        raise IRError(f"must be an integer >= {minimum}, got {value!r}", where, hint)
    if maximum is not None and value > maximum:
        raise IRError(f"must be at most {maximum}, got {value}", where, hint)
    return value


def read_number(value: Any, where: str, minimum: float | None = None,
                hint: str | None = None) -> float:
    """A finite number (NaN and infinities are refused), at least `minimum` when given."""
    if (type(value) not in (int, float) or not math.isfinite(value)
            or (minimum is not None and value < minimum)):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise IRError(f"must be a finite number{bound}, got {value!r}", where, hint)
    return float(value)


def read_text(value: Any, where: str, hint: str | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise IRError(f"must be a non-empty string, got {value!r}", where, hint)
    return value


def read_choice(value: Any, choices: Sequence[str], where: str, hint: str | None = None) -> str:
    if value not in choices:
        raise IRError(f"must be one of {', '.join(choices)}, got {value!r}", where, hint)
    return value
