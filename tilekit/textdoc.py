"""YAML and JSON text to plain data, safely: the one reader of both formats.

IR documents (`tilekit.ir.codec`) and hardware profiles (`tilekit.hw.schema`) are parsed here,
so every document tilekit reads keeps the same rules:

- **no aliases, no foreign tags.** An alias (`*a`) is refused: a YAML "billion laughs" of a
  few hundred bytes expands to gigabytes in any walker of the data, and tilekit never writes
  one. Only YAML's core tags (`!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!seq`,
  `!!map`) are accepted; anything else (`!!python/object`, `!custom`) is refused.
- **bounded nesting.** Mappings and lists nest at most `limits.NESTING` deep. The YAML
  document is composed here from the parser's events with an explicit stack (libyaml's own
  composer recurses in C and crashes on deep input; PyYAML's recurses in Python); a JSON
  document too deep for the standard parser is reported the same way.
- **YAML 1.2 core scalars**: `true`/`false` (never `yes`/`no`), integers in decimal, floats
  with `.inf`/`.nan`, `null`/`~`; every other plain scalar is a string. An integer literal
  has at most `MAX_INT_DIGITS` digits, in YAML and in JSON (what a value may be is the
  verifier's business: a shape is bounded by `limits.TENSOR_ELEMENTS`).
- duplicate keys and non-scalar keys are refused; JSON `NaN`/`Infinity` and numbers that
  overflow to infinity are refused.

Problems raise the caller's error class (a `TilekitError`), located `origin:line:col`.
Syntax errors keep PyYAML's wording: they are re-read with the pure-Python parser so that
the message does not depend on whether libyaml is installed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Iterable

import yaml

from tilekit import limits
from tilekit.errors import TilekitError, excerpt

#: The longest integer literal read (2**64 has 20 digits; payloads may hold larger ones).
MAX_INT_DIGITS = 40

FLOAT_12 = re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                           |[-+]?\.(?:inf|Inf|INF)
                           |\.(?:nan|NaN|NAN))$""", re.X)
_INT_12 = re.compile(r"^[-+]?[0-9]+$")
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL_12 = re.compile(r"^(?:~|null|Null|NULL|)$")

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null")} | {"!"}
_SEQ_TAGS = {f"{_CORE}seq", "!"}
_MAP_TAGS = {f"{_CORE}map", "!"}

#: A mapping as the caller wants it, from its (key, value, key line) entries and its line.
MappingFactory = Callable[[list[tuple[Any, Any, int]], int], Any]


def _plain_dict(entries: list[tuple[Any, Any, int]], line: int) -> dict:
    return {k: v for k, v, _ in entries}


class _Problem(Exception):
    """A rule broken at a position (1-based line and column); turned into the caller's error.
    With `limit`, the rule is that budget and `what` says what was found."""

    def __init__(self, what: str, line: int | None, col: int | None, hint: str | None = None,
                 limit: limits.Limit | None = None):
        super().__init__(what)
        self.what, self.line, self.col, self.hint, self.limit = what, line, col, hint, limit


# -- scalars -----------------------------------------------------------------------------

def bounded_int(text: str, mark: tuple[int | None, int | None] = (None, None)) -> int:
    """A decimal integer literal of at most `MAX_INT_DIGITS` digits (checked on the text,
    before converting: Python refuses, or takes quadratic time on, very long ones)."""
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > MAX_INT_DIGITS:
        raise _Problem(f"integer literal of {len(digits):,} digits is longer than "
                       f"{MAX_INT_DIGITS} digits", *mark,
                       "tile IR sizes are 64-bit; no figure needs more digits")
    return int(text)


def _float(text: str) -> float:
    lowered = text.lower()
    if lowered.endswith(".inf"):
        return float(lowered.replace(".inf", "inf"))
    if lowered == ".nan":
        return float("nan")
    return float(text)


