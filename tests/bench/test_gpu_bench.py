"""GPU benchmark: tilekit's generated kernels against PyTorch in the same run.

    make bench                      # or: pytest tests/bench -o addopts="" -s

Op cases (each built as tile IR, rolled for the device's profile, generated, compiled, checked
against PyTorch's result, then timed with CUDA events, median of RUNS after WARMUP), against
cuBLAS / cuDNN through PyTorch:

- matmul: 4096^3, 1024^3, skinny (16 x 4096 x 4096, 4096 x 16 x 4096), a K-heavy 256 x 256 x 16384
  in fp32; 4096^3 in TF32; 4096^3, 1024^3 and 512 x 4096 x 1024 in fp16, 8192^3 in fp16 and
  bf16, 4096^3 in bf16 (the GPU-kernel aims: >= 0.9x cuBLAS at 4096^3 and 8192^3);
- ResNet-50 convolution layers at batch 1 (conv1 7x7/2, the 3x3 of each stage, two 1x1);
- softmax and layer normalisation rows (fused groups of primitive ops).

Model rows (`TILEKIT_BENCH_MODELS`, `name` or `name@batch`, comma-separated; `all` adds the
other bundled models at batch 1): ResNet-50 from onnx's light test data with seeded random
weights, a BERT-base encoder layer, a MobileNetV2 block and an LSTM from tests/models, each at
batch 1 and 64, and SqueezeNet at batch 1. tilekit runs `tk-import | tk-roll | codegen`;
PyTorch runs the same ONNX graph through tests/bench/torch_onnx.py, eager (`torch_ms`) and
under torch.compile (`torch_compile_ms`, timed after the compile, whose seconds are
`compile_s`; its mode `TILEKIT_BENCH_COMPILE_MODE`, default `default`), and eager captured
once as a CUDA graph and replayed (`torch_graph_ms`, Rammer's baseline); tilekit's rolled
kernels (`tilekit_ms`), the same rolled then welded (`tilekit_welded_ms`), and as a tk-ram
program (`tilekit_program_ms`: `tk-roll --top-k 4 | tk-weld | tk-ram`, one persistent launch
per segment; `ratio_program_graph` against the CUDA graph), both checked against the rolled
outputs (relative L2 at most 1e-3). A row also holds tilekit's relative L2 error against eager
(`check`: pass at 1e-3) and, instead of aborting the bench, any stage's error
(`tilekit_error`, `program_error`, `eager_error`, `compile_error`); the test fails at the
end, after writing everything, on a tilekit or eager error or a failed check (not on a
torch.compile error). `TILEKIT_BENCH_CASES=none` skips the op cases: the model rows alone,
written to `<device>-models.json` (`-models-<mode>` for another compile mode), for a call of
their own where a GPU is lent for minutes.

All CPU work (every model's import, roll and codegen, every nvcc compile) runs first, in
parallel, and nothing runs beside the timings. No torch.compile starts once
`TILEKIT_BENCH_BUDGET_S` (180) seconds have passed since the bench began: the compiles are most
of the time, and the cap keeps the whole bench to about four minutes on an H100.

Reported per case: tilekit and PyTorch medians, their ratio (tilekit / PyTorch: below 1 is
faster; `ratio_compile` against torch.compile), achieved GFLOP/s and fraction of the profile's
fp32 SIMT peak, achieved DRAM bandwidth (compulsory bytes: inputs and weights read once,
outputs written once) and fraction of the profile's DRAM bandwidth. TF32 is disabled in PyTorch
so that both sides compute in fp32 on CUDA cores. Results go to
tests/bench/results/<device>.json with the command and the date, rewritten after every row.

Skipped without CuPy, PyTorch with CUDA, or a GPU; PyTorch is imported only there, so this file
is collected without it. `test_cases_build` and `test_batch64_models_import` run everywhere:
they build every op case (and compile it, where nvcc is) and the batch-64 models (no GPU), so
the benchmark cannot rot unnoticed.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest

from tilekit.codegen import generate
from tilekit.expr.ops import numpy_dtype
from tilekit.ir.model import Kernel, Module, Op, Tensor
from tilekit.ir.payloads import CodegenSection

ROOT = Path(__file__).resolve().parents[2]
# tests/models (the model builders) and this folder (torch_onnx, imported where torch is used).
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).resolve().parent)]
RESULTS = Path(__file__).resolve().parent / "results"
RUNS = int(os.environ.get("TILEKIT_BENCH_RUNS", "50"))
WARMUP = 5


@dataclass(frozen=True)
class Case:
    name: str
    kind: str                        # matmul, conv, softmax, layernorm, model
    module: Module
    flops: float
    bytes: float
    torch_fn: Callable | None        # (torch tensors by input name) -> output tensor
    precision: str = "fp32"          # tk-roll --precision (tf32: both sides on TF32)


def _module(name: str, tensors: dict, ops: list[Op], kernels=()) -> Module:
    return Module(model=name, tensors=tensors, ops=tuple(ops),
                  inputs=tuple(n for n, t in tensors.items() if t.role == "input"),
                  outputs=tuple(n for n, t in tensors.items() if t.role == "output"),
                  kernels=tuple(kernels)).with_stage("import")


def matmul(m: int, n: int, k: int, dtype: str = "float32", precision: str = "fp32") -> Case:
    label = {"float32": "", "float16": "_fp16", "bfloat16": "_bf16"}[dtype] + (
        "_tf32" if precision == "tf32" else "")
    mod = _module(f"matmul_{m}x{n}x{k}{label}",
                  {"a": Tensor((m, k), dtype, "input"), "b": Tensor((k, n), dtype, "input"),
                   "c": Tensor((m, n), dtype, "output")},
                  [Op("mm", "c[i,j] += a[i,k] * b[k,j]")])
    item = 2 if dtype != "float32" else 4
    return Case(mod.model, "matmul", mod, 2.0 * m * n * k, item * (m * k + k * n + m * n),
                lambda t: t["a"] @ t["b"], precision)


def conv(name: str, c: int, hw: int, f: int, ksize: int, stride: int, pad: int) -> Case:
    out = (hw + 2 * pad - ksize) // stride + 1
    expr = (f"y[n,f,h,w] += x[n,c,h*{stride}+kh-{pad},w*{stride}+kw-{pad}] * wt[f,c,kh,kw]"
            .replace("+kh-0", "+kh").replace("+kw-0", "+kw"))
    mod = _module(f"resnet50_{name}",
                  {"x": Tensor((1, c, hw, hw), "float32", "input"),
                   "wt": Tensor((f, c, ksize, ksize), "float32", "input"),
                   "y": Tensor((1, f, out, out), "float32", "output")},
                  [Op("conv", expr, pad="0" if pad else None)])

    def torch_fn(t, stride=stride, pad=pad):
        import torch.nn.functional as F
        return F.conv2d(t["x"], t["wt"], stride=stride, padding=pad)
    return Case(mod.model, "conv", mod, 2.0 * f * out * out * c * ksize * ksize,
                4.0 * (c * hw * hw + f * c * ksize * ksize + f * out * out), torch_fn)


def softmax(rows: int, cols: int) -> Case:
    t = {"x": Tensor((rows, cols), "float32", "input"), "m": Tensor((rows,)),
         "e": Tensor((rows, cols)), "s": Tensor((rows,)),
         "y": Tensor((rows, cols), "float32", "output")}
    ops = [Op("max", "m[i] max= x[i,j]"), Op("exp", "e[i,j] = exp(x[i,j] - m[i])"),
           Op("sum", "s[i] += e[i,j]"), Op("div", "y[i,j] = e[i,j] / s[i]")]
    mod = _module(f"softmax_{rows}x{cols}", t, ops,
                  [Kernel("softmax", tuple(o.name for o in ops))])
    return Case(mod.model, "softmax", mod, 5.0 * rows * cols, 8.0 * rows * cols,
                lambda t: t["x"].softmax(-1))


def layernorm(rows: int, cols: int) -> Case:
    t = {"x": Tensor((rows, cols), "float32", "input"), "g": Tensor((cols,), "float32", "input"),
         "b": Tensor((cols,), "float32", "input"), "s1": Tensor((rows,)), "mu": Tensor((rows,)),
         "d": Tensor((rows, cols)), "s2": Tensor((rows,)), "r": Tensor((rows,)),
         "y": Tensor((rows, cols), "float32", "output")}
    ops = [Op("sum1", "s1[i] += x[i,j]"), Op("mean", f"mu[i] = s1[i] / {float(cols)}"),
           Op("centre", "d[i,j] = x[i,j] - mu[i]"), Op("sum2", "s2[i] += d[i,j] * d[i,j]"),
           Op("rstd", f"r[i] = rsqrt(s2[i] / {float(cols)} + 1e-05)"),
           Op("norm", "y[i,j] = d[i,j] * r[i] * g[j] + b[j]")]
    mod = _module(f"layernorm_{rows}x{cols}", t, ops,
                  [Kernel("layernorm", tuple(o.name for o in ops))])

    def torch_fn(t, cols=cols):
        import torch.nn.functional as F
        return F.layer_norm(t["x"], (cols,), t["g"], t["b"], eps=1e-5)
    return Case(mod.model, "layernorm", mod, 8.0 * rows * cols, 8.0 * rows * cols, torch_fn)


def op_cases() -> list[Case]:
    return [
        matmul(4096, 4096, 4096), matmul(4096, 4096, 4096, "float16"),
        matmul(8192, 8192, 8192, "float16"), matmul(4096, 4096, 4096, "bfloat16"),
        matmul(8192, 8192, 8192, "bfloat16"),
        matmul(4096, 4096, 4096, precision="tf32"), matmul(512, 4096, 1024, "float16"),
        matmul(1024, 1024, 1024, "float16"),
        matmul(1024, 1024, 1024), matmul(16, 4096, 4096),
        matmul(4096, 16, 4096), matmul(256, 256, 16384),
        conv("conv1", 3, 224, 64, 7, 2, 3), conv("res2_3x3", 64, 56, 64, 3, 1, 1),
        conv("res3_3x3", 128, 28, 128, 3, 1, 1), conv("res4_3x3", 256, 14, 256, 3, 1, 1),
        conv("res5_3x3", 512, 7, 512, 3, 1, 1), conv("res2_1x1", 256, 56, 64, 1, 1, 0),
        conv("res4_1x1_expand", 256, 14, 1024, 1, 1, 0),
        softmax(4096, 4096), softmax(32768, 512), layernorm(4096, 4096), layernorm(16384, 1024),
    ]


def rolled(module: Module, profile, precision: str = "fp32", top_k: int = 1) -> Module:
    """tk-roll's tiles for `profile` at `precision` (`top_k` kept per op)."""
    from tilekit.roll.schedule import roll_module
    return roll_module(module, profile, top_k, precision=precision)


