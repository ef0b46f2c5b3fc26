"""`python -m tilekit`: the commands of the toolchain, one line each.

`COMMANDS` is the one table of tilekit's console scripts (name, the module whose `main` it
runs, what it does); pyproject.toml's `[project.scripts]` must list the same commands and
targets (tests/unit/test_main.py compares them). Arguments: none, `-h`/`--help` (the list) or
`--version`; anything else is a usage error (exit 2).
"""

from __future__ import annotations

import sys

#: (command, module whose `main` is the entry point, one line on what it does)
COMMANDS = (
    ("tk-import", "tilekit.cli.tk_import", "ONNX model -> tile IR (every op a tensor expression)"),
    ("tk-roll", "tilekit.cli.tk_roll",
     "Roller: tiles per op from the hardware profile and a micro performance model"),
    ("tk-weld", "tilekit.cli.tk_weld",
     "Welder: ops fused into kernels whose intermediates stay on chip"),
    ("tk-grind", "tilekit.cli.tk_grind",
     "Cocktailer: each loop, branch or scan placed on the device or the host"),
    ("tk-ram", "tilekit.cli.tk_ram",
     "Rammer: rTasks packed onto execution units as persistent programs"),
    ("tk-codegen", "tilekit.cli.tk_codegen", "tile IR -> CUDA C++ kernels and their launches"),
    ("tk-run", "tilekit.cli.tk_run",
     "run a module on the CPU (reference) or the GPU (CuPy); check; time"),
    ("tk-hw", "tilekit.cli.tk_hw", "hardware profiles: list, show, validate, probe"),
)

USAGE = "usage: python -m tilekit [-h|--help] [--version]"


def main(argv: list[str] | None = None) -> int:
    from tilekit import IR_VERSION, __version__
    from tilekit.errors import excerpt

    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(f"tilekit {__version__}, tile IR format {IR_VERSION}")
        return 0
    if args and args not in (["-h"], ["--help"]):
        print(f"python -m tilekit: error: unknown argument {excerpt(args[0])}; {USAGE}",
              file=sys.stderr)
        return 2
    print(f"tilekit {__version__}: a tile-based AI compiler as small commands "
          "(each reads and writes the tile IR; chain them with pipes)")
    width = max(len(name) for name, _, _ in COMMANDS)
    for name, _, what in COMMANDS:
        print(f"  {name:<{width}}  {what}")
    print("Run '<command> --help' for its flags; docs/architecture.md for the design.")
    return 0


def run() -> None:
    """The entry point: `main`, with a reader that closed the pipe early (`| head`) not
    being an error."""
    import os
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    run()
