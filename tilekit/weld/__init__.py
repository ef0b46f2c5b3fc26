"""tk-weld: Welder's (OSDI'23) tile-graph fusion across memory levels.

`structure` (a group's stages, edge levels, propagated regions, footprint), `model` (its
price from the shared cost model), `search` (its output tile), `fuse` (connect-then-fuse and
the pass), `verify` (a recorded group checked against its module), `report` (the tables).
docs/weld.md has the algorithm, the model and its limits.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__all__ = ["DEFAULT_MAX_GROUP", "connect_then_fuse", "weld_module"]

if TYPE_CHECKING:
    from tilekit.weld.fuse import DEFAULT_MAX_GROUP, connect_then_fuse, weld_module


# The names above are loaded on first use (from the module each is listed with): importing
# one module of the package runs this file, which then imports none of the others, so a
# command loads only the modules it uses.
_LAZY = {
    "DEFAULT_MAX_GROUP": "fuse",
    "connect_then_fuse": "fuse",
    "weld_module": "fuse",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
