"""GPU benchmark: tilekit's generated kernels against PyTorch (cuBLAS / cuDNN) in the same run.

    make bench                      # or: pytest tests/bench -o addopts="" -s

Cases (each built as tile IR, rolled for the device's profile, generated, compiled, checked
against PyTorch's result, then timed with CUDA events, median of RUNS after WARMUP):

- matmul: 4096^3, 1024^3, skinny (16 x 4096 x 4096, 4096 x 16 x 4096), a K-heavy 256 x 256 x 16384;
- ResNet-50 convolution layers at batch 1 (conv1 7x7/2, the 3x3 of each stage, two 1x1);
- softmax and layer normalisation rows (fused groups of primitive ops);
- models from onnx's light test data (tk-import | tk-roll | codegen), against PyTorch through
  onnx2torch when it is installed (otherwise the row has no baseline).

Reported per case: tilekit and PyTorch medians, their ratio (tilekit / PyTorch: below 1 is
faster), achieved GFLOP/s and fraction of the profile's fp32 SIMT peak, achieved DRAM bandwidth
(compulsory bytes: inputs read once, outputs written once) and fraction of the profile's DRAM
bandwidth. TF32 is disabled in PyTorch so that both sides compute in fp32 on CUDA cores.
Results go to tests/bench/results/<device>.json with the command and the date.

Skipped without CuPy, PyTorch with CUDA, or a GPU. `test_cases_build` runs everywhere: it
builds and compiles every case (no GPU), so the benchmark cannot rot unnoticed.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.ir.model import Kernel, Module, Op, Tensor

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
RUNS = int(os.environ.get("TILEKIT_BENCH_RUNS", "50"))
WARMUP = 5
MODELS = [m for m in os.environ.get("TILEKIT_BENCH_MODELS", "resnet50,squeezenet").split(",") if m]


@dataclass(frozen=True)
class Case:
    name: str
    kind: str                        # matmul, conv, softmax, layernorm, model
    module: Module
    flops: float
    bytes: float
    torch_fn: Callable | None        # (torch tensors by input name) -> output tensor


def _module(name: str, tensors: dict, ops: list[Op], kernels=()) -> Module:
    return Module(model=name, tensors=tensors, ops=tuple(ops),
                  inputs=tuple(n for n, t in tensors.items() if t.role == "input"),
                  outputs=tuple(n for n, t in tensors.items() if t.role == "output"),
                  kernels=tuple(kernels)).with_stage("import")


def matmul(m: int, n: int, k: int) -> Case:
    mod = _module(f"matmul_{m}x{n}x{k}",
                  {"a": Tensor((m, k), "float32", "input"), "b": Tensor((k, n), "float32", "input"),
                   "c": Tensor((m, n), "float32", "output")},
                  [Op("mm", "c[i,j] += a[i,k] * b[k,j]")])
    return Case(mod.model, "matmul", mod, 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n),
                lambda t: t["a"] @ t["b"])


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
        matmul(4096, 4096, 4096), matmul(1024, 1024, 1024), matmul(16, 4096, 4096),
        matmul(4096, 16, 4096), matmul(256, 256, 16384),
        conv("conv1", 3, 224, 64, 7, 2, 3), conv("res2_3x3", 64, 56, 64, 3, 1, 1),
        conv("res3_3x3", 128, 28, 128, 3, 1, 1), conv("res4_3x3", 256, 14, 256, 3, 1, 1),
        conv("res5_3x3", 512, 7, 512, 3, 1, 1), conv("res2_1x1", 256, 56, 64, 1, 1, 0),
        conv("res4_1x1_expand", 256, 14, 1024, 1, 1, 0),
        softmax(4096, 4096), softmax(32768, 512), layernorm(4096, 4096), layernorm(16384, 1024),
    ]


def rolled(module: Module, profile) -> Module:
    """tk-roll's tiles when the roll pass is available (else the default schedules)."""
    try:
        from tilekit.roll.schedule import roll_module
    except ImportError:  # pragma: no cover - the roll issue not landed
        return module
    return roll_module(module, profile)


def profile_for(arch: str | None):
    from tilekit.hw import list_profiles, load_profile
    if arch is None:
        return load_profile("h100")
    for p in list_profiles():
        if p.arch == arch:
            return p
    return load_profile("h100")


# -- no GPU needed -------------------------------------------------------------------------

