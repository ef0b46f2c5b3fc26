"""tk-grind (Cocktailer): where each control op runs, on the device or driven by the host.

`grind_module(module, profile, place)` is the pass (tilekit.grind.plan); the figures it
decides by are tilekit.grind.cost's. docs/grind.md describes both.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__all__ = ["PLACES", "grind_module"]

if TYPE_CHECKING:
    from tilekit.grind.plan import PLACES, grind_module


# The names above are loaded on first use (from the module each is listed with): importing
# one module of the package runs this file, which then imports none of the others, so a
# command loads only the modules it uses.
_LAZY = {
    "PLACES": "plan",
    "grind_module": "plan",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
