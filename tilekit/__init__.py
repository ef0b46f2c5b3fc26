"""tilekit: a tile-based AI compiler as a toolchain of small Unix-style commands."""

__version__ = "0.1.0"

#: Major version of the tile IR document format (`tilekit:` key). Readers refuse other majors.
IR_VERSION = 1


def compile(model, passes=("roll", "codegen"), hw=None, **options):
    """Import an ONNX model and run tilekit passes on it in one process
    (`tilekit.pipeline.compile`; docs/architecture.md)."""
    from tilekit.pipeline import compile as run
    return run(model, passes, hw, **options)
