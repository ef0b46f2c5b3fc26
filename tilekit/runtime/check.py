"""Comparing a run with a reference: the metric, the tolerances, and the references.

The metric, per output (`a` the run, `b` the reference, both taken as float64):

- `max_abs = max |a - b|`, the worst element;
- `rel_l2 = ||a - b||_2 / ||b||_2`, the error relative to the output's size (0 when both are
  all zero, infinite when only the reference is).

A floating-point output passes when `rel_l2 <= rtol` **or** `max_abs <= atol`: `rtol` is the
real test, `atol` the floor that lets an output whose reference is (near) zero pass when every
element is within `atol`. NaN and infinities must appear at the same places in both (they are
then left out of the metric). Integer and bool outputs must match exactly. A shape mismatch
always fails.

References: onnxruntime on the module's source model (`module.source`, checksum verified)
when there is one, otherwise the CPU reference executor in "whole" mode. What is checked
against it by default is the mode the module's stages made (`staged_mode`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from tilekit import limits
from tilekit.errors import TilekitError, excerpt
from tilekit.ir.graph import graph
from tilekit.ir.model import Module
from tilekit.runtime.io import resolve_sidecar

#: Default (rtol, atol) per output dtype: about 100 units in the last place of a single
#: rounding, which the summation-order differences between two correct float32 executors stay
#: well under on ResNet-sized models.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (1e-3, 1e-4),
    "bfloat16": (1e-2, 1e-3),
}


#: (rtol, atol) for a half-precision module (`tk-import --dtype`) against onnxruntime running
#: its float32 source: every stored intermediate is rounded to half, so the error is that of
#: the whole model in half precision, not of one rounding. Set from the 14 bundled models
#: (docs/run.md, "Half precision"): worst rel_l2 1.35e-2 in float16 and 1.27e-2 in bfloat16,
#: both where a softmax reads logits near 60 stored in half (an absolute error of about
#: 60 x 2^-11 in a logit is that relative error in its probability).
SOURCE_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (3e-2, 1e-3),
    "bfloat16": (6e-2, 1e-2),
}


def tolerances(dtype: str, rtol: float | None = None, atol: float | None = None,
               table: Mapping[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    """The (rtol, atol) that apply to an output of `dtype` (from `table`, by default
    `DEFAULT_TOLERANCES`); explicit values win."""
    default_rtol, default_atol = (table or DEFAULT_TOLERANCES).get(
        dtype, DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0)))
    return (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)


@dataclass(frozen=True)
class Comparison:
    """The result of comparing one output with its reference."""

    name: str
    max_abs: float
    rel_l2: float
    rtol: float
    atol: float
    passed: bool
    note: str = ""

    def line(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        text = (f"{self.name}: max_abs {self.max_abs:.3g}  rel_l2 {self.rel_l2:.3g}  "
                f"{verdict} (rtol {self.rtol:g}, atol {self.atol:g})")
        return f"{text}; {self.note}" if self.note else text


def compare(name: str, actual: np.ndarray, expected: np.ndarray, dtype: str,
            rtol: float | None = None, atol: float | None = None,
            table: Mapping[str, tuple[float, float]] | None = None) -> Comparison:
    """Compare one output with its reference (see the module docstring for the rule)."""
    rtol, atol = tolerances(dtype, rtol, atol, table)
    if actual.shape != expected.shape:
        return Comparison(name, math.inf, math.inf, rtol, atol, False,
                          f"shape {list(actual.shape)} != reference {list(expected.shape)}")
    exact = expected.dtype.kind in "biu" and actual.dtype.kind in "biu"
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    note = ""
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    if not (finite_a.all() and finite_b.all()):
        same_special = (~finite_a & ~finite_b) & ((a == b) | (np.isnan(a) & np.isnan(b)))
        differ = int(np.count_nonzero((~finite_a | ~finite_b) & ~same_special))
        both = finite_a & finite_b
        a, b = a[both], b[both]
        if differ:
            note = f"NaN/inf differ at {differ} element(s)"
    diff = np.abs(a - b)
    max_abs = float(diff.max()) if diff.size else 0.0
    err_norm = float(np.linalg.norm(diff))
    ref_norm = float(np.linalg.norm(b))
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    if exact:
        mismatches = int(np.count_nonzero(diff))
        passed = mismatches == 0 and not note
        if not passed and not note:
            note = f"{mismatches} element(s) differ (integer outputs must match exactly)"
        return Comparison(name, max_abs, rel_l2, 0.0, 0.0, passed, note)
    passed = not note and (rel_l2 <= rtol or max_abs <= atol)
    return Comparison(name, max_abs, rel_l2, rtol, atol, passed, note)


def compare_outputs(module: Module, actual: Mapping[str, np.ndarray],
                    expected: Mapping[str, np.ndarray], rtol: float | None = None,
                    atol: float | None = None,
                    table: Mapping[str, tuple[float, float]] | None = None
                    ) -> list[Comparison]:
    """One `Comparison` per module output, in `module.outputs` order."""
    return [compare(name, actual[name], expected[name], module.tensors[name].dtype, rtol, atol,
                    table) for name in module.outputs]


@dataclass(frozen=True)
class TensorComparison:
    """One computed tensor against the CPU reference executor's, with the op that wrote it."""

    index: int                    # the writing op's position in `module.ops`
    op: str
    comparison: Comparison

    def line(self) -> str:
        return f"ops[{self.index}] ({self.op}) {self.comparison.line()}"


