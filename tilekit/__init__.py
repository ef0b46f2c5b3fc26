"""tilekit: a tile-based AI compiler as a toolchain of small Unix-style commands.

`tilekit.compile` is `tilekit.pipeline.compile` (import an ONNX model and run the passes in
one process; `help(tilekit.compile)` lists the passes and their options), loaded on first
use so that `import tilekit` stays light for the commands.
"""

__version__ = "0.1.0"

#: Major version of the tile IR document format (`tilekit:` key). Readers refuse other majors.
IR_VERSION = 2


def __getattr__(name: str):
    # Lazy: the pipeline imports every pass; the commands import only what they run.
    if name == "compile":
        from tilekit.pipeline import compile
        return compile
    raise AttributeError(f"module 'tilekit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "compile"])
