"""Packages load the names their __init__ lists on first use (each `_LAZY` table): importing
one module of a package does not import the rest, and every listed name is the object its
module defines."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

LAZY = ["tilekit.codegen", "tilekit.expr", "tilekit.grind", "tilekit.hw", "tilekit.ir",
        "tilekit.roll", "tilekit.weld"]


@pytest.mark.parametrize("name", LAZY)
def test_every_listed_name_is_its_modules(name):
    package = importlib.import_module(name)
    for attr, sub in package._LAZY.items():
        module = importlib.import_module(f"{name}.{sub}")
        assert getattr(package, attr) is getattr(module, attr), attr
    assert set(package._LAZY) <= set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(package, "nope")


def test_one_module_imports_only_what_it_needs():
    """In a fresh interpreter: the C++ build module without the code generator, and
    `tilekit.ir.verify` still the function after its module is imported."""
    code = ("import sys, tilekit.codegen.cxx, tilekit.ir.verify, tilekit.ir\n"
            "assert 'tilekit.codegen.module' not in sys.modules\n"
            "assert 'tilekit.weld.fuse' not in sys.modules\n"
            "assert callable(tilekit.ir.verify)\n"
            "from tilekit.codegen import generate\n"
            "assert 'tilekit.codegen.module' in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
