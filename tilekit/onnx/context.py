"""What a converter sees: one ONNX node, its values, and ways to emit tile-IR ops.

A converter is a function `convert(ctx: NodeContext) -> None` that reads the node's inputs
(`ctx.input(i)`: IR name, static shape, dtype and, for constants, the value) and emits one or
more ops whose statements write `ctx.output(i)`. Everything that names things lives here, so
converters stay a readable list of statements:

- `ctx.read(value, axes, shape)` is the text reading `value` broadcast to an output indexed by
  `axes` (a size-1 constant becomes a literal, any other constant becomes a weight tensor);
- `ctx.assign(out, axes, op, body)` emits `out[axes] op body` as one op;
- `ctx.temp("max", shape)` declares an intermediate named `<first output>_max`;
- `ctx.opaque(type, inputs, outputs, attrs)` emits an opaque op (see `tilekit.opaque`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from tilekit.errors import UnsupportedError, excerpt
from tilekit.onnx import text
from tilekit.onnx.names import node_where

if TYPE_CHECKING:  # pragma: no cover
    from onnx import NodeProto

    from tilekit.onnx.importer import Importer


@dataclass(frozen=True)
class Value:
    """A tensor as converters see it. `const` is set for values known at import."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    const: np.ndarray | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class NodeContext:
    """The conversion of one ONNX node (see the module docstring)."""

    def __init__(self, importer: "Importer", node: "NodeProto", index: int,
                 attrs: Mapping[str, Any]):
        self._imp = importer
        self.node = node
        self.index = index
        self.op_type = node.op_type
        self.opset = importer.opset
        self.origin = node.name or f"{node.op_type}_{index}"
        self.attrs = dict(attrs)
        self._used_attrs: set[str] = set()

    # -- reading the node ----------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        self._used_attrs.add(name)
        return self.attrs.get(name, default)

    def axis(self, name: str, default: int, rank: int, inclusive: bool = False) -> int:
        """Attribute `name`, an axis of a rank-`rank` tensor (`inclusive`: a position in
        [0, rank], as Flatten's), normalised to be non-negative. An axis out of range is
        bad input, never wrapped around."""
        value = self.attr(name, default)
        top = rank + 1 if inclusive else rank
        if type(value) is not int or not -top <= value < top or (inclusive and value == -top):
            raise self.unsupported(f"attribute '{name}' is {excerpt(value)}, not an axis of a "
                                   f"rank-{rank} tensor", f"use an integer in [{-rank}, "
                                   f"{rank if inclusive else rank - 1}]")
        return value % top if value < 0 else value

    def flag(self, name: str, default: int) -> int:
        """A 0/1 attribute (`keepdims`, `transA`, ...); any other value is bad input."""
        value = self.attr(name, default)
        if value not in (0, 1) or type(value) not in (int, bool):
            raise self.unsupported(f"attribute '{name}' is {excerpt(value)}, not 0 or 1")
        return int(value)

    def axes_in(self, values: Any, rank: int, what: str = "axes") -> list[int]:
        """A list of axes of a rank-`rank` tensor, each checked and normalised (in order,
        duplicates refused)."""
        out: list[int] = []
        for value in list(values):
            value = int(value) if isinstance(value, (int, np.integer)) else value
            if type(value) is not int or not -rank <= value < rank:
                raise self.unsupported(f"{what} holds {excerpt(value)}, not an axis of a "
                                       f"rank-{rank} tensor")
            if value % rank in out:
                raise self.unsupported(f"{what} names axis {value % rank} twice")
            out.append(value % rank)
        return out

    @property
    def n_inputs(self) -> int:
        return len(self.node.input)

    @property
    def n_outputs(self) -> int:
        return len(self.node.output)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and bool(self.node.input[i])

    def input(self, i: int) -> Value | None:
        """Input `i`, or None when the optional input is absent."""
        if not self.has_input(i):
            return None
        return self._imp.value(self.node.input[i])

    def inputs(self) -> list[Value]:
        return [v for v in (self.input(i) for i in range(self.n_inputs)) if v is not None]

    def const(self, i: int) -> np.ndarray | None:
        v = self.input(i)
        return None if v is None else v.const

    def require_const(self, i: int, what: str) -> np.ndarray:
        """The constant value of input `i`; an UnsupportedError if it is computed at run time."""
        value = self.const(i)
        if value is None:
            raise self.unsupported(f"{what} (input {i}) must be a constant known at import",
                                   "fold it in the exporter, or give static shapes with "
                                   "--shape so that it can be computed")
        return value

    def output_used(self, i: int) -> bool:
        return i < len(self.node.output) and bool(self.node.output[i]) and \
            self._imp.is_used(self.node.output[i])

    def output(self, i: int = 0) -> Value:
        """Output `i` as an IR tensor: its name, and its shape and dtype from inference."""
        return self._imp.output_value(self.node, i, self)

    def sole_consumer(self, i: int = 0) -> "NodeProto | None":
        """The only node that reads output `i` (and it is no graph output), else None."""
        name = self.node.output[i] if i < len(self.node.output) else ""
        index = self._imp.sole_consumer(name) if name else None
        return None if index is None else self._imp.nodes[index]

    def peek(self, node: "NodeProto") -> "NodeContext":
        """A read-only look at another node (to decide whether to fold it into this one)."""
        return self._imp.context(self._imp.nodes.index(node))

    def absorb(self, node: "NodeProto") -> "NodeContext":
        """Take over the conversion of `node` (a fold into this one); returns its context."""
        return self._imp.absorb(self._imp.nodes.index(node))

    def rewritten(self, i: int, array: np.ndarray, step: str) -> Value:
        """A constant computed at import that replaces input `i` (a folded weight).

        It keeps the input's name when this node alone reads that input, so the folded
        weight reads like the original (`conv1_w_0`); otherwise it gets `<out>_<step>`.
        """
        onnx_name = self.node.input[i] if self.has_input(i) else ""
        if onnx_name and self._imp.sole_consumer(onnx_name) == self.index \
                and onnx_name not in self._imp.input_names:
            array = np.ascontiguousarray(array)
            name = self._imp.names.claim(onnx_name)
            value = Value(name, tuple(array.shape), self._imp.ir_dtype(array.dtype, name),
                          array)
            self._imp.values[onnx_name] = value
            self._imp.materialize(value)
            return value
        return self.weight(step, array)

    # -- writing ops ---------------------------------------------------------------------
    def name_of(self, value: Value) -> str:
        """The IR tensor name of `value`, making a constant into a weight on first use."""
        if value.const is not None:
            self._imp.materialize(value)
        return value.name

    def access(self, value: Value, indices: Sequence[str]) -> str:
        """`name[indices]` for `value` (a constant becomes a weight tensor)."""
        return text.access(self.name_of(value), indices)

    def read(self, value: Value, axes: Sequence[str], shape: Sequence[int],
             inline: bool = True) -> str:
        """Text reading `value` broadcast (NumPy rules) to an output `shape` indexed by `axes`.

        A one-element numeric constant is written as a literal in the output's dtype.
        """
        if inline and value.const is not None and value.const.size == 1 \
                and value.dtype not in ("bool", "bfloat16"):
            return text.literal(value.const.reshape(-1)[0].item(), value.dtype)
        try:
            indices = text.broadcast_indices(value.shape, axes, shape)
        except ValueError as exc:
            raise self.unsupported(f"input {value.name}: {exc}") from None
        return self.access(value, indices)

    def temp(self, step: str, shape: Sequence[int], dtype: str) -> Value:
        """A new intermediate tensor named after the node's first output: `<out>_<step>`."""
        return self._imp.new_tensor(f"{self._imp.output_base(self.node)}_{step}",
                                    tuple(int(d) for d in shape), dtype)

    def weight(self, step: str, array: np.ndarray) -> Value:
        """A new constant computed at import (folded BatchNorm, combined biases, ...)."""
        array = np.ascontiguousarray(array)
        name = self._imp.names.fresh(f"{self._imp.output_base(self.node)}_{step}")
        value = Value(name, tuple(array.shape), self._imp.ir_dtype(array.dtype, name), array)
        self._imp.materialize(value)
        return value

    def assign(self, out: Value, axes: Sequence[str], op: str, body: str, *,
               pad: str | None = None, extents: Mapping[str, int] | None = None,
               step: str | None = None) -> Value:
        """Emit `out[axes] op body` as one op (named after the node, `_step` if given)."""
        stmt = f"{text.access(out.name, axes)} {op} {body}"
        self._imp.add_expr_op(self, out, stmt, pad=pad, extents=extents, step=step)
        return out

    def opaque(self, type_name: str, inputs: Sequence[Value | None], outputs: Sequence[Value],
               attrs: Mapping[str, Any] | None = None, step: str | None = None) -> None:
        """Emit an opaque op of a `tilekit.opaque` registry type."""
        self._imp.add_opaque_op(self, type_name, inputs, outputs, dict(attrs or {}), step)

    def alias(self, i: int, value: Value) -> None:
        """Output `i` is `value` itself (Identity, Dropout in inference, no-op reshapes)."""
        self._imp.alias(self.node, i, value)

    def copy(self, i: int, value: Value) -> None:
        """Output `i` is a copy of `value` with the output's shape (same element order)."""
        out = self.output(i)
        ax = text.axes(out.rank)
        self.assign(out, ax, "=", self.read(value, ax, out.shape))

    # -- errors --------------------------------------------------------------------------
    def unsupported(self, what: str, hint: str | None = None) -> UnsupportedError:
        return UnsupportedError(f"{self.op_type} (opset {self.opset}): {what}",
                                node_where(self.index, self.node),
                                hint)

    def check_attrs(self, allowed: Sequence[str] = ()) -> None:
        """Refuse attributes this converter does not implement (never silently ignore one)."""
        extra = sorted(set(self.attrs) - set(allowed) - self._used_attrs)
        if extra:
            raise self.unsupported(f"attribute {', '.join(repr(a) for a in extra)} is not "
                                   "supported")
