"""Import with symbolic dimensions: one module for every size a dynamic dimension may take.

A graph input whose dimension is a `dim_param` (`batch`, `sequence`) or unknown becomes a
symbol of the module's `dims` section (`tilekit.ir.dims`), with the range `--dim NAME=MIN..MAX`
gives it (default `1..DEFAULT_MAX`). The import keeps every converter static: it imports the
model at a few sample sizes and generalises.

1. **What depends on a size.** Constant folding at two samples: a folded value whose *size*
   differs between them (a `Range(0, seq)`, a causal mask `[seq, seq]`, position embeddings
   gathered by it) is sized by a symbol, so it must stay an op rather than become a weight
   (`Importer.unfoldable`); a small integer value that differs only in its elements is shape
   arithmetic (a Reshape's target) and folds at each sample.
2. **Samples.** Each symbol takes two values; the module is imported at every combination
   (2^k imports for k symbols) and at one more point with third values, to check.
3. **Generalise.** The documents must be identical except for tensor dimensions, and the
   weights identical; each dimension that differs is interpolated as a polynomial linear in
   each symbol (`2*seq`, `batch*seq + 1`) with integer coefficients, and must reproduce the
   check sample exactly. Anything else that depends on a size (an op's index map, an
   attribute) is refused with the IR path and the flag that imports one size instead.

This is sound for what it accepts: every part of the module is either the same at all three
sizes per symbol or an exact polynomial through them, and verification (`tilekit.ir.verify`)
proves the index maps at the ranges' ends. A model whose structure changes with a size (a
branch on it, a dimension `seq // 2`) is refused rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import product
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.dims import MAX_SYMBOLS, MAX_VALUE, SYMBOL, Dim, DimExpr
from tilekit.ir.model import Tensor
from tilekit.onnx.names import sanitize

#: The range a symbol gets when `--dim` does not give one.
DEFAULT_MAX = 4096
#: Sample sizes, preferred in this order: primes, so that no sample coincides with a
#: model's own sizes (hidden 768, heads 12, kernel 3) or another symbol's.
_SAMPLES = (13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73)


@dataclass(frozen=True)
class DimFlag:
    """One `--dim`: a static size (`value`), or a range and likely values."""

    value: int | None = None
    min: int = 1
    max: int = DEFAULT_MAX
    likely: tuple[int, ...] = ()


_FLAG = re.compile(r"(\d+)(?:\.\.(\d+))?(?::(\d+(?:,\d+)*))?\Z")


def parse_dim_flag(text: str) -> tuple[str, DimFlag]:
    """`seq=1..2048:1,128` -> ('seq', DimFlag(min=1, max=2048, likely=(1, 128))); `seq=128`
    -> a static size. TilekitError naming `--dim` otherwise."""
    hint = "write --dim NAME=SIZE (one size) or --dim NAME=MIN..MAX[:LIKELY,...]"
    name, sep, rest = text.partition("=")
    name = name.strip()
    m = _FLAG.match(rest.replace(" ", ""))
    if not sep or not name or m is None:
        raise TilekitError(f"cannot read --dim {text!r}", "--dim", hint)
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) else None
    likely = tuple(int(v) for v in m.group(3).split(",")) if m.group(3) else ()
    top = hi if hi is not None else lo
    if not 1 <= lo <= top <= MAX_VALUE or any(not lo <= v <= top for v in likely):
        raise TilekitError(f"--dim {text!r}: sizes must satisfy 1 <= MIN <= LIKELY <= MAX <= "
                           f"{MAX_VALUE}", "--dim", hint)
    if hi is None:
        if likely:
            raise TilekitError(f"--dim {text!r} gives likely values to a static size",
                               "--dim", hint)
        return name, DimFlag(value=lo)
    return name, DimFlag(min=lo, max=hi, likely=tuple(sorted(set(likely))))


# -- the symbols of a model ----------------------------------------------------------------

def open_dimensions(model: onnx.ModelProto, fixed: set[str]
                    ) -> dict[str, list[int | str]]:
    """Each graph input not in `fixed` (given --shape or --value) that has an open dimension:
    its dimensions, a symbol name where open (the dim_param made an identifier, else
    `<input>_<axis>`)."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, list[int | str]] = {}
    for vi in model.graph.input:
        if vi.name in inits or vi.name in fixed or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue  # unknown rank: the static import says so
        dims: list[int | str] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.dim_param:
                dims.append(_symbol_name(d.dim_param))
            else:
                dims.append(_symbol_name(f"{vi.name}_{axis}"))
        if any(isinstance(d, str) for d in dims):
            out[vi.name] = dims
    return out


