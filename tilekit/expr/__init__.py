"""The tensor-expression language (specs/expressions.md): parse, analyse, evaluate."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__all__ = [
    "Access", "AccessInfo", "Analysis", "Axis", "Binary", "Call", "IndexMap", "Node", "Num",
    "Statement", "Unary", "analyze", "evaluate", "format_node", "format_statement",
    "index_map", "input_box", "interval", "parse", "parse_index",
]

if TYPE_CHECKING:
    from tilekit.expr.analysis import (AccessInfo, Analysis, IndexMap, analyze, index_map,
                                       input_box, interval)
    from tilekit.expr.ast import (Access, Axis, Binary, Call, Node, Num, Statement, Unary,
                                  format_node, format_statement)
    from tilekit.expr.reference import evaluate
    from tilekit.expr.parser import parse, parse_index


# The names above are loaded on first use (from the module each is listed with): importing
# one module of the package runs this file, which then imports none of the others, so a
# command loads only the modules it uses.
_LAZY = {
    "AccessInfo": "analysis",
    "Analysis": "analysis",
    "IndexMap": "analysis",
    "analyze": "analysis",
    "index_map": "analysis",
    "input_box": "analysis",
    "interval": "analysis",
    "Access": "ast",
    "Axis": "ast",
    "Binary": "ast",
    "Call": "ast",
    "Node": "ast",
    "Num": "ast",
    "Statement": "ast",
    "Unary": "ast",
    "format_node": "ast",
    "format_statement": "ast",
    "evaluate": "reference",
    "parse": "parser",
    "parse_index": "parser",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
