"""What `make test` runs, and what runs only when asked.

The default suite is sized for CI (a clean clone, two cores, no GPU): each matrix of models by
stages runs a subset that covers every kind of op and every stage, and the rest runs with
`TILEKIT_FULL=1`, which also turns on every narrower switch (`TILEKIT_ALL_ARCHS=1`,
`TILEKIT_WELD_MODELS=all`, `TILEKIT_RAM_ALL_MODELS=1`, `TILEKIT_OP_BY_OP=all`,
`TILEKIT_CORPUS=all`).
"""

from __future__ import annotations

import os
from typing import Iterable

FULL = os.environ.get("TILEKIT_FULL") == "1"


def on(name: str, value: str = "1") -> bool:
    """Whether the switch `name` is set to `value`, or the full suite was asked for."""
    return FULL or os.environ.get(name) == value


def subset(items: Iterable[str], default: Iterable[str]) -> list[str]:
    """`items` with the full suite, else those also in `default` (in `items`' order)."""
    keep = set(default)
    return [i for i in items if FULL or i in keep]