def _symbol_name(text: str) -> str:
    name = sanitize(text, "dim")
    return name if SYMBOL.match(name) else "d_" + re.sub(r"\W", "_", name)[-60:]


def symbols_of(open_dims: Mapping[str, list[int | str]]) -> list[str]:
    seen: list[str] = []
    for dims in open_dims.values():
        for d in dims:
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


# -- the import ----------------------------------------------------------------------------

def import_symbolic(importer: Callable[..., Any], model: onnx.ModelProto,
                    shapes: Mapping[str, Sequence[int]], values: Mapping[str, Any],
                    dim_flags: Mapping[str, DimFlag]) -> Any:
    """The `Imported` of `model` with its open input dimensions as symbols (or fixed by
    static `--dim`s). `importer(shapes=..., unfoldable=..., fold_only=...)` runs one static
    import (`tilekit.onnx.importer`)."""
    fixed = set(shapes) | {n for n in values}
    by_sanitized = {sanitize(i.name): i.name for i in model.graph.input}
    fixed |= {by_sanitized.get(k, k) for k in shapes}
    open_dims = open_dimensions(model, fixed)
    symbols = symbols_of(open_dims)
    merged = _merged_by_axis(open_dims)
    if merged and not set(dim_flags) & set(merged) and not _imports_apart(
            importer, model, shapes, open_dims, symbols):
        # An exporter that names every input's dimensions apart (s97, s52) when the model
        # needs them equal: the same axis of inputs of the same rank is one symbol.
        open_dims = {n: [merged.get(d, d) if isinstance(d, str) else d for d in ds]
                     for n, ds in open_dims.items()}
        symbols = symbols_of(open_dims)
        notes = [f"symbols {', '.join(sorted(merged))} taken equal to "
                 f"{', '.join(merged[s] for s in sorted(merged))} (the model needs them equal)"]
    else:
        notes = []
    unknown = sorted(set(dim_flags) - set(symbols))
    if unknown:
        listed = ", ".join(symbols) or "none (every input dimension is static)"
        raise TilekitError(f"--dim names '{unknown[0]}', which is not an open dimension of "
                           "the model's inputs", "--dim", f"its symbols: {listed}")
    static = {s: f.value for s, f in dim_flags.items() if f.value is not None}
    symbols = [s for s in symbols if s not in static]
    if len(symbols) > MAX_SYMBOLS:
        raise UnsupportedError(f"the model's inputs have {len(symbols)} open dimensions "
                               f"({', '.join(symbols)}); at most {MAX_SYMBOLS} can stay "
                               "symbolic", "graph.input",
                               "give the others a size with --dim NAME=SIZE")
    dims = {s: _dim(s, dim_flags.get(s)) for s in symbols}

    def shapes_at(point: Mapping[str, int]) -> dict[str, list[int]]:
        return _input_shapes(shapes, open_dims, {**point, **static})

    if not symbols:
        return importer(shapes=shapes_at({}))
    samples = {s: _sample_values(s, d, i) for i, (s, d) in enumerate(dims.items())}
    low = {s: v[0] for s, v in samples.items()}
    high = {s: v[1] for s, v in samples.items()}
    hint = " ".join(f"--dim {s}={d.likely[0] if d.likely else d.min}" for s, d in dims.items())

    def one(point: Mapping[str, int], **kw: Any) -> Any:
        try:
            return importer(shapes=shapes_at(point), **kw)
        except TilekitError as exc:
            at = ", ".join(f"{s}={v}" for s, v in point.items())
            raise type(exc)(f"{exc.what} (importing with {at} to keep "
                            f"{', '.join(symbols)} symbolic)", exc.where,
                            f"{exc.hint}; or import one size: {hint}" if exc.hint
                            else f"import one size: {hint}") from None

    unfoldable = _sized_by_symbols(one(low, fold_only=True), one(high, fold_only=True))
    grid = [dict(zip(symbols, c)) for c in product(*((low[s], high[s]) for s in symbols))]
    check = {s: v[2] for s, v in samples.items()}
    imports = [one(p, unfoldable=unfoldable) for p in grid + [check]]
    imported = _generalise(imports, grid + [check], dims, hint)
    imported, narrowed = _fit_ranges(imported, {s for s in dims if s in dim_flags}, hint)
    warnings = tuple(dict.fromkeys(tuple(imported.warnings) + tuple(notes) + narrowed))
    return replace(imported, warnings=warnings)


