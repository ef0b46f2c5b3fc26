"""The tensor-expression language (specs/expressions.md): parse, analyse, evaluate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

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


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
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


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
