"""The CPU target's GEMM kernels alone, on one core: GFLOP/s of each kernel and of the
micro-kernel, against the core's FMA peak.

Run with `make bench` (not part of `make test`), or alone:
`pytest tests/bench/test_cpu_gemm_bench.py -s -p no:cacheprovider -o addopts=""`
(`TILEKIT_BENCH_MODELS=resnet50,bert_layer` picks the models).

Whole-model timings (test_cpu_bench.py) on a machine shared with other work move by 2x from
run to run; a kernel's blocks timed one at a time on one core, each the fastest of many runs,
hardly move, so this is how a change to the GEMM kernels (tilekit/codegen/cpu.py,
runtime_cpu.h, tilekit/schedule/cpu.py) is measured. For each distinct `cpu_gemm` kernel of
the model (rolled and welded for the host's CPU profile scaled to one core, as the
`compiled-cpu` engine does), a C++ harness calls the kernel's body for every block:

- **hot**: each block the fastest of `REPS` runs in a row (its operands in cache: what the
  packing and the micro-kernel cost);
- **cold**: the whole grid, after 64 MiB of other writes, the fastest of `REPS` (operands
  from memory: what a kernel of a real run costs, weights included).

The micro-kernel alone (`tk_gemm_micro_rows<6, 16>` over a 66 x 208 x 256 tile, panels in L1
and L2) gives the ceiling. Operand values are synthetic (no NaN, no denormals). Results go to
tests/bench/results/cpu_gemm.json.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from cpu_engines import cpu_profile, host_profile_name  # noqa: E402
from test_cpu_bench import build  # noqa: E402

from tilekit.codegen.cxx import CXX_FLAGS, find_cxx  # noqa: E402
from tilekit.runtime.bench import cpu_description  # noqa: E402

REPS = 20
MODELS = os.environ.get("TILEKIT_BENCH_MODELS", "resnet50,bert_layer").split(",")
RESULTS = ROOT / "tests" / "bench" / "results" / "cpu_gemm.json"
GEMM = re.compile(r"// cpu gemm: (\d+)x(\d+)x(\d+)[^\n]*?(?: x (\d+) batch)?, blocks")

MICRO = """
  {
    const int kc = 256, mc = 66, nc = 208, lda = 1152;
    float* a = buf[0]; float* b = buf[1]; float* c = buf[2];
    double best = 1e9;
    for (int r = 0; r < 2000; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int jr = 0; jr < nc / 16; ++jr)
        for (int ir = 0; ir < mc / 6; ++ir)
          tk_gemm_micro_rows<6, 16>(a + ir * 6 * lda, lda, 6, b + jr * 16 * kc, kc,
                                    c + ir * 6 * nc + jr * 16, nc, 1);
      best = std::min(best, seconds(t0));
    }
    std::printf("micro %.6f %.6f %.0f\\n", best, best, 2.0 * mc * nc * kc);
  }
