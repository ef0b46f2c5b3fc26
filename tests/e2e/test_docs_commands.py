"""Every shell block of README.md and docs/*.md runs as written, every flag of every command
is in its page's synopsis, and every `TILEKIT_*` variable the code reads is documented.

The convention for command blocks (README.md says it to readers too, after its first pipe):

- Blocks fenced ```sh, ```bash or ```console are commands; ```text (synopses, outputs) and
  every other language are not run, and no block goes without a language (a command example
  in a bare ``` block would never run). In a ```console block only the lines that start with
  `$ ` (and their `\\` continuations) are commands. A block that repeats an earlier one
  (README.md shows some of the docs' examples) runs once.
- Each block runs with `bash -e -o pipefail`, so every line and every stage of every pipe
  must succeed, and the block must exit 0, in a fresh temporary folder laid out like the
  checkout (`docs/`, `examples/`, `hwprofiles/` and `specs/` copied, so that a block may write
  there; `bin/`, `tests/` and `tilekit/` linked), with the checkout's `.venv/bin/` (or the
  running Python's folder) first on PATH and no `TILEKIT_*` variable but `TILEKIT_CACHE` (the
  nvcc cache) set.
- The folder also holds those of the files the docs use as "your model" (FIXTURES below)
  that the block names: `m.onnx` and `model.onnx`, a small CNN block (tests/models'
  MobileNet-style inverted residual, its input renamed `x`: 1x8x12x12 float32, output 1x10);
  `x.npy`, an input for it; `lstm.onnx`, an LSTM written as an ONNX Loop
  (tests/models/control_models.py); `bert_encoder_layer.onnx`, tests/models' small BERT
  encoder layer; `resnet50.onnx`, the onnx package's bundled ResNet-50 graph
  (`light_resnet50.onnx`, its weights constant fills). Any other file a block uses, it makes
  itself, so a block may be copied into a shell as it is.
- A block that writes into the copied `docs/`, `hwprofiles/` or `specs/` (ram.md regenerates
  its pictures) must reproduce the committed files byte for byte.
- An HTML comment on the lines right before a block changes how it runs:
  `<!-- not-run: REASON -->` never runs it (the test reports a skip with the reason: a GPU,
  minutes of work, the whole test suite); `<!-- slow: REASON -->` runs it only with
  `TILEKIT_DOCS=all` (the default suite must stay fast); `<!-- needs: nvcc -->` skips it
  where the CUDA compiler is missing; `<!-- exit: N -->` expects exit code N instead of 0.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from models import control_models, onnx_models  # noqa: E402

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"sh", "bash", "console"}
#: Copied into each block's folder (small; a block may write there, e.g. a regenerated SVG).
COPIED = ("docs", "examples", "hwprofiles", "specs")
#: Linked into each block's folder (read only by the blocks).
LINKED = ("bin", "tests", "tilekit")
#: A guard against a hung block, not a speed limit (the ResNet-50 example takes minutes).
TIMEOUT_S = 1200
ALL = os.environ.get("TILEKIT_DOCS") == "all"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


# -- the blocks ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a markdown file and the markers on the lines before it."""

    path: Path
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    markers: tuple[tuple[str, str], ...]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def marker(self, key: str) -> str | None:
        return next((value for k, value in self.markers if k == key), None)

    def script(self) -> str:
        if self.lang != "console":
            return self.text
        lines, continued = [], False
        for line in self.text.splitlines():
            if line.startswith("$ ") or continued:
                lines.append(line[2:] if line.startswith("$ ") and not continued else line)
                continued = line.endswith("\\")
        return "\n".join(lines) + "\n"


MARKER = re.compile(r"^<!--\s*([a-z-]+):\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)")