def _input_shapes(shapes: Mapping[str, Sequence[int]], open_dims: Mapping[str, list[int | str]],
                  values: Mapping[str, int]) -> dict[str, Sequence[int]]:
    """The `--shape`s with each open input at `values` of its symbols: one static import's."""
    at: dict[str, Sequence[int]] = dict(shapes)
    for name, ds in open_dims.items():
        at[name] = [d if isinstance(d, int) else values[d] for d in ds]
    return at


def _merged_by_axis(open_dims: Mapping[str, list[int | str]]) -> dict[str, str]:
    """{symbol: the symbol it is taken equal to}: at each axis of inputs of one rank, the
    first input's symbol stands for the others' (empty when nothing would merge)."""
    first: dict[tuple[int, int], str] = {}
    merged: dict[str, str] = {}
    for dims in open_dims.values():
        for axis, d in enumerate(dims):
            if isinstance(d, str):
                keep = first.setdefault((len(dims), axis), d)
                if keep != d and d not in first.values():
                    merged[d] = keep
    return merged


def _imports_apart(importer: Callable[..., Any], model: onnx.ModelProto,
                   shapes: Mapping[str, Sequence[int]], open_dims: Mapping[str, list[int | str]],
                   symbols: list[str]) -> bool:
    """Whether the model folds with every symbol at a different size."""
    try:
        importer(shapes=_input_shapes(shapes, open_dims, dict(zip(symbols, _SAMPLES))),
                 fold_only=True)
    except TilekitError:
        return False
    return True


def _fit_ranges(imported: Any, explicit: set[str], hint: str) -> tuple[Any, tuple[str, ...]]:
    """The import with each symbol's default range narrowed to the sizes its index maps are
    valid for (a position table of 512 rows bounds the sequence at 512), found by bisection
    on the verifier; a range given with --dim is kept, and refused when it does not hold."""
    from tilekit import limits
    from tilekit.errors import ExprError, IRError
    from tilekit.ir.dims import instantiate
    from tilekit.ir.verify import verify

    module = imported.module
    if imported.weights:  # attach_files names the sidecar; the verifier wants a name
        module = replace(module, weights={"file": "weights.npz", "sha256": "0" * 64})
    notes = []

    def holds(values: Mapping[str, int]) -> str | None:
        try:
            with limits.lifted(limits.TENSOR_ELEMENTS, limits.TOTAL_BYTES):
                verify(instantiate(module, values))
        except (IRError, ExprError) as exc:
            return exc.message() if hasattr(exc, "message") else str(exc)
        return None

    dims = dict(module.dims)
    lows = {s: d.min for s, d in dims.items()}
    for sym, dim in module.dims.items():
        problem = holds({**lows, sym: dim.max})
        if problem is None:
            continue
        if sym in explicit:
            raise UnsupportedError(f"at {sym}={dim.max}, the top of its --dim range: {problem}",
                                   "--dim", f"give a smaller range, or {hint}")
        good, bad = dim.min, dim.max
        if holds({**lows, sym: good}) is not None:
            raise UnsupportedError(f"at {sym}={good}: {problem}", "model", hint)
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if holds({**lows, sym: mid}) is None else (good, mid)
        dims[sym] = Dim(dim.min, good, tuple(v for v in dim.likely if v <= good))
        notes.append(f"{sym}: range {dim.min}..{good} (above {good} the model reads past a "
                     f"tensor's end); give --dim {sym}=MIN..MAX for another")
    if not notes:
        return imported, ()
    return replace(imported, module=replace(imported.module, dims=dims)), tuple(notes)


