"""`python -m tilekit`: lists every console script from the one table, and refuses unknown
arguments with exit 2."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tilekit.__main__ import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilekit", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_the_table_is_the_pyproject_scripts():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {name: f"{module}:main" for name, module, _ in COMMANDS} == scripts


def test_lists_every_command_and_exits_0():
    proc = _run()
    assert proc.returncode == 0 and proc.stderr == ""
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert listed == [name for name, _, _ in COMMANDS]
    assert _run("--help").stdout == proc.stdout


def test_unknown_argument_is_a_usage_error():
    for args in (["foo"], ["--frobnicate"], ["--help", "extra"]):
        proc = _run(*args)
        assert proc.returncode == 2, args
        assert proc.stdout == ""
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m tilekit: error: unknown "
                                                       "argument") and "usage:" in lines[0]


def test_version():
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("tilekit ")
