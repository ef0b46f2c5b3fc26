"""The CUDA runtime on a GPU: every codegen fixture against the CPU reference executor.

Marked `gpu`: skipped (by tests/conftest.py) where CuPy or a CUDA device is missing. These are
the tests that turn "compiles and emulates correctly" into "runs correctly": run them on any
machine with a GPU (`pytest tests/gpu`), with compute-sanitizer when it is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT / "tests"))

from codegen_support import (DATA, FIXTURES, VARIANTS, big_tile_matmul, fixture,  # noqa: E402
                             random_values)

from tilekit.codegen import generate  # noqa: E402
from tilekit.runtime.cpu import run_module as run_cpu  # noqa: E402

pytestmark = pytest.mark.gpu


def close(got, want, name):
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_on_the_gpu(name, variant):
    from tilekit.runtime import cuda
    module = generate(VARIANTS[variant](fixture(name))).module
    inputs, weights = random_values(module)
    got = cuda.run_module(module, inputs, weights)
    want = run_cpu(module, inputs, weights)
    for out in module.outputs:
        close(got[out], want[out], out)
    # A second run reuses the uploaded weights and the buffers.
    again = cuda.run_module(module, inputs, weights)
    for out in module.outputs:
        np.testing.assert_array_equal(again[out], got[out])


def test_module_without_codegen_is_generated_on_the_fly():
    from tilekit.runtime import cuda
    module = fixture("softmax")
    inputs, weights = random_values(module)
    got = cuda.run_module(module, inputs, weights)
    close(got["y"], run_cpu(module, inputs, weights)["y"], "y")


def test_dynamic_shared_memory_above_48kb():
    """A staged matmul whose buffers need 64 KB: dynamic shared memory with the opt-in."""
    from tilekit.hw import load_profile
    from tilekit.runtime import cuda
    module = big_tile_matmul(model="big_tile")
    result = generate(module, load_profile("h100"))
    assert result.kernels[0].smem_bytes == 65536
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal((256, 256)).astype(np.float32) for n in ("a", "b")}
    got = cuda.run_module(result.module, inputs, {})
    close(got["c"], inputs["a"] @ inputs["b"], "c")


def test_mixed_float32_float16_and_rank0_input():
    """One unit with a float32 then a float16 kernel (TK_USE_HALF before the header), and a
    rank-0 input uploaded with its own shape."""
    from test_codegen_runtime_cuda import mixed_inputs, mixed_module

    from tilekit.runtime import cuda
    module = generate(mixed_module()).module
    inputs = mixed_inputs()
    got = cuda.run_module(module, inputs, {})
    want = run_cpu(module, inputs, {})
    for out in module.outputs:
        close(got[out].astype(np.float32), want[out].astype(np.float32), out)


def test_weights_reuploaded_for_new_arrays():
    from tilekit.runtime import cuda
    module = generate(fixture("gather")).module
    inputs, weights = random_values(module)
    cuda.run_module(module, inputs, weights)
    doubled = {name: array * 2 if array.dtype.kind == "f" else array
               for name, array in weights.items()}
    got = cuda.run_module(module, inputs, doubled)
    want = run_cpu(module, inputs, doubled)
    for out in module.outputs:
        close(got[out], want[out], out)


def test_kernel_timing_with_events():
    from tilekit.runtime import cuda
    module = generate(fixture("matmul_aligned")).module
    inputs, weights = random_values(module)
    timing = cuda.time_kernels(module, inputs, weights, runs=5, warmup=2, per_kernel=True)
    assert len(timing.seconds) == 5 and timing.min > 0
    assert set(timing.per_kernel) == {"tk_k_mm"}
    assert "CUDA events" in timing.line(cuda.device_description())


def _tk_run_conv(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """`tk-run --device cuda` on the generated conv + bias + ReLU fixture."""
    ir = tmp_path / "m.yaml"
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-codegen"), str(DATA / "conv_bias_relu.yaml"),
                    "-o", str(ir)], check=True)
    shutil.copy(DATA / "conv_bias_relu.weights.npz", tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "bin" / "tk-run"), str(ir), "--device", "cuda",
                           "--seed", "0", *flags], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_tk_run_device_cuda_check(tmp_path):
    assert "check: pass" in _tk_run_conv(tmp_path, "--check", "--bench", "3").stdout


def test_tk_run_device_cuda_report(tmp_path):
    """`--report` on the GPU: every kernel timed by events, shares of the kernels' total."""
    import json
    proc = _tk_run_conv(tmp_path, "--report", "--report-format", "json")
    report = json.loads(proc.stdout.strip().splitlines()[-1])["report"]
    assert report["slowest"] and all(row["ms"] > 0 for row in report["slowest"])
    assert sum(row["share"] for row in report["slowest"]) <= 1 + 1e-6
    assert report["ms_in_kernels"] > 0


