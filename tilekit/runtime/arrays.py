"""Reading `.npy` files and `.npz` archives safely: headers first, data only once it fits.

`numpy.load` reads a whole member before anyone can look at its shape, so a 200-byte header
that claims 2^40 floats, or a compressed member that inflates to gigabytes, costs memory
before any check. Here, for every array:

1. the file is a regular file within `limits.TOTAL_BYTES` (a FIFO or a device is refused);
2. an archive member must be named `<name>.npy` and be stored or deflated;
3. the `.npy` header (at most `MAX_HEADER` bytes) is parsed, object dtypes are refused, and
   the caller's `expect(name, shape, dtype)` checks the shape and dtype against the IR's
   declaration (raising a located error) before a single data byte is read;
4. the member's declared size must equal header + data, and exactly that many bytes are read
   (a truncated member is an error, not a short array).

Members nobody asked for are never read.
"""

from __future__ import annotations

import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

import numpy as np

from tilekit import limits
from tilekit.errors import TilekitError, excerpt
from tilekit.fileio import regular_file

#: The largest `.npy` header accepted (numpy's own default limit).
MAX_HEADER = 10_000
_NPY_MAGIC = b"\x93NUMPY"
#: dtype kinds an array may have: bool, integers, floats, complex, and raw 2-byte values
#: (how ml_dtypes saves bfloat16); dates, strings and Python objects are refused.
_NUMERIC_KINDS = frozenset("biufcV")
_READ_BLOCK = 1 << 24

#: `expect(name, shape, dtype, where)`: raise (located at `where`) unless an array of that
#: shape and dtype may be read.
Expect = Callable[[str, tuple[int, ...], np.dtype, str], None]


def _header(fh: BinaryIO, where: str, shown: str
            ) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from a `.npy` header; `shown` names the file (and the
    member) in messages. numpy parses the header's Python literal (tokenize, ast): whatever
    it raises on a malformed one (ValueError, SyntaxError, tokenize's TokenError,
    RecursionError, ...) is bad input, never an internal error."""
    try:
        with warnings.catch_warnings():  # the literal's own warnings (bad escapes) are noise
            warnings.simplefilter("ignore")
            shape, fortran, dtype = _parse_header(fh)
    except Exception as exc:  # noqa: BLE001 - numpy's parser of an untrusted header
        raise TilekitError(f"cannot read {shown} as .npy: "
                           f"{excerpt(_reason(exc), 80, quote=False)}", where,
                           "expected an array written by numpy.save") from None
    if (dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None
            or dtype.kind not in _NUMERIC_KINDS or (dtype.kind == "V" and dtype.itemsize != 2)):
        raise TilekitError(f"{shown} holds {excerpt(str(dtype), 60, quote=False)} data, not "
                           "plain numbers", where, "tilekit reads numeric arrays only")
    return shape, bool(fortran), dtype


def _parse_header(fh: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    fmt = np.lib.format
    version = fmt.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(fh, max_header_size=MAX_HEADER)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = fmt.read_array_header_2_0(fh, max_header_size=MAX_HEADER)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape[:8]}")
    return shape, fortran, np.dtype(dtype)


def _reason(exc: BaseException) -> str:
    """One line for a parse failure: the exception's first line (TokenError's message is a
    tuple), or its type."""
    text = str(exc.args[0]) if exc.args else ""
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def _shown(path: str | Path) -> str:
    return f"'{excerpt(str(path), 200, quote=False)}'"


def _data(fh: BinaryIO, shape: tuple[int, ...], fortran: bool, dtype: np.dtype,
          where: str) -> np.ndarray:
    count = 1
    for d in shape:
        count *= d
    array = np.empty(count, dtype=dtype)
    view = memoryview(array).cast("B") if array.nbytes else memoryview(b"")
    filled = 0
    try:
        while filled < len(view):
            got = fh.readinto(view[filled:filled + _READ_BLOCK])
            if not got:
                break
            filled += got
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise TilekitError(f"cannot read the array data ({excerpt(str(exc), 80, quote=False)})",
                           where, "the file is damaged; write it again") from None
    if filled != len(view):
        raise TilekitError(f"truncated: {filled:,} of {len(view):,} data bytes", where,
                           "the file is damaged; write it again")
    return array.reshape(shape, order="F" if fortran else "C")


def read_npy(path: str | Path, where: str, name: str, expect: Expect) -> np.ndarray:
    """The array in the `.npy` file `path`, checked by `expect` before its data is read."""
    regular_file(path, where, limits.TOTAL_BYTES)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(_NPY_MAGIC))
            if magic[:2] == b"PK":
                raise TilekitError(f"'{excerpt(str(path), 200, quote=False)}' is an .npz "
                                   "archive, not one array", where,
                                   "use --inputs FILE.npz for an archive")
            fh.seek(0)
            shape, fortran, dtype = _header(fh, where, _shown(path))
            expect(name, shape, dtype, where)
            array = _data(fh, shape, fortran, dtype, where)
            if fh.read(1):      # numpy.load would read the first array and ignore the rest
                raise TilekitError(f"{_shown(path)} has bytes after its {array.nbytes:,} data "
                                   f"bytes (the header says shape {list(shape)[:8]}, {dtype})",
                                   where, "the file is damaged or was appended to; write it "
                                   "again")
            return array
    except OSError as exc:
        raise TilekitError(f"cannot read: {exc.strerror}", where) from None


def npy_shape(path: str | Path, where: str) -> tuple[int, ...]:
    """The shape in an `.npy` file's header (its data is not read)."""
    shapes: list[tuple[int, ...]] = []
    _headers_only(lambda expect: read_npy(path, where, "", expect), shapes)
    return shapes[0]


