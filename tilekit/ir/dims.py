"""Symbolic dimensions: a module whose sizes are not all known until it runs.

A module imported from a model with dynamic dimensions (a batch, a sequence length) keeps
them as *symbols* declared in its `dims` section, each with a range and optional likely
values:

    dims:
      seq: {min: 1, max: 2048, likely: [1, 128]}
    tensors:
      input_ids: {shape: [1, seq], dtype: int64, role: input}
      scores: {shape: [1, 12, seq, seq], dtype: float32}
      flat: {shape: [seq*768], dtype: float32}

A tensor dimension is then an integer or a *dimension expression*: a polynomial with integer
coefficients in the symbols, each symbol of degree at most one in a term (`seq`,
`2*seq + 1`, `batch*seq`). In an op's expression a symbol is written `$seq` (an index map
`x[i // $seq, i % $seq]`, a polynomial in parentheses `($batch*$seq)`). Symbols appear only
there and in the module's tensor shapes: axes and attributes are the same at every size, and
a symbolic module has no control ops (a loop's regions are imported for one size).

`instantiate(module, values)` gives the static module at one binding of the symbols: every
stage after import and every executor works on static modules, so a symbolic module is run
by binding its symbols from the inputs' shapes (`bind`) and instantiating it. `is_symbolic`
and `require_static` are how the stages that need sizes refuse a symbolic module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from tilekit.errors import IRError, TilekitError

__all__ = ["Dim", "DimExpr", "bind", "dims_document", "instantiate", "is_symbolic",
           "named_symbols", "parse_dim_expr", "parse_size_lists", "parse_sizes", "read_dims",
           "require_static", "require_symbolic", "symbolic_inputs"]

#: A symbol: an identifier (the model's dim_param, made an identifier).
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
#: A symbol in an op's expression text: `$seq` (expressions have no `$`, so no name clashes).
SYMBOL_REF = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
#: Most symbols a module may declare (each one multiplies what an import samples).
MAX_SYMBOLS = 4
#: Largest value a range may declare.
MAX_VALUE = 1 << 24
#: Most likely values per symbol.
MAX_LIKELY = 16
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TERM = re.compile(rf"\s*([+-])?\s*(\d+|{_NAME})((?:\s*\*\s*(?:\d+|{_NAME}))*)\s*")


@dataclass(frozen=True)
class Dim:
    """A symbol's range (inclusive) and the values it is most likely to take."""

    min: int
    max: int
    likely: tuple[int, ...] = ()

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"min": self.min, "max": self.max}
        if self.likely:
            out["likely"] = list(self.likely)
        return out

    def text(self) -> str:
        return f"{self.min}..{self.max}"


@dataclass(frozen=True)
class DimExpr:
    """A dimension expression: integer-coefficient terms, each a product of distinct symbols
    (`()` is the constant term). Canonical: no zero terms, terms sorted."""

    terms: tuple[tuple[int, tuple[str, ...]], ...]

    @staticmethod
    def of(terms: Mapping[tuple[str, ...], int]) -> "DimExpr":
        kept = [(c, tuple(sorted(s))) for s, c in terms.items() if c != 0]
        return DimExpr(tuple(sorted(kept, key=lambda t: (-len(t[1]), t[1]))))

    def symbols(self) -> set[str]:
        return {s for _, syms in self.terms for s in syms}

    def constant(self) -> int | None:
        """The value when the expression names no symbol, else None."""
        if self.symbols():
            return None
        return sum(c for c, _ in self.terms)

    def evaluate(self, values: Mapping[str, int]) -> int:
        total = 0
        for coef, syms in self.terms:
            term = coef
            for s in syms:
                term *= values[s]
            total += term
        return total

    def __str__(self) -> str:
        parts = []
        for coef, syms in self.terms:
            factors = ([] if coef in (1, -1) and syms else [str(abs(coef))]) + list(syms)
            text = "*".join(factors)
            if not parts:
                parts.append(("-" if coef < 0 else "") + text)
            else:
                parts.append(("- " if coef < 0 else "+ ") + text)
        return " ".join(parts) if parts else "0"


