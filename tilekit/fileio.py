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

import codecs
import contextlib
import os
import re
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

def read_stream(fh: BinaryIO, limit: limits.Limit, where: str,
                check: "StartCheck | None" = None) -> bytes:
    """Everything `fh` holds, read in blocks; a `LimitError` once it passes `limit`, and the
    error of `check` as soon as the bytes read so far cannot start the expected form."""
    budget = limit.value
    chunks: list[bytes] = []
    size = 0
    while True:
        block = fh.read(min(_BLOCK, budget + 1 - size))
        if not block:
            if check is not None:
                check.end()
            return b"".join(chunks)
        chunks.append(block)
        size += len(block)
        if check is not None:
            check.feed(block[:max(0, budget - size + len(block))])
        if size > budget:
            raise limit.error("the input", where)


def read_bytes(path: str, limit: limits.Limit = limits.INPUT_BYTES,
               what: str = "input", form: str | None = None) -> tuple[bytes, str]:
    """The bytes of `path` (`-` is stdin) and its display name, within `limit`.

    A directory, a missing file, or stdin on a terminal is bad input; a FIFO or a device is
    read like a file, up to the budget. The file is noted as an input of the command.
    `form` ("text" for YAML/JSON documents, "protobuf" for ONNX models) refuses the input
    from its first bytes when they cannot start that form (`/dev/zero`, `/dev/urandom`, an
    endless stream of junk), instead of reading it to the budget first.
    """
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise TilekitError(f"no {what} given and stdin is a terminal", "<stdin>",
                               "pass a file or pipe one in, e.g. 'tk-import m.onnx | ...'")
        _note_stdin()
        try:
            return read_stream(sys.stdin.buffer, limit, "<stdin>",
                               start_check(form, "<stdin>", what, limit)), "<stdin>"
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
            return read_stream(fh, limit, path, start_check(form, path, what, limit)), path
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
    first bytes of a file, before its size, and of stdin as they arrive)."""
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
    data, name = read_bytes(path, limits.INPUT_BYTES, what, form="text")
    if not data.strip():
        raise TilekitError(f"empty input, expected a tile {what} document", name,
                           "did the command before this one in the pipe fail?")
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as exc:
        raise TilekitError(f"not UTF-8 text (byte {exc.start})", name,
                           f"expected a YAML or JSON tile {what} document") from None


# -- the first bytes of an input ---------------------------------------------------------

class StartCheck:
    """Looks at an input as its blocks arrive (`feed`, then `end`) and raises a located
    `TilekitError` as soon as the bytes cannot be the expected form."""

    def feed(self, block: bytes) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def end(self) -> None:
        """The input ended (an incomplete end is left to the real parser to report)."""


def start_check(form: str | None, where: str, what: str, limit: limits.Limit
                ) -> StartCheck | None:
    if form == "text":
        return TextStart(where, what)
    if form == "protobuf":
        return ProtobufStart(where, what, limit)
    return None


#: C0 controls that neither YAML nor JSON text may hold (tab, LF and CR are whitespace).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


class TextStart(StartCheck):
    """A YAML or JSON document: UTF-8 text without control characters, checked block by
    block (so `/dev/zero` or `/dev/urandom` is refused after one block, not 256 MiB)."""

    def __init__(self, where: str, what: str):
        self.where, self.what = where, what
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.offset = 0  # bytes fed before the current block

    def feed(self, block: bytes, final: bool = False) -> None:
        if self.offset == 0 and block:     # a model given where the IR is expected
            _not_onnx(block[:1], self.where, self.what)
        pending = len(self.decoder.getstate()[0])
        try:
            text = self.decoder.decode(block, final)
        except UnicodeDecodeError as exc:
            raise TilekitError(f"not UTF-8 text (byte {self.offset - pending + exc.start})",
                               self.where, f"expected a YAML or JSON tile {self.what} "
                               "document") from None
        bad = _CONTROL.search(text)
        if bad:
            raise TilekitError(f"holds the control character {bad.group()!r}, which YAML "
                               "and JSON text cannot", self.where,
                               f"expected a YAML or JSON tile {self.what} document")
        self.offset += len(block)

    def end(self) -> None:
        self.feed(b"", final=True)


#: The fields of ONNX's ModelProto (onnx.proto) and their wire types: 0 varint, 2 bytes.
_MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}
#: The most bytes a protobuf message (an .onnx file without external data) can hold.
PROTOBUF_MAX_BYTES = 2**31 - 1
#: Field numbers a newer ONNX may add (they come in order; ModelProto is at 26).
_MODEL_FIELDS_UP_TO = 64


class ProtobufStart(StartCheck):
    """An ONNX model (a protobuf `ModelProto`): its top-level fields are walked as the bytes
    arrive. A known field must have its wire type, an unknown one (a newer ONNX's) a field
    number up to 64 and a wire type protobuf knows (ONNX has no groups); a varint is at
    most 10 bytes; a length-delimited field must fit within the model size budget. Zeros
    fail at byte 0, text at its first character, random bytes within a few fields."""

    def __init__(self, where: str, what: str, limit: limits.Limit):
        self.where, self.what, self.limit = where, what, limit
        self.tail = b""   # an incomplete tag, varint or length from the previous block
        self.pos = 0      # stream offset of tail[0]
        self.skip = 0     # payload bytes of the current field still to pass
        self.head = b""   # the first bytes, to say when the input looks like text

    def feed(self, block: bytes) -> None:
        if len(self.head) < 16:
            self.head += block[:16 - len(self.head)]
        data = self.tail + block
        i = min(self.skip, len(data))
        self.skip -= i
        while i < len(data) and not self.skip:
            start = i
            tag, i = _varint(data, i)
            if tag is None:
                i = start
                break
            field, wire = tag >> 3, tag & 7
            if not (_MODEL_FIELDS.get(field) == wire or (
                    field not in _MODEL_FIELDS and 0 < field <= _MODEL_FIELDS_UP_TO
                    and wire in (0, 1, 2, 5))):
                self._refuse(start, data[start])
            if wire == 0:
                value, i = _varint(data, i)
                if value is None:
                    i = start
                    break
                if value >= 1 << 64:
                    self._refuse(start, data[start])
            elif wire == 2:
                length, i = _varint(data, i)
                if length is None:
                    i = start
                    break
                if length > PROTOBUF_MAX_BYTES:   # no protobuf message holds it
                    raise TilekitError(f"not an ONNX model: the field at byte "
                                       f"{self.pos + start:,} declares {length:,} bytes, more "
                                       f"than a protobuf message holds ({PROTOBUF_MAX_BYTES:,})",
                                       self.where, "pass the .onnx file exported from your "
                                       "framework")
                if self.pos + i + length > self.limit.value:
                    raise self.limit.error(f"a field at byte {self.pos + start:,} declaring "
                                           f"{length:,} bytes", self.where)
                self.skip = length
            else:
                self.skip = 8 if wire == 1 else 4
            passed = min(self.skip, len(data) - i)
            i += passed
            self.skip -= passed
        self.tail = data[i:]
        self.pos += i
        if len(self.tail) > 20:  # a tag and a length are 20 bytes at most
            self._refuse(self.pos, self.tail[0])

    def _refuse(self, offset: int, byte: int) -> None:
        text = self.head[:max(1, min(16, offset + 1))]
        looks = " (it looks like text)" if all(0x20 <= b < 0x7f or b in b"\t\n\r"
                                               for b in text) else ""
        raise TilekitError(f"not an ONNX model: byte {offset:,} (0x{byte:02x}) cannot start "
                           f"a field of one{looks}", self.where,
                           "pass the .onnx file exported from your framework")


def _varint(data: bytes, i: int) -> tuple[int | None, int]:
    """(value, next index) of the varint at `data[i:]`; (None, i) if it is incomplete. A
    varint running past 10 bytes is not one: its value is returned as 2^70, too large for
    any tag, length or 64-bit value, so the caller refuses it."""
    value = shift = 0
    for j in range(i, min(len(data), i + 10)):
        value |= (data[j] & 0x7F) << shift
        shift += 7
        if not data[j] & 0x80:
            return value, j + 1
    if len(data) - i >= 10:
        return 1 << 70, i + 10
    return None, i


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
