"""tk-import time: ResNet-50 (onnx's light_resnet50.onnx: 179 ops, 98 MB of weights written).

Run with `make bench` (not part of `make test`: a timing belongs to a benchmark, not to a test
that a loaded machine would fail). Reported: the library (`load_model`, `import_model`,
`attach_files`, which writes the weights sidecar; best of 3) and the whole `tk-import`
command in a fresh process (start-up, reading, verifying and writing the IR and weights).
Results go to tests/bench/results/import-cpu.json. Target (the import issue): under 2 s.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "bench" / "results" / "import-cpu.json"
MODEL = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
TARGET_S = 2.0


def library_seconds(folder: Path) -> tuple[float, int]:
    from tilekit.onnx import attach_files, import_model, load_model

    times, ops = [], 0
    for k in range(3):
        start = time.perf_counter()
        imported = import_model(load_model(str(MODEL)), name="resnet50")
        attach_files(imported, ir_folder=str(folder), weights_path=str(folder / f"w{k}.npz"),
                     onnx_path=str(MODEL), onnx_sha256="0" * 64, options={})
        times.append(time.perf_counter() - start)
        ops = len(imported.module.ops)
    return min(times), ops


def command_seconds(folder: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "bin" / "tk-import"), str(MODEL), "-o",
                    str(folder / "resnet50.yaml")], check=True)
    return time.perf_counter() - start


def test_resnet50_import_time(tmp_path):
    from tilekit.runtime.bench import cpu_description

    library, ops = library_seconds(tmp_path)
    command = command_seconds(tmp_path)
    print(f"\ntk-import ResNet-50 ({ops} ops): library {library:.2f} s (best of 3), "
          f"command {command:.2f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": "make bench (tests/bench/test_import_bench.py)",
        "date": datetime.date.today().isoformat(),
        "device": cpu_description(),
        "python": platform.python_version(),
        "method": "import_model + attach_files (weights written), best of 3; one tk-import "
                  "process",
        "resnet50": {"ops": ops, "library_s": round(library, 3),
                     "tk_import_command_s": round(command, 3)},
    }, indent=2, sort_keys=True) + "\n")
    assert library < TARGET_S
