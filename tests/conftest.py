"""Shared pytest set-up: the `--update-goldens` option, skipping `gpu` tests without a GPU, and
the environment every test and the commands it starts share (OpenMP waits, PATH, bytecode,
the build cache)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The suite runs on two workers, each starting compiled CPU code on every core: OpenMP's
# spinning waits would hold a core the other worker needs, and a barrier can then wait for
# a thread that is not scheduled (a 0.3 ms run took 100 ms). Waiting threads sleep instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The pipes the tests run start bin/tk-* through `#!/usr/bin/env python3`. With the Python
# running the tests first on PATH, that is it, and the shim runs the command in place;
# otherwise it finds another python3 (a version manager's shim, a few processes, on many
# machines) and then starts this one again: three starts instead of one, for every command.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent),
                                      os.environ.get("PATH", "")])

# Each command a test starts imports the package afresh. Where the environment says not to
# write bytecode (PYTHONDONTWRITEBYTECODE, common in containers and CI images) or the
# checkout is read-only, every start compiled every module from source again: 150 s of a
# 500 s run on two cores. The commands the tests start (and the workers, which inherit the
# variable) keep their bytecode in a private folder made for the run (mode 0700, removed at
# the end), never in the checkout: a fixed folder under /tmp could be made by another user
# and hold bytecode that Python would take for the sources' (it checks only their size and
# time). A PYTHONPYCACHEPREFIX of the user's own is kept.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
if "PYTHONPYCACHEPREFIX" not in os.environ:
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="tilekit-tests-pycache-")
    atexit.register(shutil.rmtree, os.environ["PYTHONPYCACHEPREFIX"], ignore_errors=True)
sys.dont_write_bytecode = False
sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

# Compiled kernels (C++ libraries, nvcc builds, CUDA emulations, templates) are cached in a
# folder made for the run (mode 0700, removed at the end) and shared by its workers and the
# commands they start, never the user's ~/.cache/tilekit: every run builds what it tests, as
# CI does. A TILEKIT_CACHE of the caller's own is kept (and reused across runs); tests that
# need a cache of their own set one.
if "TILEKIT_CACHE" not in os.environ:
    os.environ["TILEKIT_CACHE"] = tempfile.mkdtemp(prefix="tilekit-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["TILEKIT_CACHE"], ignore_errors=True)

# Expensive shared set-ups (a model imported, a wheel built, a program packed) are fixtures of
# scope "session", not "module": a worker of `pytest -n 2 --dist loadgroup` runs the tests it
# is sent in the order they come, other files' between them, and pytest ends a module
# fixture whenever the next test is from another file, so "once per module" was once per
# visit, several times a run.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="Rewrite the expected_* files of golden CLI cases from the actual "
                          "output (review the diff before committing).")


@functools.lru_cache(maxsize=None)
def gpu_missing_reason() -> str | None:
    """Why GPU tests cannot run here, or None when CuPy sees a CUDA device."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken CUDA install
        return f"CuPy not importable ({type(exc).__name__})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver / no device
        return f"no CUDA device ({type(exc).__name__})"
    return None if count > 0 else "no CUDA device"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_missing_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture
def repo_root() -> Path:
    return REPO
