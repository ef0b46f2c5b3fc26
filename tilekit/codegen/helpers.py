"""runtime.cuh: the device helpers every generated kernel includes, and its identity.

Generated kernels record the helpers' sha256 (`codegen.helpers`), so a runtime can refuse
kernels generated against another version of them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HELPERS = Path(__file__).resolve().parent / "runtime.cuh"
HELPERS_NAME = "runtime.cuh"


def helpers_text() -> str:
    return HELPERS.read_text(encoding="utf-8")


def helpers_sha256() -> str:
    return hashlib.sha256(HELPERS.read_bytes()).hexdigest()
