"""Writing a command's outputs: all of them visible together, or none of them.

A command stages every file it writes in one `OutputSet`, then commits it. Each target is
checked when it is staged (a usable path, an existing folder, not a file the command read,
not staged twice), so a bad `-o` fails before anything is written. By kind of target:

- a **regular file** (or a new name): the data goes to a temporary file in the target's
  folder, renamed over the target at commit;
- **stdout, a FIFO or a character device** (`/dev/null`, a terminal, `/dev/stdout`): never
  replaced; the data is kept (in memory or an anonymous temporary file) and streamed to it at
  commit, after every file; so is any name that reaches `/dev/` or `/proc/` through links
  (a link to `/dev/stdout` when stdout is redirected to a file: that file is written in
  place, the shell's descriptor keeps pointing at it); a FIFO waits for a reader at most
  `TILEKIT_MAX_FIFO_WAIT` seconds (`_open_stream`);
- a **symlink** is followed: what it points to is replaced or streamed to, the link stays;
  except for files whose names the command chose itself (the sources of `--emit-dir`, the
  default weights sidecar), where a link is refused: a link planted in a shared folder must
  not redirect a write;
- a directory, a block device or a socket is refused.

Commit renames the files in the order they were staged (a command stages the data a
document refers to, such as the weights sidecar, before the document), with SIGINT and
SIGTERM held so that no signal lands between two renames, then writes the streams. When a
rename or a stream fails, or a signal arrives, the renames already done are undone: a
replaced file gets its previous content back (kept as a hard link until the commit ends) and
a new one is removed. Temporary files are removed on every failure; `remove_temporaries`
(called by the command-line signal handlers) removes any that are still there.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Iterable, Iterator, Mapping

from tilekit import limits
from tilekit.errors import TilekitError
from tilekit.fileio import check_not_input, check_path, describe_os_error, note_input

#: Temporary files of this process not yet renamed or removed.
_TEMPS: set[str] = set()
#: Folders whose files are streamed in place even when regular (`/dev/stdout` -> a file).
_STREAM_FOLDERS = ("/dev/", "/proc/")


class ClosedStdout(io.TextIOBase):
    """What `sys.stdout` is while a command runs without one (started with descriptor 1
    closed): writing to it is bad input (exit 2), not an internal error or a silent loss."""

    def write(self, text: str) -> int:
        raise TilekitError("stdout is closed", "stdout", "redirect it, or pass -o FILE")

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def stdout_closed() -> bool:
    return sys.stdout is None or isinstance(sys.stdout, ClosedStdout)


def remove_temporaries() -> None:
    """Remove every temporary file this process still holds (on a signal, at exit)."""
    for path in list(_TEMPS):
        with contextlib.suppress(OSError):
            os.unlink(path)
        _TEMPS.discard(path)


def _reaches_stream_folder(path: str) -> bool:
    """Whether `path` or a symlink on the way to its target lies in `/dev/` or `/proc/`:
    `/dev/stdout`, a link to it, a link to a link to it, `devices/stdout` with `devices` a
    link to `/dev`. Such a name stands for a descriptor of the process (`/proc/self/fd/1`)
    and is written in place: renaming a new file over the one it reaches would leave the
    shell's redirect writing into a deleted file."""
    current = path
    for _ in range(40):  # the kernel follows at most 40 links in one path
        folder = os.path.realpath(os.path.dirname(current) or ".")
        located = os.path.join(folder, os.path.basename(current))
        if located.startswith(_STREAM_FOLDERS):
            return True
        try:
            target = os.readlink(located)
        except OSError:  # not a link (or gone): the chain ends here
            return False
        current = target if os.path.isabs(target) else os.path.join(folder, target)
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@dataclass
class _Staged:
    path: str                      # as the user named it
    where: str                     # the flag or field that chose it, for messages
    kind: str                      # "file", "stream" or "stdout"
    real: str                      # file: the path renamed over; stream: the path opened
    temp: str | None = None        # file: the temporary file
    data: list[Any] = field(default_factory=list)  # stream/stdout: str or bytes pieces
    spool: IO[bytes] | None = None  # stream/stdout: data written through a handle
    identity: Any = None           # (device, inode) or resolved path: one target once


