"""The printers' indented text buffer, and the check every printed line passes.

The printers (`tilekit.tile.cuda`, `tilekit.tile.cpp`) write lines through an `Emitter`: it
owns indentation (`with e.block("for (...)"):` opens and closes a brace). Output is a pure
function of the calls made, so the same program gives the same bytes.

Names and comments: printed code holds names only as identifiers (the tile verifier checks
every buffer and variable name), and any text derived from names or expressions that goes
into a comment passes through `comment_text`. Every line the emitter takes is checked
(`check_line`): printable ASCII, no trailing backslash, and a comment part that
`comment_text` leaves unchanged, so no input can end a comment early or add a line.
"""

from __future__ import annotations

import re
from contextlib import ExitStack, contextmanager
from typing import Iterable, Iterator

INDENT = "  "
#: Characters a comment may hold: printable ASCII without `\` (a line splice at the end of a
#: line), `?` (trigraphs: `??/` is a backslash) and the backquote.
_NOT_COMMENT = re.compile(r"[^A-Za-z0-9 _.,:;=+\-*/%<>!&|^~#@$'\"()\[\]{}]")
_CODE_LINE = re.compile(r"[\x20-\x7e]*\Z")


class UnsafeText(ValueError):
    """Text that would change the meaning of the generated code: a bug in a code generator
    (the verifier refuses every input that could lead here)."""


def comment_text(text: str) -> str:
    """`text` as one line of comment: every character outside a small printable ASCII set
    (line breaks, backslashes, `?`, non-ASCII) becomes `_`."""
    return _NOT_COMMENT.sub("_", str(text))


def check_line(text: str) -> str:
    """`text` if it can be one line of generated C, else `UnsafeText`."""
    code, sep, comment = text.partition("//")
    if not _CODE_LINE.match(code) or code.endswith("\\") or (sep and comment_text(comment)
                                                                != comment):
        raise UnsafeText(f"unsafe generated line {text[:80]!r}")
    return text


class Emitter:
    """Lines of C with indentation and a per-kernel namespace of temporaries."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._depth = 0
        self._counters: dict[str, int] = {}

    def line(self, text: str = "") -> None:
        """One line at the current depth (an empty string gives a blank line)."""
        self._lines.append(f"{INDENT * self._depth}{check_line(text)}" if text else "")

    def lines(self, texts) -> None:
        for text in texts:
            self.line(text)

    def comment(self, text: str) -> None:
        """`// text`, one comment line per line of `text`, each through `comment_text`."""
        for part in text.splitlines() or [""]:
            self.line(f"// {comment_text(part)}".rstrip())

    @contextmanager
    def block(self, head: str = "", tail: str = "") -> Iterator[None]:
        """`head {` ... `}tail`; the body is indented one level."""
        self.line(f"{head} {{" if head else "{")
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.line(f"}}{tail}")

    @contextmanager
    def blocks(self, heads: Iterable[str]) -> Iterator[None]:
        """Nested blocks, one per head, outermost first; all closed on exit."""
        with ExitStack() as stack:
            for head in heads:
                stack.enter_context(self.block(head))
            yield

    @contextmanager
    def indented(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def sibling(self) -> "Emitter":
        """A new buffer sharing this one's namespace of temporaries (a kernel's sections)."""
        e = Emitter()
        e._counters = self._counters
        return e

    def tmp(self, prefix: str) -> str:
        """A fresh name `prefix<n>`, unique in this emitter."""
        n = self._counters.get(prefix, 0)
        self._counters[prefix] = n + 1
        return f"{prefix}{n}"

    def let(self, ctype: str, prefix: str, value: str) -> str:
        """Declare a `const` temporary holding `value`; returns its name."""
        name = self.tmp(prefix)
        self.line(f"const {ctype} {name} = {value};")
        return name

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
