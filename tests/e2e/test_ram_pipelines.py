"""tk-ram through real shell pipes: `tk-import | tk-roll --hw h100 --top-k 4 | tk-ram |
tk-run --mode program --check` (every rTask run on the CPU in the planned order, checked
against onnxruntime), also after weld-style kernel groups, and the persistent kernels compiled
for sm_90 and sm_80.

The default set is the models whose every rTask the CPU runs in seconds (the LSTM, the
ResNeXt-style block, the NASNet-style cell), compiled for sm_90 (tests/unit/test_ram_codegen.py
compiles for sm_80 too). SqueezeNet, ShuffleNet, Inception v1/v2 and DenseNet-121 have
50,000-200,000 rTasks each (15 s to minutes per model on 2 cores): with
TILEKIT_RAM_ALL_MODELS=1 they run too, compiled for both archs (docs/ram.md lists the
results).
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
from scope import on

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from models import onnx_models, ram_models  # noqa: E402
from models.onnx_check import with_random_weights  # noqa: E402
from test_pipelines import LIGHT, assert_checked, run_ok, run_pipe  # noqa: E402

FAST = ["lstm_model", "resnext_block", "nasnet_cell"]
ALL = FAST + ["squeezenet", "shufflenet", "inception_v1", "inception_v2", "densenet121"]
EVERY = on("TILEKIT_RAM_ALL_MODELS")
MODELS = ALL if EVERY else FAST
TARGETS = [("h100", "sm_90"), ("a100", "sm_80")] if EVERY else [("h100", "sm_90")]
PARAMS = [pytest.param(m, marks=pytest.mark.xdist_group(f"ram-{m}")) for m in MODELS]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ram-models")


def rolled_ir(model_dir: Path, name: str) -> Path:
    """The model imported and rolled for the H100 with top-4 variants, once per session."""
    path = model_dir / f"{name}.h100.yaml"
    if path.exists():
        return path
    onnx_path = model_dir / f"{name}.onnx"
    if name in ram_models.ALL:
        model = ram_models.ALL[name]()
    elif hasattr(onnx_models, name):
        model = getattr(onnx_models, name)()
    else:
        model = with_random_weights(LIGHT / f"light_{name}.onnx", seed=0)
    onnx.save(model, str(onnx_path))
    pipe = f"tk-import {onnx_path.name} | tk-roll --hw h100 --top-k 4 -o {path.name}"
    run_ok(pipe, model_dir)
    return path


@pytest.mark.parametrize("name", PARAMS)
def test_ram_program_mode_check(name, model_dir):
    ir = rolled_ir(model_dir, name)
    pipe = f"tk-ram {ir.name} | tk-run --mode program --seed 0 --check"
    assert_checked(run_pipe(pipe, model_dir), pipe)


#: Groups made as tk-weld makes them (tests/models/ram_models.weld_style) on the LSTM and the
#: NASNet cell; the ResNeXt block's groups come from tk-weld itself in
#: test_stages_together.py (test_weld_then_ram_runs_as_a_program), the same path, and run
#: here too with TILEKIT_RAM_ALL_MODELS=1.
WELD_STYLE_PARAMS = [p for p in PARAMS if EVERY or p.values[0] != "resnext_block"]


@pytest.mark.parametrize("name", WELD_STYLE_PARAMS)
def test_ram_after_weld_style_groups(name, model_dir):
    from tilekit.ir import read_module, write_module

    grouped = model_dir / f"{name}.grouped.yaml"
    module = ram_models.weld_style(read_module(str(rolled_ir(model_dir, name))))
    assert any(len(k.ops) > 1 for k in module.kernels)
    write_module(module, str(grouped))
    pipe = f"tk-ram {grouped.name} | tk-run --mode program --seed 0 --check"
    assert_checked(run_pipe(pipe, model_dir), pipe)


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc is not installed")
@pytest.mark.parametrize("hw, arch", TARGETS)
@pytest.mark.parametrize("name", [p for p in PARAMS if EVERY or p.values[0] != "nasnet_cell"])
def test_ram_programs_compile(name, hw, arch, model_dir):
    ir = rolled_ir(model_dir, name)
    pipe = (f"tk-ram --hw {hw} {ir.name} | tk-codegen --hw {hw} --arch {arch} --compile "
            f"--strict -o {name}.{hw}.program.yaml")
    run_ok(pipe, model_dir)
    import yaml
    kernels = yaml.safe_load((model_dir / f"{name}.{hw}.program.yaml").read_text())[
        "codegen"]["kernels"]
    assert any(k.get("coresident") for k in kernels)
