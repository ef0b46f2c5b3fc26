"""Atomic file writing: a file appears whole, under its final name, or not at all.

Every file a tilekit command writes (IR documents, weight sidecars, output archives, CUDA
sources) goes through `atomic_write`: a temporary file in the target's folder, renamed over
the target once complete; on any failure the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from tilekit.errors import TilekitError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | Path, where: str | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file handle; on success the data replaces `path` in one rename.

    `where` names the flag or field that chose the path, for error messages.
    """
    target = Path(path)
    where = where or str(path)
    if target.is_dir():
        raise TilekitError("is a directory", where, "give a file name")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise TilekitError(f"folder '{folder}' does not exist", where, "create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
