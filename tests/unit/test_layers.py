"""The library's layers: a module may import only from its own layer or the ones below.

Every import counts, function-local ones too (a lazy import is still a dependency). The
order, low to high, is docs/architecture.md's:

    errors, fileio, limits,  the failure kinds, reading and writing files, budgets,
    resources                where the shipped profiles and specs are
    expr, opaque             the expression language; non-affine ops' semantics
    ir, tile                 the document: model, codec, verifier, graph, payloads, stages;
                             tile programs (the kernel IR), its passes, printers, interpreter
    hw                       hardware profiles
    schedule                 decisions shared by the stages (defaults, kernel shapes)
    onnx, roll               the front end; Roller
    weld, grind, ram         Welder, Cocktailer, Rammer (above roll: they read its tiles)
    codegen                  CUDA C++
    runtime                  executors (CPU, CUDA), checks, device measurements
    pipeline                 the passes as one registry, `tilekit.compile`
    cli                      the commands

Within one package, modules may import each other, but not in a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tilekit"
LAYERS = [("errors", "fileio", "lazy", "limits", "resources", "textdoc", "outputs"), ("expr", "opaque"), ("ir", "tile"), ("hw",), ("schedule",),
          ("onnx", "roll"), ("weld", "grind", "ram"), ("codegen",), ("runtime",),
          ("pipeline",), ("cli", "__main__")]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def unit_of(path: Path) -> str:
    """The top-level unit of a module: `tilekit/roll/cost.py` -> `roll`."""
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]


def is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported tilekit module, line) for every import in the file; `from pkg import mod`
    counts as importing `pkg.mod`. Imports under `if TYPE_CHECKING:` are annotations only."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "tilekit" or node.module.startswith("tilekit.")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((sub if is_module(sub) else node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("tilekit.")]
    return found


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
                  or p.parent != PACKAGE)


def test_every_unit_has_a_layer():
    units = {unit_of(p) for p in modules()}
    assert units <= set(LEVEL), f"units without a layer: {sorted(units - set(LEVEL))}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_from_a_layer_above(path):
    here = unit_of(path)
    bad = []
    for name, line in imports(path):
        parts = name.split(".")
        if len(parts) < 2 or parts[1] in ("__version__", "IR_VERSION", "compile"):
            continue
        there = parts[1]
        if there in LEVEL and LEVEL[there] > LEVEL[here]:
            bad.append(f"line {line}: {name} ({there} is above {here})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles_between_modules():
    graph: dict[str, set[str]] = {}
    for path in modules():
        mod = ".".join(("tilekit",) + path.relative_to(PACKAGE).with_suffix("").parts)
        mod = mod.removesuffix(".__init__")
        graph[mod] = {name for name, _ in imports(path)}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)
