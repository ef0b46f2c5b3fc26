"""The CUDA runtime's control flow against a fake CuPy (no GPU here): host-driven loops,
scans and branches whose fake kernels compute their ops with the CPU reference (so the
host-side logic, copies, scan rows, conditions and counts are checked against the CPU
executor), launches and host synchronisations counted, and device loops launched
cooperatively only after the occupancy check. The real thing: tests/bench/test_gpu_grind.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.control_models import MODELS, feeds  # noqa: E402
from test_codegen_runtime_cuda import fake_cupy  # noqa: E402
from tilekit import pipeline  # noqa: E402
from tilekit.codegen.nvcc import find_nvcc  # noqa: E402
from tilekit.errors import TilekitError  # noqa: E402
from tilekit.ir.control import region_module, walk  # noqa: E402
from tilekit.onnx import import_model  # noqa: E402
from tilekit.runtime import run_module  # noqa: E402
from tilekit.runtime.occupancy import FixedOccupancy  # noqa: E402

pytestmark = [pytest.mark.xdist_group("control"),
              pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")]


class Buffer:
    """A device buffer: set/get, fill, and slices assigned from other buffers."""

    def __init__(self, shape, dtype):
        self.data = np.zeros(shape, dtype)
        self.shape, self.dtype = self.data.shape, self.data.dtype

    def set(self, value):
        assert value.shape == self.shape and value.dtype == self.dtype
        self.data[...] = value

    def get(self):
        return self.data.copy()

    def fill(self, value):
        self.data.fill(value)

    def __getitem__(self, index):
        view = Buffer.__new__(Buffer)
        view.data = self.data[index]
        view.shape, view.dtype = view.data.shape, view.data.dtype
        return view

    def __setitem__(self, index, other):
        self.data[index] = other.data


def cpu_steps(module):
    """Every op of the module and its regions, ready to run on the CPU, by op name."""
    from tilekit.runtime.cpu import prepare

    scopes = [module] + [region_module(scope, r, rec.name) for _, rec, scope in walk(module)
                         for r in rec.regions]
    return {step.op.name: step for m in scopes for step in prepare(m).steps}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A fake CuPy whose kernels run their ops on the CPU; `log` records every launch."""
    log: list = []
    cupy = fake_cupy(log)
    cupy.empty = Buffer
    cupy.zeros = lambda n, dtype: Buffer((n,), dtype)   # a program's progress counters
    state: dict = {}

    class Function:
        """As cupy.RawKernel: cooperative when its module was loaded so (no flag per call)."""

        def __init__(self, name, cooperative):
            self.name, self.cooperative = name, cooperative

        def __call__(self, grid, block, args, *, shared_mem=0):
            log.append((self.name, grid, self.cooperative))
            record = state["records"][self.name]
            if record.coresident:
                return  # a persistent kernel: not run by the fake
            from tilekit.runtime.cpu import run_op_whole

            env = {t: b.data for t, b in state["program"].buffers.items()}
            for op in record.ops:
                step = state["steps"][op]
                for name, value in zip(step.writes, run_op_whole(step, env)):
                    env[name][...] = value

    class RawModule:
        def __init__(self, enable_cooperative_groups=False, **_):
            self.cooperative = enable_cooperative_groups
            log.append(("module",))

        def get_function(self, name):
            return Function(name, self.cooperative)

    cupy.RawModule = RawModule
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setenv("TILEKIT_CACHE", str(tmp_path))
    from tilekit.runtime import cuda
    monkeypatch.setattr(cuda, "_PROGRAMS", {})

    def prepare(module, occupancy=None):
        from tilekit.ir.payloads import CodegenSection

        state["records"] = {k.entry: k for k in CodegenSection.read(module.codegen).kernels}
        state["steps"] = cpu_steps(module)
        program = cuda.CudaProgram(module, occupancy=occupancy or FixedOccupancy(per_sm=4))
        state["program"] = program
        return program
    return types.SimpleNamespace(cuda=cuda, log=log, prepare=prepare)


def built(name, place):
    model = MODELS[name]()
    imported = import_model(model)
    module = pipeline.run(imported.module.with_stage("import"), ["roll", "grind", "codegen"],
                          pipeline.Context.for_hw("h100", place=place))
    return imported, module, feeds(name, model)


@pytest.mark.parametrize("name", ["lstm_loop", "gru_scan", "greedy_decoder", "blockdrop",
                                  "nested_loops"])
def test_host_driven_control_matches_the_cpu(fake, name):
    imported, module, inputs = built(name, "host")
    program = fake.prepare(module)
    got = program.run(inputs, imported.weights)
    want = run_module(imported.module, inputs, imported.weights)
    for out, value in want.items():
        np.testing.assert_allclose(got[out], value, rtol=1e-5, atol=1e-6, err_msg=out)
    # what tk-grind estimated for the host-driven run is what ran (for the bounded loops)
    top = [rec for path, rec, _ in walk(module) if path.count(".control.") == 0]
    if name in ("lstm_loop", "gru_scan"):
        est = top[0].grind["estimate"]
        assert program.counts["syncs"] == est["host_syncs"]
        assert program.counts["launches"] == est["host_launches"] - est["trips"] * len(
            top[0].scans) + sum(1 for k in module.kernels if k.ops[0] not in
                                {r.name for r in top})


def test_device_loop_is_launched_cooperatively_after_the_check(fake):
    imported, module, inputs = built("lstm_loop", "device")
    program = fake.prepare(module, FixedOccupancy(per_sm=4))
    program.upload(inputs, imported.weights)
    program.launch_all()
    coop = [entry for entry in fake.log if len(entry) == 3 and entry[2]]
    assert [c[0] for c in coop] == ["tk_loop_lstm"]


def test_device_loop_over_coresidency_is_not_launched(fake):
    imported, module, inputs = built("lstm_loop", "device")
    kernel = next(k for k in module.codegen["kernels"] if k.get("coresident"))
    with pytest.raises(TilekitError) as err:  # refused when loaded, before any launch
        fake.prepare(module, FixedOccupancy(per_sm=0))
    assert "not launched" in err.value.message() and kernel["entry"] in err.value.message()
    assert not any(len(e) == 3 for e in fake.log)


def test_a_program_around_control_ops_launches_its_segments_in_order(fake):
    """tk-ram after tk-grind: the CUDA runtime walks the program's segments in order (a
    persistent segment is one launch of its program kernel, at its place), not the kernel
    groups' order."""
    model = MODELS["blockdrop"]()
    imported = import_model(model)
    module = pipeline.run(imported.module.with_stage("import"),
                          ["roll", "grind", "ram", "codegen"],
                          pipeline.Context.for_hw("h100", place="device"))
    kernels = module.codegen["kernels"]
    programs = [k["entry"] for k in kernels if k["shape"] == "program"]
    assert programs, "tk-ram packed nothing"
    program = fake.prepare(module)
    program.upload(feeds("blockdrop", model), imported.weights)
    program.launch_all()
    launched = [e[0] for e in fake.log if len(e) == 3]
    assert launched == [k["entry"] for k in kernels]  # every kernel once, in program order
