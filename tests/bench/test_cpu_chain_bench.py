"""Memory-bound chains on the CPU against onnxruntime: softmax, layer norm, an MLP epilogue.

Run with `make bench` (not part of `make test`), or alone:

    .venv/bin/pytest -q -p no:cacheprovider -o addopts="" tests/bench/test_cpu_chain_bench.py

Each chain is a small ONNX model (tests/models/onnx_models.py): attention's softmax with its
scale and key mask over [batch x heads x queries, keys] rows; LayerNormalization over
[tokens, 768] as the ONNX op and in the decomposed form exporters write
(ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add); an MLP epilogue (MatMul, bias, erf
GELU, residual). Engines side by side (tests/bench/cpu_engines.py, the machinery of
test_cpu_bench.py: alternating fresh processes, medians, the same threads): the compiled CPU
code after tk-roll and tk-weld for the CPU profile (`compiled-cpu`: softmax and layer norm
as one `cpu_rows` kernel, the epilogue in the GEMM's store), the compiled code without them
(`compiled`: one kernel per op), onnxruntime. Results go to
tests/bench/results/cpu-chains.json (cpu-chains-<N>threads.json with TILEKIT_BENCH_THREADS).
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import onnx_models  # noqa: E402
from test_cpu_bench import THREADS, profile_name, record, results_path, side_by_side  # noqa: E402

ENGINES = ("compiled-cpu", "compiled", "onnxruntime")
#: Timed runs per process: the chains take well under a millisecond to a few.
RUNS = 20
RESULTS = results_path("cpu-chains")

#: name -> the model (BERT-base sizes: 12 heads, 768 hidden, 3072 intermediate).
CHAINS = {
    "softmax_12x128x128": lambda: onnx_models.softmax_chain(rows=12 * 128, seq=128),
    "softmax_12x384x384": lambda: onnx_models.softmax_chain(rows=12 * 384, seq=384),
    "layernorm_512x768": lambda: onnx_models.layer_norm_chain(tokens=512, hidden=768),
    "layernorm_decomposed_512x768": lambda: onnx_models.layer_norm_chain(
        tokens=512, hidden=768, decomposed=True),
    "mlp_epilogue_128x768x3072": lambda: onnx_models.mlp_epilogue(tokens=128, d_in=768,
                                                                  d_out=3072),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_cpu_chain_against_onnxruntime(name, tmp_path):
    path = tmp_path / f"{name}.onnx"
    onnx.save(CHAINS[name](), str(path))
    record(side_by_side(name, path, ENGINES, RUNS), RESULTS,
           "pytest tests/bench/test_cpu_chain_bench.py", RUNS, profile=profile_name())