def compare_tensors(module: Module, actual: Mapping[str, np.ndarray],
                    inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                    rtol: float | None = None, atol: float | None = None
                    ) -> list[TensorComparison]:
    """Every tensor in `actual` that an op writes, against the same tensor in a whole-mode
    run of the CPU reference executor on the same inputs, in op order.

    Errors grow as they propagate, so the first tensor that fails is where to look: a jump
    from 1e-7 to 1e-3 between an op's inputs and its output points at that op's kernel.
    """
    from tilekit.runtime.cpu import prepare

    expected: dict[str, np.ndarray] = {}
    prepare(module).run(inputs, weights, mode="whole", trace=expected)
    found = []
    for node in graph(module).nodes:
        index, op = node.index, node.op
        for name in node.writes:
            if name in actual and name in expected:
                found.append(TensorComparison(index, op.name, compare(
                    name, np.asarray(actual[name]), expected[name], module.tensors[name].dtype,
                    rtol, atol)))
    return found


# -- references --------------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    """Reference outputs (keyed by IR name) and a phrase saying where they came from."""

    description: str
    outputs: dict[str, np.ndarray]
    #: The default tolerances that fit this reference (`SOURCE_TOLERANCES` when a half
    #: module is compared with its float32 source).
    tolerances: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: DEFAULT_TOLERANCES)


def onnx_names(module: Module) -> tuple[dict[str, str], dict[str, str]]:
    """IR name -> source-model name, for the module's inputs and outputs.

    The importer sanitises ONNX names and records the originals in `module.source` under
    `inputs` and `outputs` (`{ir name: onnx name}`); names it left alone need no entry.
    """
    source = module.source or {}
    ins = dict(source.get("inputs") or {})
    outs = dict(source.get("outputs") or {})
    return ({n: ins.get(n, n) for n in module.inputs},
            {n: outs.get(n, n) for n in module.outputs})


