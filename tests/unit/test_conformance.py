"""The ONNX backend conformance cases bundled with the onnx package (pytorch-converted,
pytorch-operator, simple: 140 cases with inputs and expected outputs).

Every case must either import and run on the CPU executor with outputs matching the expected
ones, or be refused at import with an UnsupportedError (sequence ops, string ops and the
training-only Gradient op are out of scope). At least 85% must pass.
"""

from __future__ import annotations

import functools
import glob
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tilekit.errors import UnsupportedError
from tilekit.onnx import import_model, load_model

#: One worker runs this file (an xdist group): test_at_least_85_percent_pass then reads the
#: outcomes the cases cached, instead of computing them again on the other worker.
pytestmark = pytest.mark.xdist_group("conformance")

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ("pytorch-converted", "pytorch-operator", "simple")
CASES = sorted(str(Path(p).parent.relative_to(DATA))
               for suite in SUITES for p in glob.glob(str(DATA / suite / "*" / "model.onnx")))
RTOL, ATOL = 1e-4, 1e-5
MIN_PASSING = 119


def _tensors(case: Path, kind: str) -> list[onnx.TensorProto]:
    return [onnx.load_tensor(str(p)) for p in sorted(
        (case / "test_data_set_0").glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]


@functools.lru_cache(maxsize=None)
def outcome(case_name: str) -> tuple[str, str]:
    """("pass" | "unsupported" | "mismatch", detail) for one case; other errors propagate."""
    from tilekit.runtime.cpu import run_module

    case = DATA / case_name
    model = load_model(str(case / "model.onnx"))
    try:
        imported = import_model(model, name=case.name)
    except UnsupportedError as exc:
        return "unsupported", exc.message()
    module = imported.module
    renamed = {v: k for k, v in ((module.source or {}).get("inputs") or {}).items()}
    real_inputs = [vi.name for vi in model.graph.input
                   if vi.name not in {t.name for t in model.graph.initializer}]
    feeds = {}
    for position, tensor in enumerate(_tensors(case, "input")):
        onnx_name = tensor.name or real_inputs[position]
        feeds[renamed.get(onnx_name, onnx_name)] = numpy_helper.to_array(tensor)
    got = run_module(module, feeds, dict(imported.weights))
    for name, tensor in zip(module.outputs, _tensors(case, "output")):
        expected = numpy_helper.to_array(tensor)
        actual = got[name]
        if actual.shape != expected.shape or not np.allclose(
                actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True):
            return "mismatch", f"{name}: max abs error " \
                f"{np.max(np.abs(actual - expected)) if actual.shape == expected.shape else 'shape'}"
    return "pass", ""


def test_suite_has_all_cases():
    assert len(CASES) == 140


@pytest.mark.parametrize("case", CASES)
def test_case_passes_or_is_cleanly_unsupported(case):
    result, detail = outcome(case)
    assert result in ("pass", "unsupported"), f"{case}: {detail}"


def test_at_least_85_percent_pass():
    results = {case: outcome(case)[0] for case in CASES}
    passing = sum(r == "pass" for r in results.values())
    unsupported = sorted(c for c, r in results.items() if r == "unsupported")
    assert passing >= MIN_PASSING, f"{passing} of {len(CASES)} pass; unsupported: {unsupported}"
