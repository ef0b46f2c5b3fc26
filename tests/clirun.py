"""A tilekit command run in process (its click entry point) from a folder, as a shell would
run it there: what the tests that check relative paths, sidecars, outputs, exit codes and
error lines share. In process, a command costs what it does, not a Python start-up and the
imports of the package (most of a small command's time)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping

from click.testing import CliRunner


def run_in(command, args, cwd: Path, stdin: bytes | None = None,
           env: Mapping[str, str] | None = None):
    """The click `Result` of `command args` run with `cwd` as the working directory (and
    `env` added to the environment while it runs)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(command, [str(a) for a in args], input=stdin, env=env,
                                  catch_exceptions=False)
    finally:
        os.chdir(old)


def completed(command, args, cwd: Path | None = None, stdin: bytes | None = None,
              env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """`run_in` as the `CompletedProcess` a `subprocess.run(..., capture_output=True)` of the
    command would give (exit code, stdout and stderr bytes), for tests written against one.
    An exception the command lets out fails the test (it would be a traceback in a shell)."""
    result = run_in(command, args, Path(cwd) if cwd is not None else Path.cwd(), stdin, env)
    return subprocess.CompletedProcess([command.name, *map(str, args)], result.exit_code,
                                       result.stdout_bytes, result.stderr_bytes)
