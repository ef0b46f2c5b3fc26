"""The converter registry itself: ONNX op type -> function emitting tile-IR ops.

One entry per op type, registered with `@converter("Relu", ...)` in the family modules below
(elementwise, reduce, nn, matmul, layout, rnn, opaque). `ignore` lists attributes that do not
change the inference result (`consumed_inputs`, `momentum`, ...); any other attribute that a
converter did not read is refused, so nothing is silently dropped. An op type with no entry is
an `UnsupportedError` that lists the known ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tilekit.onnx.context import NodeContext

Convert = Callable[[NodeContext], None]


@dataclass(frozen=True)
class Converter:
    op_type: str
    convert: Convert
    ignore: tuple[str, ...] = ()
    #: What it becomes, for docs and `--list-ops` (one short phrase).
    summary: str = ""


CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str, ignore: tuple[str, ...] = (), summary: str = "") -> Callable:
    """Register `fn` as the converter of each of `op_types`."""

    def register(fn: Convert) -> Convert:
        for op_type in op_types:
            if op_type in CONVERTERS:
                raise ValueError(f"converter for {op_type} registered twice")
            CONVERTERS[op_type] = Converter(op_type, fn, tuple(ignore), summary)
        return fn

    return register
