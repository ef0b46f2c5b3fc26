"""Compiled CPU code: a module's C++ kernels (`tk-codegen --target cpu`) run in this process.

`CpuProgram(module)` checks the recorded kernels against a fresh generation (as the CUDA
runtime does: recorded sources are input), builds them into a shared library
(tilekit.codegen.cxx: the system C++ compiler, cached) with the unit's program entry
(tilekit.codegen.cpu_program) and loads it with ctypes. The buffers are allocated once and
their pointers bound into the argument table. A run binds inputs and weights into the
buffers (an input the kernels only read, given as a C-contiguous array of its element type,
is read in place: its table entries point at it), runs the kernels with ONE call (`tk_run`:
every kernel in order in one OpenMP team, team barriers only between dependent kernels) and
returns the outputs (the buffers the kernels wrote them in, handed over: the next run writes
fresh ones, rebound in the table). Control ops run as the generated code says: a device loop
inside the library, a host-placed one driven from here like the CUDA runtime drives it
(tilekit.runtime.cuda_control), each straight run of kernels between host steps one `tk_run`
call (such a program copies its inputs and outputs). A module with a CPU plan of tk-ram
(`program` section, tilekit.ram.cpu) runs its persistent segments with `tk_run_plan` (vEUs as
threads) and its other kernels with `tk_run`. `CpuProgram.profile` times every kernel in C++
(a barrier after each while profiling); `per_kernel=True` calls each kernel's own entry
instead (one ctypes call and one parallel region per kernel: what runs before the program
entry, kept to compare against).

Inside a run the team's barriers are the unit's own (tk_team_barrier: a short spin that
adapts, then a futex; docs/run.md). Between runs OpenMP's idle threads wait passively
(`OMP_WAIT_POLICY=passive`, unless the environment sets it): libgomp's default spins, and on
cores shared with other processes a spinning thread holds the core the thread with work
needs (ResNet-50 on 2 threads of a loaded 2-core VM: 650 ms spinning, 210-250 ms passive,
onnxruntime 250-300 ms). libgomp reads the variable once, when the first library is loaded.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from typing import Any, Mapping
from dataclasses import replace

import numpy as np

from tilekit.codegen.cxx import build
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


#: Where the runtime's buffers start: a cache line, and an AVX-512 vector. NumPy starts a large
#: array 16 bytes past a page (the allocator's header), so every 64-byte vector access of it
#: spans two cache lines: ResNet-50's 1 x 1 expansions (256 x 3136, K = 64) took 1.8x as
#: long on one Xeon core (AVX-512) as with their buffers aligned.
BUFFER_ALIGN = 64


def aligned_buffer(shape, dtype, zero: bool = True) -> "HostBuffer":
    """A C-contiguous host buffer of `shape` and `dtype` whose data start on `BUFFER_ALIGN`
    bytes (zeros, or uninitialised with `zero` false)."""
    dtype = np.dtype(dtype)
    # math.prod: np.prod of a tuple takes 3.6 us, and a run makes a buffer per output
    nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
    raw = (np.zeros if zero else np.empty)(nbytes + BUFFER_ALIGN, np.uint8)
    start = -raw.ctypes.data % BUFFER_ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(tuple(shape)).view(HostBuffer)


def _bindable(value, buffer: np.ndarray) -> bool:
    """Can the kernels read `value` where they would read `buffer` (same element type and
    count, C-contiguous, aligned)? Then a run passes it in place of a copy."""
    return isinstance(value, np.ndarray) and value.dtype == buffer.dtype \
        and value.size == buffer.size and value.flags.c_contiguous and value.flags.aligned


def _renamed(kernels, views: Mapping[str, str]) -> tuple:
    """`kernels` with each view output among their arguments named as the buffer it shares
    (`CpuProgram._views`), so that the barriers between kernels see one buffer."""
    if not views:
        return tuple(kernels)

    def root(name: str) -> str:
        while name in views:
            name = views[name]
        return name
    return tuple(replace(k, args=tuple(root(a) for a in k.args),
                         writes=tuple(root(w) for w in k.writes)) for k in kernels)


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


class _Run:
    """A straight run of kernels (indices into the unit's kernels) as one `tk_run` call; it
    stands for its kernels wherever the control steps hold launches."""

    def __init__(self, program: "CpuProgram", seq: tuple[int, ...]) -> None:
        from tilekit.codegen.cpu_program import barriers, parallel_run

        kernels = program.kernel_records
        self.program, self.seq = program, seq
        self.kernels = len(seq)         # launches counted (tilekit.runtime.cuda_control)
        self.names = tuple(kernels[k].name for k in seq)
        self.c_seq = (ctypes.c_int * max(1, len(seq)))(*seq)
        wait = barriers(program.ordering, seq) if program.overlap else (True,) * len(seq)
        self.c_wait = (ctypes.c_ubyte * max(1, len(seq)))(*wait)
        self.parallel = int(parallel_run(kernels, seq))
        self.c_times = (ctypes.c_double * (len(seq) + 1))()

    def __call__(self, buffers: Mapping[str, np.ndarray]) -> None:
        p = self.program
        if not self.seq:
            return
        timings = p.timings
        p.lib.tk_run(p.table, self.c_seq, self.c_wait, len(self.seq), self.parallel,
                     self.c_times if timings is not None else None)
        if timings is not None:
            t = self.c_times
            timings.extend((name, t[i + 1] - t[i]) for i, name in enumerate(self.names))


class _PlanSegment:
    """A persistent segment of a tk-ram CPU plan: one `tk_run_plan` call; the kernels it
    holds run op by op (`fallback`) when the team cannot hold its vEUs."""

    def __init__(self, program: "CpuProgram", segment: int, fallback: _Run) -> None:
        self.program, self.segment, self.fallback = program, segment, fallback
        self.kernels = fallback.kernels

    def __call__(self, buffers: Mapping[str, np.ndarray]) -> None:
        p = self.program
        if p.timings is not None:        # per-kernel times: op by op
            self.fallback(buffers)
            return
        if p.lib.tk_run_plan(p.table, self.segment):
            self.fallback(buffers)


#: Per loaded library whose sizes are parameters, the size tables it holds (the program's
#: `sizes` that set them last).
_TABLES_SET: dict[str, Any] = {}


class CpuProgram:
    """A module's compiled CPU kernels loaded in this process, with their buffers."""

    def __init__(self, module: Module, threads: int | None = None,
                 per_kernel: bool = False, use_plan: bool = True, overlap: bool = True,
                 unit=None, profile=None) -> None:
        """`threads`: the team's size (default: OpenMP's). `per_kernel`: call each kernel's
        own entry (one ctypes call and parallel region each). `use_plan`: run a tk-ram CPU
        plan's persistent segments on their vEUs (else op by op). `overlap`: no barrier
        between independent kernels in a row (else one after every kernel: strictly op by
        op). `unit`: the build to run instead of the module's own unit, a template whose
        sizes are parameters with this module's size tables (tilekit.codegen.parametric:
        the same kernels, the same argument table); every run sets the tables first, since
        other programs of other sizes may share the loaded library. Such a module's kernels
        were generated in this process (tilekit.runtime.family), so they are not generated
        again to check them, as recorded kernels are. `profile`: the one the kernels were
        generated for, when no file holds it (`Profile.with_cpu`: a shipped profile scaled to
        the cores in hand); the check tries it first."""
        from tilekit.codegen.cpu_program import program_unit
        from tilekit.codegen.recorded import check_recorded_kernels
        from tilekit.runtime.cpu import check_runnable

        check_runnable(module, "the compiled CPU runtime", control=True)
        if unit is None:
            check_recorded_kernels(module, profile=profile)
        section = CodegenSection.read(module.codegen)
        self.kernel_records = section.kernels
        if unit is None:
            source, self.plan = program_unit(module, plan=use_plan)
        else:
            source, self.plan = unit.source, None
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")     # the module docstring
        self.lib = ctypes.CDLL(str(build(source)))
        self.sizes = None if unit is None else (np.array(unit.ints, np.int64),
                                                np.array(unit.floats or (0.0,), np.float64))
        if self.sizes is not None:
            self.lib.tk_set_sizes.restype = None
            self.lib.tk_set_sizes.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.tk_run.restype = None
        self.lib.tk_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        if self.plan is not None:
            self.lib.tk_run_plan.restype = ctypes.c_int
            self.lib.tk_run_plan.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.per_kernel = per_kernel
        self.overlap = overlap
        #: [(kernel, seconds)] while profiling (CpuProgram.profile), else None
        self.timings: list[tuple[str, float]] | None = None
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
        records = control_records(module)
        #: {output: input} of kernels that copy a tensor unchanged, the output given the
        #: input's memory and the kernel not run (`_views`)
        self.views = {} if records or self.plan is not None else self._views(section)
        self.skipped = frozenset(i for i, k in enumerate(section.kernels)
                                 if k.writes and k.writes[0] in self.views)
        #: the records barriers are placed by: a view's reads and writes under its input's name
        self.ordering = _renamed(section.kernels, self.views)
        self.counts = {"launches": 0, "syncs": 0}
        self.steps = None
        self.trims: dict[str, str] = {}
        self.overruns: tuple = ()
        if records:
            self._control(module, section, declared, written)
        # the argument table: every kernel's pointers in kernel order; `slots` are each
        # buffer's entries, repointed when a run reads an input in place or hands an output
        # over (`_point`)
        args = [a for k in section.kernels for a in k.args]
        self.table = (ctypes.c_void_p * max(1, len(args)))(
            *[self.buffers[a].ctypes.data for a in args])
        self.slots: dict[str, list[int]] = {}
        for i, a in enumerate(args):
            self.slots.setdefault(a, []).append(i)
        if not per_kernel:
            self._batch(section)
        self.index_checks = _index_checks(module)
        self.passthrough = tuple(o for o in module.outputs if o not in written)
        self.bound: dict[str, Any] = {}     # weight -> the array last copied into its buffer
        self.written = frozenset(written)   # buffers a kernel writes: re-bound every run
        self.last: Mapping[str, np.ndarray] = self.buffers   # the last run's buffers

    def _batch(self, section: CodegenSection) -> None:
        """Kernel calls as runs of the program entry: the whole module as one run (with a
        plan: its segments), or each control step's kernels as one."""
        from dataclasses import replace as _replace

        from tilekit.runtime.cuda_control import ControlStep, KernelStep

        index = {id(launch): k for k, launch in enumerate(self.launches)}
        if self.steps is None:
            if self.plan is not None:
                self.runs = self._plan_runs()
            else:
                self.runs = [_Run(self, tuple(i for i in range(len(self.launches))
                                              if i not in self.skipped))]
            return

        def batched(steps):
            """Each run of consecutive kernel steps as one `tk_run` call (a region's kernels
            are a step each: one call per kernel cost an LSTM cell's loop about 100 us per
            iteration on a Xeon core)."""
            out: list = []
            for step in steps:
                if isinstance(step, KernelStep):
                    seq = tuple(index[id(launch)] for launch in step.launches)
                    if out and isinstance(out[-1], KernelStep):
                        before = out.pop().launches
                        seq = (before[0].seq if before else ()) + seq
                    out.append(_replace(step, launches=(_Run(self, seq),) if seq else ()))
                else:
                    out.append(_replace(step, regions=tuple(batched(r) for r in step.regions)))
            return tuple(out)

        self.steps = batched(self.steps)

    def _plan_runs(self) -> list:
        """The runs of a module with a CPU plan: per segment of the plan in order, its
        persistent segment or its kernels as one run."""
        runs: list = []
        for s, (kind, seq) in enumerate(self.plan.order):
            fallback = _Run(self, seq)
            runs.append(_PlanSegment(self, self.plan.persistent[s], fallback)
                        if kind == "persistent" else fallback)
        return runs

    def _allocate(self, name: str, declared) -> None:
        if name not in self.buffers:
            t = declared[name]
            self.buffers[name] = aligned_buffer(tuple(t.shape), numpy_dtype(t.dtype))

    def _views(self, section: CodegenSection) -> dict[str, str]:
        """{output: input} of the kernels whose schedule names a `view` (tilekit.codegen.cpu:
        a Reshape, Flatten or Squeeze, the same bytes in the same order), now sharing the
        input's buffer: where both are the module's own intermediates (a module input may be
        read in place from the caller's array, an output is handed over after each run, a
        weight is bound to its buffer) of the same dtype and bytes, and the kernel alone
        writes its output. In a module without control ops or a tk-ram plan (their kernels
        run from host steps and compiled segments: they keep the copy)."""
        fixed = {*self.inputs, *self.outputs, *self.weight_names}
        writers: dict[str, int] = {}
        for k in section.kernels:
            for w in k.writes:
                writers[w] = writers.get(w, 0) + 1
        views: dict[str, str] = {}
        for k in section.kernels:
            src = k.schedule.get("view")
            if not isinstance(src, str) or len(k.writes) != 1:
                continue
            out = k.writes[0]
            if src in fixed or out in fixed or writers.get(out) != 1 or src == out:
                continue
            a, b = self.buffers[src], self.buffers[out]
            if a.dtype != b.dtype or a.nbytes != b.nbytes:
                continue
            self.buffers[out] = a.reshape(b.shape)
            views[out] = src
        return views

    def _control(self, module: Module, section: CodegenSection, declared, written) -> None:
        from tilekit.ir.control import walk
        from tilekit.runtime.control import kept_counts, overrun_checks
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
        self.overruns = overrun_checks(module)

    def run(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
        buffers: Mapping[str, np.ndarray] = self.buffers
        direct = {}
        changed = False         # a weight's values may differ from the last run's
        for name in self.inputs:
            if name in self.buffers:
                value = inputs[name] if name in inputs else weights[name]
                changed = changed or name in self.weight_names
                if self.steps is None and name not in self.written \
                        and _bindable(value, self.buffers[name]):
                    direct[name] = value   # read in place: no copy of a large input
                else:
                    self.buffers[name].set(value)
        for name in self.weight_names:
            if name in self.buffers and name not in inputs:
                changed = self._bind_weight(name, weights[name]) or changed
        if changed:     # the weights' packed panels are stale (runtime_cpu.h tk_packed_panels)
            self.lib.tk_weights_changed()
        self._set_sizes()
        for name in self.inputs:
            if name in self.slots:
                self._point(name, direct.get(name, self.buffers[name]))
        if direct:
            buffers = {**self.buffers, **direct}
        if self.steps is not None:
            from tilekit.runtime.control import check_overruns
            from tilekit.runtime.cuda_control import run_steps
            run_steps(self, self.steps)
            check_overruns(self.overruns, self._count)
        elif self.per_kernel:
            for k, launch in enumerate(self.launches):
                if k not in self.skipped:
                    launch(buffers)
        else:
            for run in self.runs:
                run(buffers)
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
                self.buffers[name] = aligned_buffer(out[name].shape, out[name].dtype,
                                                    zero=False)
                self._point(name, self.buffers[name])
            else:
                out[name] = np.array(self.buffers[name])
        for name, count in self.trims.items():
            out[name] = out[name][:self._count(count)]
        return out

    def _count(self, name: str) -> int:
        """A loop's count tensor after the run (its iterations: the trims, the overruns)."""
        return int(np.asarray(self.buffers[name]).reshape(-1)[0])

    def _set_sizes(self) -> None:
        """A template's size tables at this program's sizes (see `__init__`), unless this
        program set them last (a ctypes call is a few microseconds of a decode step)."""
        if self.sizes is not None and _TABLES_SET.get(self.lib._name) is not self.sizes:
            self.lib.tk_set_sizes(self.sizes[0].ctypes.data, self.sizes[1].ctypes.data)
            _TABLES_SET[self.lib._name] = self.sizes

    def _point(self, name: str, array: np.ndarray) -> None:
        """The argument table's entries for buffer `name` at `array`."""
        address = array.ctypes.data
        for i in self.slots.get(name, ()):
            self.table[i] = address

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

    def _bind_weight(self, name: str, value) -> bool:
        """Copy a weight into its buffer unless this very array was copied last time (a run
        per request must not copy a model's weights every time); whether it copied. An array
        changed in place between runs is the same object: pass a new array to re-bind it."""
        if self.bound.get(name) is value and name not in self.written:
            return False
        self.buffers[name].set(value)
        self.bound[name] = value
        return True

    def profile(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]
                ) -> tuple[dict[str, np.ndarray], list[tuple[str, float]]]:
        """One run with each kernel call timed: (outputs, [(kernel, seconds)] in call
        order; a kernel inside a loop is listed per call)."""
        timings: list[tuple[str, float]] = []
        self.timings = timings
        for launch in self.launches:
            launch.timings = timings
        try:
            return self.run(inputs, weights), timings
        finally:
            self.timings = None
            for launch in self.launches:
                launch.timings = None

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor a kernel reads or writes, as the last run left it."""
        return {name: np.array(b) for name, b in self.last.items()}


__all__ = ["CpuProgram", "HostBuffer", "is_cpu_code"]
