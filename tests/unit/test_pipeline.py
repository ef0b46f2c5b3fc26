"""The pass pipeline: one signature, one place for stages, and the same bytes as the pipes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

import tilekit
from tilekit import pipeline
from tilekit.errors import IRError, TilekitError
from tilekit.ir import dumps
from tilekit.ir.stages import INVALIDATES, drop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402
from scope import FULL  # noqa: E402


def run_pipe(pipe: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{ROOT / 'bin'}{os.pathsep}{os.environ['PATH']}",
               NO_COLOR="1")
    return subprocess.run(["bash", "-o", "pipefail", "-c", pipe], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


#: (model, weld): by default each model once and each pass list once (the two others with
#: TILEKIT_FULL=1); tests/e2e/test_stages_together.py compares every pass with the pipe too.
PIPE_CASES = [("mobilenet_block", True), ("bert_encoder_layer", False)] + (
    [("mobilenet_block", False), ("bert_encoder_layer", True)] if FULL else [])


@pytest.mark.parametrize("model, weld", PIPE_CASES,
                         ids=[f"{m}-{'roll_weld' if w else 'roll'}" for m, w in PIPE_CASES])
def test_compile_in_one_process_equals_the_piped_commands(model, weld, tmp_path, monkeypatch):
    onnx.save(getattr(onnx_models, model)(), str(tmp_path / "m.onnx"))
    middle = "| tk-weld --top-k 2 " if weld else ""
    proc = run_pipe("tk-import m.onnx -o m.tk.yaml && tk-roll --hw h100 m.tk.yaml --top-k 2 "
                    f"{middle}| tk-codegen -o m.cuda.yaml", tmp_path)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.chdir(tmp_path)
    passes = ["roll", "weld", "codegen"] if weld else ["roll", "codegen"]
    compiled = tilekit.compile("m.onnx", passes, hw="h100", top_k=2, ir_path="m.tk.yaml")
    assert dumps(compiled.module) == (tmp_path / "m.cuda.yaml").read_text()
    assert not (tmp_path / "model.tk.weights.npz").exists()    # nothing written
    assert set(compiled.weights) == {n for n, t in compiled.module.tensors.items()
                                     if t.role == "weight"}


def test_every_pass_says_what_it_requires_produces_and_invalidates():
    for name, p in pipeline.PASSES.items():
        assert p.name == name and p.summary and p.produces
        assert "import" in p.requires
        assert p.invalidates == INVALIDATES[name]


def test_unknown_pass_lists_the_known_ones():
    with pytest.raises(TilekitError, match="known passes: roll, weld, grind, ram, codegen"):
        pipeline.get("fuse")


def test_a_pass_refuses_a_module_without_the_stages_it_requires(tmp_path):
    from tilekit.ir import Module, Op, Tensor
    m = Module(model="m", tensors={"x": Tensor((4,), "float32", "input"),
                                   "y": Tensor((4,), "float32", "output")},
               ops=(Op("id", "y[i] = x[i]"),), inputs=("x",), outputs=("y",))
    with pytest.raises(IRError, match="no 'import' stage"):
        pipeline.run(m, ["codegen"])
    with pytest.raises(TilekitError, match="needs a hardware profile"):
        pipeline.run(m.with_stage("import"), ["roll"])


def test_rerolling_drops_what_the_old_tiles_decided(tmp_path):
    path = tmp_path / "mobilenet.onnx"
    onnx.save(onnx_models.mobilenet_block(), str(path))
    compiled = tilekit.compile(path, ["roll", "codegen"], hw="h100")
    again = pipeline.run(compiled.module, ["roll"], pipeline.Context.for_hw("a100"))
    assert again.codegen is None and all(k.launch is None for k in again.kernels)
    assert again.stages[-1] == {"name": "roll", "options": {
        "dropped": ["codegen", "kernels[*].launch"], "top_k": 1}}
    assert again.hardware == "a100"


def test_drop_names_only_what_was_there():
    compiled_like = replace(onnx_models_module(), codegen=None)
    out, dropped = drop(compiled_like, INVALIDATES["roll"])
    assert dropped == [] and out is compiled_like


def onnx_models_module():
    from tilekit.ir import Module, Op, Tensor
    return Module(model="m", tensors={"x": Tensor((4,), "float32", "input"),
                                      "y": Tensor((4,), "float32", "output")},
                  ops=(Op("id", "y[i] = x[i]"),), inputs=("x",), outputs=("y",))


# -- compile's options, docstring and saved result ---------------------------------------

def test_compile_refuses_an_option_no_pass_reads(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(onnx_models.mobilenet_block(), str(path))
    with pytest.raises(TilekitError) as err:
        tilekit.compile(path, ["roll"], hw="h100", topk=3)
    assert "unknown option 'topk'" in err.value.message()
    assert "did you mean 'top_k'?" in err.value.message()
    assert "precision, top_k" in err.value.message()
    with pytest.raises(TilekitError, match="read by the ram pass, which is not in passes"):
        tilekit.compile(path, ["roll"], hw="h100", policy="serial")


def test_every_pass_option_is_read_and_documented():
    doc = pipeline.compile.__doc__
    for name, p in pipeline.PASSES.items():
        assert f'"{name}"' in doc, name
        for option in p.options:
            assert f"`{option}=" in doc, option
    pipeline.check_options(list(pipeline.PASSES), {o: None for p in pipeline.PASSES.values()
                                                    for o in p.options})


def test_help_of_tilekit_compile_lists_the_passes_and_options():
    """README.md: `help(tilekit.compile)` lists the passes and their options; the package
    gives the pipeline's function itself (loaded on first use), not a wrapper hiding its
    docstring."""
    import pydoc
    assert tilekit.compile is pipeline.compile
    text = pydoc.render_doc(tilekit.compile)
    assert '"weld"' in text and "`top_k=" in text and "`policy=" in text
    assert "compile" in dir(tilekit)
    with pytest.raises(AttributeError, match="no attribute 'compiel'"):
        tilekit.compiel  # noqa: B018
    lazy = subprocess.run([sys.executable, "-c", "import sys, tilekit; "
                           "print('tilekit.pipeline' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert lazy.stdout.strip() == "False"  # `import tilekit` stays light for the commands


def test_compiled_save_writes_what_tk_run_runs(tmp_path, monkeypatch):
    onnx.save(onnx_models.mobilenet_block(), str(tmp_path / "m.onnx"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    compiled = tilekit.compile("m.onnx", ["roll", "weld"], hw="h100", ir_path="out/m.tk.yaml")
    assert not (tmp_path / "out" / "m.tk.yaml").exists()
    compiled.save()
    assert (tmp_path / "out" / "m.tk.yaml").read_text() == dumps(compiled.module)
    assert (tmp_path / "out" / "m.tk.weights.npz").is_file()
    proc = run_pipe("tk-run out/m.tk.yaml --seed 0 --check --quiet", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: pass" in proc.stdout
