"""The CPU reference executor: runs a tile-IR module op by op with NumPy.

It is the semantics every other backend is checked against, so it reads only what defines
the result (tensors, ops, inputs, outputs) and ignores schedules (`tile`, `kernels`,
`program`, `codegen`): those change how fast a result comes, never what it is. IR parts that
do change the result and that it cannot run (a `control` section, an unknown op kind) are
refused with a message naming the stage that wrote them (the CUDA runtime refuses the same).

A run has two phases:

- `prepare(module)` -> `Program`: parse and analyse every expression once, look up every
  opaque implementation once, and plan when each intermediate dies (the op after which nothing
  reads it). Pure, and cached per module object.
- `Program.run(inputs, weights)`: execute the steps in order, each through the op runner of
  the chosen mode, dropping every intermediate right after its last reader ran so that peak
  memory stays near the largest live set rather than the sum of all tensors.

Modes are a registry (`OP_RUNNERS`): "whole" evaluates each op over its whole iteration
space; `tilekit.runtime.tiled` adds "tiled" (each op box by box as its tile says) with
`register_mode`.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from tilekit import opaque as opaque_registry
from tilekit.errors import TilekitError, UnsupportedError
from tilekit.expr import evaluate
from tilekit.ir.graph import OpNode, graph, per_module
from tilekit.ir.model import OP_KINDS, Module, Op
from tilekit.runtime.io import numpy_dtype


@dataclass(frozen=True)
class Step:
    """One op, ready to run: everything derivable from the IR alone is computed here."""

    index: int
    op: Op
    reads: tuple[str, ...]          # tensors read, each once
    writes: tuple[str, ...]         # tensors produced, in the op's output order
    dtypes: tuple[np.dtype, ...]    # declared dtype of each written tensor
    shapes: tuple[tuple[int, ...], ...]
    analysis: Any = None            # expr ops: tilekit.expr Analysis
    impl: Any = None                # opaque ops: the registry entry
    frees: tuple[str, ...] = ()     # tensors no later step reads (dropped after this one)

    @property
    def where(self) -> str:
        return f"ops[{self.index}] ({self.op.name})"


#: A mode's per-op function: given a step and the live tensors, return the written arrays
#: (one per `step.writes`, with the declared shapes; dtype is cast by the caller).
OpRunner = Callable[[Step, Mapping[str, np.ndarray]], "list[np.ndarray]"]


def run_op_whole(step: Step, env: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate one op over its whole iteration space (a control op: its loop, scan or
    branch, regions run whole)."""
    if step.op.kind == "expr":
        return [evaluate(step.analysis, env, pad=step.op.pad, out_dtype=step.dtypes[0])]
    if step.op.kind == "control":
        return step.impl.run(env, "whole", prepare)
    return run_opaque(step, env)


