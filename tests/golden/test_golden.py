"""Golden CLI cases: one folder per case under tests/golden/, walked by one test.

A case folder holds:
- `cmd`: one shell command line, run by `bash -o pipefail -c` (a pipe fails when any of its
  stages does, so `... | tail -1` cannot hide a crash) with the case folder as working directory,
  stdin empty, and on PATH the checkout's `bin/` (the `tk-*` shims), the running Python's
  folder, `.venv/bin` and `tests/golden/_tools` (test-only commands);
- any input files the command names;
- `expected_stdout`, `expected_stderr`, `expected_exit` (a number).

`pytest --update-goldens` runs every case and rewrites its expected_* files from what the
command did: review the diff before committing. Output must be deterministic: no paths
outside the case, no timestamps, no colours (NO_COLOR is set, stdout/stderr are pipes).
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CASES = sorted(p for p in HERE.iterdir() if (p / "cmd").is_file())
TIMEOUT_S = 120


def case_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "bin"), str(Path(sys.executable).parent),
                            str(REPO / ".venv" / "bin"), str(HERE / "_tools"),
                            os.environ.get("PATH", "")])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TILEKIT_", "PYTEST_", "COV_"))}
    env.update(PATH=path, NO_COLOR="1", TERM="dumb", COLUMNS="100", LC_ALL="C.UTF-8",
               PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8")
    return env


def run_case(case: Path) -> tuple[str, str, int]:
    cmd = (case / "cmd").read_text(encoding="utf-8").strip()
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=case, env=case_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S)
    return (proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"),
            proc.returncode)


def diff(name: str, expected: str, actual: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                        f"expected_{name}", f"actual {name}"))


def test_there_are_cases() -> None:
    assert CASES, "no golden cases found"


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_golden(case: Path, update_goldens: bool) -> None:
    stdout, stderr, code = run_case(case)
    files = {"stdout": stdout, "stderr": stderr, "exit": f"{code}\n"}
    if update_goldens:
        for name, text in files.items():
            (case / f"expected_{name}").write_text(text, encoding="utf-8")
        return
    problems = []
    for name, actual in files.items():
        path = case / f"expected_{name}"
        if not path.exists():
            problems.append(f"{path.name} is missing (run pytest --update-goldens)")
            continue
        expected = path.read_text(encoding="utf-8")
        if expected != actual:
            problems.append(diff(name, expected, actual))
    assert not problems, f"golden case {case.name} ($ {(case / 'cmd').read_text().strip()}):\n" + \
        "\n".join(problems)