def profile_for(arch: str | None):
    from tilekit.hw import list_profiles, load_profile
    if arch is None:
        return load_profile("h100")
    for p in list_profiles():
        if p.arch == arch:
            return p
    return load_profile("h100")


# -- whole models --------------------------------------------------------------------------

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ["resnet50", "inception_v1", "inception_v2", "densenet121", "shufflenet",
                "squeezenet", "vgg19", "bvlc_alexnet", "zfnet512"]
#: The built models at the benchmark's sizes (the builders' defaults are test-sized): a BERT-base
#: encoder layer over 128 tokens, a MobileNetV2 block at 56x56, one LSTM layer of 256 over 64
#: steps. The CPU bench (test_cpu_bench.py) uses the same BERT and MobileNet sizes.
BUILT_SIZES = {"bert_encoder_layer": {"seq": 128, "hidden": 768, "heads": 12, "ffn": 3072},
               "mobilenet_block": {"channels": 32, "expand": 6, "size": 56, "classes": 1000},
               "lstm_model": {"seq": 64, "inputs": 256, "hidden": 256}}
#: Where the batch is, for the models that are not batch-first ([seq, batch, features]).
BATCH_AXIS = {"lstm_model": 1}
#: Rows in this order: a torch.compile that would start after the time budget is skipped, so
#: the cheap compiles come last.
DEFAULT_MODELS = ("resnet50,resnet50@64,bert_encoder_layer,bert_encoder_layer@64,"
                  "mobilenet_block,mobilenet_block@64,lstm_model,lstm_model@64,squeezenet")