def named_symbols(text: str) -> set[str]:
    """The symbols a dimension expression names as written, a term that cancels (`0*nope`,
    `s - s`) included: its DimExpr keeps only those that remain."""
    return set(re.findall(_NAME, text))


def parse_dim_expr(text: str) -> DimExpr:
    """`2*seq + 1` -> DimExpr; ValueError with the reason when `text` is not one."""
    if not isinstance(text, str) or not text.strip() or len(text) > 256:
        raise ValueError("not a dimension expression")
    terms: dict[tuple[str, ...], int] = {}
    pos, first = 0, True
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or m.end() == pos or (m.group(1) is None and not first):
            raise ValueError(f"cannot read {text[pos:pos + 20]!r}")
        factors = [m.group(2)] + [f.strip() for f in m.group(3).split("*") if f.strip()]
        coef, syms = -1 if m.group(1) == "-" else 1, []
        for f in factors:
            if f.isdigit():
                coef *= int(f)
            else:
                syms.append(f)
        if len(set(syms)) != len(syms):
            raise ValueError(f"a symbol appears twice in one term ({'*'.join(syms)}); "
                             "dimension expressions are at most linear in each symbol")
        key = tuple(sorted(syms))
        terms[key] = terms.get(key, 0) + coef
        pos, first = m.end(), False
    return DimExpr.of(terms)


# -- the dims section ----------------------------------------------------------------------

def read_dims(value: Any, path: str = "dims", origin: str | None = None) -> dict[str, Dim]:
    """The `dims` section as `Dim`s; IRError located at `path` for anything malformed."""
    from tilekit.ir.keys import type_name, where

    def fail(at: str, what: str, hint: str) -> IRError:
        return IRError(what, where(origin, at), hint)

    if not isinstance(value, Mapping):
        raise fail(path, f"'dims' must be a mapping of symbols, got {type_name(value)}",
                   "dims: {seq: {min: 1, max: 2048}}")
    if len(value) > MAX_SYMBOLS:
        raise fail(path, f"{len(value)} symbols; at most {MAX_SYMBOLS} are supported",
                   "give the others a static size (tk-import --dim NAME=SIZE)")
    out = {}
    for name, rec in value.items():
        at = f"{path}.{name}"
        if not isinstance(name, str) or not SYMBOL.match(name):
            raise fail(path, f"symbol name {name!r} is not an identifier",
                       "letters, digits and '_', not starting with a digit")
        if not isinstance(rec, Mapping) or set(rec) - {"min", "max", "likely"} or \
                not {"min", "max"} <= set(rec):
            raise fail(at, "a symbol is {min: INT, max: INT[, likely: [INT, ...]]}",
                       "e.g. {min: 1, max: 2048, likely: [128]}")
        lo, hi = rec["min"], rec["max"]
        for key, v in (("min", lo), ("max", hi)):
            if type(v) is not int or not 1 <= v <= MAX_VALUE:
                raise fail(f"{at}.{key}", f"must be an integer in 1..{MAX_VALUE}, got {v!r}",
                           "sizes are positive")
        if lo > hi:
            raise fail(at, f"min {lo} is above max {hi}", "swap them")
        likely = rec.get("likely", [])
        if not isinstance(likely, list) or len(likely) > MAX_LIKELY or any(
                type(v) is not int or not lo <= v <= hi for v in likely):
            raise fail(f"{at}.likely", f"must be a list of at most {MAX_LIKELY} integers in "
                       f"{lo}..{hi}", "values the symbol often takes, within its range")
        out[name] = Dim(lo, hi, tuple(sorted(set(likely))))
    return out


def dims_document(dims: Mapping[str, Dim]) -> dict[str, Any]:
    return {name: dims[name].document() for name in dims}


def is_symbolic(module: Any) -> bool:
    return bool(getattr(module, "dims", None))


