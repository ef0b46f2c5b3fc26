"""Every model of the import issue through real shell pipes of the installed commands.

The nine real architectures bundled with onnx ship constant weights (every value 0.02), so
a check on them proves little: they run here with seeded random weights instead (the same
graph, its ConstantOfShape fills replaced by random initializers). The five builder models
come from tests/models. Each pipe ends in `tk-run --check`, which compares with onnxruntime
on the source model and exits 1 on a mismatch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import onnx_models  # noqa: E402
from models.onnx_check import with_random_weights  # noqa: E402
from scope import on, subset  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
REAL_MODELS = ["resnet50", "inception_v1", "inception_v2", "densenet121", "shufflenet",
               "squeezenet", "vgg19", "bvlc_alexnet", "zfnet512"]
BUILT_MODELS = ["bert_encoder_layer", "gpt_block", "mobilenet_block", "mlp_mixer_block",
                "lstm_model"]
ALL_MODELS = REAL_MODELS + BUILT_MODELS
#: One xdist group per model: its ONNX file and imported IR are made once, on one worker.
MODEL_PARAMS = [pytest.param(m, marks=pytest.mark.xdist_group(m)) for m in ALL_MODELS]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def model_path(model_dir: Path, name: str) -> Path:
    """The ONNX file for `name`, written once per test session."""
    path = model_dir / f"{name}.onnx"
    if not path.exists():
        if name in REAL_MODELS:
            model = with_random_weights(LIGHT / f"light_{name}.onnx", seed=0)
        else:
            model = getattr(onnx_models, name)()
        onnx.save(model, str(path))
    return path


def imported_ir(model_dir: Path, name: str) -> Path:
    """`tk-import` of the model, run once per test session (the roll and codegen tests start
    from it; the import itself is checked through a real pipe by test_import_run_check)."""
    path = model_dir / f"{name}.tk.yaml"
    if not path.exists():
        model = model_path(model_dir, name)
        run_ok(f"tk-import {model.name} -o {path.name}", model_dir)
    return path


def rolled_ir(model_dir: Path, name: str, hw: str) -> Path:
    """`tk-roll --hw HW` of the imported model, run once per test session (the tiled check
    and the compile of the same model start from it: tk-roll writes the same bytes each
    time)."""
    path = model_dir / f"{name}.{hw}.yaml"
    if not path.exists():
        ir = imported_ir(model_dir, name)
        run_ok(f"tk-roll --hw {hw} {ir.name} -o {path.name}", model_dir)
    return path


def run_pipe(pipe: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{ROOT / 'bin'}{os.pathsep}{os.environ['PATH']}",
               NO_COLOR="1")
    return subprocess.run(["bash", "-o", "pipefail", "-c", pipe], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def run_ok(pipe: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run `pipe` and assert it exited 0 (the pipe and its stderr in the message)."""
    proc = run_pipe(pipe, cwd)
    assert proc.returncode == 0, f"$ {pipe}\n{proc.stderr}"
    return proc


def assert_checked(proc: subprocess.CompletedProcess, pipe: str) -> None:
    assert proc.returncode == 0, f"$ {pipe}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "check: pass" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr


#: The three CNNs whose fully connected layers hold 240-575 MB of weights run the pipe below
#: only with TILEKIT_ALL_ARCHS=1: their import is checked through the tiled pipe against
#: onnxruntime (imported once), and the whole-op executor on the other eleven; moving their
#: weights through two more processes was 35 s of `make test`.
HEAVY = {"vgg19", "bvlc_alexnet", "zfnet512"}
#: The real CNNs of the default suite (TILEKIT_FULL=1: all nine): ResNet-50 (a deep residual
#: network: convolutions with folded batch norm, pooling, a GEMM), SqueezeNet (concatenated
#: branches) and ShuffleNet (the channel shuffle's reshapes and transposes, grouped
#: convolutions); the others repeat their op kinds at other shapes.
DEFAULT_REAL = ("resnet50", "squeezenet", "shufflenet")


def params(models) -> list:
    """`models` as parameters in their own xdist groups."""
    return [pytest.param(m, marks=pytest.mark.xdist_group(m)) for m in models]


WHOLE_PARAMS = params(m for m in subset(ALL_MODELS, DEFAULT_REAL + tuple(BUILT_MODELS))
                      if m not in HEAVY or on("TILEKIT_ALL_ARCHS"))