def _scalar(event: yaml.ScalarEvent) -> Any:
    mark = _mark(event)
    tag, value = event.tag, event.value
    if tag is not None and tag not in _SCALAR_TAGS:
        raise _Problem(f"YAML tag {excerpt(tag)} is not allowed", *mark,
                       "tile IR documents and profiles use plain YAML data, no tags")
    plain = event.implicit[0] and tag is None
    kind = tag[len(_CORE):] if tag and tag.startswith(_CORE) else ("resolve" if plain else "str")
    if kind == "resolve":
        if _BOOL_12.match(value):
            kind = "bool"
        elif _INT_12.match(value):
            kind = "int"
        elif FLOAT_12.match(value):
            kind = "float"
        elif _NULL_12.match(value):
            kind = "null"
        else:
            kind = "str"
    try:
        if kind == "bool":
            if not _BOOL_12.match(value):
                raise ValueError(value)
            return value.lower() == "true"
        if kind == "int":
            return bounded_int(value, mark)
        if kind == "float":
            return _float(value)
        if kind == "null":
            return None
    except ValueError:
        raise _Problem(f"{excerpt(value)} is not a valid !!{kind}", *mark) from None
    return value


def _mark(event: yaml.Event) -> tuple[int | None, int | None]:
    m = event.start_mark
    return (m.line + 1, m.column + 1) if m is not None else (None, None)


# -- composing YAML events without recursion ---------------------------------------------

class _Frame:
    __slots__ = ("kind", "items", "line", "key", "key_line", "keys")

    def __init__(self, kind: str, line: int):
        self.kind = kind                        # "seq" or "map"
        self.items: list = []
        self.line = line
        self.key: Any = _NO_KEY                 # a mapping's pending key
        self.key_line = 0
        self.keys: dict[Any, int] = {}          # a mapping's keys and their lines


_NO_KEY = object()


def _compose(events: Iterable[yaml.Event], mapping: MappingFactory) -> list[Any]:
    """The documents of an event stream, as plain data (see the module docstring)."""
    max_depth = limits.NESTING.value
    docs: list[Any] = []
    stack: list[_Frame] = []
    root: list[Any] = []

    def add(value: Any, event: yaml.Event) -> None:
        if not stack:
            root.append(value)
            return
        top = stack[-1]
        if top.kind == "seq":
            top.items.append(value)
            return
        line = _mark(event)[0] or 0
        if top.key is _NO_KEY:
            first = top.keys.get(value)
            if first is not None:
                raise _Problem(f"duplicate key {_key_text(value)}", line, _mark(event)[1],
                               f"each key may appear once in a mapping (first on line {first})")
            top.keys[value] = line
            top.key, top.key_line = value, line
            return
        top.items.append((top.key, value, top.key_line))
        top.key = _NO_KEY

    for event in events:
        if isinstance(event, yaml.AliasEvent):
            raise _Problem(f"YAML alias *{excerpt(event.anchor, quote=False)} is not allowed",
                           *_mark(event), "write the value out; tilekit never writes aliases")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            tags = _MAP_TAGS if isinstance(event, yaml.MappingStartEvent) else _SEQ_TAGS
            if event.tag is not None and event.tag not in tags:
                raise _Problem(f"YAML tag {excerpt(event.tag)} is not allowed", *_mark(event),
                               "tile IR documents and profiles use plain YAML data, no tags")
            if len(stack) >= max_depth:
                raise _Problem("the document's nesting", *_mark(event), limit=limits.NESTING)
            if stack and stack[-1].kind == "map" and stack[-1].key is _NO_KEY:
                raise _Problem("a mapping key must be a scalar", *_mark(event))
            kind = "map" if isinstance(event, yaml.MappingStartEvent) else "seq"
            stack.append(_Frame(kind, _mark(event)[0] or 0))
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            frame = stack.pop()
            value = mapping(frame.items, frame.line) if frame.kind == "map" else frame.items
            add(value, event)
        elif isinstance(event, yaml.ScalarEvent):
            add(_scalar(event), event)
        elif isinstance(event, yaml.DocumentEndEvent):
            docs.append(root.pop() if root else None)
    return docs


