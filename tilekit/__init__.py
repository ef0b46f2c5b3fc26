"""tilekit: a tile-based AI compiler as a toolchain of small Unix-style commands."""

__version__ = "0.1.0"

#: Major version of the tile IR document format (`tilekit:` key). Readers refuse other majors.
IR_VERSION = 1
