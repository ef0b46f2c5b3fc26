"""Shared pieces of the hostile-input families (one test file per class of issue 9).

Commands run in-process through click's runner (`run`) where that is faithful, and as real
processes (`spawn`) where the process matters: signals, closed or special stdin/stdout.
Every refusal is checked the same way (`assert_refused`): exit 2, one line
`tool: error: ...` on stderr, no traceback, nothing on stdout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from click.testing import CliRunner

from tilekit import limits
from tilekit.runtime.io import npz_bytes

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bin"

#: Small weights of `mlp_doc` (x[2,4] -> relu(x @ w1 + b1) @ w2 -> y[2,3]).
W1 = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
B1 = np.linspace(-0.5, 0.5, 8, dtype=np.float32)
W2 = np.linspace(1, -1, 24, dtype=np.float32).reshape(8, 3)

#: Names an attacker would try: code after a line break (LF, CR, both), comment enders, line
#: splices, trigraphs, quotes, non-ASCII look-alikes, path parts, NUL, terminal controls,
#: the empty name, a leading digit, an overlong name.
HOSTILE_NAMES = [
    'a\nint PWNED = system("id");//',
    'a\rint PWNED = 1;',
    'a\r\n#include "/etc/passwd"',
    "x*/ int PWNED; /*",
    "a\\",
    "a??/",
    'q"uote',
    "b'ack",
    "t\u00e9l\u00e9",            # non-ASCII letters nvcc rejects in identifiers
    "\u0430",                    # Cyrillic a
    "a\u202eb",                  # right-to-left override
    "a b",
    "a;b",
    "a/b",
    "../x",
    "a.b",
    "a:b",
    "a-b",
    "a\x00b",
    "a\x1b[31mred",
    "",
    "1x",
    "x" * 121,
]


def default_sigint() -> None:
    """A child's `preexec_fn`: SIGINT at its default. A command keeps a signal its parent
    ignores ignored (as a background job's is), and a test runner's workers may run with
    SIGINT ignored; a test that interrupts a command starts it with the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tool_main(tool: str):
    """The click command of `tool` (tk-import, tk-roll, tk-codegen, tk-run, tk-hw)."""
    import importlib

    return importlib.import_module(f"tilekit.cli.{tool.replace('-', '_')}").main


@contextlib.contextmanager
def cwd(folder: Path | None) -> Iterator[None]:
    if folder is None:
        yield
        return
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run(tool: str, *args: Any, input: bytes | str | None = None, folder: Path | None = None):
    """Run `tool` in this process; returns click's Result (exit_code, stdout, stderr)."""
    with cwd(folder):
        return CliRunner().invoke(tool_main(tool), [str(a) for a in args], input=input)


def spawn(tool: str, *args: Any, folder: Path | None = None, env: dict | None = None,
          timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run bin/<tool> as a process (stdin/stdout/stderr as `kwargs` say; captured by
    default)."""
    kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
    return subprocess.run([sys.executable, str(BIN / tool), *map(str, args)], cwd=folder,
                          env={**os.environ, **(env or {})}, timeout=timeout, **kwargs)


def assert_refused(result, tool: str, *words: str) -> str:
    """Exit 2, one line `tool: error: ...` holding `words`, no traceback, empty stdout."""
    if isinstance(result, subprocess.CompletedProcess):
        code, out = result.returncode, (result.stdout or b"").decode(errors="replace")
        err = (result.stderr or b"").decode(errors="replace")
    else:
        code, out, err = result.exit_code, result.stdout, result.stderr
    assert code == 2, f"exit {code}: {err}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert out == "", out
    return lines[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def mlp_doc() -> dict:
    """A small valid IR document (two layers) as data; pair it with `write_mlp`."""
    return {
        "tilekit": 1, "model": "mlp",
        "weights": {"file": "mlp.weights.npz", "sha256": "0" * 64},
        "stages": [{"name": "import"}],
        "inputs": ["x"], "outputs": ["y"],
        "tensors": {
            "x": {"shape": [2, 4], "dtype": "float32", "role": "input"},
            "w1": {"shape": [4, 8], "dtype": "float32", "role": "weight"},
            "b1": {"shape": [8], "dtype": "float32", "role": "weight"},
            "w2": {"shape": [8, 3], "dtype": "float32", "role": "weight"},
            "t1": {"shape": [2, 8], "dtype": "float32"},
            "h": {"shape": [2, 8], "dtype": "float32"},
            "y": {"shape": [2, 3], "dtype": "float32", "role": "output"},
        },
        "ops": [
            {"name": "fc1", "expr": "t1[i,j] += x[i,k] * w1[k,j]"},
            {"name": "relu1", "expr": "h[i,j] = max(t1[i,j] + b1[j], 0.0)"},
            {"name": "fc2", "expr": "y[i,j] += h[i,k] * w2[k,j]"},
        ],
    }


def write_doc(path: Path, doc: dict) -> Path:
    """Write `doc` as JSON (any string survives: control characters are escaped)."""
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def write_mlp(folder: Path, doc: dict | None = None, name: str = "mlp.json") -> Path:
    """`doc` (default `mlp_doc()`) in `folder` with its weights sidecar and checksum."""
    doc = doc or mlp_doc()
    sidecar = folder / doc.get("weights", {}).get("file", "mlp.weights.npz")
    if "weights" in doc:
        sidecar.write_bytes(npz_bytes({"w1": W1, "b1": B1, "w2": W2}))
        doc["weights"]["sha256"] = sha256(sidecar)
    return write_doc(folder / name, doc)


def tiny_onnx(path: Path, *, size: int = 4, node_name: str = "mul", x: str = "x",
              y: str = "y", w: str = "w") -> Path:
    """A one-node ONNX model y = x * w (w an initializer of `size` floats)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", [x, w], [y], name=node_name)], "g",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [size])],
        [numpy_helper.from_array(np.arange(size, dtype=np.float32), w)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def temporaries(folder: Path) -> list[str]:
    """Leftover temporary or backup files of tilekit's output staging in `folder`."""
    return sorted(p.name for p in Path(folder).rglob(".*") if p.name.endswith((".tmp", ".bak")))


@contextlib.contextmanager
def env_limit(monkeypatch, name: str, value: str) -> Iterator[None]:
    """Set a limit variable for in-process runs (limits are read once: reset around)."""
    monkeypatch.setenv(name, value)
    limits.reset()
    try:
        yield
    finally:
        monkeypatch.delenv(name, raising=False)
        limits.reset()