def blocks(path: Path) -> list[Block]:
    """Every fenced block of `path` with its language and its markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines))
                    if lines[j].startswith(fence.group(1))), None)
        assert end is not None, f"{path}:{i + 1}: unclosed code fence"
        markers, k = [], i - 1
        while k >= 0 and lines[k].startswith("<!--"):
            m = MARKER.match(lines[k].strip())
            markers.insert(0, (m.group(1), m.group(2)) if m else ("?", lines[k]))
            k -= 1
        text = "\n".join(lines[i + 1:end]) + "\n"
        found.append(Block(path, i + 1, fence.group(2).lower(), text, tuple(markers)))
        i = end + 1
    return found


RUN_BLOCKS = [b for path in DOCS for b in blocks(path) if b.lang in RUN_LANGS]
KNOWN_MARKERS = {"not-run", "slow", "needs", "exit"}
#: A marker of a non-shell block: `<!-- excerpt: FILE -->` says the block is an excerpt of a
#: generated file (tests/unit/test_codegen_docs.py regenerates it and finds the lines).
EXCERPT = "excerpt"


def test_markers_are_known_and_on_run_blocks():
    """A typo in a marker would silently run (or skip) a block: every marker is one of the
    four, and only shell blocks carry them."""
    problems = []
    for path in DOCS:
        for block in blocks(path):
            for key, value in block.markers:
                if key == EXCERPT and block.lang not in RUN_LANGS and value:
                    continue
                if key not in KNOWN_MARKERS:
                    problems.append(f"{block.id}: unknown marker {value if key == '?' else key!r}")
                elif block.lang not in RUN_LANGS:
                    problems.append(f"{block.id}: marker {key!r} on a ```{block.lang} block")
                elif key == "needs" and value != "nvcc":
                    problems.append(f"{block.id}: needs {value!r}; only 'nvcc' is known")
                elif key == "exit" and not value.isdigit():
                    problems.append(f"{block.id}: exit {value!r} is not a number")
                elif key in ("not-run", "slow") and not value:
                    problems.append(f"{block.id}: {key} without a reason")
    assert not problems, "\n".join(problems)


def test_blocks_markers_and_console_prompts_are_read(tmp_path, fixtures):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n<!-- exit: 3 -->\n<!-- needs: nvcc -->\n```console\n"
                    "$ echo one \\\n  two > out.txt\nout put\n$ cat out.txt; exit 3\n```\n\n"
                    "```text\ntk-run [IR]\n```\n")
    console, synopsis = blocks(page)
    assert (console.line, console.lang, synopsis.lang) == (5, "console", "text")
    assert console.markers == (("exit", "3"), ("needs", "nvcc"))
    assert console.script() == "echo one \\\n  two > out.txt\ncat out.txt; exit 3\n"
    proc = run_block(console, tmp_path / "run", fixtures)
    assert (proc.returncode, proc.stdout) == (3, "one two\n")


def test_there_are_blocks_to_run():
    assert len([b for b in RUN_BLOCKS if not b.marker("not-run")]) >= 10


# -- the fixtures -------------------------------------------------------------------------

def _small_cnn(path: Path) -> None:
    """tests/models' MobileNet-style block with its input renamed `x` (1x8x12x12 float32)."""
    model = onnx_models.mobilenet_block()
    for value in model.graph.input:
        if value.name == "image":
            value.name = "x"
    for node in model.graph.node:
        node.input[:] = ["x" if name == "image" else name for name in node.input]
    onnx.save(model, str(path))


#: File name -> how to make it (see the module docstring); a block's folder gets the files
#: its text names.
FIXTURES = {
    "m.onnx": _small_cnn,
    "model.onnx": _small_cnn,
    "x.npy": lambda path: np.save(path, np.random.default_rng(0).standard_normal(
        (1, 8, 12, 12)).astype(np.float32)),
    "lstm.onnx": lambda path: onnx.save(control_models.lstm_loop(), str(path)),
    "bert_encoder_layer.onnx": lambda path: onnx.save(onnx_models.bert_encoder_layer(),
                                                      str(path)),
    "resnet50.onnx": lambda path: shutil.copy(LIGHT / "light_resnet50.onnx", path),
}


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory) -> Path:
    """A folder the fixture files are made in, once per session, as blocks ask for them."""
    return tmp_path_factory.mktemp("doc-fixtures")


def fixture_file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.exists():
        FIXTURES[name](path)
    return path


