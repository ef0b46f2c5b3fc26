"""tilekit.runtime.cuda's logic against a fake CuPy (no GPU here): what it compiles, allocates,
uploads and launches, in which order, with which arguments. The real thing is tests/gpu/."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.codegen.nvcc import find_nvcc
from tilekit.errors import TilekitError

from codegen_support import fixture, random_values


class FakeArray:
    def __init__(self, shape, dtype):
        self.data = np.zeros(shape, dtype)
        self.sets = 0

    def set(self, value):
        assert value.shape == self.data.shape and value.dtype == self.data.dtype
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


def fake_cupy(log):
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12040,
        getDeviceProperties=lambda i: {"name": b"Fake GPU", "multiProcessorCount": 132})
    cuda.Device = lambda: types.SimpleNamespace(compute_capability="90", id=0)
    cuda.get_current_stream = lambda: types.SimpleNamespace(synchronize=lambda: None)

    class Event:
        clock = 0.0

        def record(self):
            Event.clock += 1.0
            self.t = Event.clock

        def synchronize(self):
            pass
    cuda.Event = Event
    cuda.get_elapsed_time = lambda a, b: (b.t - a.t) * 0.5  # ms
    cupy.cuda = cuda
    cupy.empty = FakeArray

    class RawModule:
        def __init__(self, path=None, code=None, backend=None, options=()):
            log.append(("module", path is not None, code is not None))
            self.functions = {}

        def get_function(self, name):
            return self.functions.setdefault(name, FakeFunction(name, log))
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
    from tilekit.ir.model import Module, Op, Tensor
    cuda, log = runtime
    module = Module(
        model="big", inputs=("a", "b"), outputs=("c",),
        tensors={"a": Tensor((256, 256), "float32", "input"),
                 "b": Tensor((256, 256), "float32", "input"),
                 "c": Tensor((256, 256), "float32", "output")},
        ops=(Op("mm", "c[i,j] += a[i,k] * b[k,j]",
                tile={"block": {"i": 128, "j": 128}, "thread": {"i": 8, "j": 8},
                      "step": {"k": 64}}),))
    module = generate(module, load_profile("h100")).module
    inputs = {n: np.ones((256, 256), np.float32) for n in ("a", "b")}
    timing = cuda.time_kernels(module, inputs, {}, runs=3, warmup=1, per_kernel=True)
    program = cuda.prepare(module)
    (launch,) = program.launches
    assert launch.smem_bytes == 65536 and launch.function.max_dynamic_shared_size_bytes == 65536
    assert all(entry[4] == 65536 for entry in log[1:])
    assert len(timing.seconds) == 3 and timing.per_kernel["tk_k_mm"]


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
