"""The tensor-expression language (specs/expressions.md): parse, analyse, evaluate."""

from tilekit.expr.analysis import (AccessInfo, Analysis, IndexMap, analyze, index_map,
                                   input_box, interval)
from tilekit.expr.ast import (Access, Axis, Binary, Call, Node, Num, Statement, Unary,
                              format_node, format_statement)
from tilekit.expr.reference import evaluate
from tilekit.expr.parser import parse, parse_index

__all__ = [
    "Access", "AccessInfo", "Analysis", "Axis", "Binary", "Call", "IndexMap", "Node", "Num",
    "Statement", "Unary", "analyze", "evaluate", "format_node", "format_statement",
    "index_map", "input_box", "interval", "parse", "parse_index",
]
