"""The two kinds of failure every tilekit command distinguishes.

`TilekitError` is bad input (exit 2): a message that says *where* (file, IR path such as
`ops[12].expr`, or flag), *what* rule was broken and, when we know it, a *hint* to fix it.
Anything else escaping a command is an internal error (exit 1); `InternalError` is one that
knows what reproduces it (the nvcc command that rejects generated code).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2


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
        return " ".join(text.split("\n"))

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