def run_opaque(step: Step, env: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run an opaque op through its registry implementation (the same in every mode)."""
    from tilekit.opaque import check_indices

    spec = step.op.opaque
    args = [env[name] if name else None for name in spec.get("inputs", ())]
    attrs = dict(spec.get("attrs") or {})
    try:
        check_indices(step.impl.name, args, attrs)
    except TilekitError as exc:
        raise exc.located(step.where) from None
    results = step.impl.run(args, attrs)
    return list(results)


OP_RUNNERS: dict[str, OpRunner] = {"whole": run_op_whole}

#: Modes defined outside the runtime, by the module that registers each on import.
MODE_MODULES: dict[str, str] = {"tiled": "tilekit.runtime.tiled"}
#: Modes `tilekit.runtime.backend` serves without an op runner: compiled C++, tk-ram's plan.
BACKEND_MODES = ("compiled", "program")


#: Modes that run a welded kernel group as a whole: (group, its steps, env) -> the tensors
#: it stores to global memory.
GROUP_RUNNERS: dict[str, Callable[..., Mapping[str, np.ndarray]]] = {}


def register_mode(name: str, runner: OpRunner, group_runner=None) -> None:
    """Add an execution mode (the roll stage registers "tiled"); names are unique. A
    `group_runner` runs each welded group of several ops (`Program.groups`) as one."""
    if name in OP_RUNNERS and OP_RUNNERS[name] is not runner:
        raise ValueError(f"execution mode {name!r} is already registered")
    OP_RUNNERS[name] = runner
    if group_runner is not None:
        GROUP_RUNNERS[name] = group_runner


def op_runner(mode: str) -> OpRunner:
    """The op runner of `mode`, importing the module that defines it when needed."""
    if mode not in OP_RUNNERS and mode in MODE_MODULES:
        importlib.import_module(MODE_MODULES[mode])
    try:
        return OP_RUNNERS[mode]
    except KeyError:
        known = sorted(set(OP_RUNNERS) | set(MODE_MODULES) | set(BACKEND_MODES))
        raise UnsupportedError(f"unknown execution mode '{mode}'", "--mode",
                               f"known modes: {', '.join(known)}") from None


# -- preparation -------------------------------------------------------------------------

def check_runnable(module: Module, executor: str = "the CPU reference executor",
                   control: bool = False) -> None:
    """Refuse IR whose meaning depends on parts the executor does not run (the CUDA runtime
    applies the same rule, naming itself as `executor`); `control`: it runs control ops."""
    if not control and (module.control or any(op.kind == "control" for op in module.ops)):
        raise UnsupportedError(
            f"{executor} cannot run the control-flow ops in 'control' (loops, branches, "
            "scans)", "control", "the CPU reference executor runs them")
    for index, op in enumerate(module.ops):
        if op.kind not in OP_KINDS:
            raise UnsupportedError(
                f"op kind '{op.kind}' is unknown to {executor} "
                f"(known: {', '.join(OP_KINDS)})", f"ops[{index}] ({op.name}).kind",
                "drop the stage that wrote this op from the pipeline")


def _step(node: OpNode, module: Module, dies: tuple[str, ...]) -> Step:
    """A graph node made ready to run: dtypes and shapes of what it writes, the opaque
    implementation looked up once, the tensors that die after it."""
    impl = None
    if node.op.kind == "control":
        from tilekit.runtime.control import control_plan

        impl = control_plan(module, node.index)
        writes = node.writes
    elif node.op.kind == "opaque":
        if not isinstance(node.op.opaque, Mapping) or "type" not in node.op.opaque:
            raise TilekitError("opaque op without an 'opaque: {type, inputs, outputs}' record",
                               f"{node.where}.opaque")
        try:
            impl = opaque_registry.get(node.op.opaque["type"])
        except TilekitError as exc:
            raise exc.located(node.where) from None
        writes = tuple(node.op.opaque.get("outputs", ()))  # "" is an unused optional output
    else:
        writes = node.writes
    for name in node.reads + tuple(n for n in writes if n):
        if name not in module.tensors:
            raise TilekitError(f"tensor '{name}' is not declared", node.where,
                               "declare it under tensors:")
    tensors = [module.tensors[n] if n else None for n in writes]
    return Step(node.index, node.op, reads=node.reads, writes=writes,
                dtypes=tuple(numpy_dtype(t.dtype) if t else None for t in tensors),
                shapes=tuple(tuple(t.shape) if t else None for t in tensors),
                analysis=node.analysis, impl=impl, frees=dies)


@dataclass(frozen=True)
class Program:
    """A module prepared for the CPU: steps in execution order. Stateless between runs.

    It holds no reference to its module (so the per-module cache never keeps one alive).
    """

    model: str
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    #: Welded kernel groups of several consecutive ops (the module has a `weld` stage):
    #: first step index -> (kernel name, number of steps, its `tile` payload).
    groups: Mapping[int, tuple[str, int, Any]] = None  # type: ignore[assignment]
    #: Outputs whose length is known at run time only: {output: count tensor} (a loop's
    #: scan outputs with a data-dependent trip count, trimmed to the count on return).
    counts: Mapping[str, str] = None  # type: ignore[assignment]

    def run(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], *,
            mode: str = "whole",
            on_step: Callable[[Step, float], None] | None = None,
            trace: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Execute once. `inputs` and `weights` are keyed by IR tensor name and assumed
        checked (`tilekit.runtime.io.check_inputs`, `load_weights`); they are only read.

        `on_step(step, seconds)` is called after each step (for profiles). With `trace`, every
        tensor a step writes is also stored there (for per-tensor comparisons; the run then
        holds every intermediate). Returns the module's outputs in `module.outputs` order.
        """
        runner = op_runner(mode)
        group_runner = GROUP_RUNNERS.get(mode) if self.groups else None
        env: dict[str, np.ndarray] = {**weights, **inputs}
        skip = 0
        for step in self.steps:
            if skip:            # a member of the group run before: its tensors are out
                skip -= 1
                for name in step.frees:
                    env.pop(name, None)
                continue
            start = time.perf_counter() if on_step else 0.0
            if group_runner is not None and step.index in self.groups:
                name, count, tile = self.groups[step.index]
                stored = group_runner(name, tile, self.steps[step.index:step.index + count],
                                      env)
                env.update(stored)
                if trace is not None:
                    trace.update(stored)
                skip = count - 1
            else:
                self._store(step, env, trace, step.impl.run(env, mode, prepare)
                            if step.op.kind == "control" else runner(step, env))
            for name in step.frees:
                env.pop(name, None)
            if on_step:
                on_step(step, time.perf_counter() - start)
        out = {name: env[name] for name in self.outputs}
        for name, count in (self.counts or {}).items():
            out[name] = out[name][:int(env[count])]
        return out

    @staticmethod
    def _store(step: Step, env: dict, trace: dict | None, results) -> None:
        """A step's results into `env` (and `trace`), each as its declared dtype and shape."""
        if len(results) != len(step.writes):
            raise RuntimeError(f"{step.where}: produced {len(results)} arrays for "
                               f"{len(step.writes)} outputs")
        for name, array, dtype, shape in zip(step.writes, results, step.dtypes, step.shapes):
            if not name:
                continue
            array = np.asarray(array)
            if array.shape != shape:
                # Broadcast a scalar-like result (`y[i] = 0`) but never reshape silently.
                if array.size == 1 or array.ndim == 0:
                    array = np.full(shape, array.reshape(()), dtype=dtype)
                else:
                    raise RuntimeError(f"{step.where}: '{name}' came out with shape "
                                       f"{array.shape}, declared {shape}")
            env[name] = array.astype(dtype, copy=False)
            if trace is not None:
                trace[name] = env[name]


_PROGRAMS: dict[int, Program] = {}


def prepare(module: Module) -> Program:
    """Check, analyse and plan `module` for the CPU executor (cached per module object; a
    Program holds no reference to its module, so the cache never keeps one alive)."""
    return per_module(_PROGRAMS, module, _prepare)


def _prepare(module: Module) -> Program:
    check_runnable(module, control=True)
    g = graph(module)
    counts = {}
    if module.control:
        from tilekit.runtime.control import kept_counts

        counts = kept_counts(module)
    kept = set(counts.values())
    steps = tuple(_step(node, module, tuple(t for t in dies if t not in kept))
                  for node, dies in zip(g.nodes, g.dies_after()))
    return Program(module.model, tuple(module.outputs), steps, _groups(module), counts)


def _groups(module: Module) -> dict[int, tuple[str, int, Any]]:
    """The welded groups of several consecutive ops, by first op index (a region's too: a
    region runs as a module of its own, without stage records)."""
    from tilekit.ir.payloads import welded

    groups = [k for k in module.kernels if welded(k)]
    if not groups:
        return {}
    from tilekit.weld.verify import check_groups
    check_groups(module)
    index = module.op_index()
    out = {}
    for k in groups:
        if len(k.ops) < 2:
            continue
        first = index[k.ops[0]]
        if [index[o] for o in k.ops] != list(range(first, first + len(k.ops))):
            raise TilekitError(f"kernel group '{k.name}' is not a run of consecutive ops",
                               "kernels", "re-run tk-weld")
        out[first] = (k.name, len(k.ops), k.tile)
    return out


def run_module(module: Module, inputs: Mapping[str, np.ndarray],
               weights: Mapping[str, np.ndarray], *, mode: str = "whole") -> dict[str, np.ndarray]:
    """Run `module` on the CPU and return its outputs in `module.outputs` order.

    `inputs` and `weights` map IR tensor names to arrays of the declared shapes and dtypes
    (see `tilekit.runtime.io` for loading and checking them). `mode` picks the op runner:
    "whole" (default) or a mode added with `register_mode`.
    """
    return prepare(module).run(inputs, weights, mode=mode)