"""


def harness(kernels: list[tuple[str, str, int, int, int, str, float]], buffer_bytes: int,
            params: int) -> str:
    lines = ['#include "runtime_cpu.h"', "#include <algorithm>", "#include <chrono>",
             "#include <cstdio>", "#include <cstdlib>",
             "static double seconds(std::chrono::steady_clock::time_point t0) {",
             "  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)"
             ".count();", "}"]
    lines += [body for _, body, *_ in kernels]
    floats = buffer_bytes // 4
    lines += ["int main() {",
              f"  const size_t n = {floats};",
              f"  float* buf[{max(params, 3)}];",
              f"  for (int i = 0; i < {max(params, 3)}; ++i) {{",
              "    buf[i] = static_cast<float*>(std::aligned_alloc(64, n * 4));",
              "    for (size_t j = 0; j < n; ++j) buf[i][j] = 0.01f * float(j % 7) - 0.03f;",
              "  }",
              "  const size_t flush_n = 16u << 20;",
              "  float* flush = static_cast<float*>(std::aligned_alloc(64, flush_n * 4));",
              "  for (size_t j = 0; j < flush_n; ++j) flush[j] = 0.0f;",
              MICRO]
    for fn, _, nparams, grid, smem, label, flops in kernels:
        args = ", ".join(f"buf[{i}]" for i in range(nparams))
        lines.append(f"""  {{
    unsigned char* sm = tk_block_memory({smem});
    double hot = 0, cold = 1e9;
    for (int blk = 0; blk < {grid}; ++blk) {{
      double best = 1e9;
      for (int r = 0; r < {REPS}; ++r) {{
        auto t0 = std::chrono::steady_clock::now();
        {fn}_body({args}, blk, {grid}, sm);
        best = std::min(best, seconds(t0));
      }}
      hot += best;
    }}
    for (int r = 0; r < {REPS}; ++r) {{
      for (size_t j = 0; j < flush_n; j += 16) flush[j] += 1.0f;
      auto t0 = std::chrono::steady_clock::now();
      for (int blk = 0; blk < {grid}; ++blk) {fn}_body({args}, blk, {grid}, sm);
      cold = std::min(cold, seconds(t0));
    }}
    std::printf("{label} %.6f %.6f %.0f\\n", hot, cold, {flops});
  }}""")
    lines.append("}")
    return "\n".join(lines) + "\n"


def gemm_kernels(path: Path):
    """The model's distinct cpu_gemm kernels (rolled and welded for the host's profile, one
    core) as (body name, body source, parameters, grid, block memory, label, flops), and the
    largest tensor's bytes."""
    from tilekit.codegen import generate
    from tilekit.codegen.module import CodegenSection
    from tilekit.onnx import import_model, load_model
    from tilekit.roll.schedule import roll_module
    from tilekit.weld import weld_module

    profile = cpu_profile(1)
    module = import_model(load_model(str(path))).module.with_stage("import")
    module = generate(weld_module(roll_module(module, profile), profile), profile,
                      target="cpu").module
    biggest = 8 * max(_numel(t.shape) for t in module.tensors.values())   # 8: any dtype
    out, seen = [], set()
    for k in CodegenSection.read(module.codegen).kernels:
        m = GEMM.search(k.source)
        if not m or m.group(0) in seen:
            continue
        seen.add(m.group(0))
        big_m, big_n, big_k = map(int, m.group(1, 2, 3))
        batch = int(m.group(4) or 1)
        body = k.source.split('#include "runtime_cpu.h"', 1)[1].split('extern "C"')[0]
        sig = re.search(r"static inline void (\w+)_body\((.*?)\) \{", body)
        grid = re.search(r"tk_b < (\d+)", k.source)
        smem = re.search(r"tk_block_memory\((\d+)\)|tk_smem\[(\d+)\]", k.source)
        label = f"{big_m}x{big_n}x{big_k}" + (f"x{batch}" if batch > 1 else "")
        out.append((sig.group(1), body, sig.group(2).count("__restrict__") - 1,
                    int(grid.group(1)) if grid else 1, int(smem.group(1) or smem.group(2)),
                    label, 2.0 * big_m * big_n * big_k * batch))
    return out, biggest


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
@pytest.mark.parametrize("name", MODELS)
def test_cpu_gemm_kernels(name, tmp_path):
    kernels, biggest = gemm_kernels(build(name, tmp_path))
    src = tmp_path / "gemm_bench.cpp"
    src.write_text(harness(kernels, biggest + 4096, max(k[2] for k in kernels)))
    exe = tmp_path / "gemm_bench"
    flags = [f for f in CXX_FLAGS if f not in ("-shared", "-fPIC")]
    subprocess.run([find_cxx(), *flags, f"-I{ROOT / 'tilekit' / 'codegen'}", "-o", str(exe),
                    str(src)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                         timeout=900).stdout
    rows = []
    print(f"\n{name}, one core: kernel, hot and cold GFLOP/s")
    for line in out.splitlines():
        label, hot, cold, flops = line.split()
        hot_gf, cold_gf = float(flops) / float(hot) / 1e9, float(flops) / float(cold) / 1e9
        rows.append({"kernel": label, "hot_ms": round(float(hot) * 1e3, 3),
                     "cold_ms": round(float(cold) * 1e3, 3), "hot_gflops": round(hot_gf, 1),
                     "cold_gflops": round(cold_gf, 1)})
        print(f"  {label:>18s} {hot_gf:6.1f} {cold_gf:6.1f}")
    gemm = [r for r in rows if r["kernel"] != "micro"]
    total = {"hot_ms": round(sum(r["hot_ms"] for r in gemm), 2),
             "cold_ms": round(sum(r["cold_ms"] for r in gemm), 2)}
    print(f"  distinct kernels together: {total['hot_ms']} ms hot, {total['cold_ms']} ms cold")
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.update({"command": "pytest tests/bench/test_cpu_gemm_bench.py",
                 "date": datetime.date.today().isoformat(), "device": cpu_description(),
                 "profile": host_profile_name(),
                 "method": f"one core; hot: each block the fastest of {REPS} runs; cold: the "
                           f"grid after 64 MiB of other writes, the fastest of {REPS}"})
    data.setdefault("models", {})[name] = {"kernels": rows, "total": total}
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