def onnxruntime_reference(module: Module, inputs: Mapping[str, np.ndarray],
                          folder: Path) -> Reference:
    """Run the module's source ONNX model with onnxruntime (CPU) on the same inputs."""
    path = resolve_sidecar(module.source or {}, "onnx", folder, "source", limits.MODEL_BYTES)
    try:
        import onnxruntime as ort
    except ImportError:
        raise TilekitError("--check needs onnxruntime to run the source model, and it is not "
                           "installed", "--check",
                           "pip install onnxruntime (or pip install -e '.[test]')") from None
    # What the import changed in the source (--random-weights, --value), done again here.
    source, fixed = _imported_source(module, path)
    session, lowered = _ort_session(ort, source, path)
    in_names, out_names = onnx_names(module)
    model_inputs = {i.name for i in session.get_inputs()}
    types = {i.name: i.type for i in session.get_inputs()}
    model_outputs = {o.name for o in session.get_outputs()}
    feed = {}
    for ir_name, onnx_name in in_names.items():
        if onnx_name not in model_inputs:
            raise TilekitError(f"IR input '{ir_name}' maps to '{onnx_name}', which is not an "
                               f"input of '{path.name}'", "source",
                               "the IR does not match its source model: re-run tk-import")
        feed[onnx_name] = _as_source_type(inputs[ir_name], types.get(onnx_name))
    feed.update({k: v for k, v in fixed.items() if k in model_inputs})
    missing = sorted(set(out_names.values()) - model_outputs)
    if missing:
        raise TilekitError(f"outputs {missing} are not outputs of '{path.name}'", "source",
                           "the IR does not match its source model: re-run tk-import")
    wanted = list(out_names.values())
    try:
        results = session.run(wanted, feed)
    except Exception as exc:  # noqa: BLE001 - the source model is not runnable as given
        raise TilekitError(f"onnxruntime cannot run '{path.name}': "
                           f"{excerpt(str(exc), 200, quote=False)}", "source.onnx",
                           "check the model with onnx.checker, or drop --check") from None
    half = import_dtype(module)
    return Reference(f"onnxruntime {ort.__version__} on {path.name}" + (
        f" (float32; the IR is in {half})" if half else "") + (
        f" (its ONNX IR version {lowered[0]} read as {lowered[1]}, the newest this "
        f"onnxruntime loads)" if lowered else ""),
        {ir: np.asarray(r) for ir, r in zip(out_names, results)},
        SOURCE_TOLERANCES if half else DEFAULT_TOLERANCES)


#: onnxruntime's refusal of a model whose ONNX IR version is newer than it knows.
_IR_TOO_NEW = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")