def require_static(module: Any, what: str) -> None:
    """Refuse a symbolic module where sizes must be known (a pass, a schedule, a printer)."""
    if is_symbolic(module):
        listed = ", ".join(f"{n} ({d.text()})" for n, d in module.dims.items())
        example = " ".join(f"--dim {n}={d.likely[0] if d.likely else d.min}"
                           for n, d in module.dims.items())
        raise TilekitError(f"{what} needs static sizes; this module has symbolic dimensions "
                           f"{listed}", "dims",
                           f"give this command the sizes ({example}), import the model "
                           "for one size with the same flags, or run the symbolic module "
                           "with tk-run (any size in the ranges)")


def require_symbolic(module: Any) -> None:
    """Refuse `--dim` sizes for a module without symbolic dimensions (every command)."""
    if not is_symbolic(module):
        raise TilekitError("--dim gives sizes, but the module has no symbolic dimensions",
                           "--dim", "drop --dim")


# -- binding and instantiation -------------------------------------------------------------

def shape_entry(value: Any) -> int | DimExpr:
    """A tensor shape entry: an int, or a dimension expression's text parsed."""
    if type(value) is int:
        return value
    return parse_dim_expr(value)


def symbolic_inputs(module: Any) -> list[tuple[str, int, str]]:
    """(input, axis, symbol) for every input dimension that is exactly one symbol."""
    out = []
    for name in module.inputs:
        tensor = module.tensors.get(name) if isinstance(name, str) else None
        if not isinstance(getattr(tensor, "shape", None), tuple):
            continue   # an undeclared input: the verifier says so
        for axis, d in enumerate(tensor.shape):
            if isinstance(d, str):
                e = parse_dim_expr(d)
                if len(e.terms) == 1 and e.terms[0][0] == 1 and len(e.terms[0][1]) == 1:
                    out.append((name, axis, e.terms[0][1][0]))
    return out


def bind(module: Any, shapes: Mapping[str, tuple[int, ...]], given: Mapping[str, int]
         | None = None, where_: str = "inputs") -> dict[str, int]:
    """The symbols' values from the inputs' shapes (and `given` values for the others);
    TilekitError for a shape that contradicts another, a rank mismatch, a value out of its
    range or a symbol left unbound."""
    values: dict[str, int] = dict(given or {})
    seen: dict[str, str] = {s: "--dim" for s in values}
    for name, axis, sym in symbolic_inputs(module):
        if name not in shapes:
            continue
        shape = tuple(shapes[name])
        rank = len(module.tensors[name].shape)
        if len(shape) != rank:
            raise TilekitError(f"input '{name}' has rank {len(shape)}, the module declares "
                               f"{rank} ({_shape_text(module.tensors[name].shape)})", where_,
                               "give an array of the declared rank")
        size = int(shape[axis])
        if sym in values and values[sym] != size:
            raise TilekitError(f"input '{name}' dimension {axis} is {size} but {sym} is "
                               f"{values[sym]} (from {seen[sym]})", where_,
                               f"every use of {sym} must have the same size")
        values.setdefault(sym, size)
        seen.setdefault(sym, f"input '{name}'")
    for sym, dim in module.dims.items():
        if sym not in values:
            raise TilekitError(f"symbol {sym} is not bound by any input", where_,
                               f"give it with --dim {sym}=SIZE")
        if not dim.min <= values[sym] <= dim.max:
            raise TilekitError(f"{sym} = {values[sym]} (from {seen.get(sym, '--dim')}) is "
                               f"outside its range {dim.text()}", where_,
                               f"give a size in {dim.text()}, or import the model again with "
                               f"--dim {sym}=MIN..MAX")
    unknown = sorted(set(values) - set(module.dims))
    if unknown:
        raise TilekitError(f"--dim names '{unknown[0]}', which is not a symbol of the module",
                           "--dim", "symbols: " + ", ".join(module.dims))
    for name in module.inputs:
        if name not in shapes:
            continue
        want = tuple(evaluate_shape(module.tensors[name].shape, values))
        if tuple(shapes[name]) != want:
            raise TilekitError(f"input '{name}' has shape {list(shapes[name])}, expected "
                               f"{list(want)} ({_shape_text(module.tensors[name].shape)} with "
                               f"{_binding_text(values)})", where_,
                               "give an array of the declared shape")
    return values


