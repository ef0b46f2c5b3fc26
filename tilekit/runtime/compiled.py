"""Compiled CPU code: a module's C++ kernels (`tk-codegen --target cpu`) run in this process.

`CpuProgram(module)` checks the recorded kernels against a fresh generation (as the CUDA
runtime does: recorded sources are input), builds them into a shared library
(tilekit.codegen.cxx: the system C++ compiler, cached) and loads it with ctypes. A run binds
inputs and weights into NumPy buffers (an input the kernels only read, given as a
C-contiguous array of its element type, is read in place, without a copy), calls the
kernels in order (each runs its grid's blocks over the cores with OpenMP) and returns the
outputs (the buffers the kernels wrote them in, handed over: the next run gets fresh ones); control ops run as the generated
code says: a device loop inside the library, a host-placed one driven from here like the
CUDA runtime drives it (tilekit.runtime.cuda_control).
"""

from __future__ import annotations

import ctypes
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


def _bindable(value, buffer: np.ndarray) -> bool:
    """Can the kernels read `value` where they would read `buffer` (same element type and
    count, C-contiguous, aligned)? Then a run passes it in place of a copy."""
    return isinstance(value, np.ndarray) and value.dtype == buffer.dtype \
        and value.size == buffer.size and value.flags.c_contiguous and value.flags.aligned


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
        self.last: Mapping[str, np.ndarray] = self.buffers   # the last run's buffers

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
        buffers: Mapping[str, np.ndarray] = self.buffers
        direct = {}
        for name in self.inputs:
            if name in self.buffers:
                value = inputs[name] if name in inputs else weights[name]
                if self.steps is None and name not in self.written \
                        and _bindable(value, self.buffers[name]):
                    direct[name] = value   # read in place: no copy of a large input
                else:
                    self.buffers[name].set(value)
        for name in self.weight_names:
            if name in self.buffers and name not in inputs:
                self._bind_weight(name, weights[name])
        if direct:
            buffers = {**self.buffers, **direct}
        if self.steps is not None:
            from tilekit.runtime.cuda_control import run_steps
            run_steps(self, self.steps)
        else:
            for launch in self.launches:
                launch(buffers)
        self._check_indices(inputs, weights, buffers)
        out = {}
        self.last = dict(buffers)
        for name in self.outputs:
            if name in self.passthrough:
                out[name] = np.array(inputs[name] if name in inputs else weights[name])
            elif self.steps is None and name not in out:
                # handed over, not copied: the kernels write every element of an output, so
                # the next run writes a fresh buffer (a copy of a large output costs as much
                # as a memory-bound kernel)
                out[name] = self.buffers[name].view(np.ndarray)
                self.buffers[name] = np.empty_like(out[name]).view(HostBuffer)
            else:
                out[name] = np.array(self.buffers[name])
        for name, count in self.trims.items():
            out[name] = out[name][:int(np.asarray(self.buffers[count]).reshape(-1)[0])]
        return out

    def _check_indices(self, inputs, weights, buffers) -> None:
        """Refuse the run when an opaque op's indices were out of range (the kernel read 0
        or skipped them: a kernel cannot raise), as the reference executor refuses them."""
        from tilekit.opaque import check_indices

        for where, name, reads, attrs in self.index_checks:
            args = [None if not n else buffers[n] if n in buffers
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
        return {name: np.array(b) for name, b in self.last.items()}


__all__ = ["CpuProgram", "HostBuffer", "is_cpu_code"]
