"""Class 5c: an interrupted `tk-codegen --compile` leaves nothing in the nvcc cache.

The cache (`$TILEKIT_CACHE/nvcc/`) gets each compile in a temporary folder renamed into place
when it is done. Ctrl-C or SIGTERM while nvcc ran left that folder behind. An nvcc stand-in
(a script that answers `--version` and otherwise waits) makes the interruption land during
the compile on any machine, GPU or not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_support import BIN, default_sigint, write_mlp

FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release 12.4, V12.4.99"
  exit 0
fi
touch "{marker}"
sleep 60
"""


def _fake_nvcc(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "nvcc-started"
    script = tmp_path / "nvcc"
    script.write_text(FAKE_NVCC.format(marker=marker))
    script.chmod(0o755)
    return script, marker


def _cache_entries(cache: Path) -> list[str]:
    folder = cache / "nvcc"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_the_compile_removes_the_build_folder(tmp_path, signum, code):
    nvcc, marker = _fake_nvcc(tmp_path)
    cache = tmp_path / "cache"
    ir = write_mlp(tmp_path)
    env = {**os.environ, "TILEKIT_NVCC": str(nvcc), "TILEKIT_CACHE": str(cache)}
    proc = subprocess.Popen([sys.executable, str(BIN / "tk-codegen"), str(ir), "--hw", "h100",
                             "--compile", "-o", str(tmp_path / "c.yaml")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), proc.communicate()[1]
    assert any(name.startswith(".") for name in _cache_entries(cache))  # the build folder
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert b"Traceback" not in err and len(err.splitlines()) == 1
    assert _cache_entries(cache) == []
    assert not (tmp_path / "c.yaml").exists()


def test_interrupt_injected_in_compile_unit(tmp_path, monkeypatch):
    """The same in process: KeyboardInterrupt raised where nvcc runs."""
    from tilekit.codegen import nvcc as nvcc_module

    nvcc, _ = _fake_nvcc(tmp_path)
    monkeypatch.setenv("TILEKIT_NVCC", str(nvcc))
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    real_run = subprocess.run

    def interrupted(argv, *args, **kwargs):
        if "--version" in argv:
            return real_run(argv, *args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(nvcc_module.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nvcc_module.compile_unit('#include "runtime.cuh"\n', "sm_80")
    assert _cache_entries(tmp_path / "cache") == []
