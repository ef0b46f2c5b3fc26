"""Running tile-IR modules: the CPU reference executor, device selection, data in and out.

- `tilekit.runtime.cpu`: `run_module`, `prepare` / `Program`, execution modes;
- `tilekit.runtime.io`: weights, inputs and outputs, with their checks;
- `tilekit.runtime.check`: comparison with onnxruntime or the CPU reference;
- `tilekit.runtime.bench`: timing and the device's name;
- `tilekit.runtime.cuda` (when built): the same `run_module` on an NVIDIA GPU.
"""

from __future__ import annotations

import importlib
import importlib.util
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
    #: Device-side timing `(inputs, weights, runs, warmup) -> Timing` where the device has
    #: its own clock (CUDA events); None means wall-clock timing of `run`.
    bench: Callable[..., Any] | None = None


def backend(module: Module, device: str = "cpu", mode: str = "whole") -> Backend:
    """Prepare `module` for `device` ("cpu" or "cuda"); refuses what that device cannot run.

    The CUDA backend is `tilekit.runtime.cuda` (its `run_module(module, inputs, weights)` and,
    if it has one, `device_description()`); until it exists, asking for it is bad input.
    """
    from tilekit.runtime.bench import cpu_description

    if device == "cpu":
        program = prepare(module)
        op_runner(mode)  # an unknown mode fails here, before any data is loaded
        return Backend("cpu", cpu_description(),
                       lambda inputs, weights: program.run(inputs, weights, mode=mode))
    if device == "cuda":
        if importlib.util.find_spec("tilekit.runtime.cuda") is None:
            raise TilekitError("the CUDA runtime is not built yet (issue: tk-codegen)",
                               "--device cuda", "use --device cpu")
        cuda = importlib.import_module("tilekit.runtime.cuda")
        describe = getattr(cuda, "device_description", None)
        return Backend("cuda", describe() if callable(describe) else "cuda",
                       lambda inputs, weights: cuda.run_module(module, inputs, weights),
                       lambda inputs, weights, runs, warmup: cuda.time_kernels(
                           module, inputs, weights, runs, warmup))
    raise TilekitError(f"unknown device '{device}'", "--device",
                       f"known devices: {', '.join(DEVICES)}")
