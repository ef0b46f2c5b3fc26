"""The helpers every generated kernel includes, and their identity: runtime.cuh on the
device; runtime_cpu.h (with host_types.h and runtime.cuh) on a CPU.

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


#: The CPU target's headers, in include order (runtime_cpu.h includes the other two).
CPU_HEADERS = tuple(HELPERS.parent / n for n in ("runtime_cpu.h", "host_types.h",
                                                 "runtime.cuh"))


def cpu_helpers_sha256() -> str:
    digest = hashlib.sha256()
    for path in CPU_HEADERS:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def helpers_record(target: str) -> dict:
    """`codegen.helpers` of a section generated for `target`."""
    if target == "cpu":
        return {"file": CPU_HEADERS[0].name, "sha256": cpu_helpers_sha256()}
    return {"file": HELPERS_NAME, "sha256": helpers_sha256()}
