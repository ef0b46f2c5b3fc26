"""The one table of operator semantics of the expression language.

Everything that gives an operator a meaning reads it from here: the parser (names and arity),
the NumPy reference executor and the tile-by-tile executor (NumPy spellings, reduction
identities and combiners), the CUDA code generator (C spellings, identities per compute kind,
warp-shuffle helpers) and the IR verifier (pad values). Adding a function is one entry in
`FUNCTIONS`; a name that is not here is an error everywhere, listing what is.

- `REDUCTIONS`: the reduction assignments (`+= *= max= min=`): identity, NumPy reducer and
  pairwise combiner, the C helper that combines two values and the warp-shuffle reducer.
- `FUNCTIONS`: calls in bodies (`exp(x)`, `max(a, b)`, `select(c, a, b)`, casts), each with
  its arity, its family (which decides the result kind in C), its NumPy implementation and
  its C spellings for float and double.
- `BINARY_OPERATORS`: infix operators and their NumPy ufuncs.
- `PAD_VALUES`: what an op may read outside a tensor (`pad: "0" | "-inf" | "inf"`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tilekit.errors import UnsupportedError

#: The IR's element types (`tilekit.ir.model.DTYPES`); each is also a cast function.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
          "uint8", "bool")

#: Pad values an op may declare, as the float each stands for.
PAD_VALUES: dict[str, float] = {"0": 0.0, "-inf": -math.inf, "inf": math.inf}


@dataclass(frozen=True)
class Reduction:
    """One reduction assignment (`y[i] += x[i, j]`)."""

    assign: str
    name: str
    identity: float               # of numeric values
    identity_bool: bool           # of bool values (max of nothing is false)
    reduce: Callable              # NumPy: array, axis -> reduced
    combine: Callable             # NumPy: two partial results -> one
    c_helper: str | None          # runtime.cuh function combining two values (None: C op)
    warp_helper: str              # runtime.cuh warp-shuffle reducer


REDUCTIONS: dict[str, Reduction] = {r.assign: r for r in (
    Reduction("+=", "sum", 0.0, False, np.sum, np.add, None, "tk_warp_sum"),
    Reduction("*=", "product", 1.0, True, np.prod, np.multiply, None, "tk_warp_prod"),
    Reduction("max=", "max", -math.inf, False, np.max, np.maximum, "tk_max", "tk_warp_max"),
    Reduction("min=", "min", math.inf, True, np.min, np.minimum, "tk_min", "tk_warp_min"),
)}


# -- NumPy implementations that NumPy lacks ------------------------------------------------

def _erf(x):
    """erf to ~1e-7 absolute error (Abramowitz & Stegun 7.1.26, evaluated in float64).

    NumPy has no erf and SciPy is not a dependency; fp32 checks use a 1e-5 relative bound.
    """
    x64 = np.asarray(x, dtype=np.float64)
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x64))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                            + t * 1.061405429))))
    y = 1.0 - poly * np.exp(-x64 * x64)
    out = np.sign(x64) * y
    return out.astype(np.result_type(x, np.float32)) if np.ndim(x) else out


def _sigmoid(x):
    # Split by sign so that exp never overflows.
    x = np.asarray(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype if x.dtype.kind == "f"
                                                                     else np.float64)


#: Storage-only float types: their values compute as float32 (specs/expressions.md,
#: "Precision"): read as float32, every operation and accumulation in float32, rounded to the
#: storage type once, on store or at an explicit cast.
HALF_DTYPES = ("float16", "bfloat16")


def round_to(x, dtype: str) -> np.ndarray:
    """`x` rounded to half type `dtype` (to nearest, ties to even), as float32 values."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    nan = (bits & 0x7F800000) == 0x7F800000
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(nan & ((bits & 0x7FFFFF) != 0), x, rounded.view(np.float32))


def is_half(dtype) -> bool:
    """A NumPy dtype (or IR name) of a storage-only float type (ml_dtypes' bfloat16 too)."""
    if isinstance(dtype, str):
        return dtype in HALF_DTYPES
    dtype = np.dtype(dtype)
    if dtype.itemsize != 2:          # the common case, without the name lookup
        return False
    return dtype == np.float16 or dtype.name == "bfloat16"


