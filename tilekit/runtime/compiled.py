"""Compiled CPU code: a module's C++ kernels (`tk-codegen --target cpu`) run in this process.

`CpuProgram(module)` checks the recorded kernels against a fresh generation (as the CUDA
runtime does: recorded sources are input), builds them into a shared library
(tilekit.codegen.cxx: the system C++ compiler, cached) and loads it with ctypes. A run binds
inputs and weights into NumPy buffers, calls the kernels in order (each runs its grid's
blocks over the cores with OpenMP) and returns the outputs; control ops run as the generated
code says: a device loop inside the library, a host-placed one driven from here like the
CUDA runtime drives it (tilekit.runtime.cuda_control).

OpenMP's threads wait for the next kernel passively (`OMP_WAIT_POLICY=passive`, unless the
environment sets it): libgomp's default spins, and on cores shared with other processes a
spinning thread holds the core the thread with work needs, so every kernel waits a time slice
for its slower thread (ResNet-50 on 2 threads of a loaded 2-core VM: 650 ms spinning, 210-250
ms passive, onnxruntime 250-300 ms). libgomp reads the variable once, when the first library
is loaded.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Mapping

import numpy as np

from tilekit.codegen.cxx import build, unit_source
from tilekit.errors import TilekitError
from tilekit.expr.ops import numpy_dtype
from tilekit.ir.control import all_tensors
from tilekit.ir.graph import control_records
from tilekit.ir.model import Module
from tilekit.ir.payloads import CodegenSection


def is_cpu_code(module: Module) -> bool:
    """Does the module carry kernels generated for the CPU target?"""
    return bool(module.codegen) and (module.codegen or {}).get("target") == "cpu"

def with_cpu_code(module: Module, profile=None) -> Module:
    """`module` with CPU kernels: as it is when it has them, else with kernels generated for
    the CPU target in this process (what tk-codegen --target cpu writes; `profile`: the CPU
    profile the module was rolled for, if any). The build is cached, and refused without a
    C++ compiler (tilekit.codegen.cxx)."""
    if is_cpu_code(module):
        return module
    from tilekit.codegen.module import run_codegen

    return run_codegen(module, profile, target="cpu").module


def _index_checks(module: Module) -> list[tuple[str, str, tuple[str, ...], dict]]:
    """(where, type, inputs, attrs) of each top-level opaque op whose inputs hold indices."""
    from tilekit.opaque import index_bounds

    checks = []
    for i, op in enumerate(module.ops):
        if op.kind != "opaque":
            continue
        spec = op.opaque
        reads = tuple(spec.get("inputs", ()))
        attrs = dict(spec.get("attrs") or {})
        specs = [(tuple(module.tensors[n].shape), "") if n else None for n in reads]
        if index_bounds(spec["type"], specs, attrs):
            checks.append((f"ops[{i}] ({op.name})", spec["type"], reads, attrs))
    return checks


class HostBuffer(np.ndarray):
    """A NumPy array with the buffer methods the host-driven control steps use
    (tilekit.runtime.cuda_control: `get`, `set`, `fill`, item assignment)."""

    def get(self) -> np.ndarray:
        return np.asarray(self)

    def set(self, value) -> None:
        self[...] = np.asarray(value).reshape(self.shape)


class _Launch:
    """One kernel call: the library function and the buffers it takes, in order."""

    def __init__(self, fn, args: tuple[str, ...], name: str) -> None:
        self.fn, self.args, self.name = fn, args, name
        #: (kernel, seconds) of each call while profiling (CpuProgram.profile), else None
        self.timings: list[tuple[str, float]] | None = None

    def __call__(self, buffers: Mapping[str, np.ndarray]) -> None:
        pointers = [buffers[a].ctypes.data for a in self.args]
        if self.timings is None:
            self.fn(*pointers)
            return
        start = time.perf_counter()
        self.fn(*pointers)
        self.timings.append((self.name, time.perf_counter() - start))


class CpuProgram:
    """A module's compiled CPU kernels loaded in this process, with their buffers."""

    def __init__(self, module: Module, threads: int | None = None) -> None:
        from tilekit.codegen.recorded import check_recorded_kernels
        from tilekit.runtime.cpu import check_runnable

        check_runnable(module, "the compiled CPU runtime", control=True)
        check_recorded_kernels(module)
        section = CodegenSection.read(module.codegen)
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")     # the module docstring
        self.lib = ctypes.CDLL(str(build(unit_source(section.kernels))))
        if threads is not None:
            self.lib.tk_set_threads(int(threads))
        self.threads = int(self.lib.tk_get_threads())
        declared = all_tensors(module)
        self.buffers: dict[str, np.ndarray] = {}
        self.launches: list[_Launch] = []
        written: set[str] = set()
        for k in section.kernels:
            for name in k.args:
                self._allocate(name, declared)
            fn = getattr(self.lib, k.entry)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * len(k.args)
            self.launches.append(_Launch(fn, k.args, k.name))
            written.update(k.writes)
        self.outputs = tuple(module.outputs)
        self.inputs = tuple(module.inputs)
        self.weight_names = tuple(n for n, t in module.tensors.items() if t.role == "weight")
        self.counts = {"launches": 0, "syncs": 0}
        self.steps = None
        self.trims: dict[str, str] = {}
        records = control_records(module)
        if records:
            self._control(module, section, declared, written)
        self.index_checks = _index_checks(module)
        self.passthrough = tuple(o for o in module.outputs if o not in written)
        self.bound: dict[str, Any] = {}     # weight -> the array last copied into its buffer
        self.written = frozenset(written)   # buffers a kernel writes: re-bound every run

    def _allocate(self, name: str, declared) -> None:
        if name not in self.buffers:
            t = declared[name]
            self.buffers[name] = np.zeros(tuple(t.shape), numpy_dtype(t.dtype)).view(HostBuffer)

    def _control(self, module: Module, section: CodegenSection, declared, written) -> None:
        from tilekit.ir.control import walk
        from tilekit.runtime.control import kept_counts
        from tilekit.runtime.cuda_control import build_steps

        for _, rec, _ in walk(module):
            names = [*rec.explicit_reads(), *rec.writes()]
            for region in rec.regions:
                names += [*region.inputs, *region.outputs]
            for name in names:
                self._allocate(name, declared)
        for rec in control_records(module).values():
            written.update(rec.writes())
        by_group: dict[str, list[Any]] = {}
        for k, launch in zip(section.kernels, self.launches):
            by_group.setdefault(k.group, []).append(launch)
        self.steps = build_steps(module, section.extra.get("control", {}), by_group)
        self.trims = kept_counts(module)

    def run(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
        for name in self.inputs:
            if name in self.buffers:
                self.buffers[name].set(inputs[name] if name in inputs else weights[name])
        for name in self.weight_names:
            if name in self.buffers and name not in inputs:
                self._bind_weight(name, weights[name])
        if self.steps is not None:
            from tilekit.runtime.cuda_control import run_steps
            run_steps(self, self.steps)
        else:
            for launch in self.launches:
                launch(self.buffers)
        self._check_indices(inputs, weights)
        out = {}
        for name in self.outputs:
            if name in self.passthrough:
                out[name] = np.array(inputs[name] if name in inputs else weights[name])
            else:
                out[name] = np.array(self.buffers[name])
        for name, count in self.trims.items():
            out[name] = out[name][:int(np.asarray(self.buffers[count]).reshape(-1)[0])]
        return out

    def _check_indices(self, inputs, weights) -> None:
        """Refuse the run when an opaque op's indices were out of range (the kernel read 0
        or skipped them: a kernel cannot raise), as the reference executor refuses them."""
        from tilekit.opaque import check_indices

        for where, name, reads, attrs in self.index_checks:
            args = [None if not n else self.buffers[n] if n in self.buffers
                    else inputs.get(n, weights.get(n)) for n in reads]
            try:
                check_indices(name, args, attrs)
            except TilekitError as exc:
                raise exc.located(where) from None

    def _bind_weight(self, name: str, value) -> None:
        """Copy a weight into its buffer unless this very array was copied last time (a run
        per request must not copy a model's weights every time). An array changed in place
        between runs is the same object: pass a new array to re-bind it."""
        if self.bound.get(name) is value and name not in self.written:
            return
        self.buffers[name].set(value)
        self.bound[name] = value

    def profile(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]
                ) -> tuple[dict[str, np.ndarray], list[tuple[str, float]]]:
        """One run with each kernel call timed: (outputs, [(kernel, seconds)] in call
        order; a kernel inside a loop is listed per call)."""
        timings: list[tuple[str, float]] = []
        for launch in self.launches:
            launch.timings = timings
        try:
            return self.run(inputs, weights), timings
        finally:
            for launch in self.launches:
                launch.timings = None

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor a kernel reads or writes, as the last run left it."""
        return {name: np.array(b) for name, b in self.buffers.items()}


__all__ = ["CpuProgram", "HostBuffer", "is_cpu_code"]