#: Tile by tile: the built models (the real CNNs with TILEKIT_FULL=1: SqueezeNet's and
#: ShuffleNet's tiles run op by op against whole ops in tests/unit/test_roll_models.py, a
#: stricter check of the same tiles; ShuffleNet's pipe here was a minute of `make test`).
TILED_PARAMS = params(subset(ALL_MODELS, BUILT_MODELS))


@pytest.mark.parametrize("name", WHOLE_PARAMS)
def test_import_run_check(name, model_dir):
    """Issue 3: `tk-import M.onnx | tk-run --device cpu --check`."""
    model = model_path(model_dir, name)
    piped = f"{name}.piped.yaml"
    pipe = f"tk-import {model.name} | tee {piped} | tk-run --device cpu --seed 0 --check"
    assert_checked(run_pipe(pipe, model_dir), pipe)
    # The IR that passed is the one the later tests of this model start from (no second
    # import of the large CNNs: vgg19's weights are 575 MB).
    if not (model_dir / f"{name}.tk.yaml").exists():
        (model_dir / piped).rename(model_dir / f"{name}.tk.yaml")


@pytest.mark.parametrize("name", TILED_PARAMS)
def test_import_roll_run_tiled_check(name, model_dir):
    """Issue 4: rolled for the H100 and executed tile by tile as rolled, still checked."""
    rolled = rolled_ir(model_dir, name, "h100")
    pipe = f"tk-run {rolled.name} --device cpu --mode tiled --seed 0 --check"
    assert_checked(run_pipe(pipe, model_dir), pipe)


#: Compiled CPU code on the real CNNs (TILEKIT_FULL=1: all nine; by default SqueezeNet, its
#: convolutions, pooling and concatenated branches; grouped convolutions are the corpus's
#: RegNet's, transposes its Llama's, compiled in tests/corpus; the built models go through
#: every stage to compiled code in test_stages_together.py).
CPU_PARAMS = params(subset(REAL_MODELS, ("squeezenet",)))


@pytest.mark.parametrize("name", CPU_PARAMS)
def test_import_codegen_cpu_run_check(name, model_dir):
    """The C++ target on every kernel of the model, run compiled and checked."""
    ir = imported_ir(model_dir, name)
    pipe = f"tk-codegen --target cpu {ir.name} | tk-run --seed 0 --check"
    proc = run_pipe(pipe, model_dir)
    assert_checked(proc, pipe)
    assert "check: cpu (compiled mode" in proc.stdout, proc.stdout


def have_nvcc() -> bool:
    import shutil
    return shutil.which("nvcc") is not None


#: With TILEKIT_ALL_ARCHS=1 every model compiles for sm_90 (rolled for the H100) and sm_80
#: (the A100). By default: sm_90 for SqueezeNet (a real CNN's convolutions and pooling) and
#: the built models, sm_80 for the BERT layer (a cold nvcc cache makes each real CNN 10-50 s
#: on two cores: ResNet-50's 50 s repeated SqueezeNet's op kinds at other shapes).
ALL_ARCHS = on("TILEKIT_ALL_ARCHS")
SM90_MODELS = set(ALL_MODELS) if ALL_ARCHS else {"squeezenet", *BUILT_MODELS}
SM80_MODELS = set(ALL_MODELS) if ALL_ARCHS else {"bert_encoder_layer"}
COMPILE_PARAMS = [pytest.param(m, hw, arch, marks=pytest.mark.xdist_group(m))
                  for m in ALL_MODELS for hw, arch in (("h100", "sm_90"), ("a100", "sm_80"))
                  if m in (SM90_MODELS if arch == "sm_90" else SM80_MODELS)]


@pytest.mark.skipif(not have_nvcc(), reason="nvcc is not installed")
@pytest.mark.parametrize("name, hw, arch", COMPILE_PARAMS)
def test_import_roll_codegen_compiles(name, hw, arch, model_dir):
    """Issue 5: every kernel of every model compiles with nvcc, with no spills and within the
    profile's limits (--strict), and its ptxas resources are recorded in the IR."""
    out = f"{name}.{hw}.cuda.yaml"
    pipe = f"tk-codegen --compile --strict {rolled_ir(model_dir, name, hw).name} -o {out}"
    run_ok(pipe, model_dir)
    import yaml
    codegen = yaml.safe_load((model_dir / out).read_text())["codegen"]
    assert codegen["arch"] == arch
    assert codegen["kernels"]
    for kernel in codegen["kernels"]:
        res = kernel["resources"]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, kernel["name"]
        assert 0 < res["registers"] <= 255, kernel["name"]
