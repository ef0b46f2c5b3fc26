"""tk-weld: Welder's (OSDI'23) tile-graph fusion across memory levels.

`structure` (a group's stages, edge levels, propagated regions, footprint), `model` (its
price from the shared cost model), `search` (its output tile), `fuse` (connect-then-fuse and
the pass), `verify` (a recorded group checked against its module), `report` (the tables).
docs/weld.md has the algorithm, the model and its limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilekit.lazy import lazy_attributes

__all__ = ["DEFAULT_MAX_GROUP", "connect_then_fuse", "weld_module"]

if TYPE_CHECKING:
    from tilekit.weld.fuse import DEFAULT_MAX_GROUP, connect_then_fuse, weld_module


# The names above, loaded on first use from the module each is listed with (tilekit.lazy).
_LAZY = {
    "DEFAULT_MAX_GROUP": "fuse",
    "connect_then_fuse": "fuse",
    "weld_module": "fuse",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
