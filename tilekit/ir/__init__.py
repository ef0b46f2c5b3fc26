"""The tile IR: data model, codec (YAML/JSON) and verifier. See docs/ir.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

__all__ = [
    "DTYPES", "FORMATS", "InvalidOutputError", "Kernel", "Module", "OP_KINDS", "Op",
    "PAD_VALUES", "ROLES", "Tensor", "default_kernels", "detect_format", "dumps", "loads",
    "read_module", "verify", "write_module",
]

# `verify` is imported now, not on first use: the module `tilekit.ir.verify` has the
# function's name, and importing that module (as the stages do) binds the name here to the
# module unless the function was bound after it.
from tilekit.ir.verify import verify

if TYPE_CHECKING:
    from tilekit.ir.codec import (FORMATS, InvalidOutputError, detect_format, dumps, loads,
                                  read_module, write_module)
    from tilekit.ir.model import (DTYPES, OP_KINDS, PAD_VALUES, ROLES, Kernel, Module, Op, Tensor,
                                  default_kernels)


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
_LAZY = {
    "FORMATS": "codec",
    "InvalidOutputError": "codec",
    "detect_format": "codec",
    "dumps": "codec",
    "loads": "codec",
    "read_module": "codec",
    "write_module": "codec",
    "DTYPES": "model",
    "OP_KINDS": "model",
    "PAD_VALUES": "model",
    "ROLES": "model",
    "Kernel": "model",
    "Module": "model",
    "Op": "model",
    "Tensor": "model",
    "default_kernels": "model",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
