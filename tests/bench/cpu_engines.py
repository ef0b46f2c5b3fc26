"""One engine on one model in a fresh process: latency and peak memory, as JSON on stdout.

    python tests/bench/cpu_engines.py --engine ENGINE --model M.onnx --runs N

Engines: `tilekit` (the NumPy reference executor, whole ops), `compiled` (the default
schedules, what `tk-run --device cpu` generates for a module without a profile: kernels cut
for the shipped profile of the host's SIMD ISA, or `--profile`, with its core count set to
the threads run), `compiled-cpu` (the same after tk-roll and tk-weld for that profile: the
tiles and groups a CPU profile gives), `compiled-per-kernel` and
`compiled-cpu-per-kernel` (the same kernels, each called through its own entry: one ctypes
call and one parallel region per kernel, as before the program entry), `onnxruntime`.

For the compiled engines `kernel_times_ms` are the kernels' own times in as many more runs
(a run less binding the inputs into the kernels' buffers and copying the outputs out).

Peak memory is only comparable between processes that did nothing else, so each engine runs
alone here; `test_cpu_bench.py` starts one process per engine and model, alternating engines
run after run so that machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    """Peak resident memory of this process (VmHWM: unlike ru_maxrss, not inherited from
    the parent across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def feeds_for(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def tilekit_runner(path: Path, feeds: dict[str, np.ndarray], threads: int):
    from tilekit.onnx import import_model, load_model
    from tilekit.runtime import prepare

    imported = import_model(load_model(str(path)))
    module = imported.module
    weights = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    renamed = (module.source or {}).get("inputs", {})
    ir_inputs = {ir: feeds[renamed.get(ir, ir)] for ir in module.inputs}
    program = prepare(module)
    return lambda: program.run(ir_inputs, weights)


def host_profile_name() -> str:
    """TILEKIT_BENCH_PROFILE, else the shipped CPU profile of this machine's SIMD ISA, as
    tk-run takes when a module has no profile (`tilekit.hw.host_cpu_profile`: AVX-512
    icelake, AVX2 milan, SVE graviton3), else milan. Tiles for AVX2's 16 registers of 8
    lanes, compiled for AVX-512's 32 of 16, leave half the FMA pipes' latency uncovered (the
    BERT layer 1.5x slower on 2 cores of a Xeon with AVX-512 under milan's tiles than under
    icelake's)."""
    from tilekit.hw import host_cpu_profile

    chosen = os.environ.get("TILEKIT_BENCH_PROFILE")
    if chosen:
        return chosen
    host = host_cpu_profile(1)
    return host.name if host is not None else "milan"


def cpu_profile(threads: int, name: str | None = None):
    """CPU profile `name` (default `host_profile_name()`) scaled to `threads` cores: the
    blocks are cut for the cores the code runs on, not a 40- or 64-core chip."""
    from tilekit.hw import load_profile

    return load_profile(name or host_profile_name()).with_cpu(cores=threads)


def compiled_runner(path: Path, feeds: dict[str, np.ndarray], threads: int,
                    rolled: bool = False, per_kernel: bool = False, profile_name=None):
    from tilekit.codegen import generate
    from tilekit.onnx import import_model, load_model
    from tilekit.roll.schedule import roll_module
    from tilekit.runtime.compiled import CpuProgram
    from tilekit.weld import weld_module

    imported = import_model(load_model(str(path)))
    module = imported.module.with_stage("import")
    # the same profile either way: unrolled, the kernels tk-run generates for a module
    # without one (tilekit.runtime.backend); rolled, tk-roll's tiles and tk-weld's groups
    profile = cpu_profile(threads, profile_name)
    if rolled:
        module = weld_module(roll_module(module, profile), profile)
    module = generate(module, profile, target="cpu").module
    weights = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    renamed = (module.source or {}).get("inputs", {})
    ir_inputs = {ir: feeds[renamed.get(ir, ir)] for ir in module.inputs}
    program = CpuProgram(module, threads, per_kernel=per_kernel, profile=profile)

    def run():
        return program.run(ir_inputs, weights)

    # the kernels' own time in a run (CpuProgram.profile), without binding the inputs and
    # copying the outputs out
    run.kernel_seconds = lambda: sum(t for _, t in program.profile(ir_inputs, weights)[1])
    return run


def onnxruntime_session(model, threads: int, spinning: bool = True):
    """An onnxruntime CPU session of `model` (a path or serialized bytes) on `threads`
    threads; `spinning` false: its pool's threads do not spin between runs (in a process that
    alternates it with another runner, they would hold the cores the other needs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                providers=["CPUExecutionProvider"])


def onnxruntime_runner(path: Path, feeds: dict[str, np.ndarray], threads: int):
    session = onnxruntime_session(path, threads)
    return lambda: session.run(None, feeds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["tilekit", "compiled", "compiled-cpu",
                                             "compiled-per-kernel",
                                             "compiled-cpu-per-kernel", "onnxruntime"],
                        required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--profile", default=None,
                        help="CPU profile of the compiled-cpu engines (default: the host's ISA)")
    args = parser.parse_args()
    path = Path(args.model)
    feeds = feeds_for(onnx.load(str(path), load_external_data=False), seed=0)
    base = rss_mib()
    compiled = functools.partial(compiled_runner, profile_name=args.profile)
    make = {"tilekit": tilekit_runner, "compiled": compiled,
            "compiled-cpu": functools.partial(compiled, rolled=True),
            "compiled-per-kernel": functools.partial(compiled, per_kernel=True),
            "compiled-cpu-per-kernel": functools.partial(compiled, rolled=True,
                                                         per_kernel=True),
            "onnxruntime": onnxruntime_runner}[args.engine]
    runner = make(path, feeds, args.threads)
    runner()  # warm-up
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        runner()
        times.append(time.perf_counter() - start)
    result = {"engine": args.engine, "times_ms": [t * 1e3 for t in times],
              "peak_rss_mib": rss_mib(), "base_rss_mib": base}
    if hasattr(runner, "kernel_seconds"):
        result["kernel_times_ms"] = [runner.kernel_seconds() * 1e3 for _ in range(args.runs)]
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
