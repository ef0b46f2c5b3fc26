"""Reading command input, boundedly, and remembering what was read.

- `check_path`: a path from a flag or an IR field is usable (no NUL, not too long) before
  any system call sees it;
- `read_bytes` / `read_input_text`: a whole input (a file, a FIFO, a device, or `-` for
  stdin) read in blocks and refused as soon as it passes its byte budget
  (`tilekit.limits`), so `/dev/zero` or an endless pipe costs one budget, not all memory;
- the **inputs of the running command**: every file a command reads, or that an IR it read
  refers to (weights sidecar, source model, profile), is noted here (`note_input`), and
  every output path is checked against them (`check_not_input`, called by
  `tilekit.outputs` for every file a command writes): a command never writes over a file
  it read.

Writing lives in `tilekit.outputs` (staged, atomic, all outputs of a command together);
`tilekit.outputs` has its one-file shorthands, `atomic_write` and `write_output`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Iterator

from tilekit import limits
from tilekit.errors import TilekitError, excerpt

#: POSIX PATH_MAX and NAME_MAX on Linux: longer paths fail in every system call.
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255
_BLOCK = 1 << 20


# -- paths -------------------------------------------------------------------------------

def check_path(path: str | Path, where: str | None = None) -> str:
    """`path` as a string if a system call can take it, else a `TilekitError` at `where`."""
    text = os.fspath(path)
    where = where or text
    if len(where) > 300:  # the location names the path: keep the message short
        where = where[:200] + "..."
    if not isinstance(text, str) or not text:
        raise TilekitError("empty path", where, "give a file name")
    if "\x00" in text:
        raise TilekitError("the path holds a NUL character", where, "give a file name")
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        raise TilekitError("the path cannot be encoded for this file system", where) from None
    if len(raw) > MAX_PATH_BYTES or any(len(p) > MAX_NAME_BYTES for p in raw.split(b"/")):
        raise TilekitError(f"path too long ({len(raw):,} bytes; at most {MAX_PATH_BYTES} "
                           f"bytes, {MAX_NAME_BYTES} per name)", where, "use a shorter path")
    return text


def describe_os_error(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


# -- reading -----------------------------------------------------------------------------

def read_stream(fh: BinaryIO, limit: limits.Limit, where: str) -> bytes:
    """Everything `fh` holds, read in blocks; a `LimitError` once it passes `limit`."""
    budget = limit.value
    chunks: list[bytes] = []
    size = 0
    while True:
        block = fh.read(min(_BLOCK, budget + 1 - size))
        if not block:
            return b"".join(chunks)
        chunks.append(block)
        size += len(block)
        if size > budget:
            raise limit.error("the input", where)


def read_bytes(path: str, limit: limits.Limit = limits.INPUT_BYTES,
               what: str = "input") -> tuple[bytes, str]:
    """The bytes of `path` (`-` is stdin) and its display name, within `limit`.

    A directory, a missing file, or stdin on a terminal is bad input; a FIFO or a device is
    read like a file, up to the budget. The file is noted as an input of the command.
    """
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise TilekitError(f"no {what} given and stdin is a terminal", "<stdin>",
                               "pass a file or pipe one in, e.g. 'tk-import m.onnx | ...'")
        _note_stdin()
        try:
            return read_stream(sys.stdin.buffer, limit, "<stdin>"), "<stdin>"
        except OSError as exc:
            raise TilekitError(f"cannot read: {describe_os_error(exc)}", "<stdin>") from None
    check_path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TilekitError("no such file", path, "check the path") from None
    except OSError as exc:
        raise TilekitError(f"cannot read: {describe_os_error(exc)}", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise TilekitError(f"is a directory, expected {_article(what)} file", path)
    if stat.S_ISREG(st.st_mode) and st.st_size > limit.value:
        raise limit.error(f"the file ({st.st_size:,} bytes)", path)
    note_input(path)
    try:
        with open(path, "rb") as fh:
            return read_stream(fh, limit, path), path
    except OSError as exc:
        raise TilekitError(f"cannot read: {describe_os_error(exc)}", path) from None


def _article(what: str) -> str:
    return f"an {what}" if what[:1].lower() in "aeiou" else f"a {what}"


def _onnx_model(head: bytes, name: str) -> bool:
    """Whether an input looks like an ONNX model: named `.onnx`, or starting as a serialised
    ModelProto does (field 1, `ir_version`, a varint: byte 0x08, which no YAML or JSON text
    may start with)."""
    return name.lower().endswith(".onnx") or head[:1] == b"\x08"


def _not_onnx(head: bytes, name: str, what: str) -> None:
    if what == "IR" and _onnx_model(head, name):
        model = name if name != "<stdin>" else "MODEL.onnx"
        raise TilekitError(f"{name} is an ONNX model, not tile IR: run tk-import {model} "
                           "first")


def read_input_text(path: str, what: str = "IR") -> tuple[str, str]:
    """Read the whole input as text. Returns (text, display name). Empty input is bad input;
    an ONNX model given where the IR is expected says to import it first (checked on the
    first bytes of a file, before its size)."""
    if path != "-":
        head = None
        try:
            if os.path.isfile(path):  # never opens a FIFO or a device to peek
                with open(path, "rb") as fh:
                    head = fh.read(1)
        except (OSError, ValueError):  # a path with a NUL byte raises ValueError
            pass  # read_bytes reports it, as it reports a missing file
        if head is not None:
            _not_onnx(head, path, what)
    data, name = read_bytes(path, limits.INPUT_BYTES, what)
    _not_onnx(data[:1], name, what)
    if not data.strip():
        raise TilekitError(f"empty input, expected a tile {what} document", name,
                           "did the command before this one in the pipe fail?")
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as exc:
        raise TilekitError(f"not UTF-8 text (byte {exc.start})", name,
                           f"expected a YAML or JSON tile {what} document") from None


def regular_file(path: str | Path, where: str | None, limit: limits.Limit) -> os.stat_result:
    """The stat of `path`, which must be a regular file within `limit` bytes (for files that
    an IR refers to: profiles, weights, source models). Notes it as an input. `where` names
    the flag or field that gave the path (None: the path itself)."""
    shown = excerpt(str(path), 200, quote=False)
    named = "" if where is None else f"'{shown}' "
    where = where or shown
    check_path(path, where)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TilekitError(f"{'file ' + named + 'not found' if named else 'no such file'}",
                           where, "check the path") from None
    except OSError as exc:
        raise TilekitError(f"cannot read {named}: {describe_os_error(exc)}".replace(" :", ":"),
                           where) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise TilekitError(f"{named or ''}is {kind}".strip(), where, "give a regular file")
    if st.st_size > limit.value:
        raise limit.error(f"the file ({st.st_size:,} bytes)", where)
    note_input(path)
    return st


# -- the inputs of the running command --------------------------------------------------

class _Inputs:
    """Files read by the running command, by resolved path and by (device, inode). Only a
    command (`tilekit.cli.common.tk_command`) turns the record on, so that library calls in
    a long-lived process (tests, notebooks) never inherit another call's inputs."""

    def __init__(self) -> None:
        self.active = False
        self.paths: dict[tuple[int, int] | str, str] = {}


