"""The pass pipeline: every stage after import is a registered `Pass` with one signature.

    from tilekit import pipeline
    ctx = pipeline.Context.for_hw("h100", top_k=1)
    module = pipeline.run(module, ["roll", "codegen"], ctx)

    compiled = tilekit.compile("model.onnx", passes=["roll", "codegen"], hw="h100")
    compiled.module, compiled.weights            # the IR and its weights, no files between

A `Pass` is `run(module, ctx) -> module` plus what it needs and does: the stages that must
have run before it (`requires`), the sections it writes (`produces`) and the derived sections
its output makes stale (`invalidates`, from `tilekit.ir.stages.INVALIDATES`, which is where
the dropping and the stage record happen: one place). Each `tk-*` command is a thin call of
its pass; `compile` runs the same passes in one process and gives the same bytes as the
commands piped together (tests/unit/test_pipeline.py).

Import is the pipeline's source, not a pass: it turns an ONNX file into a module and its
weights (`tilekit.onnx`), so it has a different signature by nature.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilekit.errors import IRError, TilekitError
from tilekit.ir.model import Module
from tilekit.ir.stages import INVALIDATES


@dataclass(frozen=True)
class Context:
    """What passes share: the hardware profile (and the name or path the IR records for it),
    the target arch, and per-pass options (`top_k` for roll, `compile` for codegen, ...)."""

    profile: Any = None
    hardware: str | None = None
    arch: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def for_hw(hw: str | None, **options: Any) -> "Context":
        """A context for profile `hw` (a name or a path), or none."""
        if hw is None:
            return Context(options=dict(options))
        from tilekit.hw import load_profile, recorded_profile
        profile = load_profile(hw)
        return Context(profile, recorded_profile(hw, profile, "-"), options.pop("arch", None),
                       dict(options))

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


@dataclass(frozen=True)
class Pass:
    """One stage of the pipeline (see the module docstring)."""

    name: str
    run: Callable[[Module, Context], Module]
    summary: str
    requires: tuple[str, ...] = ("import",)
    produces: tuple[str, ...] = ()
    needs_profile: bool = False
    #: The `Context` options the pass reads (`compile(..., top_k=4)`), with their meaning.
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def invalidates(self) -> tuple[str, ...]:
        return INVALIDATES.get(self.name, ())


def _roll(module: Module, ctx: Context) -> Module:
    from tilekit.roll.schedule import roll_module
    return roll_module(module, ctx.profile, int(ctx.option("top_k", 1)),
                       hardware=ctx.hardware, precision=str(ctx.option("precision", "fp32")))


def _weld(module: Module, ctx: Context) -> Module:
    from tilekit.weld import DEFAULT_MAX_GROUP, weld_module
    return weld_module(module, ctx.profile, int(ctx.option("top_k", 1)),
                       int(ctx.option("max_group", DEFAULT_MAX_GROUP)),
                       tuple(ctx.option("no_fuse", ())), hardware=ctx.hardware)


def _grind(module: Module, ctx: Context) -> Module:
    from tilekit.grind import grind_module
    return grind_module(module, ctx.profile, str(ctx.option("place", "auto")))


def _ram(module: Module, ctx: Context) -> Module:
    from dataclasses import replace

    from tilekit.codegen.cpu_ram import cpu_kernels
    from tilekit.ram import ram_module
    planned = ram_module(module, ctx.profile, str(ctx.option("policy", "wavefront")),
                         hardware=ctx.profile.name, cpu_kernels=cpu_kernels)
    if module.hardware is None:  # the first stage that needs a profile records it (as tk-ram)
        planned = replace(planned, hardware=ctx.hardware or ctx.profile.name,
                          hardware_sha256=ctx.profile.content_hash)
    return planned


def _codegen(module: Module, ctx: Context) -> Module:
    from tilekit.codegen.module import run_codegen
    from tilekit.ir.payloads import cpu_rolled
    cpu = cpu_rolled(module) or (ctx.profile is not None and ctx.profile.is_cpu)
    return run_codegen(module, ctx.profile, ctx.arch,
                       compile=bool(ctx.option("compile", False)),
                       target=str(ctx.option("target", "cpu" if cpu else "cuda"))).module


#: The registered passes, in pipeline order (docs/architecture.md: roll | weld | grind | ram | codegen).
PASSES: dict[str, Pass] = {p.name: p for p in (
    Pass("roll", _roll, "Roller's tiles per op and the micro performance model's estimates",
         produces=("ops[*].tile", "kernels[*].estimate", "hardware"), needs_profile=True,
         options={"top_k": "keep the K best tiles per op (tk-roll --top-k; default 1)",
                  "precision": "'fp32' (default) or 'tf32' for fp32 contractions "
                               "(tk-roll --precision)"}),
    Pass("weld", _weld, "Welder's kernel groups: intermediates kept on chip, levels per edge "
         "(reads a rolled module, or rolls what is unrolled)",
         produces=("kernels", "kernels[*].tile", "kernels[*].estimate"), needs_profile=True,
         options={"top_k": "keep the K best tiles per group (tk-weld --top-k; default 1)",
                  "max_group": "at most N ops per group (tk-weld --max-group; default 16)",
                  "no_fuse": "op names that stay kernels of their own (tk-weld --no-fuse)"}),
    Pass("grind", _grind, "Cocktailer's placement of each control op: a device loop or "
         "branch in one cooperative kernel, or the host", produces=("control[*].grind",),
         needs_profile=True,
         options={"place": "'auto' (default), 'host' or 'device' (tk-grind --place)"}),
    Pass("ram", _ram, "Rammer's rTasks packed onto virtual execution units: the program",
         produces=("program",), needs_profile=True,
         options={"policy": "'wavefront' (default) or 'serial' (tk-ram --policy)"}),
    Pass("codegen", _codegen, "a tile program per kernel group, printed as CUDA C++ or as "
         "C++ for CPUs, and its launch",
         produces=("codegen", "kernels[*].launch"),
         options={"target": "'cuda' (default) or 'cpu' (tk-codegen --target)",
                  "arch": "the CUDA arch, e.g. 'sm_80' (tk-codegen --arch; default the "
                          "profile's)",
                  "compile": "True: compile every kernel (nvcc, recording ptxas' resources; "
                             "the C++ compiler for the CPU) (tk-codegen --compile)"}),
)}


def check_options(passes: Sequence[str | Pass], options: Mapping[str, Any]) -> None:
    """Refuse an option that none of `passes` reads (a misspelt `topk=4` would otherwise be
    ignored without a word), naming the pass that does read it, or listing the known ones."""
    chosen = [get(p) if isinstance(p, str) else p for p in passes]
    read = {key for p in chosen for key in p.options}
    for key in options:
        if key in read:
            continue
        owners = [p.name for p in PASSES.values() if key in p.options]
        if owners:
            raise TilekitError(f"option '{key}' is read by the {' and '.join(owners)} pass, "
                               f"which is not in passes", key,
                               f"add '{owners[0]}' to passes, or drop the option")
        known = sorted(read) or ["none"]
        close = difflib.get_close_matches(key, sorted(read), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise TilekitError(f"unknown option '{key}'", key,
                           f"{hint}the options of passes {', '.join(p.name for p in chosen)}: "
                           f"{', '.join(known)}")


def register(p: Pass) -> None:
    """Add a pass (a stage defined elsewhere registers itself on import); names are unique."""
    if p.name in PASSES and PASSES[p.name] is not p:
        raise ValueError(f"pass {p.name!r} is already registered")
    PASSES[p.name] = p


def get(name: str) -> Pass:
    try:
        return PASSES[name]
    except KeyError:
        raise TilekitError(f"unknown pass '{name}'", "passes",
                           f"known passes: {', '.join(PASSES)}") from None


def run_pass(module: Module, p: Pass, ctx: Context) -> Module:
    """Check what `p` requires, then run it (it records its stage through
    `tilekit.ir.stages.run_stage`, dropping what it invalidates)."""
    have = module.stage_names()
    for stage in p.requires:
        if stage not in have:
            raise IRError(f"the input has no '{stage}' stage", "stages",
                          f"run the {stage} stage first (the {p.name} pass requires it)")
    if p.needs_profile and ctx.profile is None:
        raise TilekitError(f"the {p.name} pass needs a hardware profile", "--hw",
                           "pass --hw NAME|PATH (e.g. --hw h100); 'tk-hw list' shows the names")
    return p.run(module, ctx)


def run(module: Module, passes: Sequence[str | Pass], ctx: Context | None = None) -> Module:
    """Run `passes` (names or Pass objects) in order on `module`."""
    ctx = ctx or Context()
    for p in passes:
        module = run_pass(module, get(p) if isinstance(p, str) else p, ctx)
    return module


@dataclass(frozen=True)
class Compiled:
    """A model through the pipeline in one process: the module, its weights, and where they
    would be written (`ir_path`, `weights_path`: the module records the weights sidecar and
    the source model relative to `ir_path`'s folder)."""

    module: Module
    weights: Mapping[str, np.ndarray]
    ir_path: str = "model.tk.yaml"
    weights_path: str = "model.tk.weights.npz"

    def save(self, fmt: str | None = None) -> None:
        """Write the IR to `ir_path` and the weights sidecar to `weights_path`, together or
        not at all (the same files as `tk-import MODEL -o IR_PATH | ...` writes); `fmt` is
        "yaml" (default) or "json". `tk-run IR_PATH --check` then runs it."""
        from tilekit.ir import write_module
        from tilekit.onnx import stage_weights
        from tilekit.outputs import OutputSet

        with OutputSet() as files:
            files.check(self.ir_path, self.ir_path)
            if self.weights:
                stage_weights(files, self.weights_path, self.weights)
            write_module(self.module, self.ir_path, fmt, outputs=files)
            files.commit()


def compile(model: str | os.PathLike, passes: Sequence[str | Pass] = ("roll", "codegen"),
            hw: str | None = None, *, ir_path: str | os.PathLike = "model.tk.yaml",
            weights_path: str | os.PathLike | None = None, dtype: str = "float32",
            dims: Mapping[str, int] | None = None, **options: Any) -> Compiled:
    """Import the ONNX file `model` and run `passes` on it, with no files in between.

        compiled = tilekit.compile("m.onnx", ["roll", "weld", "codegen"], hw="h100",
                                   top_k=4, ir_path="m.tk.yaml")
        compiled.save()        # m.tk.yaml and m.tk.weights.npz; then `tk-run m.tk.yaml`

    `passes`, in this order when several are given (each is optional):

    - "roll": Roller's tiles per op (tk-roll); needs `hw`;
    - "weld": Welder's fused kernel groups (tk-weld); needs `hw`;
    - "grind": control ops placed on the device or the host (tk-grind); needs `hw`;
    - "ram": Rammer's program of rTasks on execution units (tk-ram); needs `hw`;
    - "codegen": a tile program per kernel, printed as CUDA C++ or as C++ for CPUs, and its
      launch (tk-codegen).

    `hw` is a hardware profile's name (`tk-hw list`) or a path to its YAML file. `options`
    are the passes' options, each read by the passes named in brackets:

    - `top_k=K` (roll, weld): keep the K best tiles per op or group (default 1);
    - `precision="tf32"` (roll): fp32 contractions on TF32 tensor cores (default "fp32");
    - `max_group=N` (weld): at most N ops per group (default 16);
    - `no_fuse=("op", ...)` (weld): ops that stay kernels of their own;
    - `place="host"|"device"` (grind): force the placement (default "auto");
    - `policy="serial"` (ram): one operator at a time (default "wavefront");
    - `target="cpu"` (codegen): C++ for CPUs, run by `tk-run --device cpu` (default "cuda",
      "cpu" for a CPU profile);
    - `arch="sm_80"` (codegen): the CUDA arch (default the profile's);
    - `compile=True` (codegen): compile every kernel (nvcc: record ptxas' resources).

    An option that none of `passes` reads is an error (`TilekitError`, listing the ones they
    do), as is an unknown pass. `dtype` is tk-import's `--dtype` ("float16", "bfloat16").
    `dims` gives a dynamic dimension one size, as tk-import's `--dim NAME=SIZE` (`{"seq":
    128}`): the passes need static sizes, and a model with open dimensions imports them as
    symbols (docs/dims.md); with no pass, the symbolic module is what `compile` returns.

    `ir_path` and `weights_path` (default: next to `ir_path`, `<stem>.weights.npz`) are where
    `Compiled.save` writes the IR and its weights (the IR records paths relative to its own
    folder; nothing is written before `save`): with the same paths, `tilekit.ir.dumps(
    compiled.module)` equals the bytes of `tk-import MODEL -o IR_PATH && tk-roll --hw HW
    IR_PATH | ...` (tests/unit/test_pipeline.py).
    """
    from tilekit.onnx import attach_files, import_model, load_model
    from tilekit.onnx.precision import import_options, to_precision
    from tilekit.onnx.names import sanitize
    from tilekit.onnx.symbolic import DimFlag

    check_options(passes, options)
    path = Path(model)
    proto = load_model(str(path))
    sizes = {name: DimFlag(value=int(size)) for name, size in (dims or {}).items()}
    name = sanitize(path.stem, "model")  # as tk-import names it
    imported = to_precision(import_model(proto, name=name, dims=sizes), dtype)
    ir_path = Path(ir_path)
    weights = Path(weights_path) if weights_path else ir_path.with_name(
        f"{ir_path.stem}.weights.npz")
    opset = next((int(e.version) for e in proto.opset_import if e.domain in ("", "ai.onnx")), 0)
    imported = attach_files(imported, ir_folder=str(ir_path.parent.resolve()),
                            weights_path=str(weights), onnx_path=str(path),
                            onnx_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                            options={"opset": opset, **import_options(dtype),
                                     **({"dims": dict(sorted(dims.items()))} if dims else {})},
                            write=False)
    module = run(imported.module, passes, Context.for_hw(hw, **options))
    return Compiled(module, dict(imported.weights), str(ir_path), str(weights))
