"""The hostile-input families: limits are re-read around every test (a test may set one)."""

from __future__ import annotations

import pytest

from tilekit import limits


@pytest.fixture(autouse=True)
def fresh_limits():
    limits.reset()
    yield
    limits.reset()
