"""The model corpus (tests/data/corpus/, made by tests/models/export_corpus.py): real
architectures exported by both torch exporters, each taken through every stage.

Per model file, one test per stage, each stage reading the file the one before wrote:

    tk-import M.onnx [--shape ...] -o M.tk.yaml      (dynamic exports: batch 2, sequence 16)
    tk-run M.tk.yaml --seed 0 --check                 (CPU reference against onnxruntime)
    tk-roll --hw h100 | tk-weld | tk-ram | tk-codegen (generation; nvcc with the variable below)
    tk-codegen --target cpu M.tk.yaml | tk-run --check (compiled C++ against onnxruntime)
    tk-import M.onnx -o M.sym.yaml; tk-run M.sym.yaml --dim S=2 --check ...
                                                      (dynamic exports: symbolic dimensions)

The commands run in-process (their click entry points, the same code as the shell commands,
without a Python start-up per stage). Each model is one xdist group, so its stages run in
order on one worker and build on each other.

Variables:
- `TILEKIT_CORPUS=all`: every stage of every model file; by default every file is imported
  and checked, and the later stages run for a few (`PIPELINE`: both exporters, a decoder with
  RMSNorm, an encoder, CNNs, a dynamic export; `CPU` for the compiled C++), which keeps the
  suite's cost near a minute on two cores;
- `TILEKIT_CORPUS_COMPILE=1` (or `TILEKIT_ALL_ARCHS=1`): tk-codegen compiles with nvcc;
- `TILEKIT_CORPUS_KNOWN=1`: also run the stages listed in `KNOWN` (failures of later stages
  that are recorded, not hidden: each is skipped with its reason otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from scope import on
import yaml
from clirun import run_in

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
MODELS: dict[str, dict] = MANIFEST["models"]
STAGES = ("import", "check", "roll", "weld", "ram", "codegen", "cpu", "symbolic")

#: Every model file is imported and checked in the default suite; the later stages (roll,
#: weld, ram, codegen: seconds per model) run for these by default, for all with
#: TILEKIT_CORPUS=all.
PIPELINE = {"gpt2.dynamo18", "llama.dynamo18", "t5_encoder.dynamo18",
            "resnet.dynamo18.dynamic", "densenet.ts17", "regnet.dynamo18"}
#: The `cpu` stage (the imported module as compiled C++, checked against onnxruntime) for
#: these by default (a decoder with RMSNorm and rotary embeddings; grouped convolutions),
#: for all with TILEKIT_CORPUS=all.
CPU = {"llama.dynamo18", "regnet.dynamo18"}
#: The `symbolic` stage (a dynamic export imported without --shape, its dimensions kept as
#: symbols, checked at two sizes on the reference executor and at one as compiled C++, then
#: rolled, welded and generated as CUDA for one size from the same file: `--dim`) for
#: these by default (dimension names that the exporter gives apart), all dynamic exports
#: with TILEKIT_CORPUS=all.
SYMBOLIC = {"gpt2.dynamo18.dynamic"}
#: (model file, stage) -> why it fails today. Skipped with the reason unless
#: TILEKIT_CORPUS_KNOWN=1; docs/import.md ("The model corpus") has the table.
KNOWN: dict[tuple[str, str], str] = {}

ALL = on("TILEKIT_CORPUS", "all")
COMPILE = on("TILEKIT_CORPUS_COMPILE") or on("TILEKIT_ALL_ARCHS")
RUN_KNOWN = os.environ.get("TILEKIT_CORPUS_KNOWN") == "1"

pytestmark = pytest.mark.slow


def cases():
    for key in sorted(MODELS):
        for stage in STAGES:
            marks = [pytest.mark.xdist_group(f"corpus-{key}")]
            if stage == "symbolic" and not MODELS[key]["dynamic"]:
                continue
            if stage == "symbolic" and not ALL and key not in SYMBOLIC:
                marks.append(pytest.mark.skip(reason="run with TILEKIT_CORPUS=all"))
            elif stage == "symbolic":
                pass
            elif not ALL and (key not in CPU if stage == "cpu" else
                            key not in PIPELINE and stage not in ("import", "check")):
                marks.append(pytest.mark.skip(reason="run with TILEKIT_CORPUS=all"))
            elif (key, stage) in KNOWN and not RUN_KNOWN:
                marks.append(pytest.mark.skip(reason=f"known: {KNOWN[key, stage]} (run with "
                                                     "TILEKIT_CORPUS_KNOWN=1)"))
            yield pytest.param(key, stage, marks=marks, id=f"{key}-{stage}")


def invoke(command, args: list[str], cwd: Path):
    result = run_in(command, args, cwd)
    assert result.exit_code == 0, f"$ {command.name} {' '.join(args)}\n{result.output}"
    return result


def shape_flags(key: str) -> list[str]:
    """`--shape` flags for a dynamic export: its static sibling's shapes, batch 2."""
    entry = MODELS[key]
    if not entry["dynamic"]:
        return []
    static = {i["name"]: i["shape"] for i in MODELS[key.replace(".dynamic", "")]["inputs"]}
    flags = []
    for spec in entry["inputs"]:
        dims = [2 if d == 0 else n for d, n in enumerate(static[spec["name"]])]
        flags += ["--shape", f"{spec['name']}={','.join(map(str, dims))}"]
    return flags


