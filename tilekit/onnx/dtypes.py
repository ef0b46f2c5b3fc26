"""ONNX element types as tilekit dtypes, and their names for messages."""

from __future__ import annotations

from onnx import TensorProto, helper

from tilekit.errors import excerpt

#: ONNX element type -> IR dtype (the types tilekit imports).
ONNX_DTYPES = {
    TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64",
    TensorProto.INT64: "int64", TensorProto.INT32: "int32", TensorProto.INT16: "int16",
    TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.BOOL: "bool",
}


def elem_type_name(elem: int) -> str:
    """An ONNX element type's name for messages, also for numbers ONNX does not define."""
    try:
        return helper.tensor_dtype_to_string(elem) if elem else "undefined"
    except (KeyError, ValueError):
        return f"undefined ({excerpt(elem)})"