def _dim(name: str, flag: DimFlag | None) -> Dim:
    flag = flag or DimFlag()
    return Dim(flag.min, flag.max, flag.likely)


def _sample_values(name: str, dim: Dim, index: int) -> tuple[int, int, int]:
    """Three distinct sizes in the symbol's range, not 1 (a broadcast size) where the range
    allows: primes first, a different run of them for each symbol."""
    pool = [v for v in _SAMPLES[3 * index:] + _SAMPLES[:3 * index] if dim.min <= v <= dim.max]
    pool += [v for v in range(max(dim.min, 2), min(dim.max, 64) + 1) if v not in pool]
    pool += [v for v in (dim.max, dim.max - 1, dim.min) if dim.min <= v and v not in pool]
    picked = list(dict.fromkeys(pool))[:3]
    if len(picked) < 3:
        raise TilekitError(f"the range {dim.text()} of {name} holds fewer than three sizes, "
                           "too few to keep it symbolic", "--dim",
                           f"import one size: --dim {name}={dim.min}")
    return picked[0], picked[1], picked[2]


def _sized_by_symbols(a: Any, b: Any) -> frozenset[str]:
    """The folded values whose size differs between two samples, or whose elements differ
    and are more than a few integers (shape arithmetic): they stay ops."""
    out = set()
    for name, x in a.consts.items():
        y = b.consts.get(name)
        if y is None or x.shape != y.shape:
            out.add(name)
        elif not np.array_equal(x, y) and not (
                np.issubdtype(x.dtype, np.integer) and x.ndim <= 1 and x.size <= 16):
            out.add(name)
    return frozenset(out)


def _generalise(imports: list[Any], points: list[dict[str, int]], dims: Mapping[str, Dim],
                hint: str) -> Any:
    from tilekit.ir.codec import to_document

    first = imports[0]
    for imp in imports[1:]:
        _same_weights(first.weights, imp.weights, hint)
    docs = [to_document(i.module) for i in imports]
    varying: dict[tuple[str, int], list[int]] = {}
    texts: dict[int, list[str]] = {}
    _compare(docs, "", varying, texts, hint)
    tensors = dict(first.module.tensors)
    grid, check = points[:-1], points[-1]
    symbols = list(dims)
    ops = list(first.module.ops)
    for index, variants in sorted(texts.items()):
        ops[index] = replace(ops[index], expr=_generalise_text(
            variants, symbols, grid, check, f"ops[{index}].expr", hint))
    for (name, axis), sizes in sorted(varying.items()):
        expr = _interpolate(symbols, grid, sizes[:-1])
        if expr is None or expr.evaluate(check) != sizes[-1]:
            raise UnsupportedError(
                f"tensor '{name}' dimension {axis} is not a polynomial of the symbols "
                f"(sizes {', '.join(map(str, sizes[:3]))} at {_points_text(points[:3])}; "
                "a strided window or a division by a size)",
                f"tensors.{name}.shape[{axis}]", f"import one size: {hint}")
        t = tensors[name]
        shape = list(t.shape)
        const = expr.constant()
        shape[axis] = const if const is not None else str(expr)
        tensors[name] = Tensor(tuple(shape), t.dtype, t.role)
    module = replace(first.module, tensors=tensors, ops=tuple(ops), dims=dict(dims))
    return replace(first, module=module)


def _same_weights(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], hint: str) -> None:
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype or \
                not np.array_equal(x, y, equal_nan=True):
            raise UnsupportedError(f"weight '{name}' depends on the size of a symbolic "
                                   "dimension (folded from the model's shape arithmetic)",
                                   f"tensors.{name}", f"import one size: {hint}")


_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\s+|.")
_OP_EXPR = re.compile(r"ops\[(\d+)\]\.expr\Z")


def _generalise_text(variants: list[str], symbols: list[str], grid: list[dict[str, int]],
                     check: dict[str, int], path: str, hint: str) -> str:
    """An op's expression at every sample -> its text with the integer literals that differ
    written in the symbols (`i // 17` -> `i // $seq`)."""
    tokens = [_TOKEN.findall(v) for v in variants]
    out = []
    for position, column in enumerate(zip(*tokens)):
        if all(t == column[0] for t in column):
            out.append(column[0])
            continue
        expr = None
        if all(t.isdigit() for t in column):
            sizes = [int(t) for t in column]
            expr = _interpolate(symbols, grid, sizes[:-1])
        if expr is None or expr.evaluate(check) != int(column[-1]):
            raise UnsupportedError(f"the index map depends on a symbolic dimension in a way "
                                   f"tilekit cannot write symbolically ({column[0]} / "
                                   f"{column[1]} at {_points_text(grid[:2])})", path,
                                   f"import one size: {hint}")
        out.append(text_of(expr))
    return "".join(out)