_inputs = _Inputs()


@contextlib.contextmanager
def command_inputs() -> Iterator[None]:
    """Record the inputs of one command while the block runs."""
    saved = (_inputs.active, dict(_inputs.paths))
    _inputs.active, _inputs.paths = True, {}
    try:
        yield
    finally:
        _inputs.active, _inputs.paths = saved[0], saved[1]


def note_input(path: str | Path | None, into: dict | None = None) -> None:
    """Remember `path` as an input of the running command (or in `into`): outputs never
    replace it. A file that does not exist yet is remembered by its resolved path."""
    table = into if into is not None else (_inputs.paths if _inputs.active else None)
    if table is None or path is None or str(path) in ("-", "<stdin>", ""):
        return
    try:
        text = check_path(path)
        table[os.path.realpath(text)] = text
        st = os.stat(text)
    except (TilekitError, OSError, ValueError):
        return
    if stat.S_ISREG(st.st_mode):
        table[(st.st_dev, st.st_ino)] = text


def _note_stdin() -> None:
    if not _inputs.active:
        return
    try:
        st = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return
    if stat.S_ISREG(st.st_mode):
        _inputs.paths[(st.st_dev, st.st_ino)] = "<stdin>"


def input_files() -> list[str]:
    """The inputs noted so far by the running command (for messages and tests)."""
    return sorted(set(_inputs.paths.values()))


def read_by(output: str, extra: dict | None = None) -> str | None:
    """The input `output` would overwrite (named as it was read), or None. `extra` holds
    more inputs (from `note_input(path, into=extra)`)."""
    tables = [t for t in (_inputs.paths if _inputs.active else None, extra) if t]
    if not tables:
        return None
    try:
        real = os.path.realpath(output)
        st = os.stat(output)
        key = (st.st_dev, st.st_ino)
    except FileNotFoundError:
        key = None
    except (OSError, ValueError):
        return None
    for table in tables:
        if real in table:
            return table[real]
        if key is not None and key in table:
            return table[key]
    return None


def check_not_input(output: str, where: str, extra: dict | None = None) -> None:
    """Refuse `output` when it is (a link to, or another name of) a file this command read."""
    source = read_by(output, extra)
    if source is not None:
        raise TilekitError(f"refusing to overwrite the input file {source}", where,
                           "write to a different file")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (resolved names or, when both exist, inodes)."""
    if a == "-" or b == "-":
        return False
    try:
        return os.path.realpath(a) == os.path.realpath(b) or (
            os.path.exists(b) and os.path.samefile(a, b))
    except (OSError, ValueError):
        return False