class OutputSet:
    """The outputs of one command (see the module docstring). Use as a context manager:
    anything not committed when the block ends is discarded."""

    def __init__(self, inputs: Iterable[str | None] = ()):
        self._staged: list[_Staged] = []
        self._extra: dict = {}
        for path in inputs:
            note_input(path, into=self._extra)
        self._closed = False

    def __enter__(self) -> "OutputSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.abort()

    # -- staging -------------------------------------------------------------------------
    def check(self, path: str, where: str, follow_links: bool = True) -> None:
        """Raise now if `path` cannot be an output (for commands that check before working)."""
        self._classify(path, where, follow_links)

    def _classify(self, path: str, where: str, follow_links: bool = True) -> _Staged:
        if path == "-":
            if stdout_closed():
                raise TilekitError("stdout is closed", where, "redirect it, or pass -o FILE")
            return _Staged(path, where, "stdout", "-", identity="-")
        check_path(path, where)
        if not follow_links and os.path.islink(path):
            raise TilekitError("is a symbolic link, and this command named the file itself",
                               where, "remove the link, or choose another folder")
        try:
            st = os.stat(path)  # follows symlinks
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise TilekitError(f"cannot write: {describe_os_error(exc)}", where) from None
        if st is None:
            real = os.path.realpath(path)  # a dangling symlink: its target's name
            folder = os.path.dirname(path) if not os.path.islink(path) else os.path.dirname(real)
            if not os.path.isdir(folder or "."):
                raise TilekitError(f"folder '{folder}' does not exist", where, "create it first")
            staged = _Staged(path, where, "file", real, identity=real)
        elif stat.S_ISDIR(st.st_mode):
            raise TilekitError("is a directory", where, "give a file name")
        elif stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or (
                stat.S_ISREG(st.st_mode) and _reaches_stream_folder(path)):
            staged = _Staged(path, where, "stream", path, identity=(st.st_dev, st.st_ino))
        elif stat.S_ISREG(st.st_mode):
            staged = _Staged(path, where, "file", os.path.realpath(path),
                             identity=(st.st_dev, st.st_ino))
        else:
            raise TilekitError("is not a regular file, a FIFO or a character device", where,
                               "write to a file, a pipe or a terminal")
        check_not_input(path, where, self._extra)
        for other in self._staged:
            if other.identity == staged.identity or (
                    staged.kind == "file" and other.kind == "file" and other.real == staged.real):
                raise TilekitError(f"names the same file as {other.where}", where,
                                   "give each output its own file")
        return staged

    def _stage_file(self, staged: _Staged) -> BinaryIO:
        folder = os.path.dirname(staged.real) or "."
        name = os.path.basename(staged.real)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name[:100]}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise TilekitError(f"cannot write: {describe_os_error(exc)}", staged.where) from None
        _TEMPS.add(tmp)
        staged.temp = tmp
        try:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
            return os.fdopen(fd, "w+b")  # readable too: a writer may hash what it wrote
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.close(fd)
            self._discard(staged)
            if isinstance(exc, OSError):
                raise TilekitError(f"cannot write: {describe_os_error(exc)}",
                                   staged.where) from None
            raise

    @contextlib.contextmanager
    def open(self, path: str, where: str, follow_links: bool = True) -> Iterator[BinaryIO]:
        """A binary handle whose data becomes `path` at commit (binary: never a terminal).

        Whatever fails while the data is written (the disk fills up, EIO, an exception of
        the writer), the temporary file is removed: closing a buffered file flushes it and
        can fail again, so the handle is closed quietly before the file is removed."""
        staged = self._classify(path, where, follow_links)
        if staged.kind == "stdout":
            self._refuse_terminal(where)
        handle = self._stage_file(staged) if staged.kind == "file" else tempfile.TemporaryFile()
        try:
            with _os_errors(where):
                yield handle
                handle.flush()
                if staged.kind == "file":
                    handle.close()  # flushes what is left: ENOSPC may come only here
        except BaseException:
            _close_quietly(handle)
            self._discard(staged)
            raise
        if staged.kind != "file":
            staged.spool = handle
        self._staged.append(staged)

    def put(self, path: str, data: str | bytes, where: str, follow_links: bool = True) -> None:
        """Stage `data` (text is written as UTF-8) to become `path` at commit
        (`follow_links=False`: refuse a symlink, for files the command named itself)."""
        staged = self._classify(path, where, follow_links)
        if staged.kind == "stdout" and isinstance(data, bytes):
            self._refuse_terminal(where)
        if staged.kind == "file":
            payload = data.encode("utf-8") if isinstance(data, str) else data
            fh = self._stage_file(staged)
            try:
                with _os_errors(where):
                    fh.write(payload)
                    fh.close()
            except BaseException:
                _close_quietly(fh)
                self._discard(staged)
                raise
        else:
            staged.data.append(data)
        self._staged.append(staged)

    def retarget(self, path: str, new: str, where: str, follow_links: bool = True) -> None:
        """Make the staged file `path` become `new` at commit instead: a name in the same
        folder (the temporary file stays where it is), checked like any output."""
        staged = next((s for s in self._staged if s.path == path and s.kind == "file"), None)
        if staged is None:
            raise ValueError(f"{path!r} is not a staged file")
        target = self._classify(new, where, follow_links)
        if target.kind != "file" or os.path.dirname(target.real) != os.path.dirname(
                staged.real):
            raise TilekitError("is not a regular file in the folder of the file it replaces",
                               where, "remove it, or choose the file with --weights")
        staged.path, staged.where, staged.real = new, where, target.real
        staged.identity = target.identity

    @staticmethod
    def _refuse_terminal(where: str) -> None:
        if sys.stdout is not None and sys.stdout.isatty():
            raise TilekitError("refusing to write binary data to a terminal", where,
                               "redirect stdout or pass -o FILE")

    # -- commit and abort ----------------------------------------------------------------
    def commit(self) -> None:
        """Make every staged output visible (see the module docstring)."""
        if self._closed:
            return
        files = [s for s in self._staged if s.kind == "file"]
        streams = [s for s in self._staged if s.kind != "file"]
        done: list[tuple[_Staged, str | None]] = []
        try:
            with signals_held():
                for staged in files:
                    backup = _backup(staged.real)
                    done.append((staged, backup))
                    with _os_errors(staged.where):
                        os.replace(staged.temp, staged.real)
                    _TEMPS.discard(staged.temp)
            for staged in streams:
                _write_stream(staged)
        except BaseException:
            _undo(done)
            self.abort()
            raise
        for _, backup in done:
            if backup:
                with contextlib.suppress(OSError):
                    os.unlink(backup)
        self._closed = True

    def abort(self) -> None:
        """Discard everything staged and not committed (temporary files removed)."""
        for staged in self._staged:
            self._discard(staged)
        self._staged = []
        self._closed = True

    @staticmethod
    def _discard(staged: _Staged) -> None:
        if staged.temp and staged.temp in _TEMPS:
            with contextlib.suppress(OSError):
                os.unlink(staged.temp)
            _TEMPS.discard(staged.temp)
        if staged.spool is not None:
            staged.spool.close()
            staged.spool = None