def _stage(key: str, stage: str, folder: Path) -> Path:
    """The file stage `stage` of model `key` writes (made once; earlier stages first)."""
    from tilekit.cli import tk_codegen, tk_import, tk_ram, tk_roll, tk_run, tk_weld

    names = {"import": "m.tk.yaml", "check": "m.check.txt", "roll": "m.rolled.yaml",
             "weld": "m.welded.yaml", "ram": "m.ram.yaml", "codegen": "m.cuda.yaml",
             "cpu": "m.cpu.txt", "symbolic": "m.symbolic.txt"}
    path = folder / names[stage]
    if path.exists():
        return path
    if stage == "import":
        shutil.copy(CORPUS / MODELS[key]["file"], folder / "m.onnx")
        invoke(tk_import.main, ["m.onnx", "-o", path.name] + shape_flags(key), folder)
    elif stage == "check":
        _stage(key, "import", folder)
        result = invoke(tk_run.main, ["m.tk.yaml", "--seed", "0", "--check"], folder)
        assert "check: pass" in result.output, result.output
        path.write_text(result.output)
    elif stage == "symbolic":
        shutil.copy(CORPUS / MODELS[key]["file"], folder / "m.onnx")
        invoke(tk_import.main, ["m.onnx", "-o", "m.sym.yaml"], folder)
        dims = yaml.safe_load((folder / "m.sym.yaml").read_text())["dims"]
        outputs = []
        for size, mode in ((2, "whole"), (5, "whole"), (3, "compiled")):
            flags = [f for s in dims for f in ("--dim", f"{s}={size}")]
            result = invoke(tk_run.main, ["m.sym.yaml", "--seed", "0", "--check", "--mode",
                                          mode] + flags, folder)
            assert "check: pass" in result.output, result.output
            outputs.append(result.output)
        # the same import through the stages for one size, to CUDA
        flags = [f for s in dims for f in ("--dim", f"{s}=4")]
        invoke(tk_roll.main, ["--hw", "h100", "m.sym.yaml", "-o", "m.sym.rolled.yaml"] + flags,
               folder)
        invoke(tk_weld.main, ["m.sym.rolled.yaml", "-o", "m.sym.welded.yaml"], folder)
        invoke(tk_codegen.main, ["m.sym.welded.yaml", "-o", "m.sym.cuda.yaml"]
               + (["--compile", "--strict"] if COMPILE else []), folder)
        doc = yaml.safe_load((folder / "m.sym.cuda.yaml").read_text())
        assert doc["codegen"]["kernels"] and doc["stages"][1]["name"] == "specialise"
        path.write_text("\n".join(outputs))
    elif stage == "cpu":
        invoke(tk_codegen.main, ["--target", "cpu", _stage(key, "import", folder).name, "-o",
                                 "m.cpu.yaml"], folder)
        result = invoke(tk_run.main, ["m.cpu.yaml", "--seed", "0", "--check"], folder)
        assert "check: cpu (compiled mode" in result.output and "check: pass" in \
            result.output, result.output
        path.write_text(result.output)
    elif stage == "roll":
        invoke(tk_roll.main, ["--hw", "h100", _stage(key, "import", folder).name, "-o",
                              path.name], folder)
    elif stage == "weld":
        invoke(tk_weld.main, [_stage(key, "roll", folder).name, "-o", path.name], folder)
    elif stage == "ram":
        invoke(tk_ram.main, [_stage(key, "weld", folder).name, "-o", path.name], folder)
    else:
        args = [_stage(key, "ram", folder).name, "-o", path.name]
        if COMPILE:
            args += ["--compile", "--strict"]
        invoke(tk_codegen.main, args, folder)
    return path


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("corpus")


@pytest.mark.parametrize("key,stage", list(cases()))
def test_stage(key, stage, workdir):
    folder = workdir / key
    folder.mkdir(exist_ok=True)
    if stage == "codegen" and COMPILE and shutil.which("nvcc") is None:
        pytest.skip("TILEKIT_CORPUS_COMPILE=1 needs nvcc")
    path = _stage(key, stage, folder)
    if stage == "import":
        doc = yaml.safe_load(path.read_text())
        assert doc["ops"] and all(op.get("kind", "expr") != "control" for op in doc["ops"])
    elif stage == "codegen":
        doc = yaml.safe_load(path.read_text())
        assert doc["codegen"]["kernels"]


def test_manifest_matches_the_files():
    """Every file the manifest lists is there, within the corpus budget, and every model
    was made by both exporters or says why not."""
    total = 0
    for key, entry in MODELS.items():
        data = (CORPUS / entry["file"]).read_bytes()
        assert len(data) == entry["bytes"] < 1 << 20, key
        total += len(data)
    assert total < 8 << 20
    names = {entry["model"] for entry in MODELS.values()}
    for name in names:
        for exporter in ("ts17", "dynamo18"):
            key = f"{name}.{exporter}"
            assert key in MODELS or key in MANIFEST["failures"], key
