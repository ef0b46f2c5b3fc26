"""Tokenizer and precedence-climbing parser for tensor-expression statements.

Errors are `ExprError` located by column (`col 12`), with the offending token quoted.

A statement is at most `limits.EXPR_CHARS` characters and its syntax tree at most
`limits.EXPR_DEPTH` levels deep (parentheses, calls, unary operators and chains of binary
operators all count), checked while parsing: every walker of the tree recurses, so a deep
tree would exhaust Python's stack anywhere downstream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tilekit import limits
from tilekit.errors import ExprError
from tilekit.expr.ast import (ASSIGN_OPS, BINARY_LEVELS, FUNC_ARITY, Access, Axis, Binary, Call,
                              Node, Num, Statement, Unary)

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<assign>max=|min=|\+=|\*=)
  | (?P<op>//|<=|>=|==|!=|&&|\|\||[-+*/%<>!(),\[\]=])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)

_SPECIAL_NUMBERS = {"inf": float("inf"), "nan": float("nan")}


@dataclass(frozen=True)
class Token:
    kind: str  # num, name, op, assign, end
    text: str
    col: int  # 1-based


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExprError(f"unexpected character {text[pos]!r}", f"col {pos + 1}",
                            "see specs/expressions.md for the syntax")
        kind = m.lastgroup
        if kind != "ws":
            tok = m.group()
            # `max=` / `min=` are assignments only where followed by no `(`: `max(a, b)`
            # never matches them because of the `=`.
            tokens.append(Token(kind, tok, pos + 1))
        pos = m.end()
    tokens.append(Token("end", "", len(text) + 1))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        self.depth = 0
        self.max_depth = limits.EXPR_DEPTH.value

    def nest(self, tok: Token) -> None:
        """Enter one level of the tree (a parenthesis, call, index or operator)."""
        self.depth += 1
        if self.depth > self.max_depth:
            raise _as_expr_error(limits.EXPR_DEPTH.error("the expression's nesting",
                                                         f"col {tok.col}"))

    # -- helpers -------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def error(self, what: str, tok: Token | None = None, hint: str | None = None) -> ExprError:
        tok = tok or self.tok
        shown = repr(tok.text) if tok.kind != "end" else "end of expression"
        return ExprError(f"{what}, found {shown}", f"col {tok.col}", hint)

    def expect(self, text: str) -> Token:
        if self.tok.text != text or self.tok.kind not in ("op",):
            raise self.error(f"expected {text!r}")
        return self.advance()

    # -- grammar -------------------------------------------------------------------------
    def statement(self) -> Statement:
        if self.tok.kind != "name":
            raise self.error("a statement starts with the output tensor",
                             hint="e.g. 'y[i, j] = x[i, j] + 1'")
        out = self.access(self.advance(), in_index=False)
        if self.tok.kind == "assign" or (self.tok.kind == "op" and self.tok.text == "="):
            assign = self.advance().text
        else:
            raise self.error("expected an assignment (= += *= max= min=)")
        assert assign in ASSIGN_OPS
        body = self.expr(0, in_index=False)
        if self.tok.kind != "end":
            raise self.error("unexpected text after the expression")
        return Statement(out, assign, body)

    def access(self, name_tok: Token, in_index: bool) -> Access:
        if in_index:
            raise self.error("tensor access inside an index (indices must be affine in axes)",
                             name_tok)
        self.nest(self.tok)
        self.expect("[")
        indices: list[Node] = []
        if not (self.tok.kind == "op" and self.tok.text == "]"):
            while True:
                indices.append(self.expr(0, in_index=True))
                if self.tok.kind == "op" and self.tok.text == ",":
                    self.advance()
                    continue
                break
        self.expect("]")
        self.depth -= 1
        return Access(name_tok.text, tuple(indices))

    def expr(self, level: int, in_index: bool) -> Node:
        if level == len(BINARY_LEVELS):
            return self.unary(in_index)
        start = self.depth
        node = self.expr(level + 1, in_index)
        while self.tok.kind == "op" and self.tok.text in BINARY_LEVELS[level]:
            op_tok = self.advance()
            if in_index and op_tok.text not in ("+", "-", "*", "//", "%"):
                raise self.error("operator not allowed in an index", op_tok,
                                 "indices use + - * // % on axes and integers")
            self.nest(op_tok)  # a chain `a + b + c` nests to the left, one level per operator
            rhs = self.expr(level + 1, in_index)
            node = Binary(op_tok.text, node, rhs)
        self.depth = start
        return node

    def unary(self, in_index: bool) -> Node:
        if self.tok.kind == "op" and self.tok.text in ("-", "!"):
            op_tok = self.advance()
            if in_index and op_tok.text == "!":
                raise self.error("operator not allowed in an index", op_tok)
            self.nest(op_tok)
            arg = self.unary(in_index)
            self.depth -= 1
            if op_tok.text == "-" and isinstance(arg, Num):
                return Num(-arg.value)
            return Unary(op_tok.text, arg)
        return self.primary(in_index)

    def primary(self, in_index: bool) -> Node:
        tok = self.tok
        if tok.kind == "num":
            self.advance()
            is_int = re.fullmatch(r"\d+", tok.text) is not None
            if is_int and (len(tok.text.lstrip("0")) > 19 or int(tok.text) >= 2**63):
                raise self.error("integer literal out of the 64-bit range", tok,
                                 "integers in expressions are 64-bit")
            return Num(int(tok.text) if is_int else float(tok.text))
        if tok.kind == "op" and tok.text == "(":
            self.advance()
            self.nest(tok)
            node = self.expr(0, in_index)
            self.expect(")")
            self.depth -= 1
            return node
        if tok.kind == "name":
            self.advance()
            nxt = self.tok
            if nxt.kind == "op" and nxt.text == "[":
                return self.access(tok, in_index)
            if nxt.kind == "op" and nxt.text == "(":
                return self.call(tok, in_index)
            if tok.text in _SPECIAL_NUMBERS and not in_index:
                return Num(_SPECIAL_NUMBERS[tok.text])
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", tok.text):
                raise self.error("not an axis name (axes are lower-case identifiers); "
                                 "a tensor needs brackets", tok,
                                 f"write {tok.text}[] for a rank-0 tensor")
            return Axis(tok.text)
        raise self.error("expected a value")

    def call(self, name_tok: Token, in_index: bool) -> Call:
        fn = name_tok.text
        if fn not in FUNC_ARITY:
            known = ", ".join(sorted(FUNC_ARITY))
            raise ExprError(f"unknown function {fn!r}", f"col {name_tok.col}",
                            f"known functions: {known}")
        if in_index:
            raise self.error("function call inside an index", name_tok)
        self.nest(self.tok)
        self.expect("(")
        args: list[Node] = []
        if not (self.tok.kind == "op" and self.tok.text == ")"):
            while True:
                args.append(self.expr(0, in_index))
                if self.tok.kind == "op" and self.tok.text == ",":
                    self.advance()
                    continue
                break
        self.expect(")")
        self.depth -= 1
        if len(args) != FUNC_ARITY[fn]:
            raise ExprError(f"{fn}() takes {FUNC_ARITY[fn]} argument(s), got {len(args)}",
                            f"col {name_tok.col}")
        return Call(fn, tuple(args))


def parse(text: str) -> Statement:
    """Parse one statement. Raises ExprError located by column.

    Statements are immutable, so a text is parsed once per process (every stage of a pipe
    run in one process, and every copy of a module, shares the tree)."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("empty expression", None, "an expr op needs a statement like "
                        "'y[i] = x[i] + 1'")
    _check_length(text)
    return _parse(text)


@lru_cache(maxsize=16384)
def _parse(text: str) -> Statement:
    return _Parser(text).statement()


def parse_index(text: str) -> Node:
    """Parse a lone index expression (for tests and tools)."""
    _check_length(text)
    p = _Parser(text)
    node = p.expr(0, in_index=True)
    if p.tok.kind != "end":
        raise p.error("unexpected text after the index")
    return node


def _check_length(text: str) -> None:
    try:
        limits.EXPR_CHARS.check(len(text), None, "the expression")
    except limits.LimitError as exc:
        raise _as_expr_error(exc) from None


def _as_expr_error(exc: limits.LimitError) -> ExprError:
    """A limit broken inside an expression, as an ExprError (located by the caller)."""
    return ExprError(exc.what, exc.where, exc.hint)
