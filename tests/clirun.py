"""A tilekit command run in process (its click entry point) from a folder, as a shell would
run it there: what the tests that check relative paths, sidecars and outputs share."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner


def run_in(command, args, cwd: Path, stdin: bytes | None = None):
    """The click `Result` of `command args` run with `cwd` as the working directory."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(command, args, input=stdin, catch_exceptions=False)
    finally:
        os.chdir(old)
