"""tk-grind (Cocktailer): where each control op runs, on the device or driven by the host.

`grind_module(module, profile, place)` is the pass (tilekit.grind.plan); the figures it
decides by are tilekit.grind.cost's. docs/grind.md describes both.
"""

from tilekit.grind.plan import PLACES, grind_module

__all__ = ["PLACES", "grind_module"]