def test_cases_build(tmp_path, monkeypatch):
    """Every op case rolls, generates and compiles for sm_90 (no GPU involved)."""
    from tilekit.codegen import compile_module
    from tilekit.codegen.nvcc import find_nvcc
    if "TILEKIT_CACHE" not in os.environ:
        monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path))
    profile = profile_for("sm_90")
    for case in op_cases():
        result = generate(rolled(case.module, profile), profile)
        assert result.kernels, case.name
        if find_nvcc():
            report = compile_module(result, "sm_90", profile)
            assert not report.problems, (case.name, report.problems)


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


def _torch_time(torch, fn, args) -> tuple[float, object]:
    out = fn(args)
    for _ in range(WARMUP):
        fn(args)
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(args)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return float(np.median(times)), out


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


def _run_case(case: Case, module: Module, cupy, torch, profile) -> dict:
    from tilekit.runtime import cuda
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    result = generate(rolled(module, profile), profile)
    timing = cuda.time_kernels(result.module, inputs, {}, RUNS, WARMUP)
    got = cuda.run_module(result.module, inputs, {})[module.outputs[0]]
    torch_s, err = None, None
    if case.torch_fn is not None:
        args = {n: torch.from_numpy(v).cuda() for n, v in inputs.items()}
        torch_s, want = _torch_time(torch, case.torch_fn, args)
        want = want.float().cpu().numpy()
        err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
        assert err < 1e-3, f"{case.name}: tilekit differs from PyTorch by {err:.2e}"
    return _row(case, timing.median, torch_s, profile, err)


def _model_rows(cupy, torch, profile, tmp: Path) -> list[dict]:
    import onnx
    from tilekit.ir.codec import read_module
    from tilekit.runtime import cuda
    from tilekit.runtime.io import load_weights
    rows = []
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    for name in MODELS:
        path = light / f"light_{name}.onnx"
        if not path.exists():
            continue
        ir = tmp / f"{name}.yaml"
        subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(path), "-o", str(ir)],
                       check=True)
        module = read_module(str(ir))
        weights = load_weights(module, tmp)
        rng = np.random.default_rng(0)
        inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
                  for n in module.inputs}
        result = generate(rolled(module, profile), profile)
        timing = cuda.time_kernels(result.module, inputs, weights, RUNS, WARMUP)
        nbytes = sum(module.tensors[n].size * 4 for n in module.inputs + module.outputs) + \
            sum(w.nbytes for w in weights.values())
        case = Case(f"model_{name}", "model", module, 0.0, float(nbytes), None)
        torch_s = None
        try:
            import onnx2torch
            net = onnx2torch.convert(str(path)).cuda().eval()
            args = [torch.from_numpy(inputs[n]).cuda() for n in module.inputs]
            with torch.no_grad():
                torch_s, _ = _torch_time(torch, lambda a: net(*a), args)
        except ImportError:
            pass
        row = _row(case, timing.median, torch_s, profile, None)
        row["kernels"] = len(result.module.codegen["kernels"])
        rows.append(row)
    return rows


def test_gpu_bench(tmp_path):
    cupy, torch = _gpu_or_skip()
    from tilekit.runtime import cuda
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    arch = cuda.device_arch()
    profile = profile_for(arch)
    rows = [_run_case(case, case.module, cupy, torch, profile) for case in op_cases()]
    rows += _model_rows(cupy, torch, profile, tmp_path)
    device = cuda.device_description()
    report = {
        "command": "pytest tests/bench/test_gpu_bench.py -o addopts='' -s",
        "date": datetime.date.today().isoformat(),
        "device": device, "profile": profile.name, "runs": RUNS, "warmup": WARMUP,
        "torch": torch.__version__, "tf32": False,
        "timing": "CUDA events around all kernels of a case, median; PyTorch the same",
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", device.split(" (")[0]).strip("_").lower()
    (RESULTS / f"{slug}.json").write_text(json.dumps(report, indent=1) + "\n")
    width = max(len(r["case"]) for r in rows)
    print(f"\n{device}: tilekit vs PyTorch (median of {RUNS}; ratio < 1 is faster)")
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "  -  "
        flops = f"{r['peak_fraction'] * 100:5.1f}% fp32 peak" if r["peak_fraction"] else ""
        print(f"  {r['case']:<{width}}  {r['tilekit_ms']:9.3f} ms  torch "
              f"{(r['torch_ms'] or math.nan):9.3f} ms  {ratio:>7}  "
              f"{r['dram_fraction'] * 100:5.1f}% DRAM  {flops}")
