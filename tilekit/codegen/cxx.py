"""Building the CPU target's kernels: one translation unit, the system C++ compiler, a cache.

`build(source)` compiles a unit of CPU kernels (`unit_source` of a `codegen` section's
records) into a shared library with `g++ -O3 -march=native -fopenmp -shared` (any `$CXX` that
takes those flags) and caches it under `$TILEKIT_CACHE/cpu/<key>/`; the key covers the source,
the headers, the compiler, its flags and the machine (`-march=native` makes code for the CPU
in hand). A refused unit is kept in `cpu/failed-<key>/` and the error prints the command that
reproduces it. tk-codegen --target cpu --compile builds it; tk-run --device cpu loads it.

Why the system compiler and not LLVM through a Python binding: g++ is on every machine this
project supports (the CUDA emulation needs it already), it vectorises the inner loops of the
printed C++ and brings OpenMP; an LLVM binding would be a new dependency for no gain here.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

from tilekit.errors import TilekitError, UnsupportedError
from tilekit.ir.payloads import KernelRecord


def find_cxx() -> str | None:
    """The C++ compiler: `$CXX` (a name on PATH or a path), else g++, else clang++; None when
    there is none (a `$CXX` that names no program included)."""
    named = os.environ.get("CXX")
    if named:
        return shutil.which(named)
    return shutil.which("g++") or shutil.which("clang++")


#: How every CPU library is built (with `-march=native`: for the CPU in hand). No loop-idiom
#: calls: GCC would turn a packed panel's 64-byte row copies into memmove calls. No trapping
#: math: floating-point operations never trap here (no exception handlers), which lets GCC
#: turn the selects of runtime_cpu.h's exp/tanh/erf into vector blends (results unchanged).
#: No errno from math functions: nothing reads it, and with it GCC calls libm's `sqrtf` for
#: every element (it may set errno) instead of a vector square root: a layer norm's
#: normalising pass over 512 x 768 took 0.49 ms on 2 cores of an AVX-512 Xeon, 0.055 ms
#: without (results unchanged: the instruction's NaN for a negative operand).
CXX_FLAGS = ("-O3", "-std=c++17", "-march=native", "-fopenmp",
             "-fno-tree-loop-distribute-patterns", "-fno-trapping-math", "-fno-math-errno",
             "-fPIC", "-shared", "-w")
#: What the runtime adds to the unit: a way to set the number of OpenMP threads, and to say
#: that weights changed in place (the packed weight panels are re-made: runtime_cpu.h
#: tk_packed_panels).
RUNTIME_TAIL = """
#include <omp.h>
extern "C" void tk_set_threads(int n) { omp_set_num_threads(n > 0 ? n : 1); }
extern "C" int tk_get_threads() { return omp_get_max_threads(); }
extern "C" void tk_weights_changed() { tk_packed_weights_changed(); }
"""


def unit_source(kernels: tuple[KernelRecord, ...]) -> str:
    """The recorded kernels as one translation unit; a source that does not start with the
    preamble tk-codegen writes for its record was not written by this tilekit."""
    from tilekit.tile.cpp import file_preamble, unit_text

    bodies = []
    for k in kernels:
        head = file_preamble(k.name, k.ops, k.shape)
        if not k.source.startswith(head):
            raise TilekitError(f"the source of kernel {k.entry} does not start with the "
                               "preamble tk-codegen writes", "codegen.kernels",
                               "re-run tk-codegen --target cpu with this tilekit")
        bodies.append(k.source[len(head):])
    return unit_text(bodies) + RUNTIME_TAIL


def _machine() -> str:
    """What `-march=native` depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                flags += line + "\n"
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        pass
    return platform.machine() + "\n" + flags


def compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else cxx
    except (OSError, subprocess.SubprocessError):
        return cxx


#: Flags of the precompiled runtime_cpu.h: those of the units, less what only links.
PCH_FLAGS = tuple(f for f in CXX_FLAGS if f != "-shared")


def cache_key(*parts: str) -> str:
    """A build's cache key: the hash of what goes into it."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def compile_in(work: Path, key: str, argv: list[str], what: str,
               error: type[TilekitError] = TilekitError, limit: int = 2000) -> None:
    """Run the host compiler's `argv` in the build folder `work` (tilekit.codegen.nvcc's
    `building`); when it fails, keep the folder (`keep_failed`) and raise `error`: `what`, the
    compiler's message (its first `limit` characters) and the command that reproduces the
    failure there."""
    from tilekit.codegen.nvcc import keep_failed

    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        keep = keep_failed(work, key)
        raise error(f"{what}: {proc.stderr.strip()[:limit]}", str(keep),
                    f"reproduce with: cd {keep} && {' '.join(argv)}")


def precompiled_headers(cxx: str, version: str, headers: dict[str, str], main: str,
                        flags: tuple[str, ...], folder: str, *key: str) -> Path | None:
    """A cached folder `<cache>/<folder>/headers-<key>` holding `headers` with `main`
    precompiled (GCC finds `<main>.gch` beside the header and uses it when the flags match):
    most of a small unit's compile time is the headers'. None when the compiler is not GCC
    or the precompilation fails; units then include the headers as text. The C++ target
    (runtime_cpu.h) and the CUDA emulation (host_emul.h) share it."""
    from tilekit.codegen.nvcc import building, cache_dir

    if "clang" in version.lower():
        return None
    digest = cache_key(*headers.values(), version, " ".join(flags), *key)
    final = cache_dir() / folder / f"headers-{digest}"
    if (final / f"{main}.gch").exists():
        return final
    try:
        with building(final, f"headers-{digest}") as work:
            for name, text in headers.items():
                (work / name).write_text(text)
            subprocess.run([cxx, *flags, "-x", "c++-header", main, "-o", f"{main}.gch"],
                           cwd=work, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return final


def build(source: str) -> Path:
    """The shared library of `source` (cached by content, compiler, flags and machine)."""
    from tilekit.codegen.helpers import CPU_HEADERS
    from tilekit.codegen.nvcc import CompileError, building, cache_dir

    cxx = find_cxx()
    if cxx is None:
        raise UnsupportedError("no C++ compiler (g++ or clang++) to build the CPU kernels",
                               "--device cpu", "install g++, or set CXX")
    headers = {p.name: p.read_text() for p in CPU_HEADERS}
    version = compiler_version(cxx)
    key = cache_key(source, *headers.values(), version, " ".join(CXX_FLAGS), _machine())
    final = cache_dir() / "cpu" / key
    lib = final / "module.so"
    if lib.exists():
        return lib
    included = precompiled_headers(cxx, version, headers, "runtime_cpu.h", PCH_FLAGS, "cpu",
                                   _machine())
    with building(final, key) as work:
        (work / "unit.cpp").write_text(source)
        if included is None:
            for name, text in headers.items():
                (work / name).write_text(text)
        compile_in(work, key, [cxx, *CXX_FLAGS, "-I", str(included or "."), "unit.cpp", "-o",
                               "module.so"],
                   "the C++ compiler refused the generated kernels", CompileError, 1500)
    return lib


__all__ = ["CXX_FLAGS", "RUNTIME_TAIL", "build", "cache_key", "compile_in", "compiler_version",
           "find_cxx", "precompiled_headers", "unit_source"]
