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

Nor digits that depend on the machine: the errors a `--check` line measures (`max_abs`,
`rel_l2`, below the tolerance when it passes) differ in their last digits with the CPU and the
BLAS, and the onnxruntime version with the install. `mask_measured` replaces them by
`<measured>` / `<version>` in what a command prints, before it is compared or written as
expected; the verdict (`pass (rtol 1e-05, atol 1e-06)`) stays, and is what a golden checks.
Timings (`--bench`) would be measured digits too: no case prints them
(test_no_golden_holds_measured_digits).
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CASES = sorted(p for p in HERE.iterdir() if (p / "cmd").is_file())
TIMEOUT_S = 120


#: What `mask_measured` replaces (see the module docstring).
_NUMBER = r"-?(?:\d[\d.]*(?:e[-+]?\d+)?|inf|nan)"
MEASURED = (
    (re.compile(rf"\b(max_abs|rel_l2) {_NUMBER}(?![\w.])"), r"\1 <measured>"),
    (re.compile(r"\bonnxruntime \d[\w.+-]*"), "onnxruntime <version>"),
)


def mask_measured(text: str) -> str:
    for pattern, replacement in MEASURED:
        text = pattern.sub(replacement, text)
    return text


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
    return (mask_measured(proc.stdout.decode("utf-8", "replace")),
            mask_measured(proc.stderr.decode("utf-8", "replace")), proc.returncode)


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


#: Lines no expected file may hold: measured digits, unmasked (a new kind of measured output
#: needs a pattern in MEASURED, or the case must not print it).
MACHINE_DEPENDENT = re.compile(
    r"\b(?:max_abs|rel_l2) [-\d]|\bonnxruntime \d|^bench: |\b\d+(?:\.\d+)? ms\b|"
    r"\bmedian \d|\b(?:AMD|Intel|EPYC|Xeon)\b", re.MULTILINE)


def test_no_golden_holds_measured_digits() -> None:
    found = [f"{path.relative_to(REPO)}: {match.group(0)!r}"
             for case in CASES for path in sorted(case.glob("expected_*"))
             for match in MACHINE_DEPENDENT.finditer(path.read_text(encoding="utf-8"))]
    assert not found, "golden files hold digits that depend on the machine:\n" + \
        "\n".join(found)


def test_mask_measured_keeps_the_verdict() -> None:
    line = "  out: max_abs 4.02e-07  rel_l2 2.5e-07  pass (rtol 1e-05, atol 1e-06)"
    assert mask_measured(line) == \
        "  out: max_abs <measured>  rel_l2 <measured>  pass (rtol 1e-05, atol 1e-06)"
    assert mask_measured("y: max_abs inf  rel_l2 nan  FAIL (rtol 1e-05, atol 1e-06)") == \
        "y: max_abs <measured>  rel_l2 <measured>  FAIL (rtol 1e-05, atol 1e-06)"
    assert mask_measured("  largest: y rel_l2 1.2e-07; h rel_l2 0") == \
        "  largest: y rel_l2 <measured>; h rel_l2 <measured>"
    assert mask_measured("check: cpu against onnxruntime 1.32.0 on m.onnx: pass when rel_l2 "
                         "<= rtol") == \
        "check: cpu against onnxruntime <version> on m.onnx: pass when rel_l2 <= rtol"
