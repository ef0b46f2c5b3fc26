"""`python -m tilekit`: the commands of the toolchain, one line each."""

from __future__ import annotations

COMMANDS = (
    ("tk-import", "ONNX model -> tile IR (every op a tensor expression)"),
    ("tk-roll", "Roller: tiles per op from the hardware profile and a micro performance model"),
    ("tk-codegen", "tile IR -> CUDA C++ kernels and their launches"),
    ("tk-run", "run a module on the CPU (reference) or the GPU (CuPy); check; time"),
    ("tk-hw", "hardware profiles: list, show, validate, probe"),
)


def main() -> None:
    from tilekit import __version__
    print(f"tilekit {__version__}: a tile-based AI compiler as small commands "
          "(each reads and writes the tile IR; chain them with pipes)")
    width = max(len(name) for name, _ in COMMANDS)
    for name, what in COMMANDS:
        print(f"  {name:<{width}}  {what}")
    print("Run '<command> --help' for its flags; docs/architecture.md for the design.")


if __name__ == "__main__":
    main()