MODELS = os.environ.get("TILEKIT_BENCH_MODELS", DEFAULT_MODELS)
#: Seconds from the start of the bench after which no torch.compile starts (its row records
#: why); the compiles are most of a model row's time.
BUDGET_S = float(os.environ.get("TILEKIT_BENCH_BUDGET_S", "180"))
#: torch.compile's mode for the model rows (`TILEKIT_BENCH_COMPILE_MODE`: default,
#: reduce-overhead, max-autotune; max-autotune's compiles take minutes a model).
COMPILE_MODE = os.environ.get("TILEKIT_BENCH_COMPILE_MODE", "default")
#: Whether the op cases run (`TILEKIT_BENCH_CASES`: all, the default, or none). With none the
#: bench runs only the model rows, for a call of its own on a GPU lent for minutes, and
#: writes them beside the op cases' file (`<device>-models[-<mode>].json`), not over it.
CASES = os.environ.get("TILEKIT_BENCH_CASES", "all")
#: tilekit against PyTorch eager on a whole model, relative L2 over each output.
MODEL_TOLERANCE = 1e-3
#: Tiles kept per op for the tk-ram program rows (tk-ram packs from the alternatives), as
#: tests/gpu/gpu_check.py's program variant.
PROGRAM_TOP_K = 4


@dataclass(frozen=True)
class ModelSpec:
    name: str
    batch: int = 1

    @property
    def label(self) -> str:
        return self.name if self.batch == 1 else f"{self.name}@{self.batch}"

    def onnx_model(self) -> onnx.ModelProto:
        """The bundled model with seeded random weights, or the built one at bench size."""
        from models import onnx_models
        from models.onnx_check import with_random_weights
        if self.name in LIGHT_MODELS:
            model = with_random_weights(LIGHT / f"light_{self.name}.onnx", seed=0)
            return model if self.batch == 1 else onnx_models.with_batch(model, self.batch)
        return getattr(onnx_models, self.name)(batch=self.batch, **BUILT_SIZES[self.name])


