"""A small indented-buffer emitter for C/CUDA text, with named temporaries.

Kernel generators write lines through an `Emitter` instead of concatenating strings: the
emitter owns indentation (`with e.block("for (...)"):` opens and closes a brace) and hands out
temporary names that never collide within one kernel (`e.tmp("acc")` -> `acc0`, `acc1`, ...).
Output is a pure function of the calls made, so the same IR gives the same bytes.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Iterable, Iterator

INDENT = "  "


class Emitter:
    """Lines of C with indentation and a per-kernel namespace of temporaries."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._depth = 0
        self._counters: dict[str, int] = {}

    def line(self, text: str = "") -> None:
        """One line at the current depth (an empty string gives a blank line)."""
        self._lines.append(f"{INDENT * self._depth}{text}" if text else "")

    def lines(self, texts) -> None:
        for text in texts:
            self.line(text)

    def comment(self, text: str) -> None:
        for part in text.splitlines() or [""]:
            self.line(f"// {part}".rstrip())

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
