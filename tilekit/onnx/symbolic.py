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
4. **Confirm** (`_confirm`). The samples are primes from 13, so a value the model computes
   from a size through an op no polynomial follows (`seq == 1`, `min(seq, 8)`, `seq % 2`)
   can agree at all of them and be taken for a constant. The model is imported again with
   every symbol at the smallest size of its (narrowed) range, at the largest, and at the
   smallest even size, and the module for every size, instantiated there, must be that
   import: tensors, weights and structure equal, and op expressions equal as text or, at a
   small point (every symbol at most 8), computing the same values on seeded inputs (at size
   1 an import writes `x[0, j]` for `x[i // 1, j]`). Where it is not, the import is refused
   with the IR path, both values and the flags that import one size or a range.

Every part of the module is the same at the three samples per symbol or an exact polynomial
through them, and agrees with the model at the ranges' ends and at a small even size;
verification (`tilekit.ir.verify`) proves the index maps at the ranges' ends. A value that
changes only strictly inside a range, away from those points (`seq > 40`), is not seen. A
model whose structure changes with a size (a branch on it, a dimension `seq // 2`) is
refused rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import product
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from tilekit.errors import TilekitError, UnsupportedError, excerpt
from tilekit.expr.ops import numpy_dtype
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


def _zero_size_notes(model: onnx.ModelProto, open_dims: Mapping[str, list[int | str]]
                     ) -> list[str]:
    """A warning for each open dimension declared as 0: ONNX's size of an empty tensor, which
    tilekit does not run, and what some exporters write for a size they do not know."""
    notes = []
    for vi in model.graph.input:
        if vi.name not in open_dims:
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value <= 0 and not d.dim_param:
                notes.append(f"input '{excerpt(vi.name, 60, quote=False)}' declares axis "
                             f"{axis} of size {d.dim_value} (an empty tensor, or an exporter's "
                             f"unknown size): imported as the open dimension "
                             f"{open_dims[vi.name][axis]}")
    return notes


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

    notes += _zero_size_notes(model, open_dims)
    if not symbols:
        imported = importer(shapes=shapes_at({}))
        return replace(imported, warnings=tuple(dict.fromkeys(tuple(imported.warnings)
                                                              + tuple(notes))))
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
    _confirm(imported, lambda p: one(p, unfoldable=unfoldable), grid + [check], hint)
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
    valid for, found by bisection on the verifier: its smallest size raised where the module
    is empty below it (a difference of neighbours, `seq - 1` long, needs seq >= 2), its
    largest lowered where it reads past a tensor (a position table of 512 rows bounds the
    sequence at 512); a range given with --dim is kept, and refused when it does not hold."""
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
    problem = holds(lows)   # the smallest sizes first: a length `seq - 1` is empty at 1
    for _ in dims:
        sym = next((s for s, d in dims.items() if problem is not None and s not in explicit
                    and holds({**lows, s: d.max}) is None), None)
        if sym is None:
            break
        dim = dims[sym]
        good, bad = dim.max, dim.min
        while good - bad > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if holds({**lows, sym: mid}) is None else (good, mid)
        dims[sym] = Dim(good, dim.max, tuple(v for v in dim.likely if v >= good))
        lows[sym] = good
        notes.append(f"{sym}: range {good}..{dim.max} (below {good} a tensor of the model is "
                     f"empty); give --dim {sym}=MIN..MAX for another")
        problem = holds(lows)
    if problem is not None:
        at = ", ".join(f"{s}={v}" for s, v in lows.items())
        raise UnsupportedError(f"at {at}, the smallest sizes of the ranges: {problem}",
                               "--dim" if explicit else "model",
                               "give ranges where the model holds (--dim NAME=MIN..MAX), or "
                               f"import one size: {hint}")
    for sym, dim in dims.items():
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


#: A check point whose symbols are all at most this small is compared by running both
#: modules op by op (the expression evaluator, seeded inputs); a larger one by its text (at
#: size 1 an import writes `x[0, j]` where the module for every size has `x[i // 1, j]`).
_RUN_BELOW = 8


def _confirm(imported: Any, one: Callable[[Mapping[str, int]], Any],
             samples: list[dict[str, int]], hint: str) -> None:
    """Import again where the samples cannot see (every symbol at the smallest size of its
    range, at the largest, and at the smallest even size) and require the module for every
    size, instantiated there, to be that import: a value the model computes from a size
    (`seq == 1`, `min(seq, 8)`, `seq % 2`) that happened to agree at the samples (primes from
    13) would otherwise be taken for a constant, and the module would be silently wrong at
    the sizes where it differs. Tensors, weights and op structure must be equal; op
    expressions equal as text, or, at a small point, computing the same values."""
    from tilekit import limits
    from tilekit.ir.codec import to_document
    from tilekit.ir.dims import instantiate

    dims = imported.module.dims
    evens = {s: next((v for v in range(max(d.min, 2), d.max + 1) if v % 2 == 0), d.min)
             for s, d in dims.items()}
    points = [{s: d.min for s, d in dims.items()}, {s: d.max for s, d in dims.items()}, evens]
    hint = f"import one size ({hint}), or give a range where it holds (--dim NAME=MIN..MAX)"
    for point in [dict(p) for p in dict.fromkeys(tuple(sorted(p.items())) for p in points)]:
        if point in samples:
            continue
        with limits.lifted(limits.TENSOR_ELEMENTS, limits.TOTAL_BYTES):
            direct = one(point)
            general = instantiate(imported.module, point)
        at = ", ".join(f"{s}={v}" for s, v in point.items())
        why = (f"the model computes a value from a size that its samples "
               f"({_points_text(samples[:2])}, ...) did not show (a comparison, a minimum or "
               f"a remainder of a size): at {at}")
        docs = to_document(general), to_document(direct.module)
        small = all(v <= _RUN_BELOW for v in point.values())
        differs = _first_difference(*docs, "", skip=_OP_EXPR if small else None)
        if differs is None and small:
            differs = _first_value_difference(general, imported.weights, direct.module,
                                              direct.weights)
            if differs == ():           # not runnable op by op: the text decides
                differs = _first_difference(*docs, "")
        if differs:
            path, mine, theirs = differs
            raise UnsupportedError(f"{why}, {path or 'the module'} is {_short(theirs)}, not "
                                   f"{_short(mine)} as for the other sizes", path or "model",
                                   hint)
        name = _differing_weight(imported.weights, direct.weights)
        if name is not None:
            raise UnsupportedError(f"{why}, weight '{name}' differs", f"tensors.{name}", hint)


def _first_value_difference(general: Any, weights: Mapping[str, np.ndarray], direct: Any,
                            direct_weights: Mapping[str, np.ndarray]
                            ) -> tuple[str, Any, Any] | tuple[()] | None:
    """Run both modules op by op on seeded inputs and return the first op whose result
    differs: (its IR path, a summary of each result); None when none does, () when a module
    cannot run op by op (a control op)."""
    rng = np.random.default_rng(0)
    inputs = {}
    for name in general.inputs:
        t = general.tensors[name]
        dtype = numpy_dtype(t.dtype)
        inputs[name] = (rng.integers(0, 2, t.shape).astype(dtype) if dtype.kind in "iub"
                        else rng.standard_normal(t.shape).astype(dtype))
    values = [_run_whole(general, inputs, weights), _run_whole(direct, inputs, direct_weights)]
    if None in values:
        return ()
    for index, op in enumerate(general.ops):
        for name in _op_outputs(op):
            x, y = values[0].get(name), values[1].get(name)
            if x is None or y is None:
                continue
            if x.shape != y.shape or not np.allclose(x, y, rtol=1e-5, atol=1e-6,
                                                     equal_nan=True):
                return (_op_where(op, index), f"{name} = {_summary(x)}",
                        f"{name} = {_summary(y)}")
    return None


def _op_where(op: Any, index: int, field: str = "") -> str:
    """Where a symbolic import's refusal points: the ONNX node the op came from, and the
    op's IR path."""
    origin = getattr(op, "origin", None)
    at = f"ops[{index}]{field}"
    return f"node '{excerpt(origin, 60, quote=False)}' ({at})" if origin else f"{at} ({op.name})"