def text_of(expr: DimExpr) -> str:
    """A dimension expression in an op's expression text: symbols as `$name`."""
    text = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: "$" + m.group(0), str(expr))
    return text if re.fullmatch(r"\$\w+", text) else f"({text})"


def _compare(docs: list[Any], path: str, varying: dict[tuple[str, int], list[int]],
             texts: dict[int, list[str]], hint: str) -> None:
    """Walk the documents together: equal everywhere but tensor dimensions and the integer
    literals of op expressions (collected)."""
    first = docs[0]
    if all(d == first for d in docs[1:]):
        return
    m = _OP_EXPR.match(path)
    if m and all(isinstance(d, str) for d in docs) and len({len(_TOKEN.findall(d))
                                                            for d in docs}) == 1:
        texts[int(m.group(1))] = list(docs)
        return
    parts = path.split(".")
    if (len(parts) == 3 and parts[0] == "tensors" and parts[2] == "shape"
            and all(isinstance(d, list) and len(d) == len(first) for d in docs)):
        for axis in range(len(first)):
            sizes = [d[axis] for d in docs]
            if any(s != sizes[0] for s in sizes):
                varying[(parts[1], axis)] = sizes
        return
    if all(isinstance(d, dict) for d in docs) and all(list(d) == list(first) for d in docs):
        for key in first:
            _compare([d[key] for d in docs], f"{path}.{key}" if path else str(key), varying,
                     texts, hint)
        return
    if all(isinstance(d, list) for d in docs) and all(len(d) == len(first) for d in docs):
        for i in range(len(first)):
            _compare([d[i] for d in docs], f"{path}[{i}]", varying, texts, hint)
        return
    if path in ("tensors", "ops", "kernels"):
        counts = " vs ".join(str(len(d)) if isinstance(d, (dict, list)) else "?"
                             for d in docs[:2])
        raise UnsupportedError(f"the model's structure changes with the size of a symbolic "
                               f"dimension ({counts} {path}: an op unrolled over it, or "
                               "chosen by it)", path, f"import one size: {hint}")
    shown = " / ".join(_short(d) for d in docs[:2])
    raise UnsupportedError(f"the imported module differs between sizes at {path or 'the top'} "
                           f"({shown}): only tensor shapes may depend on a symbolic dimension",
                           path or "model", f"import one size: {hint}")


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _points_text(points: list[dict[str, int]]) -> str:
    return "; ".join(", ".join(f"{s}={v}" for s, v in p.items()) for p in points)


def _interpolate(symbols: list[str], grid: list[dict[str, int]], sizes: list[int]
                 ) -> DimExpr | None:
    """The polynomial linear in each symbol through `sizes` at the grid's corners (exact, by
    products of linear Lagrange factors), or None when a coefficient is not an integer."""
    total: dict[tuple[str, ...], Fraction] = {}
    lows = {s: min(p[s] for p in grid) for s in symbols}
    highs = {s: max(p[s] for p in grid) for s in symbols}
    for point, size in zip(grid, sizes):
        poly: dict[tuple[str, ...], Fraction] = {(): Fraction(size)}
        for s in symbols:
            v = point[s]
            other = highs[s] if v == lows[s] else lows[s]
            scale = Fraction(1, v - other)
            factor = {(): -other * scale, (s,): scale}
            # `s` is in no key of `poly` yet: the products' keys are distinct
            poly = {tuple(sorted(k1 + k2)): c1 * c2 for k1, c1 in poly.items()
                    for k2, c2 in factor.items()}
        for k, c in poly.items():
            total[k] = total.get(k, Fraction(0)) + c
    if any(c.denominator != 1 for c in total.values()):
        return None
    return DimExpr.of({k: int(c) for k, c in total.items()})
