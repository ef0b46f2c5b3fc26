"""tests/gpu/gpu_check.py's arguments, without a GPU: the model variants it compiles and the
refusal of unknown steps and variants (the script runs unattended on a lent machine, so a typo
must fail before any step starts); and tests/gpu/kernel_fit.py, which reads its results."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import gpu_check  # noqa: E402


def test_every_variant_is_a_pipe_ending_in_a_compiled_ir():
    for name, pipe in gpu_check.VARIANTS.items():
        text = pipe.format(n="m", out="m.out.yaml", hw="a100")
        assert "tk-codegen --compile" in text and text.endswith("-o m.out.yaml"), (name, text)
        assert "{" not in text, (name, text)
    assert "tk-weld" in gpu_check.VARIANTS["welded"]
    assert "tk-ram" in gpu_check.VARIANTS["program"] and "--top-k 4" in gpu_check.VARIANTS["program"]
    assert "tk-grind" in gpu_check.VARIANTS["ground"]
    assert gpu_check.CONTROL_VARIANTS <= set(gpu_check.VARIANTS)


def test_the_sanitized_ground_variants_are_of_control_flow_models():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.control_models import MODELS

    assert {m for m, v in gpu_check.SANITIZED if v == "ground"} <= set(MODELS)


def test_the_models_step_builds_each_dtype_and_only_control_models_ground(tmp_path,
                                                                       monkeypatch):
    """Without a GPU the checks fail, but the builds are what the step decided to make: each
    dtype's import, the ground variant for a control-flow model only, a reused IR kept."""
    monkeypatch.setattr(gpu_check, "VARIANTS", {  # no nvcc: that is not what is tested
        k: v.replace("--compile ", "") for k, v in gpu_check.VARIANTS.items()})
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "models" / "lstm_loop.f16.ground.cuda.yaml").write_text("kept\n")
    gpu_check.main(["--out", str(tmp_path / "out"), "--work", str(work), "--steps", "models",
                    "--models", "lstm_loop,mobilenet_block", "--variants", "ground",
                    "--dtypes", "float32,float16,bfloat16", "--runs", "0", "--reuse-built"])
    built = sorted(p.name for p in (work / "models").glob("*.cuda.yaml"))
    assert built == ["lstm_loop.bf16.ground.cuda.yaml", "lstm_loop.f16.ground.cuda.yaml",
                     "lstm_loop.ground.cuda.yaml"]
    assert "--dtype bfloat16" in (work / "logs" / "models-lstm_loop.log").read_text()
    assert (work / "models" / "lstm_loop.f16.ground.cuda.yaml").read_text() == "kept\n"
    assert (work / "models" / "mobilenet_block.f16.tk.yaml").exists()
    assert "--dtype float16" in (work / "logs" / "models-lstm_loop.log").read_text()


@pytest.mark.parametrize("flag, value", [("--steps", "models,fly"), ("--variants", "rolled,fast"),
                                         ("--dtypes", "float32,int4"),
                                         ("--stages", "weld,melt"),
                                         ("--models", "resnet50,resnet5O"),
                                         ("--timed-dtypes", "float16")])
def test_unknown_steps_and_variants_are_refused_before_any_step(tmp_path, flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path), flag, value])
    assert exit_.value.code == 2
    assert "unknown" in capsys.readouterr().err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_ncu_csv_pages_become_one_summary_longest_first(tmp_path):
    """The profile step's summary: per launch the kept metrics (numbers, thousands separators
    dropped) and ncu's findings once each, the longest launches first over every file."""
    head = ('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value",'
            '"Rule Name","Rule Type","Estimated Speedup"\n')

    def row(i, kernel, section, metric, value, rule="", speedup=""):
        return f'"{i}","{kernel}","{section}","{metric}","","{value}","{rule}","OPT","{speedup}"\n'

    sol = "GPU Speed Of Light Throughput"
    (tmp_path / "ncu-m.rolled.csv").write_text(
        "==PROF== Connected to process 1\n" + head
        + row(0, "k_small", sol, "Duration", "1,024")
        + row(0, "k_small", "Occupancy", "Achieved Occupancy", "6.5", "AchievedOccupancy", "40")
        + row(0, "k_small", "Occupancy", "Theoretical Occupancy", "50", "AchievedOccupancy",
              "40")
        + row(1, "k_big", sol, "Duration", "63,264")
        + row(1, "k_big", "Launch Statistics", "Block Size", "128"))
    (tmp_path / "ncu-n.welded.csv").write_text(head + row(0, "k_mid", sol, "Duration", "9000"))
    doc = gpu_check.ncu_summary(sorted(tmp_path.glob("ncu-*.csv")), top=2)
    assert doc["launches"] == 3
    assert [(r["model"], r["variant"], r["kernel"]) for r in doc["top"]] == [
        ("m", "rolled", "k_big"), ("n", "welded", "k_mid")]
    assert doc["top"][0]["duration_ns"] == 63264.0 and doc["top"][0]["block"] == 128.0
    small = doc["rest"][0]
    assert small["achieved_occupancy_pct"] == 6.5 and small["theoretical_occupancy_pct"] == 50.0
    assert small["findings"] == [{"rule": "AchievedOccupancy", "type": "OPT", "speedup_pct": "40"}]


