"""The bad-input corpus (tests/data/ir/bad): every case fails with one located line.

Each case is one file. Its expectation (text the message must contain) is the file's first
line `# expect: ...`, or a sidecar `<case>.expect` for JSON and binary cases. Every case goes
through the shared loader (`read_module`) and through a test-only command built like the real
ones (`tk_command`), which must print exactly one `tk-check: error: <file>...` line and exit 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from tilekit.cli.common import format_option, input_argument, output_option, tk_command
from tilekit.errors import EXIT_BAD_INPUT, TilekitError
from tilekit.ir import read_module, write_module

BAD = Path(__file__).resolve().parent.parent / "data" / "ir" / "bad"
GOOD = Path(__file__).resolve().parent.parent / "data" / "ir" / "good"
CASES = sorted(p for p in BAD.iterdir() if p.suffix != ".expect")


def expectation(case: Path) -> str:
    sidecar = case.with_suffix(".expect")
    if sidecar.exists():
        return sidecar.read_text(encoding="utf-8").strip()
    first = case.read_text(encoding="utf-8", errors="replace").splitlines()[0]
    assert first.startswith("# expect: "), f"{case.name}: first line must be '# expect: ...'"
    return first[len("# expect: "):].strip()


@tk_command("tk-check")
@input_argument
@output_option
@format_option
def check_command(input: str, output: str, fmt: str | None, quiet: bool, debug: bool) -> None:
    """Test-only: read, verify and write back a tile IR document."""
    write_module(read_module(input), output, fmt, input_path=input)


def test_corpus_is_big_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_loader_rejects_with_a_located_message(case: Path) -> None:
    with pytest.raises(TilekitError) as info:
        read_module(str(case))
    text = info.value.message()
    assert "\n" not in text
    assert text.startswith(f"{case}:"), f"not located at the file: {text}"
    assert expectation(case) in text


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_command_reports_one_line_and_exits_2(case: Path) -> None:
    result = CliRunner().invoke(check_command, [str(case)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tk-check: error: {case}:")
    assert expectation(case) in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("case", sorted(GOOD.iterdir()), ids=lambda p: p.name)
def test_command_accepts_good_documents(case: Path) -> None:
    result = CliRunner().invoke(check_command, [str(case), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith('{\n  "tilekit": 1,')


def test_command_reads_stdin_and_rejects_empty_stdin() -> None:
    text = (GOOD / "minimal.json").read_text()
    ok = CliRunner().invoke(check_command, [], input=text)
    assert ok.exit_code == 0 and ok.stdout.startswith("tilekit: 1\n")
    empty = CliRunner().invoke(check_command, ["-"], input="")
    assert empty.exit_code == EXIT_BAD_INPUT
    assert empty.stderr == ("tk-check: error: <stdin>: empty input, expected a tile IR document; "
                            "did the command before this one in the pipe fail?\n")


def test_command_usage_errors_exit_2() -> None:
    result = CliRunner().invoke(check_command, ["--format", "xml"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.startswith("tk-check: error: ")
    assert "run 'tk-check --help' for usage" in result.stderr


def test_command_refuses_to_write_an_invalid_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool that builds an invalid module has a bug: exit 1 (internal), nothing written."""
    good = read_module(str(GOOD / "minimal.json"))
    monkeypatch.setattr(__name__ + ".read_module", lambda path: replace(good, model=""))
    result = CliRunner().invoke(check_command, ["whatever.yaml"])
    assert result.exit_code == 1
    assert result.stderr.startswith("tk-check: error: internal error: InvalidOutputError: "
                                    "refusing to write an invalid tile IR document: <output>: "
                                    "model: ")
    assert result.stdout == ""


def _real_commands():
    """The installed commands that read a tile IR document, with the flags they need."""
    from tilekit.cli import tk_codegen, tk_roll, tk_run
    return [("tk-run", tk_run.main, ["--seed", "0"]),
            ("tk-roll", tk_roll.main, ["--hw", "h100"]),
            ("tk-codegen", tk_codegen.main, [])]


@pytest.mark.parametrize("tool, command, flags", _real_commands(), ids=lambda c: c
                         if isinstance(c, str) else "")
def test_real_commands_report_every_case_in_one_line(tool, command, flags) -> None:
    """Every corpus case through every IR-reading command: exit 2, one located line."""
    for case in CASES:
        result = CliRunner().invoke(command, [str(case), *flags])
        assert result.exit_code == EXIT_BAD_INPUT, (tool, case.name, result.output)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (tool, case.name, result.stderr)
        assert lines[0].startswith(f"{tool}: error: {case}:"), (tool, lines[0])
        assert expectation(case) in lines[0], (tool, case.name, lines[0])
        assert "Traceback" not in result.stderr
