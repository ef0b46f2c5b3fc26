"""What every stage command shares on the command line: an ONNX model given where the IR is
expected, tk-codegen with a profile that has no CUDA arch, report formats, --time-passes and
the warning when a stage drops sections. In process (click's runner) unless a pipe is the
point."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
MLP = REPO / "tests" / "golden" / "roll_mlp_h100" / "mlp.yaml"
sys.path.insert(0, str(REPO / "tests"))
from models import onnx_models  # noqa: E402

STAGES = ("tk_roll", "tk_weld", "tk_grind", "tk_ram", "tk_codegen", "tk_run")


def invoke(command: str, *args, stdin: bytes | None = None):
    main = importlib.import_module(f"tilekit.cli.{command}").main
    return CliRunner().invoke(main, [str(a) for a in args], input=stdin)


@pytest.fixture
def model(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    onnx.save(onnx_models.mobilenet_block(), "m.onnx")
    return Path("m.onnx")


@pytest.mark.parametrize("command", STAGES)
def test_an_onnx_model_given_to_a_stage_says_to_import_it(command, model):
    result = invoke(command, model)
    assert result.exit_code == 2
    assert result.output == ("tk-" + command[3:] + ": error: m.onnx is an ONNX model, not tile "
                             "IR: run tk-import m.onnx first\n")


def test_an_onnx_model_on_stdin_or_without_its_suffix(model):
    data = model.read_bytes()
    result = invoke("tk_roll", "--hw", "h100", stdin=data)
    assert result.exit_code == 2
    assert "<stdin> is an ONNX model, not tile IR: run tk-import MODEL.onnx first" in result.output
    Path("model.bin").write_bytes(data)
    result = invoke("tk_run", "model.bin")
    assert result.exit_code == 2 and "model.bin is an ONNX model" in result.output


def test_codegen_with_a_profile_without_cuda_arch_says_what_to_do(tmp_path):
    result = invoke("tk_codegen", "--hw", "ipu", MLP)
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "tk-codegen: error: --hw: hardware profile 'ipu' (graphcore ipu2, distributed) has no "
        "CUDA arch")
    assert "pass --hw with an NVIDIA profile (a100, h100, rtx4090, v100)" in lines[0]
    assert "sm_XX" not in lines[0] and "e.g. sm_80" not in lines[0]
    rolled = tmp_path / "rolled.yaml"
    assert invoke("tk_roll", "--hw", "ipu", MLP, "-o", rolled).exit_code == 0
    result = invoke("tk_codegen", rolled)
    assert result.exit_code == 2 and "error: hardware: hardware profile 'ipu'" in result.output


# -- report formats and --time-passes -----------------------------------------------------

def _json_line(stderr: str) -> dict:
    import json
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stderr
    return json.loads(lines[0])


def test_roll_json_report_is_one_deterministic_document(tmp_path):
    runs = [CliRunner().invoke(importlib.import_module("tilekit.cli.tk_roll")
                                               .main, ["--hw", "h100", str(MLP),
                                                       "--report-format", "json", "-o",
                                                       str(tmp_path / f"r{i}.yaml")])
            for i in range(2)]
    assert all(r.exit_code == 0 for r in runs)
    assert runs[0].stderr == runs[1].stderr and runs[0].stderr.count("\n") == 1
    doc = _json_line(runs[0].stderr)
    assert doc["tool"] == "tk-roll" and doc["hardware"] == "h100" and "time_s" not in doc
    assert [row["op"] for row in doc["ops"]] == ["fc1", "relu1", "fc2", "max", "exp", "sum",
                                                 "div"]
    total = sum(row["time_us"] for row in doc["ops"])
    assert doc["estimate"]["kernels"] == doc["estimate"]["ops"] == 7
    assert abs(doc["estimate"]["time_us"] - total) <= 1e-3 * total


@pytest.mark.parametrize("command, key", [("tk_weld", "groups"), ("tk_grind", "control"),
                                          ("tk_ram", "estimate"), ("tk_codegen", "kernels")])
def test_every_stage_report_is_one_json_document(command, key, tmp_path):
    """--report-format json: the report of each later stage is one deterministic JSON line
    on stderr naming the tool, with --time-passes' phases inside it."""
    rolled = tmp_path / "r.yaml"
    assert invoke("tk_roll", "--hw", "h100", MLP, "-o", rolled).exit_code == 0
    main = importlib.import_module(f"tilekit.cli.{command}").main
    runs = [CliRunner().invoke(main, [str(rolled), "--report-format", "json", "-o",
                                      str(tmp_path / f"o{i}.yaml")]) for i in range(2)]
    assert all(r.exit_code == 0 for r in runs), runs[0].stderr
    assert runs[0].stderr == runs[1].stderr and runs[0].stderr.count("\n") == 1
    doc = _json_line(runs[0].stderr)
    assert doc["tool"] == command.replace("_", "-") and doc["hardware"] == "h100"
    assert key in doc and "time_s" not in doc
    timed = CliRunner().invoke(main, [str(rolled), "--report-format", "json", "--time-passes",
                                      "-o", str(tmp_path / "t.yaml")])
    doc = _json_line(timed.stderr)
    assert "total" in doc["time_s"] and f"{command.replace('_', '-')}: time:" not in \
        timed.stderr


