"""Files that ship with tilekit: the hardware profiles and the specs.

In a checkout they are the top-level `hwprofiles/` and `specs/` folders; in an installed
tilekit (a wheel) they are package data under `tilekit/data/`. `shipped(name)` finds the
folder either way, installed copy first.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped(name: str) -> Path:
    """The folder `hwprofiles` or `specs`, wherever this tilekit keeps it."""
    installed = _PACKAGE / "data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name