def _key_text(key: Any) -> str:
    return f"'{excerpt(key, quote=False)}'" if isinstance(key, str) else excerpt(key)


def _events(text: str, loader: type) -> Iterable[yaml.Event]:
    return yaml.parse(text, Loader=loader)


_C_LOADER = getattr(yaml, "CSafeLoader", None)


def load_yaml(text: str, origin: str, error: type[TilekitError] = TilekitError,
              mapping: MappingFactory = _plain_dict) -> list[Any]:
    """Every document of a YAML text as plain data (`mapping` builds each mapping).

    Raises `error` located as `origin:line:col` for a syntax error or a broken rule, and a
    `limits.LimitError` for nesting over the budget.
    """
    try:
        if _C_LOADER is not None:
            try:
                return _compose(_events(text, _C_LOADER), mapping)
            except yaml.YAMLError:
                pass  # read again with the pure-Python parser, for the reference message
        return _compose(_events(text, yaml.SafeLoader), mapping)
    except _Problem as p:
        if p.limit is not None:
            raise p.limit.error(p.what, _where(origin, p.line, p.col)) from None
        raise error(p.what, _where(origin, p.line, p.col), p.hint) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or "invalid YAML"
        if exc.context:
            what = f"{what} ({exc.context})"
        raise error(f"YAML syntax error: {what}",
                    _where(origin, mark.line + 1, mark.column + 1) if mark else origin,
                    "check indentation, quoting and brackets near this position") from None
    except yaml.reader.ReaderError as exc:
        line, col = line_col(text, exc.position)
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise error(f"YAML syntax error: unacceptable character U+{char:04X} ({exc.reason})",
                    f"{origin}:{line}:{col}", "a document is plain text") from None
    except yaml.YAMLError as exc:  # pragma: no cover - other parser failures
        raise error(f"YAML error: {excerpt(' '.join(str(exc).split()), 200, quote=False)}",
                    origin) from None


def _where(origin: str, line: int | None, col: int | None) -> str:
    return f"{origin}:{line}:{col}" if line is not None else origin


def line_col(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, col


# -- JSON --------------------------------------------------------------------------------

class _JsonProblem(Exception):
    pass


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonProblem(f"duplicate key {_key_text(key)}",
                               "each key may appear once in a mapping")
        out[key] = value
    return out


def _json_int(text: str) -> int:
    try:
        return bounded_int(text)
    except _Problem as p:
        raise _JsonProblem(p.what, p.hint) from None


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _JsonProblem(f"number {excerpt(text, 30)} overflows to infinity",
                           "JSON numbers must be finite")
    return value


def _json_constant(name: str) -> Any:
    raise _JsonProblem(f"{name} is not valid JSON", "JSON numbers must be finite")


def load_json(text: str, origin: str, error: type[TilekitError] = TilekitError,
              syntax_hint: str | None = None) -> Any:
    """A JSON text as plain data, with the rules of the module docstring."""
    max_depth = limits.NESTING.value
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs, parse_int=_json_int,
                          parse_float=_json_float, parse_constant=_json_constant)
    except json.JSONDecodeError as exc:
        raise error(f"JSON syntax error: {exc.msg}", f"{origin}:{exc.lineno}:{exc.colno}",
                    syntax_hint) from None
    except _JsonProblem as exc:
        raise error(exc.args[0], origin, exc.args[1]) from None
    except RecursionError:
        raise limits.NESTING.error("the document's nesting", origin) from None
    depth = nesting_depth(data)
    if depth > max_depth:
        raise limits.NESTING.error(f"the document's nesting ({depth:,} levels)", origin)
    return data


def nesting_depth(value: Any) -> int:
    """How deeply lists and mappings nest in `value` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in children)
    return deepest
