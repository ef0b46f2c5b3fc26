"""The one grammar for names and file references in a tile IR document.

Every name that can reach generated code, a file name or an archive member (tensor, op,
kernel and model names, axis names, opaque types) is an **identifier**: ASCII letters,
digits and `_`, not starting with a digit, at most `MAX_NAME_LENGTH` characters. The verifier
checks every name field against it; the code generators print names only through it (and
comment text only through `tilekit.tile.emit.comment_text`); files and archive members
are named `<identifier>.<suffix>`. The length bound keeps the longest file name tk-codegen
makes from two names (`tk_<kernel>__<op>_<n>.cu`) under the 255 bytes a file name may have.

File references in the IR (`weights.file`, `source.onnx`, a `hardware` path) are relative
paths: no absolute path, no NUL or control character, bounded length.
"""

from __future__ import annotations

import re
from typing import Any

from tilekit.errors import IRError, excerpt

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_NAME_LENGTH = 120
#: A path in the IR: at most this many characters, each part at most `MAX_PART` bytes.
MAX_PATH_LENGTH = 1024
MAX_PART = 255
NAME_RULE = (f"a name is ASCII letters, digits and '_', not starting with a digit, at most "
             f"{MAX_NAME_LENGTH} characters")


def is_identifier(value: Any) -> bool:
    return (isinstance(value, str) and len(value) <= MAX_NAME_LENGTH
            and IDENTIFIER.match(value) is not None)


def name_problem(value: Any, what: str = "name") -> str | None:
    """Why `value` is not an identifier, or None when it is one (`what`: 'op name')."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__} {excerpt(value)}"
    if not value:
        return f"{what} must not be empty"
    if len(value) > MAX_NAME_LENGTH:
        return (f"{what} {excerpt(value)} has {len(value):,} characters, more than "
                f"{MAX_NAME_LENGTH}")
    if IDENTIFIER.match(value) is None:
        return f"bad {what} {excerpt(value)}"
    return None


def check_name(value: Any, where: str | None, what: str = "name") -> str:
    """`value` if it is an identifier, else an `IRError` located at `where`."""
    problem = name_problem(value, what)
    if problem is not None:
        raise IRError(problem, where, NAME_RULE)
    return value


def is_absolute_path(path: str) -> bool:
    """POSIX or Windows absolute (`/x`, `C:\\x`, `\\\\server\\x`): not allowed in the IR."""
    return path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", path) is not None


def path_problem(value: str, what: str = "path") -> str | None:
    """Why `value` cannot be a relative file reference in the IR, or None (`what` names the
    field in the message: 'the weights file')."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"{what} {excerpt(value)} holds a control character"
    shown = value if len(value) <= 200 else value[:200] + "..."
    if len(value) > MAX_PATH_LENGTH or any(len(part.encode("utf-8", "replace")) > MAX_PART
                                           for part in re.split(r"[\\/]", value)):
        return (f"{what} '{shown}' is too long (at most {MAX_PATH_LENGTH} characters, "
                f"{MAX_PART} bytes per part)")
    if is_absolute_path(value):
        return f"{what} '{shown}' is an absolute path"
    return None


# -- hardware references ----------------------------------------------------------------

#: A hardware profile's name or alias (`h100`, `H100-SXM`, `a100.80gb`).
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
PROFILE_SUFFIXES = (".yaml", ".yml")


def is_profile_path(value: str) -> bool:
    """A profile reference with a path separator or a YAML suffix is a path, never a name."""
    return "/" in value or "\\" in value or value.endswith(PROFILE_SUFFIXES)


def hardware_problem(value: str) -> str | None:
    """Why `value` cannot be an IR's `hardware` (a profile name, or a relative path to a
    `.yaml`/`.yml` file), or None."""
    if is_profile_path(value):
        problem = path_problem(value, "the profile path")
        if problem is None and not value.endswith(PROFILE_SUFFIXES):
            problem = f"the profile path {excerpt(value)} does not end in .yaml or .yml"
        return problem
    if len(value) > MAX_NAME_LENGTH or not PROFILE_NAME.match(value):
        return f"{excerpt(value)} is not a profile name"
    return None
