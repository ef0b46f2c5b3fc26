"""Package names loaded on first use (PEP 562).

A package's `__init__` lists each name it offers with the module of the package that defines
it (`_LAZY`) and takes its module-level `__getattr__` and `__dir__` from
`lazy_attributes(__name__, _LAZY)`: a name is imported from its module when it is first read,
then kept in the package. Importing one module of a package runs the package's `__init__`,
which then imports none of the others, so a command loads only the modules it uses.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable, Mapping


def lazy_attributes(package: str, table: Mapping[str, str]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of package `package` whose names `table` maps to the
    modules (relative to the package) that define them."""

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(import_module(f"{package}.{table[name]}"), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*vars(sys.modules[package]), *table])

    return __getattr__, __dir__