def block_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TILEKIT_", "PYTEST_")) or k == "TILEKIT_CACHE"}
    venv = ROOT / ".venv" / "bin"
    first = [str(venv)] if venv.is_dir() else []
    path = os.pathsep.join(first + [str(Path(sys.executable).parent), str(ROOT / "bin"),
                                    env.get("PATH", "")])
    env.update(PATH=path, NO_COLOR="1", TERM="dumb", COLUMNS="100", LC_ALL="C.UTF-8",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    return env


def checkout_like(folder: Path, fixtures: Path, script: str) -> None:
    """`folder` laid out like the checkout, with the fixture files `script` names."""
    for name in COPIED:
        shutil.copytree(ROOT / name, folder / name)
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    for name in FIXTURES:
        if re.search(rf"(?<![\w./-]){re.escape(name)}(?![\w-])", script):
            shutil.copy(fixture_file(fixtures, name), folder / name)


def changed_files(folder: Path) -> list[str]:
    """Files of the copied docs/, hwprofiles/ and specs/ that a block added or changed: a block
    that regenerates a committed file (ram.md's pictures) must reproduce it byte for byte."""
    changed = []
    for name in ("docs", "hwprofiles", "specs"):
        for path in sorted((folder / name).rglob("*")):
            if path.is_file():
                rel = path.relative_to(folder)
                original = ROOT / rel
                if not original.is_file() or original.read_bytes() != path.read_bytes():
                    changed.append(str(rel))
    return changed


#: The first block of each text: a block that repeats another (README.md shows some of the
#: docs' examples) runs once.
FIRST = {}
for _block in RUN_BLOCKS:
    FIRST.setdefault(_block.script(), _block)


def _skip_reason(block: Block) -> str | None:
    if FIRST[block.script()] is not block:
        return f"the same commands as {FIRST[block.script()].id}"
    if reason := block.marker("not-run"):
        return f"not run: {reason}"
    if (reason := block.marker("slow")) and not ALL:
        return f"slow ({reason}): runs with TILEKIT_DOCS=all"
    if block.marker("needs") == "nvcc" and shutil.which("nvcc") is None \
            and not os.environ.get("TILEKIT_NVCC"):
        return "needs nvcc, which is not installed"
    return None


def run_block(block: Block, folder: Path, fixtures: Path) -> subprocess.CompletedProcess:
    script = block.script()
    checkout_like(folder, fixtures, script)
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=folder,
                          env=block_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.id)
def test_block_runs(block: Block, fixtures: Path, tmp_path: Path):
    if reason := _skip_reason(block):
        pytest.skip(reason)
    proc = run_block(block, tmp_path, fixtures)
    expected = int(block.marker("exit") or 0)
    assert proc.returncode == expected, (
        f"{block.id}: exit {proc.returncode}, expected {expected}\n--- block\n{block.text}"
        f"--- stdout (end)\n{proc.stdout[-3000:]}\n--- stderr (end)\n{proc.stderr[-3000:]}")
    assert not changed_files(tmp_path), (
        f"{block.id} wrote files of the checkout that differ from the committed ones: "
        f"{changed_files(tmp_path)}; commit what it makes, or fix the block")


# -- the docs against the code ------------------------------------------------------------

#: Each command's page, whose first ```text block starting with the command is its synopsis.
SYNOPSIS_PAGES = {"tk-import": "docs/import.md", "tk-roll": "docs/roll.md",
                  "tk-weld": "docs/weld.md", "tk-grind": "docs/grind.md",
                  "tk-ram": "docs/ram.md", "tk-codegen": "docs/codegen.md",
                  "tk-run": "docs/run.md", "tk-hw": "docs/hwprofiles.md"}
FLAG = re.compile(r"(?<![\w-])(--?[a-z][\w-]*)")


def commands() -> dict[str, object]:
    """The installed commands (pyproject's [project.scripts]) as click objects."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    found = {}
    for name, target in scripts.items():
        module, attr = target.split(":")
        found[name] = getattr(importlib.import_module(module), attr)
    return found


def synopsis(command: str) -> str:
    path = ROOT / SYNOPSIS_PAGES[command]
    for block in blocks(path):
        if block.lang == "text" and block.text.startswith(command + " "):
            return block.text
    raise AssertionError(f"{path.relative_to(ROOT)}: no ```text block starting with "
                         f"'{command} ' (the synopsis)")


def synopsis_parts(command: str, click_command) -> list[tuple[str, object, str]]:
    """(label, click command, its synopsis text): one for a command, one per subcommand and
    one for the group's own options for a group (`tk-hw show ...` lines, `tk-hw [...]`)."""
    text = synopsis(command)
    subcommands = getattr(click_command, "commands", None)
    if not subcommands:
        return [(command, click_command, text)]
    lines: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(command + " "):
            word = line.split()[1]
            current = word if word in subcommands else ""
        if current is not None:
            lines.setdefault(current, []).append(line.split("#")[0])
    parts = [(command, click_command, "\n".join(lines.get("", [])))]
    parts += [(f"{command} {name}", sub, "\n".join(lines.get(name, [])))
              for name, sub in subcommands.items()]
    return parts


def option_names(click_command) -> list[list[str]]:
    import click
    return [p.opts + p.secondary_opts for p in click_command.params
            if isinstance(p, click.Option)]


