"""Every budget a tilekit command enforces on its input, in one place (docs/limits.md).

A tiny or malformed input must never make a command read, allocate, loop or recurse without
bound. Each `Limit` below guards one kind of work and is checked *before* that work starts:

| limit | guards |
| --- | --- |
| `INPUT_BYTES` | one IR document, hardware profile or stdin stream, read whole |
| `MODEL_BYTES` | one ONNX model file or stream |
| `PROFILE_BYTES` | one hardware profile file (a regular file, size checked before reading) |
| `NESTING` | mappings and lists nested in a YAML or JSON document |
| `EXPR_CHARS`, `EXPR_DEPTH` | one tensor expression: characters and syntax-tree depth |
| `TENSOR_ELEMENTS` | one tensor, one axis extent, one op's reduction domain |
| `TOTAL_BYTES` | what one import writes (weights) and what one run allocates (every tensor) |
| `TILE_STEPS` | reduction steps the tiled CPU mode runs one by one, per op |
| `FIFO_WAIT` | seconds an output FIFO waits for a reader (`tilekit.outputs`) |

Each has an environment variable that raises (or lowers) it, read once per process; a value
may carry a binary suffix (`TILEKIT_MAX_TOTAL_BYTES=64G`). A broken value is bad input. A
limit error (`LimitError`, exit 2) names the limit, the value found, the budget and the
variable to raise it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
import re
from dataclasses import dataclass

from tilekit.errors import TilekitError

_SUFFIX = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_VALUE = re.compile(r"\s*([0-9]{1,19})\s*([kmgt]?)(?:i?b)?\s*\Z", re.I)
_cache: dict[str, int] = {}


class LimitError(TilekitError):
    """An input over one of the documented budgets (bad input, exit 2)."""


@dataclass(frozen=True)
class Limit:
    """One budget: its name in messages, its variable, its default and what it counts."""

    name: str
    env: str
    default: int
    unit: str  # "bytes", "levels", "characters", "elements"

    @property
    def value(self) -> int:
        """The budget in force: the variable's value when set, else the default (read once)."""
        if self.env not in _cache:
            _cache[self.env] = _read_env(self)
        return _cache[self.env]

    def error(self, found: str, where: str | None) -> LimitError:
        """The error for `found` (what was seen: 'the file (3,000,000,000 bytes)')."""
        return LimitError(f"{found} is over the {self.name} limit ({self.value:,} "
                          f"{self.unit})", where,
                          f"raise it with {self.env}=N if the input is trusted")

    def check(self, found: int, where: str | None, what: str = "the value") -> int:
        """`found` if it is within the budget, else raise `LimitError` ('what' names it)."""
        if found > self.value:
            raise self.error(f"{what} ({found:,} {self.unit})", where)
        return found


def _read_env(limit: Limit) -> int:
    raw = os.environ.get(limit.env)
    if raw is None or raw.strip() == "":
        return limit.default
    m = _VALUE.match(raw)
    if not m or int(m.group(1)) == 0:
        raise LimitError(f"'{raw[:40]}' is not a positive whole number", limit.env,
                         f"write e.g. {limit.env}={limit.default} (suffixes K, M, G, T "
                         "multiply by powers of 1024), or unset it for the default")
    return int(m.group(1)) * _SUFFIX[m.group(2).lower()]


@contextmanager
def lifted(*budgets: Limit):
    """Within the block, `budgets` do not apply (a symbolic module's largest instance is
    verified for its index maps; the sizes a run binds are checked against them again)."""
    saved = {b.env: b.value for b in budgets}
    try:
        for b in budgets:
            _cache[b.env] = 1 << 62
        yield
    finally:
        _cache.update(saved)


def reset() -> None:
    """Forget the values read from the environment (tests that change a variable)."""
    _cache.clear()


INPUT_BYTES = Limit("input size", "TILEKIT_MAX_INPUT_BYTES", 256 * 2**20, "bytes")
MODEL_BYTES = Limit("model size", "TILEKIT_MAX_MODEL_BYTES", 2**31 - 1, "bytes")
PROFILE_BYTES = Limit("profile size", "TILEKIT_MAX_PROFILE_BYTES", 2**20, "bytes")
NESTING = Limit("nesting depth", "TILEKIT_MAX_NESTING", 64, "levels")
EXPR_CHARS = Limit("expression length", "TILEKIT_MAX_EXPR_CHARS", 100_000, "characters")
EXPR_DEPTH = Limit("expression depth", "TILEKIT_MAX_EXPR_DEPTH", 64, "levels")
TENSOR_ELEMENTS = Limit("tensor size", "TILEKIT_MAX_TENSOR_ELEMENTS", 2**31 - 1, "elements")
LOOP_TRIPS = Limit("loop iterations", "TILEKIT_MAX_LOOP_TRIPS", 10_000_000, "iterations")
TOTAL_BYTES = Limit("total size", "TILEKIT_MAX_TOTAL_BYTES", 8 * 2**30, "bytes")
#: rTasks of a tk-ram program, all operators together (DenseNet-121 has 435,863).
RTASKS = Limit("rTask count", "TILEKIT_MAX_RTASKS", 2**24, "rTasks")
#: Reduction steps `tk-run --mode tiled` runs one evaluation at a time, per op (blocks x steps;
#: steps it can vectorise exactly do not count: tilekit.runtime.tiled).
TILE_STEPS = Limit("tile steps", "TILEKIT_MAX_TILE_STEPS", 100_000, "evaluations")
#: How long an output FIFO may wait for a reader before the command gives up on it.
FIFO_WAIT = Limit("FIFO wait", "TILEKIT_MAX_FIFO_WAIT", 10, "seconds")

ALL = (INPUT_BYTES, MODEL_BYTES, PROFILE_BYTES, NESTING, EXPR_CHARS, EXPR_DEPTH,
       TENSOR_ELEMENTS, TOTAL_BYTES, LOOP_TRIPS, RTASKS, TILE_STEPS, FIFO_WAIT)


#: The most dimensions a tensor may have (fixed: every kernel and executor loops over ranks).
MAX_RANK = 64


def rank(shape, where: str | None, what: str = "the tensor") -> int:
    """len(shape), refused past `MAX_RANK` (LimitError)."""
    n = len(shape)
    if n > MAX_RANK:
        raise LimitError(f"{what} has {n:,} dimensions, more than {MAX_RANK}", where,
                         "tilekit handles tensors of rank 64 or less")
    return n


def elements(shape, where: str | None, what: str = "the tensor") -> int:
    """The element count of `shape`, checked against `TENSOR_ELEMENTS` dimension by
    dimension, so that a product never grows past the budget (nor past int64) on the way;
    the rank is checked against `MAX_RANK` first."""
    rank(shape, where, what)
    n = 1
    for d in shape:
        n *= int(d)
        if n > TENSOR_ELEMENTS.value:
            dims = [str(int(x)) if abs(int(x)) < 10**30 else f"~2^{int(x).bit_length()}"
                    for x in shape]
            shown = ", ".join(dims[:8]) + (", ..." if len(dims) > 8 else "")
            raise TENSOR_ELEMENTS.error(f"{what} of shape [{shown}]", where)
    return n