def model_specs(text: str) -> list[ModelSpec]:
    """`resnet50,resnet50@64,...` (name or name@batch); `all` is the default list plus the
    other bundled models at batch 1."""
    words = [w for w in text.split(",") if w]
    if "all" in words:
        extra = [m for m in LIGHT_MODELS if m not in DEFAULT_MODELS.split(",")]
        words = [w for w in words if w != "all"] + DEFAULT_MODELS.split(",") + extra
    specs = []
    for word in dict.fromkeys(words):
        name, _, batch = word.partition("@")
        if name not in LIGHT_MODELS and name not in BUILT_SIZES:
            raise ValueError(f"TILEKIT_BENCH_MODELS: unknown model {name!r}; known: "
                             f"{', '.join(LIGHT_MODELS + list(BUILT_SIZES))}, or 'all'")
        specs.append(ModelSpec(name, int(batch or 1)))
    return specs


@dataclass
class ModelBuild:
    """A model made ready for the bench: the ONNX graph and its inputs (by ONNX name) for
    PyTorch; tilekit's import, and that rolled and generated for the device, with weights."""

    spec: ModelSpec
    model: onnx.ModelProto | None
    feeds: dict[str, np.ndarray]
    imported: Module | None = None
    generated: Module | None = None
    welded: Module | None = None
    program: Module | None = None
    weights: dict | None = None
    error: str | None = None
    program_error: str | None = None

    def tilekit_inputs(self) -> dict[str, np.ndarray]:
        renamed = (self.imported.source or {}).get("inputs") or {}
        return {ir: self.feeds[renamed.get(ir, ir)] for ir in self.imported.inputs}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:800]


def build_model(spec: ModelSpec, profile, folder: Path, arch: str | None) -> ModelBuild:
    """CPU work only: the ONNX model, `tk-import`, tk-roll for `profile` and codegen, and with
    `arch` the nvcc compile that the CUDA runtime then finds in its cache. A failure is recorded
    in `error`; when only tilekit's part failed, the PyTorch side can still run."""
    from models.onnx_check import random_inputs
    from tilekit.ir.codec import read_module
    from tilekit.runtime.io import load_weights
    try:
        model = spec.onnx_model()
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        return ModelBuild(spec, None, {}, error=_error(exc))
    build = ModelBuild(spec, model, random_inputs(model, seed=0))
    onnx_path, ir_path = folder / f"{spec.name}_b{spec.batch}.onnx", \
        folder / f"{spec.name}_b{spec.batch}.yaml"
    try:
        onnx.save(model, str(onnx_path))
        proc = subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(onnx_path),
                               "-o", str(ir_path)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"tk-import exited {proc.returncode}: {proc.stderr[-600:]}")
        build.imported = read_module(str(ir_path))
        build.weights = load_weights(build.imported, folder)
        from tilekit.weld import weld_module
        roll = rolled(build.imported, profile)
        build.generated = generate(roll, profile).module
        build.welded = generate(weld_module(roll, profile), profile).module
        try:  # the tk-ram program: `tk-roll --top-k 4 | tk-weld | tk-ram | tk-codegen`
            from tilekit import pipeline
            planned = pipeline.run(rolled(build.imported, profile, top_k=PROGRAM_TOP_K),
                                   ["weld", "ram"], pipeline.Context(profile))
            build.program = generate(planned, profile).module
        except Exception as exc:  # noqa: BLE001 - recorded in the row
            build.program_error = _error(exc)
        if arch is not None:
            from tilekit.codegen.nvcc import compile_unit, find_nvcc
            from tilekit.runtime.cuda import build_arch, unit_source
            if find_nvcc():
                for module in (build.generated, build.welded, build.program):
                    if module is None:
                        continue
                    section = CodegenSection.read(module.codegen)
                    compile_unit(unit_source(section.kernels), build_arch(section, arch))
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        build.error = _error(exc)
    return build


def _compile_case(case: Case, profile, arch: str) -> None:
    """An op case's kernels compiled into nvcc's cache (a failure shows when the case runs)."""
    from tilekit.codegen.nvcc import compile_unit, find_nvcc
    from tilekit.runtime.cuda import build_arch, unit_source
    try:
        if find_nvcc():
            generated = generate(rolled(case.module, profile, case.precision), profile).module
            section = CodegenSection.read(generated.codegen)
            compile_unit(unit_source(section.kernels), build_arch(section, arch))
    except Exception:  # noqa: BLE001 - _run_case compiles again and reports it
        pass