def test_every_command_has_a_synopsis_page():
    assert set(commands()) == set(SYNOPSIS_PAGES)


@pytest.mark.parametrize("command", sorted(SYNOPSIS_PAGES))
def test_synopsis_lists_every_flag_and_no_other(command):
    """Every option of the command (what its --help lists, --help itself aside) is in its
    page's synopsis under one of its names, and every flag the synopsis shows exists."""
    problems = []
    for label, click_command, text in synopsis_parts(command, commands()[command]):
        if not text:
            problems.append(f"{label}: no synopsis line")
            continue
        shown = set(FLAG.findall(text))
        names = option_names(click_command)
        for opts in names:
            if not shown & set(opts):
                problems.append(f"{label}: {'/'.join(opts)} is missing from the synopsis")
        known = {name for opts in names for name in opts} | {"--help", "-h"}
        problems += [f"{label}: the synopsis shows {flag}, which the command does not take"
                     for flag in sorted(shown - known)]
    assert not problems, f"{SYNOPSIS_PAGES[command]}:\n" + "\n".join(problems)


def test_code_blocks_say_their_language():
    """A command example in a bare ``` block would never run: every block names its
    language (```text for synopses and outputs)."""
    bare = [b.id for path in DOCS for b in blocks(path) if not b.lang]
    assert not bare, f"code blocks without a language: {bare}"


ENV_VAR = re.compile(r"\bTILEKIT_[A-Z][A-Z0-9_]*[A-Z0-9]\b")
CODE_FILES = ("tilekit", "tests", "bin", "examples", "Makefile")


def variables_in(paths) -> set[str]:
    found = set()
    for path in paths:
        if path.is_file() and path.suffix not in (".json", ".npz", ".onnx", ".svg", ".pyc"):
            found |= set(ENV_VAR.findall(path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_every_environment_variable_is_documented():
    """Every TILEKIT_* variable the code, the tests or the Makefiles read is named in
    README.md or docs/, and the docs name no variable that nothing reads."""
    code_paths = [p for name in CODE_FILES for p in
                  ([ROOT / name] if (ROOT / name).is_file() else (ROOT / name).rglob("*"))
                  if "results" not in p.parts]
    in_code = variables_in(code_paths)
    in_docs = variables_in(DOCS)
    assert not in_code - in_docs, f"undocumented: {sorted(in_code - in_docs)}"
    assert not in_docs - in_code, f"documented but read nowhere: {sorted(in_docs - in_code)}"


def test_readme_layout_names_every_package():
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    packages = sorted(p.parent.name for p in (ROOT / "tilekit").glob("*/__init__.py"))
    missing = [p for p in packages if f"`{p}`" not in layout]
    assert not missing, f"README.md's Layout does not name: {missing}"


#: Paths the docs name as examples of the reader's own files, not files of the checkout.
EXAMPLE_PATHS = {"hwprofiles/mine.yaml"}
REPO_PATH = re.compile(r"(?<![\w./$-])((?:tilekit|tests|specs|hwprofiles|docs|examples|bin)"
                       r"/[\w./*{},<>-]*[\w*}>])")
PATTERN_CHARS = set("*{<")
DOTTED = re.compile(r"(?<![\w./])(tilekit(?:\.[A-Za-z_]\w*)+)")


def test_docs_name_only_files_that_exist():
    missing = []
    for path in DOCS:
        for ref in sorted(set(REPO_PATH.findall(path.read_text(encoding="utf-8")))):
            if PATTERN_CHARS & set(ref):
                continue  # a pattern (docs/*.md, tests/unit/test_import_{nn,rnn}.py)
            if ref not in EXAMPLE_PATHS and not (ROOT / ref).exists():
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, "\n".join(missing)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_docs_name_only_modules_and_functions_that_exist():
    texts = {path: path.read_text(encoding="utf-8") for path in DOCS}
    texts[ROOT / "tilekit/codegen/__init__.py"] = importlib.import_module(
        "tilekit.codegen").__doc__
    missing = [f"{path.relative_to(ROOT)}: {ref}" for path, text in texts.items()
               for ref in sorted(set(DOTTED.findall(text))) if not _resolves(ref)]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("package", ["tilekit.codegen", "tilekit.hw"])
def test_package_docstring_lists_its_modules(package):
    """A package whose docstring lists its modules ("Modules: ...") names each of them."""
    folder = ROOT / package.replace(".", "/")
    doc = importlib.import_module(package).__doc__
    assert "Modules:" in doc
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert not missing, f"{package}'s docstring does not name: {missing}"
