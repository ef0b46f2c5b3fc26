"""tk-grind (Cocktailer): where each control op runs, on the device or driven by the host.

`grind_module(module, profile, place)` is the pass (tilekit.grind.plan); the figures it
decides by are tilekit.grind.cost's. docs/grind.md describes both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

__all__ = ["PLACES", "grind_module"]

if TYPE_CHECKING:
    from tilekit.grind.plan import PLACES, grind_module


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
_LAZY = {
    "PLACES": "plan",
    "grind_module": "plan",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