def _run_whole(module: Any, inputs: Mapping[str, np.ndarray],
               weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Every op of `module` over its whole iteration space (the expression evaluator, the
    opaque ops' registry): the tensors it computes; None for a module with a control op."""
    from tilekit import opaque
    from tilekit.expr.reference import evaluate
    from tilekit.ir.graph import graph

    env = {**weights, **inputs}
    with np.errstate(all="ignore"):
        for node in graph(module).nodes:
            op = node.op
            if op.kind == "expr":
                out = node.analysis.output
                env[out] = evaluate(node.analysis, env, pad=op.pad,
                                    out_dtype=numpy_dtype(module.tensors[out].dtype))
            elif op.kind == "opaque":
                args = [env[n] if n else None for n in op.opaque.get("inputs", ())]
                results = opaque.run(op.opaque["type"], args, dict(op.opaque.get("attrs")
                                                                    or {}))
                env.update(zip(op.opaque.get("outputs", ()), results))
            else:
                return None
    return env


def _op_outputs(op: Any) -> list[str]:
    if op.kind == "opaque":
        return list((op.opaque or {}).get("outputs", ()))
    target = op.expr.split("=", 1)[0] if isinstance(op.expr, str) else ""
    return [target.split("[", 1)[0].strip().rstrip("+*-/<>").strip()]


def _summary(x: np.ndarray) -> str:
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    return f"{list(x.shape)} starting {', '.join(f'{v:g}' for v in flat[:3])}"


def _first_difference(a: Any, b: Any, path: str, skip: re.Pattern | None = None
                      ) -> tuple[str, Any, Any] | None:
    """(path, a's value, b's value) where two documents first differ (but at paths `skip`
    matches), or None."""
    if a == b or (skip is not None and skip.match(path)):
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in dict.fromkeys(list(a) + list(b)):
            at = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:    # a tensor or field one side lacks
                return at, a.get(key, "absent"), b.get(key, "absent")
            found = _first_difference(a[key], b[key], at, skip)
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return path, f"{len(a)} entries", f"{len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]", skip)
            if found is not None:
                return found
        return None
    return path, a, b


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
            variants, symbols, grid, check, _op_where(ops[index], index, ".expr"), hint))
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


def _differing_weight(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> str | None:
    """The first weight name whose array differs between two imports (or one lacks)."""
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype or \
                not np.array_equal(x, y, equal_nan=True):
            return name
    return None


def _same_weights(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], hint: str) -> None:
    name = _differing_weight(a, b)
    if name is not None:
        raise UnsupportedError(f"weight '{name}' depends on the size of a symbolic dimension "
                               "(folded from the model's shape arithmetic: a value computed "
                               "from a size, such as a loop's trip count)",
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
        counts = " / ".join(str(len(d)) if isinstance(d, (dict, list)) else "?"
                            for d in docs)
        if all(isinstance(d, (dict, list)) and len(d) == len(first) for d in docs):
            counts = f"{counts}, differently named"
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
