"""tk-roll compile time: per op over the workload suite, and a whole ResNet-50.

Run with `make bench` (not part of `make test`). Reported, for the H100 profile: the median and
90th percentile of `roll_module` time per op of specs/workloads.yaml with `--top-k 1` and
`--top-k 10` (each op rolled in a fresh call, so nothing is cached between ops), and the time
to roll the ResNet-50 that `tk-import` makes of onnx's light_resnet50.onnx (library call, and
the whole `tk-roll` command with reading, verifying and writing). Results go to
tests/bench/results/roll-cpu.json. Targets (issue tk-roll): median < 50 ms per op with
`--top-k 1`, ResNet-50 < 3 s.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "bench" / "results" / "roll-cpu.json"
HW = "h100"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def per_op_ms(top_k: int) -> list[float]:
    from tilekit.hw import load_profile
    from tilekit.roll.schedule import roll_module
    from tilekit.roll.workloads import load_workloads

    profile = load_profile(HW)
    times = []
    for w in load_workloads():
        module = w.module()
        start = time.perf_counter()
        roll_module(module, profile, top_k)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def resnet50(folder: Path) -> Path:
    import onnx

    model = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    out = folder / "resnet50.yaml"
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(model), "-o",
                    str(out)], check=True)
    return out


def test_roll_compile_time(tmp_path):
    from tilekit.hw import load_profile
    from tilekit.ir import read_module
    from tilekit.roll.schedule import roll_module

    rows = {}
    for k in (1, 10):
        times = per_op_ms(k)
        rows[f"top{k}"] = {"ops": len(times), "median_ms": round(statistics.median(times), 2),
                           "p90_ms": round(percentile(times, 0.9), 2),
                           "max_ms": round(max(times), 2)}
        print(f"\ntk-roll --top-k {k}, {HW}: {len(times)} ops, median "
              f"{rows[f'top{k}']['median_ms']} ms, p90 {rows[f'top{k}']['p90_ms']} ms")

    ir = resnet50(tmp_path)
    module = read_module(str(ir))
    profile = load_profile(HW)
    lib = []
    for _ in range(3):
        start = time.perf_counter()
        roll_module(module, profile, 1)
        lib.append(time.perf_counter() - start)
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-roll"), "--hw", HW, str(ir), "-o",
                    str(tmp_path / "rolled.yaml")], check=True)
    command = time.perf_counter() - start
    rows["resnet50"] = {"ops": len(module.ops), "roll_module_s": round(min(lib), 3),
                        "tk_roll_command_s": round(command, 3)}
    print(f"ResNet-50 ({len(module.ops)} ops): roll_module {min(lib):.2f} s, "
          f"tk-roll command {command:.2f} s")
    record(rows)
    assert rows["top1"]["median_ms"] < 50
    assert rows["resnet50"]["roll_module_s"] < 3


def record(rows: dict) -> None:
    from tilekit.runtime.bench import cpu_description

    data = {
        "command": "make bench (tests/bench/test_roll_bench.py)",
        "date": datetime.date.today().isoformat(),
        "device": cpu_description(),
        "python": platform.python_version(),
        "hardware_profile": HW,
        "method": "roll_module per op of specs/workloads.yaml in a fresh call (no cache across "
                  "ops); ResNet-50: best of 3 roll_module calls, and one tk-roll process",
        **rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s", "-p", "no:cacheprovider"]))
