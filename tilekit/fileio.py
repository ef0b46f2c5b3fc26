"""Reading command input and writing files atomically: a file appears whole, under its final
name, or not at all.

Every file a tilekit command writes (IR documents, weight sidecars, output archives, CUDA
sources) goes through `atomic_write`: a temporary file in the target's folder, renamed over
the target once complete; on any failure the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

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



def read_input_text(path: str, what: str = "IR") -> tuple[str, str]:
    """Read the whole input as text. Returns (text, display name). Empty input is bad input."""
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise TilekitError(f"no {what} given and stdin is a terminal", "<stdin>",
                               f"pass a file or pipe one in, e.g. 'tk-import m.onnx | ...'")
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise TilekitError("no such file", path, "check the path")
        if p.is_dir():
            raise TilekitError("is a directory, expected a file", path)
        data = p.read_bytes()
        name = path
    if not data.strip():
        raise TilekitError(f"empty input, expected a tile {what} document", name,
                           "did the command before this one in the pipe fail?")
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as exc:
        raise TilekitError(f"not UTF-8 text (byte {exc.start})", name,
                           f"expected a YAML or JSON tile {what} document") from None


def same_file(a: str, b: str) -> bool:
    if a == "-" or b == "-":
        return False
    try:
        return Path(a).resolve() == Path(b).resolve() or (
            Path(b).exists() and os.path.samefile(a, b))
    except OSError:
        return False


def write_output(output: str, data: str | bytes,
                 input_path: str | Iterable[str | None] | None = None) -> None:
    """Write to stdout or atomically to a file (temp file in the same folder, then rename).

    Refuses to overwrite any of the command's input files (`input_path`: one path or several:
    the IR, its weights sidecar, input arrays) and to write binary data to a terminal.
    """
    if output == "-":
        if isinstance(data, bytes):
            if sys.stdout.isatty():
                raise TilekitError("refusing to write binary data to a terminal", "-o",
                                   "redirect stdout or pass -o FILE")
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
            sys.stdout.flush()
        return
    inputs = [input_path] if isinstance(input_path, (str, Path)) else list(input_path or ())
    for path in inputs:
        if path is not None and same_file(str(path), output):
            raise TilekitError(f"refusing to overwrite the input file {path}", f"-o {output}",
                               "write to a different file")
    payload = data if isinstance(data, bytes) else data.encode("utf-8")
    with atomic_write(output, f"-o {output}") as fh:
        fh.write(payload)