_SIMPLE_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8",
                  "bool")


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an IR dtype name (bfloat16 through ml_dtypes, which onnx installs)."""
    if name in _SIMPLE_DTYPES:
        return np.dtype(name)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
            raise UnsupportedError("dtype bfloat16 needs the ml_dtypes package", None,
                                   "pip install ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    raise UnsupportedError(f"dtype '{name}' has no NumPy equivalent", None,
                           f"known dtypes: {', '.join(_SIMPLE_DTYPES + ('bfloat16',))}")


def _cast(dtype: str) -> Callable:
    if dtype in HALF_DTYPES:  # rounds, and keeps computing in float32
        return lambda x: round_to(x, dtype)
    target = np.dtype(dtype)
    return lambda x: np.asarray(x).astype(target)


@dataclass(frozen=True)
class Function:
    """A function callable in a body.

    `family` decides the compute kind in kernels (tilekit.codegen.values): "math" promotes to float,
    "signed" keeps the argument's kind (ints stay ints), "predicate" gives bool, "cast" the
    named dtype, "binary" joins the arguments' kinds, "select" joins its two values.
    """

    name: str
    arity: int
    family: str
    numpy: Callable
    c_float: str | None = None
    c_double: str | None = None


def _math(name: str, fn: Callable, c_float: str, c_double: str | None = None) -> Function:
    return Function(name, 1, "math", fn, c_float, c_double or c_float.removesuffix("f"))


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    _math("exp", np.exp, "expf"), _math("log", np.log, "logf"),
    _math("tanh", np.tanh, "tanhf"), _math("erf", _erf, "erff"),
    _math("sqrt", np.sqrt, "sqrtf"), _math("rsqrt", lambda x: 1.0 / np.sqrt(x), "rsqrtf"),
    _math("sigmoid", _sigmoid, "tk_sigmoid", "tk_sigmoid"),
    _math("floor", np.floor, "floorf"), _math("ceil", np.ceil, "ceilf"),
    _math("round", np.rint, "rintf"), _math("sin", np.sin, "sinf"),
    _math("cos", np.cos, "cosf"), _math("tan", np.tan, "tanf"),
    _math("asin", np.arcsin, "asinf"), _math("acos", np.arccos, "acosf"),
    _math("atan", np.arctan, "atanf"), _math("sinh", np.sinh, "sinhf"),
    _math("cosh", np.cosh, "coshf"), _math("asinh", np.arcsinh, "asinhf"),
    _math("acosh", np.arccosh, "acoshf"), _math("atanh", np.arctanh, "atanhf"),
    Function("reciprocal", 1, "math", lambda x: 1.0 / x),  # C: 1 / x in the kind
    Function("abs", 1, "signed", np.abs, "tk_abs", "tk_abs"),
    Function("neg", 1, "signed", np.negative),
    Function("sign", 1, "signed", np.sign, "tk_sign", "tk_sign"),
    Function("isnan", 1, "predicate", np.isnan, "isnan", "isnan"),
    Function("isinf", 1, "predicate", np.isinf, "isinf", "isinf"),
    Function("not", 1, "predicate", np.logical_not),
    Function("max", 2, "binary", np.maximum, "tk_max", "tk_max"),
    Function("min", 2, "binary", np.minimum, "tk_min", "tk_min"),
    Function("pow", 2, "binary", np.power, "powf", "pow"),
    Function("fmod", 2, "binary", np.fmod, "fmodf", "fmod"),
    Function("select", 3, "select", np.where),
    *(Function(d, 1, "cast", _cast(d)) for d in DTYPES),
)}

#: Infix binary operators (precedence lives in the parser's grammar, tilekit.expr.ast).
BINARY_OPERATORS: dict[str, Callable] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
    "//": np.floor_divide, "%": np.mod, "<": np.less, "<=": np.less_equal,
    ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
    "&&": np.logical_and, "||": np.logical_or,
}


def function(name: str) -> Function:
    """The entry for `name`; KeyError when the language has no such function."""
    return FUNCTIONS[name]


def functions_of(family: str) -> frozenset[str]:
    return frozenset(f.name for f in FUNCTIONS.values() if f.family == family)