def test_time_passes_names_each_phase(tmp_path):
    result = CliRunner().invoke(
        importlib.import_module("tilekit.cli.tk_roll").main,
        ["--hw", "h100", str(MLP), "--time-passes", "-o", str(tmp_path / "r.yaml")])
    assert result.exit_code == 0
    line, = result.stderr.splitlines()
    assert line.startswith("tk-roll: time: read ") and " profile " in line
    assert " roll " in line and " write " in line and "; total " in line
    result = CliRunner().invoke(
        importlib.import_module("tilekit.cli.tk_roll").main,
        ["--hw", "h100", str(MLP), "--time-passes", "--report-format", "json", "-o",
         str(tmp_path / "r.yaml")])
    doc = _json_line(result.stderr)
    assert set(doc["time_s"]) == {"read", "profile", "roll", "write", "total"}
    assert "tk-roll: time:" not in result.stderr


def test_run_json_results_with_bench_figures(model):
    import json
    from tilekit.cli.tk_run import main
    assert invoke("tk_import", model, "-o", "m.yaml").exit_code == 0
    result = CliRunner().invoke(main, ["m.yaml", "--seed", "1", "--check", "--bench", "3",
                                       "--report-format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert result.stdout.count("\n") == 1 and doc["tool"] == "tk-run"
    assert doc["inputs"] == {"seed": 1, "default_seed": False}
    assert doc["check"]["passed"] is True and doc["check"]["run"] == "cpu (whole ops)"
    assert list(doc["outputs"]) == ["logits"]
    bench = doc["bench"]
    assert bench["runs"] == 3 and len(bench["times_ms"]) == 3 and bench["threads"] >= 1
    assert bench["min_ms"] <= bench["p50_ms"] <= bench["p90_ms"] <= bench["max_ms"]
    assert bench["stddev_ms"] >= 0


# -- estimates around loops, and stages run out of order ------------------------------------

@pytest.fixture
def loop_ir(tmp_path, monkeypatch) -> Path:
    from models import control_models
    monkeypatch.chdir(tmp_path)
    onnx.save(control_models.lstm_loop(), "loop.onnx")
    assert invoke("tk_import", "loop.onnx", "-o", "loop.yaml").exit_code == 0
    assert invoke("tk_roll", "--hw", "h100", "loop.yaml", "-o", "loop.r.yaml").exit_code == 0
    return Path("loop.r.yaml")


def test_weld_totals_count_a_loop_body_on_both_sides(loop_ir):
    from tilekit.ir import read_module
    from tilekit.roll.schedule import module_estimate, report_rows
    from tilekit.weld.report import totals

    rolled = read_module(str(loop_ir))
    rows = report_rows(rolled, full=True)
    assert any(r[0].startswith("lstm.body/") for r in rows)
    est = module_estimate(rolled)
    assert est["ops"] == len(rows) == est["kernels"]
    assert abs(est["time_us"] - sum(r[5] for r in rows)) <= 1e-3 * est["time_us"]
    result = CliRunner().invoke(
        importlib.import_module("tilekit.cli.tk_weld").main,
        [str(loop_ir), "--report", "-o", "loop.w.yaml"])
    assert result.exit_code == 0, result.stderr
    welded = read_module("loop.w.yaml")
    t = totals(welded)
    # before welding, the totals are tk-roll's: the same kernels, DRAM bytes and time
    assert t.kernels_before == est["kernels"]
    assert abs(t.time_before - est["time_us"]) <= 1e-3 * est["time_us"]
    assert abs(t.dram_before - est["dram_bytes"]) <= 1e-3 * est["dram_bytes"]
    assert t.time_after <= t.time_before and t.kernels_after < t.kernels_before
    title = result.stderr.splitlines()[0]
    assert "% less" in title and "-" not in title.split("(")[1].split(";")[0]
    assert "lstm.body/k_" in result.stderr  # the groups inside the loop body are listed


def test_a_change_is_less_or_more_never_a_negative_less():
    from tilekit.weld.report import change
    assert change(100, 65.4) == "34.6% less"
    assert change(352, 10982) == "3019.9% more"
    assert change(5, 5) == "no change" and change(0, 5) == "from none"


def test_a_stage_that_drops_sections_says_which(tmp_path):
    rolled, coded = tmp_path / "r.yaml", tmp_path / "c.yaml"
    assert invoke("tk_roll", "--hw", "h100", MLP, "-o", rolled).exit_code == 0
    assert invoke("tk_codegen", rolled, "-o", coded).exit_code == 0
    result = CliRunner().invoke(
        importlib.import_module("tilekit.cli.tk_roll").main,
        ["--hw", "a100", str(coded), "-o", str(tmp_path / "again.yaml")])
    assert result.exit_code == 0
    assert result.stderr == ("tk-roll: warning: dropped codegen, kernels[*].launch: made from "
                             "what this stage changes; run tk-codegen again after it\n")
    # in pipeline order nothing is dropped, and nothing is said
    result = CliRunner().invoke(
        importlib.import_module("tilekit.cli.tk_weld").main,
        [str(rolled), "-o", str(tmp_path / "w.yaml")])
    assert result.exit_code == 0 and result.stderr == ""


def test_progress_only_on_a_terminal(monkeypatch):
    from tilekit.cli import common
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(common.sys.stderr, "isatty", lambda: True, raising=False)
    assert common.progress_shown(quiet=False)
    assert not common.progress_shown(quiet=True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not common.progress_shown(quiet=False)
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr(common.sys.stderr, "isatty", lambda: False, raising=False)
    assert not common.progress_shown(quiet=False)
    phases = common.Phases("tk-x")
    with phases.step("work", "working") as advance:
        advance()
    assert set(phases.seconds()) == {"work", "total"}


# -- the recorded profile's content hash, checked by every stage that loads it --------------

@pytest.mark.parametrize("command", ["tk_weld", "tk_grind", "tk_ram", "tk_codegen"])
def test_a_stage_refuses_a_profile_of_other_figures_under_the_recorded_name(
        command, tmp_path, monkeypatch):
    from tilekit.hw import ENV_VAR, builtin_dir
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert invoke("tk_roll", "--hw", "h100", MLP, "-o", "r.yaml").exit_code == 0
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "mine.yaml").write_text((builtin_dir() / "h100.yaml").read_text().replace(
        "value: 3.35, unit: TB/s", "value: 2.0, unit: TB/s"))
    monkeypatch.setenv(ENV_VAR, str(folder))
    result = CliRunner().invoke(importlib.import_module(f"tilekit.cli.{command}").main,
                                ["r.yaml", "-o", "out.yaml"])
    assert result.exit_code == 2
    line, = result.stderr.splitlines()
    assert "r.yaml was made with a 'h100' profile of other figures" in line
    assert "than profiles/mine.yaml" in line and "pass --hw " in line
    assert not (tmp_path / "out.yaml").exists()
    # --hw names the profile explicitly: the stage runs for it
    result = CliRunner().invoke(importlib.import_module(f"tilekit.cli.{command}").main,
                                ["r.yaml", "--hw", str(builtin_dir() / "h100.yaml"), "-o",
                                 "out.yaml"])
    assert result.exit_code == 0, result.stderr