def _close_quietly(handle: IO[bytes]) -> None:
    """Close `handle` after a failure; a second failure (the flush on close) is the first
    one's consequence and is dropped (the descriptor is closed either way)."""
    with contextlib.suppress(OSError, ValueError):
        handle.close()


@contextlib.contextmanager
def _os_errors(where: str) -> Iterator[None]:
    try:
        yield
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except OSError as exc:
        raise TilekitError(f"cannot write: {describe_os_error(exc)}", where) from None


def _backup(path: str) -> str | None:
    """A hard link keeping the current content of `path` (None when there is none, or when
    the file system cannot link: then a failed commit cannot restore it)."""
    if not os.path.isfile(path):
        return None
    folder, name = os.path.split(path)
    for attempt in range(100):
        candidate = os.path.join(folder, f".{name[:100]}.{os.getpid()}.{attempt}.bak")
        try:
            os.link(path, candidate)
            return candidate
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


def _undo(done: list[tuple[_Staged, str | None]]) -> None:
    """Put back what the renames in `done` replaced (newest first); best effort."""
    for staged, backup in reversed(done):
        with contextlib.suppress(OSError):
            if backup:
                # When the rename never happened, backup and target are one file and rename()
                # does nothing: the link is then removed below.
                os.replace(backup, staged.real)
                if os.path.lexists(backup):
                    os.unlink(backup)
            elif staged.temp not in _TEMPS:  # renamed: a new file, remove it
                os.unlink(staged.real)


