"""tilekit.runtime.cuda's logic against a fake CuPy (no GPU here): what it compiles, allocates,
uploads and launches, in which order, with which arguments. The real thing is tests/gpu/."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.codegen.nvcc import find_nvcc
from tilekit.errors import TilekitError
from tilekit.ir.payloads import CodegenSection

from codegen_support import big_tile_matmul, fixture, random_values


class FakeArray:
    def __init__(self, shape, dtype):
        self.data = np.zeros(shape, dtype)
        self.shape = self.data.shape
        self.sets = 0

    def set(self, value):
        # cupy.ndarray.set refuses a host array of another shape or dtype.
        if value.shape != self.data.shape or value.dtype != self.data.dtype:
            raise ValueError(f"set: shape {value.shape} {value.dtype} into {self.data.shape} "
                             f"{self.data.dtype}")
        self.data[...] = value
        self.sets += 1

    def get(self):
        return self.data.copy()


class FakeFunction:
    def __init__(self, name, log):
        self.name, self.log = name, log
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, shared_mem=0):
        self.log.append((self.name, grid, block, args, shared_mem))


def fake_cupy(log, driver=99000, smem_optin=232448):
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 12040,
        driverGetVersion=lambda: driver,
        getDeviceProperties=lambda i: {"name": b"Fake GPU", "multiProcessorCount": 132})
    cuda.Device = lambda: types.SimpleNamespace(
        compute_capability="90", id=0,
        attributes={"MaxSharedMemoryPerBlockOptin": smem_optin,
                    "MaxSharedMemoryPerBlock": 49152})
    cuda.get_current_stream = lambda: types.SimpleNamespace(synchronize=lambda: None)

    class DriverError(Exception):
        pass
    cuda.driver = types.SimpleNamespace(CUDADriverError=DriverError)
    cuda.runtime.CUDARuntimeError = type("CUDARuntimeError", (Exception,), {})

    class Graph:
        """The launches made while its stream captured, logged again at each replay."""

        def __init__(self, nodes):
            self.nodes = nodes

        def upload(self, stream):
            log.append(("graph upload", len(self.nodes)))

        def launch(self, stream):
            log.append(("graph launch", len(self.nodes)))
            Event.clock += 0.25 * len(self.nodes)

    class Stream:
        """A stream whose capture collects the launches made under `with stream` (the fake
        functions log to `log`; a capture takes what they log meanwhile)."""

        def __init__(self, non_blocking=False):
            self.start = None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def begin_capture(self):
            log.append(("capture",))
            self.start = len(log)

        def end_capture(self):
            nodes, self.start = log[self.start:], None
            log.append(("end capture", len(nodes)))
            return Graph(nodes)

        def synchronize(self):
            pass
    cuda.Stream = Stream

    class Event:
        clock = 0.0

        def record(self, stream=None):
            Event.clock += 1.0
            self.t = Event.clock

        def synchronize(self):
            pass
    cuda.Event = Event
    cuda.get_elapsed_time = lambda a, b: (b.t - a.t) * 0.5  # ms
    cupy.cuda = cuda
    cupy.empty = FakeArray

    class Global:
        """A `__constant__` array of the module: what the host copied into it."""

        def __init__(self):
            self.bytes = b""

        def copy_from_host(self, address, nbytes):
            self.bytes = ctypes.string_at(address, nbytes)

    class RawModule:
        def __init__(self, path=None, code=None, backend=None, options=()):
            log.append(("module", path is not None, code is not None))
            self.path, self.code = path, code
            self.functions = {}
            self.globals = {}

        def get_function(self, name):
            return self.functions.setdefault(name, FakeFunction(name, log))

        def get_global(self, name):
            return self.globals.setdefault(name, Global())
    cupy.RawModule = RawModule
    return cupy


@pytest.fixture
def runtime(monkeypatch, tmp_path):
    log = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(log))
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path))
    from tilekit.runtime import cuda
    monkeypatch.setattr(cuda, "_PROGRAMS", {})
    return cuda, log


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_launches_in_order_with_buffers_and_weights_once(runtime):
    cuda, log = runtime
    module = generate(fixture("gather")).module
    inputs, weights = random_values(module)
    out = cuda.run_module(module, inputs, weights)
    assert log[0] == ("module", True, False)  # a cubin built by nvcc
    launches = [entry for entry in log[1:]]
    assert [l[0] for l in launches] == ["tk_k_lookup", "tk_k_scale"]
    program = cuda.prepare(module)
    name, grid, block, args, smem = launches[0]
    assert args == (program.buffers["emb"], program.buffers["ids"], program.buffers["g"])
    assert grid == tuple(module.codegen["kernels"][0]["grid"]) and block == (256, 1, 1)
    assert program.buffers["emb"].sets == 1 and program.buffers["ids"].sets == 1
    assert out["y"].shape == (2, 5, 6)
    cuda.run_module(module, inputs, weights)
    assert program.buffers["emb"].sets == 1          # weights uploaded once
    assert program.buffers["ids"].sets == 2          # inputs every run
    assert "Fake GPU (sm_90, 132 SMs" in cuda.device_description()


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_dynamic_shared_memory_opt_in_and_event_timing(runtime):
    from tilekit.hw import load_profile
    cuda, log = runtime
    module = big_tile_matmul()
    module = generate(module, load_profile("h100")).module
    inputs = {n: np.ones((256, 256), np.float32) for n in ("a", "b")}
    timing = cuda.time_kernels(module, inputs, {}, runs=3, warmup=1, per_kernel=True)
    program = cuda.prepare(module)
    (launch,) = program.launches
    assert launch.smem_bytes == 65536 and launch.function.max_dynamic_shared_size_bytes == 65536
    assert all(entry[4] == 65536 for entry in log[1:])
    assert len(timing.seconds) == 3 and timing.per_kernel["tk_k_mm"]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_graph_timing_replays_one_capture_of_the_run(runtime):
    """`graph`: the run is captured once (every launch in order, after a run that loads
    every function), uploaded, and each warm-up and timed run is one replay of it between
    two events; the timing says so."""
    cuda, log = runtime
    module = generate(fixture("gather")).module
    inputs, weights = random_values(module)
    timing = cuda.time_kernels(module, inputs, weights, runs=3, warmup=2, graph=True)
    events = [e[0] for e in log[1:]]
    start = events.index("capture")
    assert events[:start] == ["tk_k_lookup", "tk_k_scale"]           # the loading run
    assert events[start:start + 4] == ["capture", "tk_k_lookup", "tk_k_scale", "end capture"]
    assert events[start + 4:] == ["graph upload"] + ["graph launch"] * 5
    assert timing.method == cuda.GRAPH_METHOD and len(timing.seconds) == 3
    assert timing.seconds[0] == pytest.approx((1.0 + 0.5) * 0.5e-3)   # events around a replay


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_a_run_that_cannot_be_captured_is_one_error(runtime, monkeypatch):
    """A launch the driver refuses while capturing ends the capture and names --graph; a
    module that runs control flow on the host is refused before any capture."""
    cuda, log = runtime
    module = generate(fixture("gather")).module
    inputs, weights = random_values(module)
    program = cuda.prepare(module)
    program.upload(inputs, weights)
    refused = sys.modules["cupy"].cuda.driver.CUDADriverError

    def refuse_while_capturing(self, buffers):
        if any(e[0] == "capture" for e in log) and not any(e[0] == "end capture" for e in log):
            raise refused("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
        log.append((self.entry,))
    monkeypatch.setattr(cuda.Launch, "__call__", refuse_while_capturing)
    with pytest.raises(TilekitError, match="could not be captured") as err:
        program.time(2, 1, graph=True)
    assert err.value.where == "--graph" and ("end capture", 0) in log
    monkeypatch.setattr(program, "steps", ())
    with pytest.raises(TilekitError, match="control flow on the host"):
        program.time(2, 1, graph=True)


def test_without_cupy_the_error_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    from tilekit.runtime import cuda
    with pytest.raises(TilekitError, match="CuPy is not importable"):
        cuda.device_description()


def test_a_different_runtime_cuh_is_refused(runtime):
    from dataclasses import replace
    cuda, _ = runtime
    module = generate(fixture("softmax")).module
    stale = replace(module, codegen={**module.codegen, "helpers": {"file": "runtime.cuh",
                                                                   "sha256": "0" * 64}})
    with pytest.raises(TilekitError, match="another runtime.cuh"):
        cuda.run_module(stale, *random_values(stale))


def mixed_module():
    """A float32 kernel, then a float16 one (TK_USE_HALF must still come before the header),
    then one that reads a rank-0 input."""
    from tilekit.ir.model import Module, Op, Tensor
    return Module(
        model="mixed", inputs=("a", "h", "s"), outputs=("y", "z", "r"),
        tensors={"a": Tensor((8,), "float32", "input"), "y": Tensor((8,), "float32", "output"),
                 "h": Tensor((8,), "float16", "input"), "z": Tensor((8,), "float16", "output"),
                 "s": Tensor((), "float32", "input"), "r": Tensor((8,), "float32", "output")},
        ops=(Op("f32", "y[i] = a[i] * 2"), Op("f16", "z[i] = h[i] * h[i]"),
             Op("sc", "r[i] = a[i] * s[]")))


def mixed_inputs():
    return {"a": np.arange(8, dtype=np.float32), "h": np.ones(8, np.float16),
            "s": np.array(3.0, np.float32)}


def test_unit_source_has_one_preamble_with_half_first():
    from tilekit.runtime import cuda
    module = generate(mixed_module()).module
    unit = cuda.unit_source(CodegenSection.read(module.codegen).kernels)
    assert unit.count('#include "runtime.cuh"') == 1
    assert unit.index("#define TK_USE_HALF 1") < unit.index('#include "runtime.cuh"')
    for entry in ("tk_k_f32", "tk_k_f16", "tk_k_sc"):
        assert f"\n{entry}(" in unit


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_mixed_float32_float16_unit_compiles(tmp_path, monkeypatch):
    """Exactly the unit `_load` builds, through nvcc (it failed when the sources were joined)."""
    from tilekit.codegen.nvcc import compile_unit
    from tilekit.runtime import cuda
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path))
    module = generate(mixed_module()).module
    compiled = compile_unit(cuda.unit_source(CodegenSection.read(module.codegen).kernels), "sm_80")
    assert {"tk_k_f32", "tk_k_f16", "tk_k_sc"} <= set(compiled.resources)


def test_rank0_input_is_uploaded_with_its_shape(runtime, monkeypatch):
    cuda, log = runtime
    monkeypatch.setattr(cuda, "usable_nvcc", lambda cupy: None)  # NVRTC: no compile here
    module = generate(mixed_module()).module
    cuda.run_module(module, mixed_inputs(), {})
    program = cuda.prepare(module)
    assert program.buffers["s"].shape == () and float(program.buffers["s"].data) == 3.0
    assert program.buffers["s"].sets == 1


def test_nvrtc_when_nvcc_is_newer_than_the_driver(monkeypatch, tmp_path):
    import tilekit.codegen.nvcc as nvcc
    log = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(log, driver=12040))
    from tilekit.runtime import cuda
    monkeypatch.setattr(cuda, "_PROGRAMS", {})
    monkeypatch.setattr(nvcc, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(nvcc, "nvcc_version", lambda path: "13.0.88")
    module = generate(mixed_module()).module
    program = cuda.prepare(module)
    assert log[0] == ("module", False, True)                 # NVRTC, not a cubin
    assert program.raw.code == cuda.unit_source(CodegenSection.read(module.codegen).kernels)
    monkeypatch.setattr(nvcc, "nvcc_version", lambda path: "12.4.131")
    assert cuda.usable_nvcc(sys.modules["cupy"]) == "/opt/cuda/bin/nvcc"


def test_shared_memory_over_the_device_limit_is_refused(monkeypatch, tmp_path):
    from tilekit.hw import load_profile
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy([], smem_optin=49152))
    from tilekit.runtime import cuda
    monkeypatch.setattr(cuda, "_PROGRAMS", {})
    module = big_tile_matmul()
    module = generate(module, load_profile("h100")).module
    with pytest.raises(TilekitError) as err:
        cuda.prepare(module)
    assert "needs 65536 bytes of shared memory" in err.value.message()
    assert "at most 49152" in err.value.message()


@pytest.mark.parametrize("change", ["control", "kind"])
def test_control_section_and_unknown_op_kind_refused(runtime, change):
    from dataclasses import replace
    cuda, _ = runtime
    module = generate(fixture("softmax")).module
    if change == "control":  # a malformed record (runtime control flow: test_grind_cuda.py)
        module = replace(module, control={"loops": []})
        with pytest.raises(TilekitError, match="control.loops"):
            cuda.prepare(module)
        return
    module = replace(module, ops=(replace(module.ops[0], kind="fancy"),) + module.ops[1:])
    what = "op kind 'fancy'"
    with pytest.raises(TilekitError) as err:
        cuda.prepare(module)
    assert what in err.value.message() and "the CUDA runtime" in err.value.message()
    assert "--device" not in err.value.message()


def test_weights_reuploaded_for_a_new_array_and_held_while_compared(runtime, monkeypatch):
    import gc
    import weakref
    cuda, _ = runtime
    monkeypatch.setattr(cuda, "usable_nvcc", lambda cupy: None)
    module = generate(fixture("gather")).module
    inputs, weights = random_values(module)
    cuda.run_module(module, inputs, weights)
    program = cuda.prepare(module)
    assert program.buffers["emb"].sets == 1
    fresh = {name: array.copy() for name, array in weights.items()}
    held = weakref.ref(fresh["emb"])
    cuda.run_module(module, inputs, fresh)
    assert program.buffers["emb"].sets == 2          # another array object: uploaded again
    del fresh
    gc.collect()
    # The program keeps the array it compares against, so its id can never be reused by a
    # new array that would then be mistaken for it.
    assert held() is not None


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_the_sizes_of_a_symbolic_module_share_one_build(runtime, tmp_path):
    """`tk-run --device cuda` on a symbolic module: its sizes run one template's build (the
    same cubin), each with its own size tables copied into the module's constant memory
    and its own launches; the run says so."""
    import onnx

    import tilekit
    from clirun import run_in
    from models.onnx_models import kv_cache_step
    from tilekit.cli import tk_import, tk_run
    from tilekit.ir.dims import instantiate
    from tilekit.runtime.family import CompiledFamily
    from tilekit.runtime.fold import fold_constants

    cuda, log = runtime
    onnx.save(kv_cache_step(), str(tmp_path / "kv.onnx"))
    compiled = tilekit.compile(tmp_path / "kv.onnx", [])
    family = CompiledFamily(compiled.module, compiled.weights, "cuda")
    programs = []
    for past in (3, 40):
        values = {"seq": 1, "past": past}
        instance, _ = fold_constants(instantiate(compiled.module, values), compiled.weights)
        programs.append(family.program(instance, values))
    a, b = programs
    assert family.builds == 1 and a.raw.path == b.raw.path and a.raw is not b.raw
    for p in programs:
        assert np.frombuffer(p.raw.globals["tk_iz"].bytes, np.int64).tolist() == \
            list(p.unit.ints)
    assert a.unit.ints != b.unit.ints
    assert [l.grid for l in a.launches] != [l.grid for l in b.launches]
    assert run_in(tk_import.main, ["kv.onnx", "-o", "kv.yaml"], tmp_path).exit_code == 0
    result = run_in(tk_run.main, ["kv.yaml", "--device", "cuda", "--dim", "seq=1",
                                  "--dim", "past=3,40", "--bench", "2"], tmp_path)
    assert result.exit_code == 0, result.output
    assert result.output.count("sizes read at run time") == 2, result.output


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_a_rolled_module_without_kernels_runs_the_profiles_kernels(runtime, tmp_path):
    """`tk-run --device cuda` on a module rolled for a GPU profile and never through
    tk-codegen generates its kernels for that profile and the device's arch: a float16
    contraction rolled for the A100 runs on mma.sync on this (fake) sm_90 device, as
    `tk-codegen --hw a100 --arch sm_90` makes it, not the CUDA-core kernels of no profile."""
    import onnx

    from clirun import run_in
    from models.onnx_models import mlp_epilogue
    from tilekit.cli import tk_import, tk_roll, tk_run

    cuda, log = runtime
    onnx.save(mlp_epilogue(tokens=64, d_in=64, d_out=64), str(tmp_path / "mlp.onnx"))
    assert run_in(tk_import.main, ["mlp.onnx", "--dtype", "fp16", "-o", "m.yaml"],
                  tmp_path).exit_code == 0
    assert run_in(tk_roll.main, ["m.yaml", "--hw", "a100", "-o", "r.yaml"],
                  tmp_path).exit_code == 0
    result = run_in(tk_run.main, ["r.yaml", "--device", "cuda"], tmp_path)
    assert result.exit_code == 0, result.output
    assert next(e for e in log if e[0] == "module")[1]      # a cubin built by nvcc
    (built,) = (tmp_path / "nvcc").glob("*/unit.cu")
    assert "tk_mma_16816_f16" in built.read_text()