def npz_shapes(path: str | Path, where: str, names: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of the archive members `names` from their headers (no data is read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    members = npz_members(path, where)
    for name in names:
        if name in members:
            seen: list[tuple[int, ...]] = []
            _headers_only(lambda expect: read_npz(path, where, [name], expect), seen)
            shapes[name] = seen[0]
    return shapes


class _HeaderRead(Exception):
    """Stops a read after its header (`_headers_only`)."""


def _headers_only(read: Callable[[Expect], Any], into: list) -> None:
    def expect(name, shape, dtype, where):
        into.append(tuple(shape))
        raise _HeaderRead
    try:
        read(expect)
    except _HeaderRead:
        pass


def npz_members(path: str | Path, where: str) -> dict[str, zipfile.ZipInfo]:
    """The members of the `.npz` archive at `path` by array name (`<name>.npy` -> name)."""
    regular_file(path, where, limits.TOTAL_BYTES)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise TilekitError(f"cannot read: {exc.strerror}", where) from None
    if magic.startswith(_NPY_MAGIC):
        raise TilekitError(f"'{excerpt(str(path), 200, quote=False)}' is an .npy file (one "
                           "array), not an .npz archive", where,
                           "pass it as --input NAME=@FILE.npy, or bundle arrays with "
                           "numpy.savez")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        raise TilekitError(f"'{excerpt(str(path), 200, quote=False)}' is not an .npz archive "
                           f"({excerpt(str(exc), 60, quote=False)})", where,
                           "expected an archive written by numpy.savez") from None
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise TilekitError(f"member {excerpt(info.filename)} is not an .npy array", where,
                               "an .npz archive holds <name>.npy members only (numpy.savez)")
        name = info.filename[:-len(".npy")]
        if name in members:
            raise TilekitError(f"member {excerpt(info.filename)} appears twice", where,
                               "write the archive again")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise TilekitError(f"member {excerpt(info.filename)} uses an unsupported "
                               "compression", where, "use numpy.savez or savez_compressed")
        members[name] = info
    return members


def read_npz(path: str | Path, where: str, names: Iterable[str],
             expect: Expect) -> dict[str, np.ndarray]:
    """The members `names` of the archive at `path` (each checked by `expect` from its
    header before its data is read); the others are not read. A missing name is the
    caller's to report: it is simply absent from the result."""
    members = npz_members(path, where)
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for name in names:
                info = members.get(name)
                if info is None:
                    continue
                member_where = f"{where}: member {excerpt(info.filename)}"
                with zf.open(info) as fh:
                    shape, fortran, dtype = _header(
                        fh, member_where, f"{_shown(path)} member {excerpt(info.filename)}")
                    expect(name, shape, dtype, member_where)
                    size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                    header = fh.tell()
                    if info.file_size != header + size:
                        raise TilekitError(f"declares {info.file_size:,} bytes, its header "
                                           f"needs {header + size:,}", member_where,
                                           "the archive is damaged; write it again")
                    arrays[name] = _data(fh, shape, fortran, dtype, member_where)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise TilekitError(f"cannot read '{excerpt(str(path), 200, quote=False)}' as .npz "
                           f"({excerpt(str(exc), 60, quote=False)})", where,
                           "expected an archive written by numpy.savez") from None
    return arrays
