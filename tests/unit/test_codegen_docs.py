"""docs/codegen.md's worked example is what tk-codegen prints: every block marked
`<!-- excerpt: FILE -->` is found, line for line, in that file of the example regenerated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXCERPT = re.compile(r"^<!--\s*excerpt:\s*(\S+)\s*-->$")


def excerpts(text: str) -> list[tuple[str, str]]:
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = EXCERPT.match(line.strip())
        if m:
            assert lines[i + 1].startswith("```"), f"line {i + 2}: an excerpt is a code block"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            out.append((m.group(1), "\n".join(lines[i + 2:end])))
    return out


def test_the_worked_example_is_current(tmp_path):
    tk = Path(sys.executable).parent / "tk-codegen"
    model = ROOT / "tests" / "data" / "codegen" / "matmul_bias_relu.yaml"
    for target in ("cuda", "cpu"):
        proc = subprocess.run([str(tk), str(model), "--target", target, "--emit-dir",
                               str(tmp_path / target), "-o", str(tmp_path / f"{target}.yaml")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    found = excerpts((ROOT / "docs" / "codegen.md").read_text(encoding="utf-8"))
    assert len(found) >= 5
    for name, block in found:
        assert block in (tmp_path / name).read_text(), f"{name}: not found:\n{block}"


def test_the_opaque_table_of_the_import_doc_is_current():
    from tilekit.codegen.opaque import OPAQUE_KERNELS
    from tilekit.opaque import known

    text = (ROOT / "docs" / "import.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- opaque-cuda: the list"):text.index("<!-- opaque-cuda: end")]
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip()
            for line in table.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| opaque type")}
    assert set(rows) == set(known())
    for name, kernel in rows.items():
        assert kernel.startswith("yes") == (name in OPAQUE_KERNELS), name