def test_tk_run_times_runs_replayed_as_a_cuda_graph(tmp_path):
    """`--bench --graph`: the run captured once and replayed per timed run; the check of the
    run before still passes and the timing names its method."""
    import json
    from tilekit.runtime.cuda import GRAPH_METHOD
    proc = _tk_run_conv(tmp_path, "--check", "--bench", "5", "--graph", "--report-format",
                        "json")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["check"]["passed"]
    assert doc["bench"]["method"] == GRAPH_METHOD and doc["bench"]["min_ms"] > 0


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="no compute-sanitizer")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer(tool, tmp_path):
    """No out-of-bounds access, shared-memory race or barrier misuse in the fused and staged
    fixtures."""
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'tests' / 'unit')!r})\n"
        "from codegen_support import fixture, random_values\n"
        "from tilekit.codegen import generate\n"
        "from tilekit.runtime import cuda\n"
        "for name in ('matmul_bias_relu', 'conv_bias_relu', 'softmax', 'layernorm', 'conv_chain'):\n"
        "    m = generate(fixture(name)).module\n"
        "    x, w = random_values(m)\n"
        "    cuda.run_module(m, x, w)\n")
    proc = subprocess.run(["compute-sanitizer", f"--tool={tool}", "--error-exitcode=9",
                           sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("m, n, k, dtype, b_kn", [
    (100, 72, 200, "float16", True), (100, 72, 200, "float16", False),
    (70, 90, 37, "float16", True), (100, 72, 200, "bfloat16", True),
    (100, 72, 200, "float32", True), (1024, 1024, 1024, "float16", True)])
def test_tensor_core_gemm_on_the_gpu(m, n, k, dtype, b_kn):
    """mma.sync, ldmatrix and cp.async on the device give what the CPU emulation gives."""
    from test_codegen_mma import H100, TOLERANCE, gemm, rel_err, values

    from tilekit.runtime import cuda
    result = generate(gemm(m, n, k, dtype, b_kn), H100)
    assert result.kernels[0].shape == "mma"
    inputs = values(result.module)
    got = cuda.run_module(result.module, inputs, {})["c"]
    a, b = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    assert rel_err(got, a @ (b if b_kn else b.T)) < TOLERANCE[dtype]


def test_tensor_core_convolution_on_the_gpu():
    from test_codegen_mma import H100
    from tilekit.ir import Module, Op, Tensor
    from tilekit.roll.schedule import roll_module

    from tilekit.runtime import cuda
    module = Module(model="conv", tensors={
        "x": Tensor((2, 64, 28, 28), "float16", "input"),
        "w": Tensor((128, 64, 3, 3), "float16", "input"),
        "y": Tensor((2, 128, 28, 28), "float32", "output")},
        ops=(Op("conv", "y[n,f,h,w] += x[n,c,h+kh-1,w+kw-1] * w[f,c,kh,kw]", pad="0"),),
        inputs=("x", "w"), outputs=("y",), stages=({"name": "import"},))
    result = generate(roll_module(module, H100), H100)
    assert result.kernels[0].shape == "mma"
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((2, 64, 28, 28)).astype(np.float16),
              "w": rng.standard_normal((128, 64, 3, 3)).astype(np.float16)}
    got = cuda.run_module(result.module, inputs, {})["y"]
    xp = np.pad(inputs["x"].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 128, 28, 28))
    for kh in range(3):
        for kw in range(3):
            want += np.einsum("nchw,fc->nfhw", xp[:, :, kh:kh + 28, kw:kw + 28],
                              inputs["w"][:, :, kh, kw].astype(np.float64))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("hw", [None, "h100"])
def test_the_sizes_of_a_symbolic_module_on_the_gpu(hw, tmp_path, monkeypatch):
    """A symbolic module (a decode step over a key/value cache of any length, default
    kernels or rolled once for the range) run on the device at several sizes through the
    builds they share (sizes in constant memory), each checked against onnxruntime: one
    command, one template's cubin for the decode steps."""
    import onnx

    from clirun import run_in
    from models.onnx_models import kv_cache_step
    from tilekit.cli import tk_import, tk_roll, tk_run

    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path / "cache"))
    onnx.save(kv_cache_step(), str(tmp_path / "kv.onnx"))
    assert run_in(tk_import.main, ["kv.onnx", "-o", "kv.yaml"], tmp_path).exit_code == 0
    name = "kv.yaml"
    if hw:
        assert run_in(tk_roll.main, ["kv.yaml", "--hw", hw, "-o", "kv.rolled.yaml"],
                      tmp_path).exit_code == 0
        name = "kv.rolled.yaml"
    result = run_in(tk_run.main, [name, "--device", "cuda", "--dim", "seq=1,6",
                                  "--dim", "past=5,40,77", "--check", "-q"], tmp_path)
    assert result.exit_code == 0, result.output
    assert result.output.count("check: pass") == 6, result.output
    cubins = {p.parent for p in (tmp_path / "cache" / "nvcc").glob("*/unit.cubin")}
    assert len(cubins) <= 3      # the templates (decode, prefill; a widened one), not a
                                 # build per size (2 default or rolled, in the emulation)
