"""Names in the imported module: ONNX tensor names made into expression NAMEs, unique.

The expression language accepts `[A-Za-z_][A-Za-z0-9_]*` as a tensor name. ONNX names are
free text (`gpu_0/data_0`, `conv1/7x7_s2_w_0`, `1234`, `onnx::Add_5`), so every character
outside that set becomes `_`, runs of `_` collapse, and a leading digit gets a `t` prefix
(`gpu_0/data_0` -> `gpu_0_data_0`, `1234` -> `t1234`). When two ONNX names sanitise to the same
text, the later one (in graph order: inputs, initializers, node outputs) gets `_1`, `_2`, ...
Derived names (`<name>_max`, `<name>_conv`) go through the same table, so they never collide
with a sanitised ONNX name either. Names are cut to `MAX_BASE` characters before the suffix
that makes them unique, so every name stays within the IR's identifier grammar
(`tilekit.ir.names`, at most 120 characters) even with the `k_` of a kernel name.
"""

from __future__ import annotations

import re
from typing import Any

from tilekit.errors import excerpt

_BAD = re.compile(r"[^A-Za-z0-9_]+")
#: The longest sanitised name before a uniqueness suffix (`_12`) and a `k_` prefix.
MAX_BASE = 100


def sanitize(text: str, fallback: str = "t") -> str:
    """`text` as a readable identifier (not yet unique)."""
    name = _BAD.sub("_", text[:4 * MAX_BASE])
    name = re.sub(r"_+", "_", name)
    if len(name) > 1:
        name = name.strip("_") or name
    if not name:
        return fallback
    if name[0].isdigit():
        name = f"{fallback}{name}"
    return name[:MAX_BASE]


class NameTable:
    """Hands out unique identifiers; the same key always gets the same name."""

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}
        self._taken: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __getitem__(self, key: str) -> str:
        return self._by_key[key]

    def claim(self, key: str, wanted: str | None = None) -> str:
        """The name of `key`, made from `wanted` (default: sanitised key) on first use."""
        if key in self._by_key:
            return self._by_key[key]
        name = self.fresh(sanitize(wanted if wanted is not None else key))
        self._by_key[key] = name
        return name

    def child(self, inherited: dict[str, str]) -> "NameTable":
        """A table for a nested scope (a Loop body): `inherited` keys keep their names, every
        other name is new and unique across both tables (they share what is taken)."""
        table = NameTable()
        table._by_key = dict(inherited)
        table._taken = self._taken
        return table

    def fresh(self, wanted: str) -> str:
        """A new identifier not handed out before: `wanted`, else `wanted_1`, `wanted_2`..."""
        base = sanitize(wanted)
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name


def node_where(index: int, node: Any) -> str:
    """Where a message about ONNX node `index` points: `node 3 'Relu_3'` (its name, else its
    op type and index; an excerpt, so a hostile name is not copied into a terminal)."""
    return f"node {index} '{excerpt(node.name or f'{node.op_type}_{index}', 60, quote=False)}'"
