"""tk-hw on the command line: shipped profiles validate, bad ones give one located line, exit 2.

Each file in tests/data/bad_profiles/ starts with `# expect: TEXT` lines; the one-line error
for that file must contain every TEXT. Most cases run in-process (click's runner); a few go
through a real subprocess and the bin/ shim to prove the entry points.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tilekit.cli.tk_hw import main
from tilekit.hw import ENV_VAR

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "hwprofiles").glob("*.yaml"))
BAD = sorted((REPO / "tests" / "data" / "bad_profiles").glob("*.yaml"))


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(main, list(args), input=stdin)


def expectations(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    expects = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("# expect:")]
    assert expects, f"{path.name} has no '# expect:' line"
    return expects


def assert_one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tk-hw: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_there_are_enough_bad_cases():
    assert len(BAD) >= 12


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_profile(path):
    rel = str(path.relative_to(REPO))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = assert_one_error_line(result.stderr)
    assert str(path) in line  # located: the file, and its line where there is one
    for text in expectations(path):
        assert text in line, f"{rel}: expected {text!r} in {line!r}"
    assert result.stdout == ""


def test_validate_shipped_profiles_in_a_subprocess():
    files = [str(p.relative_to(REPO)) for p in SHIPPED]
    proc = subprocess.run([sys.executable, "-m", "tilekit.cli.tk_hw", "validate", *files],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"ok: {f}" for f in files]
    assert proc.stderr == ""


def test_bin_shim_reports_every_bad_file_and_the_good_ones():
    files = [str(SHIPPED[0]), *map(str, BAD)]
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "tk-hw"), "validate", *files],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [f"ok: {SHIPPED[0]}"]
    errors = proc.stderr.splitlines()
    assert len(errors) == len(BAD)
    for line, path in zip(errors, BAD):
        assert line.startswith(f"tk-hw: error: {path}"), line


def test_validate_reads_stdin():
    text = (REPO / "hwprofiles" / "v100.yaml").read_text()
    result = run("validate", "-", stdin=text)
    assert result.exit_code == 0 and result.stdout == "ok: -\n"
    result = run("validate", "-", stdin=text.replace("value: 80,", "value: -80,"))
    assert result.exit_code == 2
    assert "<stdin>:" in assert_one_error_line(result.stderr)


def test_validate_quiet_prints_nothing_on_success():
    result = run("validate", "--quiet", str(SHIPPED[0]))
    assert result.exit_code == 0 and result.stdout == ""


def test_list_is_a_plain_table_when_piped():
    result = run("list")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "ARCH", "KIND", "SMS/CORES"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert set(rows) == {"a100", "graviton3", "h100", "icelake", "ipu", "milan", "rtx4090",
                         "v100"}
    assert "sm_90" in rows["h100"] and "132" in rows["h100"] and "3.35 TB/s" in rows["h100"]
    assert "66.9 TFLOP/s" in rows["h100"]
    assert "distributed" in rows["ipu"]
    # a CPU: cores, the DRAM of all cores, the derived FP32 peak, its -march value
    assert rows["milan"].split()[1:4] == ["znver3", "cpu", "64"]
    assert "204.8 GB/s" in rows["milan"] and "5.018 TFLOP/s" in rows["milan"]


def test_show_prints_every_figure_with_its_source():
    result = run("show", "H100")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "memory[shared].per_block_optin" in out and "227 KiB" in out
    assert "measured:" in out and "sources:" in out and "datasheet:" in out
    assert "989.4 TFLOP/s" in out


def test_show_json_is_base_units():
    result = run("show", "--json", "a100")
    data = json.loads(result.stdout)
    assert data["sm_count"] == 108 and data["smem_per_block"] == 163 * 1024
    assert data["dram_bandwidth"] == 2.039e12


@pytest.mark.parametrize("args, text", [
    (["show", "h1000"], "h1000: unknown hardware profile; did you mean 'h100'? known: a100, graviton3, h100"),
    (["show"], "Missing argument"),
    (["show", "--frobnicate", "h100"], "No such option"),
    (["validate"], "Missing argument"),
    (["explode"], "No such command"),
    (["show", "tests/data/none.yaml"], "tests/data/none.yaml: no such file"),
])
def test_usage_and_input_errors_are_one_line_exit_2(args, text):
    result = run(*args)
    assert result.exit_code == 2
    assert text in assert_one_error_line(result.stderr)


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("tk-hw (tilekit) ")


@pytest.mark.parametrize("args", [["--debug", "show", "h1000"], ["show", "h1000", "--debug"]])
def test_debug_shows_the_traceback(args):
    result = run(*args)
    assert result.exit_code == 2
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("tk-hw: error: h1000: unknown")


def test_no_color_on_a_terminal_gives_the_plain_table(monkeypatch):
    """NO_COLOR wins over a terminal: no bold escapes in `tk-hw list`/`show`."""
    import tilekit.cli.common as common

    class Tty:
        @staticmethod
        def isatty():
            return True

    monkeypatch.setattr(common.sys, "stdout", Tty)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not common.stdout_is_terminal()
    import tilekit.cli.tk_hw as tk_hw
    assert not tk_hw._stdout_is_terminal()
    monkeypatch.delenv("NO_COLOR")
    assert tk_hw._stdout_is_terminal()


def test_validate_warns_when_the_name_is_not_the_file_name(tmp_path):
    text = (REPO / "hwprofiles" / "h100.yaml").read_text()
    (tmp_path / "mine.yaml").write_text(text)
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "mine.yaml")])
    assert result.exit_code == 0
    assert result.stdout == f"ok: {tmp_path / 'mine.yaml'}\n"
    assert result.stderr.startswith("tk-hw: warning: ") and "name 'h100' differs from the " \
        "file name 'mine': --hw h100 may load another file" in result.stderr
    (tmp_path / "h100.yaml").write_text(text)
    assert CliRunner().invoke(main, ["validate", str(tmp_path / "h100.yaml")]).stderr == ""


def test_list_skips_ir_documents_in_a_search_folder(tmp_path, monkeypatch):
    (tmp_path / "m.yaml").write_text((REPO / "tests" / "golden" / "roll_mlp_h100" /
                                      "mlp.yaml").read_text())
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 0, result.output
    assert "<shipped>/h100.yaml" in result.stdout and "m.yaml" not in result.stdout


def test_show_a_cpu_profile_with_its_derived_peaks():
    result = run("show", "milan")
    assert result.exit_code == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert rows["kind:"].split()[1] == "cpu" and rows["arch:"].split()[1] == "znver3"
    assert rows["simd.isa"].split()[1:3] == ["avx2", "amd-sog"]
    assert rows["memory[l3].shared_by"].split()[1] == "8"
    assert "5.018 TFLOP/s  derived: 64 cores x 2 FMA units x 8 fp32 lanes" in \
        rows["compute.peak.fp32"]
    assert "78.4 GFLOP/s" in rows["compute.peak_per_core.fp32"]
    assert "derived: memory[l2].bandwidth x 64 cores (a private level)" in \
        rows["memory[l2].bandwidth_all"]
    data = json.loads(run("show", "--json", "graviton3").stdout)
    assert data["kind"] == "cpu" and data["cpu"]["isa"] == "sve"
    assert [lv["name"] for lv in data["cpu"]["levels"]] == ["l1", "l2", "l3", "dram"]
    assert data["sm_count"] == 64 and data["peaks"]["fp64"] == pytest.approx(2.6624e12)


def test_validate_cpu_profiles_by_name_and_alias():
    result = run("validate", "milan", "xeon-8380", "c7g")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["ok: milan", "ok: xeon-8380", "ok: c7g"]
