"""Running tile-IR modules: the CPU reference executor, device selection, data in and out.

- `tilekit.runtime.cpu`: `run_module`, `prepare` / `Program`, execution modes;
- `tilekit.runtime.io`: weights, inputs and outputs, with their checks;
- `tilekit.runtime.fold`: what a module computes from its weights alone, computed once;
- `tilekit.runtime.family`: a symbolic module's compiled code, one build per structure;
- `tilekit.runtime.check`: comparison with onnxruntime or the CPU reference;
- `tilekit.runtime.bench`: timing and the device's name;
- `tilekit.runtime.cuda`: the same `run_module` on an NVIDIA GPU (through CuPy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from tilekit.errors import TilekitError
from tilekit.ir.model import Module
from tilekit.runtime.cpu import (OP_RUNNERS, Program, Step, op_runner, prepare, register_mode,
                                 run_module)

DEVICES = ("cpu", "cuda")

__all__ = ["DEVICES", "OP_RUNNERS", "Backend", "Program", "Step", "backend", "prepare",
           "register_mode", "run_module"]

Runner = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Backend:
    """A module made ready on a device: `run(inputs, weights) -> outputs`, and the device's
    name for reports."""

    device: str
    description: str
    run: Runner
    #: Device-side timing `(inputs, weights, runs, warmup, graph=False) -> Timing` where the
    #: device has its own clock (CUDA events; `graph`: each run replayed as one CUDA graph);
    #: None means wall-clock timing of `run`.
    bench: Callable[..., Any] | None = None
    #: `(inputs, weights) -> every tensor the run computed` (intermediates included), for
    #: `tk-run --check-tensors`.
    trace: Runner | None = None
    #: `(inputs, weights) -> (outputs, [(kernel, seconds)])`: each kernel call timed (the
    #: compiled CPU code: one run; CUDA: events, mean of a few runs), for `tk-run --report`.
    profile: Callable[..., Any] | None = None


def default_mode(module: Module, device: str) -> str:
    """The mode a run takes when none is given: on the CPU, compiled code (the module's own
    CPU kernels, or kernels generated for this CPU when it has none) wherever a C++ compiler
    is found, else the reference executor's whole ops."""
    from tilekit.codegen.cxx import find_cxx
    from tilekit.runtime.compiled import is_cpu_code

    if device != "cpu":
        return "whole"
    return "compiled" if is_cpu_code(module) or find_cxx() is not None else "whole"


def backend(module: Module, device: str = "cpu", mode: str | None = None,
            threads: int | None = None, profile=None, family=None, values=None) -> Backend:
    """Prepare `module` for `device` ("cpu" or "cuda"); refuses what that device cannot run.

    `mode` is the CPU execution mode: "compiled" (the module's C++ kernels, generated here
    for the CPU target when it has none, with `profile` when it was rolled for a CPU profile,
    else with the shipped profile of this machine's SIMD ISA scaled to the threads
    (`tilekit.hw.host_cpu_profile`): the default wherever a C++ compiler is found), "whole"
    (the NumPy reference executor), or one added with `register_mode` ("tiled", "program");
    the CUDA runtime runs the generated kernels and has no modes, so any other mode is
    refused there; with `profile` (the GPU profile a module without kernels was rolled for)
    they are generated for it and the device's arch. `threads`: the compiled code's threads
    (default: OpenMP's, every core).
    `family` (tilekit.runtime.family): for an instance of a symbolic module at `values`,
    the compiled code its sizes share.
    """
    from tilekit.runtime.bench import cpu_description

    mode = mode or default_mode(module, device)
    if device == "cpu" and mode == "compiled":
        from tilekit.runtime.compiled import CpuProgram, is_cpu_code, with_cpu_code
        if profile is None and not is_cpu_code(module):
            from tilekit.hw import host_cpu_profile
            from tilekit.runtime.bench import cpu_threads
            profile = host_cpu_profile(threads or cpu_threads())
        if family is not None and values is not None and not is_cpu_code(module):
            compiled = family.program(module, values, threads, profile)
        else:
            compiled = CpuProgram(with_cpu_code(module, profile), threads, profile=profile)
        from tilekit.runtime.bench import cpu_model
        # (a build shared by the sizes of one structure: tilekit.runtime.family)
        shared = "" if compiled.sizes is None else ", sizes read at run time"
        return Backend("cpu", f"cpu ({cpu_model()}, {compiled.threads} "
                       f"thread{'s' if compiled.threads != 1 else ''}), compiled{shared}",
                       compiled.run, trace=lambda i, w: (compiled.run(i, w),
                                                         compiled.tensors())[1],
                       profile=compiled.profile)

    if device == "cpu" and mode == "program":  # tk-ram's plan, task by task (runtime.program)
        from tilekit.runtime.bench import cpu_description
        from tilekit.runtime.program import program_runner
        run, trace = program_runner(module)
        return Backend("cpu", cpu_description(), run, trace=trace)
    if device == "cpu":
        program = prepare(module)
        op_runner(mode)  # an unknown mode fails here, before any data is loaded
        def trace(inputs, weights):
            tensors: dict[str, np.ndarray] = {}
            program.run(inputs, weights, mode=mode, trace=tensors)
            return tensors

        return Backend("cpu", cpu_description(),
                       lambda inputs, weights: program.run(inputs, weights, mode=mode),
                       trace=trace)
    if device == "cuda":
        if mode != "whole":
            if mode != "program":
                op_runner(mode)  # an unknown mode is named as such
            raise TilekitError(f"execution mode '{mode}' is for the CPU executor only", "--mode",
                               "the CUDA runtime runs the generated kernels: drop --mode, or "
                               "use --device cpu")
        from tilekit.runtime import cuda

        # refuses what it cannot run, builds the kernels, early; a symbolic module's size
        # through the build its sizes share
        if family is not None and values is not None and not module.codegen:
            program = family.program(module, values, profile=profile)
        else:
            program = cuda.prepare(module, profile)

        def trace(inputs, weights):
            program.run(inputs, weights)
            return program.tensors()

        def bench(inputs, weights, runs, warmup, graph=False):
            program.upload(inputs, weights)
            return program.time(runs, warmup, graph=graph)

        shared = "" if program.unit is None else ", sizes read at run time"
        return Backend("cuda", cuda.device_description() + shared, program.run, bench,
                       trace=trace,
                       # per-kernel events need every kernel once per run, in order
                       profile=program.profile if program.steps is None else None)
    raise TilekitError(f"unknown device '{device}'", "--device",
                       f"known devices: {', '.join(DEVICES)}")
