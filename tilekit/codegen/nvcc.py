"""Compiling generated kernels with nvcc, reading ptxas' resource report, caching by content.

`compile_unit(source, arch)` compiles one translation unit (usually every kernel of a module,
which is faster than one nvcc call per kernel) to a cubin with `-Xptxas -v` and parses, per
entry function, registers, static shared memory, stack, and spill stores/loads.

Results are cached in `$TILEKIT_CACHE` (default `~/.cache/tilekit`), under `nvcc/<key>/`, where
the key hashes the source, runtime.cuh, the arch, the flags and nvcc's version; a cache entry is
written to a temporary folder and renamed, so parallel test workers never see half of one; a
compile that ends any other way (Ctrl-C, SIGTERM, an error) removes its folder.
A failing compile raises `CompileError` with the exact command that reproduces it (its input
file is kept in the cache folder for that purpose).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Mapping

from tilekit.errors import InternalError, TilekitError

#: Flags of every compile; part of the cache key.
NVCC_FLAGS = ("-cubin", "-O3", "-std=c++17", "-Xptxas", "-v")
ENV_CACHE = "TILEKIT_CACHE"
ENV_NVCC = "TILEKIT_NVCC"


class CompileError(InternalError):
    """nvcc rejected generated code: a code generator bug (exit 1), reported with the command
    that reproduces it. An arch nvcc does not support and a missing nvcc are the user's
    (TilekitError, exit 2)."""


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one entry function."""

    registers: int
    smem_static: int
    stack: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def record(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class CompileResult:
    arch: str
    resources: Mapping[str, Resources]   # entry -> resources
    cubin: Path                          # in the cache
    command: str
    cached: bool


#: An NVIDIA GPU arch as nvcc's -arch takes it: sm_80, sm_90a, sm_100f.
ARCH_PATTERN = re.compile(r"sm_\d{2,3}[a-z]?")


def check_arch(arch: str, where: str = "--arch") -> str:
    """`arch` if it names an NVIDIA GPU arch (`sm_90`, `sm_90a`), else a TilekitError."""
    if not ARCH_PATTERN.fullmatch(arch):
        raise TilekitError(f"'{arch}' is not an NVIDIA arch", where,
                           "write sm_ and the compute capability, e.g. sm_80, sm_90 or sm_90a")
    return arch


def unit_arch(arch: str, shapes) -> str:
    """The target a unit of kernels of these `shapes` is built for on `arch`: wgmma and
    setmaxnreg exist only in sm_90a code, so a Hopper unit holding a wgmma kernel is built
    for sm_90a (Hopper GPUs run it); any other unit for `arch`."""
    return "sm_90a" if arch == "sm_90" and "wgmma" in set(shapes) else arch


def arch_flags(arch: str) -> list[str]:
    """nvcc's target flags: `-arch=sm_XY`, or for an arch-specific target (`sm_90a`: wgmma,
    setmaxnreg) the explicit `-gencode` form, which builds only that target (the `-arch`
    shorthand of newer nvcc also runs a plain sm_90 pass that rejects those instructions)."""
    if arch.endswith("a"):
        cc = arch[len("sm_"):]
        return [f"-gencode=arch=compute_{cc},code={arch}"]
    return [f"-arch={arch}"]


def find_nvcc() -> str | None:
    """$TILEKIT_NVCC, else `nvcc` on PATH, else None."""
    explicit = os.environ.get(ENV_NVCC)
    if explicit:
        return explicit
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """`13.0.88`-style version of an nvcc binary (from `nvcc --version`)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise TilekitError(f"cannot run {nvcc}: {exc}", "--compile",
                           "install the CUDA toolkit or set TILEKIT_NVCC") from None
    m = re.search(r"V(\d+\.\d+\.\d+)", out.stdout) or re.search(r"release (\d+\.\d+)", out.stdout)
    return m.group(1) if m else "unknown"


def cache_dir() -> Path:
    """$TILEKIT_CACHE (made absolute: compilers run in build folders, and a relative path
    would name a folder inside each), else ~/.cache/tilekit."""
    root = os.environ.get(ENV_CACHE)
    return Path(root).absolute() if root else Path.home() / ".cache" / "tilekit"


@contextlib.contextmanager
def building(final: Path, key: str) -> Iterator[Path]:
    """A fresh build folder for the cache entry `final`: the body fills it; when the body
    returns, the folder becomes `final` (when another process built it first, theirs is
    identical and stays); whatever ends the body otherwise (an error, Ctrl-C) removes it,
    unless `keep_failed` moved it away. A cache that cannot be written is the user's to fix:
    an error naming the variable."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
    except OSError as exc:
        raise TilekitError(f"cannot write the build cache {final.parent} "
                           f"({exc.strerror or type(exc).__name__})", ENV_CACHE,
                           "set TILEKIT_CACHE to a writable folder") from None
    try:
        yield work
        try:
            os.replace(work, final)
        except OSError:          # another process built it first
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


def keep_failed(work: Path, key: str) -> Path:
    """Move a failed build folder to `failed-<key>` beside it (replacing an older one), so
    that the command in the error message reproduces the failure there."""
    failed = work.parent / f"failed-{key}"
    shutil.rmtree(failed, ignore_errors=True)
    os.replace(work, failed)
    return failed


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, Resources]:
    """Per entry function, the resources in a `ptxas -v` log."""
    found: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        m = _ENTRY.search(line) or _PROPS.search(line)
        if m:
            current = m.group(1)
            found.setdefault(current, {"registers": 0, "smem_static": 0, "stack": 0,
                                       "spill_stores": 0, "spill_loads": 0})
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            found[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                  spill_loads=int(m.group(3)))
        m = _USED.search(line)
        if m:
            found[current]["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            found[current]["smem_static"] = int(s.group(1)) if s else 0
    return {name: Resources(**values) for name, values in found.items()}


def _key(source: str, helpers: str, arch: str, nvcc: str, extra: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, helpers, arch, nvcc_version(nvcc), " ".join(NVCC_FLAGS + extra)):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def compile_unit(source: str, arch: str, *, helpers_dir: Path | None = None,
                 extra_flags: tuple[str, ...] = (), use_cache: bool = True) -> CompileResult:
    """Compile `source` (which includes "runtime.cuh") for `arch` and parse ptxas' report."""
    from tilekit.codegen.helpers import HELPERS

    nvcc = find_nvcc()
    if nvcc is None:
        raise TilekitError("nvcc was not found on PATH", "--compile",
                           "install the CUDA toolkit, set TILEKIT_NVCC, or drop --compile")
    check_arch(arch)
    helpers_path = (helpers_dir or HELPERS.parent) / "runtime.cuh"
    helpers = helpers_path.read_text(encoding="utf-8")
    key = _key(source, helpers, arch, nvcc, extra_flags)
    final = cache_dir() / "nvcc" / key
    if use_cache and (final / "ptxas.json").exists() and (final / "unit.cubin").exists():
        data = json.loads((final / "ptxas.json").read_text())
        return CompileResult(arch, {k: Resources(**v) for k, v in data["resources"].items()},
                             final / "unit.cubin", data["command"], cached=True)
    with building(final, key) as work:
        (work / "unit.cu").write_text(source, encoding="utf-8")
        (work / "runtime.cuh").write_text(helpers, encoding="utf-8")
        argv = [nvcc, *NVCC_FLAGS[:1], *arch_flags(arch), *NVCC_FLAGS[1:], *extra_flags,
                "-o", "unit.cubin", "unit.cu"]
        try:
            proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise CompileError("nvcc ran for more than 600 s", "--compile") from None
        log = proc.stdout + proc.stderr
        (work / "ptxas.log").write_text(log, encoding="utf-8")
        if proc.returncode != 0:
            # Keep the inputs where the message says, so the command reproduces the failure.
            failed = keep_failed(work, key)
            command = f"cd {shlex.quote(str(failed))} && {shlex.join([Path(nvcc).name] + argv[1:])}"
            errors = [ln for ln in log.splitlines() if "error" in ln.lower()][:5]
            if re.search(r"unsupported gpu architecture|not defined for option 'gpu-architecture'",
                         log, re.I):
                raise TilekitError(f"nvcc {nvcc_version(nvcc)} does not support {arch}", "--arch",
                                   "choose an arch this CUDA toolkit knows (nvcc --list-gpu-arch)")
            raise CompileError(f"nvcc failed for {arch} (exit {proc.returncode}): "
                               + " | ".join(errors or log.strip().splitlines()[-3:]),
                               "--compile", f"reproduce with: {command}")
        resources = parse_ptxas(log)
        command = shlex.join([Path(nvcc).name] + argv[1:])
        (work / "ptxas.json").write_text(json.dumps(
            {"command": command, "resources": {k: v.record() for k, v in resources.items()}},
            indent=1, sort_keys=True))
    return CompileResult(arch, resources, final / "unit.cubin", command, cached=False)
