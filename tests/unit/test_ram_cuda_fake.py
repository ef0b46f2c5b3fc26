"""`tk-run --device cuda` on a tk-ram program, against a fake CuPy (no GPU here): the program
kernel comes from the module loaded for cooperative launches, the driver's occupancy is asked
before anything launches, a grid it cannot hold is refused with the limit named, and the
counters are zeroed before every launch. The kernels are compiled for real (nvcc)."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest

from tilekit import pipeline
from tilekit.errors import TilekitError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import ram_models  # noqa: E402

pytestmark = [pytest.mark.xdist_group("ram"),
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")]


class FakeArray:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.data = np.zeros(self.shape, self.dtype)

    def set(self, array):
        self.data = np.array(array, dtype=self.dtype).reshape(self.shape)

    def get(self):
        return self.data.copy()

    def fill(self, value):
        self.data[...] = value


def fake_cupy(blocks_per_sm: int, launches: list):
    """A CuPy with an sm_90 device of 132 SMs whose driver says `blocks_per_sm`; every
    launch is recorded as (entry, cooperative, grid, block, counters at launch)."""

    class Function:
        """As cupy.RawKernel: launched cooperatively when its module was loaded so (a call
        takes no such flag: CuPy passes the module's), its driver function under `kernel`."""

        def __init__(self, entry, cooperative):
            self.entry, self.cooperative = entry, cooperative
            self.kernel = types.SimpleNamespace(ptr=id(self))

        def __call__(self, grid, block, args, *, shared_mem=0):
            counters = None
            if self.entry.startswith("tk_program"):
                counters = args[-1].data.tolist()
                args[-1].data[...] = 7  # what a finished program leaves in its counters
            launches.append((self.entry, self.cooperative, grid, block, counters))

    class RawModule:
        def __init__(self, path=None, code=None, enable_cooperative_groups=False, **_):
            self.cooperative = enable_cooperative_groups

        def get_function(self, entry):
            return Function(entry, self.cooperative)

    class Device:
        compute_capability = "90"
        id = 0
        attributes = {"MultiProcessorCount": 132, "MaxSharedMemoryPerBlockOptin": 232448}

    class Stream:
        def synchronize(self):
            pass

    cuda = types.SimpleNamespace(
        Device=Device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, driverGetVersion=lambda: 13000,
                                      runtimeGetVersion=lambda: 13000),
        driver=types.SimpleNamespace(
            occupancyMaxActiveBlocksPerMultiprocessor=lambda ptr, threads, smem: blocks_per_sm),
        get_current_stream=lambda: Stream())
    return types.SimpleNamespace(
        cuda=cuda, RawModule=RawModule, uint32=np.uint32,
        empty=lambda shape, dtype: FakeArray(shape, dtype),
        zeros=lambda n, dtype: FakeArray((n,), dtype))


@pytest.fixture(scope="session")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cudafake")
    path = folder / "nasnet_cell.onnx"
    onnx.save(ram_models.nasnet_cell(), str(path))
    return pipeline.compile(path, passes=("roll", "ram", "codegen"), hw="h100", top_k=4,
                            ir_path=folder / "m.tk.yaml")


def _run(program, monkeypatch, blocks_per_sm):
    from tilekit.runtime import cuda

    launches: list = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(blocks_per_sm, launches))
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(program.module.tensors[n].shape).astype(np.float32)
              for n in program.module.inputs}
    prepared = cuda.CudaProgram(program.module)
    prepared.run(inputs, program.weights)
    prepared.run(inputs, program.weights)
    return launches


def test_program_launches_cooperatively_with_zeroed_counters(program, monkeypatch):
    launches = _run(program, monkeypatch, blocks_per_sm=8)
    programs = [ln for ln in launches if ln[0].startswith("tk_program")]
    persistent = [k for k in program.module.codegen["kernels"] if k.get("coresident")]
    assert persistent and len(programs) == 2 * len(persistent)  # each persistent kernel, run twice
    for entry, cooperative, grid, block, counters in programs:
        assert cooperative and counters == [0] * len(counters) and len(counters) > 1


def test_program_too_large_for_the_device_is_refused_before_any_launch(program, monkeypatch):
    from tilekit.runtime import cuda

    launches: list = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(0, launches))
    with pytest.raises(TilekitError, match=r"only 0 at once .*not launched"):
        cuda.CudaProgram(program.module)
    assert launches == []