def test_build_only_builds_and_checks_nothing(tmp_path, monkeypatch):
    """--build-only: the IR is written and recorded as built; no tk-run starts (none in the
    log), so it runs on a machine without a GPU in a clean summary."""
    import json

    monkeypatch.setattr(gpu_check, "VARIANTS", {
        k: v.replace("--compile ", "") for k, v in gpu_check.VARIANTS.items()})
    work = tmp_path / "work"
    gpu_check.main(["--out", str(tmp_path / "out"), "--work", str(work), "--steps", "models",
                    "--models", "lstm_loop", "--variants", "ground", "--build-only"])
    assert (work / "models" / "lstm_loop.ground.cuda.yaml").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary == [{"step": "models", "model": "lstm_loop", "dtype": "float32",
                        "variant": "ground", "built": "lstm_loop.ground.cuda.yaml"}]
    assert "tk-run" not in (work / "logs" / "models-lstm_loop.log").read_text()


def test_kernel_fit_sets_each_kernel_call_against_the_roll(tmp_path, capsys):
    """tests/gpu/kernel_fit.py: the models step's kernel calls (kernels.json) against the
    estimates in the IR built for them, by shape; an IR not built is a clear refusal."""
    import json

    import kernel_fit
    from clirun import completed
    from tilekit.cli import tk_codegen, tk_roll, tk_weld

    models = tmp_path / "models"
    models.mkdir()
    data = Path(__file__).resolve().parents[1] / "data" / "run" / "softmax.yaml"
    source = tmp_path / "softmax.yaml"        # as tk-import would have marked it
    source.write_text(data.read_text().replace("inputs: [x, mask]",
                                               "stages: [{name: import}]\ninputs: [x, mask]"))
    rolled = tmp_path / "rolled.yaml"
    assert completed(tk_roll.main, ["--hw", "h100", source, "-o", rolled]).returncode == 0
    ir = models / "softmax.rolled.cuda.yaml"
    assert completed(tk_codegen.main, [rolled, "-o", ir]).returncode == 0
    from tilekit.ir.codec import read_module
    entries = [k["entry"] for k in read_module(str(ir)).codegen["kernels"]]
    calls = tmp_path / "kernels.json"
    calls.write_text(json.dumps({"softmax.rolled": [[e, 0.01] for e in entries]}))
    rows_path = tmp_path / "rows.json"
    assert kernel_fit.main([str(calls), "--work", str(tmp_path), "--json", str(rows_path)]) == 0
    rows = json.loads(rows_path.read_text())
    assert [r["kernel"] for r in rows] == entries
    assert all(r["measured_us"] == 10.0 and r["estimated_us"] > 0 and r["warps_per_sm"] > 0
               for r in rows)
    assert "meas/est median" in capsys.readouterr().out
    # welded: a group is priced as one kernel (tk-weld's estimate), not as the sum of its ops
    welded = models / "softmax.welded.cuda.yaml"
    weld = completed(tk_weld.main, [rolled, "-o", tmp_path / "welded.yaml"])
    assert weld.returncode == 0
    assert completed(tk_codegen.main, [tmp_path / "welded.yaml", "-o", welded]).returncode == 0
    module = read_module(str(welded))
    (group,) = [k for k in module.kernels if len(k.ops) > 1]
    entry = next(k["entry"] for k in module.codegen["kernels"] if k["name"] == group.name)
    calls.write_text(json.dumps({"softmax.welded": [[entry, 0.01]]}))
    assert kernel_fit.main([str(calls), "--work", str(tmp_path), "--json", str(rows_path)]) == 0
    (row,) = json.loads(rows_path.read_text())
    assert row["ops"] == len(group.ops) and row["estimated_us"] == round(
        group.estimate["time_us"], 3)
    calls.write_text(json.dumps({"softmax.program": []}))
    assert kernel_fit.main([str(calls), "--work", str(tmp_path)]) == 2
    assert "softmax.program.cuda.yaml is not built" in capsys.readouterr().err
