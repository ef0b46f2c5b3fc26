"""The two kinds of failure every tilekit command distinguishes.

`TilekitError` is bad input (exit 2): a message that says *where* (file, IR path such as
`ops[12].expr`, or flag), *what* rule was broken and, when we know it, a *hint* to fix it.
Anything else escaping a command is an internal error (exit 1); `InternalError` is one that
knows what reproduces it (the nvcc command that rejects generated code).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
#: Exit codes after SIGINT and SIGTERM (128 + the signal number, as a shell reports them).
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
#: The longest message a command prints (the rest is cut): input never floods a terminal.
MAX_MESSAGE = 2000
#: The most characters of input text a message quotes.
EXCERPT = 40


def excerpt(value: Any, limit: int = EXCERPT, quote: bool = True) -> str:
    """A short, escaped excerpt of input for a message: at most `limit` characters of
    `repr(value)` for a string (quotes and escapes included, ASCII only), `...` when cut.
    Messages quote input only through this, so an error never copies a file into a terminal.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        text = f"<{value.bit_length()}-bit integer>"  # str() of a huge int is slow, or refused
    elif isinstance(value, (str, bytes, int, float, bool, type(None))):
        text = ascii(value)
    else:
        text = f"<{type(value).__name__}>"
    if isinstance(value, str) and not quote:
        text = text[1:-1]
    if len(text) > limit:
        text = text[:limit] + "..."
    return text


_UNSAFE = re.compile(r"[^\x20-\x7e]")


def _escape_char(match: re.Match) -> str:
    ch = match.group()
    if unicodedata.category(ch)[0] in "LMNPSZ" and ch not in "\u2028\u2029\x85":
        return ch  # printable non-ASCII text (a file name in another script)
    return ascii(ch)[1:-1]


def safe_line(text: str) -> str:
    """`text` as one bounded line with no terminal controls (escaped), for stderr: input never
    floods or drives a terminal."""
    text = _UNSAFE.sub(_escape_char, str(text).replace("\n", " "))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "..."


class TilekitError(Exception):
    """Bad input: a located, one-line, fixable message. Commands exit with code 2."""

    def __init__(self, what: str, where: str | None = None, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.hint = hint

    def located(self, where: str) -> "TilekitError":
        """Return a copy whose location is prefixed by `where` (outer context first)."""
        inner = f"{where}.{self.where}" if self.where and not self.where.startswith(("[", ":")) else (
            f"{where}{self.where}" if self.where else where)
        return type(self)(self.what, inner, self.hint)

    def message(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.hint:
            text += f"; {self.hint}"
        return safe_line(text)

    def __str__(self) -> str:
        return self.message()


class InternalError(Exception):
    """A fault of tilekit itself that is not the input's (generated code that nvcc rejects):
    exit 1, with what it was doing and how to reproduce it."""

    def __init__(self, what: str, where: str | None = None, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.hint = hint

    message = TilekitError.message

    def __str__(self) -> str:
        return self.message()


class ExprError(TilekitError):
    """An error in a tensor expression (syntax, axes, index maps, shapes)."""


class IRError(TilekitError):
    """An IR document that breaks the format or an invariant."""


class ProfileError(TilekitError):
    """A hardware profile that is missing, malformed or inconsistent."""


class UnsupportedError(TilekitError):
    """Input that is valid but that tilekit does not handle (yet): op, attribute, IR stage."""