def _compile_cases(cases: list[Case], profile, arch: str) -> None:
    """The op cases' kernels compiled before any is timed (nvcc is a subprocess, so the
    threads overlap)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 2)) as pool:
        list(pool.map(lambda case: _compile_case(case, profile, arch), cases))


def _build_models(specs: list[ModelSpec], profile, arch: str | None,
                  folder: Path) -> list[ModelBuild]:
    """Every model row built before any is timed (tk-import and nvcc are subprocesses, so
    the threads overlap). The bench does this after the op cases have run and been written:
    a run cut short while building the rows (nvcc for the batch-64 models, unless
    `test_models_build` filled the cache) still leaves the op cases' figures."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda spec: build_model(spec, profile, folder, arch), specs))


# -- no GPU needed -------------------------------------------------------------------------

def test_cases_build():
    """Every op case rolls, generates and compiles for the H100 (sm_90, or sm_90a where the
    kernels use wgmma; no GPU involved)."""
    from tilekit.codegen import compile_module
    from tilekit.codegen.nvcc import find_nvcc
    profile = profile_for("sm_90")
    for case in op_cases():
        result = generate(rolled(case.module, profile, case.precision), profile)
        assert result.kernels, case.name
        if find_nvcc():
            report = compile_module(result, None, profile)   # codegen's arch
            assert not report.problems, (case.name, report.problems)


def test_models_build(tmp_path):
    """Every model row of `TILEKIT_BENCH_MODELS` builds (rolled, welded, the tk-ram program)
    and compiles for the H100 without a GPU. With TILEKIT_CACHE set on a CPU machine this
    fills the cache that the bench reuses on a short lease: the rows' nvcc work (the batch-64
    models above all) otherwise runs before the bench times anything (an H100 run on
    2026-11-27 spent its 125 s there and wrote no row)."""
    from tilekit.codegen.nvcc import find_nvcc
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    specs = model_specs(MODELS)
    builds = _build_models(specs, profile_for("sm_90"), "sm_90", tmp_path)
    assert [b.spec for b in builds] == specs
    for build in builds:
        assert build.error is None, (build.spec.label, build.error)
        assert build.program_error is None, (build.spec.label, build.program_error)


@pytest.mark.parametrize("name", ["resnet50", "bert_encoder_layer", "mobilenet_block",
                                  "lstm_model"])
def test_batch64_models_import(name, tmp_path):
    """The bench's batch-64 models go through tk-import with batch 64 in the IR, and roll and
    generate for the H100 (everything but nvcc and the GPU)."""
    build = build_model(ModelSpec(name, 64), profile_for("sm_90"), tmp_path, arch=None)
    assert build.error is None, build.error
    module, axis = build.imported, BATCH_AXIS.get(name, 0)
    assert [module.tensors[n].shape[axis] for n in module.inputs] == [64]
    assert all(module.tensors[n].shape[axis] == 64 for n in module.outputs)
    assert build.generated.codegen["kernels"]
    assert build.program.program is not None and build.program.codegen["kernels"]
    assert build.tilekit_inputs()[module.inputs[0]].shape == module.tensors[module.inputs[0]].shape


def test_model_specs():
    assert model_specs("resnet50,lstm_model@64") == [ModelSpec("resnet50"),
                                                     ModelSpec("lstm_model", 64)]
    everything = model_specs("all")
    assert {s.name for s in everything if s.batch == 1} == set(LIGHT_MODELS) | set(BUILT_SIZES)
    assert {s.name for s in everything if s.batch == 64} == {
        "resnet50", "bert_encoder_layer", "mobilenet_block", "lstm_model"}
    with pytest.raises(ValueError, match="unknown model 'resnet5'.*known: resnet50"):
        model_specs("resnet5")


@pytest.mark.parametrize("cases, mode, name", [
    ("all", "default", "nvidia_h100_80gb_hbm3.json"),
    ("none", "default", "nvidia_h100_80gb_hbm3-models.json"),
    ("none", "max-autotune", "nvidia_h100_80gb_hbm3-models-max-autotune.json")])
def test_report_names(cases, mode, name, tmp_path, monkeypatch):
    """The model rows alone (TILEKIT_BENCH_CASES=none) never overwrite the op cases' file."""
    monkeypatch.setattr(sys.modules[__name__], "RESULTS", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "CASES", cases)
    monkeypatch.setattr(sys.modules[__name__], "COMPILE_MODE", mode)
    path = _write_report({"device": "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)", "rows": []})
    assert path == tmp_path / name and json.loads(path.read_text())["rows"] == []


# -- on the GPU ----------------------------------------------------------------------------

def _gpu_or_skip():
    try:
        import cupy
        import torch
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"needs CuPy and PyTorch ({type(exc).__name__})")
    if not torch.cuda.is_available() or cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device")
    return cupy, torch


