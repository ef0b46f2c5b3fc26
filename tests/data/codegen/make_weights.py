"""The weight sidecars of the codegen fixtures: seeded, deterministic, not in git.

`*.weights.npz` is git-ignored, so the sidecars are made from a fixed seed: `ensure()` (called
by the tests) writes any that are missing, byte-identical to the ones the fixtures' checksums
were taken from (np.savez writes fixed zip timestamps). After changing a fixture's weight
tensors, regenerate them and the checksums in the fixtures with

    python tests/data/codegen/make_weights.py
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 20240601


def _weight_tensors(text: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of the weight tensors, read with the IR codec."""
    sys.path.insert(0, str(HERE.parents[2]))
    from tilekit.ir.codec import loads
    module = loads(text)
    return [(n, tuple(t.shape), t.dtype) for n, t in module.tensors.items() if t.role == "weight"]


def write_weights(fixture: Path) -> tuple[Path, str] | None:
    """Write the fixture's sidecar; returns (path, sha256), or None without weights."""
    text = fixture.read_text()
    tensors = _weight_tensors(text)
    if not tensors:
        return None
    rng = np.random.default_rng(SEED)
    arrays = {n: (rng.standard_normal(shape) * 0.5).astype(dtype) for n, shape, dtype in tensors}
    model = re.search(r"^model:\s*(\S+)", text, flags=re.M).group(1)
    target = HERE / f"{model}.weights.npz"
    np.savez(target, **arrays)
    return target, hashlib.sha256(target.read_bytes()).hexdigest()


def ensure() -> None:
    """Write every missing sidecar (tests call this; existing files are left alone)."""
    for path in sorted(HERE.glob("*.yaml")):
        m = re.search(r"^weights:\s*\{file:\s*([^,]+),", path.read_text(), flags=re.M)
        if m and not (HERE / m.group(1).strip()).exists():
            write_weights(path)


def main() -> None:
    for path in sorted(HERE.glob("*.yaml")):
        made = write_weights(path)
        if made is None:
            continue
        target, sha = made
        text = path.read_text()
        line = f"weights: {{file: {target.name}, sha256: {sha}}}"
        if re.search(r"^weights:.*$", text, flags=re.M):
            text = re.sub(r"^weights:.*$", line, text, flags=re.M)
        else:
            text = re.sub(r"^(model:.*)$", r"\1\n" + line, text, count=1, flags=re.M)
        path.write_text(text)
        print(f"{path.name}: {target.name} {sha[:12]}")


if __name__ == "__main__":
    main()
