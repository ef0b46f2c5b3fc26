"""The tile IR: data model, codec (YAML/JSON) and verifier. See docs/ir.md."""

from tilekit.ir.codec import (FORMATS, InvalidOutputError, detect_format, dumps, loads,
                              read_module, write_module)
from tilekit.ir.model import (DTYPES, OP_KINDS, PAD_VALUES, ROLES, Kernel, Module, Op, Tensor,
                              default_kernels)
from tilekit.ir.verify import verify

__all__ = [
    "DTYPES", "FORMATS", "InvalidOutputError", "Kernel", "Module", "OP_KINDS", "Op",
    "PAD_VALUES", "ROLES", "Tensor", "default_kernels", "detect_format", "dumps", "loads",
    "read_module", "verify", "write_module",
]