def _write_stream(staged: _Staged) -> None:
    where = staged.where
    if staged.kind == "stdout":
        out = sys.stdout
        if stdout_closed():
            raise TilekitError("stdout is closed", where, "redirect it, or pass -o FILE")
        try:
            for piece in staged.data:
                if isinstance(piece, str):
                    out.write(piece)
                else:
                    out.flush()
                    out.buffer.write(piece)
            if staged.spool is not None:
                out.flush()
                staged.spool.seek(0)
                shutil.copyfileobj(staged.spool, out.buffer)
            out.flush()
            if hasattr(out, "buffer"):
                out.buffer.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as exc:
            what = describe_os_error(exc) if isinstance(exc, OSError) else "closed"
            raise TilekitError(f"cannot write to stdout: {what}", where,
                               "redirect stdout, or pass -o FILE") from None
        return
    with _os_errors(where), _open_stream(staged.real, where) as fh:
        for piece in staged.data:
            fh.write(piece.encode("utf-8") if isinstance(piece, str) else piece)
        if staged.spool is not None:
            staged.spool.seek(0)
            shutil.copyfileobj(staged.spool, fh)


def _open_stream(path: str, where: str) -> BinaryIO:
    """`path` (a FIFO, a character device, a descriptor's name) opened for writing. A FIFO
    is opened without blocking, retried until a reader has opened it, at most
    `limits.FIFO_WAIT` seconds: `-o FIFO` with no reader would otherwise block forever (a
    FIFO planted in an `--emit-dir` folder too). Once open, writes block as usual while the
    reader catches up."""
    try:
        is_fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        is_fifo = False
    if not is_fifo:
        return open(path, "wb")
    wait = limits.FIFO_WAIT.value
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no process has the FIFO open for reading
                raise
            if time.monotonic() >= deadline:
                raise TilekitError(f"no reader opened the FIFO within {wait:,} s", where,
                                   "start the reader first (e.g. 'cat FIFO &'), or wait "
                                   f"longer with {limits.FIFO_WAIT.env}=SECONDS") from None
            time.sleep(0.02)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP are delivered after the block, not inside it (a command's
    handlers raise where the command is: inside a half-written structure, the exception could
    leave it in a state whose cleanup fails and hides the interruption). The handlers are
    swapped for ones that note the signal for the block, then restored and the signals noted
    raised again: blocking them in this thread (pthread_sigmask) was not enough, since a
    signal sent to the process may land on another thread (BLAS's, a test runner's), and
    Python then runs the handler in the main thread at once. Only the main thread can set
    handlers; elsewhere the block runs as it is."""
    import threading

    wanted = [signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP")
                                              else [])]
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {}
    for signum in wanted:
        handler = signal.getsignal(signum)
        if handler is not None:             # None: set outside Python, cannot be restored
            previous[signum] = signal.signal(signum, lambda n, frame: noted.append(n))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


def write_npz(fh: BinaryIO, arrays: Mapping[str, Any]) -> None:
    """`arrays` (a mapping, in its order) as an `.npz` archive readable by `numpy.load` on
    the writable binary `fh`: members `<name>.npy`, stored uncompressed with a fixed timestamp
    (numpy.savez stamps the current time), so the same arrays always give the same bytes;
    each array streamed, never copied whole. A signal while a member or the archive's end is
    being written is delivered after it (`signals_held`): raised inside a member, its
    exception had left the archive with the member open, whose close then failed
    (ValueError) and replaced the interruption; raised inside the archive's close, it left a
    close for the garbage collector, which failed on the file closed by then and printed a
    traceback at exit."""
    import zipfile

    import numpy as np

    zf = zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
    try:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with signals_held(), zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    finally:
        with signals_held():
            zf.close()


# -- one-file shorthands for tilekit.outputs ---------------------------------------------

@contextlib.contextmanager
def atomic_write(path: str | Path, where: str | None = None,
                 inputs: Iterable[str | None] = ()) -> Iterator[BinaryIO]:
    """Yield a binary file handle; on success the data replaces `path` in one step (a
    FIFO or a character device is written in place). See `tilekit.outputs`."""
    with OutputSet(inputs=inputs) as out:
        with out.open(str(path), where or f"-o {path}") as fh:
            yield fh
        out.commit()


def write_output(output: str, data: str | bytes,
                 input_path: str | Iterable[str | None] | None = None) -> None:
    """Write `data` to stdout (`-`) or to a file, as one `tilekit.outputs.OutputSet`.

    Never over an input of the command, nor over `input_path` (one path or several); binary
    data never goes to a terminal.
    """
    paths = [input_path] if isinstance(input_path, (str, Path)) else list(input_path or ())
    with OutputSet(inputs=paths) as out:
        out.put(output, data, f"-o {output}" if output != "-" else "-o")
        out.commit()