def _torch_time(torch, fn, args, runs: int = RUNS) -> tuple[float, object]:
    out = fn(args)
    for _ in range(WARMUP):
        fn(args)
    return _event_median(torch, lambda: fn(args), runs), out


def _event_median(torch, call, runs: int) -> float:
    """Median seconds of `call` between two CUDA events, over `runs` runs (warm)."""
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return float(np.median(times))


def _graph_time(torch, fn, runs: int = RUNS) -> float:
    """Median seconds of one replay of `fn` captured as a CUDA graph (after warm-up runs on a
    side stream, as capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(WARMUP):
        graph.replay()
    return _event_median(torch, graph.replay, runs)


def _row(case: Case, tk_s: float, torch_s: float | None, profile, max_err: float | None) -> dict:
    row = {"case": case.name, "kind": case.kind, "tilekit_ms": tk_s * 1e3,
           "torch_ms": None if torch_s is None else torch_s * 1e3,
           "ratio": None if not torch_s else tk_s / torch_s,
           "gflops": case.flops / tk_s * 1e-9 if case.flops else None,
           "peak_fraction": case.flops / tk_s / profile.peak_flops("fp32") if case.flops else None,
           "dram_gbps": case.bytes / tk_s * 1e-9,
           "dram_fraction": case.bytes / tk_s / profile.dram_bandwidth,
           "max_rel_err": max_err}
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}


#: An op case's largest difference from PyTorch (over the output's largest magnitude), by
#: output dtype; float32 1e-3 (5e-3 on TF32).
CASE_TOLERANCE = {"float16": 5e-3, "bfloat16": 2e-2}


def _torch_tensor(torch, array: np.ndarray):
    """`array` on the GPU as a torch tensor (torch takes no ml_dtypes bfloat16 array: it goes
    through float32, exactly)."""
    if array.dtype == numpy_dtype("bfloat16"):
        return torch.from_numpy(array.astype(np.float32)).cuda().to(torch.bfloat16)
    return torch.from_numpy(array).cuda()


def _run_case(case: Case, module: Module, cupy, torch, profile) -> dict:
    from tilekit.runtime import cuda
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(
        numpy_dtype(module.tensors[n].dtype)) for n in module.inputs}   # bfloat16: ml_dtypes
    result = generate(rolled(module, profile, case.precision), profile)
    timing = cuda.time_kernels(result.module, inputs, {}, RUNS, WARMUP)
    got = cuda.run_module(result.module, inputs, {})[module.outputs[0]].astype(np.float32)
    torch_s, err = None, None
    if case.torch_fn is not None:
        args = {n: _torch_tensor(torch, v) for n, v in inputs.items()}
        tf32 = case.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32       # both sides on TF32, or neither
        try:
            torch_s, want = _torch_time(torch, case.torch_fn, args)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        want = want.float().cpu().numpy()
        err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
        out_dtype = module.tensors[module.outputs[0]].dtype
        # a bfloat16 output rounded differently on each side differs by a unit in its last
        # (eighth) bit, 2^-7 of the value
        limit = CASE_TOLERANCE.get(out_dtype, 5e-3 if tf32 else 1e-3)
        assert err < limit, f"{case.name}: tilekit differs from PyTorch by {err:.2e}"
    row = _row(case, timing.median, torch_s, profile, err)
    row["shape"] = result.kernels[0].shape
    if result.kernels[0].shape == "mma":
        key = {"float16": "fp16", "bfloat16": "bf16"}.get(module.tensors["a"].dtype, "tf32")
        row["peak_fraction"] = round(case.flops / timing.median /
                                     profile.peak_flops(key, tensor_core=True), 6)
    return row


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def _model_row(build: ModelBuild, torch, profile, deadline: float) -> dict:
    """tilekit, PyTorch eager and torch.compile on one model; each stage's failure is recorded
    in the row (`tilekit_error`, `eager_error`, `compile_error`) and the next stage runs."""
    import torch_onnx
    from tilekit.runtime import cuda
    spec = build.spec
    runs = RUNS if spec.batch == 1 else max(10, RUNS // 5)
    row: dict = {"case": f"model_{spec.label}", "kind": "model", "model": spec.name,
                 "batch": spec.batch, "runs": runs}
    got = None
    if build.error:
        row["tilekit_error"] = build.error
    else:
        try:
            module, inputs = build.generated, build.tilekit_inputs()
            timing = cuda.time_kernels(module, inputs, build.weights, runs, WARMUP)
            outputs = cuda.run_module(module, inputs, build.weights)
            got = [outputs[n] for n in module.outputs]
            nbytes = sum(module.tensors[n].size * 4 for n in module.inputs + module.outputs) + \
                sum(w.nbytes for w in build.weights.values())
            row.update(tilekit_ms=timing.median * 1e3, kernels=len(module.codegen["kernels"]),
                       dram_gbps=nbytes / timing.median * 1e-9,
                       dram_fraction=nbytes / timing.median / profile.dram_bandwidth)
            welded = cuda.time_kernels(build.welded, inputs, build.weights, runs, WARMUP)
            out_w = cuda.run_module(build.welded, inputs, build.weights)
            row.update(tilekit_welded_ms=welded.median * 1e3,
                       welded_kernels=len(build.welded.codegen["kernels"]),
                       welded_rel_l2_vs_rolled=max(_rel_l2(out_w[n], g) for n, g in
                                                   zip(module.outputs, got)))
        except Exception as exc:  # noqa: BLE001
            row["tilekit_error"] = _error(exc)
    if got is not None:
        try:  # the program apart: its failure keeps the rolled and welded figures
            if build.program is None:
                raise RuntimeError(build.program_error or "no program built")
            program = cuda.time_kernels(build.program, inputs, build.weights, runs, WARMUP)
            out_p = cuda.run_module(build.program, inputs, build.weights)
            row.update(tilekit_program_ms=program.median * 1e3,
                       program_rel_l2_vs_rolled=max(_rel_l2(out_p[n], g) for n, g in
                                                    zip(module.outputs, got)))
        except Exception as exc:  # noqa: BLE001
            row["program_error"] = _error(exc)
    net = want = None
    try:
        if build.model is None:
            raise RuntimeError("no ONNX model (see tilekit_error)")
        net = torch_onnx.TorchModel(build.model, "cuda")
        args = [torch.from_numpy(build.feeds[n]).cuda() for n in net.input_names]
        with torch.no_grad():
            eager_s, want = _torch_time(torch, lambda a: net(*a), args, runs)
        want = [w.float().cpu().numpy() for w in want]
        row["torch_ms"] = eager_s * 1e3
    except Exception as exc:  # noqa: BLE001
        row["eager_error"] = _error(exc)
    if want is not None:
        try:  # eager captured once and replayed as a CUDA graph: Rammer's baseline
            with torch.no_grad():
                graph_s = _graph_time(torch, lambda: net(*args), runs)
            row["torch_graph_ms"] = graph_s * 1e3
        except Exception as exc:  # noqa: BLE001
            row["graph_error"] = _error(exc)
    if got is not None and want is not None:
        shapes = [(g.shape, w.shape) for g, w in zip(got, want) if g.shape != w.shape]
        if shapes or len(got) != len(want):
            row["check"] = f"FAIL: outputs {[g.shape for g in got]} against eager's " \
                f"{[w.shape for w in want]}"
        else:
            row["rel_l2_vs_eager"] = max(_rel_l2(g, w) for g, w in zip(got, want))
            row["check"] = "pass" if row["rel_l2_vs_eager"] <= MODEL_TOLERANCE else "FAIL"
    if net is not None and want is not None:
        if time.monotonic() > deadline:
            row["compile_error"] = f"skipped: the time budget ({BUDGET_S:.0f} s) is spent"
        else:
            try:
                # One compiled graph per row, static shapes: the forward code is shared by
                # every TorchModel, so without a reset the rows would count as recompiles.
                torch._dynamo.reset()
                compiled = torch.compile(net, dynamic=False, mode=COMPILE_MODE)
                start = time.monotonic()
                with torch.no_grad():
                    compiled(*args)
                    torch.cuda.synchronize()
                    row["compile_s"] = time.monotonic() - start
                    compiled_s, out = _torch_time(torch, lambda a: compiled(*a), args, runs)
                row["torch_compile_ms"] = compiled_s * 1e3
                row["compile_rel_l2_vs_eager"] = max(
                    _rel_l2(o.float().cpu().numpy(), w) for o, w in zip(out, want))
            except Exception as exc:  # noqa: BLE001
                row["compile_error"] = _error(exc)
    for key, ours, theirs in (("ratio", "tilekit_ms", "torch_ms"),
                              ("ratio_compile", "tilekit_ms", "torch_compile_ms"),
                              ("ratio_welded_compile", "tilekit_welded_ms", "torch_compile_ms"),
                              ("ratio_graph", "tilekit_ms", "torch_graph_ms"),
                              ("ratio_program_graph", "tilekit_program_ms", "torch_graph_ms")):
        row[key] = row[ours] / row[theirs] if row.get(ours) and row.get(theirs) else None
    return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in row.items()}


def _write_report(report: dict) -> Path:
    """Written after every row, so that a bench stopped by a time limit leaves what it has."""
    RESULTS.mkdir(exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", report["device"].split(" (")[0]).strip("_").lower()
    if CASES == "none":
        slug += "-models" + ("" if COMPILE_MODE == "default" else f"-{COMPILE_MODE}")
    path = RESULTS / f"{slug}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _ms(value) -> str:
    return "    -    " if value is None else f"{value:9.3f}"


def _print_row(r: dict) -> None:
    """One line per row as it is measured (the bench is watched live with -s), problems under it."""
    ratios = "  ".join(f"{r[k]:6.2f}x" if r.get(k) else "    -  "
                       for k in ("ratio", "ratio_compile", "ratio_graph"))
    dram = f"{r['dram_fraction'] * 100:5.1f}% DRAM" if r.get("dram_fraction") else ""
    which = "tensor-core" if r.get("shape") == "mma" else "fp32"
    flops = f"{r['peak_fraction'] * 100:5.1f}% {which} peak" if r.get("peak_fraction") else ""
    print(f"  {r['case']:<30}  tilekit {_ms(r.get('tilekit_ms'))}  eager "
          f"{_ms(r.get('torch_ms'))}  compile {_ms(r.get('torch_compile_ms'))}  graph "
          f"{_ms(r.get('torch_graph_ms'))}  welded {_ms(r.get('tilekit_welded_ms'))}  program "
          f"{_ms(r.get('tilekit_program_ms'))}  {ratios}  "
          f"{dram}  {flops}".rstrip(), flush=True)
    problems = [f"{k}: {r[k]}" for k in ("error", "tilekit_error", "program_error",
                                         "eager_error", "graph_error", "compile_error")
                if r.get(k)]
    if str(r.get("check", "")).startswith("FAIL"):
        problems.append(f"check {r['check']} (rel L2 {r.get('rel_l2_vs_eager')} against eager)")
    for problem in problems:
        print(f"  {'':<30}  {problem[:300]}", flush=True)


def test_gpu_bench(tmp_path):
    cupy, torch = _gpu_or_skip()
    from tilekit.runtime import cuda
    started = time.monotonic()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    arch = cuda.device_arch()
    profile = profile_for(arch)
    if CASES not in ("all", "none"):
        raise ValueError(f"TILEKIT_BENCH_CASES: {CASES!r}; write all or none")
    cases = op_cases() if CASES == "all" else []
    _compile_cases(cases, profile, arch)
    report = {
        "command": "pytest tests/bench/test_gpu_bench.py -o addopts='' -s",
        "date": datetime.date.today().isoformat(),
        "device": cuda.device_description(), "profile": profile.name, "runs": RUNS,
        "warmup": WARMUP, "torch": torch.__version__, "tf32": False,
        "timing": "CUDA events around all kernels of a case (tilekit) or around one call "
                  "(PyTorch eager, torch.compile after its compile), median; model rows at "
                  "batch > 1 take max(10, runs / 5) runs",
        "models": "PyTorch through tests/bench/torch_onnx.py (the ONNX graph node by node); "
                  "torch_ms is eager, torch_graph_ms eager captured once and replayed as a "
                  f"CUDA graph, torch_compile_ms torch.compile (mode {COMPILE_MODE}); "
                  "tilekit_ms rolled, tilekit_welded_ms rolled then welded, "
                  "tilekit_program_ms a tk-ram program (roll --top-k 4, weld, ram)",
        "compile_mode": COMPILE_MODE, "cases": CASES,
        "rows": [],
    }
    rows = report["rows"]
    print(f"\n{report['device']}: tilekit vs PyTorch eager and torch.compile (medians, ms; "
          "ratio = tilekit / PyTorch, < 1 is faster)")
    for case in cases:
        try:
            rows.append(_run_case(case, case.module, cupy, torch, profile))
        except Exception as exc:  # noqa: BLE001 - AssertionError included: the rows go on
            rows.append({"case": case.name, "kind": case.kind, "error": _error(exc)})
        _print_row(rows[-1])
    _write_report(report)
    builds = _build_models(model_specs(MODELS), profile, arch, tmp_path)
    while builds:
        build = builds.pop(0)
        try:
            rows.append(_model_row(build, torch, profile, started + BUDGET_S))
        except Exception as exc:  # noqa: BLE001 - each stage is guarded; this is the rest
            rows.append({"case": f"model_{build.spec.label}", "kind": "model",
                         "error": _error(exc)})
        del build
        _print_row(rows[-1])
        _write_report(report)
        # Each row's device memory back before the next (ResNet-50 at batch 64 holds GBs).
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()
    report["seconds"] = round(time.monotonic() - started, 1)
    _write_report(report)
    print(f"  ({report['seconds']} s)")
    broken = [r["case"] for r in rows if r.get("error") or r.get("tilekit_error")
              or r.get("program_error") or r.get("eager_error")
              or str(r.get("check", "")).startswith("FAIL")
              or any((r.get(k) or 0) > MODEL_TOLERANCE
                     for k in ("welded_rel_l2_vs_rolled", "program_rel_l2_vs_rolled"))]
    assert not broken, f"rows with an error or a failed check (see above): {broken}"