def _ort_session(ort, source: str | bytes, path: Path) -> tuple[object, tuple[int, int] | None]:
    """An onnxruntime session of the source model, and (model's, loaded) IR versions when the
    model's is newer than this onnxruntime loads: an `onnx` newer than the installed
    onnxruntime writes a newer IR version than the model needs (the operator sets decide what
    it means), so the check loads it as the newest IR version it knows, and says so."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failure is reported as one line below

    def load(model: str | bytes):
        try:
            return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]), None
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            return None, str(exc)

    session, error = load(source)
    too_new = _IR_TOO_NEW.search(error or "")
    lowered = None
    if too_new is not None:
        import onnx
        try:
            model = onnx.load_model_from_string(source) if isinstance(source, bytes) \
                else onnx.load(source)
            lowered = (model.ir_version, int(too_new.group(2)))
            model.ir_version = lowered[1]
            source = model.SerializeToString()   # (a model over 2 GB cannot be)
        except Exception as exc:  # noqa: BLE001 - onnx and protobuf raise their own types
            error += f" (and it could not be rewritten at IR version {too_new.group(2)}: {exc})"
        else:
            session, error = load(source)
    if session is None:
        raise TilekitError(f"onnxruntime cannot load '{path.name}': "
                           f"{excerpt(_ort_reason(error), 200, quote=False)}", "source.onnx",
                           "check the model with onnx.checker")
    return session, lowered


def _ort_reason(message: str) -> str:
    """onnxruntime's message without its prefix, the model's path and the C++ source
    location (`[ONNXRuntimeError] : 1 : FAIL : Load model from /p failed:/src/model.cc:202
    onnxruntime::Model::Model(...) Unsupported ...` -> `Unsupported ...`)."""
    message = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message.strip())
    message = re.sub(r"^Load model from .*? failed:", "", message)
    return re.sub(r"^\S+\.(?:cc|cpp|h):\d+ \S+?\(.*?\)\s*", "", message).strip()


def _imported_source(module: Module, path: Path) -> tuple[str | bytes, dict[str, np.ndarray]]:
    """The source model for onnxruntime (its path, or its bytes with the random weights
    `tk-import --random-weights` gave it) and the inputs `--value` fixed."""
    options = next((stage.get("options") or {} for stage in module.stages
                    if stage.get("name") == "import"), {})
    if options.get("random_weights") is None and not options.get("values"):
        return str(path), {}
    from tilekit.onnx import load_model, reference_source

    model, fixed = reference_source(load_model(str(path)), options)
    if options.get("random_weights") is None:
        return str(path), fixed
    return model.SerializeToString(), fixed


#: onnxruntime's input type names for the float types a half module's inputs may stand for.
_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(double)": np.float64,
               "tensor(float16)": np.float16}


def _as_source_type(array: np.ndarray, ort_type: str | None) -> np.ndarray:
    """An input of a half module as its float32 source model takes it (the same values)."""
    target = _ORT_FLOATS.get(ort_type or "")
    if target is None or array.dtype == target or array.dtype.kind not in "fV":
        return array
    return np.asarray(array, dtype=np.float32).astype(target)


def import_dtype(module: Module) -> str | None:
    """The half type the module was imported in (`tk-import --dtype`), or None."""
    for stage in module.stages:
        if stage.get("name") == "import":
            return (stage.get("options") or {}).get("dtype")
    return None


def cpu_reference(module: Module, inputs: Mapping[str, np.ndarray],
                  weights: Mapping[str, np.ndarray]) -> Reference:
    """The CPU reference executor, whole-op mode."""
    from tilekit.runtime.cpu import run_module
    return Reference("the CPU reference executor (whole ops; the IR has no source model)",
                     run_module(module, inputs, weights, mode="whole"))


@dataclass(frozen=True)
class CheckedMode:
    """The CPU execution mode `tk-run --check` runs when `--mode` is not given, and why."""

    mode: str
    why: str


def staged_mode(module: Module) -> CheckedMode:
    """The mode that runs what the module's stages made: the compiled CPU kernels
    ("compiled"), tk-ram's `program` rTask by rTask ("program"), tk-roll's tiles or tk-weld's
    groups tile by tile ("tiled"), else whole ops.
    `tk-run --check` without `--mode` checks this mode, so that a check after the stages
    checks their schedule and not the whole-op evaluation the reference also runs."""
    from tilekit.ir.payloads import cpu_rolled
    from tilekit.runtime.compiled import is_cpu_code

    stages = set(module.stage_names())
    if is_cpu_code(module):
        return CheckedMode("compiled", "the compiled CPU kernels (tk-codegen --target cpu)")
    if cpu_rolled(module):   # CPU tiles are no GPU blocks to walk: they run compiled
        return CheckedMode("compiled", "the CPU tiles as compiled kernels (generated here)"
                           + (", tk-ram's CPU plan on its vEUs" if module.program is not None
                              else ""))
    if module.program is not None:
        return CheckedMode("program", "tk-ram's program, rTask by rTask")
    if "weld" in stages:
        return CheckedMode("tiled", "tk-weld's groups, tile by tile")
    if "roll" in stages:
        return CheckedMode("tiled", "tk-roll's tiles, block by block")
    return CheckedMode("whole", "whole ops")


def reference_outputs(module: Module, inputs: Mapping[str, np.ndarray],
                      weights: Mapping[str, np.ndarray], folder: Path) -> Reference:
    """onnxruntime on the source model when the IR names one, else the CPU executor."""
    if module.source and module.source.get("onnx"):
        return onnxruntime_reference(module, inputs, folder)
    return cpu_reference(module, inputs, weights)
