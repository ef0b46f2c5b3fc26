"""tk-weld's kernels on a GPU: every pattern fixture (tests/data/weld) welded for the H100
profile, its generated kernels run on the device (`tilekit.runtime.cuda`) against the CPU
reference executor, with masked keys for the attention fixtures (the flash form's online
softmax included). Marked `gpu`: skipped where CuPy or a device is missing; part of
`make gpu-check` (it runs `pytest tests/gpu`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tilekit.codegen import generate
from tilekit.hw import load_profile
from tilekit.ir import read_module
from tilekit.runtime.cpu import run_module as run_cpu
from tilekit.weld import weld_module

pytestmark = pytest.mark.gpu

DATA = Path(__file__).resolve().parents[1] / "data" / "weld"
PATTERNS = sorted(p.stem for p in DATA.glob("*.yaml"))


@pytest.mark.parametrize("name", PATTERNS)
def test_welded_pattern_on_the_gpu(name):
    from tilekit.runtime import cuda
    profile = load_profile("h100")
    welded = weld_module(read_module(str(DATA / f"{name}.yaml")), profile)
    module = generate(welded, profile).module
    rng = np.random.default_rng(3)
    inputs = {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
              for n in module.inputs}
    if "mask" in inputs:
        inputs["mask"][::5] = -1e9
    got = cuda.run_module(module, inputs, {})
    want = run_cpu(module, inputs, {})
    for out in module.outputs:
        np.testing.assert_allclose(got[out], want[out], rtol=1e-4, atol=1e-4, err_msg=out)