def evaluate_shape(shape: Iterable[Any], values: Mapping[str, int]) -> list[int]:
    """`shape` at `values`: each expression evaluated (an entry of another type kept, for the
    verifier to name)."""
    return [parse_dim_expr(d).evaluate(values) if isinstance(d, str) else d for d in shape]


def instantiate(module: Any, values: Mapping[str, int]) -> Any:
    """The static module at `values` (every symbol bound): tensor shapes evaluated, `$name`s
    in op expressions replaced by their values, the `dims` section gone."""
    from dataclasses import replace

    from tilekit.ir.model import Tensor

    if not is_symbolic(module):
        return module

    def text(expr):
        return SYMBOL_REF.sub(lambda m: str(values[m.group(1)]), expr)

    # entries of the wrong type stay as they are, for the verifier to name
    tensors = {n: Tensor(tuple(evaluate_shape(t.shape, values)), t.dtype, t.role)
               if isinstance(t, Tensor) and isinstance(t.shape, tuple) else t
               for n, t in module.tensors.items()}
    ops = tuple(replace(op, expr=text(op.expr)) if isinstance(op.expr, str) and "$" in op.expr
                else op for op in module.ops)
    return replace(module, tensors=tensors, ops=ops, dims={})


def specialise(module: Any, values: Mapping[str, int]) -> Any:
    """The static module at `values` (every symbol given, each within its range) with the
    stage `specialise {dims: values}` recorded: what a stage command makes of a symbolic
    module given `--dim NAME=SIZE` flags (it verifies the instance: sizes change what the
    verifier proves)."""
    missing = [n for n in module.dims if n not in values]
    if missing:
        listed = ", ".join(f"{n} ({module.dims[n].text()})" for n in missing)
        raise TilekitError(f"--dim gives no size for {listed}", "--dim",
                           "give every symbol a size: "
                           + " ".join(f"--dim {n}=SIZE" for n in missing))
    bound = bind(module, {}, values, "--dim")
    return instantiate(module, bound).with_stage("specialise",
                                                 dims=dict(sorted(bound.items())))


def parse_sizes(flags: Iterable[str]) -> dict[str, int]:
    """`--dim NAME=SIZE` flags (each symbol once) as {name: size}."""
    return {name: sizes[0] for name, sizes in _parse_dim_flags(
        flags, False, "write --dim NAME=SIZE (a positive integer), once per symbol").items()}


def parse_size_lists(flags: Iterable[str]) -> dict[str, list[int]]:
    """`--dim NAME=SIZE[,SIZE...]` flags (each symbol once; tk-run runs every combination)
    as {name: [sizes, in order, each once]}."""
    return _parse_dim_flags(flags, True, "write --dim NAME=SIZE or NAME=SIZE,SIZE,... "
                            "(positive integers), once per symbol")


def _parse_dim_flags(flags: Iterable[str], several: bool, hint: str) -> dict[str, list[int]]:
    """The one reader of `--dim` flags: a name, `=`, then one size (or, with `several`, a
    comma-separated list), each of ASCII digits, at most 12 of them (`int` would also take
    `3_0` and other scripts' digits); a symbol named twice is refused."""
    sizes: dict[str, list[int]] = {}
    for flag in flags:
        name, eq, text = flag.partition("=")
        name = name.strip()
        texts = [t.strip() for t in (text.split(",") if several else [text])]
        if not eq or not name or not all(t.isascii() and t.isdigit() and len(t) <= 12
                                          for t in texts):
            raise TilekitError(f"cannot read --dim {flag[:60]!r}", "--dim", hint)
        if name in sizes:
            raise TilekitError(f"--dim names '{name[:40]}' twice", "--dim",
                               "give each symbol once")
        sizes[name] = list(dict.fromkeys(int(t) for t in texts))
    return sizes


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _binding_text(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
