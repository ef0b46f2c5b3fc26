"""Editing a profile's YAML text in place: replace, add or drop single fields while every other
line (comments, order, alignment) stays as it was written.

`tk-hw probe` writes its figures into a copy of a base profile this way, so that
`diff base.yaml probed.yaml` shows exactly what the device changed. Fields are named by the
profile's figure paths (`name`, `parallelism.sm_count`, `memory[dram].bandwidth`,
`compute.tensor_core.fp16`) and found through PyYAML's node marks (line and column). A value
is written back on one line, as flow YAML (`{value: 3.35, unit: TB/s, source: "..."}`),
whatever style the base used for it.

    text = ProfileText(base_text, "h100.yaml")
    text.set("memory[l2].bandwidth", figure_text(7.9, "TB/s", "measured: ..."))
    text.delete("aliases")
    new = text.text()
"""

from __future__ import annotations

import json
import re

import numpy as np
import yaml

from tilekit.errors import ProfileError

_STEP = re.compile(r"(\w+)(?:\[(\w+)\])?")
#: Significant digits of a measured or derived number written into a profile.
DIGITS = 4


def number_text(value: int | float) -> str:
    """A number as YAML reads it back: whole numbers as they are, others to 4 significant digits
    in positional notation (PyYAML reads `1e-06` as a string)."""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return np.format_float_positional(float(value), precision=DIGITS, unique=False,
                                      fractional=False, trim="-")


def figure_text(value: int | float, unit: str | None, source: str,
                note: str | None = None) -> str:
    """One figure as a flow mapping: `{value: 3.35, unit: TB/s, source: "datasheet"}`."""
    parts = [f"value: {number_text(value)}"]
    if unit:
        parts.append(f"unit: {unit}")
    # A JSON string is a valid double-quoted YAML scalar.
    parts.append(f"source: {json.dumps(source)}")
    if note:
        parts.append(f"note: {json.dumps(note)}")
    return "{" + ", ".join(parts) + "}"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _blank(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _item(mapping: yaml.MappingNode, key: str):
    """(key node, value node) of `key` in a mapping node, or (None, None)."""
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None, None


class ProfileText:
    """A profile document as lines, with the edits asked for applied by `text()`.

    Edits are recorded against the original line numbers and applied bottom-up, so they do
    not shift one another; two edits of the same lines are a programming error.
    """

    def __init__(self, text: str, origin: str):
        self.origin = origin
        self.lines = text.splitlines()
        self.root = yaml.compose(text, Loader=yaml.SafeLoader)
        if not isinstance(self.root, yaml.MappingNode):
            raise ProfileError("expected a mapping of profile fields", origin)
        self._edits: list[tuple[int, int, list[str]]] = []

    # -- finding ---------------------------------------------------------------------------

    def _parent(self, path: str) -> tuple[yaml.MappingNode | None, str]:
        """The mapping node that holds the last key of `path` (None when a section is absent),
        and that key."""
        *sections, key = path.split(".")
        node = self.root
        for step in sections:
            m = _STEP.fullmatch(step)
            if m is None:
                raise ValueError(f"bad profile path {path!r}")
            _, node = _item(node, m.group(1))
            if node is not None and m.group(2):  # memory[dram]: the list item of that level
                items = node.value if isinstance(node, yaml.SequenceNode) else []
                node = next((item for item in items if isinstance(item, yaml.MappingNode)
                             and getattr(_item(item, "level")[1], "value", None) == m.group(2)),
                            None)
            if node is None:
                return None, key
            if not isinstance(node, yaml.MappingNode):
                raise ProfileError("expected a mapping", f"{self.origin}: {step}")
        return node, key

    def _span(self, key_node: yaml.Node, value_node: yaml.Node) -> tuple[int, int]:
        """First and last line (0-based) of a key and its value."""
        first = key_node.start_mark.line
        inline = value_node.start_mark.line == first and (
            isinstance(value_node, yaml.ScalarNode) or value_node.flow_style)
        if inline:  # a scalar or a flow collection: its end mark is just after it
            return first, value_node.end_mark.line
        # A block value: the lines below the key that are indented deeper than it.
        column, last = key_node.start_mark.column, first
        for i in range(first + 1, len(self.lines)):
            if _blank(self.lines[i]):
                continue
            if _indent(self.lines[i]) <= column:
                break
            last = i
        return first, last

    def unit(self, path: str) -> str | None:
        """The unit the figure at `path` is written in (`TB/s`); None for a figure without one
        or a missing figure."""
        parent, key = self._parent(path)
        _, node = _item(parent, key) if parent is not None else (None, None)
        if isinstance(node, yaml.MappingNode):
            _, unit = _item(node, "unit")
            if isinstance(unit, yaml.ScalarNode):
                return unit.value
        return None

    # -- editing ---------------------------------------------------------------------------

    def _edit(self, first: int, end: int, new: list[str]) -> None:
        for f, e, _ in self._edits:
            if first < e and f < end:
                raise ValueError(f"two edits of lines {f + 1}-{e} of {self.origin}")
        self._edits.append((first, end, new))

    def set(self, path: str, value: str) -> None:
        """Write `value` (one line of YAML) at `path`, in place of what is there; a missing key
        is added after the last one of its mapping, a missing top-level section at the end."""
        parent, key = self._parent(path)
        if parent is None:
            section, _, rest = path.partition(".")
            if "[" in section or "." in rest:
                raise ProfileError(f"cannot add '{path}': its section is missing", self.origin)
            end = len(self.lines)
            self._edit(end, end, ["", f"{section}:", f"  {key}: {value}"])
            return
        key_node, value_node = _item(parent, key)
        if key_node is None:
            self._add(parent, key, value)
            return
        first, last = self._span(key_node, value_node)
        line = self.lines[first]
        if value_node.start_mark.line == first and last == value_node.end_mark.line:
            head = line[:value_node.start_mark.column]  # the author's alignment
            rest = self.lines[last][value_node.end_mark.column:]
            tail = rest.rstrip() if rest.strip().startswith("#") else ""  # a trailing comment
        else:
            head, tail = line[:key_node.start_mark.column] + f"{key}: ", ""
        self._edit(first, last + 1, [head + value + tail])

    def _add(self, parent: yaml.MappingNode, key: str, value: str) -> None:
        if parent.flow_style:
            raise ProfileError(f"cannot add '{key}' to a mapping written on one line",
                               f"{self.origin}:{parent.start_mark.line + 1}",
                               "write the section as a block, one field per line")
        column = parent.value[0][0].start_mark.column
        _, last = self._span(*parent.value[-1])
        self._edit(last + 1, last + 1, [" " * column + f"{key}: {value}"])

    def delete(self, path: str) -> None:
        """Drop the field at `path` (its key and value lines), if it is there."""
        parent, key = self._parent(path)
        key_node, value_node = _item(parent, key) if parent is not None else (None, None)
        if key_node is not None:
            first, last = self._span(key_node, value_node)
            self._edit(first, last + 1, [])

    def prepend(self, lines: list[str]) -> None:
        """Put `lines` (comments) at the top of the document."""
        self._edit(0, 0, lines)

    def text(self) -> str:
        lines = list(self.lines)
        order = sorted(range(len(self._edits)), key=lambda i: self._edits[i][:2] + (i,),
                       reverse=True)
        for i in order:
            first, end, new = self._edits[i]
            lines[first:end] = new
        return "\n".join(lines) + "\n"
