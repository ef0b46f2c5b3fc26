"""tk-weld: Welder's (OSDI'23) tile-graph fusion across memory levels.

`structure` (a group's stages, edge levels, propagated regions, footprint), `model` (its
price from the shared cost model), `search` (its output tile), `fuse` (connect-then-fuse and
the pass), `verify` (a recorded group checked against its module), `report` (the tables).
docs/weld.md has the algorithm, the model and its limits.
"""

from tilekit.weld.fuse import DEFAULT_MAX_GROUP, connect_then_fuse, weld_module

__all__ = ["DEFAULT_MAX_GROUP", "connect_then_fuse", "weld_module"]
