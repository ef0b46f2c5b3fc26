"""The converter registry: ONNX op type -> function emitting tile-IR ops.

One entry per op type, registered with `@converter("Relu", ...)` in the family modules below
(elementwise, reduce, nn, matmul, layout, rnn, opaque, control,
attention). `ignore` lists attributes that do not
change the inference result (`consumed_inputs`, `momentum`, ...); any other attribute that a
converter did not read is refused, so nothing is silently dropped. An op type with no entry is
an `UnsupportedError` that lists the known ones.
"""

from __future__ import annotations

from tilekit.onnx.converters.registry import CONVERTERS, Converter, converter

__all__ = ["CONVERTERS", "Converter", "converter", "lookup", "supported_op_types"]


def supported_op_types() -> list[str]:
    _load()
    return sorted(CONVERTERS)


def lookup(op_type: str) -> Converter | None:
    _load()
    return CONVERTERS.get(op_type)


_LOADED = False


def _load() -> None:
    """Import the family modules once (each registers its converters on import)."""
    global _LOADED
    if _LOADED:
        return
    from tilekit.onnx.converters import (attention, control, elementwise,  # noqa: F401
                                         layout, matmul, nn, opaque, reduce, rnn)
    _LOADED = True
