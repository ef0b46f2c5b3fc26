"""pyproject.toml ships every package of the library (a wheel missing one fails on import)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    present = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "tilekit").rglob("__init__.py")}
    missing = sorted(present - listed)
    assert not missing, f"packages missing from pyproject.toml: {missing}"


def test_every_command_has_an_entry_point():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    commands = {p.stem.replace("_", "-") for p in (ROOT / "tilekit" / "cli").glob("tk_*.py")}
    assert commands <= set(scripts), sorted(commands - set(scripts))
    assert all((ROOT / "bin" / c).exists() for c in commands), "a command without bin/ shim"
